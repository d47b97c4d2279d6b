"""/v1/uploads and weight tables by key (`learned` tables, `relative_index` bias tables): uploads
as safetensors and .npy, content keys equal to `weights.table_key`, tables through /v1 and /v2 equal
to `posenc.encodings.compute` with the table inline, bad bodies (400), the upload cap (413 before
the body is read), the table store's budget and eviction, idempotent re-uploads, unknown keys (404
naming the family's key field), ONNX graphs of uploaded tables."""

from __future__ import annotations

import io
import json
import socket
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import torch
import tritonclient.http as http
from safetensors.torch import save as safetensors_save
from tritonclient.utils import InferenceServerException

from posenc.encodings import compute, content_key, parse_spec
from posenc.encodings.weights import table_key
from tests.api.v2client import as_torch, assert_equal, outputs, spec_param, url
from tests.api.wire import decode
from tests.conftest import ServerHandle, start_server

SAFETENSORS = {"Content-Type": "application/vnd.safetensors"}
NPY = {"Content-Type": "application/x-npy"}


def random_table(rows: int, dim: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed))


def npy_bytes(array: np.ndarray[Any, Any]) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def upload(client: httpx.Client, body: bytes, **kwargs: Any) -> httpx.Response:
    return client.post("/v1/uploads", content=body, **kwargs)


def timm_spec(source: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "learned", "method": "timm", "new_grid": [10, 12], **source}


def by_key(key: str, table: torch.Tensor) -> dict[str, Any]:
    return {"table_key": key, "table_shape": list(table.shape)}


def test_upload_safetensors_then_resample_equals_inline(
    server: ServerHandle, client: httpx.Client
) -> None:
    table = random_table(1 + 8 * 8, 16, seed=1)
    # a checkpoint's (1, N, D) pos_embed next to other weights: tensor= names it
    body = safetensors_save({"pos_embed": table[None], "cls_token": torch.zeros(1, 1, 16)})
    r = upload(client, body, headers=SAFETENSORS, params={"tensor": "pos_embed"})
    assert r.status_code == 201, r.text
    key = table_key(table)
    assert r.json() == {
        "table_key": key,
        "shape": [65, 16],
        "dtype": "float32",
        "nbytes": 65 * 16 * 4,
        "url": f"/v1/uploads/{key}",
    }
    assert r.headers["location"] == f"/v1/uploads/{key}"
    got = client.post("/v1/tables", json=timm_spec(by_key(key, table)))
    assert got.status_code == 200, got.text
    inline = timm_spec({"table": table.tolist()})
    want = compute(parse_spec(inline), server.device).tensors["embedding"].cpu()
    assert torch.equal(decode(got)["embedding"], want)
    assert want.shape == (1 + 10 * 12, 16)
    # the spec by key and the spec inline are one table: one content key
    assert got.headers["x-posenc-key"] == content_key(parse_spec(inline).canonical())
    again = client.post("/v1/tables", json=inline)
    assert again.headers["x-posenc-key"] == got.headers["x-posenc-key"]
    assert again.headers["x-posenc-cache"] == "hit"
    by_url = client.get(got.headers["content-location"])
    assert by_url.status_code == 200
    assert by_url.content == got.content


def test_upload_npy_then_resample_equals_inline(server: ServerHandle, client: httpx.Client) -> None:
    table = random_table(50, 24, seed=2)
    for headers, params in ((NPY, {}), ({}, {"format": "npy"}), ({}, {})):  # type, query, sniffed
        r = upload(client, npy_bytes(table.numpy()), headers=headers, params=params)
        assert r.status_code == 201, r.text
        assert r.json()["table_key"] == table_key(table)
    spec = {"kind": "learned", "method": "linear_1d", "new_length": 77}
    got = client.post("/v1/tables", json={**spec, **by_key(table_key(table), table)})
    assert got.status_code == 200, got.text
    want = compute(parse_spec({**spec, "table": table.tolist()}), server.device)
    assert torch.equal(decode(got)["embedding"], want.tensors["embedding"].cpu())


def test_npy_dtypes_and_byte_orders_are_stored_as_float32(client: httpx.Client) -> None:
    values = np.arange(12, dtype=np.float64).reshape(4, 3) / 8
    key = table_key(torch.from_numpy(values))
    for array in (values, values.astype(">f8"), values.astype("<f4"), np.asfortranarray(values)):
        r = upload(client, npy_bytes(array), headers=NPY)
        assert r.status_code == 201, (array.dtype, r.text)
        assert r.json()["table_key"] == key
    ints = np.arange(12, dtype=np.int64).reshape(4, 3)
    r = upload(client, npy_bytes(ints), headers=NPY)
    assert r.json()["table_key"] == table_key(torch.from_numpy(ints).float())


def test_reupload_is_idempotent(server: ServerHandle, client: httpx.Client) -> None:
    table = random_table(9, 4, seed=3)
    first = upload(client, safetensors_save({"t": table}), headers=SAFETENSORS)
    store = server.state.tables
    assert store is not None
    held = (len(store), store.nbytes)
    second = upload(client, safetensors_save({"t": table}), headers=SAFETENSORS)
    third = upload(client, npy_bytes(table.numpy()), headers=NPY)
    assert first.status_code == second.status_code == third.status_code == 201
    assert first.json() == second.json() == third.json()
    assert (len(store), store.nbytes) == held


def test_get_upload_and_unknown_keys(client: httpx.Client) -> None:
    table = random_table(5, 3, seed=4)
    key = upload(client, npy_bytes(table.numpy()), headers=NPY).json()["table_key"]
    r = client.get(f"/v1/uploads/{key}")
    assert r.status_code == 200
    assert r.json()["shape"] == [5, 3]
    for missing in ("0" * 64, "not-a-key"):
        r = client.get(f"/v1/uploads/{missing}")
        assert r.status_code == 404
        assert r.json()["error_type"] == "unknown_table"
    spec = {"kind": "learned", "method": "linear_1d", "new_length": 4, "table_shape": [5, 3]}
    r = client.post("/v1/tables", json={**spec, "table_key": "0" * 64})
    assert r.status_code == 404
    body = r.json()
    assert body["error_type"] == "unknown_table"
    assert body["detail"][0]["field"] == "table_key"
    assert "/v1/uploads" in body["error"]


def test_inline_tables_are_stored(client: httpx.Client) -> None:
    table = random_table(6, 2, seed=5)
    key = table_key(table)
    assert client.get(f"/v1/uploads/{key}").status_code == 404
    spec = {"kind": "learned", "method": "linear_1d", "new_length": 3}
    inline = client.post("/v1/tables", json={**spec, "table": table.tolist()})
    assert inline.status_code == 200, inline.text
    assert client.get(f"/v1/uploads/{key}").json()["shape"] == [6, 2]
    # the canonical, key-only spec now works with another length too
    other = client.post("/v1/tables", json={**spec, **by_key(key, table), "new_length": 5})
    assert other.status_code == 200, other.text
    assert decode(other)["embedding"].shape == (5, 2)


def _two_tensor_file() -> bytes:
    return safetensors_save({"a": torch.zeros(3, 2), "b": torch.ones(3, 2)})


def _corrupt_header() -> bytes:
    return struct.pack("<Q", 1 << 40) + b'{"a": 1}'


@pytest.mark.parametrize(
    ("body", "headers", "params", "error_type"),
    [
        (b"", SAFETENSORS, {}, "invalid_table"),
        (b"hello, world", {}, {}, "invalid_table"),
        (b"hello, world", NPY, {}, "invalid_table"),
        (b"\x93NUMPY\x01\x00garbage", NPY, {}, "invalid_table"),
        (_corrupt_header(), SAFETENSORS, {}, "invalid_table"),
        (b"\x00" * 64, SAFETENSORS, {}, "invalid_table"),
        (npy_bytes(np.zeros(5, dtype=np.float32)), NPY, {}, "invalid_table"),
        (npy_bytes(np.zeros((2, 2, 2), dtype=np.float32)), NPY, {}, "invalid_table"),
        (npy_bytes(np.zeros((0, 4), dtype=np.float32)), NPY, {}, "invalid_table"),
        (npy_bytes(np.zeros((2, 2), dtype=np.bool_)), NPY, {}, "invalid_table"),
        (npy_bytes(np.zeros((2, 2), dtype=np.complex64)), NPY, {}, "invalid_table"),
        (npy_bytes(np.full((2, 2), np.nan, dtype=np.float32)), NPY, {}, "invalid_table"),
        (safetensors_save({"t": torch.full((2, 2), float("inf"))}), {}, {}, "invalid_table"),
        (safetensors_save({"t": torch.zeros(2, 2, dtype=torch.bool)}), {}, {}, "invalid_table"),
        (_two_tensor_file(), SAFETENSORS, {}, "tensor_required"),
        (_two_tensor_file(), SAFETENSORS, {"tensor": "c"}, "unknown_tensor"),
        (npy_bytes(np.zeros((2, 2), dtype=np.float32)), {}, {"format": "pickle"}, "unknown_format"),
    ],
)
def test_bad_bodies_are_400(
    client: httpx.Client,
    body: bytes,
    headers: dict[str, str],
    params: dict[str, str],
    error_type: str,
) -> None:
    r = upload(client, body, headers=headers, params=params)
    assert r.status_code == 400, r.text
    payload = r.json()
    assert payload["error_type"] == error_type
    assert payload["error"]
    assert isinstance(payload["detail"], list)


def test_pickled_npy_is_refused(client: httpx.Client) -> None:
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    r = upload(client, buf.getvalue(), headers=NPY)
    assert r.status_code == 400
    assert r.json()["error_type"] == "invalid_table"


# --- limits: the upload cap and the table store ------------------------------------------------

UPLOAD_CAP = 64 << 10
STORE_BYTES = 48 << 10


@pytest.fixture(scope="module")
def small_store() -> Iterator[ServerHandle]:
    with start_server(
        max_upload_bytes=UPLOAD_CAP, table_store_bytes=STORE_BYTES, max_body_bytes=4096
    ) as srv:
        yield srv


def raw_post(server: ServerHandle, path: str, headers: dict[str, str]) -> bytes:
    """Send only the head of a POST (no body at all) and return what the server answers."""
    host, port = server.url.removeprefix("http://").split(":")
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", *(f"{k}: {v}" for k, v in headers.items())]
    answer = b""
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_upload_over_the_cap_is_413_before_the_body_is_read(small_store: ServerHandle) -> None:
    head = raw_post(
        small_store, "/v1/uploads", {"Content-Length": str(1 << 30), **NPY, "Connection": "close"}
    )
    status, _, rest = head.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 413"), head[:200]
    payload = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert payload["error_type"] == "body_too_large"
    assert payload["detail"] == {"max_bytes": UPLOAD_CAP, "size_bytes": 1 << 30}


def test_upload_streamed_past_the_cap_is_413(small_store: ServerHandle) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        for _ in range(20):
            yield b"\x00" * 8192

    with small_store.client() as c:
        r = c.post("/v1/uploads", content=chunks(), headers=NPY)
        assert r.status_code == 413
        assert r.json()["error_type"] == "body_too_large"
        # the cap is the upload's own: far above max_body_bytes
        table = random_table(100, 100, seed=6)  # 40 000 bytes as .npy
        ok = c.post("/v1/uploads", content=npy_bytes(table.numpy()), headers=NPY)
        assert ok.status_code == 201, ok.text
        r = c.post("/v1/tables", content=b" " * 5000, headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        assert r.json()["detail"]["max_bytes"] == 4096


def test_table_over_the_store_is_413(small_store: ServerHandle) -> None:
    table = random_table(200, 64, seed=7).half()  # 25 600 bytes as .npy, 51 200 as float32
    with small_store.client() as c:
        r = c.post("/v1/uploads", content=npy_bytes(table.numpy()), headers=NPY)
        assert r.status_code == 413
        assert r.json()["error_type"] == "too_large"
        assert r.json()["detail"] == {"size_bytes": 200 * 64 * 4, "max_bytes": STORE_BYTES}


def test_store_evicts_least_recently_used_tables(small_store: ServerHandle) -> None:
    tables = [random_table(64, 64, seed=10 + i) for i in range(3)]  # 16 KiB each as float32
    spec = {"kind": "learned", "method": "linear_1d", "new_length": 32}
    with small_store.client() as c:
        keys = [
            c.post("/v1/uploads", content=npy_bytes(t.numpy()), headers=NPY).json()["table_key"]
            for t in tables[:2]
        ]
        first = c.post("/v1/tables", json={**spec, **by_key(keys[0], tables[0])})
        assert first.status_code == 200
        assert c.get(f"/v1/uploads/{keys[1]}").status_code == 200  # keys[0] is now the oldest
        for seed in (20, 21):
            extra = random_table(64, 64, seed=seed).numpy()
            assert c.post("/v1/uploads", content=npy_bytes(extra), headers=NPY).status_code == 201
        missing = c.get(f"/v1/uploads/{keys[0]}")
        assert missing.status_code == 404
        assert missing.json()["error_type"] == "unknown_table"
        # a table computed from it stays served from the cache by its content key
        cached = c.get(first.headers["content-location"])
        assert cached.status_code == 200
        assert cached.headers["x-posenc-cache"] == "hit"
        assert cached.content == first.content
        # a new resampling needs the values again
        other = c.post("/v1/tables", json={**spec, **by_key(keys[0], tables[0]), "new_length": 9})
        assert other.status_code == 404
        assert other.json()["error_type"] == "unknown_table"


# --- /v2: the learned model with an uploaded table --------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_v2_learned_model_with_an_uploaded_key(
    server: ServerHandle, client: httpx.Client, binary: bool
) -> None:
    table = random_table(1 + 6 * 6, 8, seed=30)
    key = upload(client, npy_bytes(table.numpy()), headers=NPY).json()["table_key"]
    triton = http.InferenceServerClient(url(server))
    spec = {"kind": "learned", "method": "hf_vit", "new_grid": [4, 4]}
    result = triton.infer(
        "learned",
        [],
        outputs=outputs(["embedding"], binary),
        parameters=spec_param({**spec, **by_key(key, table)}),
    )
    want = compute(parse_spec({**spec, "table": table.tolist()}), server.device)
    assert_equal(as_torch(result, "embedding"), want.tensors["embedding"].cpu())
    assert result.get_response()["parameters"]["posenc_key"] == content_key(
        parse_spec({**spec, "table": table.tolist()}).canonical()
    )
    unknown = {**spec, "table_key": "f" * 64, "table_shape": [37, 8]}
    with pytest.raises(InferenceServerException) as err:
        triton.infer("learned", [], parameters=spec_param(unknown))
    assert err.value.status() == "404"
    assert "/v1/uploads" in str(err.value.message())


# --- /v1/onnx: a learned graph for an uploaded table ------------------------------------------


def test_onnx_graph_of_an_uploaded_table(server: ServerHandle, client: httpx.Client) -> None:
    table = random_table(20, 6, seed=40)
    key = upload(client, npy_bytes(table.numpy()), headers=NPY).json()["table_key"]
    spec = {"kind": "learned", "method": "linear_1d", "new_length": 31}
    r = client.post("/v1/onnx", json={"spec": {**spec, **by_key(key, table)}})
    assert r.status_code == 200, r.text
    session = ort.InferenceSession(r.content, providers=["CPUExecutionProvider"])
    positions = np.array([[0, 5, 30]], dtype=np.int64)
    (rows,) = session.run(None, {"position_ids": positions})
    want = compute(parse_spec({**spec, "table": table.tolist()})).tensors["embedding"]
    assert torch.equal(torch.from_numpy(rows), want[positions])
    again = client.get(r.headers["content-location"])
    assert again.status_code == 200
    assert again.content == r.content
    unknown = {**spec, "table_key": "e" * 64, "table_shape": [20, 6]}
    missing = client.post("/v1/onnx", json={"spec": unknown})
    assert missing.status_code == 404
    assert missing.json()["error_type"] == "unknown_table"


# --- relative_index: a bias table uploaded once, named by key ---------------------------------

BEIT = {"kind": "relative_index", "scheme": "beit", "window_size": [4, 3]}
"""num_relative_distance (2*4 - 1)(2*3 - 1) + 3 = 38."""
SHAW = {"kind": "relative_index", "scheme": "shaw", "max_relative_position": 3, "key_length": 9}
"""num_relative_distance 2*3 + 1 = 7."""


def bias_by_key(key: str, table: torch.Tensor) -> dict[str, Any]:
    return {
        "relative_position_bias_table_key": key,
        "relative_position_bias_table_shape": list(table.shape),
    }


def test_relative_index_bias_by_uploaded_key_equals_inline(
    server: ServerHandle, client: httpx.Client
) -> None:
    table = random_table(38, 12, seed=50)
    body = safetensors_save({"relative_position_bias_table": table, "qkv": torch.zeros(2, 2)})
    r = upload(client, body, headers=SAFETENSORS, params={"tensor": "relative_position_bias_table"})
    assert r.status_code == 201, r.text
    key = table_key(table)
    assert r.json()["table_key"] == key
    assert r.json()["shape"] == [38, 12]
    named = {**BEIT, **bias_by_key(key, table), "dtype": "bfloat16"}
    inline = {**BEIT, "relative_position_bias_table": table.tolist(), "dtype": "bfloat16"}
    got = client.post("/v1/tables", json=named)
    assert got.status_code == 200, got.text
    assert got.headers["x-posenc-cache"] == "miss"
    # the inline spec and its uploaded twin are one table: one content key, the same bytes
    want = client.post("/v1/tables", json=inline)
    assert want.status_code == 200, want.text
    assert want.headers["x-posenc-cache"] == "hit"
    assert got.headers["x-posenc-key"] == want.headers["x-posenc-key"]
    assert got.headers["x-posenc-key"] == content_key(parse_spec(inline))
    assert got.content == want.content
    core = compute(parse_spec(inline), server.device).tensors
    tensors = decode(got)
    assert torch.equal(tensors["index"], core["index"].cpu())
    assert torch.equal(tensors["bias"], core["bias"].cpu())
    assert tensors["bias"].shape == (12, 13, 13)
    by_url = client.get(got.headers["content-location"])
    assert by_url.status_code == 200
    assert by_url.content == got.content
    rows = client.post("/v1/tables?format=json&tensor=bias", json=named)
    assert rows.status_code == 200, rows.text
    assert rows.content == client.post("/v1/tables?format=json&tensor=bias", json=inline).content


def test_relative_index_inline_tables_are_stored(client: httpx.Client) -> None:
    table = random_table(7, 3, seed=51)
    key = table_key(table)
    assert client.get(f"/v1/uploads/{key}").status_code == 404
    inline = client.post(
        "/v1/tables", json={**SHAW, "relative_position_bias_table": table.tolist()}
    )
    assert inline.status_code == 200, inline.text
    assert client.get(f"/v1/uploads/{key}").json()["shape"] == [7, 3]
    # the canonical, key-only spec now works with other lengths too
    other = client.post("/v1/tables", json={**SHAW, **bias_by_key(key, table), "key_length": 20})
    assert other.status_code == 200, other.text
    assert decode(other)["bias"].shape == (3, 20, 20)


def test_relative_index_unknown_keys_and_bad_shapes(client: httpx.Client) -> None:
    missing = {**BEIT, **bias_by_key("c" * 64, random_table(38, 4, seed=52))}
    r = client.post("/v1/tables", json=missing)
    assert r.status_code == 404, r.text
    body = r.json()
    assert body["error_type"] == "unknown_table"
    assert body["detail"][0]["field"] == "relative_position_bias_table_key"
    assert "/v1/uploads" in body["error"]
    # the stored table is (38, 5), the spec says (38, 4)
    stored = random_table(38, 5, seed=53)
    key = upload(client, npy_bytes(stored.numpy()), headers=NPY).json()["table_key"]
    wrong = {**BEIT, "relative_position_bias_table_key": key}
    r = client.post("/v1/tables", json={**wrong, "relative_position_bias_table_shape": [38, 4]})
    assert r.status_code == 422, r.text
    assert r.json()["error_type"] == "invalid_spec"
    assert r.json()["detail"][0]["field"] == "relative_position_bias_table_shape"
    assert "[38, 5]" in r.json()["detail"][0]["message"]
    # a shape the scheme cannot have, both sources, a malformed key: named before any lookup
    for spec, field in [
        ({**wrong, "relative_position_bias_table_shape": [37, 5]}, "shape"),
        ({**wrong, "relative_position_bias_table": stored.tolist()}, ""),
        ({**BEIT, **bias_by_key("C" * 64, stored)}, "key"),
    ]:
        r = client.post("/v1/tables", json=spec)
        assert r.status_code == 422, r.text
        assert r.json()["error_type"] == "invalid_spec"
        named = "relative_position_bias_table" + (f"_{field}" if field else "")
        assert r.json()["detail"][0]["field"] == named
    ok = client.post("/v1/tables", json={**wrong, "relative_position_bias_table_shape": [38, 5]})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_v2_relative_index_model_with_an_uploaded_key(
    server: ServerHandle, client: httpx.Client, binary: bool
) -> None:
    table = random_table(38, 4, seed=54)
    key = upload(client, npy_bytes(table.numpy()), headers=NPY).json()["table_key"]
    triton = http.InferenceServerClient(url(server))
    result = triton.infer(
        "relative_index",
        [],
        outputs=outputs(["index", "bias"], binary),
        parameters=spec_param({**BEIT, **bias_by_key(key, table)}),
    )
    inline = parse_spec({**BEIT, "relative_position_bias_table": table.tolist()})
    want = compute(inline, server.device).tensors
    assert_equal(as_torch(result, "index"), want["index"].cpu())
    assert_equal(as_torch(result, "bias"), want["bias"].cpu())
    parameters = result.get_response()["parameters"]
    assert parameters["posenc_key"] == content_key(inline)
    assert "relative_position_bias_table_key" in parameters["posenc_spec"]
    unknown = {**BEIT, **bias_by_key("f" * 64, table)}
    with pytest.raises(InferenceServerException) as err:
        triton.infer("relative_index", [], parameters=spec_param(unknown))
    assert err.value.status() == "404"
    assert "/v1/uploads" in str(err.value.message())


def test_onnx_relative_index_graph_of_an_uploaded_table(client: httpx.Client) -> None:
    table = random_table(7, 2, seed=55)
    key = upload(client, npy_bytes(table.numpy()), headers=NPY).json()["table_key"]
    named = {**SHAW, **bias_by_key(key, table)}
    r = client.post("/v1/onnx", json={"spec": named, "mode": "compute"})
    assert r.status_code == 200, r.text
    inline = {**SHAW, "relative_position_bias_table": table.tolist()}
    twin = client.post("/v1/onnx", json={"spec": inline, "mode": "compute"})
    assert twin.status_code == 200, twin.text
    assert twin.headers["x-posenc-key"] == r.headers["x-posenc-key"]
    assert twin.content == r.content
    session = ort.InferenceSession(r.content, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["query_positions", "key_positions"]
    queries, keys = np.arange(9, dtype=np.int64), np.arange(9, dtype=np.int64)
    _, bias = session.run(None, {"query_positions": queries, "key_positions": keys})
    want = compute(parse_spec(inline)).tensors["bias"]
    assert torch.equal(torch.from_numpy(bias), want[None])
    again = client.get(r.headers["content-location"])
    assert again.status_code == 200
    assert again.content == r.content
    missing = client.post("/v1/onnx", json={"spec": {**SHAW, **bias_by_key("e" * 64, table)}})
    assert missing.status_code == 404
    assert missing.json()["error_type"] == "unknown_table"
    assert missing.json()["detail"][0]["field"] == "relative_position_bias_table_key"
