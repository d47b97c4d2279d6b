"""Which tensors and positions a table response carries: the `tensor` and `rows` query
parameters checked against the spec's outputs before anything is computed, and the selected
tensors cut from a computed table."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from posenc.api.error_types import (
    INVALID_ROWS,
    ROWS_UNSUPPORTED,
    TENSOR_REQUIRED,
    UNKNOWN_TENSOR,
    UNSUPPORTED_DTYPE,
)
from posenc.api.errors import ApiError
from posenc.encodings import TensorInfo

if TYPE_CHECKING:
    from posenc.api.serving.formats import Format

NUMPY_DTYPES = {"float32", "float64", "float16", "int64", "int32"}
"""The dtypes numpy formats (npz, npy) hold: numpy has no bfloat16."""


@dataclass(frozen=True)
class Selection:
    """Which tensors a response carries, and which positions: `rows` is half-open (START, END),
    or None for all of them (a range covering the whole table is normalised to None). `axes`:
    each named tensor's position axis (`TensorInfo.row_axis`), the one `rows` slices; tensors
    without one (inv_freq, slopes) are sent whole."""

    names: tuple[str, ...]
    rows: tuple[int, int] | None
    axes: tuple[int | None, ...]


ROWS_PATTERN = re.compile(r"([0-9]*):([0-9]*)")
"""`START:END` in ASCII digits only (`int()` would also take `١:٢`, `+1`, ` 1`, `1_0`)."""


def parse_rows(text: str | None) -> tuple[int, int] | None:
    """`START:END` (either may be empty; ASCII digits only) -> (start, end-or--1); 400 on any
    other spelling."""
    if text is None:
        return None
    match = ROWS_PATTERN.fullmatch(text)
    if match is None:
        raise ApiError(
            INVALID_ROWS,
            f"rows must be START:END with non-negative integers in ASCII digits, got {text!r}",
            [{"field": "rows", "message": "expected START:END ([0-9]*:[0-9]*)", "value": text}],
        )
    start_text, end_text = match.groups()
    return int(start_text or 0), int(end_text) if end_text else -1


def select(
    kind: str,
    outputs: dict[str, TensorInfo],
    fmt: Format,
    tensor: str | None,
    rows: tuple[int, int] | None,
) -> Selection:
    """Validate `tensor` and `rows` against the spec's outputs, before anything is computed."""
    names = tuple(outputs)
    if tensor is not None:
        if tensor not in outputs:
            raise ApiError(
                UNKNOWN_TENSOR,
                f"this table has no tensor {tensor!r}; it has {list(names)}",
                [{"field": "tensor", "message": f"must be one of {list(names)}", "value": tensor}],
            )
        names = (tensor,)
    elif fmt.single and len(names) > 1:
        raise ApiError(
            TENSOR_REQUIRED,
            f"format {fmt.name} carries one tensor: add tensor=NAME, one of {list(names)}",
            [{"field": "tensor", "message": f"required, one of {list(names)}", "value": None}],
        )
    if fmt.numpy:
        bad = [n for n in names if outputs[n].dtype not in NUMPY_DTYPES]
        if bad:
            raise ApiError(
                UNSUPPORTED_DTYPE,
                f"numpy has no {outputs[bad[0]].dtype}: fetch {bad} as safetensors or raw",
                [{"field": "format", "message": "no numpy dtype for " + ", ".join(bad)}],
            )
    axes = tuple(outputs[n].row_axis for n in names)
    if rows is None:
        return Selection(names, None, axes)
    lengths = {outputs[n].shape[a] for n, a in zip(names, axes, strict=True) if a is not None}
    if len(lengths) != 1:
        raise ApiError(
            ROWS_UNSUPPORTED,
            f"rows= needs a tensor with a position axis; {list(names)} of kind {kind} have none",
            [{"field": "rows", "message": "no position axis in the selected tensors"}],
        )
    total = lengths.pop()
    start, end = rows
    end = total if end == -1 else end
    if not start < end <= total:
        raise ApiError(
            INVALID_ROWS,
            f"rows {start}:{end} outside the table's {total} positions "
            f"(need START < END <= {total})",
            [{"field": "rows", "message": f"need 0 <= START < END <= {total}", "value": rows}],
        )
    return Selection(names, None if (start, end) == (0, total) else (start, end), axes)


def selected_infos(outputs: dict[str, TensorInfo], sel: Selection) -> dict[str, TensorInfo]:
    """Shapes and dtypes of what `sel` sends (row slices applied), without computing anything."""
    out: dict[str, TensorInfo] = {}
    for name, axis in zip(sel.names, sel.axes, strict=True):
        info = outputs[name]
        if sel.rows is not None and axis is not None:
            shape = list(info.shape)
            shape[axis] = sel.rows[1] - sel.rows[0]
            info = TensorInfo(tuple(shape), info.dtype, axis)
        out[name] = info
    return out


def selected_tensors(tensors: dict[str, torch.Tensor], sel: Selection) -> dict[str, torch.Tensor]:
    """The selected tensors, row-sliced and contiguous, on their own device (views when they
    are already contiguous)."""
    out: dict[str, torch.Tensor] = {}
    for name, axis in zip(sel.names, sel.axes, strict=True):
        t = tensors[name]
        if sel.rows is not None and axis is not None:
            t = t.narrow(axis, sel.rows[0], sel.rows[1] - sel.rows[0])
        out[name] = t.detach().contiguous()
    return out


def cpu_tensors(tensors: dict[str, torch.Tensor], sel: Selection) -> dict[str, Any]:
    """The selected tensors, row-sliced, contiguous and on the CPU (views when already there)."""
    return {n: t.to("cpu") for n, t in selected_tensors(tensors, sel).items()}
