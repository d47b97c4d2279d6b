"""`serve_preview`: a strided sample of one tensor as JSON (`GET /v1/tables/{key}/preview`, what
the explorer at `/ui` plots), at most `max_points` elements whatever the table's size; the
strides are `runtime.rows.preview_steps`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import torch
from starlette.requests import Request
from starlette.responses import Response

from posenc.api.error_types import (
    INVALID_MAX_POINTS,
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
PREVIEW_ERRORS += (ROWS_UNSUPPORTED, TOO_LARGE, INVALID_POOL)
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


async def serve_preview(
    request: Request,
    state: AppState,
    spec: SpecBase,
    key: str,
    query: PreviewQuery,
) -> Response:
    """`{"key", "kind", "tensor", "dtype", "shape", "row_axis", "axes", "data"}`: one tensor of
    the table, rows `rows` (its position axis) sampled with `preview_steps` to at most
    `max_points` elements, as JSON (bfloat16 as float). With `pool=block`, also `"pooled":
    {"min", "max", "mean"}` over each sampled element's block (`block_pool`; what the explorer's
    heatmaps draw, so a column faster than the stride is not aliased).

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
    steps = preview_steps(info.shape, max_points)
    whole = outputs[tensor]
    first, last = selection.rows or (0, 0)
    cache = state.require_cache()
    resident = cache.peek(cache.key_for(spec, key))
    device = resident.device if resident is not None else str(cache.device)
    span = f".{first}-{last}" if selection.rows is not None else ""
    tag = f"{key}.preview.{tensor}{span}.{max_points}{'.pooled' if pooled else ''}"

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
        "dtype": whole.dtype,
        "shape": list(whole.shape),
        "row_axis": whole.row_axis,
        "axes": axes,
        "data": sample.contiguous().reshape(-1).numpy(),
    }
    if pooled:
        blocks = block_pool(t.to("cpu"), steps)
        body["pooled"] = {name: v.reshape(-1).numpy() for name, v in blocks.items()}
    headers["X-Posenc-Cache"] = outcome
    headers["X-Posenc-Device"] = entry.device
    return Response(
        orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
        media_type="application/json",
        headers=headers,
    )
