"""The table cache: byte-bounded LRU, one computation per key, tables resident on the device.

Keys are `(content key, device, dtype, precision)` (`CacheKey`). A miss starts exactly one
computation in a worker thread, however many requests ask for the same key at once (single-flight:
later callers await the same task); distinct computations in flight are capped, and a request over
the cap raises `Busy` instead of queueing. Entries also hold bytes prepared from the table (the
serialised forms the API sends), built once per variant and counted in the same byte budget, so a
hit neither recomputes nor re-serialises. Eviction drops least-recently-used entries until the
budget holds; an entry larger than the whole budget is returned to its callers but not kept.

On a CUDA out-of-memory the computation is retried on the CPU and the entry says so (`fallback`).
All bookkeeping runs on the event loop thread; only `compute` and large `prepare` builds run in
threads, so the cache needs no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import torch

from posenc.encodings import SpecBase, Table, content_key
from posenc.encodings import compute as compute_table
from posenc.runtime.budget import InFlightBudget, Lease
from posenc.runtime.device import is_out_of_memory, release_cached_memory, synchronize

Buffer = bytes | memoryview
ComputeFn = Callable[[SpecBase, torch.device], Table]
ComputeObserver = Callable[[str, str, float], None]
Outcome = Literal["hit", "miss", "coalesced"]

OFFLOAD_BYTES = 1 << 20
"""Tables above this size are serialised in a worker thread rather than on the event loop."""

WORKING_FACTOR = {"reference": 2, "exact": 4}
"""What a computation is charged to the in-flight budget, in multiples of its output bytes: the
table plus its temporaries (measured on a 64 MiB RoPE table: +17 MiB at its peak in fp32
`reference`, +193 MiB computing in float64 for `exact`). Other precisions: the larger factor."""

KEY_MEMO = 1 << 16
"""Content keys whose `CacheKey` is remembered (oldest forgotten first)."""


class CacheKey(NamedTuple):
    """Identity of a cached table: the spec's content key plus device, dtype and precision (a
    named tuple: hashed and compared in C on every lookup, where a frozen dataclass runs a
    Python `__hash__`)."""

    content_key: str
    device: str
    dtype: str
    precision: str


class Busy(Exception):  # noqa: N818 - the condition, not a failure of the caller
    """Too many distinct computations are in flight; retry after `retry_after` seconds."""

    def __init__(self, limit: int, retry_after: float) -> None:
        super().__init__(f"{limit} computations already in flight; retry in {retry_after:g}s")
        self.limit = limit
        self.retry_after = retry_after


@dataclass
class CacheEntry:
    """A computed table, where it lives, and the serialised forms prepared from it so far."""

    key: CacheKey
    table: Table
    device: str
    fallback: str | None
    compute_seconds: float
    table_bytes: int
    prepared: dict[Hashable, Buffer] = field(default_factory=dict)
    prepared_bytes: int = 0
    digests: dict[Hashable, str] = field(default_factory=dict)
    """Digests of whole representations (the API's `Repr-Digest` values), one per variant, kept
    with the entry so that each is computed once."""
    serial: int = field(default_factory=itertools.count().__next__)
    """Unique for the life of the process (unlike `id()`, never reused once the entry is gone):
    what the in-flight charges of its sends are named by, so that a send need not keep the
    entry alive to keep its charge's name its own."""
    answers: dict[Hashable, object] = field(default_factory=dict)
    """Answers the API pre-built from this entry (a hit's headers and body, per request shape),
    dropped with the entry; their bodies are `prepared` buffers or views of `table`, so they
    hold no bytes of their own."""

    @property
    def nbytes(self) -> int:
        """Bytes this entry holds: tensors plus prepared buffers."""
        return self.table_bytes + self.prepared_bytes


@dataclass
class CacheStats:
    """Monotonic counters; bytes and entries are read from the cache itself."""

    hits: int = 0
    misses: int = 0
    coalesced: int = 0
    evictions: int = 0
    computations: int = 0
    fallbacks: int = 0
    rejected: int = 0


class TableCache:
    """Byte-bounded LRU cache of computed tables with single-flight computation.

    Args:
        max_bytes: budget for tensors plus prepared buffers, in bytes.
        device: where tables are computed and kept.
        max_concurrent: distinct computations allowed in flight; more raise `Busy`.
        retry_after: seconds suggested to a caller refused with `Busy`.
        compute: `(spec, device) -> Table`; `posenc.encodings.compute` unless a test injects one.
        on_compute: called as `(kind, device, seconds)` after each computation.
        budget: the in-flight budget a computation is charged to (`WORKING_FACTOR` times its
            output bytes, from `spec.output_bytes()`, until the table is cached or handed over;
            `_charge`); a new computation that does not fit raises `Overloaded`. None:
            computations are not charged.
        max_alone_bytes: the largest table whose computation may run alone when its working
            memory is more than the budget leaves beside its request (the server's
            `max_response_bytes`); None: any table.
    """

    def __init__(
        self,
        *,
        max_bytes: int,
        device: torch.device,
        max_concurrent: int = 4,
        retry_after: float = 1.0,
        compute: ComputeFn = compute_table,
        on_compute: ComputeObserver | None = None,
        budget: InFlightBudget | None = None,
        max_alone_bytes: int | None = None,
    ) -> None:
        if max_bytes < 0 or max_concurrent < 1:
            raise ValueError("max_bytes must be >= 0 and max_concurrent >= 1")
        self.max_bytes = max_bytes
        self.device = device
        self.max_concurrent = max_concurrent
        self.retry_after = retry_after
        self.stats = CacheStats()
        self._compute = compute
        self._on_compute = on_compute
        self.budget = budget
        self.max_alone_bytes = max_alone_bytes
        self._entries: OrderedDict[CacheKey, CacheEntry] = OrderedDict()
        self._bytes = 0
        self._key_memo: dict[str, CacheKey] = {}
        self._flights: dict[CacheKey, asyncio.Task[CacheEntry]] = {}
        self._outside = 0
        self._preparing: dict[tuple[CacheKey, Hashable], asyncio.Task[Buffer]] = {}
        self._executor: Executor = ThreadPoolExecutor(
            max_workers=max_concurrent, thread_name_prefix="posenc-compute"
        )

    @property
    def bytes_held(self) -> int:
        """Bytes currently held by resident entries."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def in_flight(self) -> int:
        """Distinct computations running now: the cache's own and those outside it (`slot`)."""
        return len(self._flights) + self._outside

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """One computation outside the cache (rows computed for the asked positions of a `/v2`
        or gRPC inference, never cached), counted with the cache's own against `max_concurrent`:
        raises `Busy` when they are all taken."""
        if self.in_flight >= self.max_concurrent:
            self.stats.rejected += 1
            raise Busy(self.max_concurrent, self.retry_after)
        self._outside += 1
        try:
            yield
        finally:
            self._outside -= 1

    def key_for(
        self, spec: SpecBase, key: str | None = None, device: torch.device | None = None
    ) -> CacheKey:
        """The cache key of `spec` on `device` (default: this cache's device; `key`: its content
        key, if known).

        Keys given by content key are remembered (up to `KEY_MEMO` of them): a content key names
        one canonical spec, hence one dtype and precision, and canonicalising a spec again on
        every hit costs more than the rest of the lookup.
        """
        where = str(self.device if device is None else device)
        if key is not None:
            known = self._key_memo.get(key)
            if known is not None:
                return known if known.device == where else known._replace(device=where)
        canon = spec.canonical()
        ck = CacheKey(
            content_key=key or content_key(canon),
            device=str(self.device),
            dtype=canon.cache_dtype(),
            precision=canon.cache_precision(),
        )
        if key is not None:
            if len(self._key_memo) >= KEY_MEMO:
                del self._key_memo[next(iter(self._key_memo))]
            self._key_memo[key] = ck
        return ck if ck.device == where else ck._replace(device=where)

    def peek(self, key: CacheKey) -> CacheEntry | None:
        """The resident entry for `key`, without touching recency or counters."""
        return self._entries.get(key)

    def touch(self, entry: CacheEntry) -> bool:
        """Count a hit on `entry` and make it the most recently used, as `get` does, when it is
        resident; False (nothing counted) when it is not."""
        if self._entries.get(entry.key) is not entry:
            return False
        self._entries.move_to_end(entry.key)
        self.stats.hits += 1
        return True

    async def get(
        self, spec: SpecBase, key: str | None = None, device: torch.device | None = None
    ) -> tuple[CacheEntry, Outcome]:
        """The entry for `spec` on `device` (default: the cache's), computing it at most once
        however many callers ask at once. `device=cpu` on a GPU server gives the reference
        bytes (what transformers computes on the CPU, bit for bit), which a GPU's libm may miss
        by an ulp: verification compares with those (docs/gpu.md).

        Returns the entry and whether it was a `hit`, a `miss` (this call started the
        computation) or `coalesced` (joined one in flight). Raises `Busy` when a new computation
        would exceed `max_concurrent`, `Overloaded` when its output does not fit the in-flight
        budget, and whatever the computation raised otherwise.
        """
        ck = self.key_for(spec, key, device)
        entry = self._entries.get(ck)
        if entry is not None:
            self._entries.move_to_end(ck)
            self.stats.hits += 1
            return entry, "hit"
        flight = self._flights.get(ck)
        outcome: Outcome = "coalesced"
        if flight is None:
            if self.in_flight >= self.max_concurrent:
                self.stats.rejected += 1
                raise Busy(self.max_concurrent, self.retry_after)
            lease = None
            if self.budget is not None:
                lease = self.budget.acquire(("compute", ck), self._charge(spec, ck))
            self.stats.misses += 1
            outcome = "miss"
            where = self.device if device is None else device
            flight = asyncio.get_running_loop().create_task(self._fill(ck, spec, lease, where))
            flight.add_done_callback(_consume_exception)
            self._flights[ck] = flight
        else:
            self.stats.coalesced += 1
        # shield: a caller that disconnects must not cancel the computation others await
        return await asyncio.shield(flight), outcome

    def can_compute(self, nbytes: int) -> bool:
        """Whether a whole table of `nbytes` can be computed here for the request being served:
        always without a budget; at most `max_alone_bytes`, since it then runs alone (`_charge`);
        else when its working charge (`WORKING_FACTOR`, the largest) fits what the budget leaves
        beside the request's own charges. A caller with another way to answer (`/v2` computing
        only the asked rows) takes it otherwise: the whole table would be 503 forever."""
        if self.budget is None:
            return True
        if self.max_alone_bytes is not None and nbytes <= self.max_alone_bytes:
            return True
        return max(WORKING_FACTOR.values()) * nbytes <= self.budget.room()

    def _charge(self, spec: SpecBase, ck: CacheKey) -> int:
        """What computing `spec` is charged to the in-flight budget: `WORKING_FACTOR` times its
        output bytes; when that is more than the budget leaves beside the asking request's own
        charges (`InFlightBudget.room`) and the table is at most `max_alone_bytes`, that room,
        so that it runs alone (admitted once nothing else is in flight, and nothing else is
        admitted while it runs); a larger table is charged in full (capped at the budget, it
        would run alone too, its working memory bounded only by the cache's budget)."""
        assert self.budget is not None
        factor = WORKING_FACTOR.get(ck.precision, max(WORKING_FACTOR.values()))
        size = spec.output_bytes()
        full = factor * size
        room = self.budget.room()
        if full > room and (self.max_alone_bytes is None or size <= self.max_alone_bytes):
            return room
        return full

    async def _fill(
        self, ck: CacheKey, spec: SpecBase, lease: Lease | None, device: torch.device
    ) -> CacheEntry:
        try:
            loop = asyncio.get_running_loop()
            table, used, fallback, seconds = await loop.run_in_executor(
                self._executor, self._run, spec, device
            )
        finally:
            del self._flights[ck]
            # from here the table is the cache's (charged to its budget) or its callers' (their
            # bodies are charged when sent)
            if lease is not None:
                lease.release()
        self.stats.computations += 1
        if fallback is not None:
            self.stats.fallbacks += 1
        if self._on_compute is not None:
            self._on_compute(str(table.meta.get("kind", spec.kind)), used, seconds)
        entry = CacheEntry(
            key=ck,
            table=table,
            device=used,
            fallback=fallback,
            compute_seconds=seconds,
            table_bytes=table.nbytes,
        )
        if entry.nbytes <= self.max_bytes:
            self._entries[ck] = entry
            self._bytes += entry.nbytes
            self._evict(protect=ck)
        return entry

    def _run(self, spec: SpecBase, device: torch.device) -> tuple[Table, str, str | None, float]:
        """Worker thread: compute on `device`, retrying on the CPU after a CUDA OOM."""
        start = time.perf_counter()
        try:
            table = self._compute(spec, device)
            synchronize(device)
            return table, str(device), None, time.perf_counter() - start
        except Exception as exc:
            if device.type != "cuda" or not is_out_of_memory(exc):
                raise
        release_cached_memory(device)
        cpu = torch.device("cpu")
        table = self._compute(spec, cpu)
        return table, str(cpu), "cuda_out_of_memory", time.perf_counter() - start

    async def prepare(
        self, entry: CacheEntry, variant: Hashable, build: Callable[[Table], Buffer]
    ) -> Buffer:
        """Bytes built from `entry.table` by `build`, built once per `(entry, variant)`.

        The result is kept on the entry and counted in the byte budget while the entry is
        resident. Builds of tables above `OFFLOAD_BYTES` run in a worker thread; concurrent
        callers of the same variant share one build.
        """
        ready = entry.prepared.get(variant)
        if ready is not None:
            return ready
        slot = (entry.key, variant)
        task = self._preparing.get(slot)
        if task is None:
            if entry.table_bytes <= OFFLOAD_BYTES:
                return self._keep(entry, variant, build(entry.table))
            task = asyncio.get_running_loop().create_task(self._build(entry, variant, build))
            task.add_done_callback(_consume_exception)
            self._preparing[slot] = task
        return await asyncio.shield(task)

    async def _build(
        self, entry: CacheEntry, variant: Hashable, build: Callable[[Table], Buffer]
    ) -> Buffer:
        try:
            buf = await asyncio.to_thread(build, entry.table)
        finally:
            del self._preparing[(entry.key, variant)]
        return self._keep(entry, variant, buf)

    def _keep(self, entry: CacheEntry, variant: Hashable, buf: Buffer) -> Buffer:
        resident = self._entries.get(entry.key) is entry
        size = buf.nbytes if isinstance(buf, memoryview) else len(buf)
        if resident and entry.nbytes + size <= self.max_bytes:
            entry.prepared[variant] = buf
            entry.prepared_bytes += size
            self._bytes += size
            self._evict(protect=entry.key)
        return buf

    def _evict(self, protect: CacheKey) -> None:
        """Drop least-recently-used entries (never `protect`) until the budget holds."""
        while self._bytes > self.max_bytes:
            victim = next((k for k in self._entries if k != protect), None)
            if victim is None:
                return
            gone = self._entries.pop(victim)
            self._bytes -= gone.nbytes
            self.stats.evictions += 1

    def clear(self) -> None:
        """Drop every resident entry (not counted as evictions)."""
        self._entries.clear()
        self._bytes = 0

    def close(self) -> None:
        """Release the worker threads; running computations finish, queued ones are dropped."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.clear()


def _consume_exception(task: asyncio.Task[object]) -> None:
    # every caller may have gone away: mark the exception retrieved so asyncio does not log it
    if not task.cancelled():
        task.exception()
