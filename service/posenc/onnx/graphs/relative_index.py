"""`relative_index/bias`: the relative position index [rows, cols] and the bias it gathers from a
learned table, [1, H, rows, cols] (`posenc.encodings.relative_index`).

bias[0, h, a, b] = E[index[a, b], h] with E = `relative_position_bias_table`
(num_relative_distance, H): an initializer when the spec names a table (inline, or by
`relative_position_bias_table_key` once bound: `weights.resolve_tables` with the table store; an
unbound key is refused with `unknown_table`), else a float32 graph input (the consumer model's
parameter), exactly timm's and transformers'
`table[index.view(-1)].view(rows, cols, -1).permute(2, 0, 1)` followed by `unsqueeze(0)`.

- mode `table` (every scheme): the core's index is embedded as an int64 initializer; the graph has
  no position inputs (a window's index is fixed by its size, as the `relative_position_index`
  buffer of timm's and transformers' Swin/BEiT modules).
- mode `compute` (`shaw`, `speecht5`): the index is built from query and key positions at run
  time, any length (`inputs` `positions` or `lengths`, as alibi/t5_bias): with rel = k_j - p_i,
  shaw `clip(rel, -k, k) + k`, speecht5 `clip(-rel, -k, k - 1) + k`. The spec's lengths are the
  verification case only.

The gather moves float32 weights and casts to the spec dtype last: bit-identical to the core.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
import torch

from posenc.encodings import FieldProblem, compute
from posenc.encodings.relative_index import (
    WINDOW_SCHEMES,
    RelativeIndexSpec,
    relative_index,
)
from posenc.onnx._graph import IR_DTYPES, Graph
from posenc.onnx._options import ExportOptions, InputStyle
from posenc.onnx._registry import GraphExporter, Sample, register_exporter
from posenc.onnx.graphs._pairs import feeds, query_key_positions, relative

MAX_INDEX_BYTES = 1 << 30
"""Embedded indices above 1 GiB are refused (protobuf caps a model at 2 GiB)."""
SAMPLE_ENTRIES = 1 << 20
SAMPLE_HEADS = 3
"""Heads of the random weights verification feeds when the spec carries none."""


def _sequence_index(g: Graph, spec: RelativeIndexSpec, style: str) -> ir.Value:
    """Shaw's or SpeechT5's clipped index int64 [Q, K] from the position inputs."""
    op = g.op
    k = int(spec.max_relative_position or 0)
    queries, keys = query_key_positions(g, style)  # [Q], [K]
    rel = relative(g, queries, keys)  # int64 [Q, K]: k_j - p_i
    # shaw: clip(k_j - p_i, -k, k); speecht5: clip(p_i - k_j, -k, k - 1)
    shaw = spec.scheme == "shaw"
    clipped: ir.Value = op.Clip(rel, -k, k) if shaw else op.Clip(op.Neg(rel), -k, k - 1)  # [Q,K]
    index: ir.Value = op.Add(clipped, k)  # [Q, K]
    return index


def _weights(spec: RelativeIndexSpec) -> torch.Tensor:
    """The spec's bound float32 table (`UnknownTableError` when it names one by key that was
    never bound), or random (num_relative_distance, SAMPLE_HEADS) weights when it names none."""
    if spec.named_table_shape() is not None:
        return spec.require_bound().tensor
    gen = torch.Generator().manual_seed(0)
    return torch.randn(spec.num_relative_distance(), SAMPLE_HEADS, generator=gen)


@register_exporter
class RelativeIndexBias(GraphExporter):
    kind = "relative_index"
    graph = "bias"
    summary = (
        "relative position index [rows, cols] (embedded, or from query/key positions for "
        "shaw/speecht5) -> index and bias [1, H, rows, cols] gathered from the learned table"
    )
    modes = ("table", "compute")
    input_styles = ("positions", "lengths")

    def styles(self, mode: str) -> tuple[InputStyle, ...]:
        return self.input_styles if mode == "compute" else ()

    def problems(self, spec: RelativeIndexSpec, options: ExportOptions) -> list[FieldProblem]:
        if options.mode == "compute" and spec.scheme in WINDOW_SCHEMES:
            return [
                FieldProblem(
                    "mode",
                    f"a {spec.scheme} window's index is fixed by window_size: use mode 'table'",
                    options.mode,
                )
            ]
        rows, cols = spec.shape()
        if options.mode == "table" and 8 * rows * cols > MAX_INDEX_BYTES:
            return [
                FieldProblem(
                    "mode",
                    f"the embedded index would take {8 * rows * cols} bytes (limit "
                    f"{MAX_INDEX_BYTES}): use mode 'compute'",
                    options.mode,
                )
            ]
        return []

    def build(self, g: Graph, spec: RelativeIndexSpec, options: ExportOptions) -> dict[str, Any]:
        op = g.op
        rows: Any
        cols: Any
        if options.mode == "table":
            index = g.initializer("relative_position_index", relative_index(spec))  # [rows, cols]
            rows, cols = spec.shape()
        else:
            index = _sequence_index(g, spec, str(options.inputs))  # [Q, K]
            rows, cols = "Q", "K"
        weights: ir.Value
        if spec.named_table_shape() is None:
            weights = g.input(
                "relative_position_bias_table",
                "float32",
                [spec.num_relative_distance(), "H"],
                "learned relative_position_bias_table (num_relative_distance, H)",
            )
        else:
            weights = g.initializer("relative_position_bias_table", _weights(spec))  # [R, H]
        gathered: ir.Value = op.Gather(weights, index, axis=0)  # [rows, cols, H]
        bias: ir.Value = op.Unsqueeze(op.Transpose(gathered, perm=[2, 0, 1]), [0])  # [1,H,r,c]
        if spec.dtype != "float32":
            bias = op.Cast(bias, to=IR_DTYPES[spec.dtype])  # [1, H, rows, cols]
        if options.mode == "table":
            index = op.Identity(index)  # an initializer cannot be a graph output by itself
        g.output(index, "index", f"int64 relative position index [{rows}, {cols}]")
        g.output(bias, "bias", f"additive attention bias [1, H, {rows}, {cols}]")
        return {"scheme": spec.scheme, "num_relative_distance": spec.num_relative_distance()}

    def samples(self, spec: RelativeIndexSpec, options: ExportOptions) -> list[Sample]:
        weights = _weights(spec)
        extra: dict[str, torch.Tensor] = {}
        if spec.named_table_shape() is None:
            extra = {"relative_position_bias_table": weights}
        if options.mode == "table":
            return [Sample(feeds=extra, expected=_expected(spec, weights), label="table")]
        style = str(options.inputs)
        q, k = spec.shape()
        offset = spec.query_offset
        if q * k > SAMPLE_ENTRIES:
            q, offset = min(q, 16), min(offset, 64)
            k = min(k, offset + q + 64)
        if style == "lengths":
            k = offset + q
        case = _with(spec, query_length=q, key_length=k, query_offset=offset)
        queries = torch.arange(offset, offset + q, dtype=torch.int64)
        keys = torch.arange(k, dtype=torch.int64)
        out = [
            Sample(
                feeds={**feeds(style, queries, keys), **extra},
                expected=_expected(case, weights),
                label=f"Q={q} K={k} offset={offset}",
            )
        ]
        if style == "positions":
            # Distances far past the clip, both directions: one core row per query position.
            far = 3 * int(spec.max_relative_position or 0) + 5
            queries = torch.tensor([0, 1, far, 5 * far], dtype=torch.int64)
            keys = torch.cat((queries, queries + 2 * far))
            rows = []
            for p in queries.tolist():
                row = _with(spec, query_length=1, key_length=int(keys.max()) + 1, query_offset=p)
                rows.append(relative_index(row)[0, keys])
            index = torch.stack(rows)  # [Q, K]
            bias = weights[index].permute(2, 0, 1).to(getattr(torch, spec.dtype))[None]
            out.append(
                Sample(
                    feeds={**feeds(style, queries, keys), **extra},
                    expected={"index": index, "bias": bias},
                    label="far positions",
                )
            )
        return out


def _with(spec: RelativeIndexSpec, **update: Any) -> RelativeIndexSpec:
    """The canonical spec with `update` applied, its bound table kept."""
    out = RelativeIndexSpec.model_validate({**spec.canonical().model_dump(), **update}).canonical()
    if spec.bound is not None and out.bound is None:
        out = out.with_table(spec.bound)
    return out


def _expected(spec: RelativeIndexSpec, weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """The core's index and bias [1, H, rows, cols] (with `weights` when the spec has none)."""
    if spec.named_table_shape() is None:
        spec = _with(spec, relative_position_bias_table=weights.tolist())
    table = compute(spec).tensors
    return {"index": table["index"], "bias": table["bias"][None]}
