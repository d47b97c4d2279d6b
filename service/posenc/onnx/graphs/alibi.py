"""`alibi/bias`: query and key positions -> the additive ALiBi bias [1, H, Q, K].

Built at run time from the core's slopes (an [H, 1, 1] float32 initializer), never from a baked
[H, S, S] constant, so it has no length limit. With query position p_i and key position k_j
(inputs, or `past_length`/`query_length`: p_i = past + i, k_j = j):

- causal `m*(k_j - p_i)`, symmetric and bottom_right `-m*|k_j - p_i|` (bottom-right alignment is
  the choice of positions p_i = K - Q + i, which the `lengths` inputs give), row_constant
  `m*k_j`, mpt `m*(k_j - max_j k_j)`;
- decoder forms (causal, row_constant, mpt) fill k_j > p_i with `masked_value` (the dtype's
  minimum, -inf, or nothing).

As in `posenc.encodings.alibi.alibi_bias`: distances in int64, converted to float32 exactly,
multiplied by the float32 slopes, masked, cast to the spec dtype last (bit-identical). The output
adds to attention scores: ONNX Attention-23's `attn_mask`, onnxruntime's `attention_bias`.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
import torch

from posenc.encodings import FieldProblem, compute
from posenc.encodings.alibi import MASKED_FORMS, AlibiSpec, alibi_slopes
from posenc.onnx._graph import IR_DTYPES, Graph
from posenc.onnx._options import ExportOptions
from posenc.onnx._registry import GraphExporter, Sample, register_exporter
from posenc.onnx.graphs._pairs import feeds, query_key_positions, relative

SAMPLE_ENTRIES = 1 << 20
"""Verification runs the spec's own lengths when H*Q*K is at most this, else a smaller case."""


def _fill(spec: AlibiSpec) -> float | None:
    """The value of masked entries in float32 (exact in every output dtype), or None."""
    if spec.bias not in MASKED_FORMS or spec.masked_value == "none":
        return None
    if spec.masked_value == "-inf":
        return float("-inf")
    return float(torch.finfo(getattr(torch, spec.dtype)).min)


@register_exporter
class AlibiBias(GraphExporter):
    kind = "alibi"
    graph = "bias"
    summary = "query/key positions -> additive bias [1, H, Q, K] from the slopes, any length"
    modes = ("compute",)
    input_styles = ("positions", "lengths")

    def problems(self, spec: AlibiSpec, options: ExportOptions) -> list[FieldProblem]:
        if spec.bias is None:
            return [
                FieldProblem(
                    "bias",
                    "alibi/bias builds a bias form: set bias to one of causal, symmetric, "
                    "bottom_right, row_constant, mpt",
                    None,
                )
            ]
        return []

    def build(self, g: Graph, spec: AlibiSpec, options: ExportOptions) -> dict[str, Any]:
        op = g.op
        queries, keys = query_key_positions(g, str(options.inputs))  # [Q], [K]
        rel = relative(g, queries, keys)  # int64 [Q, K]: k_j - p_i
        dist: ir.Value
        if spec.bias == "causal":
            dist = rel  # [Q, K]
        elif spec.bias in ("symmetric", "bottom_right"):
            dist = op.Neg(op.Abs(rel))  # [Q, K]
        elif spec.bias == "row_constant":
            dist = op.Expand(op.Unsqueeze(keys, [0]), op.Shape(rel))  # [Q, K]
        else:
            newest: ir.Value = op.ReduceMax(keys, keepdims=1)  # [1]
            dist = op.Expand(op.Unsqueeze(op.Sub(keys, newest), [0]), op.Shape(rel))  # [Q, K]
        slopes = alibi_slopes(spec).reshape(-1, 1, 1)  # [H, 1, 1] float32
        distance: ir.Value = op.Cast(dist, to=ir.DataType.FLOAT)  # [Q, K]
        bias: ir.Value = op.Mul(g.initializer("slopes", slopes), distance)  # [H, Q, K]
        fill = _fill(spec)
        if fill is not None:
            future: ir.Value = op.Greater(rel, 0)  # bool [Q, K]: key after the query
            bias = op.Where(future, op.CastLike(fill, bias), bias)  # [H, Q, K]
        bias = op.Unsqueeze(bias, [0])  # [1, H, Q, K]
        if spec.dtype != "float32":
            bias = op.Cast(bias, to=IR_DTYPES[spec.dtype])  # [1, H, Q, K]
        g.output(bias, "bias", f"additive attention bias [1, {spec.local_heads}, Q, K]")
        start = spec.tp_rank * spec.local_heads
        return {
            "heads": [start, start + spec.local_heads],
            "bias_form": spec.bias,
            "masked_value": spec.masked_value,
        }

    def samples(self, spec: AlibiSpec, options: ExportOptions) -> list[Sample]:
        style = str(options.inputs)
        case = _sample_spec(spec, style)
        q, k = int(case.query_length or 0), int(case.key_length or 0)
        first = k - q if case.bias == "bottom_right" else case.query_offset
        queries = torch.arange(first, first + q, dtype=torch.int64)
        keys = torch.arange(k, dtype=torch.int64)
        bias = compute(case).tensors["bias"]  # [H, Q, K]
        return [
            Sample(
                feeds=feeds(style, queries, keys),
                expected={"bias": bias[None]},
                label=f"Q={q} K={k} offset={first}",
            )
        ]


def _sample_spec(spec: AlibiSpec, style: str) -> AlibiSpec:
    """The spec's lengths when small enough (lengths inputs: keys end at the last query)."""
    q, k, offset = int(spec.query_length or 0), int(spec.key_length or 0), spec.query_offset
    if spec.local_heads * q * k > SAMPLE_ENTRIES:
        q, offset = min(q, 16), min(offset, 64)
        k = min(k, offset + q + 16)
    if style == "lengths" and spec.bias != "bottom_right":
        k = offset + q
    if spec.bias == "bottom_right":
        offset = 0
    update = {"query_length": q, "key_length": k, "query_offset": offset}
    return AlibiSpec.model_validate({**spec.model_dump(), **update}).canonical()
