"""The documented memory bound at default settings under mixed load (issue 32, finding 6).

`posenc serve` runs in a process of its own with the defaults (in-flight budget 1 GiB, 256 MiB of
it per client address, `max_response_bytes` 512 MiB) and a 256 MiB cache, the settings of the
probe that found it peaking at 2.3-2.5 GiB against a bound of 1.54 GiB. Real clients load it from
eight loopback addresses (so that the per-address shares do not keep the whole budget idle):
asyncio httpx clients mixing cache hits, churning misses, 64 MiB tables (safetensors and raw
views) and `/v2` infers of computed rows, and tritonclient.grpc clients sending infers of up to
32 MiB. A 503 with `Retry-After` is the budget at work: waited out and retried; anything else is
an error. The bound (docs/service.md, "Memory under load"): the server's peak resident size
(`VmHWM`) at most its RSS once warm (its connections open) + the cache budget + the in-flight
budget.

A measurement under 40 s of load whose outcome depends on how the machine schedules the clients,
so it runs in `make load-check` (POSENC_LOAD_CHECK=1), as the benches do, not in `make test`
(the guide: memory is measured in bench/, not asserted in timed tests). It once held the bound
alone on 2 CPUs (1.49 of 1.72 GiB) but not inside the suite's CI run (2.20 GB against 1.84 GB)
nor on the H200 (2.18 against 2.15 GB): sends kept their evicted cache entries alive while
charged for one tensor or body of them (issue 32, finding 6; docs/service.md, "Memory under
load"). The report gives, besides the peak, the most the server's RSS was ever seen above its
baseline + cache bytes + in-flight bytes (sampled every 0.25 s with `/metrics`): memory outside
every charge, which should stay at or below zero.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException

from tests.api.metrics_util import scrape, value
from tests.api.test_hostile_budgets import infer_request, status_kib
from tests.conftest import ProcessHandle, start_server_process

pytestmark = pytest.mark.skipif(
    os.environ.get("POSENC_LOAD_CHECK") != "1",
    reason="a load measurement: make load-check (POSENC_LOAD_CHECK=1), not make test",
)

MiB = 1 << 20
GiB = 1 << 30
CACHE = 256 * MiB
IN_FLIGHT = 1 * GiB  # the default
ADDRESSES = [f"127.0.0.{i}" for i in range(1, 9)]
HTTP_CLIENTS = 40
GRPC_CLIENTS = 4
SECONDS = 40.0
HOT = [{"kind": "rope", "head_dim": 64, "max_positions": 2048 + i} for i in range(8)]  # 1 MiB
LARGE = [{"kind": "rope", "head_dim": 128, "max_positions": 65536 + i} for i in range(4)]  # 64 MiB
ROWS = {"head_dim": 128, "max_positions": 1 << 20}  # 1 GiB: never cached, rows computed
MIX = (("hit", 0.35), ("miss", 0.2), ("large", 0.3), ("infer", 0.15))


@pytest.fixture(scope="module")
def proc() -> Iterator[ProcessHandle]:
    # the minimum send rate is off: the budgets are at their defaults, but this test's clients
    # share one process (and the gRPC clients' protobuf decoding holds its interpreter lock) on
    # a loaded 2-core machine, and were cut as slow readers (connection reset mid-body) at the
    # default 256 KiB/s; the rate's own tests are in test_hostile_budgets.py
    env = {
        "POSENC_CACHE_BYTES": str(CACHE),
        "POSENC_MIN_SEND_RATE_BYTES": "0",
        "POSENC_LOG_LEVEL": "warning",
    }
    handle = start_server_process("--grpc-port", "0", env=env)
    try:
        yield handle
    finally:
        handle.stop()


class Tally:
    """Requests done per kind, 503s retried, errors."""

    def __init__(self) -> None:
        self.done: dict[str, int] = {}
        self.retried = 0
        self.errors: list[str] = []


async def http_load(
    url: str,
    hot: list[str],
    large: list[str],
    tally: Tally,
    ready: threading.Event,
    go: threading.Event,
) -> None:
    """`HTTP_CLIENTS` clients (one connection each, spread over `ADDRESSES`), their connections
    opened (`ready`), then loading for `SECONDS` from `go`."""
    deadline = time.monotonic() + SECONDS
    churn = iter(range(10**9))
    clients = [
        httpx.AsyncClient(
            base_url=url,
            timeout=120,
            headers={"Accept-Encoding": "identity"},
            limits=httpx.Limits(max_connections=1, keepalive_expiry=1.0),
            transport=httpx.AsyncHTTPTransport(local_address=ADDRESSES[i % len(ADDRESSES)]),
        )
        for i in range(HTTP_CLIENTS)
    ]

    async def one(client: httpx.AsyncClient, seed: int) -> None:
        pick = random.Random(seed)
        kinds, weights = zip(*MIX, strict=True)
        while time.monotonic() < deadline:
            kind = pick.choices(kinds, weights)[0]
            method, path, body = "GET", pick.choice(hot), None
            if kind == "miss":
                method, path = "POST", "/v1/tables"
                body = {"kind": "rope", "head_dim": 128, "max_positions": 4096 + next(churn)}
            elif kind == "large":
                path = pick.choice(large) + pick.choice(["", "?format=raw&tensor=cos"])
            elif kind == "infer":
                method, path = "POST", "/v2/models/rope/infer"
                body = infer_request(16384, pick.randrange(1 << 19), ROWS)
            stale = False
            while True:
                size = 0
                try:
                    async with client.stream(method, path, json=body) as r:
                        async for chunk in r.aiter_raw(1 << 20):
                            size += len(chunk)
                except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as err:
                    # before any byte, once: the keep-alive race with the server's idle
                    # timeout (every request here is idempotent), sent again
                    if size or stale:
                        tally.errors.append(f"{kind}: {type(err).__name__} after {size} bytes")
                        break
                    stale = True
                    continue
                if r.status_code == 503 and "retry-after" in r.headers:
                    tally.retried += 1
                    await asyncio.sleep(float(r.headers["retry-after"]))
                    continue
                if r.status_code != 200 or size != int(r.headers["content-length"]):
                    tally.errors.append(f"{kind}: {r.status_code}, {size} bytes")
                tally.done[kind] = tally.done.get(kind, 0) + 1
                break

    try:
        # every connection opened and used, so that the baseline holds what each costs
        await asyncio.gather(*(c.get(hot[i % len(hot)]) for i, c in enumerate(clients)))
        ready.set()
        await asyncio.to_thread(go.wait)
        await asyncio.gather(*(one(c, i) for i, c in enumerate(clients)))
    finally:
        for c in clients:
            await c.aclose()


def grpc_load(url: str, seed: int, tally: Tally, go: threading.Event) -> None:
    """One tritonclient.grpc client sending infers of 8-32 MiB for `SECONDS` from `go`."""
    client = tgrpc.InferenceServerClient(url)
    pick = random.Random(seed)
    try:
        go.wait()
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            positions = pick.choice([8192, 16384, 32768])
            item = tgrpc.InferInput("position_ids", [positions], "INT64")
            start = pick.randrange(1 << 19)
            item.set_data_from_numpy(np.arange(start, start + positions, dtype=np.int64))
            try:
                result = client.infer("rope", [item], parameters={"spec": json.dumps(ROWS)})
            except InferenceServerException as exc:
                if exc.status() == "StatusCode.UNAVAILABLE":
                    tally.retried += 1
                    time.sleep(1)
                    continue
                tally.errors.append(f"grpc: {exc.status()} {exc.message()}")
                continue
            if result.as_numpy("cos").shape != (positions, 128):
                tally.errors.append("grpc: wrong shape")
            tally.done["grpc"] = tally.done.get("grpc", 0) + 1
    finally:
        client.close()


def uncharged(proc: ProcessHandle, baseline: int, out: list[float], stop: threading.Event) -> None:
    """Until `stop`: the server's RSS less `baseline`, its cache bytes and its in-flight bytes
    (memory no charge counts), every 0.25 s, appended to `out` (a report, not an assertion)."""
    with httpx.Client(base_url=proc.url, timeout=30) as client:
        while not stop.wait(0.25):
            rss = status_kib(proc.proc.pid)["VmRSS"]
            samples = scrape(client)
            charged = value(samples, "posenc_cache_bytes") + value(
                samples, "posenc_in_flight_bytes"
            )
            out.append(rss - baseline - charged)


@pytest.mark.slow
def test_default_budgets_hold_under_mixed_load(proc: ProcessHandle) -> None:
    """Peak RSS within baseline + cache + in-flight at the default in-flight budget, the budget
    used (its peak above half of it), every request answered (503s retried), no other error."""
    with httpx.Client(base_url=proc.url, timeout=300) as client:
        hot = [client.post("/v1/tables", json=s).headers["content-location"] for s in HOT]
        large = [
            client.post("/v1/tables", json=s, params={"rows": "0:1"}).headers["content-location"]
            for s in LARGE
        ]
    tally = Tally()
    ready, go = threading.Event(), threading.Event()
    grpc_threads = [
        threading.Thread(target=grpc_load, args=(proc.grpc_url, i, tally, go))
        for i in range(GRPC_CLIENTS)
    ]
    for t in grpc_threads:
        t.start()
    http = threading.Thread(
        target=asyncio.run, args=(http_load(proc.url, hot, large, tally, ready, go),)
    )
    http.start()
    outside: list[float] = []
    stop = threading.Event()
    try:
        assert ready.wait(120)
        baseline = status_kib(proc.proc.pid)["VmRSS"]
        sampler = threading.Thread(target=uncharged, args=(proc, baseline, outside, stop))
        sampler.start()
        go.set()
    finally:
        go.set()
        http.join(SECONDS + 300)
        for t in grpc_threads:
            t.join(SECONDS + 300)
        stop.set()
    sampler.join(60)
    memory = status_kib(proc.proc.pid)
    with httpx.Client(base_url=proc.url) as client:
        samples = scrape(client)
    peak_in_flight = value(samples, "posenc_in_flight_peak_bytes")
    most_outside = max(outside, default=float("nan"))
    report = (tally.done, tally.retried, memory, baseline, peak_in_flight, most_outside)
    assert tally.errors == [], (tally.errors[:10], report)
    assert all(tally.done.get(k, 0) > 0 for k in ("hit", "miss", "large", "infer", "grpc")), report
    assert peak_in_flight > IN_FLIGHT // 2, report
    assert peak_in_flight <= IN_FLIGHT, report
    assert memory["VmHWM"] <= baseline + CACHE + IN_FLIGHT, report
    print("load:", report)
