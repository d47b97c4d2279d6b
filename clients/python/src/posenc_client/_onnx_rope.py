"""RoPE caches into ONNX models: `find_rope_consumers` and `attach_rope_caches`, a `Patcher`
(find, check, apply) whose consumers are the nodes reading cos/sin caches. What each consumer
needs is tabled in `posenc_client.onnx`'s module docstring."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from posenc_check.graph import MICROSOFT, attribute, domain, label, node_input, op_name
from posenc_check.rope import BranchValue, LengthSwitch, RopeSlots, length_switch, rope_readers
from posenc_client._exceptions import IncompatibleModelError
from posenc_client._formats import Array, dtype_name
from posenc_client._onnx_patch import (
    GraphSources,
    ModelLike,
    Patcher,
    ValueTypes,
    cast_array,
    load_model,
    patch,
    place_initializer,
    record_metadata,
)
from posenc_client._tables import Tables


@dataclass(frozen=True)
class RopeConsumer:
    """A node that reads cos/sin caches, and what it requires of them.

    `op` is `RotaryEmbedding`, `com.microsoft.RotaryEmbedding` or
    `com.microsoft.GroupQueryAttention`; `rotary_dim` is the rotated width d when it can be read
    from the attributes or the declared shapes (None when unknown); `dtype` the activation dtype
    (None when unknown); `rows` the cache rows the model declares (None when dynamic)."""

    node: str
    op: str
    cos: str
    sin: str
    interleaved: bool
    dtype: str | None
    head_size: int | None
    rotary_dim: int | None
    rows: int | None
    has_position_ids: bool


def _head_size(node: onnx.NodeProto, activation: str, types: ValueTypes) -> int | None:
    """Head size of a RoPE consumer from its activation's declared shape and attributes."""
    rank = types.rank(activation)
    if node.op_type == "GroupQueryAttention":
        hidden = types.dim(activation, -1)
        heads = int(attribute(node, "num_heads", 0) or 0)
        kv_heads = int(attribute(node, "kv_num_heads", 0) or 0)
        if hidden is None or heads <= 0:
            return None
        if not node_input(node, 1):  # packed QKV: (num_heads + 2 * kv_num_heads) * head_size
            heads += 2 * kv_heads
        return hidden // heads if hidden % heads == 0 else None
    if rank == 4:
        return types.dim(activation, 3)
    if rank == 3:
        hidden = types.dim(activation, 2)
        heads = int(attribute(node, "num_heads", 0) or 0)
        if hidden is not None and heads > 0 and hidden % heads == 0:
            return hidden // heads
    return None


def _rope_consumer(
    index: int, node: onnx.NodeProto, slots: RopeSlots, types: ValueTypes
) -> RopeConsumer:
    activation = node_input(node, slots.activation)
    cos, sin = node_input(node, slots.cos), node_input(node, slots.sin)
    head = _head_size(node, activation, types)
    if node.op_type == "GroupQueryAttention":
        width = types.dim(cos, 1)
        rotary_dim = 2 * width if width is not None else None
    else:
        rotary_dim = int(attribute(node, "rotary_embedding_dim", 0) or 0) or head
    return RopeConsumer(
        node=label(node, index),
        op=op_name(node),
        cos=cos,
        sin=sin,
        interleaved=bool(attribute(node, slots.interleaved_attribute, 0)),
        dtype=types.dtype(activation),
        head_size=head,
        rotary_dim=rotary_dim,
        rows=types.dim(cos, 0),
        has_position_ids=bool(node_input(node, 3)) if domain(node) == "" else True,
    )


def find_rope_consumers(model: ModelLike) -> list[RopeConsumer]:
    """Every node of the main graph that reads cos/sin caches (GroupQueryAttention only with
    `do_rotary=1`), with its requirements, in graph order."""
    proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
    types = ValueTypes(proto)
    return [
        _rope_consumer(index, node, slots, types)
        for index, node, slots in rope_readers(proto.graph)
    ]


def _half_caches(tables: Tables) -> tuple[Array, Array]:
    """The half-width (P, d/2) cos and sin caches of a rope table, or why it has none."""
    if tables.kind != "rope":
        raise IncompatibleModelError(f"attach_rope_caches takes a rope table, got {tables.kind}")
    if "cos" not in tables or "sin" not in tables:
        raise IncompatibleModelError(
            f"the table packs its caches as {list(tables)}; ONNX consumers need separate "
            "cos and sin: fetch with profile='onnx' or 'ort_gqa' (packing='separate', "
            "width='half')"
        )
    cos, sin = tables["cos"], tables["sin"]
    if tables.spec.get("width", "half") != "half" or cos.ndim != 2 or cos.shape != sin.shape:
        raise IncompatibleModelError(
            f"ONNX consumers take half-width caches (P, d/2); this table is "
            f"{tables.spec.get('width')} width {list(cos.shape)}: fetch with profile='onnx' "
            "or 'ort_gqa' (width='half')"
        )
    return cos, sin


class _RopeCaches(Patcher[RopeConsumer]):
    """Served half-width cos/sin caches into every RoPE consumer's cache inputs (graph inputs
    become initializers, initializers are replaced)."""

    consumer_name = "RoPE consumer"
    no_consumer = (
        "the model has no RoPE consumer (RotaryEmbedding, com.microsoft.RotaryEmbedding, "
        "com.microsoft.GroupQueryAttention with do_rotary=1)"
    )
    action = "attach the RoPE caches"

    def __init__(
        self,
        tables: Tables,
        *,
        cast: bool,
        check_pairing: bool,
        long_tables: Tables | None = None,
    ) -> None:
        self.cos, self.sin = _half_caches(tables)
        self.long = _half_caches(long_tables) if long_tables is not None else None
        self.tables = tables
        self.long_tables = long_tables
        self.rows, self.width = int(self.cos.shape[0]), int(self.cos.shape[1])
        self.dtype = dtype_name(self.cos.dtype)
        if self.long is not None and (
            self.long[0].shape[1] != self.width or dtype_name(self.long[0].dtype) != self.dtype
        ):
            raise IncompatibleModelError(
                f"the long table ({list(self.long[0].shape)}, {dtype_name(self.long[0].dtype)}) "
                f"and the short one ({list(self.cos.shape)}, {self.dtype}) differ in width or "
                "dtype"
            )
        self.cast = cast
        self.check_pairing = check_pairing
        self.graph = onnx.GraphProto()
        self.targets: dict[str, tuple[Array, str]] = {}
        """Cache name -> (values, dtype) to write, filled by `check`."""
        self.switches: dict[str, tuple[LengthSwitch, Array, Array, str]] = {}
        """Cache name made by a length `If` -> (switch, short values, long values, dtype)."""

    def find(self, model: onnx.ModelProto) -> list[RopeConsumer]:
        self.graph = model.graph
        return find_rope_consumers(model)

    def check(self, consumer: RopeConsumer, sources: GraphSources) -> list[str]:
        found = [
            *self._width_problems(consumer),
            *self._rows_dtype_pairing_problems(consumer),
            *self._slot_problems(consumer, sources),
        ]
        return found or self._claim(consumer)

    def _width_problems(self, consumer: RopeConsumer) -> list[str]:
        """What the consumer's op needs of the rotated width d = 2 * the table's width."""
        rotated = 2 * self.width
        problems: list[str] = []
        where = f"{consumer.op} node {consumer.node!r}"
        if consumer.op == "RotaryEmbedding" and not consumer.has_position_ids:
            problems.append(
                f"{where} has no position_ids input, so its caches are per batch (B, S, d/2), "
                "not position tables: give the node position_ids"
            )
        if consumer.op == f"{MICROSOFT}.GroupQueryAttention":
            if self.width % 8:
                problems.append(
                    f"{where} needs rotary_dim/2 to be a multiple of 8; the table has "
                    f"d/2 = {self.width}"
                )
            if consumer.head_size is not None:
                if consumer.head_size % 16:
                    problems.append(
                        f"{where} needs a head size that is a multiple of 16 with do_rotary=1, "
                        f"got {consumer.head_size}"
                    )
                if rotated > consumer.head_size:
                    problems.append(
                        f"{where}: the table rotates d = {rotated} dims, more than head_size "
                        f"{consumer.head_size}"
                    )
        elif consumer.rotary_dim is not None and consumer.rotary_dim != rotated:
            problems.append(
                f"{where} rotates {consumer.rotary_dim} dims (rotary_embedding_dim or head "
                f"size), the table has d = {rotated} (width {self.width}): fetch the table for "
                "this model's head_dim/rotary dim"
            )
        return problems

    def _rows_dtype_pairing_problems(self, consumer: RopeConsumer) -> list[str]:
        """The cache rows the model declares, its activation dtype and its pairing."""
        problems: list[str] = []
        where = f"{consumer.op} node {consumer.node!r}"
        if consumer.rows is not None and self.rows < consumer.rows:
            problems.append(
                f"{where}: the model declares {consumer.rows} cache rows, the table has "
                f"{self.rows}: fetch with max_positions >= {consumer.rows}"
            )
        if consumer.dtype is not None and consumer.dtype != self.dtype and not self.cast:
            problems.append(
                f"{where} computes in {consumer.dtype} and needs caches of the same dtype; the "
                f"table is {self.dtype}: fetch with dtype={consumer.dtype!r} (or pass cast=True)"
            )
        table_interleaved = bool(self.tables.spec.get("interleaved", False))
        if self.check_pairing and consumer.interleaved != table_interleaved:
            node_pairs = "interleaved" if consumer.interleaved else "half-split"
            table_pairs = "interleaved" if table_interleaved else "half-split"
            problems.append(
                f"{where} rotates {node_pairs} pairs but the table was resolved for "
                f"{table_pairs} pairs (the model's config and the graph disagree; pass "
                "check_pairing=False if the graph is right: half-width values are the same for "
                "both)"
            )
        return problems

    def _slot_problems(self, consumer: RopeConsumer, sources: GraphSources) -> list[str]:
        """Whether the consumer's cache inputs are values this patcher can replace: graph
        inputs, initializers, or the constants of a length `If` (both branches)."""
        problems: list[str] = []
        where = f"{consumer.op} node {consumer.node!r}"
        for name, is_cos in ((consumer.cos, True), (consumer.sin, False)):
            if not name:
                problems.append(f"{where} has no cache input to fill")
            elif name in sources.produced and name not in sources.initializers:
                problems.extend(self._switch_problems(consumer, name, is_cos, sources))
            elif name not in sources.inputs and name not in sources.initializers:
                problems.append(f"{where}: no graph input or initializer {name!r}")
        if consumer.cos == consumer.sin and consumer.cos:
            problems.append(f"{where} reads one tensor {consumer.cos!r} as both cos and sin")
        return problems

    def _switch_problems(
        self, consumer: RopeConsumer, name: str, is_cos: bool, sources: GraphSources
    ) -> list[str]:
        """`name` is computed: fine when a length `If` chooses it between two constants and a
        long table was given, whose length sides match the switch."""
        where = f"{consumer.op} node {consumer.node!r}"
        switch = length_switch(self.graph, name)
        if switch is None:
            return [
                f"{where}: {name!r} is computed by node {sources.produced[name]!r}; only graph "
                "inputs, initializers and the constants of a length If can be replaced"
            ]
        if isinstance(switch, str):
            return [f"{where}: {switch}"]
        if self.long_tables is None:
            return [
                f"{where}: {name!r} is chosen by If node {switch.node!r} on length > "
                f"{switch.threshold} (LongRoPE's short and long caches): give the table past "
                "the switch too (long_tables=; the CLI fetches both)"
            ]
        problems = []
        for tables, side, value in (
            (self.tables, "short", switch.short),
            (self.long_tables, "long", switch.long),
        ):
            seq_len = tables.spec.get("seq_len")
            long_side = isinstance(seq_len, int) and seq_len > switch.threshold
            if isinstance(seq_len, int) and long_side != (side == "long"):
                problems.append(
                    f"{where}: If node {switch.node!r} takes the {side} cache for length "
                    f"{'>' if side == 'long' else '<='} {switch.threshold}, the {side} table "
                    f"was computed for seq_len {seq_len}"
                )
            declared = tuple(value.tensor.dims)
            rows = int(tables["cos"].shape[0])
            if declared and rows < declared[0]:
                problems.append(
                    f"{where}: the {side} branch of If node {switch.node!r} holds "
                    f"{declared[0]} rows, the {side} table {rows}: fetch with max_positions >= "
                    f"{declared[0]}"
                )
        if not problems and self.long is not None:
            short = self.cos if is_cos else self.sin
            long = self.long[0] if is_cos else self.long[1]
            dtype = consumer.dtype if (self.cast and consumer.dtype) else self.dtype
            self.switches[name] = (switch, short, long, dtype)
        return problems

    def _claim(self, consumer: RopeConsumer) -> list[str]:
        """Record the consumer's caches in `targets`; a cache another consumer reads in
        another dtype is a problem."""
        dtype = consumer.dtype if (self.cast and consumer.dtype) else self.dtype
        problems: list[str] = []
        for name, array in ((consumer.cos, self.cos), (consumer.sin, self.sin)):
            if name in self.switches:
                continue
            previous = self.targets.get(name)
            if previous is not None and previous[1] != dtype:
                problems.append(f"{name!r} is read in both {previous[1]} and {dtype}")
            self.targets[name] = (array, dtype)
        return problems

    def check_model(self, sources: GraphSources) -> list[str]:
        if self.long_tables is not None and not self.switches:
            return [
                "a long table was given but no cache is chosen by a length If: plug the one "
                "table for the model's length instead"
            ]
        return []

    def apply(self, model: onnx.ModelProto, consumers: list[RopeConsumer]) -> onnx.ModelProto:
        for name, (array, dtype) in self.targets.items():
            value = array if dtype == self.dtype else cast_array(array, dtype)
            place_initializer(model.graph, name, value)
        keys = {name: self.tables.key for name in self.targets}
        for name, (switch, short, long, dtype) in self.switches.items():
            for branch, values in ((switch.short, short), (switch.long, long)):
                cast = values if dtype == self.dtype else cast_array(values, dtype)
                _replace_branch_value(branch, cast)
            long_key = self.long_tables.key if self.long_tables else ""
            keys[name] = f"{self.tables.key} if length <= {switch.threshold} else {long_key}"
        record_metadata(model, "posenc.tables", keys)
        return model


def _replace_branch_value(value: BranchValue, array: Array) -> None:
    """Put `array` in place of a branch's constant (a `Constant`'s `value` or a branch
    initializer) and declare its new shape on the branch output."""
    tensor = numpy_helper.from_array(np.ascontiguousarray(array), value.tensor.name)
    value.tensor.CopyFrom(tensor)
    output = value.graph.output[value.output]
    if output.type.HasField("tensor_type") and output.type.tensor_type.HasField("shape"):
        shape = output.type.tensor_type.shape
        del shape.dim[:]
        for size in array.shape:
            shape.dim.add().dim_value = int(size)


def attach_rope_caches(
    model: ModelLike,
    tables: Tables,
    *,
    nodes: Iterable[str] | None = None,
    cast: bool = False,
    check_pairing: bool = True,
    long_tables: Tables | None = None,
) -> onnx.ModelProto:
    """A copy of `model` whose RoPE consumers read the served `cos`/`sin` caches.

    Args:
        model: the model; its consumers' cos/sin caches must be graph inputs (they become
            initializers), initializers (replaced), or the two constants of an `If` on the
            length (`LengthSwitch`: onnxruntime-genai's LongRoPE caches; both are replaced). A
            path is read without its external data (write the result with `save_model`).
        tables: a `rope` table with separate half-width caches: fetch it with `profile="onnx"`
            (RotaryEmbedding) or `profile="ort_gqa"` (GroupQueryAttention), and the model's
            activation dtype (`dtype=`).
        nodes: only these node names (default: every consumer).
        cast: convert the caches to the activation dtype instead of refusing (rounding once, as
            the server would when computing in fp32 and casting last).
        check_pairing: refuse a table resolved for the other pairing (see the module doc).
        long_tables: with a length switch, the table past it (`tables` is then the one for
            lengths up to the switch: LongRoPE's short factors; their `seq_len` must lie on
            those sides).

    Records `{cos_name: key, sin_name: key}` in metadata property `posenc.tables`. Raises
    `IncompatibleModelError` listing every problem found.
    """
    proto = load_model(model)
    patcher = _RopeCaches(tables, cast=cast, check_pairing=check_pairing, long_tables=long_tables)
    return patch(proto, patcher, nodes)
