"""tritonclient helpers for the /v2 tests: inputs from tensors, outputs to tensors, /v1 tables."""

from __future__ import annotations

import json
from typing import Any

import ml_dtypes
import numpy as np
import torch
import tritonclient.http as http

from posenc.encodings import compute, parse_spec
from tests.api.wire import decode
from tests.conftest import ServerHandle

NP_DATATYPES = {
    np.dtype(np.int64): "INT64",
    np.dtype(np.int32): "INT32",
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
    np.dtype(np.float16): "FP16",
    np.dtype(ml_dtypes.bfloat16): "BF16",
}


def url(server: ServerHandle) -> str:
    """tritonclient wants host:port, no scheme."""
    return server.url.removeprefix("http://")


def make_input(name: str, array: np.ndarray[Any, Any], binary: bool = True) -> http.InferInput:
    item = http.InferInput(name, list(array.shape), NP_DATATYPES[array.dtype])
    item.set_data_from_numpy(array, binary_data=binary)
    return item


def outputs(names: list[str], binary: bool) -> list[http.InferRequestedOutput]:
    return [http.InferRequestedOutput(n, binary_data=binary) for n in names]


def as_torch(result: http.InferResult, name: str) -> torch.Tensor:
    """An output as a torch tensor (BF16 via ml_dtypes bits)."""
    array = result.as_numpy(name)
    assert array is not None, name
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array).copy())


def spec_param(spec: dict[str, Any]) -> dict[str, Any]:
    """Request parameters carrying `spec` as the `spec` JSON string."""
    return {"spec": json.dumps({k: v for k, v in spec.items() if k != "kind"})}


def table(server: ServerHandle, spec: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The whole table from `posenc.encodings.compute` on the server's device, on the CPU."""
    computed = compute(parse_spec(spec), server.device)
    return {name: t.cpu() for name, t in computed.tensors.items()}


def v1_table(server: ServerHandle, spec: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The whole table as `POST /v1/tables` serves it (safetensors)."""
    with server.client() as client:
        response = client.post("/v1/tables", json=spec)
        assert response.status_code == 200, response.text
        return decode(response)


def assert_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert torch.equal(got, want)
