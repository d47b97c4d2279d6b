"""`POST /v1/check/onnx`: every RoPE site of an ONNX model against the exact table, and why it
departs (the explorer's check pane at /ui). `posenc-client verify` runs the same check locally:
both are `posenc_check.sites.find_sites` + `posenc_check.verify.check_site`/`outcome`, so both
give the same outcome per site (baked caches, tables gathered by position, folded cos/sin
constants, LongRoPE's If branches, frequency constants from torch.onnx.export and optimum;
sites whose values the model does not hold are `not_checkable` with the reason).

The body is the model (any media type; `Content-Encoding` refused). A model saved with external
data may be sent as its graph-only `.onnx`: caches stored in external data are not read (their
sites are `not_checkable`) and are listed under `external`, the model's weights are never
sent. The body is capped by `max_upload_bytes` from `Content-Length` before any of it is read,
and while it streams (the `Gate` middleware). `?key=` names the table to compare with: a rope
table this server resolved (a key of /v1/resolve, /v1/tables or a preset's). Its spec is taken
as `posenc-client verify` asks for it (`sites.TableRequest`): half width, the caches' dtype and
rows, and per side of a LongRoPE length switch (`If`) the `seq_len` at and past its
threshold; for frequency constants, its `inv_freq`.

Bounded cost: parsing, finding, reading, comparing, mapping and serialising run in worker
threads, never on the event loop, charged `WORK_FACTOR` times the body's bytes to the in-flight
budget while they run (503 `overloaded` when that does not fit); a model with more than
`posenc_check.sites.MAX_SITES` sites, or a tensor read as cos by one consumer and as sin by
another, is refused (422 `site_limit`) before any value is compared; the maps of one answer
hold at most `MAP_CELLS` cells in all.

Each report names `exact_key`, the table it was compared with (at /v1/tables/{exact_key}), and
carries `map`, the largest |model - exact| per block of positions and columns
(`posenc_check.verify.departures`, at most 256 x 256, less when many reports share
`MAP_CELLS`), which the page draws as a heatmap.

Answers `{"key", "outcome", "caches": [report...], "external": [{"name", "location"}]}`
(`outcome`: exact, repair, mismatch or not_checkable, as `posenc-client verify` exits 0, 8, 6,
9); errors: 400 `invalid_model` (not an ONNX model), 404 `unknown_key`, 413 `body_too_large` /
`too_large`, 422 `invalid_request` (`key` missing or not a rope table), 422 `no_rope_caches` (no
RoPE site in the model), 422 `site_limit` (past the bounds above), 422 `invalid_spec` (the
caches' rows or dtype out of range).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import torch
from fastapi import APIRouter, Request
from starlette.responses import Response

from posenc.api.caps import body_cap
from posenc.api.deps import app_state
from posenc.api.error_types import (
    BODY_TOO_LARGE,
    COMPUTE,
    INVALID_MODEL,
    INVALID_REQUEST,
    INVALID_SPEC,
    NO_ROPE_CACHES,
    SITE_LIMIT,
    TOO_LARGE,
    TOO_MANY_ENTRIES,
    UNKNOWN_KEY,
    UNSUPPORTED_MEDIA_TYPE,
    responses,
)
from posenc.api.errors import ApiError
from posenc.api.jsonio import check_content_encoding
from posenc.api.serving.table import check_size
from posenc.api.specs import canonical_spec
from posenc.api.state import AppState
from posenc.api.wire import TooManyEntries, count_graph_entries
from posenc.encodings import SpecBase, canonical_json
from posenc.runtime import OFFLOAD_BYTES

CPU = torch.device("cpu")
"""Where the check route computes its references."""

if TYPE_CHECKING:
    import onnx

    from posenc_check.sites import Site, TableRequest

# onnx and posenc_check are imported on the first check, not at start-up (as /v1/onnx does).

router = APIRouter(prefix="/v1", tags=["check"])

MAP_SIZE = 256
"""Largest side of a report's departure map."""
MAP_CELLS = 1 << 18
"""Most map cells in one answer, all reports together (a side shrinks as reports grow)."""
WORK_FACTOR = 4
"""The check's working memory, charged to the in-flight budget while it runs: this many times
the body's bytes (the body, the parsed model, the sites' values and their float64
temporaries, the answer)."""


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
        raise ApiError(INVALID_REQUEST, message, [{"field": "key", "message": message}])
    spec = state.index.get(key)
    if spec is None:
        raise ApiError(
            UNKNOWN_KEY,
            f"no table with key {key!r} is known here: resolve its config or preset first",
            {"key": key},
        )
    if spec.kind != "rope":
        message = f"key names a {spec.kind} table; the check compares RoPE caches (a rope table)"
        raise ApiError(INVALID_REQUEST, message, [{"field": "key", "message": message}])
    return key, spec


def _invalid(message: str) -> ApiError:
    return ApiError(INVALID_MODEL, message, [{"field": "(body)", "message": message}])


def _parse(body: bytes, max_entries: int) -> onnx.ModelProto:
    """The model, parsed once its entries are counted (`api/wire.py`: 413 `too_many_entries`
    past `max_entries`, before the parser allocates a message for each)."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        count_graph_entries(body, max_entries)
    except TooManyEntries as err:
        raise ApiError(
            TOO_MANY_ENTRIES,
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


@dataclass
class _Plan:
    """What the first worker-thread step found: every site with its values (or its
    not_checkable report) and the table it asks for, and the caches kept in external data."""

    sites: list[tuple[Site, Any, TableRequest | None]]
    external: list[dict[str, Any]]


def _plan(body: bytes, max_entries: int) -> _Plan:
    """Parse the model (at most `max_entries` graph entries) and find its sites, reading their
    values (worker thread)."""
    from posenc_check.graph import external_field, is_external
    from posenc_check.sites import BakedCaches, SiteLimitError, Unchecked, table_request
    from posenc_check.verify import read_site

    model = _parse(body, max_entries)
    try:
        sites = _find(model)
    except SiteLimitError as err:
        message = str(err)
        raise ApiError(SITE_LIMIT, message, [{"field": "(body)", "message": message}]) from None
    if not sites:
        message = (
            "no RoPE site in the model: no RotaryEmbedding, com.microsoft.RotaryEmbedding or "
            "GroupQueryAttention (do_rotary=1) reading cos/sin, no folded cos/sin constant and "
            "no RoPE frequency constant"
        )
        raise ApiError(NO_ROPE_CACHES, message, [{"field": "(body)", "message": message}])
    planned: list[tuple[Site, Any, TableRequest | None]] = []
    external: list[dict[str, Any]] = []
    for site in sites:
        if isinstance(site, BakedCaches):
            stored = [t for t in (site.cos_tensor, site.sin_tensor) if is_external(t)]
            external += [
                {"name": t.name, "location": external_field(t, "location")} for t in stored
            ]
        values = read_site(model, site, None)
        checkable = not isinstance(site, Unchecked) and isinstance(values, tuple)
        planned.append((site, values, table_request(site) if checkable else None))  # type: ignore[arg-type]
    return _Plan(planned, external)


def _find(model: onnx.ModelProto) -> list[Site]:
    from posenc_check.sites import find_sites

    try:
        return find_sites(model)
    except (KeyError, IndexError, TypeError, AttributeError) as err:
        raise _invalid(f"cannot read the model's RoPE nodes: {err!r}") from None


def _request_spec(base: SpecBase, request: TableRequest) -> tuple[SpecBase, str]:
    """The base rope spec as a site asks for it (as `posenc-client verify` asks): half-width
    caches of the site's dtype and rows (and `seq_len` on a side of a length switch), or the
    frequencies (16 rows: only inv_freq is read), and its key; a dtype or row count out of
    range is 422 `invalid_spec`."""
    fields = base.model_dump(mode="json", exclude_none=True)
    if request.what == "inv_freq":
        fields = {**fields, "max_positions": 16}
    else:
        fields = {
            **fields,
            "width": "half",
            "packing": "separate",
            "dtype": request.dtype,
            "max_positions": request.rows,
            "seq_len": request.seq_len,
        }
    return canonical_spec(fields)


async def _exact(state: AppState, spec: SpecBase, key: str) -> _Exact:
    """The exact table of `spec` (content key `key`) through the cache, checked against
    `max_response_bytes` before it is computed. Computed on the CPU whatever the server's
    device: the reference bytes (a GPU's cos/sin may differ by an ulp, docs/gpu.md), the ones
    ONNX exports bake and a model exported from transformers holds."""
    outputs = spec.outputs()
    check_size(state, outputs)
    size = sum(info.nbytes for info in outputs.values())
    entry, _ = await state.require_cache().get(spec, key, CPU)
    if size > OFFLOAD_BYTES:
        return await asyncio.to_thread(_Exact, spec, entry.table.tensors)
    return _Exact(spec, entry.table.tensors)


def _map(value: Any, exact: Any, side: int) -> dict[str, Any] | None:
    """Where one cache departs: `departures` (at most side x side blocks) as {"row_step",
    "col_step", "data"}; None when the shapes cannot be compared."""
    from posenc_check.verify import departures

    if value.ndim != 2 or exact.ndim != 2 or value.shape[1] != exact.shape[1]:
        return None
    grid = departures(value, exact, side, side)
    rows = min(value.shape[0], exact.shape[0])
    return {
        "row_step": math.ceil(rows / grid.shape[0]),
        "col_step": math.ceil(value.shape[1] / grid.shape[1]),
        "data": grid.tolist(),
    }


def _map_side(reports: int) -> int:
    """The side of each report's map: MAP_SIZE, less when the answer's reports would hold more
    than MAP_CELLS cells in all (at least 1)."""
    return max(1, min(MAP_SIZE, math.isqrt(MAP_CELLS // max(reports, 1))))


def _answer(key: str, plan: _Plan, exact: dict[TableRequest, tuple[_Exact, str]]) -> bytes:
    """Compare, diagnose, map and serialise (worker thread): the answer's bytes."""
    from posenc_check.sites import BakedCaches
    from posenc_check.verify import check_site, outcome

    checked = [
        (site, values, request, check_site(site, values, exact[request][0] if request else None))
        for site, values, request in plan.sites
    ]
    side = _map_side(sum(len(found) for *_, found in checked))
    reports: list[dict[str, Any]] = []
    for site, values, request, found in checked:
        table = exact[request] if request is not None else None
        for index, report in enumerate(found):
            value_map = None
            if table is not None and isinstance(values, tuple):
                if isinstance(site, BakedCaches):
                    pair = values[index], table[0][("cos", "sin")[index]]
                else:  # frequencies: one row
                    pair = values[0].reshape(1, -1), table[0]["inv_freq"].reshape(1, -1)
                value_map = _map(*pair, side)
            reports.append(
                {
                    **asdict(report),
                    "line": report.line(),
                    "exact_key": table[1] if table is not None else None,
                    "map": value_map,
                }
            )
    verdicts = [r for _, _, _, found in checked for r in found]
    answer = {
        "key": key,
        "outcome": outcome(verdicts),
        "caches": reports,
        "external": plan.external,
    }
    return orjson.dumps(answer)


@router.post(
    "/check/onnx",
    summary="Every RoPE site of an ONNX model against a rope table: one outcome each, and why",
    responses={
        200: {
            "description": '{"key", "outcome", "caches": [{"name", "nodes", "side", "shape", '
            '"dtype", "rows", "max_abs", "max_ulp", "first", "verdict", "diagnosis", "kind", '
            '"line", "exact_key", "map"}], "external": [{"name", "location"}]}'
        },
        **responses(
            BODY_TOO_LARGE,
            UNSUPPORTED_MEDIA_TYPE,
            INVALID_MODEL,
            TOO_MANY_ENTRIES,
            INVALID_REQUEST,
            UNKNOWN_KEY,
            TOO_LARGE,
            NO_ROPE_CACHES,
            SITE_LIMIT,
            INVALID_SPEC,
            COMPUTE,
        ),
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
@body_cap("max_upload_bytes")
async def check_onnx(request: Request) -> Response:
    """Check every RoPE site of the uploaded model against the table of `?key=`: parse, find and
    read in a worker thread, the exact tables through the cache, then compare, map and
    serialise in a worker thread (the event loop keeps answering meanwhile)."""
    state = app_state(request)
    key, base = _key(state, request)
    check_content_encoding(request)
    body = await request.body()
    limit = state.settings.max_onnx_entries
    budget = state.require_cache().budget
    lease = budget.acquire(object(), WORK_FACTOR * len(body)) if budget is not None else None
    try:
        plan = await asyncio.to_thread(_plan, body, limit)
        del body
        exact: dict[TableRequest, tuple[_Exact, str]] = {}
        for _, _, table_request in plan.sites:
            if table_request is None or table_request in exact:
                continue
            spec, exact_key = _request_spec(base, table_request)
            exact[table_request] = (await _exact(state, spec, exact_key), exact_key)
            state.index.remember(exact_key, spec)  # GET /v1/tables/{exact_key} answers later
        answer = await asyncio.to_thread(_answer, key, plan, exact)
    finally:
        if lease is not None:
            lease.release()
    return Response(answer, media_type="application/json")
