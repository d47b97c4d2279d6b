"""The error contract: every error response is `{"error", "error_type", "detail"}`.

This module is the one place that maps exceptions to HTTP statuses:

    PosencError (posenc.encodings.errors)
    ├── SpecError ............... 422 invalid_spec      detail: [{field, message, value}]
    │   ├── UnknownKindError .... 422 unknown_kind
    │   ├── ConfigError ......... 422 unsupported_config
    │   └── UnknownTableError ... 404 unknown_table     (a table key not in the store)
    ApiError (raised by the routes with its own status and error_type)
    Busy (posenc.runtime) ....... 503 busy              Retry-After
    RequestValidationError ...... 422 invalid_request   (path and query parameters)
    StarletteHTTPException ...... its status            (404 unknown route, 405 ...)
    anything else ............... 500 internal_error    (a bug: logged with its traceback)
"""

from __future__ import annotations

import logging
import math
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from posenc.encodings import PosencError, SpecError
from posenc.encodings.weights import UnknownTableError
from posenc.runtime import Busy

log = logging.getLogger("posenc.api")

_STATUS_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "too_large",
    415: "unsupported_media_type",
    416: "range_not_satisfiable",
    422: "invalid_request",
    503: "unavailable",
}


class ApiError(Exception):
    """An error the API itself raises: HTTP status, `error_type`, message and optional detail."""

    def __init__(
        self,
        status: int,
        error_type: str,
        message: str,
        detail: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.detail = detail
        self.headers = headers or {}


def jsonable(value: Any) -> Any:
    """`value` made safe for strict JSON: non-finite floats and unknown types become strings."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def error_response(
    status: int,
    error_type: str,
    message: str,
    detail: Any = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """The JSON error body of the contract with `status` and extra `headers`."""
    body = {"error": message, "error_type": error_type, "detail": jsonable(detail)}
    return Response(
        orjson.dumps(body), status_code=status, media_type="application/json", headers=headers
    )


def spec_problems(err: SpecError) -> list[dict[str, Any]]:
    """The field problems of a `SpecError` as `[{field, message, value}]`."""
    return [{"field": p.field, "message": p.message, "value": p.value} for p in err.problems]


def to_response(exc: Exception) -> Response:
    """Map any exception to its contract response (the one mapping in the service)."""
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
            503,
            "busy",
            str(exc),
            {"max_concurrent_computations": exc.limit},
            {"Retry-After": retry},
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
        return error_response(422, "invalid_request", "invalid request parameters", detail)
    if isinstance(exc, StarletteHTTPException):
        error_type = _STATUS_TYPES.get(exc.status_code, "http_error")
        return error_response(
            exc.status_code, error_type, str(exc.detail), None, dict(exc.headers or {})
        )
    log.exception("unhandled error", exc_info=exc)
    return error_response(500, "internal_error", "internal server error")


async def _handle(request: Request, exc: Exception) -> Response:
    return to_response(exc)


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception type above through `to_response`."""
    for exc_type in (
        ApiError,
        PosencError,
        Busy,
        RequestValidationError,
        StarletteHTTPException,
        Exception,
    ):
        app.add_exception_handler(exc_type, _handle)
