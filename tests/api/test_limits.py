"""Limits: table size checked from the spec before anything is allocated (413), request bodies
capped (413) per route (specs, /v2 infer bodies; uploads in test_uploads), JSON capped by
elements (413)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from tests.api.metrics_util import scrape, value
from tests.api.v2client import as_torch, make_input, outputs, spec_param, url
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


# --- /v2 infer bodies have their own cap (max_infer_body_bytes) ---------------------------------


def test_full_cache_infer_request_fits_the_infer_cap(server: ServerHandle) -> None:
    n = 131072  # 1 MiB of INT64 positions in binary: over max_body_bytes, under the infer cap
    assert n * 8 >= server.settings.max_body_bytes  # plus the JSON header: over it
    triton = http.InferenceServerClient(url(server))
    spec = {"kind": "rope", "head_dim": 8, "max_positions": n}
    result = triton.infer(
        "rope",
        [make_input("position_ids", np.arange(n, dtype=np.int64))],
        outputs=outputs(["cos"], True),
        parameters=spec_param(spec),
    )
    assert as_torch(result, "cos").shape == (n, 8)


INFER_CAP = 8192


@pytest.fixture(scope="module")
def small_infer_server() -> Iterator[ServerHandle]:
    with start_server(max_infer_body_bytes=INFER_CAP, max_body_bytes=1 << 20) as srv:
        yield srv


def test_infer_body_over_its_cap_is_413(small_infer_server: ServerHandle) -> None:
    triton = http.InferenceServerClient(url(small_infer_server))
    spec = spec_param({"kind": "rope", "head_dim": 8, "max_positions": 4096})
    small = [make_input("position_ids", np.arange(512, dtype=np.int64))]  # 4 KiB
    assert triton.infer("rope", small, parameters=spec).as_numpy("cos") is not None
    large = [make_input("position_ids", np.arange(4096, dtype=np.int64))]  # 32 KiB
    for version in ("", "1"):
        with pytest.raises(InferenceServerException) as err:
            triton.infer("rope", large, model_version=version, parameters=spec)
        assert err.value.status() == "413"
        assert str(INFER_CAP) in str(err.value.message())
    # other routes keep max_body_bytes: a 32 KiB spec body is fine there
    with small_infer_server.client() as c:
        pad = "x" * (32 << 10)
        r = c.post("/v1/tables", content=f'{{"kind": "alibi", "num_heads": 4, "p": "{pad}"}}')
        assert r.status_code == 422  # read and parsed: an unknown field, not a body cap


def test_infer_cap_is_checked_before_the_body_is_read(small_infer_server: ServerHandle) -> None:
    host, port = small_infer_server.url.removeprefix("http://").split(":")
    for path in ("/v2/models/rope/infer", "/v2/models/rope/versions/1/infer"):
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {1 << 30}\r\n"
        answer = b""
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall((head + "Connection: close\r\n\r\n").encode())
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b'"max_bytes":8192' in answer
