"""RoPE computed inside the graph from frequencies: `find_frequency_constants` finds them,
`frequency_values` reads them (posenc-client's `attach_inv_freq` replaces them, `verify` and
`POST /v1/check/onnx` compare them). Needs `onnx`.

`torch.onnx.export` of a transformers model computes `cos(cat(p * inv, p * inv)) * A`,
`sin(...) * A` in the graph, A folded as a constant (torch 2.13, transformers 5): there are no
caches to replace, only the frequencies `inv`, which each exporter stores differently:

- dynamo (`dynamo=True`): the rotary module's `inv_freq` buffer as an initializer
  (`model.rotary_emb.inv_freq`, (d/2,)) -> `source == "initializer"`;
- TorchScript (`dynamo=False`): a `Constant` node (`/model/rotary_emb/Constant_1`, (d/2,)),
  the MatMul folded into a Mul -> `source == "constant"`;
- a model computing its frequencies in `forward` (`1 / theta ** (arange(0, d, 2) / d)`): a chain
  of nodes over constants only (Range, Pow, Div...) -> `source == "computed"`, evaluated with
  onnx's reference evaluator, replaced by a `Constant` node of the same name and output.

Found from the other end, as a pattern: a `Cos` and a `Sin` reached from one Mul or MatMul
through Concat/Reshape/Transpose/Unsqueeze/Cast/Identity, one of whose inputs depends on the
model's inputs (the positions) and the other is, through Unsqueeze/Reshape/Expand/Cast/
Transpose/Identity (whose shape inputs may read the model's: optimum expands to the batch),
a value computed from constants only (the frequencies). A product whose both sides depend on
the inputs (frequencies that change with the length: dynamic NTK, LongRoPE computed in the
graph) is still listed, with `problem` saying why it cannot be replaced; patching or verifying
it refuses naming the node. Length-dependent configs (dynamic, longrope) are refused too: one
constant cannot hold them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from posenc_check.graph import ELEMENT_TYPES, Array, is_external, label, read_tensor

_SHAPING = {"Unsqueeze", "Reshape", "Expand", "Cast", "Transpose", "Identity"}
_PRODUCT = {"Mul", "MatMul"}
_AFTER = {"Concat", "Reshape", "Transpose", "Unsqueeze", "Cast", "Identity"}
_FLOATS = ("float32", "float16", "bfloat16", "float64")
LENGTH_DEPENDENT = ("dynamic", "longrope")


@dataclass(frozen=True)
class FrequencyConstant:
    """RoPE's inverse frequencies as the graph holds them, turned into cos/sin in the graph.

    `node`: what `nodes=` selects: the initializer's name (`source` "initializer"), the
    `Constant` node's name ("constant") or the name of the node computing the values
    ("computed"); `value`: the value name the product reads them through; `width`: d/2 (0 when
    `problem`); `dtype`; `shape` as stored; `product`: the node multiplying positions by them;
    `cos`, `sin`: the nodes it reaches; `ops`: the op types computing them ("computed"); `problem`:
    why they cannot be replaced (None when they can)."""

    node: str
    width: int
    dtype: str | None
    shape: tuple[int, ...]
    product: str
    cos: str
    sin: str
    source: str = "initializer"
    value: str = ""
    ops: tuple[str, ...] = ()
    problem: str | None = None


def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[int, onnx.NodeProto]]]:
    found: dict[str, list[tuple[int, onnx.NodeProto]]] = {}
    for index, node in enumerate(graph.node):
        for name in node.input:
            if name:
                found.setdefault(name, []).append((index, node))
    return found


def _reach(
    start: str, consumers: dict[str, list[tuple[int, onnx.NodeProto]]], through: set[str]
) -> list[tuple[int, onnx.NodeProto]]:
    """Nodes reached from value `start` through `through` ops (those not in it are returned)."""
    ends: list[tuple[int, onnx.NodeProto]] = []
    seen: set[str] = set()
    stack = [start]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for index, node in consumers.get(name, []):
            if node.op_type in through:
                stack.extend(output for output in node.output if output)
            else:
                ends.append((index, node))
    return ends


class _Graph:
    """The main graph's producers, and which values are constant (computed from initializers
    and `Constant` nodes only)."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.initializers = {t.name: t for t in graph.initializer}
        self.producer: dict[str, tuple[int, onnx.NodeProto]] = {
            output: (index, node)
            for index, node in enumerate(graph.node)
            for output in node.output
            if output
        }
        self._constant: dict[str, bool] = {}

    def constant(self, name: str) -> bool:
        """Whether value `name` depends on no graph input (iteratively: graphs are deep)."""
        stack = [name]
        while stack:
            value = stack[-1]
            if value in self._constant:
                stack.pop()
                continue
            if value in self.initializers:
                self._constant[value] = True
                stack.pop()
                continue
            found = self.producer.get(value)
            if (
                found is None
                or found[1].op_type == "Shape"
                or any(a.type == onnx.AttributeProto.GRAPH for a in found[1].attribute)
            ):
                self._constant[value] = False
                stack.pop()
                continue
            pending = [i for i in found[1].input if i and i not in self._constant]
            if pending:
                stack.extend(pending)
                continue
            self._constant[value] = all(self._constant[i] for i in found[1].input if i)
            stack.pop()
        return self._constant[name]

    def base(self, name: str) -> str:
        """The value `name` is a reshaping of (back through `_SHAPING` ops)."""
        while (found := self.producer.get(name)) is not None and found[1].op_type in _SHAPING:
            name = found[1].input[0]
        return name

    def ancestors(self, name: str) -> list[tuple[int, onnx.NodeProto]]:
        """The nodes computing value `name`, in graph order."""
        seen: dict[int, onnx.NodeProto] = {}
        stack = [name]
        while stack:
            found = self.producer.get(stack.pop())
            if found is None or found[0] in seen:
                continue
            seen[found[0]] = found[1]
            stack.extend(i for i in found[1].input if i)
        return sorted(seen.items())

    def evaluate(self, name: str, opsets: Iterable[onnx.OperatorSetIdProto]) -> Array:
        """The values of constant value `name` (onnx's reference evaluator on its ancestors)."""
        from onnx.reference import ReferenceEvaluator

        nodes = [node for _, node in self.ancestors(name)]
        needed = {i for node in nodes for i in node.input if i in self.initializers}
        external = sorted(i for i in needed if is_external(self.initializers[i]))
        if external:
            raise ValueError(f"its inputs {external} are stored in external data")
        graph = onnx.helper.make_graph(
            nodes,
            "frequencies",
            [],
            [onnx.helper.make_empty_tensor_value_info(name)],
            [self.initializers[i] for i in sorted(needed)],
        )
        model = onnx.helper.make_model(graph, opset_imports=list(opsets))
        outputs: Any = ReferenceEvaluator(model).run(None, {})
        return np.asarray(outputs[0])


def _describe(
    graph: _Graph,
    opsets: Iterable[onnx.OperatorSetIdProto],
    frequencies: str,
    product: str,
    cos: str,
    sin: str,
) -> FrequencyConstant:
    base = graph.base(frequencies)
    if base in graph.initializers:
        tensor = graph.initializers[base]
        dims = tuple(int(d) for d in tensor.dims)
        return _checked(base, base, ELEMENT_TYPES.get(tensor.data_type), dims, product, cos, sin)
    index, node = graph.producer[base]
    if node.op_type == "Constant":
        values = numpy_helper.to_array(node.attribute[0].t) if node.attribute else np.zeros(0)
        dtype = ELEMENT_TYPES.get(
            node.attribute[0].t.data_type if node.attribute else 0, str(values.dtype)
        )
        return _checked(
            label(node, index), base, dtype, values.shape, product, cos, sin, "constant"
        )
    ops = tuple(dict.fromkeys(n.op_type for _, n in graph.ancestors(base)))
    name = label(node, index)
    if len(node.output) != 1:
        return FrequencyConstant(
            name, 0, None, (), product, cos, sin, "computed", base, ops,
            f"frequencies computed by {name!r} ({node.op_type}, {len(node.output)} outputs): "
            "only a node of one output can be replaced",
        )  # fmt: skip
    try:
        values = graph.evaluate(base, opsets)
    except Exception as err:  # the reference evaluator raises what the op raises
        return FrequencyConstant(
            name, 0, None, (), product, cos, sin, "computed", base, ops,
            f"frequencies computed by {name!r} ({', '.join(ops)}) cannot be evaluated: {err}",
        )  # fmt: skip
    computed = ELEMENT_TYPES.get(onnx.helper.np_dtype_to_tensor_dtype(values.dtype))
    return _checked(name, base, computed, values.shape, product, cos, sin, "computed", ops)


def _checked(
    node: str,
    value: str,
    dtype: str | None,
    shape: tuple[int, ...],
    product: str,
    cos: str,
    sin: str,
    source: str = "initializer",
    ops: tuple[str, ...] = (),
) -> FrequencyConstant:
    wide = [d for d in shape if d != 1]
    problem = None
    if dtype not in _FLOATS or len(wide) != 1:
        problem = (
            f"{product!r} multiplies the positions by {node!r} ({dtype} {list(shape)}) into "
            f"{cos!r} and {sin!r}: not a vector of frequencies"
        )
    width = wide[0] if len(wide) == 1 else 0
    return FrequencyConstant(
        node, width, dtype, shape, product, cos, sin, source, value, ops, problem
    )


def find_frequency_constants(proto: onnx.ModelProto) -> list[FrequencyConstant]:
    """Every RoPE computation of the main graph from frequencies (see the module doc), in graph
    order of their products; those that cannot be replaced carry a `problem`."""
    graph = _Graph(proto.graph)
    consumers = _consumers(proto.graph)
    found: dict[str, FrequencyConstant] = {}
    for index, product in enumerate(proto.graph.node):
        if product.op_type not in _PRODUCT or len(product.input) != 2:
            continue
        ends = [(i, n) for output in product.output for i, n in _reach(output, consumers, _AFTER)]
        cos = next((label(n, i) for i, n in ends if n.op_type == "Cos"), None)
        sin = next((label(n, i) for i, n in ends if n.op_type == "Sin"), None)
        if not (cos and sin):
            continue
        name = label(product, index)
        # the values matter, not the shapes: an Expand to the batch reads the input's shape
        constant = [graph.constant(graph.base(value)) for value in product.input]
        if constant == [False, False]:
            ops = tuple(dict.fromkeys(n.op_type for _, n in graph.ancestors(product.input[1])))
            found[name] = FrequencyConstant(
                name, 0, None, (), name, cos, sin, "computed", product.input[1], ops,
                f"{name!r} multiplies two values that depend on the model's inputs into {cos!r} "
                f"and {sin!r} (frequencies computed from the length? {', '.join(ops[:6])}): "
                "no constant frequencies to replace",
            )  # fmt: skip
        elif constant != [True, True]:
            frequencies = product.input[constant.index(True)]
            described = _describe(graph, proto.opset_import, frequencies, name, cos, sin)
            if described.node not in found:
                found[described.node] = described
    return list(found.values())


def frequency_values(
    model: onnx.ModelProto, constant: FrequencyConstant, data_dir: str | os.PathLike[str] | None
) -> Array:
    """The frequencies the graph computes with at `constant`: the initializer's values (read from
    external data in `data_dir` when stored there), the `Constant`'s, or the computed ones
    (onnx's reference evaluator)."""
    if constant.problem is not None:
        raise ValueError(constant.problem)
    graph = _Graph(model.graph)
    if constant.source == "initializer":
        return read_tensor(graph.initializers[constant.value or constant.node], data_dir)
    return graph.evaluate(constant.value, model.opset_import)
