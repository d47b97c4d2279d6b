"""TableCache: identity of keys, byte-bounded LRU eviction, single-flight, busy, OOM fallback."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import torch

from posenc.encodings import SpecBase, Table, compute, content_key, parse_spec
from posenc.runtime import Busy, CacheKey, TableCache
from tests.waiting import Gate, async_wait_for


def rope(positions: int = 16, **extra: Any) -> SpecBase:
    return parse_spec({"kind": "rope", "head_dim": 8, "max_positions": positions, **extra})


class CountingCompute:
    """`encodings.compute` that counts calls, can be held at a gate until the test opens it
    (a computation in flight for exactly as long as the test needs) and can be made to fail."""

    def __init__(self, gate: Gate | None = None, fail: BaseException | None = None) -> None:
        self.calls = 0
        self.gate = gate
        self.fail = fail
        self.lock = threading.Lock()

    def __call__(self, spec: SpecBase, device: torch.device) -> Table:
        with self.lock:
            self.calls += 1
        if self.gate is not None:
            self.gate.pass_through()
        if self.fail is not None:
            raise self.fail
        return compute(spec, device)


def make_cache(**kwargs: Any) -> TableCache:
    kwargs.setdefault("max_bytes", 1 << 20)
    kwargs.setdefault("device", torch.device("cpu"))
    return TableCache(**kwargs)


def test_key_identity() -> None:
    cache = make_cache()
    spec = rope()
    key = cache.key_for(spec)
    assert key == CacheKey(content_key(spec), "cpu", "float32", "reference")
    # equal canonical forms share a key; dtype and precision are part of it
    assert cache.key_for(rope(profile="hf")) == key
    assert cache.key_for(rope(dtype="bfloat16")).dtype == "bfloat16"
    assert cache.key_for(rope(precision="exact")).precision == "exact"
    assert cache.key_for(rope(dtype="bfloat16")) != key
    other = TableCache(max_bytes=1, device=torch.device("meta"))
    assert other.key_for(spec) != key
    cache.close()
    other.close()


def test_hit_returns_the_same_entry_without_recomputing() -> None:
    counting = CountingCompute()
    cache = make_cache(compute=counting)

    async def run() -> None:
        first, outcome1 = await cache.get(rope())
        second, outcome2 = await cache.get(rope(profile="hf"))
        assert (outcome1, outcome2) == ("miss", "hit")
        assert first is second

    asyncio.run(run())
    assert counting.calls == 1
    assert cache.stats.hits == 1
    assert cache.stats.misses == 1
    cache.close()


def test_single_flight_under_concurrency() -> None:
    gate = Gate()
    counting = CountingCompute(gate)
    cache = make_cache(compute=counting, max_concurrent=1)

    async def run() -> list[str]:
        tasks = [asyncio.create_task(cache.get(rope())) for _ in range(50)]
        try:
            # every caller has asked while the one computation is held in flight
            assert await async_wait_for(lambda: cache.stats.misses + cache.stats.coalesced == 50)
        finally:
            gate.open()
        results = await asyncio.gather(*tasks)
        assert len({id(entry) for entry, _ in results}) == 1
        return [outcome for _, outcome in results]

    outcomes = asyncio.run(run())
    assert counting.calls == 1
    assert outcomes.count("miss") == 1
    assert outcomes.count("coalesced") == 49
    assert cache.stats.computations == 1
    cache.close()


def test_busy_when_too_many_distinct_computations() -> None:
    gate = Gate()
    cache = make_cache(compute=CountingCompute(gate), max_concurrent=2, retry_after=2.0)

    async def run() -> None:
        tasks = [asyncio.create_task(cache.get(rope(16 + i))) for i in range(2)]
        try:
            assert await async_wait_for(lambda: cache.in_flight == 2)
            with pytest.raises(Busy) as info:
                await cache.get(rope(64))
            assert info.value.retry_after == 2.0
            # joining a computation already in flight is not refused
            joined = asyncio.create_task(cache.get(rope(16)))
            assert await async_wait_for(lambda: cache.stats.coalesced == 1)
        finally:
            gate.open()
        _entry, outcome = await joined
        assert outcome == "coalesced"
        await asyncio.gather(*tasks)

    asyncio.run(run())
    assert cache.stats.rejected == 1
    cache.close()


def test_lru_eviction_keeps_the_byte_budget() -> None:
    one = rope(64).output_bytes()
    cache = make_cache(max_bytes=3 * one + 10)

    async def run() -> None:
        a, _ = await cache.get(rope(64))
        b, _ = await cache.get(rope(64, rope_theta=500.0))
        c, _ = await cache.get(rope(64, rope_theta=600.0))
        assert len(cache) == 3
        await cache.get(rope(64))  # touch a: b is now least recently used
        await cache.get(rope(64, rope_theta=700.0))
        assert cache.peek(b.key) is None
        assert cache.peek(a.key) is a
        assert cache.peek(c.key) is c
        assert cache.bytes_held <= cache.max_bytes

    asyncio.run(run())
    assert cache.stats.evictions == 1
    cache.close()


def test_prepared_bytes_count_in_the_budget_and_are_built_once() -> None:
    cache = make_cache(max_bytes=1 << 20)
    builds = 0

    def build(table: Table) -> bytes:
        nonlocal builds
        builds += 1
        return b"x" * 1000

    async def run() -> None:
        entry, _ = await cache.get(rope())
        before = cache.bytes_held
        first = await cache.prepare(entry, "fmt", build)
        second = await cache.prepare(entry, "fmt", build)
        assert first is second
        assert cache.bytes_held == before + 1000 == entry.nbytes

    asyncio.run(run())
    assert builds == 1
    cache.close()


def test_large_prepare_runs_once_for_concurrent_callers() -> None:
    cache = make_cache(max_bytes=64 << 20)
    builds = 0
    gate = Gate()

    def build(table: Table) -> bytes:
        nonlocal builds
        builds += 1
        gate.pass_through()
        return b"y" * 10

    async def run() -> None:
        entry, _ = await cache.get(rope(32768))  # 2 MiB: built in a worker thread
        assert entry.table_bytes > (1 << 20)
        tasks = [asyncio.create_task(cache.prepare(entry, "v", build)) for _ in range(10)]
        try:
            # the build task is queued behind the ten callers' first steps: once it runs, every
            # caller has found it in flight, and it stays in flight until the gate opens
            assert await async_wait_for(gate.reached.is_set)
        finally:
            gate.open()
        results = await asyncio.gather(*tasks)
        assert all(r is results[0] for r in results)

    asyncio.run(run())
    assert builds == 1
    cache.close()


def test_entry_larger_than_the_budget_is_served_not_kept() -> None:
    cache = make_cache(max_bytes=100)

    async def run() -> None:
        entry, outcome = await cache.get(rope())
        assert outcome == "miss"
        assert entry.table.tensors["cos"].shape == (16, 8)
        assert len(cache) == 0
        assert cache.bytes_held == 0

    asyncio.run(run())
    cache.close()


def test_failure_propagates_to_every_waiter_and_is_not_cached() -> None:
    gate = Gate()
    failing = CountingCompute(gate, fail=RuntimeError("boom"))
    cache = make_cache(compute=failing)

    async def run() -> None:
        tasks = [asyncio.create_task(cache.get(rope())) for _ in range(5)]
        try:
            assert await async_wait_for(lambda: cache.stats.misses + cache.stats.coalesced == 5)
        finally:
            gate.open()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, RuntimeError) for r in results)
        assert cache.in_flight == 0
        assert len(cache) == 0
        failing.fail = None
        _, outcome = await cache.get(rope())
        assert outcome == "miss"

    asyncio.run(run())
    assert failing.calls == 2
    cache.close()


def test_cancelled_caller_does_not_cancel_the_computation() -> None:
    gate = Gate()
    counting = CountingCompute(gate)
    cache = make_cache(compute=counting)

    async def run() -> None:
        first = asyncio.create_task(cache.get(rope()))
        try:
            assert await async_wait_for(lambda: cache.in_flight == 1)
            second = asyncio.create_task(cache.get(rope()))
            assert await async_wait_for(lambda: cache.stats.coalesced == 1)
            first.cancel()
            # the first caller is gone while the computation is still held in flight
            assert await async_wait_for(first.done)
            assert first.cancelled()
            assert cache.in_flight == 1
        finally:
            gate.open()
        entry, outcome = await second
        assert outcome == "coalesced"
        assert cache.peek(entry.key) is entry

    asyncio.run(run())
    assert counting.calls == 1
    cache.close()


def test_cuda_out_of_memory_falls_back_to_cpu() -> None:
    calls: list[str] = []

    def oom_on_cuda(spec: SpecBase, device: torch.device) -> Table:
        calls.append(device.type)
        if device.type == "cuda":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 4 GiB")
        return compute(spec, device)

    observed: list[tuple[str, str]] = []
    cache = make_cache(
        device=torch.device("cuda", 0),
        compute=oom_on_cuda,
        on_compute=lambda kind, dev, sec: observed.append((kind, dev)),
    )

    async def run() -> None:
        entry, _ = await cache.get(rope())
        assert entry.device == "cpu"
        assert entry.fallback == "cuda_out_of_memory"
        assert entry.key.device == "cuda:0"

    asyncio.run(run())
    assert calls == ["cuda", "cpu"]
    assert observed == [("rope", "cpu")]
    assert cache.stats.fallbacks == 1
    cache.close()


def test_other_errors_on_cuda_are_not_retried() -> None:
    def broken(spec: SpecBase, device: torch.device) -> Table:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    cache = make_cache(device=torch.device("cuda", 0), compute=broken)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        asyncio.run(cache.get(rope()))
    assert cache.stats.fallbacks == 0
    cache.close()


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="max_concurrent"):
        TableCache(max_bytes=1, device=torch.device("cpu"), max_concurrent=0)


def test_a_get_on_another_device_is_its_own_entry() -> None:
    """`get(..., device=cpu)` on a cache whose device is not the CPU (a GPU server asked for
    the reference bytes, as the check route and `verify` ask): computed on the CPU, keyed on
    the CPU, equal to the CPU table, and a separate entry from the cache device's; by content key
    too (the key memo keeps the cache device's key)."""
    counting = CountingCompute()
    cache = make_cache(device=torch.device("meta"), compute=counting)
    spec = rope()
    key = content_key(spec)
    cpu = torch.device("cpu")

    async def run() -> None:
        on_cpu, outcome = await cache.get(spec, key, cpu)
        assert outcome == "miss"
        assert on_cpu.device == "cpu"
        assert on_cpu.key == CacheKey(key, "cpu", "float32", "reference")
        want = compute(spec, cpu).tensors
        assert all(torch.equal(on_cpu.table.tensors[n], want[n]) for n in want)
        again, outcome = await cache.get(spec, key, cpu)
        assert (again, outcome) == (on_cpu, "hit")
        on_meta, outcome = await cache.get(spec, key)
        assert outcome == "miss"
        assert on_meta.device == "meta"
        assert on_meta.key == CacheKey(key, "meta", "float32", "reference")
        assert cache.key_for(spec, key) == on_meta.key
        assert cache.key_for(spec, key, cpu) == on_cpu.key

    asyncio.run(run())
    assert counting.calls == 2
    cache.close()
