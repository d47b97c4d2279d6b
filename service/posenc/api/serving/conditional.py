"""Validators and conditional requests, one rule for every immutable or versioned answer
(tables, previews, ONNX models, the explorer's files): a strong ETag, `If-None-Match` compared
weakly (RFC 9110 section 13.1.2), and a 304 carrying the headers a 200 would (ETag,
Cache-Control, ...) for GET and HEAD.

Tags: a table representation's is `representation_etag` (`table.py`); a resource built off the
CPU adds `@<device>` after its tag (`device_etag`), so replicas on different devices never share
a strong ETag for different bytes.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

IMMUTABLE = "public, max-age=31536000, immutable"
"""`Cache-Control` of content-addressed resources (`/v1/tables/{key}[.{spec}]`, previews,
`/v1/onnx/{key}`)."""

NOT_MODIFIED = {"description": "Not modified (If-None-Match); no body, the 200's validators"}
"""The OpenAPI response of a route answering 304."""


def etag_matches(header: str | None, etag: str) -> bool:
    """True when an `If-None-Match` header lists `etag` (quoted; compared weakly, as RFC 9110
    says for If-None-Match) or `*`."""
    if not header:
        return False
    for tag in header.split(","):
        tag = tag.strip()
        if tag == "*" or tag.removeprefix("W/") == etag:
            return True
    return False


def device_etag(tag: str, device: str) -> str:
    """The strong ETag `"<tag>"` of bytes built on the CPU, `"<tag>@<device>"` elsewhere."""
    return f'"{tag}"' if device == "cpu" else f'"{tag}@{device}"'


def not_modified(request: Request, headers: dict[str, str]) -> Response | None:
    """A 304 with `headers` when the request is a GET (or HEAD) whose `If-None-Match` lists
    `headers["ETag"]`, else None: the one 304 path."""
    if request.method not in ("GET", "HEAD"):
        return None
    if not etag_matches(request.headers.get("if-none-match"), headers["ETag"]):
        return None
    return Response(status_code=304, headers=headers)
