"""Row ranges (`rows=`): the argument's checks, its query parameter, and slicing a whole table
the client holds on the position axes the server declares in its metadata (`meta["row_axes"]`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from posenc_client._exceptions import InvalidRowsError
from posenc_client._formats import Array
from posenc_client._tables import Tables

Rows = tuple[int, int | None] | list[int] | slice
"""A `rows=` argument: `(start, end)` or `[start, end]` (positions [start, end); `end=None`: to
the last one) or `slice(start, end)` (no step)."""


def rows_error(error_type: str, message: str, value: Any) -> InvalidRowsError:
    """The `InvalidRowsError` the client raises itself, shaped as the server's answer."""
    detail = [{"field": "rows", "message": message, "value": value}]
    return InvalidRowsError(message, status=400, error_type=error_type, detail=detail)


def rows_arg(rows: Rows) -> tuple[int, int | None]:
    """`(start, end_or_None)` from a `rows=` argument; `InvalidRowsError` unless it is
    `(start, end)`, `[start, end]` or `slice(start, end)` with integers `0 <= start < end`
    (`end` may be None: to the last position; a slice's `start` may be None: 0)."""
    if isinstance(rows, slice):
        if rows.step not in (None, 1):
            raise rows_error("invalid_rows", f"rows take no step, got {rows!r}", repr(rows))
        start, end = (0 if rows.start is None else rows.start), rows.stop
    elif isinstance(rows, tuple | list) and len(rows) == 2:
        start, end = rows
    else:
        raise rows_error(
            "invalid_rows", f"rows must be (start, end) or a slice, got {rows!r}", repr(rows)
        )
    for bound in (start, end):
        if bound is not None and (type(bound) is bool or not isinstance(bound, int)):
            message = f"rows must be integers, got {rows!r}"
            raise rows_error("invalid_rows", message, repr(rows))
    if not isinstance(start, int) or start < 0 or (end is not None and end <= start):
        raise rows_error("invalid_rows", f"rows need 0 <= start < end, got {rows!r}", [start, end])
    return start, end


def rows_param(start: int, end: int | None) -> str:
    """The `rows` query parameter: `START:END`, or `START:` to the last position."""
    return f"{start}:{'' if end is None else end}"


def row_axes(tables: Tables) -> dict[str, int | None] | None:
    """Each tensor's position axis as the server declares it (`meta["row_axes"]`, from
    `TensorInfo.row_axis`), or None when the metadata lacks one or it does not fit the array."""
    declared = tables.meta.get("row_axes")
    if not isinstance(declared, dict):
        return None
    axes: dict[str, int | None] = {}
    for name, array in tables.arrays.items():
        if name not in declared:
            return None
        axis = declared[name]
        if axis is not None and (type(axis) is not int or not 0 <= axis < array.ndim):
            return None  # not a layout this client can read: let the server decide
        axes[name] = axis
    return axes


def slice_rows(tables: Tables, start: int, end: int | None) -> Tables | None:
    """Rows [start, end) of a whole table, as the server would send them, without a request.

    None when the table does not say its position axes (`meta["row_axes"]`, tensor name -> axis
    or None, which servers before it did not send) for every tensor it holds: ask the server.
    Raises `InvalidRowsError` as the server does: `rows_unsupported` for a table
    without a position axis, `invalid_rows` for a range past its positions. A range covering
    every position is the table itself (the server answers the whole table then, without
    `meta["rows"]`); otherwise arrays are contiguous copies of those rows (the whole table's
    buffer is not kept alive) and `meta["rows"]` is `[start, end]`.
    """
    axes = row_axes(tables)
    if axes is None:
        return None
    lengths = {tables.arrays[n].shape[a] for n, a in axes.items() if a is not None}
    if len(lengths) != 1:
        message = f"rows= needs a tensor with a position axis; this {tables.kind} table has none"
        raise rows_error("rows_unsupported", message, [start, end])
    total = lengths.pop()
    stop = total if end is None else end
    if not start < stop <= total:
        message = (
            f"rows {start}:{stop} outside the table's {total} positions "
            f"(need START < END <= {total})"
        )
        raise rows_error("invalid_rows", message, [start, stop])
    if (start, stop) == (0, total):
        return tables
    arrays: dict[str, Array] = {}
    for name, array in tables.arrays.items():
        axis = axes[name]
        if axis is not None:
            index = (slice(None),) * axis + (slice(start, stop),)
            array = array[index]
        arrays[name] = np.array(array, order="C")  # a copy: frees the whole table's buffer
    meta = {**tables.meta, "rows": [start, stop]}
    return Tables(
        tables.key, tables.kind, tables.spec, meta, arrays, dict(tables.notes), tables.name
    )
