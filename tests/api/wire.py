"""Decoders for every wire format the API sends, independent of the server's own code."""

from __future__ import annotations

import base64
import io
import json
import re
import struct
import zlib
from typing import Any

import httpx
import numpy as np
import torch
from safetensors.torch import load as safetensors_load

TORCH_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
}


def safetensors_metadata(data: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors file (8-byte little-endian header length, JSON)."""
    (length,) = struct.unpack("<Q", data[:8])
    header: dict[str, Any] = json.loads(data[8 : 8 + length])
    meta: dict[str, str] = header.get("__metadata__", {})
    return meta


TABLE_URL = re.compile(r"/v1/tables/([0-9a-f]{64})\.([A-Za-z0-9_-]+)")
"""The table URL the server hands out: `/v1/tables/{key}.{spec}` (docs/service.md)."""


def table_url_parts(url: str) -> tuple[str, dict[str, Any]]:
    """(key, spec object) of a `/v1/tables/{key}.{spec}` URL: the spec part is base64url
    (unpadded) of the zlib-deflated canonical JSON."""
    found = TABLE_URL.fullmatch(url)
    assert found is not None, url
    token = found.group(2)
    text = zlib.decompress(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    spec: dict[str, Any] = json.loads(text)
    return found.group(1), spec


def spec_token(spec: dict[str, Any]) -> str:
    """The spec part of a table URL for a spec object (any spelling: the server checks its key)."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return base64.urlsafe_b64encode(zlib.compress(text.encode(), 9)).rstrip(b"=").decode()


def decode(response: httpx.Response) -> dict[str, torch.Tensor]:
    """Tensors from a table response in any format, by name."""
    kind = response.headers["content-type"].split(";")[0]
    data = response.content
    if kind == "application/vnd.safetensors":
        return dict(safetensors_load(data))
    if kind == "application/x-npz":
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            return {name: torch.from_numpy(archive[name].copy()) for name in archive.files}
    if kind == "application/x-npy":
        array = np.load(io.BytesIO(data), allow_pickle=False)
        return {response.headers["x-posenc-tensor"]: torch.from_numpy(array.copy())}
    if kind == "application/octet-stream":
        dtype = TORCH_DTYPES[response.headers["x-posenc-dtype"]]
        shape = [int(d) for d in response.headers["x-posenc-shape"].split(",")]
        tensor = torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)
        return {response.headers["x-posenc-tensor"]: tensor}
    if kind == "application/json":
        body = response.json()
        return {
            name: torch.tensor(t["data"], dtype=TORCH_DTYPES[t["dtype"]]).reshape(t["shape"])
            for name, t in body["tensors"].items()
        }
    raise AssertionError(f"unexpected content type {kind}")
