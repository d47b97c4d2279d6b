"""Static files the server ships (the explorer's page, the API documentation's bundles): one
representation for all of them, a strong ETag (sha256 of the bytes, 128 bits), `Cache-Control:
no-cache` (a reload revalidates with a 304 through `conditional.not_modified`, a new release is
picked up at once) and `X-Content-Type-Options: nosniff`. HEAD comes from `head.HeadRequests`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from posenc.api.serving.conditional import not_modified


@dataclass(frozen=True)
class Asset:
    """The bytes of one file, its media type and its strong ETag."""

    data: bytes
    media_type: str
    etag: str

    @classmethod
    def of(cls, data: bytes, media_type: str) -> Asset:
        """`data` with its ETag: the first 32 hex digits of its sha256, quoted."""
        return cls(data, media_type, f'"{hashlib.sha256(data).hexdigest()[:32]}"')


def send_asset(request: Request, asset: Asset, headers: dict[str, str] | None = None) -> Response:
    """`asset` with its validators and `headers`, or a 304 when `If-None-Match` names it."""
    sent = {
        "ETag": asset.etag,
        "Cache-Control": "no-cache",
        "X-Content-Type-Options": "nosniff",
        **(headers or {}),
    }
    unchanged = not_modified(request, sent)
    if unchanged is not None:
        return unchanged
    return Response(asset.data, media_type=asset.media_type, headers=sent)
