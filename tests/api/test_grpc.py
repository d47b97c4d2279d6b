"""The Open Inference Protocol over gRPC (`posenc serve --grpc-port`) through tritonclient.grpc,
sync and aio, against what tritonclient.http gets from the same server: for every model the same
outputs (names, datatypes, shapes, bytes) and response parameters; health and metadata; errors as
status codes with the HTTP messages; API keys in `authorization` metadata; the body limit; the
stream; metrics; and the SIGTERM drain."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as tgrpc
import tritonclient.grpc.aio as tgrpc_aio
import tritonclient.http as http
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from posenc.api.oip import EXTENSIONS, MODELS
from posenc.encodings import SpecBase, Table, compute
from tests.api.v2client import NP_DATATYPES, url
from tests.conftest import ServerHandle, start_server, start_server_process
from tests.waiting import Gate, wait_for

W = (np.arange(64, dtype=np.float32).reshape(32, 2) / 64).astype(np.float32)
Q, K = np.array([3, 9], np.int64), np.array([0, 4, 9], np.int64)
BIAS_TABLE = (np.arange(38 * 4, dtype=np.float32).reshape(38, 4) / 7).astype(np.float32)


def _spec(spec: dict[str, Any]) -> dict[str, Any]:
    return {"spec": json.dumps(spec)}


Inputs = list[tuple[str, np.ndarray[Any, Any]]]
# case id -> (model, parameters, inputs, requested outputs or None for the model's defaults)
CASES: dict[str, tuple[str, dict[str, Any], Inputs, list[str] | None]] = {
    "rope": (
        "rope",
        {"head_dim": 32, "max_positions": 64, "rope_theta": 5000.0},
        [("position_ids", np.array([[1, 63], [2, 0]], np.int64))],
        None,
    ),
    "rope-bf16": (
        "rope",
        {"head_dim": 64, "max_positions": 4096, "dtype": "bfloat16", "width": "half"},
        [("position_ids", np.array([7, 4095], np.int64))],
        ["cos", "sin", "inv_freq"],
    ),
    "rope-mrope": (
        "rope",
        {"head_dim": 32, "max_positions": 64, "mrope_section": "[4, 6, 6]"},
        [("position_ids", np.array([[0, 5], [1, 6], [2, 7]], np.int32))],
        ["cos"],
    ),
    "alibi": (
        "alibi",
        {"num_heads": 4, "bias": "symmetric", "query_length": 10, "key_length": 10},
        [("query_positions", Q), ("key_positions", K)],
        ["bias", "slopes"],
    ),
    "sinusoidal": (
        "sinusoidal",
        {"dim": 16, "max_positions": 32},
        [("position_ids", np.array([31, 0, 5], np.int64))],
        None,
    ),
    "sinusoidal_2d": (
        "sinusoidal_2d",
        {"style": "timm", "dim": 16},
        [("grid", np.array([3, 5], np.int32))],
        None,
    ),
    "vision_rope": (
        "vision_rope",
        {"style": "pixtral", "head_dim": 16},
        [("grid", np.array([3, 5], np.int64))],
        None,
    ),
    "t5_bias": (
        "t5_bias",
        {"query_length": 10, "key_length": 10},
        [("query_positions", Q), ("key_positions", K), ("relative_attention_bias", W)],
        ["buckets", "bias"],
    ),
    "xpos": (
        "xpos",
        {"head_dim": 64, "max_positions": 128, "position_offset": 16},
        [("position_ids", np.array([0, 100, 127], np.int64))],
        None,
    ),
    "learned": (
        "learned",
        _spec(
            {
                "method": "linear_1d",
                "new_length": 7,
                "table": (np.arange(10, dtype=np.float32).reshape(5, 2) / 3).tolist(),
            }
        ),
        [],
        None,
    ),
    "normalized": ("normalized", _spec({"mode": "by_last", "lengths": [3, 5]}), [], None),
    "relative_index": (
        "relative_index",
        {},  # the uploaded table's key is added by the fixture
        [],
        None,
    ),
}


def test_cases_cover_every_model() -> None:
    assert {model for model, *_ in CASES.values()} == set(MODELS)


@pytest.fixture(scope="module")
def bias_table_key(server: ServerHandle) -> str:
    """The key of BIAS_TABLE uploaded to the session server (relative_index reads it from the
    server's table store, whichever protocol asks)."""
    buf = io.BytesIO()
    np.save(buf, BIAS_TABLE)
    with server.client() as client:
        response = client.post("/v1/uploads", content=buf.getvalue())
        assert response.status_code in (200, 201), response.text
        key: str = response.json()["table_key"]
        return key


def _parameters(case: str, key: str) -> dict[str, Any]:
    model, params, _, _ = CASES[case]
    if model == "relative_index":
        return _spec(
            {
                "scheme": "beit",
                "window_size": [4, 3],
                "relative_position_bias_table_key": key,
                "relative_position_bias_table_shape": [38, 4],
            }
        )
    return params


@pytest.fixture(scope="module")
def triton_http(server: ServerHandle) -> Iterator[http.InferenceServerClient]:
    client = http.InferenceServerClient(url(server), network_timeout=120)
    yield client
    client.close()


@pytest.fixture(scope="module")
def triton_grpc(server: ServerHandle) -> Iterator[tgrpc.InferenceServerClient]:
    client = tgrpc.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


Answer = tuple[str, str, dict[str, Any], list[tuple[str, str, list[int], bytes]]]
"""(model name, model version, response parameters, [(output, datatype, shape, bytes)])."""


def _grpc_inputs(inputs: Inputs) -> list[tgrpc.InferInput]:
    items = []
    for name, array in inputs:
        item = tgrpc.InferInput(name, list(array.shape), NP_DATATYPES[array.dtype])
        item.set_data_from_numpy(array)
        items.append(item)
    return items


def _http_inputs(inputs: Inputs) -> list[http.InferInput]:
    items = []
    for name, array in inputs:
        item = http.InferInput(name, list(array.shape), NP_DATATYPES[array.dtype])
        item.set_data_from_numpy(array, binary_data=True)
        items.append(item)
    return items


def _bytes(array: np.ndarray[Any, Any] | None) -> bytes:
    assert array is not None
    return np.ascontiguousarray(array).tobytes()


def _http_answer(result: http.InferResult) -> Answer:
    response = result.get_response()
    outputs = [
        (o["name"], o["datatype"], o["shape"], _bytes(result.as_numpy(o["name"])))
        for o in response["outputs"]
    ]
    return response["model_name"], response["model_version"], response["parameters"], outputs


def _grpc_params(parameters: Any) -> dict[str, Any]:
    return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in parameters.items()}


def _grpc_answer(result: tgrpc.InferResult) -> Answer:
    response = result.get_response()
    outputs = [
        (o.name, o.datatype, list(o.shape), bytes(response.raw_output_contents[i]))
        for i, o in enumerate(response.outputs)
    ]
    return response.model_name, response.model_version, _grpc_params(response.parameters), outputs


def _without_source(answer: Answer) -> Answer:
    """The answer without `posenc_source` (the first call of a table says miss, a later hit)."""
    name, version, params, outputs = answer
    return name, version, {k: v for k, v in params.items() if k != "posenc_source"}, outputs


@pytest.mark.parametrize("case", sorted(CASES))
def test_grpc_answers_what_http_answers(
    triton_http: http.InferenceServerClient,
    triton_grpc: tgrpc.InferenceServerClient,
    bias_table_key: str,
    case: str,
) -> None:
    model, _, inputs, names = CASES[case]
    params = _parameters(case, bias_table_key)
    http_result = triton_http.infer(
        model,
        _http_inputs(inputs),
        outputs=None if names is None else [http.InferRequestedOutput(n) for n in names],
        parameters=params,
    )
    grpc_result = triton_grpc.infer(
        model,
        _grpc_inputs(inputs),
        outputs=None if names is None else [tgrpc.InferRequestedOutput(n) for n in names],
        parameters=params,
    )
    got_http, got_grpc = _http_answer(http_result), _grpc_answer(grpc_result)
    assert got_grpc[3], "no outputs"
    assert _without_source(got_grpc) == _without_source(got_http)
    # and the arrays each client hands its caller are equal (BF16 as ml_dtypes.bfloat16)
    for name, datatype, _, _ in got_grpc[3]:
        got, want = grpc_result.as_numpy(name), http_result.as_numpy(name)
        assert got.dtype == want.dtype, (name, datatype)
        np.testing.assert_array_equal(got, want)


def test_request_id_and_version_echoed(triton_grpc: tgrpc.InferenceServerClient) -> None:
    model, params, inputs, _ = CASES["sinusoidal"]
    triton_grpc.infer(model, _grpc_inputs(inputs), parameters=params)  # the table is cached now
    result = triton_grpc.infer(
        model, _grpc_inputs(inputs), model_version="1", request_id="step-7", parameters=params
    )
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("step-7", model, "1")
    assert _grpc_params(response.parameters)["posenc_source"] == "hit"


def test_typed_contents_equal_raw_bytes(server: ServerHandle) -> None:
    """A client that sends positions in `contents.int64_contents` (stubs generated from the
    .proto, as C++/Go clients do) gets the rows tritonclient gets from raw bytes."""
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    positions = [31, 0, 5]
    request = service_pb2.ModelInferRequest(model_name="sinusoidal")
    request.parameters["dim"].int64_param = 16
    request.parameters["max_positions"].int64_param = 32
    item = request.inputs.add(name="position_ids", datatype="INT64", shape=[3])
    item.contents.int64_contents.extend(positions)
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        typed = stub.ModelInfer(request)
        del request.inputs[0].contents.int64_contents[:]
        request.inputs[0].ClearField("contents")
        request.raw_input_contents.append(np.array(positions, np.int64).tobytes())
        raw = stub.ModelInfer(request)
    assert typed.raw_output_contents == raw.raw_output_contents
    assert len(typed.raw_output_contents[0]) == 3 * 16 * 4


def test_health_and_metadata_match_http(
    triton_http: http.InferenceServerClient, triton_grpc: tgrpc.InferenceServerClient
) -> None:
    assert triton_grpc.is_server_live() is True
    assert triton_grpc.is_server_ready() is True
    meta = triton_grpc.get_server_metadata(as_json=True)
    http_meta = triton_http.get_server_metadata()
    assert meta["name"] == http_meta["name"] == "posenc"
    assert meta["version"] == http_meta["version"]
    assert meta["extensions"] == http_meta["extensions"] == list(EXTENSIONS)
    for model in sorted(MODELS):
        assert triton_grpc.is_model_ready(model) is triton_http.is_model_ready(model) is True
        got = triton_grpc.get_model_metadata(model, as_json=True)
        want = triton_http.get_model_metadata(model)
        # protobuf's JSON spells int64 as strings and leaves out empty lists
        for tensors in ("inputs", "outputs"):
            for t in got.get(tensors, []):
                t["shape"] = [int(d) for d in t["shape"]]
            got.setdefault(tensors, [])
        assert got == want
        assert triton_grpc.get_model_metadata(model, "1").name == model
    for model, version in (("nope", ""), ("rope", "2")):
        assert triton_grpc.is_model_ready(model, version) is False
        assert triton_http.is_model_ready(model, version) is False


def test_model_ready_of_an_unknown_model_is_false_as_triton_answers(server: ServerHandle) -> None:
    """An unknown model or version is "not ready", the answer the protocol gives it, not an
    error: gRPC ModelReady is OK with `ready: false` (Triton core's `ModelIsReady` sets false and
    returns success for a model it cannot find; tritonclient.grpc's `is_model_ready` would raise
    on NOT_FOUND instead of saying False), HTTP `/ready` is a 4xx (KServe: "a 4xx status code
    indicating false"; posenc's 404 carries the message ModelMetadata's NOT_FOUND carries)."""
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    with grpc.insecure_channel(server.grpc_url) as channel, server.client() as client:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for name, version in (("nope", ""), ("rope", "2"), ("rope", "1"), ("rope", "")):
            known = name == "rope" and version in ("", "1")
            answer, call = stub.ModelReady.with_call(
                service_pb2.ModelReadyRequest(name=name, version=version)
            )
            assert call.code() == grpc.StatusCode.OK
            assert answer.ready is known
            path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/ready"
            ready = client.get(path)
            assert ready.status_code == (200 if known else 404), ready.text
            if known:
                continue
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=name, version=version))
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
            assert ready.json() == {"error": info.value.details()}


def _http_error(call: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.status()), str(info.value.message())


def _grpc_error(call: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.status()), str(info.value.message())


HTTP_TO_GRPC = {
    "400": "StatusCode.INVALID_ARGUMENT",
    "404": "StatusCode.NOT_FOUND",
    "413": "StatusCode.RESOURCE_EXHAUSTED",
}

ERRORS: dict[str, tuple[str, str, dict[str, Any], Inputs, list[str] | None]] = {
    "unknown model": ("nope", "", {}, [], None),
    "unknown version": ("rope", "3", {"head_dim": 8}, [], None),
    "missing input": ("rope", "", {"head_dim": 8}, [], None),
    "bad spec value": ("rope", "", {"head_dim": -4}, [("position_ids", np.array([0]))], None),
    "unknown spec field": ("sinusoidal", "", {"dimm": 8}, [("position_ids", np.array([0]))], None),
    "spec not JSON": ("rope", "", {"spec": "{head_dim"}, [("position_ids", np.array([0]))], None),
    "negative position": (
        "rope",
        "",
        {"head_dim": 8, "max_positions": 4},
        [("position_ids", np.array([-1]))],
        None,
    ),
    "wrong input datatype": (
        "rope",
        "",
        {"head_dim": 8},
        [("position_ids", np.array([0.5], np.float32))],
        None,
    ),
    "unknown input": (
        "sinusoidal",
        "",
        {"dim": 8},
        [("position_ids", np.array([0])), ("extra", np.array([1]))],
        None,
    ),
    "unknown output": ("sinusoidal", "", {"dim": 8}, [("position_ids", np.array([0]))], ["nope"]),
    "over max_response_bytes": (
        "rope",
        "",
        {"head_dim": 4096, "max_positions": 1 << 20},
        [("position_ids", np.arange(20000, dtype=np.int64))],
        None,
    ),
    "unknown weight table": (
        "relative_index",
        "",
        _spec(
            {
                "scheme": "beit",
                "window_size": [4, 3],
                "relative_position_bias_table_key": "d" * 64,
                "relative_position_bias_table_shape": [38, 4],
            }
        ),
        [],
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_errors_are_status_codes_with_the_http_messages(
    triton_http: http.InferenceServerClient,
    triton_grpc: tgrpc.InferenceServerClient,
    case: str,
) -> None:
    model, version, params, inputs, names = ERRORS[case]
    http_status, http_message = _http_error(
        lambda: triton_http.infer(
            model,
            _http_inputs(inputs),
            model_version=version,
            outputs=None if names is None else [http.InferRequestedOutput(n) for n in names],
            parameters=params,
        )
    )
    grpc_status, grpc_message = _grpc_error(
        lambda: triton_grpc.infer(
            model,
            _grpc_inputs(inputs),
            model_version=version,
            outputs=None if names is None else [tgrpc.InferRequestedOutput(n) for n in names],
            parameters=params,
        )
    )
    assert grpc_message == http_message
    assert grpc_status == HTTP_TO_GRPC[http_status], (http_status, grpc_status)


def test_metadata_errors(triton_grpc: tgrpc.InferenceServerClient) -> None:
    status, message = _grpc_error(lambda: triton_grpc.get_model_metadata("nope"))
    assert status == "StatusCode.NOT_FOUND"
    assert message.startswith("unknown model 'nope'; models: [")
    status, message = _grpc_error(lambda: triton_grpc.get_model_config("rope", "7"))
    assert status == "StatusCode.NOT_FOUND"
    assert message == "model 'rope' has no version '7'; versions: ['1']"
    status, _ = _grpc_error(lambda: triton_grpc.load_model("rope"))
    assert status == "StatusCode.UNIMPLEMENTED"


@pytest.mark.parametrize("model", sorted(MODELS))
def test_model_config_is_the_http_document(
    triton_http: http.InferenceServerClient,
    triton_grpc: tgrpc.InferenceServerClient,
    model: str,
) -> None:
    """ModelConfig: Triton's message holding what `GET /v2/models/{model}/config` says (the
    tensors' descriptions and accepted datatypes aside: the message has no field for them)."""
    want = triton_http.get_model_config(model)
    got = triton_grpc.get_model_config(model).config
    assert (got.name, got.platform, got.backend) == (
        want["name"],
        want["platform"],
        want["backend"],
    )
    assert list(got.version_policy.specific.versions) == [1]
    assert got.max_batch_size == want["max_batch_size"] == 0
    for tensors, declared in ((got.input, want["input"]), (got.output, want["output"])):
        assert [(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims))
                for t in tensors] == [
            (t["name"], t["data_type"], t["dims"]) for t in declared
        ]  # fmt: skip
    assert [t.optional for t in got.input] == [t["optional"] for t in want["input"]]
    params = {k: v.string_value for k, v in got.parameters.items()}
    assert json.loads(params.pop("posenc")) == want["posenc"]
    assert params == want["parameters"]


def test_malformed_requests_from_generated_stubs(server: ServerHandle) -> None:
    """What tritonclient never sends but hand-built requests can: every one a 400."""
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    def request(**fields: Any) -> Any:
        message = service_pb2.ModelInferRequest(model_name="sinusoidal", **fields)
        message.parameters["dim"].int64_param = 8
        return message

    one = np.array([1], np.int64).tobytes()
    bad = {
        "raw count": (
            request(
                inputs=[{"name": "position_ids", "datatype": "INT64", "shape": [1]}],
                raw_input_contents=[one, one],
            ),
            "raw_input_contents holds 2 tensors for 1 inputs",
        ),
        "no data": (
            request(inputs=[{"name": "position_ids", "datatype": "INT64", "shape": [1]}]),
            "input 'position_ids' has neither contents nor raw_input_contents",
        ),
        "negative dim": (
            request(
                inputs=[{"name": "position_ids", "datatype": "INT64", "shape": [-1]}],
                raw_input_contents=[one],
            ),
            "shape must be a list of non-negative integers",
        ),
        "byte count": (
            request(
                inputs=[{"name": "position_ids", "datatype": "INT64", "shape": [1 << 40]}],
                raw_input_contents=[one],
            ),
            "binary_data_size 8 does not match shape",
        ),
        "datatype": (
            request(
                inputs=[{"name": "position_ids", "datatype": "INT128", "shape": [1]}],
                raw_input_contents=[one],
            ),
            "datatype must be one of",
        ),
        "twice": (
            request(
                inputs=[
                    {"name": "position_ids", "datatype": "INT64", "shape": [1]},
                    {"name": "position_ids", "datatype": "INT64", "shape": [1]},
                ],
                raw_input_contents=[one, one],
            ),
            "input 'position_ids' is given twice",
        ),
        "output twice": (
            request(
                inputs=[{"name": "position_ids", "datatype": "INT64", "shape": [1]}],
                raw_input_contents=[one],
                outputs=[{"name": "embedding"}, {"name": "embedding"}],
            ),
            "output 'embedding' is requested twice",
        ),
    }
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for name, (message, expected) in bad.items():
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(message)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert expected in info.value.details(), (name, info.value.details())


def test_body_limit_and_api_keys() -> None:
    """`max_infer_body_bytes` bounds gRPC messages as it bounds HTTP bodies; API keys guard the
    model calls (the HTTP messages, constant-time check), health and server metadata stay open."""
    with start_server(grpc_port=0, max_infer_body_bytes=4096, api_keys=["k-one", "k-two"]) as srv:
        client = tgrpc.InferenceServerClient(srv.grpc_url)
        big = [("position_ids", np.zeros(1024, np.int64))]
        params = {"dim": 8, "max_positions": 4}
        auth = {"authorization": "Bearer k-two"}
        status, message = _grpc_error(
            lambda: client.infer("sinusoidal", _grpc_inputs(big), parameters=params, headers=auth)
        )
        assert status == "StatusCode.RESOURCE_EXHAUSTED"
        assert "4096" in message
        with httpx.Client(base_url=srv.url) as c:
            body = json.dumps({"inputs": [{"name": "position_ids", "datatype": "INT64",
                                           "shape": [2048], "data": [0] * 2048}]})  # fmt: skip
            r = c.post("/v2/models/sinusoidal/infer", content=body, headers={
                "Authorization": "Bearer k-one"})  # fmt: skip
            assert r.status_code == 413

        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.get_server_metadata().name == "posenc"
        small = _grpc_inputs([("position_ids", np.array([1, 2], np.int64))])
        for headers, expected in (
            (None, "this route needs an Authorization: Bearer <key> header"),
            ({"authorization": "Bearer nope"}, "the bearer token is not a valid API key"),
            ({"authorization": "Basic k-one"}, "this route needs an Authorization: Bearer"),
        ):
            for call in (
                lambda h=headers: client.infer("sinusoidal", small, parameters=params, headers=h),
                lambda h=headers: client.get_model_metadata("rope", headers=h),
                lambda h=headers: client.get_model_config("rope", headers=h),
                lambda h=headers: client.is_model_ready("rope", headers=h),
            ):
                status, message = _grpc_error(call)
                assert status == "StatusCode.UNAUTHENTICATED"
                assert message.startswith(expected)
        result = client.infer("sinusoidal", small, parameters=params, headers=auth)
        assert result.as_numpy("embedding").shape == (2, 8)
        for headers, want in ((None, "refused"), (auth, "answered")):
            got: list[tuple[Any, Any]] = []
            stream = tgrpc.InferenceServerClient(srv.grpc_url)
            stream.start_stream(
                lambda result, error, got=got: got.append((result, error)), headers=headers
            )
            try:
                stream.async_stream_infer("sinusoidal", small, parameters=params)
            except InferenceServerException:
                # the refusal can end the stream before the request is queued: tritonclient
                # then raises here and reports the server's error through the callback
                assert want == "refused"
            assert wait_for(lambda got=got: bool(got))
            stream.stop_stream()
            stream.close()
            (answer, error), *_ = got
            if want == "refused":
                assert answer is None
                assert "UNAUTHENTICATED" in str(error.status())
                assert str(error.message()).startswith("this route needs an Authorization")
            else:
                assert error is None
                assert answer.as_numpy("embedding").shape == (2, 8)
        assert client.is_model_ready("rope", headers={"authorization": "bearer k-one"})
        client.close()


def test_busy_is_unavailable_with_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """Too many computations in flight: UNAVAILABLE with /v2's message and `retry-after` in the
    trailing metadata (HTTP's Retry-After)."""
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    with start_server(grpc_port=0, max_concurrent_computations=1, retry_after_seconds=3) as srv:
        cache = srv.state.require_cache()
        gate = Gate()

        def slow(spec: SpecBase, device: torch.device) -> Table:
            gate.pass_through()  # in flight until the second request has been refused
            return compute(spec, device)

        monkeypatch.setattr(cache, "_compute", slow)

        def request(max_positions: int) -> Any:
            message = service_pb2.ModelInferRequest(model_name="rope")
            message.parameters["head_dim"].int64_param = 8
            message.parameters["max_positions"].int64_param = max_positions
            message.inputs.add(name="position_ids", datatype="INT64", shape=[1])
            message.raw_input_contents.append(np.array([0], np.int64).tobytes())
            return message

        with grpc.insecure_channel(srv.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            with ThreadPoolExecutor(2) as pool:
                first = pool.submit(stub.ModelInfer, request(10))
                try:
                    assert gate.reached.wait(30), "the first computation never started"
                    with pytest.raises(grpc.RpcError) as info:
                        stub.ModelInfer(request(11))
                finally:
                    gate.open()
                assert len(first.result().raw_output_contents) == 2
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert info.value.details() == "1 computations already in flight; retry in 3s"
        assert ("retry-after", "3") in tuple(info.value.trailing_metadata())


def test_stream_infer_keeps_order_and_reports_errors(server: ServerHandle) -> None:
    """ModelStreamInfer (tritonclient's start_stream): responses in request order, a failure as
    the stream's error for that request while the stream goes on."""
    got: list[tuple[Any, Any]] = []
    client = tgrpc.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.append((result, error)))
    params = {"head_dim": 16, "max_positions": 32}
    for i, position in enumerate([3, -99, 7]):
        client.async_stream_infer(
            "rope",
            _grpc_inputs([("position_ids", np.array([position], np.int64))]),
            request_id=f"r{i}",
            parameters=params,
        )
    wait_for(lambda: len(got) >= 3)
    client.stop_stream()
    client.close()
    assert len(got) == 3
    (first, e0), (_, e1), (third, e2) = got
    assert (e0, e2) == (None, None)
    assert (first.get_response().id, third.get_response().id) == ("r0", "r2")
    unary = tgrpc.InferenceServerClient(server.grpc_url)
    want = unary.infer(
        "rope", _grpc_inputs([("position_ids", np.array([7], np.int64))]), parameters=params
    )
    unary.close()
    np.testing.assert_array_equal(third.as_numpy("cos"), want.as_numpy("cos"))
    assert isinstance(e1, InferenceServerException)
    assert str(e1.message()).startswith("input 'position_ids': positions must be in [0, ")


def test_aio_client_concurrent_requests(server: ServerHandle) -> None:
    """tritonclient.grpc.aio: concurrent inferences for every position model in one event loop,
    each equal to the sync client's answer. The client keeps at most the server's
    `max_concurrent_computations` requests in flight (each may start a computation; more are
    answered UNAVAILABLE with a retry hint, as `test_computed_rows_take_a_computation_slot`
    holds): without that bound whether the fifth collides depends on how fast the device
    computes (it did on an H200, docs/gpu.md)."""
    cases = [c for c in sorted(CASES) if CASES[c][2] and CASES[c][0] != "relative_index"]
    slots = server.settings.max_concurrent_computations
    assert len(cases) > slots  # more requests than computation slots: the bound is exercised

    async def run() -> list[Answer]:
        async with tgrpc_aio.InferenceServerClient(server.grpc_url) as client:
            assert await client.is_server_live()
            assert await client.is_server_ready()
            meta = await client.get_model_metadata("rope", as_json=True)
            assert meta["name"] == "rope"
            gate = asyncio.Semaphore(slots)

            async def infer(case: str) -> Any:
                async with gate:
                    model, params, inputs, _ = CASES[case]
                    return await client.infer(model, _grpc_inputs(inputs), parameters=params)

            results = await asyncio.gather(*(infer(c) for c in cases))
            with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
                await client.infer("nope", [])
            return [_grpc_answer(r) for r in results]

    answers = asyncio.run(run())
    sync = tgrpc.InferenceServerClient(server.grpc_url)
    for case, answer in zip(cases, answers, strict=True):
        model, params, inputs, _ = CASES[case]
        want = _grpc_answer(sync.infer(model, _grpc_inputs(inputs), parameters=params))
        assert _without_source(answer) == _without_source(want), case
    sync.close()


def _metric(server: ServerHandle, name: str, labels: dict[str, str]) -> float:
    with server.client() as client:
        text = client.get("/metrics").text
    return sum(
        float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def test_metrics_count_grpc_calls_and_shared_inferences(
    server: ServerHandle, triton_grpc: tgrpc.InferenceServerClient
) -> None:
    ok = {"method": "ModelInfer", "code": "OK"}
    missing = {"method": "ModelInfer", "code": "NOT_FOUND"}
    infer = {"model": "sinusoidal"}
    before = [_metric(server, "posenc_grpc_requests_total", ok),
              _metric(server, "posenc_grpc_requests_total", missing),
              _metric(server, "posenc_v2_infer_total", infer)]  # fmt: skip
    model, params, inputs, _ = CASES["sinusoidal"]
    triton_grpc.infer(model, _grpc_inputs(inputs), parameters=params)
    _grpc_error(lambda: triton_grpc.infer("nope", []))
    after = [_metric(server, "posenc_grpc_requests_total", ok),
             _metric(server, "posenc_grpc_requests_total", missing),
             _metric(server, "posenc_v2_infer_total", infer)]  # fmt: skip
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 1]
    assert _metric(server, "posenc_grpc_request_duration_seconds_count", {"method": "ModelInfer"})


def test_grpc_off_unless_asked(server: ServerHandle) -> None:
    assert server.settings.grpc_port == 0
    with start_server() as plain:
        assert plain.state.grpc_port is None


def test_sigterm_drains_grpc_alongside_http() -> None:
    """`posenc serve --grpc-port 0`: after SIGTERM the gRPC service says not ready while it
    still answers, then stops with the HTTP server; the process exits 0."""
    proc = start_server_process(
        "--device", "cpu", "--grpc-port", "0", "--drain-seconds", "3", "--grace-seconds", "5"
    )
    try:
        assert proc.grpc_url, "".join(proc.lines)
        client = tgrpc.InferenceServerClient(proc.grpc_url)
        assert wait_for(client.is_server_ready, timeout=60)
        small = _grpc_inputs([("position_ids", np.array([1, 2], np.int64))])
        proc.signal(signal.SIGTERM)
        # not ready as soon as the drain (3 s) begins, well before it ends
        assert wait_for(lambda: client.is_server_ready() is False, timeout=2.5)
        assert client.is_model_ready("sinusoidal") is False
        assert client.is_server_live() is True
        result = client.infer("sinusoidal", small, parameters={"dim": 8, "max_positions": 4})
        assert result.as_numpy("embedding").shape == (2, 8)
        assert proc.proc.wait(timeout=30) == 0
        with pytest.raises(InferenceServerException):
            client.is_server_live()
        client.close()
    finally:
        proc.stop()


def test_serve_fails_cleanly_when_the_grpc_port_is_taken() -> None:
    """A gRPC port in use is a failed start-up, never a second listener sharing the port, and
    fails as an HTTP port in use does: exit 3 and one line naming the address and the reason, no
    traceback (it was ~60 lines of Starlette's lifespan traceback, plus grpc core's own line)."""
    exe = Path(sys.executable).with_name("posenc")
    answers = {}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        for case, flags in (
            ("http", ["--port", str(port)]),
            ("grpc", ["--port", "0", "--grpc-port", str(port)]),
        ):
            answers[case] = subprocess.run(
                [str(exe), "serve", "--host", "127.0.0.1", "--device", "cpu", *flags],
                capture_output=True,
                text=True,
                timeout=120,
            )
    for case, result in answers.items():
        assert result.returncode == 3, (case, result.stderr[-2000:])
        assert "Traceback" not in result.stderr, (case, result.stderr[-2000:])
        named = [line for line in result.stderr.splitlines() if str(port) in line]
        assert len(named) == 1, (case, result.stderr[-2000:])
        assert f"('127.0.0.1', {port}): address already in use" in named[0], named
        assert " ERROR " in named[0], named
    grpc_line = next(ln for ln in answers["grpc"].stderr.splitlines() if str(port) in ln)
    assert "gRPC: [Errno " in grpc_line, grpc_line
