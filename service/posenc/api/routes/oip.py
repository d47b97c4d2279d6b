"""`/v2`: the routes of the Open Inference Protocol (KServe v2); health routes are in `health`.

    GET  /v2                                         server metadata
    GET  /v2/models/{model}[/versions/{version}]     model metadata
    GET  /v2/models/{model}[/versions/{version}]/ready
    GET  /v2/models/{model}[/versions/{version}]/config
    POST /v2/models/{model}[/versions/{version}]/infer
    GET  /v2/models/stats, /v2/models/{model}[/versions/{version}]/stats
                                                     inference statistics (`oip/stats.py`)
    POST /v2/repository/index                        every model, READY or UNAVAILABLE

Every error is `{"error": message}` (what tritonclient decodes) with 400 (bad input), 404 (unknown
model or version, or a weight table key not uploaded), 413 (a body over `max_infer_body_bytes`,
as sent or decompressed, or outputs over `max_response_bytes`) or 503 (model readiness while
warming up or draining, a server starting or stopping, too many computations in flight: with
Retry-After); the mapping is `error_response` below, over `posenc.api.oip.errors` (shared with
gRPC). The infer route reads the raw body: tritonclient's sync client sends no Content-Type.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Receive, Scope

import posenc
from posenc.api.caps import body_cap
from posenc.api.deps import app_state
from posenc.api.hot import answered_by, hot
from posenc.api.oip import EXTENSIONS
from posenc.api.oip.codec import (
    OipError,
    OutputTensor,
    decompress,
    encode_infer_response,
    error_body,
    parse_infer_request,
)
from posenc.api.oip.context import OipContext
from posenc.api.oip.errors import INTERNAL_MESSAGE, as_oip_error
from posenc.api.oip.models import MODELS, VERSION, OipModel, find_model
from posenc.api.oip.stats import InferTimer
from posenc.api.serving.body import BodyResponse, ReadyResponse
from posenc.api.state import AppState
from posenc.runtime import TableCache
from posenc.verified import VERIFIED_AGAINST

log = logging.getLogger("posenc.api.oip")


ContextGetter = Callable[[Request], OipContext]


def error_response(exc: Exception) -> Response:
    """`{"error": message}` with the status `as_oip_error` gives `exc` (the one /v2 mapping)."""
    error = as_oip_error(exc)
    if isinstance(exc, ClientDisconnect):
        # an incomplete request, answered to no one: not a bug of ours (no traceback)
        log.info("client disconnected before its request body arrived")
    if error is None:
        log.exception("unhandled error in /v2", exc_info=exc)
        error = OipError(500, INTERNAL_MESSAGE)
    return Response(
        error_body(error.message), error.status, error.headers, media_type="application/json"
    )


def _json(body: Any) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")


async def _guarded(fn: Callable[[], Awaitable[Response]]) -> Response:
    try:
        return await fn()
    except Exception as exc:
        return error_response(exc)


def _body_headers(scope: Scope) -> tuple[bytes | None, bytes | None, bytes | None]:
    """The first `Content-Length`, `Content-Encoding` and `Inference-Header-Content-Length` of a
    request (raw values; None when absent), in one pass over its headers."""
    length = encoding = header_length = None
    for name, value in scope["headers"]:
        if name == b"content-length":
            length = value if length is None else length
        elif name == b"content-encoding":
            encoding = value if encoding is None else encoding
        elif name == b"inference-header-content-length":
            header_length = value if header_length is None else header_length
    return length, encoding, header_length


async def _read_body(
    receive: Receive, limit: int, declared: bytes | None, encoding: bytes | None
) -> bytes:
    """The request body, read from the ASGI `receive` as Starlette's `Request.stream` reads it
    (`ClientDisconnect` when the client goes), without its per-chunk generator: 413 over `limit`
    (the declared `Content-Length` before anything is read), then undone from `encoding`."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        text = declared.decode()
        raise OipError(413, f"request body of {text} bytes exceeds the limit of {limit}")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.request":
            chunk: bytes = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise OipError(413, f"request body exceeds the limit of {limit} bytes")
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        elif message["type"] == "http.disconnect":
            raise ClientDisconnect()
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return decompress(body, None if encoding is None else encoding.decode("latin-1"), limit)


Handler = Callable[[Request, str, "str | None"], Awaitable[Response]]


def _bind(handler: Handler) -> tuple[Callable[..., Awaitable[Response]], ...]:
    """The handler as two endpoints: without and with the `{version}` path parameter."""

    async def plain(request: Request, model: str) -> Response:
        return await handler(request, model, None)

    async def versioned(request: Request, model: str, version: str) -> Response:
        return await handler(request, model, version)

    return plain, versioned


UNKNOWN_MODEL = {404: "Unknown model or version"}
READY_ERRORS = {**UNKNOWN_MODEL, 503: "The server is not ready (warming up or draining)"}
INFER_ERRORS = {
    **UNKNOWN_MODEL,
    400: "Malformed request, inputs or parameters (the message names them), or a body that "
    "is not the gzip or deflate its Content-Encoding says (tritonclient's compression)",
    413: "Body over max_infer_body_bytes (as sent or decompressed), or the outputs over "
    "max_response_bytes",
    503: "Too many computations in flight (Retry-After), or the server is starting",
}
"""Each /v2 model route's error statuses (`{"error"}` bodies, `oip/errors.py`: the protocol has
no error_type)."""


def oip_responses(errors: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """A /v2 model route's error responses for its decorator, with the `OipError` body."""
    schema = {"$ref": "#/components/schemas/OipError"}
    return {
        status: {"description": text, "content": {"application/json": {"schema": schema}}}
        for status, text in errors.items()
    }


def infer_route(endpoint: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """An infer endpoint: a hot route (`@hot`), its body capped by `max_infer_body_bytes`, its
    templated decode steps answered by the server (`ready_infer`)."""
    return answered_by(ready_infer)(body_cap("max_infer_body_bytes")(hot(endpoint)))


def ready_infer(
    state: AppState, scope: Scope, body: bytes | bytearray, max_bytes: int
) -> ReadyResponse | None:
    """The infer endpoint's ready answer (`ReadyAnswer`, api/hot.py): a decode step its
    template answers (`StepTemplates.ready`, as the endpoint's `steps.answer`)."""
    _, encoding, header_length = _body_headers(scope)
    cache = state.cache
    if encoding is not None or cache is None or len(body) > max_bytes:
        return None
    return state.steps.ready(
        cache,
        scope["path"],
        header_length,
        bytes(body),
        state.metrics.observe_infer,
        state.stats,
        max_bytes,
    )


def _index_request(body: bytes) -> bool:
    """`ready` of a repository index request: an empty body (tritonclient's) or a JSON object
    with `repository_name` (a string, ignored: there is one repository) and `ready` (a boolean:
    only the models ready to infer)."""
    if not body.strip():
        return False
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise OipError(400, f"the repository index request is not JSON: {err}") from err
    if not isinstance(parsed, dict) or set(parsed) - {"repository_name", "ready"}:
        raise OipError(400, "a repository index request is {repository_name?, ready?}")
    ready = parsed.get("ready", False)
    if not isinstance(ready, bool) or not isinstance(parsed.get("repository_name", ""), str):
        raise OipError(400, "ready is a boolean, repository_name a string")
    return ready


def build_router(context: ContextGetter) -> tuple[APIRouter, APIRouter]:
    """(server router: `GET /v2`, model router: `/v2/models/...`). API keys, when set, guard
    the model routes through the app's `Gate` middleware (`/v2/models` prefix); `/v2` is open.

    `context(request)` returns the app's `OipContext` (`posenc.api.deps.oip_context`).
    """
    server = APIRouter(tags=["v2"])
    models = APIRouter(prefix="/v2/models", tags=["v2"])

    @server.get("/v2", summary="Server metadata (KServe v2)")
    async def server_metadata() -> Response:
        return _json(
            {
                "name": "posenc",
                "version": posenc.__version__,
                "extensions": list(EXTENSIONS),
                "verified_against": dict(VERIFIED_AGAINST),
            }
        )

    async def metadata(request: Request, model: str, version: str | None = None) -> Response:
        async def run() -> Response:
            return _json(find_model(model, version).metadata())

        return await _guarded(run)

    async def ready(request: Request, model: str, version: str | None = None) -> Response:
        async def run() -> Response:
            find_model(model, version)
            if not context(request).ready():
                raise OipError(503, "the server is not ready (warming up or draining)")
            return Response(status_code=200)

        return await _guarded(run)

    async def config(request: Request, model: str, version: str | None = None) -> Response:
        async def run() -> Response:
            return _json(find_model(model, version).config(context(request)))

        return await _guarded(run)

    async def infer(request: Request, model: str, version: str | None = None) -> Response:
        # `_guarded` written out: one decode step is a few dozen µs, two frames a few of them
        try:
            found = find_model(model, version)
            # like /v1, inference is served while presets warm and while draining (readiness
            # tells load balancers); only a server without its cache answers 503
            state = app_state(request)
            cache = state.require_cache()
            timer = state.stats.timer(found.name)
            try:
                return await answer(request, found, state, cache, timer)
            except BaseException:
                timer.failed()
                raise
        except Exception as exc:
            return error_response(exc)

    async def answer(
        request: Request, found: OipModel, state: AppState, cache: TableCache, timer: InferTimer
    ) -> Response:
        """The inference's response, each phase timed (`oip/stats.py`)."""
        scope = request.scope
        declared, encoding, header_length = _body_headers(scope)
        limit = state.settings.max_infer_body_bytes
        body = await _read_body(request.receive, limit, declared, encoding)
        steps = state.steps if encoding is None else None
        if steps is not None:
            # a decode step whose shape was answered before: its rows sliced from the cached
            # table (`oip/steps.py`), counted as a cache hit; no `OipContext` is built for it
            step = steps.answer(
                cache, scope["path"], header_length, body, state.metrics.observe_infer, timer
            )
            if step is not None:
                timer.succeeded("hit")
                return step
        service = context(request)
        length = None if header_length is None else header_length.decode("latin-1")
        parsed = parse_infer_request(body, length)
        timer.mark("compute_input")
        # the outputs and computed rows are charged to the in-flight budget by the model
        # (`admit`, `OipContext.compute`); released when sent, or here on any failure
        try:
            try:
                result = await found.infer(service, parsed)
            finally:
                service.release_work()
            timer.mark("compute_infer")
            outputs = [
                OutputTensor(name, t, parsed.binary(name)) for name, t in result.tensors.items()
            ]
            # binary outputs on the CPU are sent as views (no work); JSON and GPU copies are
            work = sum(
                t.numel() * t.element_size()
                for o, t in zip(outputs, result.tensors.values(), strict=True)
                if not o.binary or t.device.type != "cpu"
            )
            encoded = await service.offload(
                lambda: encode_infer_response(
                    found.name, VERSION, parsed.id, outputs, result.parameters
                ),
                work,
            )
        except BaseException:
            service.release()
            raise
        timer.mark("compute_output")
        source = str(result.parameters.get("posenc_source", ""))
        if service.observe is not None:
            service.observe(found.name, source)
        timer.succeeded(source)
        charge = service.charged
        response = BodyResponse(
            list(encoded.parts), 200, encoded.headers, encoded.media_type, service.take_held()
        )
        entry = service.entry
        binary = all(o.binary for o in outputs)
        if steps is not None and result.rows_of is not None and entry is not None and binary:
            head = bytes(encoded.parts[0])
            await steps.keep(
                service.cache,
                scope["path"],
                header_length,
                body,
                parsed,
                entry,
                result.rows_of,
                found.name,
                head,
                response,
                charge,
            )
        return response

    async def statistics(request: Request, model: str, version: str | None = None) -> Response:
        async def run() -> Response:
            found = find_model(model, version)
            stats = context(request).stats
            return _json({"model_stats": [stats.get(found.name).as_json(found.name, VERSION)]})

        return await _guarded(run)

    # before the model routes: `/v2/models/stats` is not the metadata of a model named "stats"
    @models.get("/stats", summary="Every model's inference statistics (Triton's extension)")
    async def all_statistics(request: Request) -> Response:
        async def run() -> Response:
            stats = context(request).stats
            every = [stats.get(name).as_json(name, VERSION) for name in sorted(MODELS)]
            return _json({"model_stats": every})

        return await _guarded(run)

    for template, endpoint in zip(
        ("/{model}/stats", "/{model}/versions/{version}/stats"), _bind(statistics), strict=True
    ):
        models.add_api_route(
            template,
            endpoint,
            methods=["GET"],
            summary="Model inference statistics (Triton's extension)",
            responses=oip_responses(UNKNOWN_MODEL),
        )

    @server.post(
        "/v2/repository/index",
        summary="The model repository's index (Triton's extension)",
        responses=oip_responses({400: "A body that is not {repository_name?, ready?}"}),
    )
    async def repository_index(request: Request) -> Response:
        async def run() -> Response:
            only_ready = _index_request(await request.body())
            state = "READY" if context(request).ready() else "UNAVAILABLE"
            reason = "" if state == "READY" else "the server is warming up or draining"
            if only_ready and state != "READY":
                return _json([])
            return _json(
                [
                    {"name": name, "version": VERSION, "state": state, "reason": reason}
                    for name in sorted(MODELS)
                ]
            )

        return await _guarded(run)

    for path, handler, method, summary, errors, is_hot in (
        ("", metadata, "GET", "Model metadata", UNKNOWN_MODEL, False),
        ("/ready", ready, "GET", "Model readiness", READY_ERRORS, False),
        (
            "/config",
            config,
            "GET",
            "Model configuration, spec schema and limits",
            UNKNOWN_MODEL,
            False,
        ),
        ("/infer", infer, "POST", "Inference: rows for the given positions", INFER_ERRORS, True),
    ):
        for template, endpoint in zip(
            ("/{model}", "/{model}/versions/{version}"), _bind(handler), strict=True
        ):
            models.add_api_route(
                template + path,
                infer_route(endpoint) if is_hot else endpoint,
                methods=[method],
                summary=summary,
                responses=oip_responses(errors),
            )
    return server, models
