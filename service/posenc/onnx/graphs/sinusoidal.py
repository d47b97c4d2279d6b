"""`sinusoidal/embedding`: position_ids [B, S] -> the sinusoidal rows [B, S, dim].

position_ids are position values (the table's rows are positions position_offset + r).

- mode `table`: Gather from the core's table (bit-identical; row position_offset - id for
  descending rows, `position_step` -1); positions outside the table's fail in onnxruntime
  with a message naming the range.
- mode `compute`: `posenc.encodings.sinusoidal` op for op with no length limit: float32 angles
  `position * inv` (inv from the core, bit-identical), or float64 `position / base ** (k / den)`
  (Marian/XLM); `scale * angle`; sin/cos laid out as the spec says (interleaved, sin_cos,
  cos_sin; odd dims zero-padded or with an extra sin column); the padding_idx row zeroed; cast
  last.

Specs with explicit (fractional) `positions` have no integer position ids: not exported.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
import torch

from posenc.encodings import FieldProblem, compute
from posenc.encodings.sinusoidal import SinusoidalSpec, sinusoidal_angles
from posenc.onnx._graph import IR_DTYPES, Graph
from posenc.onnx._options import ExportOptions
from posenc.onnx._registry import ATOL, GraphExporter, Sample, register_exporter

CPU = torch.device("cpu")
MAX_TABLE_BYTES = 1 << 30


def _with(spec: SinusoidalSpec, **update: Any) -> SinusoidalSpec:
    return SinusoidalSpec.model_validate({**spec.model_dump(), **update}).canonical()


def frequencies(spec: SinusoidalSpec) -> tuple[torch.Tensor, bool]:
    """(values [n], divide): float32 inverse frequencies to multiply by (the core's angles at
    position 1, scale 1), or float64 divisors `base ** (k / den)` (Marian's order) to divide by."""
    n = spec.num_frequencies()
    if spec.compute_dtype == "float64":
        # As `sinusoidal_angles` builds the float64 divisor; verification compares the tables.
        k = torch.arange(n, dtype=torch.int64).to(torch.float64)
        exponent = k / spec.denominator() if n > 1 else k
        return float(spec.base or 0.0) ** exponent, True
    unit = _with(
        spec, max_positions=1, position_offset=1, scale=1.0, padding_idx=None, position_step=None
    )
    return sinusoidal_angles(unit, CPU)[0], False


def _compute(g: Graph, spec: SinusoidalSpec, pos: ir.Value) -> ir.Value:
    """The rows [B, S, dim] in the compute dtype, uncast."""
    op = g.op
    cd = IR_DTYPES[str(spec.compute_dtype)]
    half, n = spec.dim // 2, spec.num_frequencies()
    values, divide = frequencies(spec)
    freqs = g.initializer("divisors" if divide else "inv_freq", values)  # [n]
    position: ir.Value = op.Unsqueeze(op.Cast(pos, to=cd), [-1])  # [B, S, 1]
    angles: ir.Value = op.Div(position, freqs) if divide else op.Mul(position, freqs)  # [B, S, n]
    if spec.scale is not None and spec.scale != 1.0:
        angles = op.Mul(angles, spec.scale)  # [B, S, n]
    sin_all: ir.Value = op.Sin(angles)  # [B, S, n]
    cos: ir.Value = op.Cos(op.Slice(angles, [0], [half], [2]))  # [B, S, half]
    sin: ir.Value = op.Slice(sin_all, [0], [half], [2]) if n > half else sin_all  # [B, S, half]
    parts: list[ir.Value]
    if spec.layout == "interleaved":
        pairs: ir.Value = op.Concat(op.Unsqueeze(sin, [-1]), op.Unsqueeze(cos, [-1]), axis=-1)
        parts = [op.Reshape(pairs, [0, 0, -1])]  # [B, S, 2*half]: s0, c0, s1, c1, ...
    elif spec.layout == "cos_sin":
        parts = [cos, sin]
    else:
        parts = [sin]
    if n > half:
        parts.append(op.Slice(sin_all, [half], [n], [2]))  # [B, S, 1]: extra_sin column
    if spec.layout == "sin_cos":
        parts.append(cos)
    table: ir.Value = op.Concat(*parts, axis=-1) if len(parts) > 1 else parts[0]
    if spec.dim % 2 and spec.odd_dim == "zero_pad":
        table = op.Pad(table, [0, 0, 0, 0, 0, 1])  # [B, S, dim]: zero last column
    if spec.padding_idx is not None:
        is_pad: ir.Value = op.Unsqueeze(op.Equal(pos, spec.padding_idx), [-1])  # [B, S, 1]
        table = op.Where(is_pad, op.CastLike(0.0, table), table)  # [B, S, dim]
    return table


def _table(g: Graph, spec: SinusoidalSpec, pos: ir.Value) -> ir.Value:
    """Gather rows [B, S, dim] in the spec dtype from the embedded table, range-checked."""
    op = g.op
    first = int(spec.position_offset or 0)
    rows = int(spec.max_positions or 0)
    if spec.position_step == -1:
        # Descending rows (relative distances): row r holds position first - r.
        index: ir.Value = op.Sub(first, pos)  # [B, S]
        low, high = first - rows + 1, first + 1
    else:
        index = op.Sub(pos, first)  # [B, S]
        low, high = first, first + rows
    valid: ir.Value = op.And(op.GreaterOrEqual(index, 0), op.Less(index, rows))  # [B, S]
    safe: ir.Value = op.Where(valid, index, rows)  # [B, S]: out of range -> past the end
    name = (
        f"position_ids must lie in [{low}, {high}): this graph embeds {rows} rows "
        "(export mode 'compute' for other positions)"
    )
    table = compute(spec, CPU).tensors["embedding"]
    rows_out: ir.Value = op.Gather(g.initializer("embedding_table", table), safe, _name=name)
    return rows_out  # [B, S, dim]


@register_exporter
class SinusoidalEmbedding(GraphExporter):
    kind = "sinusoidal"
    graph = "embedding"
    summary = "position_ids [B, S] -> sinusoidal embedding rows [B, S, dim]"
    modes = ("table", "compute")

    def problems(self, spec: SinusoidalSpec, options: ExportOptions) -> list[FieldProblem]:
        problems = []
        if spec.positions is not None:
            problems.append(
                FieldProblem(
                    "positions",
                    "the graph takes integer position ids: give max_positions (and "
                    "position_offset) instead of explicit positions",
                    f"{len(spec.positions)} positions",
                )
            )
        elif options.mode == "compute" and spec.standardize is not None:
            problems.append(
                FieldProblem(
                    "mode",
                    "standardize divides by statistics of the whole table: no row is computed "
                    "from its position alone; use 'table'",
                    options.mode,
                )
            )
        elif options.mode == "table" and spec.output_bytes() > MAX_TABLE_BYTES:
            problems.append(
                FieldProblem(
                    "mode",
                    f"the embedded table would exceed {MAX_TABLE_BYTES} bytes: use 'compute'",
                    options.mode,
                )
            )
        return problems

    def build(self, g: Graph, spec: SinusoidalSpec, options: ExportOptions) -> dict[str, Any]:
        op = g.op
        pos = g.input("position_ids", "int64", ["B", "S"], "int64 position values [B, S]")
        if options.mode == "table":
            rows = _table(g, spec, pos)  # [B, S, dim]
        else:
            rows = _compute(g, spec, pos)  # [B, S, dim]
            if spec.dtype != spec.compute_dtype:
                rows = op.Cast(rows, to=IR_DTYPES[str(spec.dtype)])  # [B, S, dim]
        g.output(rows, "embedding", f"sinusoidal rows [B, S, {spec.dim}]")
        return {
            "num_frequencies": spec.num_frequencies(),
            "freq_denominator": spec.denominator(),
            "position_offset": spec.position_offset,
            "padding_idx": spec.padding_idx,
        }

    def samples(self, spec: SinusoidalSpec, options: ExportOptions) -> list[Sample]:
        first = int(spec.position_offset or 0)
        rows = int(spec.max_positions or 0)
        step = -1 if spec.position_step == -1 else 1
        cases = [("rows", first, rows)]
        if options.mode == "compute":
            # past the table's end: after its last row (ascending) or above its first (descending)
            cases.append(("past the table", first + rows if step == 1 else first + 40, 40))
        out = []
        for label, start, count in cases:
            case = _with(spec, position_offset=start, max_positions=count)
            table = compute(case, CPU).tensors["embedding"]  # [count, dim]
            n = min(count, 64)
            picks = torch.cat((torch.arange(n), torch.arange(count - n, count)))
            positions = (start + step * picks).reshape(2, n)
            if case.padding_idx is not None and label == "rows":
                positions[0, 0] = case.padding_idx
                picks[0] = (case.padding_idx - start) * step
            out.append(
                Sample(
                    feeds={"position_ids": positions},
                    expected={"embedding": table[picks].reshape(2, n, -1)},
                    atol=0.0 if options.mode == "table" else ATOL[str(spec.dtype)],
                    label=label,
                )
            )
        return out
