"""Every place an ONNX model takes its RoPE values from (a *site*), found reading no values, and
what each needs to be compared: `find_sites`.

A site is one of:

- `BakedCaches` kind "cache": a cos/sin pair of initializers a RoPE consumer (`RotaryEmbedding`,
  `com.microsoft.RotaryEmbedding`, `GroupQueryAttention` with `do_rotary=1`) reads, or the two
  branches of a LongRoPE length `If` (onnxruntime-genai's builder; `side` "short"/"long");
- `BakedCaches` kind "gathered": a consumer's caches gathered by position from an initializer
  table (`Gather(table, positions)`, through Reshape/Identity...: posenc's own `rope/rotary`
  graph with op `onnx` or `contrib` in mode `table`, whose Gather is guarded by the position
  range);
- `BakedCaches` kind "folded": full-width cos/sin constants that a static-shape export
  (`torch.onnx.export` with fixed shapes: transformers' rotary module constant-folded) multiplies
  into q and k: `Add(Mul(x, cos), Mul(rotate_half(x), sin))`, cos/sin a constant of shape
  (..., S, d) with every leading dim 1;
- `FrequencyConstant` (`posenc_check.freq`): frequencies the graph turns into cos/sin
  (`torch.onnx.export` with dynamic shapes, optimum);
- `Unchecked`: a site whose values are not in the model (graph inputs, values computed from the
  model's inputs, a pattern posenc does not know), with the reason and the node.

`TableRequest` says which exact table a site is compared with: its dtype, rows and, for a side
of a length switch, the `seq_len` on that side (caches), or the frequencies (`inv_freq`).

Bounds (`SiteLimitError`): a tensor read as cos by one consumer and as sin by another is refused
(no table is both), and a model holding more than `MAX_SITES` distinct sites is refused: each
site costs one comparison, and a hostile model can wire k tensors into k^2 pairings.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import onnx

from posenc_check.freq import FrequencyConstant, find_frequency_constants
from posenc_check.graph import ELEMENT_TYPES, label, node_input
from posenc_check.rope import LengthSwitch, length_switch, rope_readers

MAX_SITES = 256
"""Most distinct sites (cos/sin pairs, sides, frequency constants) one model may hold."""

_THROUGH = {"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"}
"""Ops a cache or a gathered table passes through unchanged in value."""
_FOLDED_THROUGH = {"Identity", "Reshape", "Squeeze", "Unsqueeze", "Expand"}


class SiteLimitError(ValueError):
    """The model's sites exceed a bound (`MAX_SITES`, a tensor read as both cos and sin)."""


@dataclass(frozen=True)
class BakedCaches:
    """One cos/sin pair whose values the model holds.

    `cos`/`sin`: the values the consumers read (initializers, outputs of a LongRoPE `If`: then
    `side` is "short"/"long" for its else/then branch and `threshold` the length it switches at,
    else "" and None; for kind "gathered", the Gather outputs; for "folded", the constants);
    `nodes`: the consumers; `cos_tensor`/`sin_tensor`: where the values are stored (possibly in
    external data: `graph.is_external`); `kind`: "cache", "gathered" or "folded"; `layout`:
    "half" (P, d/2), "full" (..., P, d) = cat(c, c) (the half-split rotation) or "interleaved"
    (..., P, d) = repeat_interleave(c, 2)."""

    cos: str
    sin: str
    side: str
    threshold: int | None
    nodes: tuple[str, ...]
    cos_tensor: onnx.TensorProto
    sin_tensor: onnx.TensorProto
    kind: str = "cache"
    layout: str = "half"


@dataclass(frozen=True)
class Unchecked:
    """A site whose values cannot be compared: `name` the value (or node) it reads, `nodes` the
    consumers, `reason` why (naming the node)."""

    name: str
    nodes: tuple[str, ...]
    reason: str


Site = BakedCaches | FrequencyConstant | Unchecked


@dataclass(frozen=True)
class TableRequest:
    """The exact table a site is compared with: `what` "caches" (half-width cos/sin of `dtype`,
    `rows` rows and, on a side of a length switch, `seq_len`) or "inv_freq" (the frequencies)."""

    what: str
    dtype: str | None = None
    rows: int | None = None
    seq_len: int | None = None


def table_request(site: BakedCaches | FrequencyConstant) -> TableRequest:
    """What `site` is compared with, read from its stored dims and type (no values)."""
    if isinstance(site, FrequencyConstant):
        return TableRequest("inv_freq")
    dims = [int(d) for d in site.cos_tensor.dims]
    rows = dims[-2] if len(dims) >= 2 else None
    seq_len = None
    if site.threshold is not None:
        seq_len = site.threshold + (1 if site.side == "long" else 0)
    return TableRequest("caches", ELEMENT_TYPES.get(site.cos_tensor.data_type), rows, seq_len)


class _Graph:
    """The main graph's initializers, `Constant` outputs, producers and consumers."""

    def __init__(self, model: onnx.ModelProto) -> None:
        graph = model.graph
        self.graph = graph
        self.initializers = {t.name: t for t in graph.initializer}
        self.inputs = {i.name for i in graph.input} - set(self.initializers)
        self.producer: dict[str, tuple[int, onnx.NodeProto]] = {}
        self.consumers: dict[str, list[tuple[int, onnx.NodeProto]]] = {}
        for index, node in enumerate(graph.node):
            for output in node.output:
                if output:
                    self.producer[output] = (index, node)
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append((index, node))

    def constant(self, name: str) -> onnx.TensorProto | None:
        """The tensor holding value `name`: an initializer or a `Constant` node's `value`."""
        if name in self.initializers:
            stored: onnx.TensorProto = self.initializers[name]
            return stored
        found = self.producer.get(name)
        if found is not None and found[1].op_type == "Constant":
            for item in found[1].attribute:
                if item.name == "value" and item.type == onnx.AttributeProto.TENSOR:
                    tensor = onnx.TensorProto()
                    tensor.CopyFrom(item.t)
                    tensor.name = name
                    return tensor
        return None

    def back(self, name: str, through: set[str]) -> str:
        """The value `name` is a reshaping of (back through `through` ops)."""
        seen = 0
        while (found := self.producer.get(name)) is not None and found[1].op_type in through:
            name = found[1].input[0]
            seen += 1
            if seen > 64:
                break
        return name

    def ancestors_have(self, name: str, wanted: set[str], limit: int = 4096) -> bool:
        """Whether a node labelled in `wanted`, or an op type in `wanted`, computes `name`
        (at most `limit` nodes visited)."""
        stack, seen = [name], set[int]()
        while stack and len(seen) < limit:
            found = self.producer.get(stack.pop())
            if found is None or found[0] in seen:
                continue
            seen.add(found[0])
            index, node = found
            if label(node, index) in wanted or node.op_type in wanted:
                return True
            stack.extend(i for i in node.input if i)
        return False


def _gathered(graph: _Graph, name: str) -> tuple[onnx.TensorProto, str] | str | None:
    """(table, gather node) when value `name` is rows Gathered from a constant table along axis
    0 (through `_THROUGH` ops), a reason when it is gathered in a way posenc cannot compare, or
    None when no Gather makes it."""
    base = graph.back(name, _THROUGH)
    found = graph.producer.get(base)
    if found is None or found[1].op_type != "Gather":
        return None
    index, node = found
    where = f"Gather node {label(node, index)!r}"
    table = graph.constant(node.input[0])
    axis = 0
    for item in node.attribute:
        if item.name == "axis":
            axis = int(item.i)
    if table is None or axis != 0 or len(table.dims) != 2:
        return None
    if graph.ancestors_have(node.input[1], {"Greater"}):  # the range guard is >= and <
        return (
            f"{where} reads {node.input[0]!r} at a row offset chosen by the length (a second "
            "frequency set past a switch): its rows hold two tables, not comparable as one"
        )
    return table, label(node, index)


def _consumer_sites(graph: _Graph, covered: set[str]) -> tuple[list[Site], dict[str, str]]:
    """The sites of the RoPE consumers, and which tensor each pair reads as cos/sin."""
    readers: dict[tuple[str, str], list[str]] = {}
    for index, node, slots in rope_readers(graph.graph):
        pair = (node_input(node, slots.cos), node_input(node, slots.sin))
        readers.setdefault(pair, []).append(label(node, index))
    roles: dict[str, str] = {}
    sites: list[Site] = []
    for cos, sin in readers:
        for name, role in ((cos, "cos"), (sin, "sin")):
            if name and roles.setdefault(name, role) != role:
                raise SiteLimitError(
                    f"tensor {name!r} is read as cos by one RoPE consumer and as sin by another "
                    "(no table is both): refused"
                )
    if len(readers) > MAX_SITES:
        raise SiteLimitError(
            f"the model pairs {len(readers)} distinct cos/sin caches into its RoPE consumers, "
            f"more than {MAX_SITES}: refused"
        )
    for (cos, sin), nodes in readers.items():
        sites.extend(_consumer_site(graph, cos, sin, tuple(nodes), covered))
    return sites, roles


def _consumer_site(
    graph: _Graph, cos: str, sin: str, nodes: tuple[str, ...], covered: set[str]
) -> list[Site]:
    where = f"node {nodes[0]!r}" + (f" (and {len(nodes) - 1} more)" if len(nodes) > 1 else "")
    if not cos or not sin:
        return [Unchecked(cos or sin, nodes, f"{where} has no cos/sin cache input")]
    if cos == sin:
        return [Unchecked(cos, nodes, f"{where} reads one tensor {cos!r} as both cos and sin")]
    if cos in graph.initializers and sin in graph.initializers:
        tensors = (graph.initializers[cos], graph.initializers[sin])
        return [BakedCaches(cos, sin, "", None, nodes, *tensors)]
    if cos in graph.inputs or sin in graph.inputs:
        name = cos if cos in graph.inputs else sin
        return [
            Unchecked(
                name,
                nodes,
                f"{where} reads its cache {name!r} from a graph input: the values come at run "
                "time, the model holds none to compare (posenc-client plug fills it)",
            )
        ]
    switches = length_switch(graph.graph, cos), length_switch(graph.graph, sin)
    if isinstance(switches[0], LengthSwitch) and isinstance(switches[1], LengthSwitch):
        threshold = switches[0].threshold
        short = (switches[0].short.tensor, switches[1].short.tensor)
        long = (switches[0].long.tensor, switches[1].long.tensor)
        return [
            BakedCaches(cos, sin, "short", threshold, nodes, *short),
            BakedCaches(cos, sin, "long", threshold, nodes, *long),
        ]
    if isinstance(switches[0], str) or isinstance(switches[1], str):
        reason = switches[0] if isinstance(switches[0], str) else switches[1]
        return [Unchecked(cos, nodes, f"{where}: {reason}")]
    cos_gathered, sin_gathered = _gathered(graph, cos), _gathered(graph, sin)
    if isinstance(cos_gathered, tuple) and isinstance(sin_gathered, tuple):
        (cos_table, gather), (sin_table, _) = cos_gathered, sin_gathered
        return [
            BakedCaches(
                cos_table.name, sin_table.name, "", None, (*nodes, gather), cos_table,
                sin_table, kind="gathered",
            )
        ]  # fmt: skip
    if isinstance(cos_gathered, str) or isinstance(sin_gathered, str):
        reason = cos_gathered if isinstance(cos_gathered, str) else str(sin_gathered)
        return [Unchecked(cos, nodes, f"{where}: {reason}")]
    if covered and graph.ancestors_have(cos, covered) and graph.ancestors_have(sin, covered):
        return []  # computed from a frequency constant: that site covers it
    found = graph.producer.get(cos)
    maker = f"node {label(found[1], found[0])!r} ({found[1].op_type})" if found else "nothing"
    return [
        Unchecked(
            cos,
            nodes,
            f"{where} reads {cos!r}, computed by {maker} from the model's inputs, in a pattern "
            "posenc cannot read (not an initializer, a length If, a Gather from a table or "
            "frequencies into Cos/Sin)",
        )
    ]


def _folded_sites(graph: _Graph, roles: dict[str, str]) -> list[Site]:
    """Full-width cos/sin constants multiplied into q/k (see the module doc), in graph order:
    `Add(Mul(x, cos), Mul(y, sin))` where cos and sin are constants of one shape (..., S, d),
    leading dims 1, d even, and y is x rotated (`Concat`, the rotate_half / rotate_every_two of
    transformers), or failing that sin[0] = 0 (angle 0)."""
    pairs: dict[tuple[str, str], list[str]] = {}
    tensors: dict[str, onnx.TensorProto] = {}
    for index, node in enumerate(graph.graph.node):
        if node.op_type not in ("Add", "Sub") or len(node.input) != 2:
            continue
        found = []
        for value in node.input:
            producer = graph.producer.get(value)
            if producer is None or producer[1].op_type != "Mul" or len(producer[1].input) != 2:
                break
            constants = [
                (graph.back(i, _FOLDED_THROUGH), other)
                for i, other in zip(producer[1].input, producer[1].input[::-1], strict=True)
            ]
            constants = [(c, other) for c, other in constants if graph.constant(c) is not None]
            if len(constants) != 1:
                break
            found.append(constants[0])
        if len(found) != 2:
            continue
        (a, a_other), (b, b_other) = found
        ta, tb = graph.constant(a), graph.constant(b)
        if ta is None or tb is None or a == b or not _folded_shape(ta, tb):
            continue
        rotated = [_is_rotated(graph, other) for other in (a_other, b_other)]
        if rotated == [False, True]:
            cos, sin = a, b
        elif rotated == [True, False]:
            cos, sin = b, a
        else:
            continue
        if roles.get(cos, "cos") != "cos" or roles.get(sin, "sin") != "sin":
            raise SiteLimitError(f"tensors {cos!r}, {sin!r} are read as both cos and sin")
        roles[cos], roles[sin] = "cos", "sin"
        tensors[cos], tensors[sin] = graph.constant(cos), graph.constant(sin)  # type: ignore[assignment]
        pairs.setdefault((cos, sin), []).append(label(node, index))
        if len(pairs) > MAX_SITES:
            raise SiteLimitError(
                f"the model multiplies more than {MAX_SITES} distinct cos/sin constants into "
                "its activations: refused"
            )
    return [
        BakedCaches(cos, sin, "", None, tuple(nodes), tensors[cos], tensors[sin], "folded", "full")
        for (cos, sin), nodes in pairs.items()
    ]


def _folded_shape(a: onnx.TensorProto, b: onnx.TensorProto) -> bool:
    dims = [int(d) for d in a.dims]
    return (
        list(a.dims) == list(b.dims)
        and a.data_type == b.data_type
        and ELEMENT_TYPES.get(a.data_type) in ("float32", "float16", "bfloat16", "float64")
        and len(dims) >= 2
        and all(d == 1 for d in dims[:-2])
        and dims[-1] % 2 == 0
        and dims[-1] > 0
        and dims[-2] > 0
    )


def _is_rotated(graph: _Graph, value: str) -> bool:
    """Whether `value` is an activation rotated by pairs: a `Concat` (of -x2 and x1: transformers'
    `rotate_half`) or a `Neg`/`Reshape`-of-`Stack` chain (`rotate_every_two`), through
    reshaping."""
    base = graph.back(value, _FOLDED_THROUGH | {"Cast"})
    found = graph.producer.get(base)
    if found is None:
        return False
    node = found[1]
    if node.op_type == "Concat":
        return any(
            (p := graph.producer.get(graph.back(i, _FOLDED_THROUGH))) is not None
            and p[1].op_type == "Neg"
            for i in node.input
        )
    return False


def find_sites(model: onnx.ModelProto, nodes: Iterable[str] | None = None) -> list[Site]:
    """Every RoPE site of `model` (see the module doc), reading no values: the consumers' caches
    first (graph order), then folded constants, then frequency constants. `nodes`: only the
    sites whose consumers (or, for frequencies, whose constant) are named. Raises
    `SiteLimitError` past the bounds."""
    graph = _Graph(model)
    frequencies = find_frequency_constants(model)
    if len(frequencies) > MAX_SITES:
        raise SiteLimitError(
            f"the model holds {len(frequencies)} RoPE frequency constants, more than "
            f"{MAX_SITES}: refused"
        )
    covered = {name for f in frequencies for name in (f.cos, f.sin)}
    consumer, roles = _consumer_sites(graph, covered)
    folded = _folded_sites(graph, roles)
    sites: list[Site] = [*consumer, *folded, *frequencies]
    if len(sites) > MAX_SITES:
        raise SiteLimitError(f"the model holds {len(sites)} RoPE sites, more than {MAX_SITES}")
    if nodes is None:
        return sites
    wanted = set(nodes)
    return [s for s in sites if (site_nodes(s) | {site_name(s)}) & wanted]


def site_name(site: Site) -> str:
    """The name a report gives the site (the cos value, the constant, the unchecked value)."""
    if isinstance(site, BakedCaches):
        return site.cos
    if isinstance(site, FrequencyConstant):
        return site.node
    return site.name


def site_nodes(site: Site) -> set[str]:
    """The nodes a site's values feed."""
    if isinstance(site, FrequencyConstant):
        return {site.product, site.cos, site.sin}
    return set(site.nodes)
