"""JSON in and out: request bodies parsed strictly with orjson, responses serialised by it;
`check_content_encoding`, the one check of request bodies' `Content-Encoding` (every route that
reads a body calls it first); `read_body` and `replaying`, a hot route's whole body read straight
from ASGI `receive` and given back to the request that parses it."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Message, Receive

from posenc.api.error_types import INVALID_JSON, UNSUPPORTED_MEDIA_TYPE
from posenc.api.errors import ApiError


def json_object_body(description: str) -> dict[str, Any]:
    """The OpenAPI `requestBody` of a route whose body `read_json_object` reads: a required JSON
    object described by `description` (the routes read the raw body, so FastAPI has no model)."""
    schema = {"type": "object", "description": description}
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """`data` serialised with orjson."""
    return Response(orjson.dumps(data), status, headers, media_type="application/json")


def check_content_encoding(request: Request) -> None:
    """Refuse a body with any `Content-Encoding` but `identity` (415 `unsupported_media_type`):
    posenc decodes no compressed request bodies, and ignoring the header would read gzip bytes
    as JSON or tensors (RFC 9110 section 15.5.16)."""
    encoding = request.headers.get("content-encoding")
    if encoding is not None and encoding.strip().lower() not in ("", "identity"):
        raise ApiError(
            UNSUPPORTED_MEDIA_TYPE,
            f"Content-Encoding {encoding!r} is not supported: send the body uncompressed",
            [{"field": "Content-Encoding", "message": "only identity", "value": encoding}],
        )


async def read_json_object(request: Request) -> dict[str, Any]:
    """The request body parsed as a JSON object (orjson: NaN/Infinity literals are invalid).

    Content-Type is not checked (clients such as tritonclient send none). Raises `ApiError` 400
    `invalid_json` for an empty or malformed body or one that is not an object, 415 for a
    `Content-Encoding` (`check_content_encoding`).
    """
    check_content_encoding(request)
    raw = await request.body()
    if not raw.strip():
        raise ApiError(INVALID_JSON, "the request body is empty; send a JSON object")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise ApiError(
            INVALID_JSON,
            f"the request body is not valid JSON: {err}",
            [{"field": "(body)", "message": str(err), "value": None}],
        ) from None
    if not isinstance(data, dict):
        raise ApiError(
            INVALID_JSON,
            f"the request body must be a JSON object, got {type(data).__name__}",
            [{"field": "(body)", "message": "expected an object", "value": type(data).__name__}],
        )
    return data


async def read_body(receive: Receive) -> bytes:
    """The whole request body from ASGI `receive` (`ClientDisconnect` when the client goes):
    what `Request.body()` returns, without its stream generator and `aclosing` (six Python calls
    of a cached POST hit's hundred). The app's `Gate` caps it as it arrives."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def replaying(body: bytes, receive: Receive) -> Receive:
    """`receive` for a request whose `body` was read whole (`read_body`): the body first, then
    `receive`'s own messages (a disconnect)."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay
