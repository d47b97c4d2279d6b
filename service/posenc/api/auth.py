"""Bearer-token access control for the model routes (`/v1/*`, `/v2/models/*` and
`/v2/repository/*`).

Active only when `POSENC_API_KEYS` is set. The app's pure ASGI middleware (`middleware.Gate`: no
per-route dependency to forget, nothing run in a thread) asks `refusal`, which checks
`Authorization: Bearer <key>` with `hmac.compare_digest` against every configured key without an
early exit, so timing does not reveal which key nearly matched. Health (`/v2/health/*`) and
server metadata (`/v2`) stay open; `/metrics` and the OpenAPI pages too unless
`protect_docs_and_metrics` (`DOCS_PREFIXES`). Refusals are the error
contract's 401 `unauthorized` with `WWW-Authenticate: Bearer`.
`bearer_verdict` is the check itself, shared with the gRPC service (`authorization` metadata).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from starlette.types import ASGIApp, Scope

from posenc.api.error_types import UNAUTHORIZED
from posenc.api.errors import error_response

PROTECTED_PREFIXES = ("/v1/", "/v2/models", "/v2/repository")
DOCS_PREFIXES = ("/metrics", "/docs", "/redoc", "/openapi.json")
"""Guarded too with `protect_docs_and_metrics`."""


MISSING_MESSAGE = "this route needs an Authorization: Bearer <key> header"
INVALID_MESSAGE = "the bearer token is not a valid API key"


def bearer_verdict(value: bytes | None, keys: Sequence[bytes]) -> bool | None:
    """Whether an `Authorization` value (None: absent) carries one of `keys` as a bearer token:
    True/False for a valid/invalid token, None when there is no bearer token at all. Every key is
    compared (`hmac.compare_digest`, no early exit)."""
    if value is None:
        return None
    scheme, _, token = value.partition(b" ")
    token = token.strip()
    if scheme.lower() != b"bearer" or not token:
        return None
    match = False
    for key in keys:
        match |= hmac.compare_digest(token, key)
    return match


def refusal(scope: Scope, keys: Sequence[bytes]) -> ASGIApp | None:
    """The 401 answer to a request (ASGI `scope`) to a guarded path, or None when its
    `Authorization` carries one of `keys` as a bearer token."""
    value = None
    for name, header in scope["headers"]:
        if name == b"authorization":
            value = header
            break
    verdict = bearer_verdict(value, keys)
    if verdict:
        return None
    if verdict is None:
        message, challenge = MISSING_MESSAGE, ""
    else:
        message, challenge = INVALID_MESSAGE, ', error="invalid_token"'
    return error_response(
        UNAUTHORIZED.status,
        UNAUTHORIZED.name,
        message,
        None,
        {"WWW-Authenticate": f'Bearer realm="posenc"{challenge}'},
    )
