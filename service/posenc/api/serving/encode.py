"""Encoding a table's selected tensors into one wire format's body (`Format.encode`).

Encoders take an `Encoding` (the table's tensors on their device, the selection, the table's
identity and metadata) and return the body; the safetensors encoder copies GPU tensors straight
into the body, the others work on CPU copies. No math happens here beyond slicing and packing.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import torch
from safetensors.torch import save as safetensors_save

from posenc.api.serving.selection import Selection, cpu_tensors, selected_tensors
from posenc.encodings import SpecBase, canonical_json
from posenc.encodings.memory import empty
from posenc.runtime import Buffer
from posenc.verified import VERIFIED_AGAINST_TEXT


@dataclass(frozen=True)
class Encoding:
    """What an encoder needs: the table's `tensors` (on the device that built them), the
    `selection` to send, its content `key`, canonical `spec`, `meta` (the table's facts, with
    `rows` and `fallback` when they apply) and the `device` that built it."""

    tensors: dict[str, torch.Tensor]
    selection: Selection
    key: str
    spec: SpecBase
    meta: dict[str, Any]
    device: str

    def cpu(self) -> dict[str, torch.Tensor]:
        """The selected tensors, row-sliced, contiguous, on the CPU."""
        return cpu_tensors(self.tensors, self.selection)


def raw_view(t: torch.Tensor) -> memoryview:
    """Little-endian bytes of a contiguous CPU tensor, without copying (bfloat16 as its bits)."""
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().data.cast("B")


SAFETENSORS_DTYPES: dict[torch.dtype, tuple[int, str]] = {
    torch.bool: (0, "BOOL"),
    torch.uint8: (4, "U8"),
    torch.int8: (5, "I8"),
    torch.int16: (9, "I16"),
    torch.float16: (11, "F16"),
    torch.bfloat16: (12, "BF16"),
    torch.int32: (13, "I32"),
    torch.float32: (15, "F32"),
    torch.float64: (17, "F64"),
    torch.int64: (18, "I64"),
}
"""safetensors' name of each dtype and its position in the library's `Dtype` enum, which orders
the tensors of a file (larger first, then by name)."""


def build_safetensors(
    tensors: dict[str, torch.Tensor], metadata: dict[str, str]
) -> bytes | memoryview:
    """A safetensors file holding `tensors` (bfloat16 native; on any device) and string
    `metadata`.

    The file `safetensors.torch.save` writes (its tensor order, header JSON and padding), except
    that the metadata keys are sorted: the library writes them in its hash map's order, which
    changes from process to process, so equal tables had unequal bytes across replicas. Built with
    one copy of the data into one uninitialised buffer and returned as a memoryview of it (the
    library copies twice, into its own buffer and then into a new `bytes`, and every copy of a
    large table is as many fresh pages to fault in). Dtypes without an entry go through the
    library.
    """
    if any(t.dtype not in SAFETENSORS_DTYPES for t in tensors.values()):
        data: bytes = safetensors_save({n: t.cpu() for n, t in tensors.items()}, metadata=metadata)
        return data
    order = sorted(tensors.items(), key=lambda kv: (-SAFETENSORS_DTYPES[kv[1].dtype][0], kv[0]))
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for name, t in order:
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[t.dtype][1],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    start = 8 + len(text)
    out = empty((start + offset,), torch.uint8)  # its own mapping when large (encodings.memory)
    out[:start] = torch.frombuffer(
        bytearray(len(text).to_bytes(8, "little") + text), dtype=torch.uint8
    )
    for _, t in order:
        size = t.numel() * t.element_size()
        # a GPU tensor is copied device-to-host straight into the body: one transfer, no
        # intermediate host copy
        out[start : start + size] = t.detach().reshape(-1).view(torch.uint8)
        start += size
    return out.numpy().data


def build_npz(tensors: dict[str, torch.Tensor]) -> bytes:
    """An uncompressed `.npz` archive (numpy.savez) of `tensors`."""
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=False, **{k: v.numpy() for k, v in tensors.items()})
    return buf.getvalue()


def build_npy(t: torch.Tensor) -> bytes:
    """A `.npy` file (numpy.save) of one tensor."""
    buf = io.BytesIO()
    np.save(buf, t.numpy(), allow_pickle=False)
    return buf.getvalue()


def build_json(tensors: dict[str, torch.Tensor], head: dict[str, Any]) -> bytes:
    """`{**head, "tensors": {name: {"dtype", "shape", "data"}}}` via orjson (bfloat16 as float)."""
    body: dict[str, Any] = dict(head)
    out: dict[str, Any] = {}
    for name, t in tensors.items():
        dtype = str(t.dtype).removeprefix("torch.")
        values = t.float() if t.dtype == torch.bfloat16 else t
        out[name] = {"dtype": dtype, "shape": list(t.shape), "data": values.numpy()}
    body["tensors"] = out
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def encode_safetensors(e: Encoding) -> Buffer:
    """safetensors with posenc's metadata (key, kind, canonical spec, meta as JSON, device, the
    reference releases); GPU tensors are copied straight into the body."""
    header = {
        "format": "pt",
        "key": e.key,
        "kind": e.spec.kind,
        "spec": canonical_json(e.spec),
        "algorithm_version": str(e.meta.get("algorithm_version", "")),
        "device": e.device,
        "meta": orjson.dumps(e.meta).decode(),
        "verified_against": VERIFIED_AGAINST_TEXT,
    }
    return build_safetensors(selected_tensors(e.tensors, e.selection), header)


def encode_npz(e: Encoding) -> Buffer:
    """An uncompressed `.npz` of the selected tensors."""
    return build_npz(e.cpu())


def encode_npy(e: Encoding) -> Buffer:
    """A `.npy` of the one selected tensor."""
    return build_npy(next(iter(e.cpu().values())))


def encode_raw(e: Encoding) -> Buffer:
    """The one selected tensor's little-endian bytes (`raw_body`)."""
    return raw_body(e.tensors, e.selection)


def raw_body(tensors: dict[str, torch.Tensor], selection: Selection) -> memoryview:
    """The raw body of the one tensor `selection` names. Reached off the CPU only (a CPU table
    is sent as a view, `Format.view`): the host copy is the body, kept as a view, not copied
    again into bytes."""
    return raw_view(next(iter(cpu_tensors(tensors, selection).values())))


def encode_json(e: Encoding) -> Buffer:
    """`{"key", "kind", "spec", "meta", "tensors": {name: {"dtype", "shape", "data"}}}`."""
    head = {"key": e.key, "kind": e.spec.kind, "spec": e.meta.get("spec"), "meta": e.meta}
    return build_json(e.cpu(), head)
