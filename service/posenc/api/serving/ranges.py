"""Byte ranges of a representation (RFC 9110 section 14): one `bytes=` range served as a 206
zero-copy slice, 416 when unsatisfiable, the whole body when the Range is absent, malformed or
multi-range, or `If-Range` is not the representation's strong ETag. Formats whose record says
`ranges` (raw tables) go through here, as Starlette's `FileResponse` keeps Range and If-Range
together."""

from __future__ import annotations

import re

from starlette.requests import Request

from posenc.api.error_types import RANGE_NOT_SATISFIABLE
from posenc.api.errors import ApiError
from posenc.runtime import Buffer

RANGE_PATTERN = re.compile(r"[Bb][Yy][Tt][Ee][Ss][ \t]*=[ \t]*([0-9]*)[ \t]*-[ \t]*([0-9]*)")
"""One `bytes=FIRST-LAST` range in ASCII digits (either bound may be empty)."""


def content_range(header: str | None, size: int) -> tuple[int, int] | bool | None:
    """Parse a single `bytes=` Range against `size`: (first, last) inclusive, None to ignore the
    header (absent, malformed or multi-range), False when unsatisfiable (416)."""
    if not header:
        return None
    match = RANGE_PATTERN.fullmatch(header.strip())
    if match is None:  # another unit, several ranges, or not ASCII digits: ignored
        return None
    first_text, last_text = match.groups()
    if not first_text:
        if not last_text:
            return None
        suffix = int(last_text)
        if suffix <= 0:
            return False
        return max(0, size - suffix), size - 1
    first = int(first_text)
    last = int(last_text) if last_text else max(first, size - 1)
    if first < 0 or last < first:
        return None
    if first >= size:
        return False
    return first, min(last, size - 1)


def apply_range(
    request: Request, etag: str, body: Buffer, headers: dict[str, str]
) -> tuple[Buffer, int]:
    """(body, status) for a request to a representation that takes ranges: 206 with a zero-copy
    slice and `Content-Range`, 416 (`ApiError`, `Content-Range: bytes */size`) when
    unsatisfiable, else the whole body with 200. Sets `Accept-Ranges: bytes`."""
    headers["Accept-Ranges"] = "bytes"
    if_range = request.headers.get("if-range")
    if if_range is not None and if_range.strip() != etag:
        return body, 200
    size = len(body) if isinstance(body, bytes) else body.nbytes
    span = content_range(request.headers.get("range"), size)
    if span is None:
        return body, 200
    if span is False:
        raise ApiError(
            RANGE_NOT_SATISFIABLE,
            f"the range is outside the {size}-byte body",
            {"size_bytes": size},
            {"Content-Range": f"bytes */{size}"},
        )
    assert span is not True
    first, last = span
    headers["Content-Range"] = f"bytes {first}-{last}/{size}"
    return memoryview(body)[first : last + 1], 206
