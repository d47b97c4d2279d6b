"""Limits: table size checked from the spec before anything is allocated (413), request bodies
capped (413), JSON capped by elements (413)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.api.metrics_util import scrape, value
from tests.conftest import ServerHandle, start_server

TERABYTE_SPEC = {"kind": "rope", "head_dim": 8192, "max_positions": 1 << 24}


def rss_bytes() -> int:
    """Resident set size of this process (the in-process server included)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_huge_table_is_413_before_allocation(server: ServerHandle, client: httpx.Client) -> None:
    before = scrape(client)
    rss = rss_bytes()
    for _ in range(3):
        r = client.post("/v1/tables", json=TERABYTE_SPEC)
        assert r.status_code == 413
        body = r.json()
        assert body["error_type"] == "too_large"
        size = 2 * (1 << 24) * 8192 * 4 + 4096 * 4
        assert body["detail"] == {
            "size_bytes": size,
            "max_bytes": server.settings.max_response_bytes,
        }
        assert str(size) in body["error"]
        assert str(server.settings.max_response_bytes) in body["error"]
    grown = rss_bytes() - rss
    assert grown < 32 << 20, f"RSS grew by {grown} bytes answering 413s"
    after = scrape(client)
    assert value(after, "posenc_cache_misses_total") == value(before, "posenc_cache_misses_total")


def test_just_over_the_limit_is_413_too(server: ServerHandle, client: httpx.Client) -> None:
    limit = server.settings.max_response_bytes
    positions = limit // (2 * 128 * 4) + 1
    r = client.post(
        "/v1/tables", json={"kind": "rope", "head_dim": 128, "max_positions": positions}
    )
    assert r.status_code == 413
    assert r.json()["detail"]["size_bytes"] > limit


def test_json_element_limit(server: ServerHandle, client: httpx.Client) -> None:
    spec = {"kind": "rope", "head_dim": 64, "max_positions": 1000}
    r = client.post("/v1/tables", json=spec, params={"format": "json"})
    assert r.status_code == 413
    body = r.json()
    assert body["error_type"] == "too_large_for_json"
    assert body["detail"] == {"elements": 2 * 1000 * 64 + 32, "max_elements": 100_000}
    r = client.post("/v1/tables", json=spec, params={"format": "json", "rows": "0:10"})
    assert r.status_code == 200


@pytest.fixture(scope="module")
def small_body_server() -> Iterator[ServerHandle]:
    with start_server(max_body_bytes=4096) as srv:
        yield srv


def test_body_over_the_cap_is_413(small_body_server: ServerHandle) -> None:
    padding = "x" * 8000
    with small_body_server.client() as c:
        r = c.post("/v1/tables", content=f'{{"kind": "rope", "pad": "{padding}"}}')
        assert r.status_code == 413
        body = r.json()
        assert body["error_type"] == "body_too_large"
        assert body["detail"]["max_bytes"] == 4096

        def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
            yield b'{"kind": "rope", "pad": "'
            for _ in range(10):
                yield b"y" * 1000
            yield b'"}'

        r = c.post("/v1/tables", content=chunks())
        assert r.status_code == 413
        assert r.json()["error_type"] == "body_too_large"
        ok = c.post("/v1/tables", json={"kind": "alibi", "num_heads": 8})
        assert ok.status_code == 200
        rejected = [
            v
            for (name, labels), v in scrape(c).items()
            if name == "posenc_http_requests_total" and ("status", "413") in labels
        ]
        assert sum(rejected) == 2
