"""The error contract: every error response is `{"error", "error_type", "detail"}`.

This module is the one place that maps exceptions to HTTP statuses:

    PosencError (posenc.encodings.errors)
    ├── SpecError ............... 422 invalid_spec      detail: [{field, message, value}]
    │   ├── UnknownKindError .... 422 unknown_kind
    │   ├── ConfigError ......... 422 unsupported_config
    │   └── UnknownTableError ... 404 unknown_table     (a table key not in the store)
    ApiError (raised by the routes with its own status and error_type)
    Busy (posenc.runtime) ....... 503 busy              Retry-After
    Overloaded (posenc.runtime) . 503 overloaded        Retry-After (in-flight byte budget)
    RequestValidationError ...... 422 invalid_request   (path and query parameters)
    StarletteHTTPException ...... its status            (404 unknown route, 405 ...)
    ClientDisconnect ............ 400 bad_request       (the client left mid-body: an INFO line)
    anything else ............... 500 internal_error    (a bug: logged with its traceback)
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Iterator
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette._utils import get_route_path
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, compile_path

from posenc.api.error_types import (
    BAD_REQUEST,
    BUSY,
    BY_STATUS,
    HTTP_ERROR,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    OVERLOADED,
    ErrorType,
)
from posenc.encodings import PosencError, SpecError
from posenc.encodings.weights import UnknownTableError
from posenc.runtime import Busy, Overloaded

log = logging.getLogger("posenc.api")


class ApiError(Exception):
    """An error the API itself raises: its `error_type` record (`error_types.py`, which gives
    the HTTP status; `status` picks another of the record's), message and optional detail."""

    def __init__(
        self,
        error: ErrorType,
        message: str,
        detail: Any = None,
        headers: dict[str, str] | None = None,
        *,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        if status is not None and status not in error.statuses:
            raise ValueError(f"{error.name} is sent with {error.statuses}, not {status}")
        self.status = error.status if status is None else status
        self.error_type = error.name
        self.message = message
        self.detail = detail
        self.headers = headers or {}


_TEXT_EXCERPT = 120
"""Characters of a string value kept in an error (the rest is counted, never echoed)."""
_ITEMS_EXCERPT = 8
"""Elements of a list, or keys of an object, kept in an error."""
_MESSAGE_MAX = 1024
"""Characters of an error message kept: an error stays a few KiB whatever the input."""


def excerpt(text: str, limit: int = _TEXT_EXCERPT) -> str:
    """`text` itself when short, else its start and its length: `"abc... (500000 characters)"`."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def jsonable(value: Any) -> Any:
    """`value` made safe and short for strict JSON: non-finite floats, integers past 64 bits and
    unknown types become strings; long strings, lists and objects are cut to an excerpt that
    states their size, so an error never amplifies its input."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        # orjson writes 64-bit integers only; str() of a huge one is itself a cost (and limited)
        return value if -(2**63) <= value < 2**64 else f"({value.bit_length()}-bit integer)"
    if isinstance(value, str):
        return excerpt(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        items = list(value.items())
        out = {excerpt(str(k)): jsonable(v) for k, v in items[:_ITEMS_EXCERPT]}
        if len(items) > _ITEMS_EXCERPT:
            out["..."] = f"({len(items)} keys)"
        return out
    if isinstance(value, (list, tuple)):
        head = [jsonable(v) for v in value[:_ITEMS_EXCERPT]]
        return head if len(value) <= _ITEMS_EXCERPT else [*head, f"... ({len(value)} items)"]
    return excerpt(repr(value) if not isinstance(value, bytes) else f"({len(value)} bytes)")


def error_response(
    status: int,
    error_type: str,
    message: str,
    detail: Any = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """The JSON error body of the contract with `status` and extra `headers`."""
    body = {
        "error": excerpt(message, _MESSAGE_MAX),
        "error_type": error_type,
        "detail": jsonable(detail),
    }
    return Response(
        orjson.dumps(body), status_code=status, media_type="application/json", headers=headers
    )


def spec_problems(err: SpecError) -> list[dict[str, Any]]:
    """The field problems of a `SpecError` as `[{field, message, value}]`."""
    return [{"field": p.field, "message": p.message, "value": p.value} for p in err.problems]


def _route_methods(routes: Iterable[BaseRoute], prefix: str) -> Iterator[tuple[str, set[str]]]:
    """(path, methods) of every route, those of included routers too (FastAPI keeps them behind
    an `_IncludedRouter` that holds the router and its include prefix), routes left out of the
    OpenAPI document (`/ui`) included."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            context = getattr(route, "include_context", None)
            yield from _route_methods(included.routes, prefix + getattr(context, "prefix", ""))
        elif isinstance(route, Route):
            yield prefix + route.path, set(route.methods or ())


def allowed_methods(request: Request) -> list[str]:
    """Every method the app takes at this request's path (a 405's `Allow`): the OpenAPI
    document's operations and every route's (`/docs`, `/ui`...), HEAD beside GET (`serving/head.py`
    answers it).
    Starlette's 405 names only the first route matching the path, and `GET /v1/onnx` and
    `POST /v1/onnx` are two routes. Built once per app."""
    app = request.app
    table: list[tuple[re.Pattern[str], set[str]]] | None = getattr(app.state, "posenc_allow", None)
    if table is None:
        table = []
        for template, item in app.openapi().get("paths", {}).items():
            methods = {m.upper() for m in item}
            table.append(
                (compile_path(template)[0], methods | ({"HEAD"} if "GET" in methods else set()))
            )
        for path, methods in _route_methods(app.router.routes, ""):
            table.append(
                (compile_path(path)[0], methods | ({"HEAD"} if "GET" in methods else set()))
            )
        app.state.posenc_allow = table
    path = get_route_path(request.scope)
    return sorted({m for regex, methods in table if regex.match(path) for m in methods})


def to_response(exc: Exception, request: Request | None = None) -> Response:
    """Map any exception to its contract response (the one mapping in the service); `request`
    gives a 405 its `Allow`."""
    if isinstance(exc, ApiError):
        return error_response(exc.status, exc.error_type, exc.message, exc.detail, exc.headers)
    if isinstance(exc, SpecError):
        status = 404 if isinstance(exc, UnknownTableError) else 422
        return error_response(status, exc.error_type, str(exc), spec_problems(exc))
    if isinstance(exc, PosencError):
        return error_response(422, exc.error_type, str(exc))
    if isinstance(exc, Busy):
        retry = str(max(1, math.ceil(exc.retry_after)))
        return error_response(
            BUSY.status,
            BUSY.name,
            str(exc),
            {"max_concurrent_computations": exc.limit},
            {"Retry-After": retry},
        )
    if isinstance(exc, Overloaded):
        held, limit = (
            ("in_flight_bytes", "max_in_flight_bytes")
            if exc.peer is None
            else ("peer_in_flight_bytes", "max_in_flight_bytes_per_peer")
        )
        return error_response(
            OVERLOADED.status,
            OVERLOADED.name,
            str(exc),
            {"requested_bytes": exc.requested, held: exc.held, limit: exc.limit},
            {"Retry-After": str(max(1, math.ceil(exc.retry_after)))},
        )
    if isinstance(exc, RequestValidationError):
        detail = [
            {
                "field": ".".join(str(p) for p in e.get("loc", ())),
                "message": e.get("msg", ""),
                "value": e.get("input"),
            }
            for e in exc.errors()
        ]
        return error_response(
            INVALID_REQUEST.status, INVALID_REQUEST.name, "invalid request parameters", detail
        )
    if isinstance(exc, StarletteHTTPException):
        generic = BY_STATUS.get(exc.status_code)
        error_type = generic.name if generic is not None else HTTP_ERROR
        headers = dict(exc.headers or {})
        if exc.status_code == 405 and request is not None:
            allowed = allowed_methods(request)
            headers["Allow"] = ", ".join(allowed)
            message = f"{request.method} is not allowed here; allowed: {', '.join(allowed)}"
            return error_response(405, error_type, message, None, headers)
        return error_response(exc.status_code, error_type, str(exc.detail), None, headers)
    if isinstance(exc, ClientDisconnect):
        # the client went away before its body arrived: an incomplete request, answered to no
        # one, not a bug of ours (no traceback)
        log.info("client disconnected before its request body arrived")
        return error_response(
            BAD_REQUEST.status,
            BAD_REQUEST.name,
            "the client disconnected before its request body arrived",
        )
    log.exception("unhandled error", exc_info=exc)
    return error_response(INTERNAL_ERROR.status, INTERNAL_ERROR.name, "internal server error")


async def _handle(request: Request, exc: Exception) -> Response:
    return to_response(exc, request)


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception type above through `to_response`.

    Every type but `Exception` is handled by Starlette's `ExceptionMiddleware`, which answers it;
    `Exception`'s handler runs in `ServerErrorMiddleware`, which answers and then re-raises to
    the server (uvicorn's `Exception in ASGI application` traceback): a client that leaves
    mid-body (`ClientDisconnect`, from any route reading its body) is named here so that it is
    answered, not re-raised."""
    for exc_type in (
        ApiError,
        PosencError,
        Busy,
        Overloaded,
        RequestValidationError,
        StarletteHTTPException,
        ClientDisconnect,
        Exception,
    ):
        app.add_exception_handler(exc_type, _handle)
