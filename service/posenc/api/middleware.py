"""Pure ASGI middleware: the request body cap.

`BodyLimitMiddleware` answers 413 (the error contract) when `Content-Length` exceeds the cap, and
raises `ApiError` 413 (answered by the error handlers) when a body streamed without one grows past
it, so the route never holds more than the cap.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from posenc.api.errors import ApiError, error_response


class BodyLimitMiddleware:
    """Reject request bodies larger than `max_bytes` with 413 `body_too_large`."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _reject(self, size: int) -> ASGIApp:
        return error_response(
            413,
            "body_too_large",
            f"request body of {size} bytes exceeds the limit of {self.max_bytes} bytes",
            {"max_bytes": self.max_bytes, "size_bytes": size},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_bytes:
                    await self._reject(declared)(scope, receive, send)
                    return
                break
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise ApiError(
                        413,
                        "body_too_large",
                        f"request body exceeds the limit of {self.max_bytes} bytes",
                        {"max_bytes": self.max_bytes, "size_bytes": None},
                    )
            return message

        await self.app(scope, limited_receive, send)
