"""Pure ASGI middleware: the request body caps.

`BodyLimitMiddleware` picks the cap of a request from its path (`routes`: the first full match of
a pattern, else `max_bytes`), answers 413 (the error contract) when `Content-Length` exceeds it,
before reading any of the body, and raises `ApiError` 413 (answered by the error handlers) when a
body streamed without one grows past it, so a route never holds more than its cap.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from posenc.api.errors import ApiError, error_response

RouteLimit = tuple[re.Pattern[str], int]
"""A path pattern (matched in full) and the body cap of the requests to it."""


class BodyLimitMiddleware:
    """Reject request bodies larger than the cap of their route with 413 `body_too_large`."""

    def __init__(self, app: ASGIApp, max_bytes: int, routes: Sequence[RouteLimit] = ()) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.routes = tuple(routes)

    def limit_for(self, path: str) -> int:
        """The body cap of a request to `path`."""
        for pattern, limit in self.routes:
            if pattern.fullmatch(path):
                return limit
        return self.max_bytes

    @staticmethod
    def _reject(size: int, limit: int) -> ASGIApp:
        return error_response(
            413,
            "body_too_large",
            f"request body of {size} bytes exceeds the limit of {limit} bytes",
            {"max_bytes": limit, "size_bytes": size},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit:
                    await self._reject(declared, limit)(scope, receive, send)
                    return
                break
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise ApiError(
                        413,
                        "body_too_large",
                        f"request body exceeds the limit of {limit} bytes",
                        {"max_bytes": limit, "size_bytes": None},
                    )
            return message

        await self.app(scope, limited_receive, send)
