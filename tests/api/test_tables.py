"""/v1/tables: every format round-trips to `posenc.encodings.compute`, content addressing,
conditional requests, GET by key, row ranges and HTTP Range."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import torch

from posenc.encodings import canonical_json, compute, content_key, parse_spec
from tests.api.wire import decode, safetensors_metadata, table_url_parts
from tests.conftest import ServerHandle

SPECS: dict[str, dict[str, Any]] = {
    "rope_fp32": {"kind": "rope", "head_dim": 64, "max_positions": 300, "rope_theta": 500000.0},
    "rope_bf16": {
        "kind": "rope",
        "head_dim": 128,
        "max_positions": 257,
        "dtype": "bfloat16",
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    "rope_fp16_half": {
        "kind": "rope",
        "head_dim": 32,
        "max_positions": 100,
        "dtype": "float16",
        "profile": "onnx",
    },
    "rope_exact_pairs": {
        "kind": "rope",
        "head_dim": 16,
        "max_positions": 64,
        "precision": "exact",
        "profile": "trtllm",
    },
    "alibi_bias": {"kind": "alibi", "num_heads": 12, "bias": "causal", "key_length": 40},
    "t5_buckets": {"kind": "t5_bias", "query_length": 33, "key_length": 40},
    "sinusoidal": {"kind": "sinusoidal", "dim": 48, "max_positions": 200, "convention": "whisper"},
}
FORMATS = ["safetensors", "npz", "npy", "raw", "json"]


def expected(server: ServerHandle, spec: dict[str, Any]) -> dict[str, torch.Tensor]:
    table = compute(parse_spec(spec), server.device)
    return {name: t.cpu() for name, t in table.tensors.items()}


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert got[name].shape == want[name].shape, name
        assert torch.equal(got[name], want[name]), name


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", sorted(SPECS))
def test_round_trip(server: ServerHandle, client: httpx.Client, case: str, fmt: str) -> None:
    spec = SPECS[case]
    want = expected(server, spec)
    names = list(want)
    numpy_ok = all(t.dtype != torch.bfloat16 for t in want.values())
    if fmt in ("npy", "raw"):
        for name in names:
            r = client.post("/v1/tables", json=spec, params={"format": fmt, "tensor": name})
            if fmt == "npy" and want[name].dtype == torch.bfloat16:
                assert r.status_code == 400
                assert r.json()["error_type"] == "unsupported_dtype"
                continue
            assert r.status_code == 200, r.text
            assert_same(decode(r), {name: want[name]})
        return
    r = client.post("/v1/tables", json=spec, params={"format": fmt})
    if fmt == "npz" and not numpy_ok:
        assert r.status_code == 400
        assert r.json()["error_type"] == "unsupported_dtype"
        return
    assert r.status_code == 200, r.text
    assert_same(decode(r), want)


def test_default_is_safetensors_with_metadata(
    etag_for: Callable[[str], str], client: httpx.Client
) -> None:
    spec = SPECS["rope_bf16"]
    r = client.post("/v1/tables", json=spec)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/vnd.safetensors"
    canon = parse_spec(spec).canonical()
    key = content_key(canon)
    assert r.headers["etag"] == etag_for(key)
    assert r.headers["x-posenc-key"] == key
    assert table_url_parts(r.headers["content-location"]) == (
        key,
        json.loads(canonical_json(canon)),
    )
    assert r.headers["x-posenc-device"] in ("cpu", "cuda:0")
    meta = safetensors_metadata(r.content)
    assert meta["key"] == key
    assert meta["kind"] == "rope"
    assert meta["spec"] == canonical_json(canon)
    assert '"attention_scaling"' in meta["meta"]
    assert decode(r)["cos"].dtype == torch.bfloat16


def test_json_carries_spec_and_facts(client: httpx.Client) -> None:
    spec = {
        "kind": "rope",
        "head_dim": 16,
        "max_positions": 8,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4},
    }
    body = client.post("/v1/tables", json=spec, params={"format": "json"}).json()
    assert body["key"] == content_key(parse_spec(spec))
    assert body["spec"]["rope_scaling"]["rope_type"] == "yarn"
    assert body["meta"]["attention_scaling"] > 1.0
    assert body["tensors"]["cos"]["shape"] == [8, 16]


@pytest.mark.parametrize(
    ("accept", "expected_type"),
    [
        ("application/x-npy", None),
        ("application/json", "application/json"),
        ("application/x-npz", "application/x-npz"),
        ("application/vnd.safetensors", "application/vnd.safetensors"),
        ("*/*", "application/vnd.safetensors"),
        ("text/html, application/json;q=0.5, application/x-npz;q=0.9", "application/x-npz"),
        ("application/json;q=0, application/x-npz", "application/x-npz"),
    ],
)
def test_accept_negotiation(client: httpx.Client, accept: str, expected_type: str | None) -> None:
    r = client.post("/v1/tables", json=SPECS["rope_fp32"], headers={"Accept": accept})
    if expected_type is None:  # npy needs tensor=NAME
        assert r.status_code == 400
        assert r.json()["error_type"] == "tensor_required"
        return
    assert r.status_code == 200
    assert r.headers["content-type"] == expected_type
    assert r.headers["vary"] == "Accept"


def test_format_parameter_beats_accept_and_unknown_accept_is_406(client: httpx.Client) -> None:
    r = client.post(
        "/v1/tables", json=SPECS["rope_fp32"], params={"format": "npz"}, headers={"Accept": "x/y"}
    )
    assert r.headers["content-type"] == "application/x-npz"
    r = client.post("/v1/tables", json=SPECS["rope_fp32"], headers={"Accept": "text/html"})
    assert r.status_code == 406
    assert r.json()["error_type"] == "not_acceptable"


def test_get_by_key_etag_and_304(etag_for: Callable[[str], str], client: httpx.Client) -> None:
    spec = {"kind": "rope", "head_dim": 32, "max_positions": 77}
    posted = client.post("/v1/tables", json=spec)
    key = posted.headers["x-posenc-key"]
    got = client.get(posted.headers["content-location"])
    assert got.status_code == 200
    assert got.content == posted.content
    assert got.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert got.headers["etag"] == etag_for(key)
    assert got.headers["x-posenc-cache"] == "hit"
    for tag in (etag_for(key), "W/" + etag_for(key), f'"other", {etag_for(key)}', "*"):
        r = client.get(f"/v1/tables/{key}", headers={"If-None-Match": tag})
        assert r.status_code == 304, tag
        assert r.content == b""
        assert r.headers["etag"] == etag_for(key)
    r = client.get(f"/v1/tables/{key}", headers={"If-None-Match": '"nope"'})
    assert r.status_code == 200


def test_unknown_key_is_404(client: httpx.Client) -> None:
    for key in ("0" * 64, "not-a-key"):
        r = client.get(f"/v1/tables/{key}")
        assert r.status_code == 404
        assert r.json()["error_type"] == "unknown_key"


def test_preset_keys_are_known_without_posting(client: httpx.Client) -> None:
    part = client.get("/v1/presets/falcon-7b").json()["parts"][0]
    r = client.get(part["url"], params={"format": "raw", "tensor": "inv_freq"})
    assert r.status_code == 200
    assert decode(r)["inv_freq"].shape == (32,)


def test_rows_slice_every_format(server: ServerHandle, client: httpx.Client) -> None:
    spec = SPECS["rope_fp32"]
    want = expected(server, spec)
    key = client.post("/v1/tables", json=spec).headers["x-posenc-key"]
    for fmt in ("safetensors", "npz", "json"):
        r = client.get(f"/v1/tables/{key}", params={"format": fmt, "rows": "10:20"})
        assert r.status_code == 200, r.text
        got = decode(r)
        assert torch.equal(got["cos"], want["cos"][10:20])
        assert torch.equal(got["sin"], want["sin"][10:20])
        assert torch.equal(got["inv_freq"], want["inv_freq"])  # no position axis: whole
    r = client.get(f"/v1/tables/{key}", params={"format": "raw", "tensor": "sin", "rows": "299:"})
    assert r.headers["x-posenc-shape"] == "1,64"
    assert torch.equal(decode(r)["sin"], want["sin"][299:])
    meta = safetensors_metadata(client.get(f"/v1/tables/{key}", params={"rows": ":5"}).content)
    assert '"rows":[0,5]' in meta["meta"]


def test_rows_on_the_query_axis_of_biases(server: ServerHandle, client: httpx.Client) -> None:
    spec = SPECS["alibi_bias"]
    want = expected(server, spec)
    r = client.post("/v1/tables", json=spec, params={"format": "npz", "rows": "5:9"})
    got = decode(r)
    assert torch.equal(got["bias"], want["bias"][:, 5:9])
    assert torch.equal(got["slopes"], want["slopes"])


T5_WITH_BIAS = {
    "kind": "t5_bias",
    "query_length": 12,
    "key_length": 7,
    "num_buckets": 4,
    "relative_attention_bias": [[0.5, -1.0], [0.25, 2.0], [1.5, 0.0], [-0.75, 1.0]],
}
SHAW = {
    "kind": "relative_index",
    "scheme": "shaw",
    "max_relative_position": 3,
    "query_length": 12,
    "key_length": 9,
}
MAE = {"kind": "sinusoidal_2d", "style": "mae", "dim": 8, "grid_height": 4, "grid_width": 3}
ROW_AXIS_CASES: list[tuple[dict[str, Any], str, int | None]] = [
    ({"kind": "rope", "head_dim": 8, "max_positions": 12, "profile": "vllm"}, "cos_sin", 0),
    ({"kind": "rope", "head_dim": 8, "max_positions": 12, "profile": "trtllm"}, "pairs", 0),
    (T5_WITH_BIAS, "buckets", 0),
    (T5_WITH_BIAS, "bias", 1),
    ({"kind": "xpos", "head_dim": 8, "max_positions": 12}, "sin_k", 0),
    ({"kind": "normalized", "mode": "by_length", "max_positions": 12}, "embedding", 0),
    ({"kind": "normalized", "mode": "by_length", "lengths": [12, 5]}, "embedding", 1),
    (SHAW, "index", 0),
    (MAE, "embedding", None),
]


@pytest.mark.parametrize(("spec", "tensor", "axis"), ROW_AXIS_CASES)
def test_rows_slice_the_row_axis_the_family_declares(
    server: ServerHandle, client: httpx.Client, spec: dict[str, Any], tensor: str, axis: int | None
) -> None:
    assert parse_spec(spec).canonical().outputs()[tensor].row_axis == axis
    r = client.post("/v1/tables", json=spec, params={"tensor": tensor, "rows": "3:8"})
    if axis is None:
        assert r.status_code == 400
        assert r.json()["error_type"] == "rows_unsupported"
        return
    assert r.status_code == 200, r.text
    want = expected(server, spec)[tensor].narrow(axis, 3, 5)
    assert torch.equal(decode(r)[tensor], want)


@pytest.mark.parametrize(
    ("rows", "tensor", "error_type"),
    [
        ("5", None, "invalid_rows"),
        ("a:b", None, "invalid_rows"),
        ("-1:4", None, "invalid_rows"),
        ("10:5", None, "invalid_rows"),
        ("0:301", None, "invalid_rows"),
        ("300:300", None, "invalid_rows"),
        ("0:4", "inv_freq", "rows_unsupported"),
    ],
)
def test_bad_rows(client: httpx.Client, rows: str, tensor: str | None, error_type: str) -> None:
    params = {"rows": rows} | ({"tensor": tensor} if tensor else {})
    r = client.post("/v1/tables", json=SPECS["rope_fp32"], params=params)
    assert r.status_code == 400
    assert r.json()["error_type"] == error_type


def test_http_range_on_raw(
    etag_for: Callable[[str], str], server: ServerHandle, client: httpx.Client
) -> None:
    spec = SPECS["rope_fp32"]
    key = client.post("/v1/tables", json=spec).headers["x-posenc-key"]
    url = f"/v1/tables/{key}?format=raw&tensor=cos"
    full = client.get(url)
    assert full.headers["accept-ranges"] == "bytes"
    size = len(full.content)
    assert size == 300 * 64 * 4
    cases = {
        "bytes=0-255": (0, 255),
        "bytes=1000-": (1000, size - 1),
        "bytes=-100": (size - 100, size - 1),
        f"bytes=76000-{size * 2}": (76000, size - 1),
    }
    for header, (first, last) in cases.items():
        r = client.get(url, headers={"Range": header})
        assert r.status_code == 206, header
        assert r.headers["content-range"] == f"bytes {first}-{last}/{size}"
        assert r.content == full.content[first : last + 1]
    # row 7 exactly, as bytes
    row = 64 * 4
    r = client.get(url, headers={"Range": f"bytes={7 * row}-{8 * row - 1}"})
    assert torch.equal(
        torch.frombuffer(bytearray(r.content), dtype=torch.float32),
        expected(server, spec)["cos"][7],
    )
    r = client.get(url, headers={"Range": f"bytes={size}-"})
    assert r.status_code == 416
    assert r.headers["content-range"] == f"bytes */{size}"
    assert r.json()["error_type"] == "range_not_satisfiable"
    for ignored in ("bytes=0-1,5-9", "items=0-4", "bytes=abc"):
        r = client.get(url, headers={"Range": ignored})
        assert r.status_code == 200
        assert len(r.content) == size
    # If-Range compares strongly with this representation's ETag, not the default one's
    assert full.headers["etag"] == etag_for(f"{key}.raw.cos")
    for other in ('"stale"', etag_for(key), f'W/"{key}.raw.cos"'):
        r = client.get(url, headers={"Range": "bytes=0-3", "If-Range": other})
        assert r.status_code == 200, other
    r = client.get(url, headers={"Range": "bytes=0-3", "If-Range": full.headers["etag"]})
    assert r.status_code == 206


def test_tensor_selection(client: httpx.Client) -> None:
    r = client.post("/v1/tables", json=SPECS["rope_fp32"], params={"tensor": "sin"})
    assert set(decode(r)) == {"sin"}
    r = client.post("/v1/tables", json=SPECS["rope_fp32"], params={"tensor": "tan"})
    assert r.status_code == 400
    assert r.json()["error_type"] == "unknown_tensor"
    assert r.json()["detail"][0]["field"] == "tensor"


def test_hf_config_body(client: httpx.Client) -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "max_position_embeddings": 1024,
        "rope_theta": 10000.0,
    }
    r = client.post("/v1/tables", json={"hf_config": config, "max_positions": 16})
    assert r.status_code == 200, r.text
    spec = {"kind": "rope", "head_dim": 64, "max_positions": 16}
    assert r.headers["x-posenc-key"] == content_key(parse_spec(spec))


def test_hf_config_with_several_tables_needs_layer_type(client: httpx.Client) -> None:
    config = {
        "model_type": "t5",
        "d_model": 64,
        "num_heads": 4,
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
    }
    body = {"hf_config": config, "key_length": 16}
    r = client.post("/v1/tables", json=body)
    assert r.status_code == 400
    assert r.json()["error_type"] == "ambiguous_config"
    assert r.json()["detail"][0]["field"] == "layer_type"
    assert "encoder" in r.json()["error"]
    r = client.post("/v1/tables", json=body | {"layer_type": "decoder"})
    assert r.status_code == 200, r.text
    assert r.headers["x-posenc-kind"] == "t5_bias"


def test_device_cpu_asks_for_the_reference_bytes(
    server: ServerHandle, client: httpx.Client
) -> None:
    """`?device=cpu` (what `posenc-client verify` sends): the table computed on the CPU whatever
    the server's device, bit for bit the CPU reference, on POST and on the table's URL; another
    value is 400 `invalid_device` naming the field. (On a GPU server the default answer is
    the GPU's table, `@cuda:0` in its ETag; tests/runtime/test_cache.py holds the cache's
    separate CPU entry, the GPU run of docs/gpu.md the route.)"""
    spec = {"kind": "rope", "head_dim": 32, "max_positions": 96, "rope_theta": 123456.0}
    want = compute(parse_spec(spec), torch.device("cpu")).tensors
    answer = client.post("/v1/tables", json=spec, params={"device": "cpu"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-posenc-device"] == "cpu"
    assert "@" not in answer.headers["etag"]
    got = decode(answer)
    assert all(torch.equal(got[name], want[name]) for name in want)
    url = answer.headers["content-location"]
    again = client.get(url, params={"device": "cpu", "format": "npy", "tensor": "cos"})
    assert again.status_code == 200
    assert again.headers["x-posenc-device"] == "cpu"
    default = client.post("/v1/tables", json=spec)
    assert default.headers["x-posenc-device"] == str(server.device)
    for bad in ("cuda", "gpu", "x" * 500):
        refused = client.post("/v1/tables", json=spec, params={"device": bad})
        assert refused.status_code == 400, refused.text
        body = refused.json()
        assert body["error_type"] == "invalid_device"
        assert body["detail"][0]["field"] == "device"
        assert len(refused.content) < 400  # the value is not echoed whole
