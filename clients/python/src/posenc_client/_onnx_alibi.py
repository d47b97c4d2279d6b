"""The ALiBi bias subgraph into ONNX models: `find_alibi_consumers` and `attach_alibi_bias`, a
`Patcher` (find, check, apply) whose consumers are the attention nodes with an additive-bias
input."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import onnx

from posenc_check.graph import (
    MICROSOFT,
    attribute,
    domain,
    label,
    matching_nodes,
    node_input,
    op_name,
)
from posenc_client._exceptions import IncompatibleModelError
from posenc_client._onnx_merge import merge_subgraph
from posenc_client._onnx_patch import (
    GraphSources,
    ModelLike,
    Patcher,
    ValueTypes,
    load_model,
    patch,
    record_metadata,
    value_info,
)


@dataclass(frozen=True)
class AlibiConsumer:
    """A node with an additive-bias input: ONNX `Attention` (`attn_mask`, input 3),
    `com.microsoft.MultiHeadAttention` (`attention_bias`, 5) or `GroupQueryAttention` (10).
    `slot` is the tensor name there ("" when the optional input is left out)."""

    node: str
    op: str
    index: int
    slot: str
    dtype: str | None
    num_heads: int | None


_BIAS_SLOTS: dict[tuple[str, str], int] = {
    ("", "Attention"): 3,
    (MICROSOFT, "MultiHeadAttention"): 5,
    (MICROSOFT, "GroupQueryAttention"): 10,
}


def find_alibi_consumers(model: ModelLike) -> list[AlibiConsumer]:
    """Every node of the main graph that can take an additive attention bias."""
    proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
    types = ValueTypes(proto)
    out: list[AlibiConsumer] = []
    for index, node, slot in matching_nodes(proto.graph, _BIAS_SLOTS):
        query = node_input(node, 0)
        heads_attribute = "q_num_heads" if node.op_type == "Attention" else "num_heads"
        heads = int(attribute(node, heads_attribute, 0) or 0) or None
        if heads is None and node.op_type == "Attention" and types.rank(query) == 4:
            heads = types.dim(query, 1)
        out.append(
            AlibiConsumer(
                node=label(node, index),
                op=op_name(node),
                index=index,
                slot=node_input(node, slot),
                dtype=types.dtype(query),
                num_heads=heads,
            )
        )
    return out


def _rename_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name == old:
                node.input[index] = new


class _AlibiBias(Patcher[AlibiConsumer]):
    """The served `alibi/bias` subgraph merged into the model, its `bias` output feeding every
    attention node's bias slot (replacing that graph input or filling the empty slot)."""

    consumer_name = "attention node"
    no_consumer = (
        "the model has no node taking an additive bias (Attention, "
        "com.microsoft.MultiHeadAttention, com.microsoft.GroupQueryAttention)"
    )
    action = "attach the ALiBi bias"

    def __init__(
        self, subgraph: onnx.ModelProto, inputs: Mapping[str, str] | None, prefix: str
    ) -> None:
        self.subgraph = subgraph
        self.metadata = {item.key: item.value for item in subgraph.metadata_props}
        graph_name = self.metadata.get("posenc.graph")
        if graph_name is not None and graph_name != "alibi/bias":
            raise IncompatibleModelError(f"expected the alibi/bias subgraph, got {graph_name}")
        output = next((value for value in subgraph.graph.output if value.name == "bias"), None)
        if output is None:
            raise IncompatibleModelError("the subgraph has no output named 'bias'")
        self.bias = value_info(output.type)
        shape = self.bias.shape
        self.heads = shape[1] if shape and len(shape) == 4 else None
        self.links = dict(inputs or {})
        self.prefix = prefix
        self.targets: list[str] = []
        """The graph inputs the bias replaces, filled by `check`."""
        self.empty: list[AlibiConsumer] = []
        """The consumers whose empty bias slot it fills, filled by `check`."""

    def find(self, model: onnx.ModelProto) -> list[AlibiConsumer]:
        return find_alibi_consumers(model)

    def check(self, consumer: AlibiConsumer, sources: GraphSources) -> list[str]:
        problems: list[str] = []
        where = f"{consumer.op} node {consumer.node!r}"
        bias_dtype = self.bias.dtype
        if consumer.dtype is not None and bias_dtype is not None and consumer.dtype != bias_dtype:
            problems.append(
                f"{where} computes in {consumer.dtype}; the bias subgraph outputs {bias_dtype}: "
                f"export it with dtype={consumer.dtype!r}"
            )
        heads = self.heads
        if (
            isinstance(heads, int)
            and consumer.num_heads is not None
            and heads != consumer.num_heads
        ):
            problems.append(
                f"{where} has {consumer.num_heads} heads; the bias has {heads}: export it for "
                f"num_heads={consumer.num_heads} (or the tp_size/tp_rank slice)"
            )
        if not consumer.slot:
            self.empty.append(consumer)
        elif consumer.slot in sources.inputs and consumer.slot not in sources.initializers:
            if consumer.slot not in self.targets:
                self.targets.append(consumer.slot)
        else:
            source = sources.produced.get(consumer.slot, "an initializer")
            problems.append(
                f"{where}: its bias input {consumer.slot!r} comes from {source!r}; "
                "attach_alibi_bias replaces a graph input or fills an empty slot (add the two "
                "yourself with merge_subgraph)"
            )
        return problems

    def check_model(self, sources: GraphSources) -> list[str]:
        """The `inputs=` links: subgraph inputs it names, model values it reads them from."""
        problems: list[str] = []
        subgraph_inputs = {value.name for value in self.subgraph.graph.input}
        known = sources.inputs | sources.initializers | set(sources.produced)
        for name, existing in self.links.items():
            if name not in subgraph_inputs:
                problems.append(
                    f"the subgraph has no input {name!r}; it has {sorted(subgraph_inputs)}"
                )
            if existing not in known:
                problems.append(f"inputs maps {name!r} to {existing!r}, which the model lacks")
        return problems

    def apply(self, model: onnx.ModelProto, consumers: list[AlibiConsumer]) -> onnx.ModelProto:
        prefix = self.prefix
        merged = merge_subgraph(
            model, self.subgraph, [("bias", target) for target in self.targets], prefix
        )
        graph = merged.graph
        output = f"{prefix}bias"
        first = len(graph.node) - len(model.graph.node)  # merge_models puts the subgraph first
        for consumer in self.empty:
            node = graph.node[first + consumer.index]
            slot = _BIAS_SLOTS[(domain(node), node.op_type)]
            while len(node.input) <= slot:
                node.input.append("")
            node.input[slot] = output
        for name, existing in self.links.items():
            _rename_uses(graph, f"{prefix}{name}", existing)
            keep = [value for value in graph.input if value.name != f"{prefix}{name}"]
            del graph.input[:]
            graph.input.extend(keep)
        record_metadata(merged, "posenc.tables", {output: self.metadata.get("posenc.key", "")})
        onnx.checker.check_model(merged)
        return merged


def attach_alibi_bias(
    model: ModelLike,
    bias: ModelLike,
    *,
    nodes: Iterable[str] | None = None,
    inputs: Mapping[str, str] | None = None,
    prefix: str = "posenc_alibi/",
) -> onnx.ModelProto:
    """A copy of `model` whose attention nodes add the served ALiBi bias.

    Args:
        model: a model with ONNX `Attention`, `com.microsoft.MultiHeadAttention` or
            `GroupQueryAttention` nodes; each one's bias slot must be a graph input (replaced by
            the subgraph's output) or empty (filled).
        bias: the `alibi/bias` subgraph (`Client.onnx(spec, graph="bias", opset=...)`) in the
            model's activation dtype (`spec["dtype"]`) with the model's number of heads.
        nodes: only these node names (default: every attention node).
        inputs: subgraph input -> an existing model value to read it from (for example
            `{"query_positions": "position_ids_1d"}`); the others become model inputs named
            `<prefix><name>` (`query_positions`/`key_positions` int64 [Q]/[K], or
            `past_length`/`query_length` int64 scalars).
        prefix: prefix of every subgraph name in the result.

    Raises `IncompatibleModelError` on a dtype or head-count mismatch, a bias slot computed in
    the graph, or unknown names.
    """
    proto = load_model(model)
    return patch(proto, _AlibiBias(load_model(bias), inputs, prefix), nodes)
