"""The nodes of an ONNX model that read cos/sin caches, and the `If` nodes that choose a cache by
length (onnxruntime-genai's LongRoPE). Needs `onnx`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import onnx
from onnx import numpy_helper

from posenc_check.graph import MICROSOFT, attribute, label, matching_nodes


@dataclass(frozen=True)
class RopeSlots:
    """Where a RoPE consumer reads its activation, caches and pairing."""

    activation: int
    cos: int
    sin: int
    interleaved_attribute: str


ROPE_SLOTS: dict[tuple[str, str], RopeSlots] = {
    ("", "RotaryEmbedding"): RopeSlots(0, 1, 2, "interleaved"),
    (MICROSOFT, "RotaryEmbedding"): RopeSlots(0, 2, 3, "interleaved"),
    (MICROSOFT, "GroupQueryAttention"): RopeSlots(0, 7, 8, "rotary_interleaved"),
}


def rope_readers(graph: onnx.GraphProto) -> Iterator[tuple[int, onnx.NodeProto, RopeSlots]]:
    """(index, node, its slots) for every node of `graph` that reads cos/sin caches
    (GroupQueryAttention only with `do_rotary=1`), in graph order."""
    for index, node, slots in matching_nodes(graph, ROPE_SLOTS):
        if node.op_type != "GroupQueryAttention" or attribute(node, "do_rotary", 0):
            yield index, node, slots


@dataclass(frozen=True)
class BranchValue:
    """Where an `If` branch makes one of its outputs: a `Constant` node's `value` or a branch
    initializer."""

    graph: onnx.GraphProto
    output: int
    tensor: onnx.TensorProto
    constant: onnx.NodeProto | None


@dataclass(frozen=True)
class LengthSwitch:
    """A cache chosen by an `If` on the length, as onnxruntime-genai's builder emits LongRoPE's
    two caches (`/model/rope_caches_subgraph/If`: `Greater(length, original)` -> then: the long
    cache, else: the short one, each a `Constant` in its branch)."""

    node: str
    threshold: int
    long: BranchValue
    short: BranchValue


def _scalar(name: str, graph: onnx.GraphProto) -> int | None:
    """The integer value of a scalar initializer or `Constant` output `name` held in the graph,
    else None."""
    for initializer in graph.initializer:  # an external one would need its data file: skip it
        if (
            initializer.name == name
            and initializer.data_type in _INTEGER_TYPES
            and initializer.data_location != onnx.TensorProto.EXTERNAL
        ):
            values = numpy_helper.to_array(initializer).reshape(-1)
            return int(values[0]) if values.size == 1 else None
    for node in graph.node:
        if node.op_type == "Constant" and node.output[:1] == [name]:
            value = attribute(node, "value")
            if isinstance(value, onnx.TensorProto) and value.data_type in _INTEGER_TYPES:
                values = numpy_helper.to_array(value).reshape(-1)
                return int(values[0]) if values.size == 1 else None
    return None


_INTEGER_TYPES = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)


def _branch_value(branch: onnx.GraphProto, output: int) -> BranchValue | None:
    """The tensor that makes `branch`'s output `output`, when it is a constant."""
    if output >= len(branch.output):
        return None
    name = branch.output[output].name
    for initializer in branch.initializer:
        if initializer.name == name:
            return BranchValue(branch, output, initializer, None)
    for node in branch.node:
        if node.op_type == "Constant" and node.output[:1] == [name]:
            for item in node.attribute:
                if item.name == "value" and item.type == onnx.AttributeProto.TENSOR:
                    return BranchValue(branch, output, item.t, node)
    return None


def length_switch(graph: onnx.GraphProto, name: str) -> LengthSwitch | str | None:
    """How the `If` node making `name` chooses it: a `LengthSwitch`, a reason it is not one
    posenc can fill (str), or None when no `If` node makes `name`."""
    for index, node in enumerate(graph.node):
        if node.op_type != "If" or name not in node.output:
            continue
        where = f"If node {label(node, index)!r}"
        output = list(node.output).index(name)
        branches = {
            item.name: item.g for item in node.attribute if item.type == onnx.AttributeProto.GRAPH
        }
        then, other = (
            _branch_value(branches["then_branch"], output),
            _branch_value(branches["else_branch"], output),
        )
        if then is None or other is None:
            return f"{where}: both branches must make {name!r} as a Constant or an initializer"
        condition = next((n for n in graph.node if node.input[0] in n.output), None)
        if condition is not None and condition.op_type in ("Greater", "Less"):
            _, bound = condition.input if condition.op_type == "Greater" else condition.input[::-1]
            threshold = _scalar(bound, graph)
            if threshold is not None:
                return LengthSwitch(label(node, index), threshold, then, other)
        return (
            f"{where} chooses {name!r} on a condition posenc cannot read (expected "
            "Greater(length, N) with a constant N, as onnxruntime-genai's LongRoPE caches)"
        )
    return None
