"""Prepared answers: a cache hit on a table route answered from headers and body built once.

A small table hit spent most of its time re-deriving what the previous identical request
derived: the query record, the format, the selection, the size check, the ETag, the header dict
(turned into Starlette's header list), the charges. None of it changes while the cache entry is
resident, so `serve_table` keeps, per request shape, the 200 it sent (`Prepared`: the raw header
lines with `X-Posenc-Cache: hit`, the body as views, the in-flight charges) on the cache entry
(`CacheEntry.answers`: dropped with the entry), and `PreparedAnswers` finds it again from the
next request's shape (`signature`) without touching the spec.

A request shape is what decides the answer besides the server's state: the route, the path,
the raw query string, `Accept` and, for `POST /v1/tables`, the body bytes. A request carrying
`If-None-Match`, `Range`, `If-Range` or `Content-Encoding` has no shape (`signature` returns
None): the slow path answers it (304, 206/416, 415), as it does every first request, every row
slice (built per request), every answer whose body the cache did not keep, and every spec
naming an uploaded weight table. A prepared answer is used only while its entry is resident;
using it counts a hit and refreshes the entry as `TableCache.get` does, and takes the same
charges, so the budget, `X-Posenc-Cache`, the metrics and the bytes are those of the slow path
(`tests/api/test_prepared.py` compares the two through a real server).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field

from starlette.types import Scope

from posenc.api.serving.body import FixedHeaders, ReadyResponse, acquire, try_acquire
from posenc.encodings import SpecBase
from posenc.runtime import CacheEntry, TableCache

Signature = tuple[Hashable, ...]
"""A request shape: the route's name, then what decides its answer (`signature`)."""

NO_SHAPE = frozenset((b"if-none-match", b"range", b"if-range", b"content-encoding"))
"""Request headers whose answer is worked out per request (304, 206, 416, 415)."""

PREPARED_SHAPES = 4096
"""Request shapes remembered (each holds its header lines; bodies are the cache's)."""

MAX_SIGNATURE_BODY = 4 << 10
"""`POST /v1/tables` bodies up to this many bytes have a shape (a spec; not a config.json)."""


@dataclass(frozen=True)
class Prepared:
    """A 200 answer to one request shape of a resident entry.

    `key` and `spec` are what the route remembers in the key index on a hit (`carried`: the URL
    carries the spec, so an unknown key is remembered instead of refused)."""

    key: str
    spec: SpecBase
    carried: bool
    headers: FixedHeaders
    views: list[memoryview]
    charges: list[tuple[Hashable, int]]
    size: int = field(init=False)
    """The body's bytes."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", sum(view.nbytes for view in self.views))


def signature(scope: Scope, route: str, *extra: Hashable) -> Signature | None:
    """The shape of a request to `route` (the path, raw query, `Accept`, then `extra`), or None
    when a header in `NO_SHAPE` asks for per-request work."""
    accept = None
    for name, value in scope["headers"]:
        if name in NO_SHAPE:
            return None
        if name == b"accept":
            accept = value
    return (route, scope["path"], scope["query_string"], accept, *extra)


def post_signature(scope: Scope, body: bytes | bytearray) -> Signature | None:
    """`signature` of a `POST /v1/tables` with `body` (None above `MAX_SIGNATURE_BODY`)."""
    if len(body) > MAX_SIGNATURE_BODY:
        return None
    return signature(scope, "post_table", bytes(body))


class PreparedAnswers:
    """Request shape -> the resident entry whose `answers` hold its `Prepared` (a weak reference:
    an evicted entry takes its answers with it); at most `size` shapes, the least recently used
    forgotten first (0: none, every hit takes the slow path)."""

    def __init__(self, size: int = PREPARED_SHAPES) -> None:
        self.size = size
        self._shapes: OrderedDict[Signature, weakref.ref[CacheEntry]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._shapes)

    def find(self, cache: TableCache, shape: Signature) -> tuple[CacheEntry, Prepared] | None:
        """The resident entry and prepared answer of `shape`, or None (nothing counted)."""
        ref = self._shapes.get(shape)
        if ref is None:
            return None
        entry = ref()
        prepared = entry.answers.get(shape) if entry is not None else None
        if (
            entry is None
            or not isinstance(prepared, Prepared)
            or cache.peek(entry.key) is not entry
        ):
            self._forget(shape)
            return None
        self._shapes.move_to_end(shape)
        return entry, prepared

    def send(self, cache: TableCache, entry: CacheEntry, prepared: Prepared) -> ReadyResponse:
        """The answer, a hit counted on `entry` and its charges taken (`Overloaded` raised when
        they do not fit, as on the slow path)."""
        cache.touch(entry)
        # the views keep alive what is sent, never the entry (charges are named by its serial)
        return ReadyResponse(prepared.headers, prepared.views, acquire(cache, prepared.charges))

    def try_send(
        self, cache: TableCache, entry: CacheEntry, prepared: Prepared, max_bytes: int
    ) -> ReadyResponse | None:
        """`send`, for an answer of at most `max_bytes` whose charges fit; else None, and
        nothing counted, touched or refused (the server's ready answers, `api/door.py`, leave
        the request to its route)."""
        if prepared.size > max_bytes:
            return None
        leases = try_acquire(cache, prepared.charges)
        if leases is None:
            return None
        cache.touch(entry)
        return ReadyResponse(prepared.headers, prepared.views, leases)

    def keep(self, shape: Signature, entry: CacheEntry, prepared: Prepared) -> None:
        """Remember `prepared` as `shape`'s answer while `entry` is resident."""
        if not self.size:
            return
        entry.answers[shape] = prepared
        self._shapes[shape] = weakref.ref(entry)
        self._shapes.move_to_end(shape)
        while len(self._shapes) > self.size:
            self._forget(next(iter(self._shapes)))

    def _forget(self, shape: Signature) -> None:
        ref = self._shapes.pop(shape, None)
        entry = ref() if ref is not None else None
        if entry is not None:
            entry.answers.pop(shape, None)
