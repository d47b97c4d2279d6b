"""The in-flight byte budget: memory held outside the cache by work in progress.

The cache's budget (`TableCache.max_bytes`) bounds what stays resident. Work in progress holds
memory beside it: a table being computed (its output and temporaries exist before the cache takes
the table; charged by `TableCache.get`),
a response body built per request (row slices, formats of a table too large to keep), and a
cached table or prepared body that is still being sent when the cache evicts it (the send keeps
the buffer alive). `InFlightBudget` counts those bytes and refuses new work that would take them
past `max_bytes` (`Overloaded`, answered 503 with `Retry-After`), so the process holds at most
the cache budget plus this budget plus a fixed baseline, however many clients ask at once.

Charges are named: every send of the same cached buffer (many clients fetching one hot table)
shares one charge, taken by the first and released by the last, because they share its memory.
All calls happen on the event loop thread, so no locks are needed.

Per-peer share: a charge made while a request is being served (`for_peer(peer)`, entered by the
HTTP body middleware and the gRPC service for each request, a context variable that worker
threads inherit) counts toward that request and its peer (the client's address). A peer may
hold at most `max_peer_bytes`: a new charge that would take it past that while the peer holds
bytes of *other* requests is refused (`Overloaded` naming the share), so one client, however
many connections it opens (two slow readers, say), cannot hold the whole budget and starve the
others. One request alone may exceed the share (as one computation may take the whole budget):
the share bounds what a peer piles up, not the largest answer. A shared charge counts toward the
request that made it, until its last holder releases it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Hashable
from contextvars import ContextVar
from dataclasses import dataclass


class Overloaded(Exception):  # noqa: N818 - the condition, not a failure of the caller
    """Admitting `requested` more bytes would exceed the in-flight budget (or, with `peer`, that
    peer's share of it: `held` and `limit` are then the peer's); retry later."""

    def __init__(
        self, requested: int, held: int, limit: int, retry_after: float, peer: str | None = None
    ) -> None:
        if peer is None:
            message = (
                f"{held} bytes of tables and bodies are in flight; {requested} more would exceed "
                f"the in-flight budget of {limit} bytes: retry in {retry_after:g}s"
            )
        else:
            message = (
                f"{held} bytes of this client's ({peer}) other requests are in flight; "
                f"{requested} more would exceed its share of the in-flight budget, {limit} "
                f"bytes: retry in {retry_after:g}s"
            )
        super().__init__(message)
        self.requested = requested
        self.held = held
        self.limit = limit
        self.retry_after = retry_after
        self.peer = peer


@dataclass
class Request:
    """One request being served: its peer and the bytes of the charges it made and still holds."""

    peer: str
    held: int = 0


_serving: ContextVar[Request | None] = ContextVar("posenc_budget_request", default=None)


class for_peer:  # noqa: N801 - used as the function it was: `with for_peer(host):`
    """Charges made inside (on this task, in the tasks and threads it starts) count toward one
    request of `peer` (its host address) and that peer's share. (A class, not a
    `contextlib.contextmanager`: entered once per request, the generator's machinery was six
    Python calls of a decode step's hundred.)"""

    __slots__ = ("_token", "request")

    def __init__(self, peer: str) -> None:
        self.request = Request(peer)

    def __enter__(self) -> Request:
        self._token = _serving.set(self.request)
        return self.request

    def __exit__(self, *exc: object) -> None:
        _serving.reset(self._token)


@dataclass
class _Charge:
    nbytes: int
    holders: int
    request: Request | None


class Lease:
    """One holder's share of a charge; `release()` (idempotent) gives it back."""

    __slots__ = ("_budget", "_name", "_released")

    def __init__(self, budget: InFlightBudget, name: Hashable) -> None:
        self._budget = budget
        self._name = name
        self._released = False

    def release(self) -> None:
        """Give the share back; the charge's bytes return to the budget with its last holder."""
        if not self._released:
            self._released = True
            self._budget._drop(self._name)


class InFlightBudget:
    """Bytes held by computations and response bodies in progress, bounded by `max_bytes`.

    Args:
        max_bytes: the budget in bytes.
        retry_after: seconds suggested to a caller refused with `Overloaded`.
        max_peer_bytes: one peer's share (module docstring); None: no share.
    """

    def __init__(
        self, max_bytes: int, retry_after: float = 1.0, max_peer_bytes: int | None = None
    ) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.retry_after = retry_after
        self.max_peer_bytes = max_peer_bytes
        self.peak = 0
        self.refused = 0
        self.refused_peer = 0
        self._held = 0
        self._charges: dict[Hashable, _Charge] = {}
        self._peers: dict[str, int] = {}

    def peer_held(self, peer: str) -> int:
        """Bytes charged now by requests of `peer`."""
        return self._peers.get(peer, 0)

    @property
    def held(self) -> int:
        """Bytes charged now."""
        return self._held

    def room(self) -> int:
        """What the budget leaves beside the charges of the request being served (`for_peer`;
        the whole budget outside a request): the largest charge that request can still take,
        which fits once nothing but that request is in flight. A computation larger than the
        budget is charged this much and so runs alone (`TableCache.get`): capping it at the
        whole budget instead, the request's own body charge made it never fit (503 forever)."""
        request = _serving.get()
        return max(0, self.max_bytes - (request.held if request is not None else 0))

    @property
    def holders(self) -> int:
        """Leases held now: a charge shared by several holders counts each of them."""
        return sum(charge.holders for charge in self._charges.values())

    def acquire(self, name: Hashable, nbytes: int) -> Lease:
        """A share of the charge `name` of `nbytes` bytes: joins it when held already (its
        memory is shared), else charges `nbytes` or raises `Overloaded` when they do not fit."""
        lease = self._take(name, nbytes, True)
        assert lease is not None  # `_take` raises instead
        return lease

    def try_acquire(self, name: Hashable, nbytes: int) -> Lease | None:
        """`acquire`, but None where it raises, and the refusal not counted: for a caller with
        another way to answer (the server's ready answers, `api/door.py`, leave such a request
        to its route, which is refused there, once)."""
        return self._take(name, nbytes, False)

    def _take(self, name: Hashable, nbytes: int, raising: bool) -> Lease | None:
        charge = self._charges.get(name)
        if charge is not None:
            charge.holders += 1
            return Lease(self, name)
        refusal = None
        request = _serving.get()
        peer_held = 0
        if self._held + nbytes > self.max_bytes:
            refusal = Overloaded(nbytes, self._held, self.max_bytes, self.retry_after)
        elif request is not None:
            peer_held = self._peers.get(request.peer, 0)
            share = self.max_peer_bytes
            if share is not None and peer_held > request.held and peer_held + nbytes > share:
                refusal = Overloaded(
                    nbytes, peer_held - request.held, share, self.retry_after, request.peer
                )
        if refusal is not None:
            if not raising:
                return None
            self.refused += 1
            self.refused_peer += refusal.peer is not None
            raise refusal
        if request is not None:
            self._peers[request.peer] = peer_held + nbytes
            request.held += nbytes
        self._charges[name] = _Charge(nbytes, 1, request)
        self._held += nbytes
        self.peak = max(self.peak, self._held)
        return Lease(self, name)

    def _drop(self, name: Hashable) -> None:
        charge = self._charges[name]
        charge.holders -= 1
        if charge.holders == 0:
            del self._charges[name]
            self._held -= charge.nbytes
            request = charge.request
            if request is not None:
                request.held -= charge.nbytes
                left = self._peers[request.peer] - charge.nbytes
                if left > 0:
                    self._peers[request.peer] = left
                else:
                    del self._peers[request.peer]


MMAP_THRESHOLD = 128 * 1024
"""glibc's mmap threshold `fix_mmap_threshold` sets (its default before it adapts)."""

_M_MMAP_THRESHOLD = -3
"""`mallopt`'s parameter number for the mmap threshold (glibc's malloc.h)."""


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes for this process, as the images'
    `MALLOC_MMAP_THRESHOLD_=131072` does, unless that variable is set (glibc has applied it).

    The budgets count what work holds, and freeing it must give the memory back. glibc's
    threshold adapts: after the first free of a mapped block it rises to that block's size (up
    to 32 MiB), and from then on blocks below it (a computation's temporaries, rows, protobuf
    copies) come from the heaps of malloc's arenas, one per worker thread, which keep what is
    freed for reuse. The process then holds more than the charges in flight: 12 concurrent
    20 MiB infers peaked 51 MiB above the ready server against 80 MiB of cache and in-flight
    budgets, 32 MiB with the threshold fixed (tests/api/test_hostile_budgets.py). Fixed,
    every allocation from `threshold` up is a mapping of its own, returned when freed.
    Returns whether it was set here (False: the variable is set, or not glibc)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))
