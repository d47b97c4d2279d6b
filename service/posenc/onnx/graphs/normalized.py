"""`normalized/embedding`: position_ids [B, S] (and per-sample lengths [B]) -> values [B, S].

`posenc.encodings.normalized` op for op at run time, for any positions and lengths: with p the
position and T the sample's valid length,

- `raw` p; `by_last` p / max(T - 1, 1); `by_length` p / max(T, 1); `by_max` p / t_max,
  in float32 (float64 for dtype float64), integer denominators converted exactly, cast last;
- specs with `lengths`: the graph takes `lengths` int64 [B] and writes `pad_value` where p lies
  outside [0, T) (the spec's own lengths and max_positions are only the verification case);
- specs without: T is the spec's max_positions (a constant of the graph) and nothing is padded.

The values are bit-identical to the core's (IEEE division is correctly rounded in both).
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
import torch

from posenc.encodings import compute
from posenc.encodings.normalized import NormalizedSpec
from posenc.onnx._graph import IR_DTYPES, Graph
from posenc.onnx._options import ExportOptions
from posenc.onnx._registry import GraphExporter, Sample, register_exporter

CPU = torch.device("cpu")
SAMPLE_ENTRIES = 1 << 20
"""Verification runs the spec's own lengths when B * P is at most this, else fewer rows."""


@register_exporter
class NormalizedEmbedding(GraphExporter):
    kind = "normalized"
    graph = "embedding"
    summary = "position_ids [B, S] (and lengths [B]) -> normalized positions [B, S], any length"
    modes = ("compute",)

    def build(self, g: Graph, spec: NormalizedSpec, options: ExportOptions) -> dict[str, Any]:
        op = g.op
        work = "float64" if spec.dtype == "float64" else "float32"
        pos = g.input("position_ids", "int64", ["B", "S"], "int64 positions p [B, S]")
        p: ir.Value = op.Cast(pos, to=IR_DTYPES[work])  # [B, S]
        lengths: ir.Value | None = None
        if spec.lengths is not None:
            lengths = g.input("lengths", "int64", ["B"], "int64 valid length T per sample [B]")
        values: ir.Value
        if spec.mode == "raw":
            values = p  # [B, S]
        elif spec.mode == "by_max":
            values = op.Div(p, float(spec.t_max or 1.0))  # [B, S]
        elif lengths is None:
            rows = spec.rows()  # T = max_positions, a constant: exact in float32 below 2^24
            values = op.Div(p, float(max(rows - 1 if spec.mode == "by_last" else rows, 1)))
        else:
            length: ir.Value = op.Unsqueeze(lengths, [1])  # int64 [B, 1]: T
            denom: ir.Value = op.Sub(length, 1) if spec.mode == "by_last" else length  # [B, 1]
            denom = op.Cast(op.Max(denom, 1), to=IR_DTYPES[work])  # [B, 1]: max(., 1), exact
            values = op.Div(p, denom)  # [B, S]
        if lengths is not None:
            valid: ir.Value = op.And(
                op.GreaterOrEqual(pos, 0), op.Less(pos, op.Unsqueeze(lengths, [1]))
            )  # bool [B, S]
            values = op.Where(valid, values, op.CastLike(float(spec.pad_value or 0.0), values))
        if spec.dtype != work:
            values = op.Cast(values, to=IR_DTYPES[spec.dtype])  # [B, S]
        g.output(values, "embedding", f"normalized positions ({spec.mode}) [B, S]")
        return {"mode": spec.mode, "masked": spec.lengths is not None}

    def samples(self, spec: NormalizedSpec, options: ExportOptions) -> list[Sample]:
        case = spec
        if spec.lengths is not None and len(spec.lengths) * spec.rows() > SAMPLE_ENTRIES:
            rows = max(1, SAMPLE_ENTRIES // spec.rows())
            case = NormalizedSpec.model_validate(
                {**spec.model_dump(), "lengths": spec.lengths[:rows]}
            ).canonical()
        table = compute(case, CPU).tensors["embedding"]
        p = case.rows()
        if case.lengths is None:
            feeds = {"position_ids": torch.arange(p)[None]}
            expected = table[None]  # [1, P]
        else:
            b = len(case.lengths)
            feeds = {
                "position_ids": torch.arange(p).expand(b, p),
                "lengths": torch.tensor(case.lengths, dtype=torch.int64),
            }
            expected = table  # [B, P]
        return [Sample(feeds=feeds, expected={"embedding": expected}, label=f"P={p}")]
