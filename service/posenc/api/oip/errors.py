"""Every failure of a /v2 request as an `OipError`: the one mapping of exceptions to a status and
a message, shared by the HTTP routes (`posenc.api.routes.oip`, `{"error": message}` bodies) and
the gRPC service (`posenc.api.grpc`, status codes).

| exception                                  | status | extra             |
|--------------------------------------------|--------|-------------------|
| `OipError`, `ApiError`                     | theirs | their headers     |
| `UnknownTableError` (weight table key)     | 404    |                   |
| other `PosencError` (bad spec or input)    | 400    |                   |
| `Busy` (too many computations in flight)   | 503    | Retry-After       |
| `Overloaded` (in-flight byte budget full)  | 503    | Retry-After       |
| `ClientDisconnect` (gone before its body)  | 400    | sent to no one    |
| anything else                              | None: the caller logs it and answers 500  |
"""

from __future__ import annotations

import math

from starlette.requests import ClientDisconnect

from posenc.api.errors import ApiError
from posenc.api.oip.codec import OipError
from posenc.encodings import PosencError
from posenc.encodings.weights import UnknownTableError
from posenc.runtime import Busy, Overloaded

INTERNAL_MESSAGE = "internal server error"
DISCONNECTED_MESSAGE = "the client disconnected before its request body arrived"
"""The message of a request whose client left mid-body (answered to no one; as /v1's)."""
"""The message of a failure nothing maps (the exception itself is logged, never sent)."""


def as_oip_error(exc: Exception) -> OipError | None:
    """`exc` as the `OipError` sent to the client, or None for an unexpected failure (500)."""
    if isinstance(exc, OipError):
        return exc
    if isinstance(exc, ApiError):
        return OipError(exc.status, exc.message, exc.headers)
    if isinstance(exc, PosencError):
        return OipError(404 if isinstance(exc, UnknownTableError) else 400, str(exc))
    if isinstance(exc, ClientDisconnect):
        return OipError(400, DISCONNECTED_MESSAGE)
    if isinstance(exc, (Busy, Overloaded)):
        return OipError(503, str(exc), {"Retry-After": str(max(1, math.ceil(exc.retry_after)))})
    return None
