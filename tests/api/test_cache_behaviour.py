"""The cache seen through the API: one computation per key under concurrency (the metric proves
it), hits never recompute, the byte budget holds under a stream of distinct specs, 503 when busy."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import torch

from posenc.encodings import SpecBase, Table, compute
from tests.api.metrics_util import scrape, value
from tests.conftest import ServerHandle, start_server


def test_concurrent_identical_requests_compute_once(
    server: ServerHandle, client: httpx.Client
) -> None:
    spec = {"kind": "rope", "head_dim": 128, "max_positions": 40_000, "rope_theta": 123457.0}
    device = str(server.device)
    before = scrape(client)
    n = 16
    barrier = threading.Barrier(n)

    def fetch(_: int) -> tuple[int, str, bytes]:
        with server.client() as c:
            barrier.wait()
            # the whole table is computed; only one row travels, to keep the clients cheap
            params = {"format": "raw", "tensor": "cos", "rows": "39999:"}
            r = c.post("/v1/tables", json=spec, params=params)
            return r.status_code, r.headers["x-posenc-cache"], r.content

    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(fetch, range(n)))
    assert {status for status, _, _ in results} == {200}
    assert len({body for _, _, body in results}) == 1
    outcomes = [outcome for _, outcome, _ in results]
    assert outcomes.count("miss") == 1
    after = scrape(client)
    computed = value(after, "posenc_compute_seconds_count", kind="rope", device=device) - value(
        before, "posenc_compute_seconds_count", kind="rope", device=device
    )
    assert computed == 1
    assert (
        value(after, "posenc_cache_misses_total") - value(before, "posenc_cache_misses_total") == 1
    )
    joined = value(after, "posenc_cache_coalesced_total") - value(
        before, "posenc_cache_coalesced_total"
    )
    hits = value(after, "posenc_cache_hits_total") - value(before, "posenc_cache_hits_total")
    assert joined + hits == n - 1


def test_hits_do_not_recompute_or_reserialise(server: ServerHandle, client: httpx.Client) -> None:
    spec = {"kind": "rope", "head_dim": 64, "max_positions": 1000, "rope_theta": 777.0}
    first = client.post("/v1/tables", json=spec)
    cache = server.state.require_cache()
    entry = next(
        e for e in cache._entries.values() if e.key.content_key == first.headers["x-posenc-key"]
    )
    prepared = dict(entry.prepared)
    before = scrape(client)
    for _ in range(5):
        again = client.get(first.headers["content-location"])
        assert again.headers["x-posenc-cache"] == "hit"
        assert again.content == first.content
    after = scrape(client)
    assert value(
        after, "posenc_compute_seconds_count", kind="rope", device=str(server.device)
    ) == value(before, "posenc_compute_seconds_count", kind="rope", device=str(server.device))
    # the same prepared body object is sent every time
    assert entry.prepared.keys() == prepared.keys()
    assert all(entry.prepared[k] is prepared[k] for k in prepared)


def test_byte_budget_holds_under_a_stream_of_distinct_specs() -> None:
    budget = 4 << 20
    with start_server(cache_bytes=budget, max_response_bytes=1 << 20) as srv, srv.client() as c:
        sizes = []
        for i in range(24):
            spec = {"kind": "rope", "head_dim": 64, "max_positions": 1000 + i}  # ~0.5 MiB each
            r = c.post("/v1/tables", json=spec)
            assert r.status_code == 200
            samples = scrape(c)
            held = value(samples, "posenc_cache_bytes")
            assert held <= budget
            sizes.append(held)
        samples = scrape(c)
        assert value(samples, "posenc_cache_evictions_total") > 0
        assert value(samples, "posenc_cache_entries") < 24
        assert value(samples, "posenc_cache_max_bytes") == budget
        assert max(sizes) > budget / 2  # the budget is used, not just respected
        # an evicted table is recomputed on demand from its key
        first = {"kind": "rope", "head_dim": 64, "max_positions": 1000}
        key = c.post("/v1/tables", json=first, params={"format": "json", "rows": "0:1"})
        assert key.status_code == 200


@pytest.fixture
def slow_server(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A server whose computations signal `started` and then wait for `release` (events, not a
    fixed sleep: the test decides when the first computation is under way and when it ends)."""
    started, release = threading.Event(), threading.Event()
    with start_server(max_concurrent_computations=1, retry_after_seconds=3) as srv:
        cache = srv.state.require_cache()

        def slow(spec: SpecBase, device: torch.device) -> Table:
            started.set()
            assert release.wait(30), "the test never released the computation"
            return compute(spec, device)

        monkeypatch.setattr(cache, "_compute", slow)
        try:
            yield srv, started, release
        finally:
            release.set()


def test_busy_is_503_with_retry_after(
    slow_server: tuple[ServerHandle, threading.Event, threading.Event],
) -> None:
    server, started, release = slow_server

    def post(positions: int) -> httpx.Response:
        with server.client() as c:
            return c.post(
                "/v1/tables", json={"kind": "rope", "head_dim": 8, "max_positions": positions}
            )

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, 10)
        assert started.wait(30), "the first computation never started"
        refused = pool.submit(post, 11).result()  # while the first one holds the only slot
        release.set()
        assert first.result().status_code == 200
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "3"
    body = refused.json()
    assert body["error_type"] == "busy"
    assert body["detail"] == {"max_concurrent_computations": 1}
    with server.client() as c:
        assert value(scrape(c), "posenc_compute_rejected_total") == 1
        # once the computation is done, the same request succeeds
        assert (
            c.post(
                "/v1/tables", json={"kind": "rope", "head_dim": 8, "max_positions": 11}
            ).status_code
            == 200
        )


def test_cuda_out_of_memory_falls_back_to_cpu_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    with start_server(device="cpu") as srv, srv.client() as c:
        cache = srv.state.require_cache()

        def oom_on_cuda(spec: SpecBase, device: torch.device) -> Table:
            if device.type == "cuda":
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
            return compute(spec, device)

        # pretend the cache lives on a GPU whose allocations all fail
        monkeypatch.setattr(cache, "device", torch.device("cuda", 0))
        monkeypatch.setattr(cache, "_compute", oom_on_cuda)
        r = c.post("/v1/tables", json={"kind": "alibi", "num_heads": 6}, params={"format": "json"})
        assert r.status_code == 200
        assert r.headers["x-posenc-device"] == "cpu"
        assert r.headers["x-posenc-fallback"] == "cuda_out_of_memory"
        assert r.json()["meta"]["fallback"] == "cuda_out_of_memory"
        assert value(scrape(c), "posenc_compute_fallbacks_total") == 1
        assert c.get("/v2/health/ready").status_code == 200
