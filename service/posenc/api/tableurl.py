"""Table URLs that any replica answers: `/v1/tables/{key}.{spec}`, the spec carried in the URL.

A content key alone (`/v1/tables/{key}`) names a table only to a process that has seen its spec:
a second replica, or the same one after a restart, answers 404 `unknown_key`, yet the URL is
served `immutable` and a load balancer or CDN sends it to any replica. The URL the server hands
out (`Content-Location`, the `url` of `/v1/resolve`, `/v1/presets`) therefore carries the
canonical spec too, so any replica of the same algorithm version rebuilds the table from the URL
alone, with no shared state:

    /v1/tables/<key>.<spec>
    <key>   the content key (64 hex digits: sha256 of the algorithm version and canonical JSON)
    <spec>  base64url, unpadded, of zlib-deflated (level 9) canonical JSON of the spec
            (`encodings.canonical_json`: sorted keys, no whitespace)

Decoding is checked, cheapest first: the segment's size (at most `SPEC_TOKEN_MAX` characters,
414 otherwise, before anything is decoded), the key's form, the base64url alphabet, the inflated
size (at most `SPEC_JSON_MAX` bytes: a deflate bomb stops there), a JSON object, a valid spec
(422 `invalid_spec`), and last that the spec's content key is the URL's key (400
`key_mismatch`): a spec cannot pose as another key, and the bytes, ETag and `Repr-Digest` a URL
answers with are those of its key on every replica. Any spelling of the spec whose canonical form
has that key is accepted (a client may build the URL from the canonical spec it was given); the
server hands out the canonical spelling, so every replica hands out the same URL.

A spec naming an uploaded weight table (`table_key`, `relative_position_bias_table_key`) carries
that key, not the values: the replica answering needs the upload in its own table store (send
the upload to each replica: the same values give the same key), else 404 `unknown_table`.
"""

from __future__ import annotations

import base64
import binascii
import re
import zlib
from collections import OrderedDict
from typing import Any

import orjson

from posenc.api.error_types import INVALID_TABLE_URL, KEY_MISMATCH
from posenc.api.errors import ApiError
from posenc.api.specs import canonical_spec
from posenc.encodings import SpecBase, canonical_json

TABLES_PATH = "/v1/tables/"

SPEC_TOKEN_MAX = 4096
"""Characters of a URL's spec part at most, checked before anything is decoded. Every spec the
server resolves stays far below it (tests/api/test_table_urls.py: every handed-out URL is under
2 KiB), and a request line with it fits nginx's default 8 KiB `large_client_header_buffers`."""

SPEC_JSON_MAX = 65536
"""Bytes of inflated JSON at most: decompression stops there."""

_KEY = re.compile(r"[0-9a-f]{64}")
_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
_MEMO_SIZE = 2048
"""Verified URL segments (and URLs per key) remembered, least recently used forgotten first."""


def spec_token(spec: SpecBase) -> str:
    """The URL's spec part of canonical spec `spec`: base64url (unpadded) of its deflated
    canonical JSON."""
    packed = zlib.compress(canonical_json(spec).encode(), 9)
    return base64.urlsafe_b64encode(packed).rstrip(b"=").decode("ascii")


_URLS: OrderedDict[str, str] = OrderedDict()


def table_url(spec: SpecBase, key: str) -> str:
    """`/v1/tables/{key}.{spec}` for canonical spec `spec` with content key `key` (memoised per
    key: a key names one canonical spec)."""
    url = _URLS.get(key)
    if url is None:
        url = _URLS[key] = f"{TABLES_PATH}{key}.{spec_token(spec)}"
        if len(_URLS) > _MEMO_SIZE:
            _URLS.popitem(last=False)
    else:
        _URLS.move_to_end(key)
    return url


def _bad(field: str, message: str, value: Any, status: int = 400) -> ApiError:
    return ApiError(
        INVALID_TABLE_URL,
        f"the table URL's {field} part is invalid: {message}",
        [{"field": field, "message": message, "value": value}],
        status=status,
    )


def decode_spec(key: str, token: str) -> SpecBase:
    """The canonical spec a URL's `token` carries, checked to have content key `key`; raises
    `ApiError` (414/400 `invalid_table_url`, 400 `key_mismatch`) or `SpecError` (422)."""
    if len(token) > SPEC_TOKEN_MAX:
        raise _bad(
            "spec", f"at most {SPEC_TOKEN_MAX} characters", f"({len(token)} characters)", 414
        )
    if _KEY.fullmatch(key) is None:
        raise _bad("key", "64 lowercase hex digits", key)
    if _TOKEN.fullmatch(token) is None:
        raise _bad("spec", "base64url characters only (A-Z a-z 0-9 - _)", token)
    try:
        packed = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raise _bad(
            "spec", "not base64url (its length is 1 more than a multiple of 4)", token
        ) from None
    inflater = zlib.decompressobj()
    try:
        text = inflater.decompress(packed, SPEC_JSON_MAX)
    except zlib.error:
        raise _bad("spec", "not a zlib stream", token) from None
    if inflater.unconsumed_tail:
        raise _bad("spec", f"inflates to more than {SPEC_JSON_MAX} bytes", token)
    if not inflater.eof or inflater.unused_data:
        raise _bad("spec", "not one whole zlib stream", token)
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise _bad("spec", "the inflated bytes are not JSON", token) from None
    if not isinstance(data, dict):
        raise _bad("spec", "a JSON object (a canonical spec)", type(data).__name__)
    spec, found = canonical_spec(data)
    if found != key:
        raise ApiError(
            KEY_MISMATCH,
            f"the spec in the URL has content key {found}, not the URL's key {key}",
            [{"field": "spec", "message": "its content key is not the URL's key", "value": found}],
        )
    return spec


_VERIFIED: OrderedDict[str, tuple[str, SpecBase]] = OrderedDict()


def parse_segment(segment: str) -> tuple[str, SpecBase | None]:
    """A `/v1/tables/` path segment -> (content key, the spec it carries or None): `{key}` alone
    (None), or `{key}.{spec}` decoded and verified (`decode_spec`) once per distinct segment."""
    key, dot, token = segment.partition(".")
    if not dot:
        return key, None
    found = _VERIFIED.get(segment)
    if found is not None:
        _VERIFIED.move_to_end(segment)
        return found
    spec = decode_spec(key, token)
    _VERIFIED[segment] = (key, spec)
    if len(_VERIFIED) > _MEMO_SIZE:
        _VERIFIED.popitem(last=False)
    return key, spec
