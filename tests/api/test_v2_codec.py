"""The /v2 wire codec against tritonclient's own request builder and response parser."""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest
import torch
import tritonclient.http as http

from posenc.api.oip.codec import (
    InferRequest,
    OipError,
    OutputTensor,
    check_json_outputs,
    decompress,
    encode_infer_response,
    parse_infer_request,
)
from tests.api.v2client import make_input


def test_parses_tritonclient_requests() -> None:
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    weights = np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)
    half = np.array([1.5, -2.25], dtype=ml_dtypes.bfloat16)
    body, json_size = http.InferenceServerClient.generate_request_body(
        [make_input("a", ids), make_input("w", weights, binary=False), make_input("h", half)],
        outputs=[http.InferRequestedOutput("x", binary_data=False), http.InferRequestedOutput("y")],
        request_id="r1",
        parameters={"head_dim": 8, "spec": "{}"},
    )
    request = parse_infer_request(body, str(json_size))
    assert request.id == "r1"
    assert request.parameters == {"head_dim": 8, "spec": "{}"}
    assert torch.equal(request.inputs["a"].tensor, torch.from_numpy(ids))
    assert torch.equal(request.inputs["w"].tensor, torch.from_numpy(weights))
    assert request.inputs["h"].tensor.dtype == torch.bfloat16
    assert request.inputs["h"].tensor.float().tolist() == [1.5, -2.25]
    assert not request.binary("x")
    assert request.binary("y")
    plain, size = http.InferenceServerClient.generate_request_body([make_input("a", ids)])
    parsed = parse_infer_request(plain, None if size is None else str(size))
    assert parsed.outputs is None
    assert parsed.binary("anything")  # no outputs named: tritonclient asks for binary


def test_response_round_trips_through_tritonclient() -> None:
    tensors = {
        "f": torch.randn(2, 3, 4),
        "b": torch.randn(5).to(torch.bfloat16),
        "h": torch.randn(2, 2).to(torch.float16),
        "i": torch.arange(6, dtype=torch.int64).reshape(3, 2),
        "j": torch.tensor([0.1, -3e-8], dtype=torch.float32),
    }
    binary = {"f": True, "b": True, "h": True, "i": False, "j": False}
    encoded = encode_infer_response(
        "m", "1", "id-7", [OutputTensor(n, t, binary[n]) for n, t in tensors.items()], {"p": 1}
    )
    header = encoded.headers.get("Inference-Header-Content-Length")
    assert header is not None
    result = http.InferenceServerClient.parse_response_body(encoded.body(), False, int(header))
    response = result.get_response()
    assert (response["id"], response["model_name"], response["parameters"]) == (
        "id-7",
        "m",
        {"p": 1},
    )
    for name, t in tensors.items():
        got = result.as_numpy(name)
        if t.dtype == torch.bfloat16:
            got = torch.from_numpy(got.view(np.int16).copy()).view(torch.bfloat16)
        else:
            got = torch.from_numpy(np.array(got))
        assert torch.equal(got, t), name
    only_json = encode_infer_response("m", "1", None, [OutputTensor("i", tensors["i"], False)])
    assert only_json.media_type == "application/json"
    assert not only_json.headers
    parsed = http.InferenceServerClient.parse_response_body(only_json.body())
    assert "id" not in parsed.get_response()
    assert parsed.as_numpy("i").tolist() == tensors["i"].tolist()


def test_json_limits() -> None:
    request = InferRequest(None, {}, {}, None, binary_data_output=False)
    check_json_outputs({"a": ((10,), "FP32")}, request, 10)
    with pytest.raises(OipError, match="limit of 9"):
        check_json_outputs({"a": ((10,), "FP32")}, request, 9)
    with pytest.raises(OipError, match="only as binary"):
        check_json_outputs({"a": ((1,), "BF16")}, request, 10)
    binary = InferRequest(None, {}, {}, None, binary_data_output=True)
    check_json_outputs({"a": ((10**9,), "BF16")}, binary, 0)
    with pytest.raises(OipError, match="non-finite"):
        encode_infer_response("m", "1", None, [OutputTensor("x", torch.tensor([-np.inf]), False)])


def test_decompress_is_bounded() -> None:
    bomb = zlib.compress(b"\0" * (1 << 20))
    assert len(decompress(bomb, "deflate", 1 << 20)) == 1 << 20
    with pytest.raises(OipError, match="exceeds the limit"):
        decompress(bomb, "deflate", (1 << 20) - 1)
    with pytest.raises(OipError, match="unsupported Content-Encoding"):
        decompress(b"", "br", 10)
    assert decompress(b"abc", None, 1) == b"abc"
