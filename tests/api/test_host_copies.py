"""`serving/host.py`: the host copy of a table's tensor kept on its cache entry, the bytes a
GPU server's decode-step templates slice rows from and its raw `/v1` body sends.

The copy itself is `tensor.to("cpu")` (the same on any device: tests/api/test_gpu_paths.py and
the CUDA run of tests/api/test_v2_steps.py cover it on a GPU); what is checked here, on CPU
entries, is what the entry keeps and what each budget is charged: kept once under the raw body's
variant and counted in the cache budget; none when the entry is not resident, when the copy does
not fit beside it, or while its build does not fit the in-flight budget (that refusal not
counted); the build charged while it runs.
"""

from __future__ import annotations

import asyncio

import torch

from posenc.api.serving.formats import FORMATS
from posenc.api.serving.host import body_variant, host_bytes
from posenc.api.serving.selection import Selection
from posenc.encodings import parse_spec
from posenc.runtime import CacheEntry, InFlightBudget, TableCache

SPEC = parse_spec({"kind": "rope", "head_dim": 64, "max_positions": 256})  # cos, sin: 64 KiB
COS_BYTES = 256 * 64 * 4
VARIANT = body_variant(FORMATS["raw"], Selection(("cos",), None, (None,)))


def cache_with(max_bytes: int, budget_bytes: int = 1 << 30) -> TableCache:
    return TableCache(
        max_bytes=max_bytes,
        device=torch.device("cpu"),
        budget=InFlightBudget(budget_bytes, retry_after=1.0),
    )


async def resident(cache: TableCache) -> CacheEntry:
    entry, _ = await cache.get(SPEC)
    assert cache.peek(entry.key) is entry
    return entry


def test_the_copy_is_kept_once_and_counted() -> None:
    async def run() -> None:
        cache = cache_with(1 << 20)
        entry = await resident(cache)
        held = cache.bytes_held
        got = await host_bytes(cache, entry, "cos")
        assert got is not None
        assert bytes(got) == entry.table.tensors["cos"].numpy().tobytes()
        assert entry.prepared[VARIANT] is got
        assert cache.bytes_held == held + COS_BYTES
        assert await host_bytes(cache, entry, "cos") is got  # built once
        assert cache.bytes_held == held + COS_BYTES
        assert cache.budget is not None
        assert cache.budget.held == 0  # the build's charge is given back
        cache.close()

    asyncio.run(run())


def test_no_copy_for_an_entry_no_longer_resident() -> None:
    async def run() -> None:
        cache = cache_with(1 << 20)
        entry = await resident(cache)
        cache.clear()
        assert await host_bytes(cache, entry, "cos") is None
        assert VARIANT not in entry.prepared
        cache.close()

    asyncio.run(run())


def test_no_copy_that_does_not_fit_beside_the_entry() -> None:
    async def run() -> None:
        cache = cache_with(2 * COS_BYTES + COS_BYTES // 2)  # the table, not its copy too
        entry = await resident(cache)
        held = cache.bytes_held
        assert await host_bytes(cache, entry, "cos") is None
        assert VARIANT not in entry.prepared
        assert cache.bytes_held == held
        cache.close()

    asyncio.run(run())


def test_no_copy_while_its_build_does_not_fit_in_flight() -> None:
    async def run() -> None:
        cache = cache_with(1 << 20, budget_bytes=4 * COS_BYTES)
        budget = cache.budget
        assert budget is not None
        entry = await resident(cache)
        other = budget.acquire(object(), 3 * COS_BYTES + 1)
        refused = budget.refused
        assert await host_bytes(cache, entry, "cos") is None
        assert budget.refused == refused  # not a refusal of a request
        assert VARIANT not in entry.prepared
        other.release()
        assert await host_bytes(cache, entry, "cos") is not None
        cache.close()

    asyncio.run(run())


def test_the_build_is_charged_while_it_runs() -> None:
    async def run() -> None:
        cache = cache_with(1 << 20)
        budget = cache.budget
        assert budget is not None
        entry = await resident(cache)
        seen: list[int] = []
        prepare = cache.prepare

        async def watched(*args: object) -> object:
            seen.append(budget.held)
            return await prepare(*args)  # type: ignore[arg-type]

        cache.prepare = watched  # type: ignore[method-assign]
        assert await host_bytes(cache, entry, "cos") is not None
        assert seen == [COS_BYTES]
        assert budget.held == 0
        cache.close()

    asyncio.run(run())
