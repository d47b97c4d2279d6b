"""Any replica answers any table URL (issue 35), on real `posenc serve` processes.

Two separate server processes share nothing (no store, no cache, no key index): the table URLs
one hands out (`Content-Location` of `POST /v1/tables`, the `url` of `/v1/resolve`) are answered
by the other, and by the first again after a restart, with identical bytes, ETag and
`Repr-Digest` in every format; the client library (posenc-client) fetches them by URL from a
replica that never saw the spec. tests/api/test_table_urls.py covers the URL form itself.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from posenc_client import Client
from tests.api.wire import decode
from tests.conftest import ProcessHandle, start_server_process
from tests.deploy.support import wait_http

CONFIGS = Path(__file__).parent.parent / "data" / "configs"

SPECS: list[dict[str, Any]] = [
    {"kind": "alibi", "num_heads": 12},
    {"kind": "sinusoidal", "dim": 64, "max_positions": 256},
    {"kind": "t5_bias", "num_buckets": 32, "max_distance": 128, "query_length": 24},
]

FORMATS: list[dict[str, str]] = [{}, {"format": "npz"}, {"format": "json"}]

COMPARED = ("etag", "repr-digest", "content-type", "content-location", "x-posenc-key")


def _serve() -> ProcessHandle:
    """A `posenc serve` process on a free port, ready (its own cache and key index)."""
    handle = start_server_process("--drain-seconds", "0")
    wait_http(f"{handle.url}/v2/health/ready", timeout=120)
    return handle


def _stop(handle: ProcessHandle) -> None:
    handle.signal(signal.SIGTERM)
    try:
        handle.proc.wait(timeout=60)
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def first() -> Iterator[ProcessHandle]:
    handle = _serve()
    yield handle
    _stop(handle)


@pytest.fixture(scope="module")
def second() -> Iterator[ProcessHandle]:
    handle = _serve()
    yield handle
    _stop(handle)


def _handed_out(url: str) -> list[str]:
    """The table URLs server `url` hands out for `SPECS` and a Gemma 3 config (two layer
    types; 256 positions)."""
    urls = []
    with httpx.Client(base_url=url, timeout=60) as c:
        for spec in SPECS:
            r = c.post("/v1/tables", json=spec)
            assert r.status_code == 200, r.text
            urls.append(r.headers["content-location"])
        config = json.loads((CONFIGS / "google__gemma-3-4b-it.json").read_text())
        r = c.post("/v1/resolve", json={"hf_config": config, "max_positions": 256})
        assert r.status_code == 200, r.text
        urls += [s["url"] for s in r.json()["specs"]]
    assert all(u.startswith("/v1/tables/") and "." in u for u in urls)
    return urls


def _answers(base: str, urls: list[str]) -> dict[tuple[str, str], httpx.Response]:
    out = {}
    with httpx.Client(base_url=base, timeout=60, headers={"Accept-Encoding": "identity"}) as c:
        for url in urls:
            for params in FORMATS:
                r = c.get(url, params=params)
                assert r.status_code == 200, (url, r.text)
                out[url, json.dumps(params)] = r
    return out


def _assert_same(
    got: dict[tuple[str, str], httpx.Response], want: dict[tuple[str, str], httpx.Response]
) -> None:
    assert got.keys() == want.keys()
    for where, r in want.items():
        assert got[where].content == r.content, where
        for header in COMPARED:
            assert got[where].headers.get(header) == r.headers.get(header), (where, header)
        assert r.headers["repr-digest"].startswith("sha-256=:")


@pytest.mark.slow
def test_urls_answer_alike_on_every_replica_and_after_a_restart(
    first: ProcessHandle, second: ProcessHandle, tmp_path: Path
) -> None:
    urls = _handed_out(first.url)
    with httpx.Client(base_url=second.url, timeout=60) as c:
        key = urls[0].removeprefix("/v1/tables/").partition(".")[0]
        unknown = c.get(f"/v1/tables/{key}")  # the bare key: the second never resolved it
        assert unknown.status_code == 404
        assert unknown.json()["error_type"] == "unknown_key"
    want = _answers(first.url, urls)
    _assert_same(_answers(second.url, urls), want)
    assert _handed_out(second.url) == urls  # every replica hands out the same URLs

    # the client library, on the replica that did not resolve them, by URL
    with Client(second.url, cache=tmp_path / "cache") as client:
        for url in urls:
            tables = client.table_by_key(f"{second.url}{url}")
            served = decode(want[url, json.dumps({})])
            assert set(tables) == set(served)
            for name, array in served.items():
                assert np.array_equal(tables[name], array.numpy()), (url, name)

    _stop(first)
    restarted = _serve()
    try:
        _assert_same(_answers(restarted.url, urls), want)
    finally:
        _stop(restarted)
