"""`learned/embedding`: position_ids [B, S] -> rows [B, S, D] of the resampled learned table.

A resampled learned table (`posenc.encodings.learned`: timm, transformers ViT, DINOv2's scale
factor, 1-D linear) depends only on the spec, so the graph embeds the core's (N', D) table in the
spec dtype and gathers rows (mode `table`, bit-identical to `/v1/tables`); the row index counts
the prefix tokens first (row 0 is the class token for the image methods). Rows outside [0, N')
make the Gather fail in onnxruntime with a message naming the range. A ViT-style consumer adding
the whole table feeds `arange(N')[None]`.

The resampling itself is not in the graph: export one graph per target grid (or length). A graph
resizing at run time for each input resolution (transformers' `interpolate_pos_encoding=True`)
would need ONNX Resize to reproduce PyTorch's bicubic kernels, with and without antialias, which
posenc has not verified. The spec must have its table bound (inline, or `resolve_tables` with the
table store).
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
import torch

from posenc.encodings import FieldProblem, compute
from posenc.encodings.learned import LearnedSpec
from posenc.onnx._graph import Graph
from posenc.onnx._options import ExportOptions
from posenc.onnx._registry import GraphExporter, Sample, register_exporter

CPU = torch.device("cpu")
MAX_TABLE_BYTES = 1 << 30
"""Embedded tables above 1 GiB are refused (protobuf caps a model at 2 GiB)."""


@register_exporter
class LearnedEmbedding(GraphExporter):
    kind = "learned"
    graph = "embedding"
    summary = "position_ids [B, S] -> rows [B, S, D] of the resampled learned table (embedded)"
    modes = ("table",)

    def problems(self, spec: LearnedSpec, options: ExportOptions) -> list[FieldProblem]:
        size = spec.output_bytes()
        if size <= MAX_TABLE_BYTES:
            return []
        return [
            FieldProblem(
                "new_grid" if spec.method != "linear_1d" else "new_length",
                f"the resampled table would take {size} bytes (limit {MAX_TABLE_BYTES})",
                spec.new_grid if spec.method != "linear_1d" else spec.new_length,
            )
        ]

    def build(self, g: Graph, spec: LearnedSpec, options: ExportOptions) -> dict[str, Any]:
        op = g.op
        rows, dim = spec.new_rows(), spec.shape()[1]
        pos = g.input("position_ids", "int64", ["B", "S"], "int64 row indices [B, S]")
        valid: ir.Value = op.And(op.GreaterOrEqual(pos, 0), op.Less(pos, rows))  # bool [B, S]
        safe: ir.Value = op.Where(valid, pos, rows)  # [B, S]: out of range -> past the end
        name = (
            f"position_ids must lie in [0, {rows}): the resampled table has {rows} rows "
            f"({spec.prefix()} prefix tokens first)"
        )
        table = compute(spec, CPU).tensors["embedding"]  # [N', D]
        out: ir.Value = op.Gather(g.initializer("embedding_table", table), safe, _name=name)
        g.output(out, "embedding", f"learned position rows [B, S, {dim}]")
        return {"rows": rows, "num_prefix_tokens": spec.prefix(), "method": spec.method}

    def samples(self, spec: LearnedSpec, options: ExportOptions) -> list[Sample]:
        table = compute(spec, CPU).tensors["embedding"]  # [N', D]
        rows = table.shape[0]
        n = min(rows, 64)
        picks = torch.cat((torch.arange(n), torch.arange(rows - n, rows))).reshape(2, n)
        return [
            Sample(
                feeds={"position_ids": picks}, expected={"embedding": table[picks]}, label="rows"
            )
        ]
