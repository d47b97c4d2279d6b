"""`/v1/onnx`: verified ONNX subgraphs of the tables, cached and content-addressed like them.

- `GET /v1/onnx`: the graphs posenc exports and what each supports.
- `POST /v1/onnx` with `{"spec": <spec object>}` (fields, `hf_config` plus overrides, or a
  preset: `api/specs.py`; the last two may also stand at the top level) plus the export options
  `graph`, `opset`, `mode`, `op`, `num_heads`, `inputs`, `role` -> the model bytes; its stable
  URL is in `Content-Location`.
- `GET /v1/onnx/{key}`: the model by export key, immutable (ETag, 304 on If-None-Match).

A model is built and verified (checker, shape inference, one onnxruntime run against the torch
table) in a worker thread before it is first served, at most once per export key at a time. The
bytes are kept in the table cache as a prepared variant of the spec's table entry, so they share
its byte budget, eviction and `Busy` limits. Graph-only kinds (`posenc.onnx.ONNX_SPECS`: CoPE)
have no table: their models are kept in a small byte-bounded LRU of their own. A verification
failure answers 500 `export` and is logged: a wrong graph is never sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from posenc.api.deps import State
from posenc.api.error_types import (
    BODY,
    COMPUTE,
    EXPORT,
    SPEC,
    TOO_LARGE,
    UNKNOWN_KEY,
    UNKNOWN_TABLE,
    UNSUPPORTED_EXPORT,
    responses,
)
from posenc.api.errors import ApiError
from posenc.api.jsonio import json_response, read_json_object
from posenc.api.serving.bind import bind_tables, stored_tables, unbound
from posenc.api.serving.conditional import IMMUTABLE, NOT_MODIFIED, not_modified
from posenc.api.serving.digest import repr_digest
from posenc.api.specs import guarded, spec_from_object
from posenc.api.state import AppState
from posenc.encodings import FieldProblem, SpecBase, SpecError, content_key

if TYPE_CHECKING:
    from posenc.onnx import Resolved

# The ONNX stack (onnx_ir, onnxscript, onnxruntime: a large share of start-up, docs/benchmarks.md
# section 4) is imported by the handlers below on the first /v1/onnx request, not at start-up.

log = logging.getLogger("posenc.api")

router = APIRouter(prefix="/v1", tags=["onnx"])

MEDIA_TYPE = "application/octet-stream"
OPTION_FIELDS = ("graph", "opset", "mode", "op", "num_heads", "inputs", "role")
INDEX_CAPACITY = 4096
TABLELESS_BYTES = 64 << 20
"""Budget of the models of graph-only kinds (no table entry to hold them)."""


@dataclass
class OnnxIndex:
    """Export key -> resolved request (bounded LRU, so GET can rebuild an evicted model) and
    the builds in flight (one per key)."""

    recent: OrderedDict[str, Resolved] = field(default_factory=OrderedDict)
    flights: dict[str, asyncio.Task[tuple[bytes, str]]] = field(default_factory=dict)
    tableless: OrderedDict[str, tuple[bytes, str]] = field(default_factory=OrderedDict)

    def remember(self, request: Resolved) -> None:
        self.recent[request.key] = request
        self.recent.move_to_end(request.key)
        while len(self.recent) > INDEX_CAPACITY:
            self.recent.popitem(last=False)

    def keep(self, key: str, data: bytes, digest: str) -> None:
        """Keep a graph-only model and its digest, evicting the least recently used past
        `TABLELESS_BYTES`."""
        self.tableless[key] = (data, digest)
        self.tableless.move_to_end(key)
        while sum(len(d) for d, _ in self.tableless.values()) > TABLELESS_BYTES:
            self.tableless.popitem(last=False)


async def onnx_index(request: Request) -> OnnxIndex:
    """Dependency: this app's `OnnxIndex` (created on first use: it holds no resources)."""
    index: OnnxIndex | None = getattr(request.app.state, "posenc_onnx", None)
    if index is None:
        index = OnnxIndex()
        request.app.state.posenc_onnx = index
    return index


Models = Annotated[OnnxIndex, Depends(onnx_index)]


def _request_from_body(body: dict[str, Any]) -> Resolved:
    """Body -> resolved export request; raises `SpecError` (422) / `ApiError` (400)."""
    from posenc.onnx import ONNX_SPECS, graphs_for, options_from, parse_export_spec, resolve

    rest = {k: v for k, v in body.items() if k not in OPTION_FIELDS}
    spec: SpecBase
    if "spec" in rest:
        if set(rest) != {"spec"}:
            extra = sorted(set(rest) - {"spec"})
            raise SpecError(
                "unknown fields next to spec",
                [FieldProblem(name, "unknown field", rest[name]) for name in extra],
            )
        data = rest["spec"]
    elif rest:
        data = rest  # a spec object at the top level: hf_config or preset (and overrides)
    else:
        raise SpecError(
            "give spec (or hf_config, or preset)",
            [FieldProblem("spec", "required", None)],
        )
    if isinstance(data, dict) and isinstance(data.get("kind"), str) and data["kind"] in ONNX_SPECS:
        spec = guarded("spec", lambda: parse_export_spec(data).canonical())
    else:
        spec, _ = spec_from_object(data)
    graph = body.get("graph")
    if graph is None:
        known = graphs_for(spec.kind)
        if not known:
            raise SpecError(
                f"no ONNX graph for kind {spec.kind!r}",
                [FieldProblem("kind", "no exporter", spec.kind)],
            )
        graph = known[0]
    options = options_from(graph, **{k: body.get(k) for k in OPTION_FIELDS[1:]})
    return resolve(spec, options)


def _build_verified(request: Resolved) -> tuple[bytes, str]:
    """Worker thread: the model, verified, serialised, and its `Repr-Digest`."""
    from posenc.onnx import build, verify

    model = build(request)
    verify(model, request.spec)
    data: bytes = model.SerializeToString()
    return data, repr_digest(data)


async def _model_bytes(
    state: AppState, index: OnnxIndex, request: Resolved
) -> tuple[bytes, str, str]:
    """(verified model bytes, their `Repr-Digest`, cache outcome): from the table entry's
    prepared variants (or the graph-only LRU), else built once in a thread and kept there, the
    digest beside the bytes (computed once, with the build)."""
    from posenc.onnx import ONNX_SPECS

    if request.spec.kind in ONNX_SPECS:
        kept = index.tableless.get(request.key)
        if kept is not None:
            index.tableless.move_to_end(request.key)
            return *kept, "hit"
        (data, digest), outcome = await _built(index, request)
        index.keep(request.key, data, digest)
        return data, digest, outcome
    cache, store = state.require_cache(), state.require_tables()
    spec_key = content_key(request.spec)
    entry, _ = await cache.get(bind_tables(cache, store, request.spec, spec_key), spec_key)
    variant = ("onnx", request.key)
    ready = entry.prepared.get(variant)
    known = entry.digests.get(variant)
    if isinstance(ready, bytes) and known is not None:
        return ready, known, "hit"
    # learned and relative_index graphs embed their weights: the build needs the uploaded values
    (data, digest), outcome = await _built(
        index, replace(request, spec=stored_tables(store, request.spec))
    )
    entry.digests[variant] = digest
    await cache.prepare(entry, variant, lambda _table: data)
    return data, digest, outcome


async def _built(index: OnnxIndex, request: Resolved) -> tuple[tuple[bytes, str], str]:
    """The verified model, built in a thread once per export key however many ask at once."""
    from posenc.onnx import ExportError

    flight = index.flights.get(request.key)
    outcome = "coalesced"
    if flight is None:
        outcome = "miss"
        flight = asyncio.get_running_loop().create_task(asyncio.to_thread(_build_verified, request))
        index.flights[request.key] = flight
        flight.add_done_callback(lambda _: index.flights.pop(request.key, None))
    try:
        data = await asyncio.shield(flight)
    except ExportError as err:
        log.error("ONNX export %s failed verification: %s %s", request.key, err, err.detail)
        raise ApiError(EXPORT, str(err), err.detail) from None
    return data, outcome


async def _serve(
    request: Request,
    state: AppState,
    index: OnnxIndex,
    resolved: Resolved,
    *,
    cache_control: str | None,
) -> Response:
    key = resolved.key
    exporter = resolved.exporter
    headers = {
        "ETag": f'"{key}"',
        "Content-Location": f"/v1/onnx/{key}",
        "X-Posenc-Key": key,
        "X-Posenc-Spec-Key": content_key(resolved.spec),
        "X-Posenc-Graph": exporter.name,
        "X-Posenc-Opset": str(resolved.options.opset),
        "Content-Disposition": f'attachment; filename="{exporter.kind}-{exporter.graph}-'
        f'{key[:16]}.onnx"',
    }
    if cache_control:
        headers["Cache-Control"] = cache_control
    unchanged = not_modified(request, headers)
    if unchanged is not None:
        return unchanged
    size = resolved.spec.output_bytes()
    limit = state.settings.max_response_bytes
    if size > limit:
        raise ApiError(
            TOO_LARGE,
            f"the spec's table is {size} bytes, over the limit of {limit} bytes; ask for fewer "
            "positions (mode compute reads max_positions as its verification range only)",
            {"size_bytes": size, "max_bytes": limit},
        )
    data, digest, outcome = await _model_bytes(state, index, resolved)
    headers["X-Posenc-Cache"] = outcome
    headers["Repr-Digest"] = digest
    return Response(data, media_type=MEDIA_TYPE, headers=headers)


@router.get("/onnx", summary="The ONNX graphs posenc exports and what each supports")
async def list_graphs() -> Response:
    """One entry per (kind, graph): modes, ops, input styles; opsets 17..23."""
    from posenc.onnx import DEFAULT_OPSET, EXPORTERS, OPSETS

    graphs = [exporter.describe() for exporter in EXPORTERS.values()]
    return json_response({"graphs": graphs, "opsets": list(OPSETS), "default_opset": DEFAULT_OPSET})


@router.post(
    "/onnx",
    summary="A verified ONNX subgraph for a spec or a config.json",
    responses={
        200: {"description": "The model (ONNX protobuf)", "content": {MEDIA_TYPE: {}}},
        **responses(BODY, SPEC, UNSUPPORTED_EXPORT, TOO_LARGE, EXPORT, COMPUTE),
    },
)
async def post_onnx(request: Request, state: State, index: Models) -> Response:
    """The model for the spec and options in the body; its stable URL is in Content-Location."""
    resolved = _request_from_body(await read_json_object(request))
    index.remember(replace(resolved, spec=unbound(resolved.spec)))
    return await _serve(request, state, index, resolved, cache_control=None)


@router.get(
    "/onnx/{key}",
    summary="An ONNX model by export key (any key this server built)",
    responses={
        200: {"description": "The model (ONNX protobuf)", "content": {MEDIA_TYPE: {}}},
        304: NOT_MODIFIED,
        **responses(UNKNOWN_KEY, UNKNOWN_TABLE, TOO_LARGE, EXPORT, COMPUTE),
    },
)
async def get_onnx(request: Request, state: State, index: Models) -> Response:
    """The model for `key`: immutable, so cacheable forever; 304 on a matching If-None-Match."""
    key: str = request.path_params["key"]
    resolved = index.recent.get(key)
    if resolved is None:
        raise ApiError(
            UNKNOWN_KEY,
            f"no ONNX model with key {key!r} is known here: POST its request to /v1/onnx first",
            {"key": key},
        )
    return await _serve(request, state, index, resolved, cache_control=IMMUTABLE)
