"""xPos graphs: `xpos/cos_sin` (position_ids -> the four tables) and `xpos/rotary` (x -> rotated x
with the query or key decay).

Both start from half-width values [B, S, d/2] at the position ids n (`posenc.encodings.xpos`):
cos(n theta), sin(n theta) and the decay s = zeta ** ((n - c) / scale_base) with the spec's
resolved centre c, a constant of the graph.

- mode `table`: a Gather from the core's tables (embedded in the spec dtype, bit-identical to the
  served tables) at rows n - position_offset; positions outside the rows make the Gather fail in
  onnxruntime with a message naming the range.
- mode `compute`: torchscale's fp32 ops in its order (float64 for precision `exact`): zeta and
  theta are the core's (bit-identical initializers), `exponent = float(n - c) / scale_base`,
  `s = Pow(zeta, exponent)`, `angles = float(n) * theta`, then `cos * s`, `sin * s` (queries),
  `cos * (1 / s)`, `sin * (1 / s)` (keys), cast last. No length limit, but the decay grows with
  |n - c|: positions far outside the spec's rows can overflow the dtype (the spec checks its own
  rows only). onnxruntime's Pow, Cos and Sin may differ from torch's by an ulp.

cos_sin lays the values out like the table (`packing` premultiplied or factored, `width`,
`interleaved`). rotary applies the role's premultiplied caches (query: cos * s, sin * s; key:
cos / s, sin / s) with the rotation of `_rotary` in one of three implementations: `decomposed`
(torchscale's `x * cos + rotate_every_two(x) * sin`, or rotate-half for `interleaved: false`),
`onnx` (RotaryEmbedding-23) or `contrib` (com.microsoft.RotaryEmbedding). The RotaryEmbedding ops
apply xPos unchanged because the caches are pre-multiplied: that is the point of that layout.
The centre cancels in every q.k, so a query graph and a key graph of the same spec give
torchscale's scores.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
import torch

from posenc.encodings import FieldProblem, SpecError, compute
from posenc.encodings.xpos import OUTPUT_NAMES, XposSpec
from posenc.onnx._graph import IR_DTYPES, Graph
from posenc.onnx._options import ExportOptions
from posenc.onnx._registry import ATOL, GraphExporter, Sample, register_exporter
from posenc.onnx.graphs._rotary import (
    full_width,
    reference_rotate,
    rotary_problems,
    rotate,
    x_input,
)

CPU = torch.device("cpu")
MAX_TABLE_BYTES = 1 << 30
"""Embedded tables above 1 GiB are refused (protobuf caps a model at 2 GiB): use mode compute."""
PAST_ROWS = 17
"""Compute mode is verified this many positions past the spec's rows (when the decay fits)."""


def with_fields(spec: XposSpec, **update: Any) -> XposSpec:
    """`spec` with fields replaced, validated again and canonical."""
    return XposSpec.model_validate({**spec.model_dump(), **update}).canonical()


def _compute_dtype(spec: XposSpec) -> str:
    return "float64" if spec.precision == "exact" else "float32"


def _constants(spec: XposSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """zeta and theta [d/2] in the compute dtype, by the core's expressions."""
    d, half = spec.head_dim, spec.head_dim // 2
    dt = torch.float64 if spec.precision == "exact" else torch.float32
    zeta = (torch.arange(0, d, 2).to(dt) + spec.gamma * d) / ((1.0 + spec.gamma) * d)
    theta = 1.0 / (spec.base ** (torch.arange(0, half).to(dt) / half))
    return zeta, theta


def _compute_half(g: Graph, spec: XposSpec, pos: ir.Value) -> dict[str, ir.Value]:
    """cos, sin, scale_q (s) and scale_k (1/s), half width [B, S, d/2], compute dtype, uncast."""
    op = g.op
    to = IR_DTYPES[_compute_dtype(spec)]
    zeta_t, theta_t = _constants(spec)
    zeta, theta = g.initializer("zeta", zeta_t), g.initializer("theta", theta_t)  # [d/2]
    centred: ir.Value = op.Cast(op.Sub(pos, spec.resolved_centre()), to=to)  # [B, S]
    exponent: ir.Value = op.Div(centred, spec.scale_base)  # [B, S]
    s: ir.Value = op.Pow(zeta, op.Unsqueeze(exponent, [-1]))  # [B, S, d/2]
    angles: ir.Value = op.Mul(op.Unsqueeze(op.Cast(pos, to=to), [-1]), theta)  # [B, S, d/2]
    return {
        "cos": op.Cos(angles),  # [B, S, d/2]
        "sin": op.Sin(angles),  # [B, S, d/2]
        "scale_q": s,
        "scale_k": op.Div(op.CastLike(1.0, s), s),  # [B, S, d/2]: torchscale's 1 / scale
    }


def _packed(g: Graph, half: dict[str, ir.Value], packing: str) -> dict[str, ir.Value]:
    """The four outputs of `packing` from cos, sin, scale_q, scale_k (half width)."""
    if packing == "factored":
        return half
    op = g.op
    cos, sin, s_q, s_k = half["cos"], half["sin"], half["scale_q"], half["scale_k"]
    return {
        "cos_q": op.Mul(cos, s_q),  # [B, S, d/2]
        "sin_q": op.Mul(sin, s_q),  # [B, S, d/2]
        "cos_k": op.Mul(cos, s_k),  # [B, S, d/2]
        "sin_k": op.Mul(sin, s_k),  # [B, S, d/2]
    }


def _gather_rows(
    g: Graph, spec: XposSpec, pos: ir.Value, tables: dict[str, torch.Tensor]
) -> dict[str, ir.Value]:
    """Rows n - position_offset [B, S, w] of each embedded table, range-checked."""
    op = g.op
    first, rows = spec.position_offset, spec.max_positions
    index: ir.Value = op.Sub(pos, first)  # [B, S]
    valid: ir.Value = op.And(op.GreaterOrEqual(index, 0), op.Less(index, rows))  # bool [B, S]
    safe: ir.Value = op.Where(valid, index, rows)  # [B, S]: out of range -> past the end
    message = (
        f"position_ids must lie in [{first}, {first + rows}): the embedded tables have {rows} "
        "rows (export mode 'compute' for other positions)"
    )
    out = {}
    for name, table in tables.items():
        out[name] = op.Gather(
            g.initializer(f"{name}_table", table), safe, axis=0, _name=f"{message} [{name}]"
        )  # [B, S, w]
    return out


def _table_problems(spec: XposSpec, options: ExportOptions, tables: int) -> list[FieldProblem]:
    if options.mode != "table":
        return []
    w = spec.head_dim if spec.width == "full" else spec.head_dim // 2
    size = tables * spec.max_positions * w * (4 if spec.dtype == "float32" else 2)
    if size <= MAX_TABLE_BYTES:
        return []
    return [
        FieldProblem(
            "mode",
            f"the embedded tables would take {size} bytes (limit {MAX_TABLE_BYTES}): use mode "
            "'compute'",
            options.mode,
        )
    ]


def _notes(spec: XposSpec) -> dict[str, Any]:
    return {
        "centre": spec.resolved_centre(),
        "max_log_scale": spec.max_log_scale(),
        "position_offset": spec.position_offset,
    }


def _sample_rows(spec: XposSpec, mode: str) -> list[tuple[str, XposSpec]]:
    """Specs whose rows are the sampled positions, with the same centre: the spec's rows, and in
    compute mode PAST_ROWS more (unless their decay would overflow the dtype)."""
    fixed = with_fields(spec, centre=spec.resolved_centre())
    cases = [("rows", fixed)]
    if mode == "compute":
        try:
            longer = with_fields(fixed, max_positions=spec.max_positions + PAST_ROWS)
        except SpecError:
            longer = None  # the decay past the rows leaves the dtype's range
        if longer is not None:
            cases.append(("past the rows", longer))
    return cases


def _sample_positions(case: XposSpec) -> torch.Tensor:
    """[2, n]: the first and the last n rows of `case`, as position ids."""
    count = case.max_positions
    n = min(count, 64)
    picks = torch.cat((torch.arange(n), torch.arange(count - n, count)))
    return (picks + case.position_offset).reshape(2, n)


def _atol(spec: XposSpec, mode: str, expected: dict[str, torch.Tensor]) -> float:
    """0 for table mode; else 2 ATOL of the dtype relative to the largest value (the decay makes
    values O(s), and Pow/Cos/Sin may each be an ulp off torch's)."""
    if mode == "table":
        return 0.0
    peak = max(float(t.double().abs().max()) for t in expected.values())
    return 2 * ATOL[spec.dtype] * max(1.0, peak)


@register_exporter
class XposCosSin(GraphExporter):
    kind = "xpos"
    graph = "cos_sin"
    summary = (
        "position_ids [B, S] -> cos_q, sin_q, cos_k, sin_k (or cos, sin, scale_q, scale_k) "
        "[B, S, width] laid out like the spec's tables"
    )
    modes = ("table", "compute")

    def problems(self, spec: XposSpec, options: ExportOptions) -> list[FieldProblem]:
        return _table_problems(spec, options, 4)

    def build(self, g: Graph, spec: XposSpec, options: ExportOptions) -> dict[str, Any]:
        op = g.op
        pos = g.input("position_ids", "int64", ["B", "S"], "int64 position ids [B, S]")
        if options.mode == "table":
            outputs = _gather_rows(g, spec, pos, compute(spec, CPU).tensors)  # [B, S, w]
        else:
            outputs = _packed(g, _compute_half(g, spec, pos), spec.packing)  # [B, S, d/2]
            for name, value in outputs.items():
                if spec.width == "full":
                    value = full_width(g, value, spec.interleaved)  # [B, S, d]
                if spec.dtype != _compute_dtype(spec):
                    value = op.Cast(value, to=IR_DTYPES[spec.dtype])  # [B, S, w]
                outputs[name] = value
        for name in OUTPUT_NAMES[spec.packing]:
            g.output(outputs[name], name, f"xPos {name} [B, S, {spec.width} width]")
        return _notes(spec)

    def samples(self, spec: XposSpec, options: ExportOptions) -> list[Sample]:
        out = []
        for label, case in _sample_rows(spec, str(options.mode)):
            positions = _sample_positions(case)
            rows = positions - case.position_offset
            table = compute(case, CPU).tensors
            expected = {name: t[rows] for name, t in table.items()}  # [2, n, w]
            atol = _atol(spec, str(options.mode), expected)
            out.append(
                Sample(feeds={"position_ids": positions}, expected=expected, atol=atol, label=label)
            )
        return out


@register_exporter
class XposRotary(GraphExporter):
    kind = "xpos"
    graph = "rotary"
    summary = (
        "x [B, N, S, H] (or [B, S, N*H] with num_heads) and position_ids [B, S] -> x rotated "
        "with the query (role query) or key (role key) decay"
    )
    modes = ("table", "compute")
    ops = ("decomposed", "onnx", "contrib")
    roles = ("query", "key")
    takes_num_heads = True

    def normalize(self, spec: XposSpec) -> XposSpec:
        # Rotation reads the half-width premultiplied caches; width and packing are table layouts.
        return with_fields(spec, width="half", packing="premultiplied")

    def problems(self, spec: XposSpec, options: ExportOptions) -> list[FieldProblem]:
        return _table_problems(spec, options, 2) + rotary_problems(spec.dtype, options)

    def build(self, g: Graph, spec: XposSpec, options: ExportOptions) -> dict[str, Any]:
        op = g.op
        suffix = "q" if options.role == "query" else "k"
        heads = options.num_heads
        x = x_input(g, spec.dtype, spec.head_dim, heads)
        pos = g.input("position_ids", "int64", ["B", "S"], "int64 position ids [B, S]")
        names = (f"cos_{suffix}", f"sin_{suffix}")
        if options.mode == "table":
            tables = compute(spec, CPU).tensors
            caches = _gather_rows(g, spec, pos, {n: tables[n] for n in names})  # [B, S, d/2]
        else:
            caches = _packed(g, _compute_half(g, spec, pos), "premultiplied")  # [B, S, d/2]
            if spec.dtype != _compute_dtype(spec):
                caches = {n: op.Cast(caches[n], to=IR_DTYPES[spec.dtype]) for n in names}
        y = rotate(
            g,
            x,
            pos,
            caches[names[0]],
            caches[names[1]],
            op_kind=str(options.op),
            head_dim=spec.head_dim,
            rotary_dim=spec.head_dim,
            interleaved=spec.interleaved,
            heads=heads,
            dtype=spec.dtype,
        )  # like x
        g.output(y, "y", f"x rotated with the xPos {options.role} decay")
        return {**_notes(spec), "role": options.role}

    def samples(self, spec: XposSpec, options: ExportOptions) -> list[Sample]:
        out = []
        gen = torch.Generator().manual_seed(0)
        heads = options.num_heads or 3
        dtype = getattr(torch, spec.dtype)
        suffix = "q" if options.role == "query" else "k"
        for label, case in _sample_rows(spec, str(options.mode)):
            positions = _sample_positions(case)
            positions = positions[:, :: max(1, positions.shape[1] // 6)]  # [2, <= 7]
            b, s = positions.shape
            table = compute(case, CPU).tensors
            rows = positions - case.position_offset
            cos, sin = table[f"cos_{suffix}"][rows], table[f"sin_{suffix}"][rows]  # [B, S, d/2]
            x = (torch.rand(b, heads, s, spec.head_dim, generator=gen) * 2 - 1).to(dtype)
            y = reference_rotate(x, cos, sin, spec.head_dim, spec.interleaved)
            feeds_x = x.transpose(1, 2).reshape(b, s, -1) if options.num_heads else x
            expected = y.transpose(1, 2).reshape(b, s, -1) if options.num_heads else y
            peak = max(float(cos.double().abs().max()), float(sin.double().abs().max()))
            out.append(
                Sample(
                    feeds={"x": feeds_x, "position_ids": positions},
                    expected={"y": expected},
                    atol=4 * ATOL[spec.dtype] * max(1.0, peak),
                    label=label,
                )
            )
        return out
