"""/v2 protocol surface through tritonclient.http (sync): health, metadata, config, readiness,
errors surfacing as InferenceServerException with our message and status, `id`, auth."""

from __future__ import annotations

import gzip
import json
import zlib

import numpy as np
import orjson
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from posenc.api.oip import MODELS
from posenc.api.oip.models import POSITION_MODELS
from posenc.encodings import FAMILIES
from tests.api.v2client import make_input, outputs, url
from tests.conftest import ServerHandle, start_server

ROPE = {"head_dim": 16, "max_positions": 64}


@pytest.fixture(scope="module")
def triton(server: ServerHandle) -> http.InferenceServerClient:
    return http.InferenceServerClient(url(server))


def positions(n: int = 4) -> http.InferInput:
    return make_input("position_ids", np.arange(n, dtype=np.int64))


def test_every_family_is_a_model() -> None:
    assert sorted(MODELS) == sorted(FAMILIES)
    assert {"rope", "alibi", "sinusoidal", "sinusoidal_2d", "t5_bias"} <= set(POSITION_MODELS)


def test_health(triton: http.InferenceServerClient) -> None:
    assert triton.is_server_live()
    assert triton.is_server_ready()


def test_server_metadata(triton: http.InferenceServerClient) -> None:
    meta = triton.get_server_metadata()
    assert meta["name"] == "posenc"
    assert meta["version"]
    assert sorted(meta["extensions"]) == [
        "binary_tensor_data", "model_configuration", "parameters", "statistics",
    ]  # fmt: skip
    # each announced one answers (binary tensors and parameters: the infer tests)
    assert triton.get_model_config("rope")["name"] == "rope"
    assert "model_stats" in triton.get_inference_statistics("rope")


@pytest.mark.parametrize("model", sorted(MODELS))
def test_model_metadata_ready_config(triton: http.InferenceServerClient, model: str) -> None:
    meta = triton.get_model_metadata(model)
    assert meta["name"] == model
    assert meta["versions"] == ["1"]
    assert meta == triton.get_model_metadata(model, model_version="1")
    for tensor in meta["inputs"] + meta["outputs"]:
        assert tensor["datatype"] in {"INT64", "FP32"}
        assert -1 in tensor["shape"] or tensor["shape"] == [2]
    assert bool(meta["outputs"]) == (model in POSITION_MODELS)
    assert triton.is_model_ready(model)
    assert triton.is_model_ready(model, model_version="1")
    config = triton.get_model_config(model)
    assert config["name"] == model
    assert config["posenc"]["spec_schema"]["title"]
    assert config["posenc"]["limits"]["max_response_bytes"] > 0
    assert [i["name"] for i in config["input"]] == [i["name"] for i in meta["inputs"]]


def test_unknown_model_and_version(triton: http.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as err:
        triton.get_model_metadata("nope")
    assert err.value.status() == "404"
    assert "unknown model 'nope'" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        triton.infer("nope", [positions()])
    assert err.value.status() == "404"
    with pytest.raises(InferenceServerException) as err:
        triton.infer("rope", [positions()], model_version="2", parameters=ROPE)
    assert err.value.status() == "404"
    assert "no version '2'" in err.value.message()
    assert not triton.is_model_ready("nope")


@pytest.mark.parametrize(
    ("parameters", "needle"),
    [
        ({"head_dim": 15, "max_positions": 8}, "rotary"),
        ({"head_dim": 16}, "max_positions"),
        ({"head_dim": 16, "max_positions": 8, "rope_type": "warp"}, "rope_type"),
        # an unknown key close to nothing is named at the top level, as other models name it
        ({"head_dim": 16, "max_positions": 8, "bogus": 1}, "rope spec: bogus: unknown field"),
        # a misspelt top-level field is named there, not as rope_scaling.rope_thetaa
        (
            {"head_dim": 16, "max_positions": 8, "rope_thetaa": 1e4},
            "rope_thetaa: unknown field; did you mean 'rope_theta'?",
        ),
        (
            {"head_dim": 16, "max_positions": 8, "rope_type": "linear", "factr": 2},
            "rope_scaling.factr: unknown field; did you mean 'factor'?",
        ),
        ({"spec": "{not json"}, "not valid JSON"),
        ({"spec": json.dumps({"kind": "alibi", "num_heads": 4})}, "kind"),
        ({**ROPE, "mrope_section": "[1, 2, 3]"}, "mrope_section"),
    ],
)
def test_bad_spec_is_400(
    triton: http.InferenceServerClient, parameters: dict[str, object], needle: str
) -> None:
    with pytest.raises(InferenceServerException) as err:
        triton.infer("rope", [positions()], parameters=parameters)
    assert err.value.status() == "400"
    assert needle in err.value.message()


def test_bad_inputs_are_400(triton: http.InferenceServerClient) -> None:
    cases = [
        ([], "position_ids' is required"),
        ([make_input("position_ids", np.arange(4, dtype=np.float32))], "INT64"),
        ([make_input("position_ids", np.array([-1], dtype=np.int64))], "positions must be"),
        ([positions(), make_input("extra", np.zeros(1, dtype=np.int64))], "no input 'extra'"),
    ]
    for inputs, needle in cases:
        with pytest.raises(InferenceServerException) as err:
            triton.infer("rope", inputs, parameters=ROPE)
        assert err.value.status() == "400"
        assert needle in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        triton.infer("rope", [positions()], outputs=outputs(["nope"], True), parameters=ROPE)
    assert "no output 'nope'" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        triton.infer("rope", [positions()], outputs=outputs(["pairs"], True), parameters=ROPE)
    assert "packing" in err.value.message()


def test_half_precision_outputs_are_binary_only(triton: http.InferenceServerClient) -> None:
    for dtype in ("bfloat16", "float16"):
        params = {**ROPE, "dtype": dtype}
        with pytest.raises(InferenceServerException) as err:
            triton.infer("rope", [positions()], outputs=outputs(["cos"], False), parameters=params)
        assert err.value.status() == "400"
        assert "only as binary" in err.value.message()
        result = triton.infer(
            "rope", [positions()], outputs=outputs(["cos"], True), parameters=params
        )
        assert (
            result.get_output("cos")["datatype"] == {"bfloat16": "BF16", "float16": "FP16"}[dtype]
        )


def test_json_element_limit(server: ServerHandle, triton: http.InferenceServerClient) -> None:
    n = server.settings.json_max_elements // 16 + 1
    big = make_input("position_ids", np.arange(n, dtype=np.int64))
    with pytest.raises(InferenceServerException) as err:
        triton.infer("rope", [big], outputs=outputs(["cos"], False), parameters=ROPE)
    assert "JSON outputs would hold" in err.value.message()
    triton.infer("rope", [big], outputs=outputs(["cos"], True), parameters=ROPE)


def test_response_size_limit(server: ServerHandle, triton: http.InferenceServerClient) -> None:
    """Outputs over `max_response_bytes` are 413 (gRPC RESOURCE_EXHAUSTED), as the OpenAPI
    document and README say and as `/v1` answers a table over the limit (`too_large`): the
    request is well formed, its answer too large. One position fewer fits."""
    huge = {"head_dim": 8192, "max_positions": 64}
    n = server.settings.max_response_bytes // (8192 * 4 * 2) + 1
    ids = make_input("position_ids", np.zeros(n, np.int64))
    with pytest.raises(InferenceServerException) as err:
        triton.infer("rope", [ids], parameters=huge)
    assert err.value.status() == "413"
    assert f"more than the limit of {server.settings.max_response_bytes}" in err.value.message()
    fits = make_input("position_ids", np.zeros(n - 1, np.int64))
    assert triton.infer("rope", [fits], parameters=huge).as_numpy("cos").shape == (n - 1, 8192)
    grpc_client = tgrpc.InferenceServerClient(server.grpc_url)
    try:
        item = tgrpc.InferInput("position_ids", [n], "INT64")
        item.set_data_from_numpy(np.zeros(n, np.int64))
        with pytest.raises(InferenceServerException) as err:
            grpc_client.infer("rope", [item], parameters=huge)
        assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "more than the limit" in str(err.value.message())
    finally:
        grpc_client.close()


def test_decompressed_body_over_the_limit_is_413() -> None:
    """A gzip or deflate body that inflates past `max_infer_body_bytes` is refused as the same
    body sent uncompressed is: 413 (it was a 400). The one under the limit is served."""
    limit = 4096
    request = {"parameters": ROPE, "inputs": [
        {"name": "position_ids", "datatype": "INT64", "shape": [1], "data": [3]}]}  # fmt: skip
    small = orjson.dumps(request)
    padded = small + b" " * (limit + 1 - len(small))
    with start_server(max_infer_body_bytes=limit) as handle, handle.client() as client:
        plain = client.post("/v2/models/rope/infer", content=padded)
        assert plain.status_code == 413, plain.text
        for encoding, compress in (("gzip", gzip.compress), ("deflate", zlib.compress)):
            headers = {"Content-Encoding": encoding}
            ok = client.post("/v2/models/rope/infer", content=compress(small), headers=headers)
            assert ok.status_code == 200, ok.text
            packed = compress(padded)
            assert len(packed) < limit
            r = client.post("/v2/models/rope/infer", content=packed, headers=headers)
            assert r.status_code == 413, r.text
            assert r.json() == {
                "error": f"decompressed request body exceeds the limit of {limit} bytes"
            }


def test_id_echo_and_reserved_parameters(triton: http.InferenceServerClient) -> None:
    result = triton.infer("rope", [positions()], request_id="req-42", parameters=ROPE)
    assert result.get_response()["id"] == "req-42"
    assert "id" not in triton.infer("rope", [positions()], parameters=ROPE).get_response()
    # tritonclient refuses its reserved names itself; the protocol's own keys are not spec fields
    with pytest.raises(InferenceServerException, match="reserved"):
        triton.infer("rope", [positions()], parameters={**ROPE, "timeout": 1})
    result = triton.infer("rope", [positions()], parameters=ROPE, priority=1, timeout=1000)
    assert result.as_numpy("cos").shape == (4, 16)


def test_request_compression(triton: http.InferenceServerClient) -> None:
    for algorithm in ("gzip", "deflate"):
        result = triton.infer(
            "rope", [positions()], parameters=ROPE, request_compression_algorithm=algorithm
        )
        assert result.as_numpy("sin").shape == (4, 16)


def test_raw_http_contract(server: ServerHandle) -> None:
    """No Content-Type, malformed bodies and headers: always `{"error": ...}` 400."""
    with server.client() as client:
        ok = client.post(
            "/v2/models/rope/infer",
            content=orjson.dumps(
                {
                    "parameters": ROPE,
                    "inputs": [
                        {"name": "position_ids", "datatype": "INT32", "shape": [2, 1],
                         "data": [[3], [5]]}
                    ],
                }
            ),
        )  # fmt: skip
        assert ok.status_code == 200, ok.text
        body = ok.json()
        assert ok.headers["content-type"] == "application/json"
        assert [o["shape"] for o in body["outputs"]] == [[2, 1, 16], [2, 1, 16]]
        binary_head = orjson.dumps(
            {
                "inputs": [
                    {"name": "position_ids", "datatype": "INT64", "shape": [1],
                     "parameters": {"binary_data_size": 8}}
                ]
            }
        )  # fmt: skip
        bad = [
            (b"{", {}),
            (b"[]", {}),
            (b'{"inputs": 3}', {}),
            (b'{"inputs": [{"name": "position_ids", "datatype": "INT64", "shape": [2]}]}', {}),
            (
                b'{"inputs": [{"name": "position_ids", "datatype": "INT64", "shape": [2],'
                b' "data": [1.5, 2]}]}',
                {},
            ),
            (binary_head + b"\0" * 4, {"Inference-Header-Content-Length": str(len(binary_head))}),
            (binary_head + b"\0" * 12, {"Inference-Header-Content-Length": str(len(binary_head))}),
            (b'{"inputs": []}xx', {"Inference-Header-Content-Length": "14"}),
            (b'{"inputs": []}', {"Inference-Header-Content-Length": "x"}),
            (gzip.compress(b"{}")[:-4], {"Content-Encoding": "gzip"}),
        ]
        for content, headers in bad:
            response = client.post("/v2/models/rope/infer", content=content, headers=headers)
            assert response.status_code == 400, (content, response.text)
            assert set(response.json()) == {"error"}
        missing = client.post("/v2/models/none/infer", content=b"{}")
        assert missing.status_code == 404
        assert set(missing.json()) == {"error"}


def test_api_keys_guard_model_routes_only() -> None:
    with start_server(api_keys=["sekrit"]) as handle:
        triton = http.InferenceServerClient(url(handle))
        assert triton.is_server_live()
        assert triton.get_server_metadata()["name"] == "posenc"
        with pytest.raises(InferenceServerException) as err:
            triton.get_model_metadata("rope")
        assert err.value.status() == "401"
        with pytest.raises(InferenceServerException) as err:
            triton.infer("rope", [positions()], parameters=ROPE)
        assert err.value.status() == "401"
        assert "Bearer" in err.value.message()
        auth = {"Authorization": "Bearer sekrit"}
        assert triton.get_model_metadata("rope", headers=auth)["name"] == "rope"
        result = triton.infer("rope", [positions()], parameters=ROPE, headers=auth)
        assert result.as_numpy("cos").shape == (4, 16)


def test_model_readiness_follows_the_server() -> None:
    with start_server() as handle:
        triton = http.InferenceServerClient(url(handle))
        assert triton.is_model_ready("rope")
        handle.state.lifecycle.draining = True
        assert not triton.is_model_ready("rope")
        with handle.client() as client:
            response = client.get("/v2/models/rope/ready")
        assert response.status_code == 503
        assert set(response.json()) == {"error"}
        # in-flight work keeps being served while draining, as on /v1
        assert triton.infer("rope", [positions()], parameters=ROPE).as_numpy("cos") is not None
