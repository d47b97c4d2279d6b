"""RoPE computed inside the graph from a frequency constant: `find_frequency_constants` and
`attach_inv_freq`, a `Patcher` whose consumers are the constants.

`torch.onnx.export` (dynamo, torch 2.13) of a transformers model keeps the rotary module's
`inv_freq` buffer as an initializer (`model.rotary_emb.inv_freq`, (d/2,)) and computes
`cos(cat(p * inv, p * inv)) * A`, `sin(...) * A` in the graph, A folded as a constant: there are
no caches to replace, only the frequencies. A constant is taken for one when it is a float
initializer of shape (d/2,) (or with unit dims around it) from which a chain of
Unsqueeze/Reshape/Expand/Cast/Transpose leads to a Mul or MatMul whose result, through
Concat/Reshape/Transpose/Unsqueeze/Cast, reaches both a Cos and a Sin. Length-dependent
frequencies (dynamic NTK, LongRoPE) cannot be one constant and are refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from posenc_check.graph import label
from posenc_client._exceptions import IncompatibleModelError
from posenc_client._models import Tables
from posenc_client._onnx_patch import (
    ELEMENT_TYPES,
    GraphSources,
    ModelLike,
    Patcher,
    cast_array,
    load_model,
    patch,
    record_metadata,
)

_SHAPING = {"Unsqueeze", "Reshape", "Expand", "Cast", "Transpose", "Identity"}
_PRODUCT = {"Mul", "MatMul"}
_AFTER = {"Concat", "Reshape", "Transpose", "Unsqueeze", "Cast", "Identity"}
LENGTH_DEPENDENT = ("dynamic", "longrope")


@dataclass(frozen=True)
class FrequencyConstant:
    """An initializer holding RoPE's inverse frequencies that the graph turns into cos/sin.

    `node`: the initializer's name (what `nodes=` selects); `width`: d/2; `dtype`; `shape` as
    stored; `product`: the node multiplying positions by it; `cos`, `sin`: the nodes it
    reaches."""

    node: str
    width: int
    dtype: str | None
    shape: tuple[int, ...]
    product: str
    cos: str
    sin: str


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


def find_frequency_constants(model: ModelLike) -> list[FrequencyConstant]:
    """Every frequency constant of the main graph (see the module doc), in initializer order."""
    proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
    graph = proto.graph
    consumers = _consumers(graph)
    found: list[FrequencyConstant] = []
    for initializer in graph.initializer:
        dtype = ELEMENT_TYPES.get(initializer.data_type)
        dims = tuple(int(d) for d in initializer.dims)
        wide = [d for d in dims if d != 1]
        if dtype not in ("float32", "float16", "bfloat16", "float64") or len(wide) != 1:
            continue
        for index, product in _reach(initializer.name, consumers, _SHAPING):
            if product.op_type not in _PRODUCT:
                continue
            ends = [
                (i, n) for output in product.output for i, n in _reach(output, consumers, _AFTER)
            ]
            cos = next((label(n, i) for i, n in ends if n.op_type == "Cos"), None)
            sin = next((label(n, i) for i, n in ends if n.op_type == "Sin"), None)
            if cos and sin:
                found.append(
                    FrequencyConstant(
                        initializer.name, wide[0], dtype, dims, label(product, index), cos, sin
                    )
                )
                break
    return found


class _InvFreq(Patcher[FrequencyConstant]):
    """The served `inv_freq` in place of every frequency constant."""

    consumer_name = "frequency constant"
    no_consumer = (
        "the model has no RoPE frequency constant (an initializer of d/2 values multiplied by "
        "positions into a Cos and a Sin)"
    )
    action = "attach the RoPE frequencies"

    def __init__(self, tables: Tables) -> None:
        if tables.kind != "rope" or "inv_freq" not in tables:
            raise IncompatibleModelError(
                f"attach_inv_freq takes a rope table with inv_freq, got {tables.kind} "
                f"{list(tables)}"
            )
        rope_type = str((tables.spec.get("rope_scaling") or {}).get("rope_type", "default"))
        if rope_type in LENGTH_DEPENDENT:
            raise IncompatibleModelError(
                f"{rope_type} frequencies depend on the sequence length: one constant in the "
                "graph cannot hold them (export with caches, or compute them per length)"
            )
        self.tables = tables
        self.inv_freq = np.asarray(tables["inv_freq"]).reshape(-1)

    def find(self, model: onnx.ModelProto) -> list[FrequencyConstant]:
        return find_frequency_constants(model)

    def check(self, consumer: FrequencyConstant, sources: GraphSources) -> list[str]:
        if consumer.width != self.inv_freq.size:
            return [
                f"frequency constant {consumer.node!r} (into {consumer.cos!r}, {consumer.sin!r})"
                f" has {consumer.width} frequencies (d = {2 * consumer.width}), the table "
                f"{self.inv_freq.size}: fetch the table for this model's rotary dim"
            ]
        return []

    def apply(self, model: onnx.ModelProto, consumers: list[FrequencyConstant]) -> onnx.ModelProto:
        names = {consumer.node: consumer for consumer in consumers}
        for initializer in model.graph.initializer:
            consumer = names.get(initializer.name)
            if consumer is None:
                continue
            values = cast_array(self.inv_freq, consumer.dtype or "float32")
            initializer.CopyFrom(
                numpy_helper.from_array(values.reshape(consumer.shape), initializer.name)
            )
        record_metadata(model, "posenc.tables", {name: self.tables.key for name in names})
        return model


def attach_inv_freq(
    model: ModelLike, tables: Tables, *, nodes: Iterable[str] | None = None
) -> onnx.ModelProto:
    """A copy of `model` whose in-graph RoPE computes with the served `inv_freq` (the table's
    inverse frequencies, in each constant's dtype and shape). `nodes`: only these constants
    (initializer names). Records `{name: key}` in metadata `posenc.tables`; raises
    `IncompatibleModelError` listing every problem."""
    return patch(load_model(model), _InvFreq(tables), nodes)
