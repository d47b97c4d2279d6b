"""`/v1/tables`: compute (or find) a table and send it in the negotiated format.

- `POST /v1/tables`: the body is a spec (`kind` selects the family) or `{"hf_config": {...},
  "kind"?, "layer_type"?, ...overrides}`; parsed, canonicalised and keyed once per distinct body
  (`SPECS`), and remembered in the key index so that its stable URL answers afterwards.
- `GET /v1/tables/{key}.{spec}`: the table whose canonical spec the URL carries (checked against
  the key: `posenc.api.tableurl`); any replica answers it with no shared state, and it is the URL
  the server hands out (`Content-Location`, `/v1/resolve`, `/v1/presets`); immutable.
- `GET /v1/tables/{key}`: the table of any key this process resolved, or a preset's (kept for
  compatibility: another replica, or this one after a restart, answers 404 `unknown_key`).
- `GET /v1/tables/{key}[.{spec}]/preview`: a strided sample of one tensor as JSON, at most
  `max_points` elements (`serving.preview.serve_preview`): what the explorer (`/ui`) plots, so a
  131072-position table is looked at without sending it whole.

Both are hot routes, marked `@hot` (`posenc.api.hot`: no FastAPI dependencies, the query read
from the request);
sending a table (limits, format, ETags, 304, the cache) is `serving.table.serve_table`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.types import Scope

from posenc.api.deps import app_state
from posenc.api.error_types import (
    BODY,
    COMPUTE,
    SPEC,
    TABLE,
    TABLE_URL,
    UNKNOWN_KEY,
    UNKNOWN_TABLE,
    responses,
)
from posenc.api.errors import ApiError
from posenc.api.hot import answered_by, hot
from posenc.api.jsonio import read_body, read_json_object, replaying
from posenc.api.memo import JsonMemo
from posenc.api.serving.bind import unbound
from posenc.api.serving.body import ReadyResponse
from posenc.api.serving.conditional import IMMUTABLE, NOT_MODIFIED
from posenc.api.serving.params import TABLE_PARAMETERS, TABLE_RESPONSES
from posenc.api.serving.prepared import Prepared, Signature, post_signature, signature
from posenc.api.serving.preview import (
    PREVIEW_ERRORS,
    PREVIEW_PARAMETERS,
    PreviewQuery,
    serve_preview,
)
from posenc.api.serving.query import TableQuery
from posenc.api.serving.table import serve_table
from posenc.api.specs import spec_from_object
from posenc.api.state import AppState
from posenc.api.tableurl import parse_segment
from posenc.encodings import SpecBase
from posenc.runtime import CacheEntry, TableCache

router = APIRouter(prefix="/v1", tags=["tables"])

SPECS: JsonMemo[tuple[SpecBase, str]] = JsonMemo()
"""POST bodies -> (canonical spec, key), once per distinct body."""

SPEC_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "description": "A spec (`kind` selects the family; see GET /v1/kinds) or "
                '{"hf_config": {...config.json...}, "kind"?, "layer_type"?, ...overrides}.',
            },
            "examples": {
                "rope": {
                    "summary": "Llama 3.1 RoPE, 8192 positions",
                    "value": {
                        "kind": "rope",
                        "head_dim": 128,
                        "rope_theta": 500000.0,
                        "max_positions": 8192,
                        "rope_scaling": {
                            "rope_type": "llama3",
                            "factor": 8.0,
                            "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192,
                        },
                    },
                },
                "alibi": {"summary": "ALiBi slopes", "value": {"kind": "alibi", "num_heads": 12}},
                "hf_config": {
                    "summary": "from a config.json",
                    "value": {
                        "hf_config": {
                            "model_type": "llama",
                            "hidden_size": 4096,
                            "num_attention_heads": 32,
                            "max_position_embeddings": 4096,
                            "rope_theta": 10000.0,
                        }
                    },
                },
            },
        }
    },
}


Hit = tuple[TableCache, CacheEntry, Prepared]
"""A prepared answer the route gives: the cache, the resident entry and the answer."""


def _prepared(state: AppState, shape: Signature, post: bool) -> Hit | None:
    """The prepared answer to a request of `shape` (to `POST /v1/tables` when `post`, else to
    `GET /v1/tables/{key}`), or None. A POST remembers the key of the spec it names, as the full
    path does; a GET remembers a key its URL carries, as `_known` does, and has none for a bare
    key this process no longer knows (`_known` refuses it, 404)."""
    cache = state.cache
    found = state.prepared.find(cache, shape) if cache is not None else None
    if cache is None or found is None:
        return None
    entry, prepared = found
    if post or state.index.get(prepared.key) is None:
        if not (post or prepared.carried):
            return None
        state.index.remember(prepared.key, prepared.spec)
    return cache, entry, prepared


def _ready(
    state: AppState, shape: Signature | None, post: bool, max_bytes: int
) -> ReadyResponse | None:
    """The routes' `ReadyAnswer` (`api/hot.py`): the prepared answer of `shape` the endpoint
    would send (`_prepared`), when it is at most `max_bytes` and its charges fit."""
    hit = _prepared(state, shape, post) if shape is not None else None
    return state.prepared.try_send(*hit, max_bytes) if hit is not None else None


def ready_post(
    state: AppState, scope: Scope, body: bytes | bytearray, max_bytes: int
) -> ReadyResponse | None:
    """`post_table`'s ready answer (`ReadyAnswer`)."""
    return _ready(state, post_signature(scope, body), True, max_bytes)


def ready_get(
    state: AppState, scope: Scope, body: bytes | bytearray, max_bytes: int
) -> ReadyResponse | None:
    """`get_table`'s ready answer (`ReadyAnswer`; a GET with a body is the route's to answer)."""
    if body:
        return None
    return _ready(state, signature(scope, "get_table"), False, max_bytes)


@router.post(
    "/tables",
    summary="Compute (or fetch from the cache) the table for a spec or a config.json",
    responses={**TABLE_RESPONSES, **responses(BODY, SPEC, TABLE, COMPUTE)},
    openapi_extra={"requestBody": SPEC_BODY, "parameters": TABLE_PARAMETERS},
)
@hot
@answered_by(ready_post)
async def post_table(request: Request) -> Response:
    """The table for the spec in the body; its stable URL is in `Content-Location`."""
    state = app_state(request)
    shape = raw = None
    if signature(request.scope, "post_table") is not None:  # no per-request headers
        raw = await read_body(request.receive)
        shape = post_signature(request.scope, raw)
    hit = _prepared(state, shape, True) if shape is not None else None
    if hit is not None:
        return state.prepared.send(*hit)
    if raw is not None:  # read already: the full path reads it from here
        request = Request(request.scope, replaying(raw, request.receive))
    body = await read_json_object(request)
    spec, key = SPECS.get(body, lambda: spec_from_object(body))
    state.index.remember(key, unbound(spec))
    return await serve_table(
        request,
        state,
        spec,
        key,
        TableQuery.from_request(request),
        cache_control=None,
        shape=shape,
    )


@router.get(
    "/tables/{key}",
    summary="A table by URL: {key}.{spec} (any replica), or a content key this server resolved",
    responses={
        **TABLE_RESPONSES,
        304: NOT_MODIFIED,
        **responses(TABLE_URL, TABLE, UNKNOWN_TABLE, COMPUTE),
    },
    openapi_extra={
        "parameters": [
            {
                "name": "key",
                "in": "path",
                "required": True,
                "schema": {"type": "string"},
                "description": "`{key}.{spec}` as handed out in Content-Location and `url` "
                "(64 hex digits, a dot, base64url of the deflated canonical spec JSON): any "
                "replica answers it; or the bare key (64 hex digits), which only a server that "
                "resolved it knows",
            },
            *TABLE_PARAMETERS,
        ]
    },
)
@hot
@answered_by(ready_get)
async def get_table(request: Request) -> Response:
    """The table the URL names: immutable, so cacheable forever; 304 on a matching
    If-None-Match."""
    state = app_state(request)
    shape = signature(request.scope, "get_table")
    hit = _prepared(state, shape, False) if shape is not None else None
    if hit is not None:
        return state.prepared.send(*hit)
    segment = request.path_params["key"]
    key, spec = _known(state, segment)
    return await serve_table(
        request,
        state,
        spec,
        key,
        TableQuery.from_request(request),
        cache_control=IMMUTABLE,
        shape=shape,
        carried="." in segment,
    )


def _known(state: AppState, segment: str) -> tuple[str, SpecBase]:
    """(content key, canonical spec) of a `/v1/tables/` path segment: the key index's spec
    when this process knows the key (it may hold an inline weight table the URL names only by
    `table_key`), else the spec the URL carries (`{key}.{spec}`, verified either way); 404
    `unknown_key` for a bare key this process has not resolved."""
    key, carried = parse_segment(segment)
    spec = state.index.get(key)  # may hold more than the URL: an inline weight table, bound
    if spec is None and carried is not None:
        state.index.remember(key, carried)  # its output shapes are memoised while known
        return key, carried
    if spec is None:
        raise ApiError(
            UNKNOWN_KEY,
            f"no table with key {key!r} is known here: GET the URL the server handed out "
            "(Content-Location, or the `url` of /v1/resolve: /v1/tables/{key}.{spec}), which any "
            "replica answers, or POST the spec to /v1/tables",
            {"key": key},
        )
    return key, spec


@router.get(
    "/tables/{key}/preview",
    summary="A strided sample of one tensor of a table, as JSON (at most max_points elements)",
    responses={
        200: {
            "description": '{"key", "kind", "tensor", "dtype", "shape", "row_axis", '
            '"axes": [{"start", "step", "count"}], "data"}'
        },
        304: NOT_MODIFIED,
        **responses(TABLE_URL, PREVIEW_ERRORS, UNKNOWN_TABLE, COMPUTE),
    },
    openapi_extra={
        "parameters": [
            {
                "name": "key",
                "in": "path",
                "required": True,
                "schema": {"type": "string"},
                "description": "`{key}.{spec}` (any replica) or a bare content key",
            },
            *PREVIEW_PARAMETERS,
        ]
    },
)
async def get_preview(request: Request) -> Response:
    """At most `max_points` elements of one tensor (`rows` narrows its position axis first),
    every k-th along each axis: a large table explored without sending it whole."""
    state = app_state(request)
    key, spec = _known(state, request.path_params["key"])
    query = PreviewQuery.from_request(request)
    minus = _known(state, query.minus) if query.minus is not None else None
    return await serve_preview(request, state, spec, key, query, minus)
