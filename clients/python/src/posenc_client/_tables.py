"""`Tables`: the tensors of one served table, with its key, spec and the server's facts."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from posenc_client._exceptions import DecodeError
from posenc_client._formats import Array, Buffer, dtype_name, parse_safetensors, save_arrays
from posenc_client._options import JSON

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, eq=False)
class Tables(Mapping[str, Array]):
    """The tensors of one served table, by name, with what identifies them.

    A mapping from tensor name (`cos`, `sin`, `inv_freq`, `slopes`, `bias`, `embedding`,
    `buckets`, ...) to numpy arrays, zero-copy views of the received buffer (writing to them never
    touches the disk cache): bfloat16 tables are `ml_dtypes.bfloat16` arrays, every other dtype is
    native numpy. Attributes:

    - `key`: the content key (sha256 of the canonical spec and the algorithm version);
    - `kind`: the family; `spec`: the canonical spec (every default filled in);
    - `meta`: the server's facts (shapes, dtypes, attention_scaling, rotary_dim, device, ...);
    - `notes`: what a runtime must know beside the table (from `resolve`; empty otherwise);
    - `name`: the table's name in a model (`rope`, `rope:sliding_attention`, ...) or None.
    """

    key: str
    kind: str
    spec: JSON
    meta: JSON
    arrays: dict[str, Array]
    notes: JSON = field(default_factory=dict)
    name: str | None = None
    raw: Buffer | None = field(default=None, repr=False)

    @classmethod
    def from_safetensors(cls, data: Buffer, *, name: str | None = None) -> Tables:
        """Tables from the server's safetensors bytes (arrays are views of `data`); a header
        without the posenc metadata (`key`, `kind`, `spec` and `meta` as JSON) is a
        `DecodeError`."""
        arrays, metadata = parse_safetensors(data)
        try:
            key = metadata["key"]
            kind = metadata["kind"]
            spec = json.loads(metadata["spec"])
            meta = json.loads(metadata.get("meta", "{}"))
        except (KeyError, json.JSONDecodeError) as err:
            raise DecodeError(f"the table carries no posenc metadata: {err}") from None
        return cls(key, kind, spec, meta, arrays, name=name, raw=data)

    def __getitem__(self, name: str) -> Array:
        try:
            return self.arrays[name]
        except KeyError:
            raise KeyError(
                f"no tensor {name!r} in this {self.kind} table; it has {list(self.arrays)}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.arrays)

    def __len__(self) -> int:
        return len(self.arrays)

    def __repr__(self) -> str:
        shapes = ", ".join(
            f"{n}: {dtype_name(a.dtype)}{list(a.shape)}" for n, a in self.arrays.items()
        )
        label = f" {self.name!r}" if self.name else ""
        return f"<Tables{label} {self.kind} {self.key[:12]} {{{shapes}}}>"

    @property
    def etag(self) -> str:
        """The server's strong ETag for these bytes as safetensors: `"<key>"` for the whole
        table, `"<key>.safetensors.<start>-<end>"` for rows [start, end) (`meta["rows"]`), and
        `@<device>` after either for a table built off the CPU (`meta["device"]`)."""
        meta = self.meta
        tag = self.key
        rows = meta.get("rows")
        if isinstance(rows, list) and len(rows) == 2:
            tag = f"{tag}.safetensors.{rows[0]}-{rows[1]}"
        device = str(meta.get("device", "cpu"))
        return f'"{tag}"' if device == "cpu" else f'"{tag}@{device}"'

    @property
    def dtypes(self) -> dict[str, str]:
        """Tensor name -> dtype name (`float32`, `bfloat16`, ...)."""
        return {n: dtype_name(a.dtype) for n, a in self.arrays.items()}

    def with_notes(self, notes: Mapping[str, Any], name: str | None) -> Tables:
        """A copy carrying `notes` and `name` (the arrays are shared)."""
        return Tables(
            self.key, self.kind, self.spec, self.meta, self.arrays, dict(notes), name, self.raw
        )

    def to_torch(self, device: str | None = None) -> dict[str, torch.Tensor]:
        """The tensors as torch tensors (bfloat16 included), copied, on `device` (CPU default).

        Needs torch (`pip install posenc-client[torch]`); torch is imported only here.
        """
        try:
            import torch
        except ImportError as err:
            raise ImportError(
                "Tables.to_torch needs torch: pip install 'posenc-client[torch]'"
            ) from err
        out: dict[str, torch.Tensor] = {}
        for name, array in self.arrays.items():
            if array.dtype.name == "bfloat16":
                bits = torch.from_numpy(np.array(array.view(np.uint16)))
                tensor = bits.view(torch.bfloat16)
            else:
                tensor = torch.from_numpy(np.array(array))
            out[name] = tensor.to(device) if device is not None else tensor
        return out

    def save(self, path: str | os.PathLike[str], *, tensor: str | None = None) -> None:
        """Write the table by suffix: `.safetensors` (the server's file as received, metadata
        included, unless `tensor=` picks one), `.npz` or `.npy` (`tensor=NAME`, or the only one).
        numpy formats cannot hold bfloat16 (ValueError)."""
        from posenc_client._formats import write_atomic

        suffix = os.path.splitext(os.fspath(path))[1].lower()
        if suffix == ".safetensors" and tensor is None and self.raw is not None:
            write_atomic(path, self.raw)
            return
        metadata = {
            "key": self.key,
            "kind": self.kind,
            "spec": json.dumps(self.spec, sort_keys=True, separators=(",", ":")),
            "meta": json.dumps(self.meta, separators=(",", ":")),
        }
        save_arrays(path, self.arrays, metadata=metadata, tensor=tensor)
