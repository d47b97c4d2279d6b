"""Sending a body: `BodyResponse` hands a buffer (or a /v2 answer's parts) to the server in
views, holding its in-flight byte charges (`runtime.budget`) until the last byte is handed over,
however the send ends; `acquire` takes those charges, all or none."""

from __future__ import annotations

from collections.abc import Hashable

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from posenc.runtime import Buffer, Lease, TableCache

SEND_CHUNK = 1 << 20
"""Bytes handed to the server per `http.response.body` message of a table body."""


def as_bytes(buffer: Buffer) -> memoryview:
    """`buffer` as a flat byte view (no copy)."""
    view = memoryview(buffer)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class LeasedResponse(Response):
    """A response sending `views` (`send_views`) after `raw_headers`, holding its in-flight
    `leases` until the send ends, however it ends (completed, client gone, cancelled), and
    keeping alive only what it sends."""

    views: list[memoryview]
    leases: list[Lease]

    def release(self) -> None:
        """Give the in-flight charges back (idempotent)."""
        leases, self.leases = getattr(self, "leases", []), []
        for lease in leases:
            lease.release()

    def __del__(self) -> None:
        # a response dropped unsent (the request cancelled before it was called) must not keep
        # its charges for the life of the process
        if getattr(self, "leases", None):
            self.release()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send_views(send, self.status_code, self.raw_headers, self.views)
        finally:
            self.release()


FIXED_HEADERS = "posenc.fixed_headers"
"""The key of a `http.response.start` message carrying its `FixedHeaders` (servers ignore keys
they do not know; posenc's own protocol reads it, api/server.py)."""


class FixedHeaders:
    """The header lines of a ready answer, the same for every response made from it, and the
    server's rendering of them (`wire`: set by the server on first use and reused while a start
    message's lines still equal `lines`; api/server.py)."""

    __slots__ = ("lines", "wire")

    def __init__(self, lines: list[tuple[bytes, bytes]]) -> None:
        self.lines = lines
        self.wire: object = None


class ReadyResponse(LeasedResponse):
    """A 200 whose header lines are ready (a cache hit's prepared answer, a /v2 decode step),
    without `Response.__init__`'s header building; a copy of the lines per response, since outer
    middlewares (CORS) add to the start message's list in place. The start message carries the
    `FixedHeaders` too (`FIXED_HEADERS`)."""

    def __init__(self, headers: FixedHeaders, views: list[memoryview], leases: list[Lease]) -> None:
        self.status_code = 200
        self.background = None
        self.fixed = headers
        self.raw_headers = list(headers.lines)
        self.views = views
        self.leases = leases

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send_views(send, 200, self.raw_headers, self.views, self.fixed)
        finally:
            self.release()


class BodyResponse(LeasedResponse):
    """A body sent as views of its buffers (one table buffer, or a /v2 answer's parts in order,
    never joined), `SEND_CHUNK` bytes at a time, holding its in-flight `leases` until the send
    ends, however it ends (completed, client gone, cancelled).

    Each view is handed to uvicorn, which waits for the transport to drain before the next one:
    a slow client is paced by flow control instead of having the rest of a large body copied
    into the transport's buffer, and nothing is copied from the cached buffer.
    """

    def __init__(
        self,
        body: Buffer | list[Buffer],
        status_code: int,
        headers: dict[str, str],
        media_type: str,
        leases: list[Lease],
    ) -> None:
        super().__init__(None, status_code, headers, media_type)
        self.views = [as_bytes(part) for part in (body if isinstance(body, list) else [body])]
        self.leases = leases
        self.headers["content-length"] = str(sum(view.nbytes for view in self.views))


async def send_views(
    send: Send,
    status: int,
    raw_headers: list[tuple[bytes, bytes]],
    views: list[memoryview],
    fixed: FixedHeaders | None = None,
) -> None:
    """The response start (with `fixed`, the lines' `FixedHeaders`), then `views` in order,
    `SEND_CHUNK` bytes per body message (one empty message for an empty body)."""
    begin: Message = {"type": "http.response.start", "status": status, "headers": raw_headers}
    if fixed is not None:
        begin[FIXED_HEADERS] = fixed
    await send(begin)
    left = sum([view.nbytes for view in views])
    if not left:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    for view in views:
        for start in range(0, view.nbytes, SEND_CHUNK):
            chunk = view[start : start + SEND_CHUNK]
            left -= chunk.nbytes
            await send({"type": "http.response.body", "body": chunk, "more_body": left > 0})


def acquire(cache: TableCache, charges: list[tuple[Hashable, int]]) -> list[Lease]:
    """Leases for every charge, or none (`Overloaded` raised, those taken given back)."""
    budget = cache.budget
    leases: list[Lease] = []
    if budget is None:
        return leases
    try:
        for name, size in charges:
            leases.append(budget.acquire(name, size))
    except BaseException:
        for lease in leases:
            lease.release()
        raise
    return leases


def try_acquire(cache: TableCache, charges: list[tuple[Hashable, int]]) -> list[Lease] | None:
    """`acquire`, but None where it raises (those taken given back), the refusal not counted
    (`InFlightBudget.try_acquire`)."""
    budget = cache.budget
    leases: list[Lease] = []
    if budget is None:
        return leases
    for name, size in charges:
        lease = budget.try_acquire(name, size)
        if lease is None:
            for taken in leases:
                taken.release()
            return None
        leases.append(lease)
    return leases
