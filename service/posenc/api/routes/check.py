"""`POST /v1/check/onnx`: how far the RoPE caches baked into an ONNX model are from the exact
table, and why (the explorer's check pane at /ui; `posenc-client verify` runs the same check
locally).

The body is the model (any media type; `Content-Encoding` refused). A model saved with external
data may be sent as its graph-only `.onnx`: caches stored in external data are not read and are
listed under `external`, the model's weights are never sent. The body is capped by
`max_upload_bytes` from `Content-Length` before any of it is read, and while it streams
(`BodyLimitMiddleware`). `?key=` names the table to compare with: a rope table this server
resolved (a key of /v1/resolve, /v1/tables or a preset's). Its spec is taken as
`posenc-client verify` asks for it: half width, the caches' dtype and rows, and per side of a
LongRoPE length switch (`If`) the `seq_len` at and past its threshold.

Each report names `exact_key`, the table it was compared with (at /v1/tables/{exact_key}).
Finding the caches, comparing and diagnosing are `posenc_check.verify` (one implementation, shared
with posenc-client). Only the caches become arrays; each report carries `map`, the largest
|model - exact| per block of positions and columns (`posenc_check.verify.departures`, at most
256 x 256), which the page draws as a heatmap.

Answers `{"key", "caches": [report...], "external": [{"name", "location"}]}`; errors: 400
`invalid_model` (not an ONNX model), 404 `unknown_key`, 413 `body_too_large` / `too_large`, 422
`invalid_request` (`key` missing or not a rope table), 422 `no_rope_caches` (no RoPE consumer
reads a cache baked into the model), 422 `invalid_spec` (the caches' rows or dtype out of range).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import torch
from fastapi import APIRouter, Request
from starlette.responses import Response

from posenc.api.deps import app_state
from posenc.api.errors import ApiError
from posenc.api.jsonio import check_content_encoding, json_response
from posenc.api.serving import check_size
from posenc.api.specs import canonical_spec
from posenc.api.state import AppState
from posenc.api.wire import TooManyEntries, count_graph_entries
from posenc.encodings import SpecBase, canonical_json
from posenc.runtime import OFFLOAD_BYTES

if TYPE_CHECKING:
    import onnx

    from posenc_check.verify import BakedCaches

# onnx and posenc_check are imported on the first check, not at start-up (as /v1/onnx does).

router = APIRouter(prefix="/v1", tags=["check"])

MAP_SIZE = 256
"""Largest side of a report's departure map."""


class _Exact:
    """A computed rope table as `posenc_check.verify.ExactTable`: its canonical spec as JSON and
    its tensors as numpy arrays (bfloat16 through ml_dtypes)."""

    def __init__(self, spec: SpecBase, tensors: dict[str, torch.Tensor]) -> None:
        self.spec: dict[str, Any] = orjson.loads(canonical_json(spec))
        self.arrays = {name: _numpy(t) for name, t in tensors.items()}

    def __getitem__(self, name: str, /) -> np.ndarray[Any, Any]:
        return self.arrays[name]


def _numpy(tensor: torch.Tensor) -> np.ndarray[Any, Any]:
    cpu = tensor.detach().cpu().contiguous()
    if cpu.dtype == torch.bfloat16:
        import ml_dtypes

        return cpu.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return cpu.numpy()


def _key(state: AppState, request: Request) -> tuple[str, SpecBase]:
    key = request.query_params.get("key")
    if not key:
        message = "key: the content key of the rope table to compare with (X-Posenc-Key)"
        raise ApiError(422, "invalid_request", message, [{"field": "key", "message": message}])
    spec = state.index.get(key)
    if spec is None:
        raise ApiError(
            404,
            "unknown_key",
            f"no table with key {key!r} is known here: resolve its config or preset first",
            {"key": key},
        )
    if spec.kind != "rope":
        message = f"key names a {spec.kind} table; the check compares RoPE caches (a rope table)"
        raise ApiError(422, "invalid_request", message, [{"field": "key", "message": message}])
    return key, spec


def _invalid(message: str) -> ApiError:
    return ApiError(400, "invalid_model", message, [{"field": "(body)", "message": message}])


def _parse(body: bytes, max_entries: int) -> onnx.ModelProto:
    """The model, parsed once its entries are counted (`api/wire.py`: 413 `too_many_entries`
    past `max_entries`, before the parser allocates a message for each)."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        count_graph_entries(body, max_entries)
    except TooManyEntries as err:
        raise ApiError(
            413,
            "too_many_entries",
            f"the model holds {err}: a model sent here may hold at most {max_entries} nodes, "
            "initializers, attributes and other graph entries",
            {"max_entries": max_entries},
        ) from None
    model = onnx.ModelProto()
    try:
        model.ParseFromString(body)
    except (DecodeError, ValueError, RuntimeError) as err:
        raise _invalid(f"the body is not an ONNX model: {err}") from None
    if not model.HasField("graph"):
        raise _invalid("the body is not an ONNX model (no graph): send the .onnx file's bytes")
    return model


def _values(caches: BakedCaches) -> tuple[Any, Any]:
    """The cos and sin values of a baked pair, each (P, w) with P, w >= 1 and equal shapes, or
    400 `invalid_model`."""
    from posenc_check.graph import read_tensor

    try:
        values = (read_tensor(caches.cos_tensor, None), read_tensor(caches.sin_tensor, None))
    except Exception as err:  # a malformed tensor: protobuf and numpy raise many kinds
        message = f"cannot read the caches {caches.cos!r}, {caches.sin!r}: {err}"
        raise _invalid(message) from None
    shapes = [tuple(int(d) for d in value.shape) for value in values]
    if any(len(s) != 2 or 0 in s for s in shapes) or shapes[0] != shapes[1]:
        raise _invalid(
            f"the caches {caches.cos!r} {shapes[0]} and {caches.sin!r} {shapes[1]} are not two "
            "(P, d/2) tables of one shape"
        )
    return values


def _side_spec(base: SpecBase, caches: BakedCaches, dtype: str, rows: int) -> tuple[SpecBase, str]:
    """The base rope spec as the model's caches hold it (as `posenc-client verify` asks), and
    its key; a dtype or row count out of range is 422 `invalid_spec`."""
    seq_len = None
    if caches.threshold is not None:
        seq_len = caches.threshold + (1 if caches.side == "long" else 0)
    fields = {
        **base.model_dump(mode="json", exclude_none=True),
        "width": "half",
        "packing": "separate",
        "dtype": dtype,
        "max_positions": rows,
        "seq_len": seq_len,
    }
    return canonical_spec(fields)


async def _exact(state: AppState, spec: SpecBase, key: str) -> _Exact:
    """The exact table of `spec` (content key `key`) through the cache, checked against
    `max_response_bytes` before it is computed."""
    outputs = spec.outputs()
    check_size(state, outputs)
    size = sum(info.nbytes for info in outputs.values())
    entry, _ = await state.require_cache().get(spec, key)
    if size > OFFLOAD_BYTES:
        return await asyncio.to_thread(_Exact, spec, entry.table.tensors)
    return _Exact(spec, entry.table.tensors)


def _map(value: Any, exact: Any) -> dict[str, Any] | None:
    """Where one cache departs: `departures` as {"row_step", "col_step", "data"}; None when the
    shapes cannot be compared."""
    from posenc_check.verify import departures

    if value.ndim != 2 or exact.ndim != 2 or value.shape[1] != exact.shape[1]:
        return None
    grid = departures(value, exact, MAP_SIZE, MAP_SIZE)
    rows = min(value.shape[0], exact.shape[0])
    return {
        "row_step": math.ceil(rows / grid.shape[0]),
        "col_step": math.ceil(value.shape[1] / grid.shape[1]),
        "data": grid.tolist(),
    }


def _reports(
    caches: BakedCaches, values: tuple[Any, Any], exact: _Exact, exact_key: str
) -> list[dict[str, Any]]:
    """The cos and sin reports of one baked pair as JSON (`check_caches`, plus the summary
    line, the exact table's key and the departure map)."""
    from posenc_check.verify import check_caches

    pairs = zip(check_caches(caches, values, exact), values, ("cos", "sin"), strict=True)
    return [
        {
            **asdict(report),
            "line": report.line(),
            "exact_key": exact_key,
            "map": _map(value, exact[tensor]),
        }
        for report, value, tensor in pairs
    ]


@router.post(
    "/check/onnx",
    summary="How far the RoPE caches baked into an ONNX model are from a rope table, and why",
    responses={
        200: {
            "description": '{"key", "caches": [{"name", "nodes", "side", "shape", "dtype", '
            '"rows", "max_abs", "max_ulp", "first", "verdict", "diagnosis", "line", "exact_key", '
            '"map"}], '
            '"external": [{"name", "location"}]}'
        },
    },
    openapi_extra={
        "parameters": [
            {
                "name": "key",
                "in": "query",
                "required": True,
                "schema": {"type": "string"},
                "description": "content key of the rope table to compare with",
            }
        ],
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string"}}},
        },
    },
)
async def check_onnx(request: Request) -> Response:
    """Compare every cos/sin cache baked into the uploaded model with the table of `?key=`."""
    from posenc_check.graph import external_field, is_external
    from posenc_check.verify import baked_caches

    state = app_state(request)
    key, base = _key(state, request)
    check_content_encoding(request)
    body = await request.body()
    limit = state.settings.max_onnx_entries
    model = (
        await asyncio.to_thread(_parse, body, limit)
        if len(body) > OFFLOAD_BYTES
        else _parse(body, limit)
    )
    del body
    try:
        found = baked_caches(model)
    except (KeyError, IndexError, ValueError, TypeError, AttributeError) as err:
        raise _invalid(f"cannot read the model's RoPE nodes: {err!r}") from None
    if not found:
        message = (
            "no RoPE cache baked into the model: no RotaryEmbedding, com.microsoft."
            "RotaryEmbedding or GroupQueryAttention (do_rotary=1) reads cos/sin initializers"
        )
        raise ApiError(422, "no_rope_caches", message, [{"field": "(body)", "message": message}])
    reports: list[dict[str, Any]] = []
    external: list[dict[str, Any]] = []
    for caches in found:
        stored = [t for t in (caches.cos_tensor, caches.sin_tensor) if is_external(t)]
        if stored:
            external += [
                {"name": t.name, "location": external_field(t, "location")} for t in stored
            ]
            continue
        values = _values(caches)
        rows = int(values[0].shape[0])
        spec, exact_key = _side_spec(base, caches, values[0].dtype.name, rows)
        exact = await _exact(state, spec, exact_key)
        state.index.remember(exact_key, spec)  # GET /v1/tables/{exact_key} answers afterwards
        if sum(value.nbytes for value in values) > OFFLOAD_BYTES:
            reports += await asyncio.to_thread(_reports, caches, values, exact, exact_key)
        else:
            reports += _reports(caches, values, exact, exact_key)
    return json_response({"key": key, "caches": reports, "external": external})
