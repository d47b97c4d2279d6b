"""HEAD wherever `Allow` lists it (`serving/head.py`): every GET operation of the OpenAPI
document answers HEAD with its GET's status and headers and no body, 304 and Range included;
a path without GET still answers HEAD with 405."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from tests.api.metrics_util import scrape, value

SPEC = {"kind": "rope", "head_dim": 16, "max_positions": 12, "rope_theta": 777.0}
ONNX_REQUEST = {"spec": SPEC, "graph": "cos_sin", "mode": "compute", "opset": 18}

VOLATILE = {"date", "x-posenc-cache", "content-length", "server"}
"""Headers that may differ between two answers to the same request (a cache miss, then a hit;
/metrics changes as it is read)."""


@pytest.fixture(scope="module")
def values(client: httpx.Client) -> dict[str, str]:
    """A value for every path parameter of the GET operations: a served table, an ONNX model, a
    preset and part, an uploaded table key (absent: its 404 is what HEAD must say too)."""
    table = client.post("/v1/tables", json=SPEC)
    assert table.status_code == 200
    onnx = client.post("/v1/onnx", json=ONNX_REQUEST)
    assert onnx.status_code == 200, onnx.text
    return {
        "key": table.headers["content-location"].rsplit("/", 1)[1],
        "onnx_key": onnx.headers["x-posenc-key"],
        "name": "llama-3.1-8b",
        "part": "rope",
        "table_key": "0" * 64,
        "model": "rope",
        "version": "1",
    }


def _get_paths(client: httpx.Client, values: dict[str, str]) -> list[str]:
    """Every GET operation of the served OpenAPI document, its path parameters filled in."""
    paths = []
    for template, item in client.get("/openapi.json").json()["paths"].items():
        if "get" not in item:
            continue
        if template.startswith("/v1/onnx/"):
            template = template.replace("{key}", "{onnx_key}")
        paths.append(re.sub(r"{([^}]+)}", lambda m: values[m.group(1)], template))
    return [*paths, "/ui", "/ui/explorer.js", "/docs", "/openapi.json"]


def _stable(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k not in VOLATILE}


def test_every_get_operation_answers_head(client: httpx.Client, values: dict[str, str]) -> None:
    paths = _get_paths(client, values)
    assert len(paths) > 15
    for path in paths:
        got = client.get(path)
        head = client.head(path)
        assert head.status_code == got.status_code, path
        assert "GET" in client.request("PUT", path).headers.get("allow", "GET"), path
        assert head.content == b"", path
        assert _stable(head.headers) == _stable(got.headers), path
        if "etag" in got.headers and path != "/metrics":
            assert head.headers["content-length"] == str(len(got.content)), path


def test_head_revalidates_with_304(client: httpx.Client, values: dict[str, str]) -> None:
    path = f"/v1/tables/{values['key']}"
    etag = client.get(path).headers["etag"]
    for target in (path, f"{path}/preview?tensor=cos", f"/v1/onnx/{values['onnx_key']}", "/ui"):
        tag = client.head(target).headers["etag"]
        r = client.head(target, headers={"If-None-Match": tag})
        assert r.status_code == 304, target
        assert r.headers["etag"] == tag
    assert client.head(path, headers={"If-None-Match": etag}).status_code == 304


def test_head_takes_the_range_path(client: httpx.Client, values: dict[str, str]) -> None:
    path = f"/v1/tables/{values['key']}"
    params: dict[str, Any] = {"format": "raw", "tensor": "cos"}
    whole = client.get(path, params=params)
    r = client.head(path, params=params, headers={"Range": "bytes=4-11"})
    assert r.status_code == 206
    assert r.headers["content-range"] == f"bytes 4-11/{len(whole.content)}"
    assert r.headers["content-length"] == "8"
    assert r.headers["accept-ranges"] == "bytes"
    assert r.content == b""
    past = client.head(path, params=params, headers={"Range": f"bytes={len(whole.content)}-"})
    assert past.status_code == 416
    assert past.headers["content-range"] == f"bytes */{len(whole.content)}"


def test_head_without_get_is_405(client: httpx.Client) -> None:
    for path, allow in (("/v1/tables", "POST"), ("/v2/models/rope/infer", "POST")):
        r = client.head(path)
        assert r.status_code == 405, path
        assert r.headers["allow"] == allow


def test_head_is_counted_under_its_route(client: httpx.Client, values: dict[str, str]) -> None:
    labels = {"method": "HEAD", "route": "/v1/tables/{key}", "status": "200"}
    before = value(scrape(client), "posenc_http_requests_total", **labels)
    assert client.head(f"/v1/tables/{values['key']}").status_code == 200
    after = value(scrape(client), "posenc_http_requests_total", **labels)
    assert after == before + 1
