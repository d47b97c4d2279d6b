"""Bearer-token access control for the model routes (`/v1/*`, `/v2/models/*` and
`/v2/repository/*`).

Active only when `POSENC_API_KEYS` is set. A pure ASGI middleware (no per-route dependency to
forget, nothing run in a thread) checks `Authorization: Bearer <key>` with `hmac.compare_digest`
against every configured key without an early exit, so timing does not reveal which key nearly
matched. Health (`/v2/health/*`) and server metadata (`/v2`) stay open; `/metrics` and the
OpenAPI pages too unless `protect_docs_and_metrics` (`DOCS_PREFIXES`). Refusals are the error
contract's 401 `unauthorized` with `WWW-Authenticate: Bearer`.
`bearer_verdict` is the check itself, shared with the gRPC service (`authorization` metadata).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from starlette._utils import get_route_path
from starlette.types import ASGIApp, Receive, Scope, Send

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


class ApiKeyMiddleware:
    """401 on protected paths unless the request carries one of `keys` as a bearer token."""

    def __init__(
        self, app: ASGIApp, keys: list[str], prefixes: tuple[str, ...] = PROTECTED_PREFIXES
    ) -> None:
        self.app = app
        self.keys = [k.encode() for k in keys]
        self.prefixes = prefixes

    def _authorised(self, scope: Scope) -> bool | None:
        """True/False for a valid/invalid token, None when there is no bearer token at all."""
        for name, value in scope["headers"]:
            if name == b"authorization":
                return bearer_verdict(value, self.keys)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or not self.keys
            or not get_route_path(scope).startswith(self.prefixes)
        ):
            await self.app(scope, receive, send)
            return
        verdict = self._authorised(scope)
        if verdict:
            await self.app(scope, receive, send)
            return
        if verdict is None:
            message, challenge = MISSING_MESSAGE, ""
        else:
            message, challenge = INVALID_MESSAGE, ', error="invalid_token"'
        response = error_response(
            UNAUTHORIZED.status,
            UNAUTHORIZED.name,
            message,
            None,
            {"WWW-Authenticate": f'Bearer realm="posenc"{challenge}'},
        )
        await response(scope, receive, send)
