"""`t5_bias/bias`: query and key positions -> T5 buckets [Q, K] and bias [1, H, Q, K].

rel = k_j - p_i. Bidirectional: bucket base nb' * (rel > 0) with nb' = num_buckets / 2 and
n = |rel|; causal: base 0, nb' = num_buckets, n = max(-rel, 0). The in-direction bucket of n:

- mode `table`: a lookup table over n = 0..max_distance built by the core
  (`relative_position_bucket`, transformers' fp32 ops on the CPU), indexed by min(n, max_distance):
  every bucket past max_distance is nb' - 1, so the table is complete and exact for any length;
- mode `compute`: transformers' formula in the graph, `max_exact + int(log(max(n, max_exact) /
  max_exact) / log(max_distance / max_exact) * (nb' - max_exact))` capped at nb' - 1, with n
  clamped before the log (log 0 = -inf cast to an integer is undefined), selected by
  n < max_exact. onnxruntime's fp32 `Log` can round differently from torch's by an ulp, which
  moves a bucket where the product lands on an integer; verification compares the buckets
  exactly for the spec's lengths, and `table` is exact everywhere.

bias[0, h, i, j] = E[bucket[i, j], h] with E = `relative_attention_bias` (num_buckets, H): an
initializer when the spec carries the weights, else a graph input. T5 adds it to unscaled scores.
"""

from __future__ import annotations

import math
from typing import Any

import onnx_ir as ir
import torch

from posenc.encodings import compute
from posenc.encodings.t5_bias import T5BiasSpec, relative_position_bucket
from posenc.onnx._graph import IR_DTYPES, Graph
from posenc.onnx._options import ExportOptions
from posenc.onnx._registry import GraphExporter, Sample, register_exporter
from posenc.onnx.graphs._pairs import feeds, query_key_positions, relative

SAMPLE_ENTRIES = 1 << 20
SAMPLE_HEADS = 4
"""Heads of the random weights verification feeds when the spec carries none."""


def bucket_lookup(spec: T5BiasSpec) -> torch.Tensor:
    """In-direction bucket of n = 0..max_distance, int64 [max_distance + 1], from the core."""
    nb, _ = spec.bucket_split()
    n = torch.arange(spec.max_distance + 1, dtype=torch.int64)
    # Causal bucketing of -n with nb' buckets is the in-direction bucket of either mode.
    return relative_position_bucket(-n, False, nb, spec.max_distance)


def _in_direction_table(g: Graph, spec: T5BiasSpec, n: ir.Value) -> ir.Value:
    op = g.op
    capped: ir.Value = op.Min(n, spec.max_distance)  # [Q, K]
    bucket: ir.Value = op.Gather(g.initializer("bucket_lookup", bucket_lookup(spec)), capped)
    return bucket  # int64 [Q, K]


def _in_direction_compute(g: Graph, spec: T5BiasSpec, n: ir.Value) -> ir.Value:
    op = g.op
    nb, max_exact = spec.bucket_split()
    clamped: ir.Value = op.Cast(op.Max(n, max_exact), to=ir.DataType.FLOAT)  # [Q, K]
    ratio: ir.Value = op.Div(clamped, float(max_exact))  # [Q, K] >= 1
    scaled: ir.Value = op.Div(op.Log(ratio), math.log(spec.max_distance / max_exact))  # [Q, K]
    steps: ir.Value = op.Cast(op.Mul(scaled, float(nb - max_exact)), to=ir.DataType.INT64)
    large: ir.Value = op.Min(op.Add(steps, max_exact), nb - 1)  # int64 [Q, K]
    bucket: ir.Value = op.Where(op.Less(n, max_exact), n, large)  # int64 [Q, K]
    return bucket


@register_exporter
class T5Bias(GraphExporter):
    kind = "t5_bias"
    graph = "bias"
    summary = "query/key positions -> T5 buckets [Q, K] and bias [1, H, Q, K], any length"
    modes = ("table", "compute")
    input_styles = ("positions", "lengths")

    def build(self, g: Graph, spec: T5BiasSpec, options: ExportOptions) -> dict[str, Any]:
        op = g.op
        nb, max_exact = spec.bucket_split()
        queries, keys = query_key_positions(g, str(options.inputs))  # [Q], [K]
        rel = relative(g, queries, keys)  # int64 [Q, K]
        n: ir.Value
        if spec.bidirectional:
            n = op.Abs(rel)  # [Q, K]
            base: ir.Value | None = op.Mul(op.Cast(op.Greater(rel, 0), to=ir.DataType.INT64), nb)
        else:
            n = op.Max(op.Neg(rel), 0)  # [Q, K]
            base = None
        if options.mode == "table":
            bucket = _in_direction_table(g, spec, n)  # [Q, K]
        else:
            bucket = _in_direction_compute(g, spec, n)  # [Q, K]
        if base is not None:
            bucket = op.Add(base, bucket)  # [Q, K]
        weights: ir.Value
        if spec.relative_attention_bias is None:
            weights = g.input(
                "relative_attention_bias",
                spec.dtype,
                [spec.num_buckets, "H"],
                "T5Attention.relative_attention_bias.weight (num_buckets, H)",
            )
        else:
            table = torch.tensor(spec.relative_attention_bias, dtype=torch.float32)
            weights = g.initializer("relative_attention_bias", table)  # [nb, H]
        gathered: ir.Value = op.Gather(weights, bucket, axis=0)  # [Q, K, H]
        bias: ir.Value = op.Unsqueeze(op.Transpose(gathered, perm=[2, 0, 1]), [0])  # [1, H, Q, K]
        if spec.relative_attention_bias is not None and spec.dtype != "float32":
            bias = op.Cast(bias, to=IR_DTYPES[spec.dtype])  # [1, H, Q, K]
        g.output(bucket, "buckets", "int64 relative position buckets [Q, K]")
        g.output(bias, "bias", "additive attention bias [1, H, Q, K] (T5: unscaled scores)")
        return {"max_exact": max_exact, "buckets_per_direction": nb}

    def samples(self, spec: T5BiasSpec, options: ExportOptions) -> list[Sample]:
        style = str(options.inputs)
        weights = spec.relative_attention_bias
        extra: dict[str, torch.Tensor] = {}
        if weights is None:
            gen = torch.Generator().manual_seed(0)
            table = torch.randn(spec.num_buckets, SAMPLE_HEADS, generator=gen)
            extra = {"relative_attention_bias": table}
            weights = table.tolist()
        q, k, offset = int(spec.query_length or 0), int(spec.key_length or 0), spec.query_offset
        if q * k > SAMPLE_ENTRIES:
            q, offset = min(q, 16), min(offset, 64)
            k = min(k, offset + q + 64)
        if style == "lengths":
            k = offset + q
        case = T5BiasSpec.model_validate(
            {
                **spec.model_dump(),
                "query_length": q,
                "key_length": k,
                "query_offset": offset,
                "relative_attention_bias": weights,
            }
        ).canonical()
        core = compute(case).tensors
        queries = torch.arange(offset, offset + q, dtype=torch.int64)
        keys = torch.arange(k, dtype=torch.int64)
        out = [
            Sample(
                feeds={**feeds(style, queries, keys), **extra},
                expected={"buckets": core["buckets"], "bias": core["bias"][None]},
                label=f"Q={q} K={k} offset={offset}",
            )
        ]
        if style == "positions":
            # Distances far past max_distance, both directions, through the core's bucket rule.
            far = torch.tensor([0, 3, spec.max_distance, 5 * spec.max_distance], dtype=torch.int64)
            keys = torch.cat((far, far + 7 * spec.max_distance))
            rel = keys[None, :] - far[:, None]
            buckets = relative_position_bucket(
                rel, spec.bidirectional, spec.num_buckets, spec.max_distance
            )
            e = torch.tensor(weights, dtype=torch.float32)
            bias = e.t()[:, buckets].to(getattr(torch, spec.dtype))
            out.append(
                Sample(
                    feeds={**feeds(style, far, keys), **extra},
                    expected={"buckets": buckets, "bias": bias[None]},
                    label="far positions",
                )
            )
        return out
