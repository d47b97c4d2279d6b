"""Hostile input gets a concise 4xx in the error contract and leaves the server healthy: numbers
past 64 bits, .npy headers that claim more data than the body holds, and huge field names,
values and lists, which an error states the size of and never echoes whole (issue 23's probe)."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
from numpy.lib import format as npy_format

from posenc.api.errors import jsonable

MAX_ERROR_BYTES = 4096
"""An error body stays a few KiB whatever the input."""


def _npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    out = io.BytesIO()
    npy_format.write_array_header_1_0(out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue()


def _assert_contract(r: httpx.Response, status: int, error_type: str | None = None) -> None:
    assert r.status_code == status, r.text[:500]
    body = r.json()
    assert set(body) == {"error", "error_type", "detail"}
    if error_type is not None:
        assert body["error_type"] == error_type
    assert len(r.content) <= MAX_ERROR_BYTES, len(r.content)


@pytest.fixture
def healthy(client: httpx.Client) -> httpx.Client:
    yield client
    assert client.get("/v2/health/ready").status_code == 200
    assert client.post("/v1/tables", json={"kind": "alibi", "num_heads": 4}).status_code == 200


def test_row_range_past_64_bits(healthy: httpx.Client) -> None:
    key = healthy.post("/v1/tables", json={"kind": "rope", "head_dim": 8, "max_positions": 4})
    url = f"/v1/tables/{key.headers['x-posenc-key']}?rows=0:99999999999999999999999"
    r = healthy.get(url)
    _assert_contract(r, 400, "invalid_rows")
    assert r.json()["detail"][0]["value"] == [0, "(77-bit integer)"]


def test_config_number_past_64_bits(healthy: httpx.Client) -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 1e23,
    }
    r = healthy.post("/v1/resolve", json=config)
    _assert_contract(r, 422)
    assert r.json()["detail"][0]["field"] == "max_positions"


def test_npy_header_claiming_more_than_the_body(healthy: httpx.Client) -> None:
    """(200000, 200000) float32 over 64 bytes: refused from the header, nothing allocated."""
    body = _npy_header((200000, 200000)) + bytes(64)
    r = healthy.post("/v1/uploads", content=body, headers={"content-type": "application/x-npy"})
    _assert_contract(r, 400, "invalid_table")
    assert "160000000000 bytes" in r.json()["error"]
    assert r.json()["detail"][0]["field"] == "shape"


def test_npy_with_exactly_its_data_is_accepted(healthy: httpx.Client) -> None:
    out = io.BytesIO()
    np.save(out, np.arange(6, dtype=np.float32).reshape(2, 3))
    r = healthy.post(
        "/v1/uploads", content=out.getvalue(), headers={"content-type": "application/x-npy"}
    )
    assert r.status_code == 201
    assert r.json()["shape"] == [2, 3]
    short = out.getvalue()[:-4]
    r = healthy.post("/v1/uploads", content=short, headers={"content-type": "application/x-npy"})
    _assert_contract(r, 400, "invalid_table")


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"kind": "rope", "head_dim": 8, "x" * 500_000: 1}, id="huge-field-name"),
        pytest.param({"kind": "r" * 500_000}, id="huge-kind"),
        pytest.param({"kind": "rope", "head_dim": list(range(50_000))}, id="huge-list"),
        pytest.param({"kind": "rope", "head_dim": 8, "rope_theta": "9" * 100_000}, id="huge-str"),
    ],
)
def test_errors_never_amplify_the_input(healthy: httpx.Client, body: dict[str, object]) -> None:
    r = healthy.post("/v1/tables", json=body)
    _assert_contract(r, 422)


def test_jsonable_states_sizes() -> None:
    assert jsonable(2**70) == "(71-bit integer)"
    assert jsonable(2**63 - 1) == 2**63 - 1
    assert jsonable("a" * 1000).endswith("... (1000 characters)")
    assert jsonable(list(range(100)))[-1] == "... (100 items)"
    assert jsonable({str(i): i for i in range(20)})["..."] == "(20 keys)"
    assert jsonable(float("nan")) == "nan"


@pytest.mark.parametrize("rows", ["١:٢", "１:２", "+1:2", " 1:2", "1_0:20", "0x1:2", "1:2 "])
def test_rows_take_ascii_digits_only(healthy: httpx.Client, rows: str) -> None:
    key = healthy.post("/v1/tables", json={"kind": "rope", "head_dim": 8, "max_positions": 32})
    r = healthy.get(f"/v1/tables/{key.headers['x-posenc-key']}", params={"rows": rows})
    _assert_contract(r, 400, "invalid_rows")


def test_range_with_other_digits_is_ignored(healthy: httpx.Client) -> None:
    key = healthy.post("/v1/tables", json={"kind": "rope", "head_dim": 8, "max_positions": 32})
    url = f"/v1/tables/{key.headers['x-posenc-key']}?format=raw&tensor=cos"
    whole = healthy.get(url)
    r = healthy.get(url, headers={"Range": "bytes=٠-٣".encode()})
    assert r.status_code == 200
    assert r.content == whole.content


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"kind": "rope", "head_dim": "64", "max_positions": 8}, "head_dim"),
        ({"kind": "rope", "head_dim": 64, "max_positions": "8"}, "max_positions"),
        ({"kind": "rope", "head_dim": 64.0, "max_positions": 8}, "head_dim"),
        ({"kind": "rope", "head_dim": True, "max_positions": 8}, "head_dim"),
        ({"kind": "rope", "head_dim": 64, "max_positions": 8, "rope_theta": "1e4"}, "rope_theta"),
        (
            {"kind": "rope", "head_dim": 64, "max_positions": 8, "interleaved": "true"},
            "interleaved",
        ),
        ({"kind": "rope", "head_dim": 64, "max_positions": 8, "interleaved": 1}, "interleaved"),
        (
            {
                "kind": "rope",
                "head_dim": 64,
                "max_positions": 8,
                "rope_scaling": {"rope_type": "linear", "factor": "8"},
            },
            "rope_scaling.factor",
        ),
        ({"kind": "alibi", "num_heads": "12"}, "num_heads"),
        ({"kind": "sinusoidal", "dim": 64, "max_positions": "١٢"}, "max_positions"),
    ],
)
def test_no_string_to_number_coercion(
    healthy: httpx.Client, spec: dict[str, object], field: str
) -> None:
    r = healthy.post("/v1/tables", json=spec)
    _assert_contract(r, 422, "invalid_spec")
    assert [p["field"] for p in r.json()["detail"]] == [field]
    onnx = healthy.post("/v1/onnx", json={"spec": spec})
    _assert_contract(onnx, 422, "invalid_spec")


def test_strict_everywhere_else(healthy: httpx.Client) -> None:
    rope = {"kind": "rope", "head_dim": 8, "max_positions": 8}
    r = healthy.post("/v1/onnx", json={"spec": rope, "graph": "cos_sin", "opset": "19"})
    _assert_contract(r, 422)
    assert r.json()["detail"][0]["field"] == "opset"
    ids = [{"name": "position_ids", "shape": [1], "datatype": "INT64", "data": [0]}]
    v2 = healthy.post(
        "/v2/models/rope/infer", json={"inputs": ids, "parameters": {"head_dim": "8"}}
    )
    assert v2.status_code == 400
    assert "head_dim" in v2.json()["error"]
    section = {"head_dim": 8, "mrope_section": "١,1,2"}
    v2 = healthy.post("/v2/models/rope/infer", json={"inputs": ids, "parameters": section})
    assert v2.status_code == 400
    body = b'{"inputs": []}'
    v2 = healthy.post(
        "/v2/models/rope/infer",
        content=body,
        headers={"Inference-Header-Content-Length": "١٤".encode()},
    )
    assert v2.status_code == 400


@pytest.mark.parametrize("path", ["/v1/tables", "/v1/resolve", "/v1/onnx", "/v1/uploads"])
def test_content_encoding_is_refused(healthy: httpx.Client, path: str) -> None:
    body = b'{"kind": "alibi", "num_heads": 4}'
    for encoding in ("gzip", "br", "deflate, gzip"):
        r = healthy.post(path, content=body, headers={"Content-Encoding": encoding})
        _assert_contract(r, 415, "unsupported_media_type")
        assert "Content-Encoding" in r.json()["error"]
    plain = healthy.post(path, content=body, headers={"Content-Encoding": "identity"})
    assert plain.status_code != 415


def test_v2_decodes_compressed_bodies_only(healthy: httpx.Client) -> None:
    """/v2 infer takes tritonclient's request compression (gzip, deflate): a plain body labelled
    gzip, or another encoding, is a 400 naming Content-Encoding, never read as JSON."""
    body = b'{"inputs": [], "parameters": {"head_dim": 8}}'
    for encoding in ("gzip", "deflate", "br"):
        r = healthy.post(
            "/v2/models/rope/infer", content=body, headers={"Content-Encoding": encoding}
        )
        assert r.status_code == 400, (encoding, r.text[:300])
        assert set(r.json()) == {"error"}


@pytest.mark.parametrize("max_points", ["١٢", " 12", "+12", "1_2", "12.0"])
def test_preview_max_points_ascii_digits_only(healthy: httpx.Client, max_points: str) -> None:
    key = healthy.post("/v1/tables", json={"kind": "rope", "head_dim": 8, "max_positions": 32})
    url = f"/v1/tables/{key.headers['x-posenc-key']}/preview"
    r = healthy.get(url, params={"tensor": "cos", "max_points": max_points})
    _assert_contract(r, 400, "invalid_max_points")
