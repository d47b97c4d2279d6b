"""The loop every ONNX patcher of `posenc_client.onnx` runs, and the graph reading and writing
they share.

A patcher plugs one kind of served value into a model as find, check, apply, the shape of
onnxscript's rewrite rules (pattern, check, rewrite): `find` lists the nodes that could take the
value, `check` says why one of them cannot, `apply` writes the value for all of them. `patch` runs
the three for every patcher alike: it restricts the nodes found to those the caller named, checks
each one, reports every problem at once in one `IncompatibleModelError`, and applies only when
there is none. A new exporter pattern is a new `Patcher` (a module beside `_onnx_rope.py` and
`_onnx_alibi.py`) and a public function in `posenc_client.onnx` that runs it.

Needs `onnx`; `posenc_client.onnx` says so when it is missing.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np
import onnx
from onnx import numpy_helper

from posenc_check.graph import ELEMENT_TYPES, label
from posenc_client._exceptions import IncompatibleModelError
from posenc_client._formats import Array
from posenc_client._onnx_files import load_graph
from posenc_client._onnx_model import OnnxModel

ModelLike = onnx.ModelProto | bytes | str | os.PathLike[str] | OnnxModel


def load_model(model: ModelLike) -> onnx.ModelProto:
    """A private copy of `model` (ModelProto, bytes, path or OnnxModel). A path is read without
    its external data: the weights stay on disk, their tensors keep naming their files
    (relative to the model's folder; write the result with `save_model` and that folder)."""
    out = onnx.ModelProto()
    if isinstance(model, onnx.ModelProto):
        out.CopyFrom(model)
    elif isinstance(model, OnnxModel):
        out.ParseFromString(model.data)
    elif isinstance(model, bytes):
        out.ParseFromString(model)
    else:
        out = load_graph(model)
    return out


# reading values -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ValueInfo:
    """A value's element type name and shape (ints, symbolic names, None for unknown dims), each
    None when undeclared."""

    dtype: str | None
    shape: tuple[int | str | None, ...] | None


def value_info(type_proto: onnx.TypeProto) -> ValueInfo:
    """The dtype and shape a `TypeProto` declares."""
    if not type_proto.HasField("tensor_type"):
        return ValueInfo(None, None)
    tensor_type = type_proto.tensor_type
    dtype = ELEMENT_TYPES.get(tensor_type.elem_type) if tensor_type.elem_type else None
    if not tensor_type.HasField("shape"):
        return ValueInfo(dtype, None)
    dims: list[int | str | None] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return ValueInfo(dtype, tuple(dims))


class ValueTypes:
    """Element types and shapes of the graph's values: declared ones, initializers, and what
    onnx shape inference adds (contrib ops are skipped by it, which is fine: activations feeding
    attention are usually produced by standard ops)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.values: dict[str, ValueInfo] = {}
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:  # inference is best effort: declared types still count
            inferred = model
        graph = inferred.graph
        for value in [*graph.value_info, *graph.output, *graph.input]:
            self.values[value.name] = value_info(value.type)
        for initializer in graph.initializer:
            self.values[initializer.name] = ValueInfo(
                ELEMENT_TYPES.get(initializer.data_type), tuple(initializer.dims)
            )

    def dtype(self, name: str) -> str | None:
        value = self.values.get(name)
        return value.dtype if value else None

    def shape(self, name: str) -> tuple[int | str | None, ...] | None:
        value = self.values.get(name)
        return value.shape if value else None

    def dim(self, name: str, axis: int) -> int | None:
        shape = self.shape(name)
        if shape is None or not -len(shape) <= axis < len(shape):
            return None
        dim = shape[axis]
        return dim if isinstance(dim, int) else None

    def rank(self, name: str) -> int | None:
        shape = self.shape(name)
        return None if shape is None else len(shape)


@dataclass(frozen=True)
class GraphSources:
    """Where the main graph's values come from: its inputs, its initializers, and the node
    (label) that produces each node output."""

    inputs: set[str]
    initializers: set[str]
    produced: dict[str, str]

    @classmethod
    def of(cls, graph: onnx.GraphProto) -> GraphSources:
        produced = {
            output: label(node, index)
            for index, node in enumerate(graph.node)
            for output in node.output
            if output
        }
        return cls(
            {value.name for value in graph.input},
            {initializer.name for initializer in graph.initializer},
            produced,
        )


# writing --------------------------------------------------------------------------------------


def cast_array(array: Array, dtype: str) -> Array:
    """`array` converted to the dtype named `dtype` (bfloat16 by ml_dtypes)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return array.astype(ml_dtypes.bfloat16)
    return array.astype(np.dtype(dtype))


def place_initializer(graph: onnx.GraphProto, name: str, array: Array) -> None:
    """`name` becomes an initializer holding `array` (no longer a graph input)."""
    for field in (graph.input, graph.initializer, graph.value_info):
        keep = [value for value in field if value.name != name]
        if len(keep) != len(field):
            del field[:]
            field.extend(keep)
    graph.initializer.append(numpy_helper.from_array(np.asarray(array, order="C"), name))


def record_metadata(model: onnx.ModelProto, key: str, entries: Mapping[str, str]) -> None:
    """Merge `entries` into the JSON object stored in metadata property `key`."""
    current: dict[str, Any] = {}
    properties = [item for item in model.metadata_props if item.key != key]
    for item in model.metadata_props:
        if item.key == key:
            try:
                current = dict(json.loads(item.value))
            except (ValueError, TypeError):
                current = {}
    current.update(entries)
    del model.metadata_props[:]
    model.metadata_props.extend(properties)
    entry = model.metadata_props.add()
    entry.key, entry.value = key, json.dumps(current, sort_keys=True)


# the loop -------------------------------------------------------------------------------------


class Consumer(Protocol):
    """What `patch` needs of a node a patcher found: its label (`nodes=` selects by it)."""

    @property
    def node(self) -> str: ...


ConsumerT = TypeVar("ConsumerT", bound=Consumer)


class Patcher(ABC, Generic[ConsumerT]):
    """One way of plugging a served value into a model: find, check, apply.

    An instance is built for one call, with the value (a table, a subgraph) and the options, and
    checks the value itself there (raising at once when no model could take it). `check` may
    remember what `apply` will write (an instance serves one `patch` only).
    """

    consumer_name: ClassVar[str]
    """How a node it finds is called in errors ("RoPE consumer")."""
    no_consumer: ClassVar[str]
    """The error when the model has no such node."""
    action: ClassVar[str]
    """What it does, in "cannot {action}:" ("attach the RoPE caches")."""

    @abstractmethod
    def find(self, model: onnx.ModelProto) -> list[ConsumerT]:
        """Every node of the main graph that could take the value, in graph order."""

    @abstractmethod
    def check(self, consumer: ConsumerT, sources: GraphSources) -> list[str]:
        """Why `consumer` cannot take the value (empty when it can)."""

    def check_model(self, sources: GraphSources) -> list[str]:
        """Problems that belong to no single node, found after every node was checked."""
        return []

    @abstractmethod
    def apply(self, model: onnx.ModelProto, consumers: list[ConsumerT]) -> onnx.ModelProto:
        """The patched model (`model` may be modified: it is `patch`'s private copy)."""


def select_consumers(
    consumers: list[ConsumerT], nodes: Iterable[str] | None, what: str, none: str
) -> list[ConsumerT]:
    """`consumers` restricted to the node names `nodes` (all when None); `IncompatibleModelError`
    for a name the model lacks (`what`: how such a node is called) or when none is left
    (`none`: the message)."""
    if nodes is not None:
        wanted = set(nodes)
        unknown = wanted - {consumer.node for consumer in consumers}
        if unknown:
            raise IncompatibleModelError(
                f"no {what} named {sorted(unknown)}; the model has "
                f"{[consumer.node for consumer in consumers]}"
            )
        consumers = [consumer for consumer in consumers if consumer.node in wanted]
    if not consumers:
        raise IncompatibleModelError(none)
    return consumers


def patch(
    model: onnx.ModelProto, patcher: Patcher[ConsumerT], nodes: Iterable[str] | None
) -> onnx.ModelProto:
    """Run `patcher` on `model` (a private copy, see `load_model`): find its nodes (only those
    named in `nodes` when given), check every one, raise one `IncompatibleModelError` listing
    every problem found (each once, in the order found), else apply."""
    consumers = select_consumers(
        patcher.find(model), nodes, patcher.consumer_name, patcher.no_consumer
    )
    sources = GraphSources.of(model.graph)
    problems: list[str] = []
    for consumer in consumers:
        problems.extend(patcher.check(consumer, sources))
    problems.extend(patcher.check_model(sources))
    if problems:
        raise IncompatibleModelError(
            f"cannot {patcher.action}:\n- " + "\n- ".join(dict.fromkeys(problems))
        )
    return patcher.apply(model, consumers)
