"""HEAD (RFC 9110 section 9.3.2): every GET route answers HEAD with the headers its GET would
send (ETag, Content-Length, Repr-Digest, ...) and no body, through this one path.

FastAPI's routes take the methods they declare (Starlette's own `Route` adds HEAD beside GET;
FastAPI's `APIRoute` does not), while the 405's `Allow` (`errors.allowed_methods`) lists HEAD
wherever GET is taken. `HeadRequests` (run by the app's `middleware.Gate`, outside the hot-route
dispatcher) runs a HEAD request to such a path as its GET, on a copy of the scope (the server
keeps its own and drops the body for HEAD: uvicorn does), and hands the server the response's
start and empty body messages: a 304 for a matching `If-None-Match`, Range answers and errors are
those of the GET; the route routing found is copied back for the metrics. A path without GET is
left alone (its 405 names HEAD's method).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from posenc.api.errors import allowed_methods


class HeadRequests:
    """Answer HEAD as GET without the body (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        if "GET" not in allowed_methods(Request(scope)):
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        as_get = {**scope, "method": "GET"}
        try:
            await self.app(as_get, receive, headers_only)
        finally:
            # what routing found, for the outer middlewares (the metrics' route template)
            for name in ("route", "endpoint", "path_params"):
                if name in as_get:
                    scope[name] = as_get[name]
