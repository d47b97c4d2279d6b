"""The GPU serving paths (skipped without CUDA): device-to-host copies made once, into the body.

- safetensors bodies of GPU tables are written by copying each tensor device-to-host straight
  into the body: the bytes equal those of the same tensors on the CPU;
- /v2 binary outputs of GPU tensors: one copy, into pinned memory from `PINNED_MIN_BYTES` on;
- a server on the GPU tags its tables `"<key>@cuda:0"`, and its raw and /v2 bytes are the table's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc.api.oip.codec import PINNED_MIN_BYTES, host_bytes
from posenc.api.serving.encode import build_safetensors
from posenc.encodings import compute, parse_spec
from tests.conftest import start_server

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("numel", [1, 1000, PINNED_MIN_BYTES // 2 + 3, 3 * PINNED_MIN_BYTES])
def test_host_bytes_of_gpu_tensors_are_the_cpu_bytes(numel: int, dtype: torch.dtype) -> None:
    cpu = (torch.arange(numel, dtype=torch.float32) * 0.37).to(dtype)
    got = host_bytes(cpu.to(CUDA))
    assert bytes(got) == bytes(host_bytes(cpu))
    strided = cpu.reshape(1, -1).expand(2, -1)
    assert bytes(host_bytes(strided.to(CUDA))) == bytes(host_bytes(strided))


def test_safetensors_bodies_of_gpu_tensors_equal_the_cpu_ones() -> None:
    spec = parse_spec({"kind": "rope", "head_dim": 128, "max_positions": 4096, "dtype": "bfloat16"})
    table = compute(spec, "cpu")
    meta = {"key": "k", "spec": "{}"}
    on_gpu = {n: t.to(CUDA) for n, t in table.tensors.items()}
    assert bytes(build_safetensors(on_gpu, meta)) == bytes(build_safetensors(table.tensors, meta))


def test_a_gpu_server_tags_and_serves_its_own_bytes() -> None:
    spec = {"kind": "rope", "head_dim": 64, "max_positions": 8192}
    with start_server(device="cuda") as server, server.client() as c:
        r = c.post("/v1/tables", json=spec)
        key = r.headers["x-posenc-key"]
        assert r.headers["x-posenc-device"] == "cuda:0"
        assert r.headers["etag"] == f'"{key}@cuda:0"'
        assert c.get(f"/v1/tables/{key}", headers={"If-None-Match": f'"{key}"'}).status_code == 200
        assert (
            c.get(f"/v1/tables/{key}", headers={"If-None-Match": r.headers["etag"]}).status_code
            == 304
        )
        table = compute(parse_spec(spec), CUDA).tensors["cos"].cpu()
        raw = c.get(f"/v1/tables/{key}", params={"format": "raw", "tensor": "cos"})
        assert raw.headers["etag"] == f'"{key}.raw.cos@cuda:0"'
        assert np.array_equal(
            np.frombuffer(raw.content, np.float32).reshape(8192, 64), table.numpy()
        )
