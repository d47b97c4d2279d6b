"""`vision_rope/cos_sin`: patch_ids [S] -> cos, sin [S, w] of a vision tower's rotary table.

The table of one grid (`posenc.encodings.vision_rope`: rows in the tower's order, its layout)
depends only on the spec, so the graph embeds the core's (N, w) cos and sin in the spec dtype and
gathers rows (mode `table`, bit-identical to `/v1/tables`). A tower rotating every patch feeds
`arange(N)`; rows outside [0, N) make the Gather fail in onnxruntime with a message naming the
range. One graph per grid: the merge/window order and (DINOv3) the normalised coordinates change
with the grid, so they are baked in, not computed from grid inputs.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
import torch

from posenc.encodings import FieldProblem, compute
from posenc.encodings.vision_rope import VisionRopeSpec
from posenc.onnx._graph import Graph
from posenc.onnx._options import ExportOptions
from posenc.onnx._registry import GraphExporter, Sample, register_exporter

CPU = torch.device("cpu")
MAX_TABLE_BYTES = 1 << 30
"""Embedded tables above 1 GiB are refused (protobuf caps a model at 2 GiB)."""


@register_exporter
class VisionRopeCosSin(GraphExporter):
    kind = "vision_rope"
    graph = "cos_sin"
    summary = "patch_ids [S] -> cos, sin [S, w] of the tower's table for one grid (embedded)"
    modes = ("table",)

    def problems(self, spec: VisionRopeSpec, options: ExportOptions) -> list[FieldProblem]:
        size = spec.output_bytes()
        if size <= MAX_TABLE_BYTES:
            return []
        message = f"the table would take {size} bytes (limit {MAX_TABLE_BYTES})"
        return [FieldProblem("grid_height", message, spec.grid_height)]

    def build(self, g: Graph, spec: VisionRopeSpec, options: ExportOptions) -> dict[str, Any]:
        op = g.op
        rows = spec.rows()
        ids = g.input("patch_ids", "int64", ["S"], "int64 row indices [S] in the tower's order")
        valid: ir.Value = op.And(op.GreaterOrEqual(ids, 0), op.Less(ids, rows))  # bool [S]
        safe: ir.Value = op.Where(valid, ids, rows)  # [S]: out of range -> past the end
        table = compute(spec, CPU).tensors
        width = table["cos"].shape[1]
        for name in ("cos", "sin"):
            message = f"patch_ids must lie in [0, {rows}): the {name} table has {rows} rows"
            init = g.initializer(f"{name}_table", table[name])  # [N, w]
            out: ir.Value = op.Gather(init, safe, _name=f"{name}: {message}")  # [S, w]
            g.output(out, name, f"{name} rows [S, {width}]")
        return {
            "rows": rows,
            "style": spec.style,
            "width": spec.width,
            "pairing": {"llama4": "interleaved", "gemma4": "half_split_per_axis"}.get(
                spec.style, "half_split"
            ),
        }

    def samples(self, spec: VisionRopeSpec, options: ExportOptions) -> list[Sample]:
        table = compute(spec, CPU).tensors
        rows = spec.rows()
        ids = torch.arange(rows - 1, -1, -1) if rows <= 4096 else torch.arange(4096)
        expected = {name: table[name][ids] for name in ("cos", "sin")}
        return [Sample(feeds={"patch_ids": ids}, expected=expected, label="rows")]
