"""RoPE graphs: `rope/cos_sin` (position_ids -> cos, sin) and `rope/rotary` (x -> rotated x).

Both start from the half-width cos/sin of the position ids, [B, S, d/2] (`_half_cos_sin`):

- mode `table`: a Gather from the core's half-width table (embedded in the spec dtype, so every
  value is bit-identical to the served table). Positions outside [0, P) make the Gather fail in
  onnxruntime with a message naming the range (ONNX has no assert: invalid positions are mapped
  to an index past the table, and the guarding Gather's node name is the message). A variant
  with a second frequency set past its switch length (`ScalingBase.switch()`; LongRoPE: its
  original_max_position_embeddings) embeds both tables when P exceeds the switch, as
  onnxruntime-genai does, and picks the second rows when max(position_ids) + 1 > the switch. A
  variant that recomputes its frequencies for every longer length (dynamic NTK) has an exact
  table only up to its switch (max_position_embeddings): longer specs are refused (use
  `compute`).
- mode `compute`: `angles = float(position_ids)[..., None] * inv_freq`, `cos(angles) * A`, cast
  last: transformers' `LlamaRotaryEmbedding.forward` op for op (fp32, or float64 for precision
  `exact`). inv_freq is the core's (bit-identical). Past the switch, with L = max(position_ids) +
  1, a second set is embedded and selected with Where (LongRoPE: transformers
  `longrope_frequency_update`); dynamic NTK recomputes the base from L in the graph (transformers
  `dynamic_frequency_update`, stateless: it never keeps a longer length's base).

cos_sin then lays the half-width values out like the table (full width `cat(c, c)` or
`repeat_interleave(c, 2)`, or the packed `cos_sin` / `pairs`). rotary applies them to x
[B, N, S, H] (or [B, S, N*H] with `num_heads`), rotating the first d channels with the spec's
pairing, in one of three implementations (`_rotary`, shared with xpos/rotary): `decomposed`
(Slice/Mul/Sub/Add/Concat, any opset; the expressions of transformers' `apply_rotary_pos_emb` /
GPT-J's `rotate_every_two`), `onnx` (RotaryEmbedding-23, 3-D caches without position_ids) or
`contrib` (com.microsoft.RotaryEmbedding, which needs 2-D caches: the gathered rows become a
[B*S, d/2] cache indexed by arange(B*S)).
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
import torch

from posenc.encodings import FieldProblem, compute
from posenc.encodings.rope import RopeSpec, half_cos_sin, layout, rope_inv_freq
from posenc.encodings.rope.variants._common import RopeInputs, Switch, exponents
from posenc.encodings.rope.variants.dynamic import DynamicScaling
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


def with_fields(spec: RopeSpec, **update: Any) -> RopeSpec:
    """`spec` with fields replaced, validated again and canonical."""
    data = spec.model_dump()
    data.update(update)
    return RopeSpec.model_validate(data).canonical()


def switch_length(spec: RopeSpec) -> int | None:
    """The length past which the frequencies change (the variant's `switch()`): LongRoPE's
    original length, dynamic NTK's max_position_embeddings; None for the variants that do not
    depend on the length."""
    switch = spec.rope_scaling.switch()
    return None if switch is None else switch.length


def _second_table(spec: RopeSpec) -> Switch | None:
    """The switch of a variant whose embedded table needs a second set of rows past it (one fixed
    set for every longer length, LongRoPE) when the spec has more rows than the switch."""
    switch = spec.rope_scaling.switch()
    if switch is None or switch.recomputed or spec.max_positions <= switch.length:
        return None
    return switch


def reference_half(
    spec: RopeSpec, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Half-width cos, sin (positions.shape + (d/2,)) in the compute dtype, uncast, for int64
    `positions`, as the core computes them for a sequence of length max(positions) + 1; and A."""
    length = int(positions.max()) + 1
    sized = with_fields(spec, seq_len=length, max_positions=max(length, spec.max_positions))
    inv, scaling, _ = rope_inv_freq(sized, CPU)
    cos, sin = half_cos_sin(sized, inv, scaling, positions.reshape(-1))
    shape = (*positions.shape, cos.shape[-1])
    return cos.reshape(shape), sin.reshape(shape), scaling


def _notes(spec: RopeSpec) -> dict[str, Any]:
    """attention scaling, YaRN's softmax scale multiplier, the LongRoPE / dynamic switch."""
    _, scaling, facts = rope_inv_freq(spec, CPU)
    notes: dict[str, Any] = {"attention_scaling": scaling, "rotary_dim": spec.rotary_dim}
    for key in ("softmax_scale_multiplier", "rotated_pairs"):
        if key in facts:
            notes[key] = facts[key]
    switch = spec.rope_scaling.switch()
    if switch is not None:
        notes[f"{spec.rope_scaling.rope_type}_switch_point"] = switch.length
    return notes


def _length(g: Graph, pos: ir.Value) -> ir.Value:
    """L = max(position_ids) + 1, as transformers' dynamic/longrope updates take it."""
    op = g.op
    top: ir.Value = op.ReduceMax(pos, keepdims=0)  # int64 []
    length: ir.Value = op.Add(top, 1)  # int64 []
    return length


def _table_half(g: Graph, spec: RopeSpec, pos: ir.Value, dtype: str) -> tuple[ir.Value, ir.Value]:
    """Gather half-width cos/sin [B, S, d/2] in `dtype` from the embedded core table(s)."""
    op = g.op
    rows = spec.max_positions
    half = with_fields(spec, width="half", packing="separate", dtype=dtype, seq_len=None)
    index = pos
    second = _second_table(spec)
    if second is not None:
        switch = second.length
        first = compute(with_fields(half, seq_len=switch), CPU).tensors
        past = compute(with_fields(half, seq_len=switch + 1), CPU).tensors
        cos_t = torch.cat((first["cos"][:switch], past["cos"]))  # [switch + P, d/2]
        sin_t = torch.cat((first["sin"][:switch], past["sin"]))  # [switch + P, d/2]
        use_past: ir.Value = op.Greater(_length(g, pos), switch)  # bool []
        shift: ir.Value = op.Where(use_past, switch, 0)  # int64 []: second rows start at switch
        index = op.Add(pos, shift)  # int64 [B, S]
    else:
        table = compute(half, CPU).tensors
        cos_t, sin_t = table["cos"], table["sin"]  # [P, d/2]
    total = int(cos_t.shape[0])
    valid: ir.Value = op.And(op.GreaterOrEqual(pos, 0), op.Less(pos, rows))  # bool [B, S]
    safe: ir.Value = op.Where(valid, index, total)  # int64 [B, S]: out of range -> past the end
    message = (
        f"position_ids must lie in [0, {rows}): the embedded table has {rows} rows "
        "(export mode 'compute' for longer sequences)"
    )
    cos: ir.Value = op.Gather(
        g.initializer("cos_table", cos_t), safe, axis=0, _name=f"{message} [cos]"
    )  # [B, S, d/2]
    sin: ir.Value = op.Gather(
        g.initializer("sin_table", sin_t), safe, axis=0, _name=f"{message} [sin]"
    )  # [B, S, d/2]
    return cos, sin


def _dynamic_inv_freq(g: Graph, spec: RopeSpec, length: ir.Value, compute_dtype: str) -> ir.Value:
    """Dynamic NTK's inv_freq [d/2] for length L > max_position_embeddings (transformers' forward
    path), in the compute dtype, with M = max_position_embeddings:
    `base' = base * ((factor * L / M) - (factor - 1)) ** (d / (d - 2))`,
    `inv = 1 / base' ** (arange(0, d, 2) / d)`. Dynamic NTK is the one variant that recomputes
    its frequencies past the switch (`Switch.recomputed`)."""
    op = g.op
    scaling = spec.rope_scaling
    assert isinstance(scaling, DynamicScaling)
    d = spec.resolved_rotary_dim()
    dt = torch.float64 if compute_dtype == "float64" else torch.float32
    exps = exponents(d, RopeInputs(d, spec.head_dim, spec.rope_theta, None, dt, CPU))  # [d/2]
    to = IR_DTYPES[compute_dtype]
    t: ir.Value = op.Cast(length, to=to)  # []
    t = op.Mul(t, scaling.factor)  # []
    t = op.Div(t, float(scaling.max_position_embeddings))  # []
    t = op.Sub(t, scaling.factor - 1)  # []
    t = op.Pow(t, d / (d - 2))  # []
    base: ir.Value = op.Mul(t, spec.rope_theta)  # []: base'
    powers: ir.Value = op.Pow(base, g.initializer("inv_freq_exponents", exps))  # [d/2]
    inv: ir.Value = op.Div(op.CastLike(1.0, powers), powers)  # [d/2]
    return inv


def _compute_half(g: Graph, spec: RopeSpec, pos: ir.Value, dtype: str) -> tuple[ir.Value, ir.Value]:
    """Half-width cos/sin [B, S, d/2] computed from inv_freq, cast to `dtype` last."""
    op = g.op
    compute_dtype = "float64" if spec.precision == "exact" else "float32"
    switch = spec.rope_scaling.switch()
    at_switch = None if switch is None else switch.length
    inv_base, attention, _ = rope_inv_freq(with_fields(spec, seq_len=at_switch), CPU)
    inv: ir.Value = g.initializer("inv_freq", inv_base)  # [d/2]
    if switch is not None:
        length = _length(g, pos)  # int64 []
        longer: ir.Value = op.Greater(length, switch.length)  # bool []
        if switch.recomputed:
            inv = op.Where(longer, _dynamic_inv_freq(g, spec, length, compute_dtype), inv)
        else:
            inv_long, _, _ = rope_inv_freq(with_fields(spec, seq_len=switch.length + 1), CPU)
            inv = op.Where(longer, g.initializer("inv_freq_long", inv_long), inv)  # [d/2]
    positions: ir.Value = op.Cast(pos, to=IR_DTYPES[compute_dtype])  # [B, S]
    angles: ir.Value = op.Mul(op.Unsqueeze(positions, [-1]), inv)  # [B, S, d/2]
    cos: ir.Value = op.Cos(angles)  # [B, S, d/2]
    sin: ir.Value = op.Sin(angles)  # [B, S, d/2]
    if attention != 1.0:
        cos = op.Mul(cos, attention)  # [B, S, d/2]
        sin = op.Mul(sin, attention)  # [B, S, d/2]
    if dtype != compute_dtype:
        cos = op.Cast(cos, to=IR_DTYPES[dtype])  # [B, S, d/2]
        sin = op.Cast(sin, to=IR_DTYPES[dtype])  # [B, S, d/2]
    return cos, sin


def half_cos_sin_graph(
    g: Graph, spec: RopeSpec, mode: str, pos: ir.Value, dtype: str
) -> tuple[ir.Value, ir.Value]:
    """Half-width cos, sin [B, S, d/2] of `pos` in `dtype`, by table or by computation."""
    if mode == "table":
        return _table_half(g, spec, pos, dtype)
    return _compute_half(g, spec, pos, dtype)


def _mode_problems(spec: RopeSpec, mode: str | None) -> list[FieldProblem]:
    if mode != "table":
        if spec.trig == "polar" and mode == "compute":
            return [
                FieldProblem(
                    "mode",
                    "trig 'polar' (torch.polar's cos/sin) is reproduced by the embedded table "
                    "only: use mode 'table'",
                    mode,
                )
            ]
        return []
    problems = []
    switch = spec.rope_scaling.switch()
    if switch is not None and switch.recomputed and spec.max_positions > switch.length:
        problems.append(
            FieldProblem(
                "mode",
                f"{switch.label} recomputes every frequency from the sequence length past "
                f"{switch.field}={switch.length}, so no embedded "
                f"table serves max_positions={spec.max_positions}: use mode 'compute'",
                mode,
            )
        )
    d = spec.resolved_rotary_dim()
    rows = spec.max_positions
    second = _second_table(spec)
    if second is not None:
        rows += second.length
    size = 2 * rows * (d // 2) * (2 if spec.dtype != "float32" else 4)
    if size > MAX_TABLE_BYTES:
        problems.append(
            FieldProblem(
                "mode",
                f"the embedded tables would take {size} bytes (limit {MAX_TABLE_BYTES}): use "
                "mode 'compute' (no length limit, no table)",
                mode,
            )
        )
    return problems


def _sample_positions(spec: RopeSpec, mode: str) -> list[tuple[str, torch.Tensor]]:
    """Position-id batches [2, n]: the first and last n positions of a sequence of each length
    tested. Table mode covers the table's last row; compute mode goes past it; length-dependent
    variants (LongRoPE, dynamic NTK) are tested on both sides of their switch."""
    rows = spec.max_positions
    switch = switch_length(spec)
    lengths: list[tuple[str, int]] = [("max_positions", rows)]
    if mode == "compute":
        lengths.append(("past max_positions", rows + 17))
    if switch is not None and (mode == "compute" or switch < rows):
        lengths += [("at the switch", switch), ("past the switch", switch + 1)]
    out = []
    for label, length in lengths:
        if mode == "table" and length > rows:
            continue
        n = min(length, 64)
        head = torch.arange(n, dtype=torch.int64)
        tail = torch.arange(length - n, length, dtype=torch.int64)
        out.append((label, torch.stack((head, tail))))
    return out


@register_exporter
class RopeCosSin(GraphExporter):
    kind = "rope"
    graph = "cos_sin"
    summary = "position_ids [B, S] -> cos, sin [B, S, width] laid out like the spec's table"
    modes = ("table", "compute")

    def normalize(self, spec: RopeSpec) -> RopeSpec:
        # The graph reads the length from position_ids: seq_len takes its default.
        return with_fields(spec, seq_len=None)

    def problems(self, spec: RopeSpec, options: ExportOptions) -> list[FieldProblem]:
        return _mode_problems(spec, options.mode)

    def build(self, g: Graph, spec: RopeSpec, options: ExportOptions) -> dict[str, Any]:
        op = g.op
        dtype = str(spec.dtype)
        pos = g.input("position_ids", "int64", ["B", "S"], "int64 position ids [B, S]")
        cos, sin = half_cos_sin_graph(g, spec, str(options.mode), pos, dtype)  # [B, S, d/2]
        if spec.packing != "separate" and spec.width == "full":
            # torchtune's Qwen2/Phi-3 cat(cos, sin), TensorRT-LLM's duplicated MLA pairs
            cos = full_width(g, cos, spec.repeats_interleaved())
            sin = full_width(g, sin, spec.repeats_interleaved())
        if spec.packing == "cos_sin":
            packed: ir.Value = op.Concat(cos, sin, axis=-1)  # [B, S, d] (2d at full width)
            g.output(packed, "cos_sin", f"cat(cos, sin) [B, S, {spec.width} width x 2]")
        elif spec.packing == "pairs":
            pairs: ir.Value = op.Concat(
                op.Unsqueeze(cos, [-1]), op.Unsqueeze(sin, [-1]), axis=-1
            )  # [B, S, w, 2]
            g.output(pairs, "pairs", f"stack(cos, sin) [B, S, {spec.width} width, 2]")
        else:
            if spec.width == "full":
                cos, sin = (
                    full_width(g, cos, spec.repeats_interleaved()),
                    full_width(g, sin, spec.repeats_interleaved()),
                )  # [B, S, d]
            g.output(cos, "cos", f"cos * attention_scaling [B, S, {spec.width} width]")
            g.output(sin, "sin", f"sin * attention_scaling [B, S, {spec.width} width]")
        return _notes(spec)

    def samples(self, spec: RopeSpec, options: ExportOptions) -> list[Sample]:
        out = []
        exact = options.mode == "table"
        for label, positions in _sample_positions(spec, str(options.mode)):
            cos, sin, attention = reference_half(spec, positions)
            flat = layout(spec, cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1]))
            expected = {name: t.reshape(*positions.shape, *t.shape[1:]) for name, t in flat.items()}
            out.append(
                Sample(
                    feeds={"position_ids": positions},
                    expected=expected,
                    atol=0.0 if exact else _compute_atol(spec, positions, attention),
                    label=label,
                )
            )
        return out


def _compute_atol(spec: RopeSpec, positions: torch.Tensor, attention: float) -> float:
    """ATOL of the dtype; for dynamic NTK past its switch, plus the angle error an ulp-level
    difference between onnxruntime's and torch's fp32 `pow` makes at these positions."""
    atol = ATOL[str(spec.dtype)]
    switch = spec.rope_scaling.switch()
    length = int(positions.max()) + 1
    if switch is not None and switch.recomputed and length > switch.length:
        ulp = 2.0**-52 if spec.precision == "exact" else 2.0**-23
        atol += 4 * ulp * length * max(1.0, attention)
    return atol


@register_exporter
class RopeRotary(GraphExporter):
    kind = "rope"
    graph = "rotary"
    summary = "x [B, N, S, H] (or [B, S, N*H] with num_heads) and position_ids [B, S] -> x rotated"
    modes = ("table", "compute")
    ops = ("decomposed", "onnx", "contrib")
    takes_num_heads = True

    def normalize(self, spec: RopeSpec) -> RopeSpec:
        # Rotation reads half-width values; width and packing are table layouts.
        return with_fields(spec, seq_len=None, width="half", packing="separate")

    def problems(self, spec: RopeSpec, options: ExportOptions) -> list[FieldProblem]:
        problems = _mode_problems(spec, options.mode) + rotary_problems(str(spec.dtype), options)
        if spec.rotary_dim != spec.head_dim and options.op == "contrib" and not options.num_heads:
            problems.append(
                FieldProblem(
                    "num_heads",
                    "com.microsoft.RotaryEmbedding rotates part of a head only with num_heads: "
                    "give num_heads (x as [B, S, num_heads * head_dim])",
                    options.num_heads,
                )
            )
        return problems

    def build(self, g: Graph, spec: RopeSpec, options: ExportOptions) -> dict[str, Any]:
        dtype = str(spec.dtype)
        heads = options.num_heads
        x = x_input(g, dtype, spec.head_dim, heads)
        pos = g.input("position_ids", "int64", ["B", "S"], "int64 position ids [B, S]")
        cos, sin = half_cos_sin_graph(g, spec, str(options.mode), pos, dtype)  # [B, S, d/2]
        y = rotate(
            g,
            x,
            pos,
            cos,
            sin,
            op_kind=str(options.op),
            head_dim=spec.head_dim,
            rotary_dim=spec.resolved_rotary_dim(),
            interleaved=bool(spec.interleaved),
            heads=heads,
            dtype=dtype,
        )  # like x
        g.output(y, "y", "x with its first rotary_dim channels of each head rotated")
        return _notes(spec)

    def samples(self, spec: RopeSpec, options: ExportOptions) -> list[Sample]:
        out = []
        gen = torch.Generator().manual_seed(0)
        heads = options.num_heads or 3
        dtype = getattr(torch, str(spec.dtype))
        for label, positions in _sample_positions(spec, str(options.mode)):
            positions = positions[:, :: max(1, positions.shape[1] // 6)]  # [2, <= 7]
            b, s = positions.shape
            x = (torch.rand(b, heads, s, spec.head_dim, generator=gen) * 2 - 1).to(dtype)
            y = reference_rotary(spec, x, positions)
            feeds_x = x.transpose(1, 2).reshape(b, s, -1) if options.num_heads else x
            expected = y.transpose(1, 2).reshape(b, s, -1) if options.num_heads else y
            out.append(
                Sample(
                    feeds={"x": feeds_x, "position_ids": positions},
                    expected={"y": expected},
                    atol=2 * ATOL[str(spec.dtype)],
                    label=label,
                )
            )
        return out


def reference_rotary(spec: RopeSpec, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x [B, N, S, H] rotated with the core's cos/sin (cast to x's dtype first, as transformers
    does), evaluated in float64 and rounded once to x's dtype."""
    cos, sin, _ = reference_half(spec, positions)  # [B, S, d/2]
    return reference_rotate(x, cos, sin, spec.resolved_rotary_dim(), bool(spec.interleaved))
