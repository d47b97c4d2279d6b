"""`attach_inv_freq`: the served `inv_freq` in place of the RoPE frequency constants a model
computes cos/sin from (`posenc_check.freq` finds them; its docstring says how each exporter
stores them)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import numpy_helper

from posenc_check.freq import LENGTH_DEPENDENT, FrequencyConstant
from posenc_check.freq import find_frequency_constants as _find
from posenc_client._exceptions import IncompatibleModelError
from posenc_client._onnx_patch import (
    GraphSources,
    ModelLike,
    Patcher,
    cast_array,
    load_model,
    patch,
    record_metadata,
)
from posenc_client._tables import Tables

__all__ = ["FrequencyConstant", "attach_inv_freq", "find_frequency_constants"]


def find_frequency_constants(model: ModelLike) -> list[FrequencyConstant]:
    """Every RoPE computation of the main graph from frequencies (`posenc_check.freq`), in graph
    order of their products; those that cannot be replaced carry a `problem`."""
    return _find(model if isinstance(model, onnx.ModelProto) else load_model(model))


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
        if consumer.problem is not None:
            return [consumer.problem]
        if consumer.width != self.inv_freq.size:
            return [
                f"frequency constant {consumer.node!r} (into {consumer.cos!r}, {consumer.sin!r})"
                f" has {consumer.width} frequencies (d = {2 * consumer.width}), the table "
                f"{self.inv_freq.size}: fetch the table for this model's rotary dim"
            ]
        return []

    def apply(self, model: onnx.ModelProto, consumers: list[FrequencyConstant]) -> onnx.ModelProto:
        """Initializers are rewritten in place; a `Constant` node or the node computing the
        values becomes a `Constant` node of the same name and output (what computed its
        inputs is left to the runtime's dead-node elimination)."""
        values = {
            consumer.value or consumer.node: (
                consumer,
                cast_array(self.inv_freq, consumer.dtype or "float32").reshape(consumer.shape),
            )
            for consumer in consumers
        }
        for initializer in model.graph.initializer:
            if initializer.name in values:
                array = values[initializer.name][1]
                initializer.CopyFrom(numpy_helper.from_array(array, initializer.name))
        for index, node in enumerate(model.graph.node):
            output = next((o for o in node.output if o in values), None)
            if output is None:
                continue
            constant = onnx.helper.make_node(
                "Constant",
                [],
                [output],
                name=node.name,
                value=numpy_helper.from_array(values[output][1]),
            )
            model.graph.node[index].CopyFrom(constant)
        record_metadata(
            model, "posenc.tables", {consumer.node: self.tables.key for consumer in consumers}
        )
        return model


def attach_inv_freq(
    model: ModelLike, tables: Tables, *, nodes: Iterable[str] | None = None
) -> onnx.ModelProto:
    """A copy of `model` whose in-graph RoPE computes with the served `inv_freq` (the table's
    inverse frequencies, in each constant's dtype and shape). `nodes`: only these constants
    (`FrequencyConstant.node`: initializer or node names). Records `{name: key}` in metadata
    `posenc.tables`; raises `IncompatibleModelError` listing every problem."""
    return patch(load_model(model), _InvFreq(tables), nodes)
