"""Graph authoring: an onnxscript `GraphBuilder` pinned to one opset, plus the model wrapper.

Graphs are written imperatively against `onnxscript.GraphBuilder` (public in onnxscript 0.7):
every op call is checked against the ONNX schema of the pinned opset, Python scalars become typed
constants, and each node's output type and shape are inferred as it is added, so the shape
comments in the graph modules are checked by the builder, not just written. The `@script`
decorator cannot express these graphs: their structure depends on the spec (variant, pairing,
partial rotary, bias form), which `@script` would turn into ONNX `If` nodes instead of Python
branches.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import onnx
import onnx_ir as ir
import torch
from onnx_ir.tensor_adapters import TorchTensor
from onnxscript import GraphBuilder

from posenc import __version__
from posenc.onnx._options import IR_VERSIONS

IR_DTYPES: dict[str, ir.DataType] = {
    "float32": ir.DataType.FLOAT,
    "float16": ir.DataType.FLOAT16,
    "bfloat16": ir.DataType.BFLOAT16,
    "float64": ir.DataType.DOUBLE,
    "int64": ir.DataType.INT64,
    "bool": ir.DataType.BOOL,
}

CONTRIB_DOMAIN = "com.microsoft"

Dim = int | str | None


class Graph:
    """One graph under construction: the builder, its opset, inputs, outputs and initializers.

    `op` is the opset-pinned op builder (`op.Mul(a, b)`); `contrib` the `com.microsoft` one.
    """

    def __init__(self, name: str, opset: int, *, contrib: bool = False) -> None:
        imports = {"": opset}
        if contrib:
            imports[CONTRIB_DOMAIN] = 1
        self.opset = opset
        self.ir_graph = ir.Graph(inputs=[], outputs=[], nodes=[], opset_imports=imports, name=name)
        self.builder = GraphBuilder(self.ir_graph)
        self.op = self.builder.op
        self.contrib = self.builder.opset(CONTRIB_DOMAIN, 1) if contrib else None

    def input(self, name: str, dtype: str, shape: Sequence[Dim], doc: str) -> ir.Value:
        """Declare a graph input; symbolic dims are strings (`"B"`, `"S"`)."""
        value: ir.Value = self.builder.input(name, IR_DTYPES[dtype], list(shape))
        value.doc_string = doc
        return value

    def output(
        self, value: ir.Value, name: str, doc: str, shape: Sequence[Dim] | None = None
    ) -> None:
        """Name `value` and declare it as a graph output; `shape` names dims that inference
        leaves unknown (it must agree with what the graph computes)."""
        value.doc_string = doc
        if shape is not None:
            value.shape = ir.Shape(list(shape))
        self.builder.add_output(value, name)

    def initializer(self, name: str, tensor: torch.Tensor) -> ir.Value:
        """Embed `tensor` (contiguous CPU copy, any dtype incl. bfloat16) as an initializer."""
        data = tensor.detach().to("cpu").contiguous()
        value: ir.Value = self.builder.initializer(TorchTensor(data, name=name), name=name)
        return value


def finish(
    graph: Graph,
    *,
    doc: str,
    metadata: Mapping[str, str],
) -> onnx.ModelProto:
    """The `ModelProto`: explicit IR version for the opset, producer, metadata, doc string.

    Node annotations the builder adds for module scopes (`namespace`, `pkg.onnxscript.*`) are
    dropped: these graphs have no modules, and the models are merged into others.
    """
    for node in ir.traversal.RecursiveGraphIterator(graph.ir_graph):
        node.metadata_props.clear()
    model = ir.Model(
        graph.ir_graph,
        ir_version=IR_VERSIONS[graph.opset],
        producer_name="posenc",
        producer_version=__version__,
        doc_string=doc,
    )
    model.metadata_props.update(metadata)
    proto: onnx.ModelProto = ir.serde.serialize_model(model)
    return proto


def notes_json(notes: Mapping[str, Any]) -> str:
    """Notes as sorted, compact JSON (floats kept at full precision)."""
    return json.dumps(dict(notes), sort_keys=True, separators=(",", ":"), allow_nan=False)
