"""`sinusoidal_2d/embedding`: grid size (and DETR's valid extents) -> the 2-D table.

Inputs are int64 scalars, so one graph serves every image size:

- detr: `height`, `width`, `valid_height`, `valid_width` -> embedding [2F, H, W]. The mask of
  the valid top-left block is cumulatively summed along each axis (CumSum), optionally
  normalised `(c + offset) / (c_last + eps) * scale`, divided by `t ** (2*(i//2)/F)`, sin on
  even and cos on odd channels, y block first (transformers `DetrSinePositionEmbedding`).
- mae: `grid_height`, `grid_width` -> [H*W (+1 cls row), D]: per token
  [sin(x w), cos(x w), sin(y w), cos(y w)], tokens row-major.
- timm: `grid_height`, `grid_width` -> [H*W, D]: [sin y, sin x, cos y, cos x] (or
  [sin y, cos y, sin x, cos x] with interleave_sin_cos; axes swapped with reverse_coord).

Each style computes in its spec's compute dtype with the core's op order; the frequency vectors
are built in torch as `posenc.encodings.sinusoidal_2d` builds them (bit-identical initializers)
and verification compares the whole table with the core's. Cast to the spec dtype last.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
import torch

from posenc.encodings import compute
from posenc.encodings.sinusoidal_2d import Sinusoidal2DSpec
from posenc.onnx._graph import IR_DTYPES, Graph
from posenc.onnx._options import ExportOptions
from posenc.onnx._registry import ATOL, GraphExporter, Sample, register_exporter

CPU = torch.device("cpu")


def _dt(spec: Sinusoidal2DSpec) -> torch.dtype:
    return torch.float64 if spec.compute_dtype == "float64" else torch.float32


def _with(spec: Sinusoidal2DSpec, **update: Any) -> Sinusoidal2DSpec:
    return Sinusoidal2DSpec.model_validate({**spec.model_dump(), **update}).canonical()


def _axis_range(g: Graph, size: ir.Value, cd: ir.DataType) -> ir.Value:
    """arange(size) in the compute dtype [size]."""
    op = g.op
    values: ir.Value = op.Cast(op.Range(0, size, 1), to=cd)  # [size]
    return values


def _detr(g: Graph, spec: Sinusoidal2DSpec) -> ir.Value:
    op = g.op
    cd = IR_DTYPES[str(spec.compute_dtype)]
    feats = int(spec.num_pos_feats or 0)
    height = g.input("height", "int64", [], "int64 scalar: padded feature map height H")
    width = g.input("width", "int64", [], "int64 scalar: padded feature map width W")
    valid_h = g.input("valid_height", "int64", [], "int64 scalar: unpadded rows (top)")
    valid_w = g.input("valid_width", "int64", [], "int64 scalar: unpadded columns (left)")
    rows: ir.Value = op.Less(op.Range(0, height, 1), valid_h)  # bool [H]
    cols: ir.Value = op.Less(op.Range(0, width, 1), valid_w)  # bool [W]
    # An empty valid block is empty whichever side is zero (as the core's canonical form says).
    inside: ir.Value = op.And(op.Unsqueeze(rows, [1]), op.Unsqueeze(cols, [0]))  # bool [H, W]
    mask: ir.Value = op.Cast(inside, to=cd)  # [H, W]
    y_embed: ir.Value = op.CumSum(mask, op.Constant(value_int=0))  # [H, W]
    x_embed: ir.Value = op.CumSum(mask, op.Constant(value_int=1))  # [H, W]
    if spec.normalize:
        eps, scale, offset = float(spec.eps or 0.0), float(spec.scale or 0.0), spec.offset
        y_last: ir.Value = op.Slice(y_embed, [-1], [1 << 62], [0])  # [1, W]
        x_last: ir.Value = op.Slice(x_embed, [-1], [1 << 62], [1])  # [H, 1]
        y_num: ir.Value = op.Add(y_embed, offset) if offset else y_embed  # [H, W]
        x_num: ir.Value = op.Add(x_embed, offset) if offset else x_embed  # [H, W]
        y_embed = op.Mul(op.Div(y_num, op.Add(y_last, eps)), scale)  # [H, W]
        x_embed = op.Mul(op.Div(x_num, op.Add(x_last, eps)), scale)  # [H, W]
    i = torch.arange(feats, dtype=torch.int64).to(_dt(spec))
    exponent = 2 * torch.div(i, 2, rounding_mode="floor") / feats

    def axis(coord: ir.Value, temperature: float, name: str) -> ir.Value:
        dim_t = g.initializer(name, temperature**exponent)  # [F]
        pos: ir.Value = op.Div(op.Unsqueeze(coord, [2]), dim_t)  # [H, W, F]
        even: ir.Value = op.Sin(op.Slice(pos, [0], [feats], [2], [2]))  # [H, W, F/2]
        odd: ir.Value = op.Cos(op.Slice(pos, [1], [feats], [2], [2]))  # [H, W, F/2]
        pairs: ir.Value = op.Concat(op.Unsqueeze(even, [3]), op.Unsqueeze(odd, [3]), axis=3)
        flat: ir.Value = op.Reshape(pairs, [0, 0, -1])  # [H, W, F]
        return flat

    pos_y = axis(y_embed, float(spec.temperature_h or 0.0), "dim_t_y")  # [H, W, F]
    pos_x = axis(x_embed, float(spec.temperature_w or 0.0), "dim_t_x")  # [H, W, F]
    both: ir.Value = op.Concat(pos_y, pos_x, axis=2)  # [H, W, 2F]
    table: ir.Value = op.Transpose(both, perm=[2, 0, 1])  # [2F, H, W]
    return table


def _grid_inputs(g: Graph) -> tuple[ir.Value, ir.Value]:
    h = g.input("grid_height", "int64", [], "int64 scalar: patch rows H")
    w = g.input("grid_width", "int64", [], "int64 scalar: patch columns W")
    return h, w


def _outer_grid(
    g: Graph, first: ir.Value, second: ir.Value, freqs: ir.Value, quarter: int
) -> tuple[ir.Value, ir.Value]:
    """(first[r] * f, second[c] * f) broadcast to [R, C, D/4] for an R x C grid."""
    op = g.op
    shape: ir.Value = op.Concat(
        op.Reshape(op.Size(first), [1]), op.Reshape(op.Size(second), [1]), [quarter], axis=0
    )  # int64 [3]: R, C, D/4
    a: ir.Value = op.Expand(op.Mul(op.Unsqueeze(first, [1, 2]), freqs), shape)  # [R, C, D/4]
    b: ir.Value = op.Expand(op.Mul(op.Unsqueeze(second, [0, 2]), freqs), shape)  # [R, C, D/4]
    return a, b


def _mae(g: Graph, spec: Sinusoidal2DSpec) -> ir.Value:
    op = g.op
    cd = IR_DTYPES[str(spec.compute_dtype)]
    dim = int(spec.dim or 0)
    quarter = dim // 4
    omega = torch.arange(quarter, dtype=_dt(spec)) / quarter
    omega = 1.0 / float(spec.temperature or 0.0) ** omega  # [D/4]
    h, w = _grid_inputs(g)
    ys, xs = _axis_range(g, h, cd), _axis_range(g, w, cd)  # [H], [W]
    emb_h, emb_w = _outer_grid(g, ys, xs, g.initializer("omega", omega), quarter)  # [H, W, D/4]
    parts = (op.Sin(emb_w), op.Cos(emb_w), op.Sin(emb_h), op.Cos(emb_h))
    table: ir.Value = op.Reshape(op.Concat(*parts, axis=2), [-1, dim])  # [H*W, D]
    if spec.cls_token:
        zeros = g.initializer("cls_row", torch.zeros(1, dim, dtype=_dt(spec)))  # [1, D]
        table = op.Concat(zeros, table, axis=0)  # [H*W + 1, D]
    return table


def _timm(g: Graph, spec: Sinusoidal2DSpec) -> ir.Value:
    op = g.op
    cd = IR_DTYPES[str(spec.compute_dtype)]
    dim = int(spec.dim or 0)
    quarter = dim // 4
    exp = torch.arange(0, quarter, 1, dtype=torch.int64).to(_dt(spec)) / quarter
    bands = 1.0 / (float(spec.temperature or 0.0) ** exp)  # [D/4]
    h, w = _grid_inputs(g)
    sizes = (w, h) if spec.reverse_coord else (h, w)
    first, second = _axis_range(g, sizes[0], cd), _axis_range(g, sizes[1], cd)
    p0, p1 = _outer_grid(g, first, second, g.initializer("bands", bands), quarter)
    if spec.interleave_sin_cos:
        parts = (op.Sin(p0), op.Cos(p0), op.Sin(p1), op.Cos(p1))
    else:
        parts = (op.Sin(p0), op.Sin(p1), op.Cos(p0), op.Cos(p1))
    table: ir.Value = op.Reshape(op.Concat(*parts, axis=2), [-1, dim])  # [H*W, D]
    return table


_BUILDERS = {"detr": _detr, "mae": _mae, "timm": _timm}


@register_exporter
class Sinusoidal2DEmbedding(GraphExporter):
    kind = "sinusoidal_2d"
    graph = "embedding"
    summary = "grid size (and DETR valid extents) -> the 2-D sine/cosine table, any size"
    modes = ("compute",)

    def build(self, g: Graph, spec: Sinusoidal2DSpec, options: ExportOptions) -> dict[str, Any]:
        op = g.op
        table = _BUILDERS[spec.style](g, spec)
        if spec.dtype != spec.compute_dtype:
            table = op.Cast(table, to=IR_DTYPES[str(spec.dtype)])
        shape = "[2F, H, W]" if spec.style == "detr" else "[H*W (+1), D]"
        g.output(table, "embedding", f"{spec.style} 2-D sinusoidal table {shape}")
        return {"style": spec.style}

    def samples(self, spec: Sinusoidal2DSpec, options: ExportOptions) -> list[Sample]:
        cases = [("spec size", spec)]
        if spec.style == "detr":
            h, w = int(spec.height or 0), int(spec.width or 0)
            other = _with(
                spec,
                height=h + 3,
                width=max(1, w - 1),
                valid_height=min(int(spec.valid_height or 0) + 1, h + 3),
                valid_width=min(int(spec.valid_width or 0), max(1, w - 1)),
            )
        else:
            gh, gw = int(spec.grid_height or 0), int(spec.grid_width or 0)
            other = _with(spec, grid_height=gw + 1, grid_width=gh + 2)
        cases.append(("another size", other))
        out = []
        for label, case in cases:
            if case.style == "detr":
                sizes = {
                    "height": case.height,
                    "width": case.width,
                    "valid_height": case.valid_height,
                    "valid_width": case.valid_width,
                }
            else:
                sizes = {"grid_height": case.grid_height, "grid_width": case.grid_width}
            out.append(
                Sample(
                    feeds={
                        k: torch.tensor(int(v or 0), dtype=torch.int64) for k, v in sizes.items()
                    },
                    expected={"embedding": compute(case, CPU).tensors["embedding"]},
                    atol=ATOL[str(spec.dtype)],
                    label=label,
                )
            )
        return out
