"""`serve_preview`: a strided sample of one tensor as JSON (`GET /v1/tables/{key}/preview`, what
the explorer at `/ui` plots), at most `max_points` elements whatever the table's size; the
strides are `runtime.rows.preview_steps`. With `minus`, the sample (and the blocks pooled) is of
the element-wise difference of two tables' tensors: the explorer's difference heatmap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import torch
from starlette.requests import Request
from starlette.responses import Response

from posenc.api.error_types import (
    INVALID_MAX_POINTS,
    INVALID_MINUS,
    INVALID_POOL,
    INVALID_ROWS,
    ROWS_UNSUPPORTED,
    TENSOR_REQUIRED,
    TOO_LARGE,
    UNKNOWN_TENSOR,
    ErrorType,
)
from posenc.api.errors import ApiError
from posenc.api.serving.bind import bind_tables
from posenc.api.serving.conditional import IMMUTABLE, device_etag, not_modified
from posenc.api.serving.formats import FORMATS
from posenc.api.serving.query import ROWS_DOC, ROWS_SCHEMA, QueryRecord, param
from posenc.api.serving.selection import parse_rows, select, selected_infos
from posenc.api.serving.table import check_size
from posenc.api.state import AppState
from posenc.encodings import SpecBase
from posenc.runtime.rows import block_pool, preview_steps

PREVIEW_ERRORS: tuple[ErrorType, ...] = (
    INVALID_MAX_POINTS,
    UNKNOWN_TENSOR,
    TENSOR_REQUIRED,
    INVALID_ROWS,
)
PREVIEW_ERRORS += (ROWS_UNSUPPORTED, TOO_LARGE, INVALID_POOL, INVALID_MINUS)
"""What a preview refuses beyond naming its table."""

PREVIEW_FORMAT = FORMATS["json"]
"""What a preview is: a JSON body (its tensors selected as for `format=json`)."""

PREVIEW_POINTS = 65536
"""`max_points` of a preview when the request names none (capped by `json_max_elements`)."""


@dataclass(frozen=True)
class PreviewQuery(QueryRecord):
    """The query of a preview: the tensor, a row range, the most elements sampled."""

    tensor: str | None = param("the tensor to preview (required when the table has several)")
    rows: str | None = param(ROWS_DOC, **ROWS_SCHEMA)
    max_points: str | None = param(
        f"at most this many elements (default {PREVIEW_POINTS}, at most the server's "
        "json_max_elements)",
        type="integer",
        minimum=1,
    )
    pool: str | None = param(
        "block: add `pooled` {min, max, mean}, each of the sample's shape, over the block of "
        "elements each sampled element stands for (runtime.rows.block_pool)",
        enum=["none", "block"],
        default="none",
    )
    minus: str | None = param(
        "another table of the same kind (`{key}.{spec}` as handed out, or a key this server "
        "resolved) whose tensor has the same shape: the preview is of this tensor minus that "
        "one, element by element in float64, and `pooled` adds `maxabs`, the largest "
        "|difference| in each block"
    )


PREVIEW_PARAMETERS = PreviewQuery.parameters()


def parse_max_points(text: str | None, limit: int) -> int:
    """The `max_points` query parameter: an integer in [1, `limit`], 400 `invalid_max_points`
    otherwise; `min(PREVIEW_POINTS, limit)` when absent."""
    value: int | None
    if text is None:
        value = min(PREVIEW_POINTS, limit)
    else:
        # ASCII digits only, as every number in a query (int() would take "١٢" or " +12_0")
        value = int(text) if text.isascii() and text.isdigit() else None
    if value is None or not 1 <= value <= limit:
        raise ApiError(
            INVALID_MAX_POINTS,
            f"max_points must be an integer from 1 to {limit}, got {text!r}",
            [{"field": "max_points", "message": f"need 1 <= max_points <= {limit}", "value": text}],
        )
    return value


def _check_minus(
    spec: SpecBase,
    tensor: str,
    shape: tuple[int, ...],
    other: tuple[str, SpecBase],
    outputs: dict[str, Any],
) -> None:
    """400 `invalid_minus` unless table `other` is of `spec`'s kind and its `tensor` has `shape`
    (the difference is element by element: no broadcasting, no alignment guessed)."""
    other_key, other_spec = other
    found = outputs.get(tensor)
    if other_spec.kind != spec.kind or found is None or tuple(found.shape) != shape:
        got = f"{other_spec.kind} with {tensor} {list(found.shape) if found else 'absent'}"
        raise ApiError(
            INVALID_MINUS,
            f"minus must name a {spec.kind} table whose {tensor} has shape {list(shape)}, "
            f"got {got}",
            [
                {
                    "field": "minus",
                    "message": f"need {spec.kind} {tensor} {list(shape)}",
                    "value": other_key,
                }
            ],
        )


async def serve_preview(
    request: Request,
    state: AppState,
    spec: SpecBase,
    key: str,
    query: PreviewQuery,
    minus: tuple[str, SpecBase] | None = None,
) -> Response:
    """`{"key", "kind", "tensor", "dtype", "shape", "row_axis", "axes", "data"}`: one tensor of
    the table, rows `rows` (its position axis) sampled with `preview_steps` to at most
    `max_points` elements, as JSON (bfloat16 as float). With `pool=block`, also `"pooled":
    {"min", "max", "mean"}` over each sampled element's block (`block_pool`; what the explorer's
    heatmaps draw, so a column faster than the stride is not aliased).

    With `minus` = (key, spec) of another table (`PreviewQuery.minus`, resolved by the route):
    the sample and the pooled blocks are of `this - other` over the same rows, computed in
    float64 from both cached tables (`"dtype": "float64"`, `"minus": key`), and `pooled` adds
    `"maxabs"` = max(|min|, |max|) of each block's difference (the largest element-wise
    difference in the block: a pooled difference, not a difference of pooled tables).

    `shape` is the whole tensor's; `axes[i]` = `{"start", "step", "count"}` says which indices of
    axis i the sample holds (`start + k*step`, k < count); `data` is the sample, flat, row-major.
    Everything is checked from shapes before the table is computed: the table's size (413, as
    for the table itself), `max_points`, the tensor and the rows (400). The sample is taken from
    the cached table (computed once, like any table request) and is immutable like it.
    """
    outputs = state.index.outputs(key, spec)
    check_size(state, outputs)
    max_points = parse_max_points(query.max_points, state.settings.json_max_elements)
    if query.pool not in (None, "none", "block"):
        raise ApiError(
            INVALID_POOL,
            f"pool must be none or block, got {query.pool!r}",
            [{"field": "pool", "message": "one of none, block", "value": query.pool}],
        )
    pooled = query.pool == "block"
    tensor = query.tensor
    names = list(outputs)
    if tensor is None:
        if len(names) != 1:
            raise ApiError(
                TENSOR_REQUIRED,
                f"a preview shows one tensor: add tensor=NAME, one of {names}",
                [{"field": "tensor", "message": f"required, one of {names}", "value": None}],
            )
        tensor = names[0]
    selection = select(spec.kind, outputs, PREVIEW_FORMAT, tensor, parse_rows(query.rows))
    info = selected_infos(outputs, selection)[tensor]
    if minus is not None:
        other_outputs = state.index.outputs(minus[0], minus[1])
        check_size(state, other_outputs)
        _check_minus(spec, tensor, tuple(outputs[tensor].shape), minus, other_outputs)
    steps = preview_steps(info.shape, max_points)
    whole = outputs[tensor]
    first, last = selection.rows or (0, 0)
    cache = state.require_cache()
    resident = cache.peek(cache.key_for(spec, key))
    device = resident.device if resident is not None else str(cache.device)
    span = f".{first}-{last}" if selection.rows is not None else ""
    against = f".minus.{minus[0]}" if minus is not None else ""
    tag = f"{key}.preview.{tensor}{span}.{max_points}{'.pooled' if pooled else ''}{against}"

    headers = {
        "ETag": device_etag(tag, device),
        "Cache-Control": IMMUTABLE,
        "X-Posenc-Key": key,
        "X-Posenc-Kind": spec.kind,
    }
    unchanged = not_modified(request, headers)
    if unchanged is not None:
        return unchanged
    spec = bind_tables(cache, state.require_tables(), spec, key)
    entry, outcome = await cache.get(spec, key)
    headers["ETag"] = device_etag(tag, entry.device)  # a CUDA out-of-memory may have fallen back
    t = entry.table.tensors[tensor]
    if selection.rows is not None and info.row_axis is not None:
        t = t.narrow(info.row_axis, first, last - first)
    if minus is not None:
        other_spec = bind_tables(cache, state.require_tables(), minus[1], minus[0])
        other_entry, _ = await cache.get(other_spec, minus[0])
        u = other_entry.table.tensors[tensor]
        if selection.rows is not None and info.row_axis is not None:
            u = u.narrow(info.row_axis, first, last - first)
        t = t.to("cpu", torch.float64) - u.to("cpu", torch.float64)
    sample = t[tuple(slice(None, None, step) for step in steps)].to("cpu")
    if sample.dtype == torch.bfloat16:
        sample = sample.float()
    axes = [
        {
            "start": first if axis == info.row_axis and selection.rows is not None else 0,
            "step": step,
            "count": sample.shape[axis],
        }
        for axis, step in enumerate(steps)
    ]
    body: dict[str, Any] = {
        "key": key,
        "kind": spec.kind,
        "tensor": tensor,
        "dtype": whole.dtype if minus is None else "float64",
        "shape": list(whole.shape),
        "row_axis": whole.row_axis,
        "axes": axes,
        "data": sample.contiguous().reshape(-1).numpy(),
    }
    if pooled:
        blocks = block_pool(t.to("cpu"), steps)
        if minus is not None:
            blocks["maxabs"] = torch.maximum(blocks["max"], -blocks["min"])
        body["pooled"] = {name: v.reshape(-1).numpy() for name, v in blocks.items()}
    if minus is not None:
        body["minus"] = minus[0]
    headers["X-Posenc-Cache"] = outcome
    headers["X-Posenc-Device"] = entry.device
    return Response(
        orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
        media_type="application/json",
        headers=headers,
    )
