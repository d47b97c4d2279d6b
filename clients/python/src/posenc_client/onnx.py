"""Plug served tables and subgraphs into ONNX models that cannot compute them.

Needs `onnx` (`pip install 'posenc-client[onnx]'`); importing `posenc_client` alone never imports
it. Every function takes a model as an `onnx.ModelProto`, serialized bytes, a path or an
`OnnxModel`, never modifies it, and returns a new `ModelProto`.

- `attach_rope_caches(model, tables)`: put served cos/sin caches in place of the cache inputs or
  initializers of every RoPE consumer: `com.microsoft.GroupQueryAttention` with `do_rotary=1`,
  the standard `RotaryEmbedding` (opset 23) and `com.microsoft.RotaryEmbedding`. What each
  consumer needs (onnx 1.23 / onnxruntime 1.31 schemas, checked before anything is written):

  | consumer                  | cos/sin inputs | shape            | also                          |
  |---------------------------|----------------|------------------|-------------------------------|
  | RotaryEmbedding-23        | 1, 2           | (P, d/2)         | position_ids given; dtype = X |
  | com.microsoft.RotaryEmb.  | 2, 3           | (P, d/2)         | dtype = input                 |
  | com.microsoft.GQA rotary  | 7, 8           | (P, d/2)         | d/2 a multiple of 8, d <=     |
  |                           |                |                  | head_size, head_size % 16 == 0|
  |                           |                |                  | dtype = query; P >= total len |

  d is the rotary dim: `rotary_embedding_dim`, else the head size. Half-width values are the
  same for both pairings, but a table fetched for interleaved pairs (GPT-J, DeepSeek) plugged into
  a half-split node means the config and the graph disagree: that is an error unless
  `check_pairing=False`.
- `attach_alibi_bias(model, bias)`: merge the server's `alibi/bias` subgraph (from
  `Client.onnx(spec, graph="bias")`) so that its `bias` [1, H, Q, K] feeds an ONNX `Attention`
  `attn_mask` (input 3) or an onnxruntime `attention_bias` (`MultiHeadAttention` input 5,
  `GroupQueryAttention` input 10), replacing that graph input or filling the empty slot.
- `merge_subgraph(model, subgraph, io_map, prefix)`: `onnx.compose.merge_models` with the IR
  versions and the default-domain opsets aligned first (the subgraph is converted to the model's
  opset, never the other way round), the model's identity and outputs kept, and the subgraph's
  metadata kept under its prefix.

Errors are `IncompatibleModelError` (also a ValueError) naming the node, what it needs, what it
got and how to fetch the right table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

try:
    import onnx
    from onnx import numpy_helper
except ImportError as err:  # pragma: no cover - exercised in the fresh-venv test
    raise ImportError("posenc_client.onnx needs onnx: pip install 'posenc-client[onnx]'") from err

from posenc_client._exceptions import IncompatibleModelError
from posenc_client._formats import Array, dtype_name
from posenc_client._models import OnnxModel, Tables

__all__ = [
    "AlibiConsumer",
    "RopeConsumer",
    "attach_alibi_bias",
    "attach_rope_caches",
    "find_alibi_consumers",
    "find_rope_consumers",
    "merge_subgraph",
]

ModelLike = onnx.ModelProto | bytes | str | os.PathLike[str] | OnnxModel

MS = "com.microsoft"
_ELEM_NAMES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.BOOL: "bool",
}


def _domain(node: onnx.NodeProto) -> str:
    return "" if node.domain in ("", "ai.onnx") else node.domain


def _label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}#{index}"


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _input(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if len(node.input) > index else ""


def _load_model(model: ModelLike) -> onnx.ModelProto:
    """A private copy of `model` (ModelProto, bytes, path or OnnxModel)."""
    out = onnx.ModelProto()
    if isinstance(model, onnx.ModelProto):
        out.CopyFrom(model)
    elif isinstance(model, OnnxModel):
        out.ParseFromString(model.data)
    elif isinstance(model, bytes):
        out.ParseFromString(model)
    else:
        out = onnx.load(os.fspath(model))
    return out


@dataclass(frozen=True)
class _Value:
    dtype: str | None
    shape: tuple[int | str | None, ...] | None


class _Types:
    """Element types and shapes of the graph's values: declared ones, initializers, and what
    onnx shape inference adds (contrib ops are skipped by it, which is fine: activations feeding
    attention are usually produced by standard ops)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.values: dict[str, _Value] = {}
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:  # inference is best effort: declared types still count
            inferred = model
        g = inferred.graph
        for vi in [*g.value_info, *g.output, *g.input]:
            self.values[vi.name] = self._from_type(vi.type)
        for init in g.initializer:
            self.values[init.name] = _Value(_ELEM_NAMES.get(init.data_type), tuple(init.dims))

    @staticmethod
    def _from_type(tp: onnx.TypeProto) -> _Value:
        if not tp.HasField("tensor_type"):
            return _Value(None, None)
        t = tp.tensor_type
        dtype = _ELEM_NAMES.get(t.elem_type) if t.elem_type else None
        if not t.HasField("shape"):
            return _Value(dtype, None)
        dims: list[int | str | None] = []
        for d in t.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param"):
                dims.append(d.dim_param)
            else:
                dims.append(None)
        return _Value(dtype, tuple(dims))

    def dtype(self, name: str) -> str | None:
        v = self.values.get(name)
        return v.dtype if v else None

    def shape(self, name: str) -> tuple[int | str | None, ...] | None:
        v = self.values.get(name)
        return v.shape if v else None

    def dim(self, name: str, axis: int) -> int | None:
        shape = self.shape(name)
        if shape is None or not -len(shape) <= axis < len(shape):
            return None
        d = shape[axis]
        return d if isinstance(d, int) else None

    def rank(self, name: str) -> int | None:
        shape = self.shape(name)
        return None if shape is None else len(shape)


_C = TypeVar("_C", "RopeConsumer", "AlibiConsumer")


def _selected(consumers: list[_C], nodes: Iterable[str] | None, what: str, none: str) -> list[_C]:
    """`consumers` restricted to the node names `nodes` (all when None); `IncompatibleModelError`
    for a name the model lacks (`what`: how such a node is called) or when none is left
    (`none`: the message)."""
    if nodes is not None:
        wanted = set(nodes)
        unknown = wanted - {c.node for c in consumers}
        if unknown:
            raise IncompatibleModelError(
                f"no {what} named {sorted(unknown)}; the model has {[c.node for c in consumers]}"
            )
        consumers = [c for c in consumers if c.node in wanted]
    if not consumers:
        raise IncompatibleModelError(none)
    return consumers


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


_ROPE_SLOTS: dict[tuple[str, str], tuple[int, int, int, str]] = {
    # (domain, op_type): (activation input, cos input, sin input, interleaved attribute)
    ("", "RotaryEmbedding"): (0, 1, 2, "interleaved"),
    (MS, "RotaryEmbedding"): (0, 2, 3, "interleaved"),
    (MS, "GroupQueryAttention"): (0, 7, 8, "rotary_interleaved"),
}


def _op_name(node: onnx.NodeProto) -> str:
    domain = _domain(node)
    return f"{domain}.{node.op_type}" if domain else node.op_type


def _head_size(node: onnx.NodeProto, x: str, types: _Types) -> int | None:
    """Head size of a RoPE consumer from its activation's declared shape and attributes."""
    rank = types.rank(x)
    if node.op_type == "GroupQueryAttention":
        hidden = types.dim(x, -1)
        heads = int(_attr(node, "num_heads", 0) or 0)
        kv_heads = int(_attr(node, "kv_num_heads", 0) or 0)
        if hidden is None or heads <= 0:
            return None
        if not _input(node, 1):  # packed QKV: (num_heads + 2 * kv_num_heads) * head_size
            heads += 2 * kv_heads
        return hidden // heads if hidden % heads == 0 else None
    if rank == 4:
        return types.dim(x, 3)
    if rank == 3:
        hidden = types.dim(x, 2)
        heads = int(_attr(node, "num_heads", 0) or 0)
        if hidden is not None and heads > 0 and hidden % heads == 0:
            return hidden // heads
    return None


def find_rope_consumers(model: ModelLike) -> list[RopeConsumer]:
    """Every node of the main graph that reads cos/sin caches (GroupQueryAttention only with
    `do_rotary=1`), with its requirements, in graph order."""
    proto = model if isinstance(model, onnx.ModelProto) else _load_model(model)
    types = _Types(proto)
    out: list[RopeConsumer] = []
    for index, node in enumerate(proto.graph.node):
        slots = _ROPE_SLOTS.get((_domain(node), node.op_type))
        if slots is None:
            continue
        x_slot, cos_slot, sin_slot, pairing = slots
        if node.op_type == "GroupQueryAttention" and not _attr(node, "do_rotary", 0):
            continue
        x, cos, sin = _input(node, x_slot), _input(node, cos_slot), _input(node, sin_slot)
        head = _head_size(node, x, types)
        rotary = int(_attr(node, "rotary_embedding_dim", 0) or 0)
        rows = types.dim(cos, 0)
        if node.op_type == "GroupQueryAttention":
            width = types.dim(cos, 1)
            rotary_dim = 2 * width if width is not None else None
        else:
            rotary_dim = rotary or head
        positions = bool(_input(node, 3)) if _domain(node) == "" else True
        out.append(
            RopeConsumer(
                node=_label(node, index),
                op=_op_name(node),
                cos=cos,
                sin=sin,
                interleaved=bool(_attr(node, pairing, 0)),
                dtype=types.dtype(x),
                head_size=head,
                rotary_dim=rotary_dim,
                rows=rows,
                has_position_ids=positions,
            )
        )
    return out


def _cast(array: Array, dtype: str) -> Array:
    if dtype == "bfloat16":
        import ml_dtypes

        return array.astype(ml_dtypes.bfloat16)
    return array.astype(np.dtype(dtype))


def _sources(graph: onnx.GraphProto) -> tuple[set[str], set[str], dict[str, str]]:
    inputs = {i.name for i in graph.input}
    inits = {i.name for i in graph.initializer}
    produced = {o: _label(n, i) for i, n in enumerate(graph.node) for o in n.output if o}
    return inputs, inits, produced


def _check_rope(
    c: RopeConsumer,
    tables: Tables,
    width: int,
    rows: int,
    table_dtype: str,
    cast: bool,
    check_pairing: bool,
) -> list[str]:
    """Why the consumer cannot take the table (empty when it can)."""
    d = 2 * width
    problems: list[str] = []
    where = f"{c.op} node {c.node!r}"
    if c.op == "RotaryEmbedding" and not c.has_position_ids:
        problems.append(
            f"{where} has no position_ids input, so its caches are per batch (B, S, d/2), "
            "not position tables: give the node position_ids"
        )
    if c.op == f"{MS}.GroupQueryAttention":
        if width % 8:
            problems.append(
                f"{where} needs rotary_dim/2 to be a multiple of 8; the table has d/2 = {width}"
            )
        if c.head_size is not None:
            if c.head_size % 16:
                problems.append(
                    f"{where} needs a head size that is a multiple of 16 with do_rotary=1, "
                    f"got {c.head_size}"
                )
            if d > c.head_size:
                problems.append(
                    f"{where}: the table rotates d = {d} dims, more than head_size {c.head_size}"
                )
    elif c.rotary_dim is not None and c.rotary_dim != d:
        problems.append(
            f"{where} rotates {c.rotary_dim} dims (rotary_embedding_dim or head size), the "
            f"table has d = {d} (width {width}): fetch the table for this model's head_dim/"
            "rotary dim"
        )
    if c.rows is not None and rows < c.rows:
        problems.append(
            f"{where}: the model declares {c.rows} cache rows, the table has {rows}: fetch "
            f"with max_positions >= {c.rows}"
        )
    if c.dtype is not None and c.dtype != table_dtype and not cast:
        problems.append(
            f"{where} computes in {c.dtype} and needs caches of the same dtype; the table is "
            f"{table_dtype}: fetch with dtype={c.dtype!r} (or pass cast=True)"
        )
    table_interleaved = bool(tables.spec.get("interleaved", False))
    if check_pairing and c.interleaved != table_interleaved:
        node_pairs = "interleaved" if c.interleaved else "half-split"
        table_pairs = "interleaved" if table_interleaved else "half-split"
        problems.append(
            f"{where} rotates {node_pairs} pairs but the table was resolved for {table_pairs} "
            "pairs (the model's config and the graph disagree; pass check_pairing=False if the "
            "graph is right: half-width values are the same for both)"
        )
    return problems


def _place_initializer(graph: onnx.GraphProto, name: str, array: Array) -> None:
    """`name` becomes an initializer holding `array` (no longer a graph input)."""
    for field in (graph.input, graph.initializer, graph.value_info):
        keep = [v for v in field if v.name != name]
        if len(keep) != len(field):
            del field[:]
            field.extend(keep)
    graph.initializer.append(numpy_helper.from_array(np.asarray(array, order="C"), name))


def _record(model: onnx.ModelProto, key: str, entries: Mapping[str, str]) -> None:
    """Merge `entries` into the JSON object stored in metadata property `key`."""
    current: dict[str, Any] = {}
    props = [p for p in model.metadata_props if p.key != key]
    for p in model.metadata_props:
        if p.key == key:
            try:
                current = dict(json.loads(p.value))
            except (ValueError, TypeError):
                current = {}
    current.update(entries)
    del model.metadata_props[:]
    model.metadata_props.extend(props)
    entry = model.metadata_props.add()
    entry.key, entry.value = key, json.dumps(current, sort_keys=True)


def attach_rope_caches(
    model: ModelLike,
    tables: Tables,
    *,
    nodes: Iterable[str] | None = None,
    cast: bool = False,
    check_pairing: bool = True,
) -> onnx.ModelProto:
    """A copy of `model` whose RoPE consumers read the served `cos`/`sin` caches.

    Args:
        model: the model; its consumers' cos/sin caches must be graph inputs (they become
            initializers) or initializers (replaced).
        tables: a `rope` table with separate half-width caches: fetch it with `profile="onnx"`
            (RotaryEmbedding) or `profile="ort_gqa"` (GroupQueryAttention), and the model's
            activation dtype (`dtype=`).
        nodes: only these node names (default: every consumer).
        cast: convert the caches to the activation dtype instead of refusing (rounding once, as
            the server would when computing in fp32 and casting last).
        check_pairing: refuse a table resolved for the other pairing (see the module doc).

    Records `{cos_name: key, sin_name: key}` in metadata property `posenc.tables`. Raises
    `IncompatibleModelError` listing every problem found.
    """
    proto = _load_model(model)
    if tables.kind != "rope":
        raise IncompatibleModelError(f"attach_rope_caches takes a rope table, got {tables.kind}")
    if "cos" not in tables or "sin" not in tables:
        raise IncompatibleModelError(
            f"the table packs its caches as {list(tables)}; ONNX consumers need separate cos "
            "and sin: fetch with profile='onnx' or 'ort_gqa' (packing='separate', width='half')"
        )
    cos, sin = tables["cos"], tables["sin"]
    if tables.spec.get("width", "half") != "half" or cos.ndim != 2 or cos.shape != sin.shape:
        raise IncompatibleModelError(
            f"ONNX consumers take half-width caches (P, d/2); this table is "
            f"{tables.spec.get('width')} width {list(cos.shape)}: fetch with profile='onnx' or "
            "'ort_gqa' (width='half')"
        )
    rows, width = int(cos.shape[0]), int(cos.shape[1])
    table_dtype = dtype_name(cos.dtype)
    consumers = _selected(
        find_rope_consumers(proto),
        nodes,
        "RoPE consumer",
        "the model has no RoPE consumer (RotaryEmbedding, com.microsoft.RotaryEmbedding, "
        "com.microsoft.GroupQueryAttention with do_rotary=1)",
    )
    inputs, inits, produced = _sources(proto.graph)
    problems: list[str] = []
    targets: dict[str, tuple[Array, str]] = {}
    for c in consumers:
        found = _check_rope(c, tables, width, rows, table_dtype, cast, check_pairing)
        for name in (c.cos, c.sin):
            if not name:
                found.append(f"{c.op} node {c.node!r} has no cache input to fill")
            elif name in produced and name not in inits:
                found.append(
                    f"{c.op} node {c.node!r}: {name!r} is computed by node {produced[name]!r}; "
                    "only graph inputs and initializers can be replaced"
                )
            elif name not in inputs and name not in inits:
                found.append(f"{c.op} node {c.node!r}: no graph input or initializer {name!r}")
        if c.cos == c.sin and c.cos:
            found.append(f"{c.op} node {c.node!r} reads one tensor {c.cos!r} as both cos and sin")
        problems.extend(found)
        if not found:
            dtype = c.dtype if (cast and c.dtype) else table_dtype
            for name, array in ((c.cos, cos), (c.sin, sin)):
                previous = targets.get(name)
                if previous is not None and previous[1] != dtype:
                    problems.append(f"{name!r} is read in both {previous[1]} and {dtype}")
                targets[name] = (array, dtype)
    if problems:
        raise IncompatibleModelError(
            "cannot attach the RoPE caches:\n- " + "\n- ".join(dict.fromkeys(problems))
        )
    for name, (array, dtype) in targets.items():
        value = array if dtype == table_dtype else _cast(array, dtype)
        _place_initializer(proto.graph, name, value)
    _record(proto, "posenc.tables", {name: tables.key for name in targets})
    return proto


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
    (MS, "MultiHeadAttention"): 5,
    (MS, "GroupQueryAttention"): 10,
}


def find_alibi_consumers(model: ModelLike) -> list[AlibiConsumer]:
    """Every node of the main graph that can take an additive attention bias."""
    proto = model if isinstance(model, onnx.ModelProto) else _load_model(model)
    types = _Types(proto)
    out: list[AlibiConsumer] = []
    for index, node in enumerate(proto.graph.node):
        slot = _BIAS_SLOTS.get((_domain(node), node.op_type))
        if slot is None:
            continue
        q = _input(node, 0)
        heads_attr = "q_num_heads" if node.op_type == "Attention" else "num_heads"
        heads = int(_attr(node, heads_attr, 0) or 0) or None
        if heads is None and node.op_type == "Attention" and types.rank(q) == 4:
            heads = types.dim(q, 1)
        out.append(
            AlibiConsumer(
                node=_label(node, index),
                op=_op_name(node),
                index=index,
                slot=_input(node, slot),
                dtype=types.dtype(q),
                num_heads=heads,
            )
        )
    return out


def _main_opset(model: onnx.ModelProto) -> int | None:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return None


def _align(model: onnx.ModelProto, sub: onnx.ModelProto) -> onnx.ModelProto:
    """`sub` converted to the model's default-domain opset (the model gains the subgraph's when
    it imports none); custom domains must already agree."""
    target, have = _main_opset(model), _main_opset(sub)
    if target is None and have is not None:
        model.opset_import.add(domain="", version=have)
    elif target is not None and have is not None and target != have:
        from onnx import version_converter

        try:
            sub = version_converter.convert_version(sub, target)
        except Exception as err:
            raise IncompatibleModelError(
                f"the subgraph uses opset {have} and the model opset {target}; converting the "
                f"subgraph failed ({err}): fetch it with opset={target}"
            ) from err
    versions = {o.domain: o.version for o in model.opset_import if o.domain not in ("", "ai.onnx")}
    for o in sub.opset_import:
        if o.domain in versions and versions[o.domain] != o.version:
            raise IncompatibleModelError(
                f"domain {o.domain!r}: the model imports version {versions[o.domain]}, the "
                f"subgraph {o.version}"
            )
    return sub


def merge_subgraph(
    model: ModelLike,
    subgraph: ModelLike,
    io_map: Sequence[tuple[str, str]] | Mapping[str, str],
    prefix: str = "posenc/",
) -> onnx.ModelProto:
    """`onnx.compose.merge_models(subgraph, model, io_map)` made to work on real pairs.

    Args:
        model: the consumer model (kept as is: opset, outputs, name, producer, metadata).
        subgraph: the producer (a served posenc graph): converted to the model's default-domain
            opset when they differ, every name prefixed with `prefix`, its metadata kept as
            `<prefix><key>`.
        io_map: (subgraph output, model input) pairs, unprefixed: each model input is replaced
            by the subgraph output. Subgraph inputs become model inputs (`<prefix><name>`).
        prefix: added to every name of the subgraph (nodes, values, initializers).

    The IR version of the result is the larger of the two. Raises `IncompatibleModelError` on
    unknown names, clashing opsets, or a failed conversion.
    """
    base = _load_model(model)
    sub = _align(base, _load_model(subgraph))
    pairs = list(io_map.items()) if isinstance(io_map, Mapping) else list(io_map)
    sub_outputs = {o.name for o in sub.graph.output}
    model_inputs = {i.name for i in base.graph.input}
    bad = [f"subgraph output {o!r}" for o, _ in pairs if o not in sub_outputs]
    bad += [f"model input {i!r}" for _, i in pairs if i not in model_inputs]
    if bad:
        raise IncompatibleModelError(
            f"io_map names unknown values: {', '.join(bad)} (subgraph outputs: "
            f"{sorted(sub_outputs)}; model inputs: {sorted(model_inputs)})"
        )
    ir_version = max(base.ir_version, sub.ir_version)
    base.ir_version = sub.ir_version = ir_version
    sub_meta = {p.key: p.value for p in sub.metadata_props}
    del sub.metadata_props[:]
    keep_meta = {p.key: p.value for p in base.metadata_props}
    del base.metadata_props[:]
    try:
        merged = onnx.compose.merge_models(
            sub, base, io_map=pairs, prefix1=prefix, name=base.graph.name
        )
    except ValueError as err:
        raise IncompatibleModelError(f"cannot merge the subgraph: {err}") from err
    # the model's outputs only (merge_models' `outputs=` would prune unconnected subgraph nodes),
    # and the model's inputs first, in their order
    outputs = {o.name for o in base.graph.output}
    keep = [o for o in merged.graph.output if o.name in outputs]
    del merged.graph.output[:]
    merged.graph.output.extend(keep)
    own = {i.name for i in base.graph.input}
    ordered = sorted(merged.graph.input, key=lambda i: i.name not in own)
    del merged.graph.input[:]
    merged.graph.input.extend(ordered)
    merged.producer_name = base.producer_name
    merged.producer_version = base.producer_version
    merged.domain = base.domain
    merged.model_version = base.model_version
    merged.doc_string = base.doc_string
    merged.graph.doc_string = base.graph.doc_string
    seen: dict[str, int] = {}
    for o in merged.opset_import:
        domain = "" if o.domain == "ai.onnx" else o.domain
        seen[domain] = max(seen.get(domain, 0), int(o.version))
    del merged.opset_import[:]
    for domain, version in seen.items():
        merged.opset_import.add(domain=domain, version=version)
    del merged.metadata_props[:]
    props = {**keep_meta, **{f"{prefix}{k}": v for k, v in sub_meta.items()}}
    onnx.helper.set_model_props(merged, props)
    return merged


def _rename_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new


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
    proto = _load_model(model)
    sub = _load_model(bias)
    sub_meta = {p.key: p.value for p in sub.metadata_props}
    graph_name = sub_meta.get("posenc.graph")
    if graph_name is not None and graph_name != "alibi/bias":
        raise IncompatibleModelError(f"expected the alibi/bias subgraph, got {graph_name}")
    out = next((o for o in sub.graph.output if o.name == "bias"), None)
    if out is None:
        raise IncompatibleModelError("the subgraph has no output named 'bias'")
    sub_value = _Types._from_type(out.type)
    sub_heads = sub_value.shape[1] if sub_value.shape and len(sub_value.shape) == 4 else None
    consumers = _selected(
        find_alibi_consumers(proto),
        nodes,
        "attention node",
        "the model has no node taking an additive bias (Attention, "
        "com.microsoft.MultiHeadAttention, com.microsoft.GroupQueryAttention)",
    )
    graph_inputs, inits, produced = _sources(proto.graph)
    problems: list[str] = []
    targets: list[str] = []
    empty: list[AlibiConsumer] = []
    for c in consumers:
        where = f"{c.op} node {c.node!r}"
        if c.dtype is not None and sub_value.dtype is not None and c.dtype != sub_value.dtype:
            problems.append(
                f"{where} computes in {c.dtype}; the bias subgraph outputs {sub_value.dtype}: "
                f"export it with dtype={c.dtype!r}"
            )
        if isinstance(sub_heads, int) and c.num_heads is not None and sub_heads != c.num_heads:
            problems.append(
                f"{where} has {c.num_heads} heads; the bias has {sub_heads}: export it for "
                f"num_heads={c.num_heads} (or the tp_size/tp_rank slice)"
            )
        if not c.slot:
            empty.append(c)
        elif c.slot in graph_inputs and c.slot not in inits:
            if c.slot not in targets:
                targets.append(c.slot)
        else:
            source = produced.get(c.slot, "an initializer")
            problems.append(
                f"{where}: its bias input {c.slot!r} comes from {source!r}; attach_alibi_bias "
                "replaces a graph input or fills an empty slot (add the two yourself with "
                "merge_subgraph)"
            )
    links = dict(inputs or {})
    sub_inputs = {i.name for i in sub.graph.input}
    known = graph_inputs | inits | set(produced)
    for name, existing in links.items():
        if name not in sub_inputs:
            problems.append(f"the subgraph has no input {name!r}; it has {sorted(sub_inputs)}")
        if existing not in known:
            problems.append(f"inputs maps {name!r} to {existing!r}, which the model lacks")
    if problems:
        raise IncompatibleModelError(
            "cannot attach the ALiBi bias:\n- " + "\n- ".join(dict.fromkeys(problems))
        )
    merged = merge_subgraph(proto, sub, [("bias", t) for t in targets], prefix)
    g = merged.graph
    output = f"{prefix}bias"
    first = len(g.node) - len(proto.graph.node)  # merge_models puts the subgraph's nodes first
    for c in empty:
        node = g.node[first + c.index]
        slot = _BIAS_SLOTS[(_domain(node), node.op_type)]
        while len(node.input) <= slot:
            node.input.append("")
        node.input[slot] = output
    for name, existing in links.items():
        _rename_uses(g, f"{prefix}{name}", existing)
        keep = [i for i in g.input if i.name != f"{prefix}{name}"]
        del g.input[:]
        g.input.extend(keep)
    _record(merged, "posenc.tables", {output: sub_meta.get("posenc.key", "")})
    onnx.checker.check_model(merged)
    return merged
