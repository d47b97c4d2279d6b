"""/v1/onnx on a real server: models built, verified, cached and served like tables (content
keys, ETag, immutable GET, 304), equal to the core when run, mergeable; errors per the contract."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from posenc.encodings import compute, content_key, parse_spec
from posenc.onnx import IR_VERSIONS, ExportError, ExportOptions, metadata, ort_run, ort_session
from posenc.onnx import resolve as resolve_export
from tests.conftest import ServerHandle
from tests.tolerances import ATOL

ROPE = {"kind": "rope", "head_dim": 32, "max_positions": 64, "rope_theta": 500000.0}


def post(client: httpx.Client, body: dict[str, Any]) -> httpx.Response:
    return client.post("/v1/onnx", json=body)


def model_of(response: httpx.Response) -> onnx.ModelProto:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    return onnx.load_from_string(response.content)


def test_post_serves_a_verified_model_equal_to_the_core(client: httpx.Client) -> None:
    r = post(client, {"spec": ROPE, "graph": "cos_sin", "mode": "compute", "opset": 18})
    model = model_of(r)
    spec = parse_spec(ROPE)
    request = resolve_export(spec, ExportOptions(graph="cos_sin", mode="compute", opset=18))
    key = request.key
    assert r.headers["x-posenc-key"] == key == metadata(model)["export_key"]
    assert r.headers["etag"] == f'"{key}"'
    assert r.headers["content-location"] == f"/v1/onnx/{key}"
    assert r.headers["x-posenc-spec-key"] == content_key(request.spec)
    assert r.headers["x-posenc-graph"] == "rope/cos_sin"
    assert model.ir_version == IR_VERSIONS[18]
    out = ort_run(ort_session(model), {"position_ids": torch.arange(64)[None]})
    table = compute(spec).tensors
    assert (out["cos"][0] - table["cos"]).abs().max() <= ATOL["float32"]


def test_get_by_key_is_immutable_and_conditional(client: httpx.Client) -> None:
    body = {"spec": {**ROPE, "dtype": "float16"}, "graph": "rotary", "op": "contrib"}
    first = post(client, body)
    again = post(client, body)
    assert again.headers["x-posenc-cache"] == "hit"
    assert again.content == first.content
    location = first.headers["content-location"]
    got = client.get(location)
    assert got.status_code == 200
    assert got.content == first.content
    assert got.headers["cache-control"] == "public, max-age=31536000, immutable"
    not_modified = client.get(location, headers={"If-None-Match": first.headers["etag"]})
    assert not_modified.status_code == 304
    assert not_modified.content == b""


def test_defaults_spelled_out_share_the_key(client: httpx.Client) -> None:
    alibi = {"kind": "alibi", "num_heads": 8, "bias": "symmetric", "key_length": 16}
    plain = post(client, {"spec": alibi})
    spelled = post(client, {"spec": alibi, "graph": "bias", "opset": 17, "inputs": "positions"})
    assert plain.headers["x-posenc-key"] == spelled.headers["x-posenc-key"]
    assert [i.name for i in model_of(plain).graph.input] == ["query_positions", "key_positions"]


def test_hf_config_body(client: httpx.Client) -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "max_position_embeddings": 128,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    }
    r = post(client, {"hf_config": config, "graph": "rotary", "num_heads": 4, "opset": 23})
    model = model_of(r)
    assert metadata(model)["graph"] == "rope/rotary"
    x = torch.randn(1, 3, 256, generator=torch.Generator().manual_seed(0))
    y = ort_run(ort_session(model), {"x": x, "position_ids": torch.tensor([[0, 64, 127]])})["y"]
    assert y.shape == x.shape


def test_served_subgraph_merges_into_a_consumer(client: httpx.Client) -> None:
    spec = {"kind": "alibi", "num_heads": 4, "bias": "causal", "key_length": 8, "query_offset": 5}
    served = model_of(post(client, {"spec": spec, "opset": 23, "inputs": "lengths"}))
    t = TensorProto.FLOAT
    consumer = helper.make_model(
        helper.make_graph(
            [helper.make_node("Attention", ["q", "k", "v", "attn_mask"], ["out"])],
            "attend",
            [
                helper.make_tensor_value_info("q", t, ["B", 4, "Q", 8]),
                helper.make_tensor_value_info("k", t, ["B", 4, "K", 8]),
                helper.make_tensor_value_info("v", t, ["B", 4, "K", 8]),
                helper.make_tensor_value_info("attn_mask", t, [1, 4, "Q", "K"]),
            ],
            [helper.make_tensor_value_info("out", t, ["B", 4, "Q", 8])],
        ),
        opset_imports=[helper.make_opsetid("", 23)],
        ir_version=IR_VERSIONS[23],
    )
    merged = onnx.compose.merge_models(served, consumer, io_map=[("bias", "attn_mask")])
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 4, n, 8, generator=gen) for n in (3, 8, 8))
    feeds = {
        "past_length": torch.tensor(5),
        "query_length": torch.tensor(3),
        "q": q,
        "k": k,
        "v": v,
    }
    out = ort_run(ort_session(merged), feeds)["out"]
    bias = compute(parse_spec(spec)).tensors["bias"][None]
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    assert (out - want).abs().max() <= 8 * ATOL["float32"]


def test_listing_names_every_graph(client: httpx.Client) -> None:
    r = client.get("/v1/onnx")
    assert r.status_code == 200
    graphs = {(g["kind"], g["graph"]) for g in r.json()["graphs"]}
    assert ("rope", "rotary") in graphs
    assert ("t5_bias", "bias") in graphs
    assert r.json()["opsets"] == list(range(17, 24))


@pytest.mark.parametrize(
    ("body", "status", "error_type", "field"),
    [
        ({"spec": ROPE, "opset": 30}, 422, "invalid_spec", "opset"),
        ({"spec": ROPE, "graph": "bias"}, 422, "unsupported_export", "graph"),
        ({"spec": {"kind": "alibi", "num_heads": 4}}, 422, "unsupported_export", "bias"),
        ({"spec": ROPE, "graph": "rotary", "op": "onnx"}, 422, "unsupported_export", "opset"),
        ({"spec": {**ROPE, "head_dim": -1}}, 422, "invalid_spec", "head_dim"),
        ({"graph": "cos_sin"}, 422, "invalid_spec", "spec"),
        ({"spec": ROPE, "extra": 1}, 422, "invalid_spec", "extra"),
    ],
)
def test_bad_requests_follow_the_error_contract(
    client: httpx.Client, body: dict[str, Any], status: int, error_type: str, field: str
) -> None:
    r = post(client, body)
    assert r.status_code == status, r.text
    payload = r.json()
    assert payload["error_type"] == error_type
    assert field in [p["field"] for p in payload["detail"]]


def test_malformed_body_and_unknown_key(client: httpx.Client) -> None:
    r = client.post("/v1/onnx", content=b'{"spec": ')
    assert r.status_code == 400
    assert r.json()["error_type"] == "invalid_json"
    r = client.get("/v1/onnx/" + "0" * 64)
    assert r.status_code == 404
    assert r.json()["error_type"] == "unknown_key"


def test_a_graph_failing_verification_is_a_500_export_error(
    client: httpx.Client, server: ServerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(model: onnx.ModelProto, spec: Any) -> None:
        raise ExportError("graph output differs from the torch table", {"max_abs_error": 1.0})

    monkeypatch.setattr("posenc.onnx.verify", broken)  # read by the route at call time
    r = post(client, {"spec": {**ROPE, "max_positions": 33}, "graph": "cos_sin"})
    assert r.status_code == 500
    assert r.json()["error_type"] == "export"
    assert r.json()["detail"] == {"max_abs_error": 1.0}


def test_the_onnx_stack_is_imported_on_first_use_only() -> None:
    # start-up must not pay for onnx_ir/onnxscript/onnxruntime (docs/benchmarks.md, startup)
    code = (
        "import sys; from posenc.api import create_app; create_app(); "
        "print(sorted(m for m in ('posenc.onnx', 'onnx_ir', 'onnxscript', 'onnxruntime', "
        "'onnx') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
