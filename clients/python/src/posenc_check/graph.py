"""Reading ONNX nodes and tensors without loading a model's weights.

Needs `onnx`. Tensors stored in external data (the `external_data` section of the ONNX IR spec:
location, offset and length relative to the model's folder) are read one at a time, only their
own bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy.typing as npt
import onnx
from onnx import numpy_helper

Array = npt.NDArray[Any]

ELEMENT_TYPES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.BOOL: "bool",
}
"""`TensorProto` element types -> the dtype names tables use."""

MICROSOFT = "com.microsoft"
"""onnxruntime's contrib-op domain."""


def domain(node: onnx.NodeProto) -> str:
    """The node's domain, "" for the default one (however it is spelled)."""
    return "" if node.domain in ("", "ai.onnx") else node.domain


def label(node: onnx.NodeProto, index: int) -> str:
    """The node's name, or `op_type#index` for an unnamed one."""
    return node.name or f"{node.op_type}#{index}"


def op_name(node: onnx.NodeProto) -> str:
    """`op_type`, prefixed with its domain outside the default one."""
    node_domain = domain(node)
    return f"{node_domain}.{node.op_type}" if node_domain else node.op_type


def attribute(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    """The value of the node's attribute `name`, or `default`."""
    for item in node.attribute:
        if item.name == name:
            return onnx.helper.get_attribute_value(item)
    return default


def node_input(node: onnx.NodeProto, index: int) -> str:
    """The name of the node's input `index` ("" when left out)."""
    return node.input[index] if len(node.input) > index else ""


SlotT = TypeVar("SlotT")


def matching_nodes(
    graph: onnx.GraphProto, slots: Mapping[tuple[str, str], SlotT]
) -> Iterator[tuple[int, onnx.NodeProto, SlotT]]:
    """(index, node, what `slots` holds for it) for every node of `graph` whose
    `(domain, op_type)` `slots` lists, in graph order."""
    for index, node in enumerate(graph.node):
        found = slots.get((domain(node), node.op_type))
        if found is not None:
            yield index, node, found


def is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def external_field(tensor: onnx.TensorProto, key: str) -> str | None:
    """One `external_data` entry of a tensor ("location", "offset", "length")."""
    for entry in tensor.external_data:
        if entry.key == key:
            return str(entry.value)
    return None


def data_path(data_dir: str | os.PathLike[str], location: str) -> Path:
    """The file an external data `location` names in the model's folder `data_dir`; ValueError
    when it is absolute or leaves the folder (`../`, a symlinked step out): a model must never
    make a reader (or a copy) reach files beside it."""
    folder = Path(data_dir).resolve()
    path = (folder / location).resolve()
    if Path(location).is_absolute() or folder not in path.parents:
        raise ValueError(f"data location {location!r} leaves the folder")
    return path


def read_tensor(tensor: onnx.TensorProto, data_dir: str | os.PathLike[str] | None) -> Array:
    """The values of one tensor, reading only its own bytes (offset, length) from its data file
    when external (`data_dir`: the folder its location is relative to; the location must stay
    inside it; None: external tensors are not read, a ValueError says so). Read here rather
    than by onnx's loader, which refuses data files with several hard links
    (`posenc_client.onnx.save_model(..., link=True)` makes such files)."""
    if not is_external(tensor):
        return numpy_helper.to_array(tensor)
    location = external_field(tensor, "location") or ""
    if data_dir is None:
        raise ValueError(
            f"tensor {tensor.name!r} is stored in external data ({location!r}): give the "
            "model's folder"
        )
    try:
        path = data_path(data_dir, location)
    except ValueError as err:
        raise ValueError(f"tensor {tensor.name!r}: {err}") from None
    offset = int(external_field(tensor, "offset") or 0)
    length = external_field(tensor, "length")
    with open(path, "rb") as data:
        data.seek(offset)
        raw = data.read(int(length)) if length is not None else data.read()
    inline = onnx.TensorProto()
    inline.CopyFrom(tensor)
    del inline.external_data[:]
    inline.data_location = onnx.TensorProto.DEFAULT
    inline.raw_data = raw
    return numpy_helper.to_array(inline)
