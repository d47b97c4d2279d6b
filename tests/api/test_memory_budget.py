"""The in-flight byte budget (runtime/budget.py, api/serving/body.py): bodies being sent and tables
being computed are charged to it, sends of one cached body share a charge, new work beyond it is
503 `overloaded` with `Retry-After`, and the charges come back when the sends end.

Slow readers are real loopback sockets with a 4 KiB receive buffer that read nothing: their
responses (16 MiB, beyond what the kernel's socket buffers absorb) stay in flight until closed.
"""

from __future__ import annotations

import contextlib
import gc
import socket
import weakref
from collections.abc import Callable, Iterator

import httpx
import pytest

from posenc.api.middleware import BODY_COPIES
from posenc.encodings import parse_spec
from posenc.runtime import CacheEntry, InFlightBudget
from tests import waiting
from tests.api.metrics_util import scrape, value
from tests.conftest import ServerHandle, start_server

PATIENCE = 15.0
MiB = 1 << 20
BIG = {"kind": "rope", "head_dim": 128, "max_positions": 12288}  # cos + sin: 2 x 6 MiB
BIG2 = {**BIG, "max_positions": 12287}
OTHER = {"kind": "rope", "head_dim": 128, "max_positions": 8192}  # 2 x 4 MiB


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerHandle]:
    with start_server(
        cache_bytes=160 * MiB,
        max_response_bytes=12 * MiB + 4096,
        in_flight_bytes=24 * MiB + 8192,
        send_timeout_seconds=PATIENCE,
    ) as handle:
        yield handle


def budget_of(handle: ServerHandle) -> InFlightBudget:
    budget = handle.state.require_cache().budget
    assert budget is not None
    return budget


def wait_for(condition: Callable[[], bool]) -> bool:
    """`tests.waiting.wait_for` with this module's patience."""
    return waiting.wait_for(condition, PATIENCE)


def stalled_get(handle: ServerHandle, path: str) -> socket.socket:
    """A GET of `path` from a socket that reads nothing (small receive window)."""
    host, port = handle.url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(PATIENCE)
    sock.connect((host, int(port)))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return sock


def status_line(sock: socket.socket) -> bytes:
    """The first line of the response on `sock` (read a byte at a time: nothing after it)."""
    line = b""
    while not line.endswith(b"\r\n"):
        byte = sock.recv(1)
        assert byte, line
        line += byte
    return line[:-2]


@contextlib.contextmanager
def budget_spent(handle: ServerHandle, client: httpx.Client) -> Iterator[None]:
    """Two stalled sends of two cached 12 MiB tables: the whole in-flight budget, held."""
    budget = budget_of(handle)
    paths = [client.post("/v1/tables", json=s).headers["content-location"] for s in (BIG, BIG2)]
    assert wait_for(lambda: budget.held == 0)
    socks = [stalled_get(handle, path) for path in paths]
    try:
        assert wait_for(lambda: budget.held > 23 * MiB)
        yield
    finally:
        for sock in socks:
            sock.close()
    assert wait_for(lambda: budget.held == 0)


def test_sends_are_charged_shared_and_refuse_work_beyond_the_budget(srv: ServerHandle) -> None:
    budget = budget_of(srv)
    with srv.client() as client:
        big = client.post("/v1/tables", json=BIG)
        big2 = client.post("/v1/tables", json=BIG2)
        assert big.status_code == big2.status_code == 200
        assert wait_for(lambda: budget.held == 0)
        size = len(big.content)
        path = big.headers["content-location"]
        first = stalled_get(srv, path)
        second = stalled_get(srv, path)
        third = None
        try:
            # both sends have started (each holds its share) before the charge is read
            assert wait_for(lambda: budget.holders == 2)
            # two sends of one cached body: one charge, its size
            assert size - 64 * 1024 < budget.held <= size
            third = stalled_get(srv, big2.headers["content-location"])
            assert wait_for(lambda: budget.held > size)
            refused = client.post("/v1/tables", json=OTHER)
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            error = refused.json()
            assert set(error) == {"error", "error_type", "detail"}
            assert error["error_type"] == "overloaded"
            assert error["detail"]["max_in_flight_bytes"] == 24 * MiB + 8192
            # held when refused: the stalled sends, and this request's own body (charged
            # BODY_COPIES times from its Content-Length while the request is served)
            body_charge = BODY_COPIES * len(refused.request.content)
            assert error["detail"]["in_flight_bytes"] == budget.held + body_charge
            assert error["detail"]["requested_bytes"] > 24 * MiB + 8192 - budget.held
            # what is cached and small still goes out
            small = client.post("/v1/tables", json={"kind": "alibi", "num_heads": 8})
            assert small.status_code == 200
        finally:
            for sock in (first, second, third):
                if sock is not None:
                    sock.close()
        assert wait_for(lambda: budget.held == 0)
        again = client.post("/v1/tables", json=OTHER)
        assert again.status_code == 200
        assert budget.peak <= 24 * MiB + 8192
        samples = scrape(client)
        assert value(samples, "posenc_in_flight_refused_total") >= 1
        assert value(samples, "posenc_in_flight_peak_bytes") == budget.peak
        assert value(samples, "posenc_in_flight_max_bytes") == 24 * MiB + 8192


def test_v2_reports_the_overload_in_its_own_contract(srv: ServerHandle) -> None:
    with srv.client() as client, budget_spent(srv, client):
        infer = client.post(
            "/v2/models/rope/infer",
            json={
                "parameters": {"head_dim": 128, "max_positions": 8193},
                "inputs": [
                    {"name": "position_ids", "shape": [1], "datatype": "INT64", "data": [0]}
                ],
            },
        )
    assert infer.status_code == 503, infer.text
    assert infer.headers["retry-after"] == "1"
    assert "in-flight budget" in infer.json()["error"]


def test_a_client_gone_mid_body_gives_its_charge_back(srv: ServerHandle) -> None:
    budget = budget_of(srv)
    with srv.client() as client:
        path = client.post("/v1/tables", json=BIG).headers["content-location"]
        assert wait_for(lambda: budget.held == 0)
        with client.stream("GET", path) as response:
            chunk = next(response.iter_bytes(65536))
            assert chunk
        # the stream closed unread: the server notices, stops sending, releases
        assert wait_for(lambda: budget.held == 0)
        assert client.get(path).status_code == 200


def test_budget_unit_rules() -> None:
    budget = InFlightBudget(10, retry_after=2)
    a = budget.acquire("a", 6)
    shared = budget.acquire("a", 6)  # joins: no new bytes
    assert (budget.held, budget.holders) == (6, 2)
    with pytest.raises(Exception, match="in-flight budget of 10 bytes") as refused:
        budget.acquire("b", 5)
    assert refused.value.retry_after == 2  # type: ignore[attr-defined]
    a.release()
    a.release()  # idempotent
    assert (budget.held, budget.holders) == (6, 1)
    shared.release()
    assert (budget.held, budget.holders) == (0, 0)
    assert budget.acquire("b", 10) is not None
    assert (budget.peak, budget.refused) == (10, 1)


def test_a_table_larger_than_the_cache_is_charged_while_sent() -> None:
    with start_server(
        cache_bytes=4 * MiB,
        max_response_bytes=12 * MiB + 4096,
        in_flight_bytes=24 * MiB + 8192,
        min_send_rate_bytes=0,  # the stalled send stays until closed, however slow the run
    ) as handle:
        budget = budget_of(handle)
        with handle.client() as client:
            path = client.post("/v1/tables", json=BIG, params={"rows": "0:1"}).headers[
                "content-location"
            ]
            sock = stalled_get(handle, path)  # 12 MiB, never resident: table + body charged
            try:
                assert wait_for(lambda: budget.held > 24 * MiB)
                other = client.post("/v1/tables", json=OTHER)
                assert other.status_code == 503, (budget.held, budget.holders, other.text[:200])
            finally:
                sock.close()
            assert wait_for(lambda: budget.held == 0)
            assert client.post("/v1/tables", json=OTHER).status_code == 200


def test_a_refused_computation_leaves_nothing_behind(srv: ServerHandle) -> None:
    cache = srv.state.require_cache()
    spec = {"kind": "rope", "head_dim": 128, "max_positions": 8194}
    with srv.client() as client:
        with budget_spent(srv, client):
            before = cache.stats.computations
            assert client.post("/v1/tables", json=spec).status_code == 503
            assert cache.stats.computations == before
            assert cache.in_flight == 0
            # other routes are unaffected
            assert client.get("/v1/presets").status_code == 200
        assert client.post("/v1/tables", json=spec).status_code == 200


def _gone(ref: weakref.ref[CacheEntry]) -> bool:
    gc.collect()
    return ref() is None


def test_a_send_holds_only_what_it_is_charged_for_once_evicted() -> None:
    """A send outliving its entry's eviction keeps alive the buffer it sends (charged), not the
    entry: its other tensors and prepared bodies leave with the eviction (issue 32, finding 6:
    a raw view of one tensor charged 6 MiB kept a 24 MiB entry, and under load such sends held
    hundreds of MiB outside both budgets)."""
    with start_server(
        cache_bytes=32 * MiB,
        max_response_bytes=12 * MiB + 4096,
        in_flight_bytes=48 * MiB,
        min_send_rate_bytes=0,  # the stalled sends stay until closed
    ) as handle:
        budget = budget_of(handle)
        cache = handle.state.require_cache()
        with handle.client() as client:
            for fmt in ("raw&tensor=cos", "safetensors"):
                # BIG resident with its safetensors body prepared: 12 + 12 MiB
                big = client.post("/v1/tables", json=BIG)
                assert big.status_code == 200
                key = cache.key_for(parse_spec(BIG), big.headers["x-posenc-key"])
                entry = cache.peek(key)
                assert entry is not None
                assert entry.prepared
                ref = weakref.ref(entry)
                del entry
                sock = stalled_get(handle, f"{big.headers['content-location']}?format={fmt}")
                try:
                    # the send holds one charge: the tensor (6 MiB) or the prepared body
                    assert wait_for(lambda: budget.holders == 1)
                    charged = budget.held
                    assert charged == (6 * MiB if fmt.startswith("raw") else 12 * MiB + 256)
                    # BIG2's tensors (12 MiB) do not fit beside BIG's 24: BIG is evicted
                    rows = {"format": "npy", "tensor": "cos", "rows": "0:1"}
                    assert client.post("/v1/tables", json=BIG2, params=rows).status_code == 200
                    assert cache.peek(key) is None
                    assert wait_for(lambda: _gone(ref)), fmt  # noqa: B023
                    assert budget.held == charged
                finally:
                    sock.close()
                assert wait_for(lambda: budget.held == 0)


def test_bodies_built_per_request_are_charged_each() -> None:
    """A whole-table body the cache does not keep (here: the table fits the cache, the table
    with its body does not) is built for each request that asks: each build is charged, not one
    charge shared by every send of the variant as for a kept body (issue 32, finding 6)."""
    with start_server(
        cache_bytes=16 * MiB,
        max_response_bytes=12 * MiB + 4096,
        in_flight_bytes=48 * MiB,
        min_send_rate_bytes=0,  # the stalled sends stay until closed
    ) as handle:
        budget = budget_of(handle)
        with handle.client() as client:
            path = client.post("/v1/tables", json=BIG, params={"rows": "0:1"}).headers[
                "content-location"
            ]
            socks = []
            try:
                for count in (1, 2):
                    socks.append(stalled_get(handle, path))
                    # the body is built (its headers are sent after that), so the next request
                    # builds another rather than joining this build
                    assert status_line(socks[-1]) == b"HTTP/1.1 200 OK"
                    # each stalled send holds its own body's charge
                    held = count * (12 * MiB + 256)
                    assert wait_for(lambda: budget.held == held), budget.held  # noqa: B023
                    assert budget.holders == count
            finally:
                for sock in socks:
                    sock.close()
            assert wait_for(lambda: budget.held == 0)
