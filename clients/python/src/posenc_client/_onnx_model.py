"""`OnnxModel`, a served ONNX subgraph, and its `posenc.*` metadata read without the onnx
package (`onnx_metadata`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from posenc_client._exceptions import DecodeError
from posenc_client._options import JSON

if TYPE_CHECKING:
    import onnx


@dataclass(frozen=True, eq=False)
class OnnxModel:
    """A served ONNX subgraph: the model bytes, its export key and the `posenc.*` metadata
    (graph, spec, key, options, notes) read from its `metadata_props`."""

    key: str
    data: bytes
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def graph(self) -> str | None:
        """The graph name (`rope/rotary`, `alibi/bias`, ...), from the metadata."""
        return self.metadata.get("graph")

    @property
    def spec(self) -> JSON:
        """The canonical spec the graph was exported for."""
        text = self.metadata.get("spec")
        return dict(json.loads(text)) if text else {}

    @property
    def notes(self) -> JSON:
        text = self.metadata.get("notes")
        return dict(json.loads(text)) if text else {}

    def load(self) -> onnx.ModelProto:
        """The model as an `onnx.ModelProto` (needs `pip install 'posenc-client[onnx]'`)."""
        import onnx

        model = onnx.ModelProto()
        model.ParseFromString(self.data)
        return model

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the model bytes to `path`."""
        from posenc_client._formats import write_atomic

        write_atomic(path, self.data)

    def __repr__(self) -> str:
        return f"<OnnxModel {self.graph} {self.key[:12]} {len(self.data)} bytes>"


def onnx_metadata(data: bytes) -> dict[str, str]:
    """The `posenc.*` metadata_props of serialized ONNX bytes, read without the onnx package.

    ModelProto field 14 is `metadata_props` (StringStringEntryProto: key 1, value 2); this walks
    the protobuf wire format just far enough to read them.
    """
    out: dict[str, str] = {}
    try:
        for number, value in _fields(memoryview(data)):
            if number == 14 and isinstance(value, memoryview):
                entry = {n: bytes(v).decode() for n, v in _fields(value) if not isinstance(v, int)}
                key = entry.get(1, "")
                if key.startswith("posenc."):
                    out[key.removeprefix("posenc.")] = entry.get(2, "")
    except (IndexError, ValueError, UnicodeDecodeError) as err:
        raise DecodeError(f"not a valid ONNX model: {err}") from None
    return out


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: memoryview) -> Iterator[tuple[int, int | memoryview]]:
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, value
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise ValueError("truncated field")
            yield number, buf[pos : pos + size]
            pos += size
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
