"""CoPE graphs: `cope/logits` (q, k -> attention logits) and `cope/attention` (q, k, v -> output).

Contextual Position Encoding (Golovneva et al. 2024, arXiv:2405.18719; RAM
`projects/cope/src/cope/context_position.py`), op for op as `posenc.encodings.cope.cope_logits`,
for q [B, N, S, d], k [B, N, T, d], s = sqrt(d), the learned pos_emb [d, npos] and a mask m:

    qk     = q @ k^T                                   MatMul            [B, N, S, T]
    gates  = sigmoid(qk / s), 0 where masked           Sigmoid, Where    [B, N, S, T]
    p      = min(reverse cumsum of gates, npos_max-1)  CumSum(reverse=1, exclusive=0), Min
    z      = q @ pos_emb[:, :npos_max]                 MatMul            [B, N, S, npos_max]
    e      = z[ceil p] * w + z[floor p] * (1 - w)      Ceil/Floor, GatherElements, w = p - floor p
    repo:  logits = (qk + e) / s        paper: logits = qk / s + e
    masked logits = -inf                               Where (the references' `+ log m`)

CumSum is inclusive (`exclusive=0`): p[j] = sum over t >= j of gates[t], the key itself included,
as the reference's `flip(-1).cumsum(-1).flip(-1)`. It runs in float64 and is rounded once:
torch's CPU cumsum accumulates float32 in double, so the positions are bit-identical to the
reference's for equal gates. Where(mask, ., 0) and Where(mask, ., -inf) equal the references'
`gates * m` and `+ log m` exactly for a 0/1 mask. Masks (`mask` field of the spec): `causal`
builds key j <= T - S + i from the shapes (queries are the last S of T keys, the KV-cache view),
`input` takes a boolean `attention_mask` broadcastable to [B, N, S, T], `none` attends everywhere.

float16 and bfloat16 inputs are computed in float32 and the output rounded once (the references
would run the cumulative sum and the interpolation in the input dtype); verification compares
with the reference evaluated in float32 on the same inputs. `cope/attention` adds
`softmax(logits) @ v` (Softmax over keys, MatMul) before the cast.
"""

from __future__ import annotations

import math
from typing import Any

import onnx_ir as ir
import torch

from posenc.encodings.cope import cope_logits
from posenc.onnx._graph import IR_DTYPES, Graph
from posenc.onnx._options import ExportOptions
from posenc.onnx._registry import ATOL, GraphExporter, Sample, register_exporter
from posenc.onnx._specs import CopeSpec

FLOAT = ir.DataType.FLOAT
SAMPLE_KEYS = 64
"""Keys in the random verification samples (at most 2 * npos_max + 8; the saturated sample has
npos_max + 8, at most 2 * SAMPLE_KEYS)."""


def _inputs(g: Graph, spec: CopeSpec) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value | None]:
    """Declare q, k, pos_emb (unless embedded) and attention_mask (mask `input`); return q, k,
    pos_emb [d, npos_max] in float32 and the bool mask broadcastable to [B, N, S, T] (or None)."""
    op = g.op
    d, dtype = spec.head_dim, spec.dtype
    q = g.input("q", dtype, ["B", "N", "S", d], f"queries [B, N, S, {d}]")
    k = g.input("k", dtype, ["B", "N", "T", d], f"keys [B, N, T, {d}]")
    emb: ir.Value
    if spec.pos_emb is None:
        weight = g.input("pos_emb", dtype, [d, "npos"], f"learned position embedding [{d}, npos]")
        emb = op.Slice(weight, [0], [spec.npos_max], [1])  # [d, npos_max]
        if dtype != "float32":
            emb = op.Cast(emb, to=FLOAT)  # [d, npos_max]
    else:
        emb = g.initializer("pos_emb", torch.tensor(spec.pos_emb, dtype=torch.float32))
    if dtype != "float32":
        q = op.Cast(q, to=FLOAT)  # [B, N, S, d]
        k = op.Cast(k, to=FLOAT)  # [B, N, T, d]
    mask: ir.Value | None = None
    if spec.mask == "input":
        mask = g.input(
            "attention_mask",
            "bool",
            ["MB", "MN", "S", "T"],
            "bool [B or 1, N or 1, S, T]: True where query i attends to key j",
        )
    elif spec.mask == "causal":
        mask = _causal(g, q, k)  # bool [S, T]
    return q, k, emb, mask


def _causal(g: Graph, q: ir.Value, k: ir.Value) -> ir.Value:
    """key j <= T - S + i: bool [S, T], queries aligned with the last S keys."""
    op = g.op
    s_len: ir.Value = op.Gather(op.Shape(q), 2, axis=0)  # int64 []: S
    t_len: ir.Value = op.Gather(op.Shape(k), 2, axis=0)  # int64 []: T
    rows: ir.Value = op.Range(op.Sub(t_len, s_len), t_len, 1)  # int64 [S]: T - S + i
    cols: ir.Value = op.Range(0, t_len, 1)  # int64 [T]
    allowed: ir.Value = op.LessOrEqual(op.Unsqueeze(cols, [0]), op.Unsqueeze(rows, [1]))
    return allowed  # bool [S, T]


def _logits(
    g: Graph, spec: CopeSpec, q: ir.Value, k: ir.Value, emb: ir.Value, mask: ir.Value | None
) -> ir.Value:
    """CoPE logits [B, N, S, T] in float32 (module docstring)."""
    op = g.op
    scale = math.sqrt(spec.head_dim)
    qk: ir.Value = op.MatMul(q, op.Transpose(k, perm=[0, 1, 3, 2]))  # [B, N, S, T]
    scaled: ir.Value = op.Div(qk, scale)  # [B, N, S, T]
    gates: ir.Value = op.Sigmoid(scaled)  # [B, N, S, T]
    if mask is not None:
        gates = op.Where(mask, gates, 0.0)  # [B, N, S, T]
    summed: ir.Value = op.CumSum(
        op.Cast(gates, to=ir.DataType.DOUBLE), -1, exclusive=0, reverse=1
    )  # float64 [B, N, S, T]: sum over t >= j
    positions: ir.Value = op.Min(op.Cast(summed, to=FLOAT), float(spec.npos_max - 1))  # [B,N,S,T]
    z: ir.Value = op.MatMul(q, emb)  # [B, N, S, npos_max]
    floor: ir.Value = op.Floor(positions)  # [B, N, S, T]
    ceil: ir.Value = op.Ceil(positions)  # [B, N, S, T]
    at_ceil: ir.Value = op.GatherElements(
        z, op.Cast(ceil, to=ir.DataType.INT64), axis=3
    )  # [B, N, S, T]
    at_floor: ir.Value = op.GatherElements(
        z, op.Cast(floor, to=ir.DataType.INT64), axis=3
    )  # [B, N, S, T]
    w: ir.Value = op.Sub(positions, floor)  # [B, N, S, T]
    e: ir.Value = op.Add(op.Mul(at_ceil, w), op.Mul(at_floor, op.Sub(1.0, w)))  # [B, N, S, T]
    # repo: (qk + e) / sqrt(d); paper: qk / sqrt(d) + e
    repo = spec.variant == "repo"
    logits: ir.Value = op.Div(op.Add(qk, e), scale) if repo else op.Add(scaled, e)  # [B,N,S,T]
    if mask is not None:
        logits = op.Where(mask, logits, float("-inf"))  # [B, N, S, T]
    return logits


def _notes(spec: CopeSpec) -> dict[str, Any]:
    return {
        "variant": spec.variant,
        "mask": spec.mask,
        "npos_max": spec.npos_max,
        "pos_emb": "initializer" if spec.pos_emb is not None else "input",
        "softmax_scale": "in the logits (do not scale again)",
    }


class _Cope(GraphExporter):
    kind = "cope"
    modes = ("compute",)

    def samples(self, spec: CopeSpec, options: ExportOptions) -> list[Sample]:
        out = []
        for label, feeds in sample_feeds(spec, with_v=self.graph == "attention"):
            expected, atol = reference(spec, feeds, self.graph)
            out.append(Sample(feeds=feeds, expected=expected, atol=atol, label=label))
        return out


@register_exporter
class CopeLogits(_Cope):
    graph = "logits"
    summary = "q [B, N, S, d], k [B, N, T, d] -> CoPE attention logits [B, N, S, T] (pre-softmax)"

    def build(self, g: Graph, spec: CopeSpec, options: ExportOptions) -> dict[str, Any]:
        op = g.op
        logits = _logits(g, spec, *_inputs(g, spec))  # [B, N, S, T]
        if spec.dtype != "float32":
            logits = op.Cast(logits, to=IR_DTYPES[spec.dtype])  # [B, N, S, T]
        g.output(
            logits,
            "logits",
            "attention logits [B, N, S, T], -inf where masked",
            ["B", "N", "S", "T"],
        )
        return _notes(spec)


@register_exporter
class CopeAttention(_Cope):
    graph = "attention"
    summary = "q, k, v [B, N, T, dv] -> softmax(CoPE logits) @ v [B, N, S, dv]"

    def build(self, g: Graph, spec: CopeSpec, options: ExportOptions) -> dict[str, Any]:
        op = g.op
        logits = _logits(g, spec, *_inputs(g, spec))  # [B, N, S, T]
        v = g.input("v", spec.dtype, ["B", "N", "T", "dv"], "values [B, N, T, dv]")
        if spec.dtype != "float32":
            v = op.Cast(v, to=FLOAT)  # [B, N, T, dv]
        weights: ir.Value = op.Softmax(logits, axis=-1)  # [B, N, S, T]
        y: ir.Value = op.MatMul(weights, v)  # [B, N, S, dv]
        if spec.dtype != "float32":
            y = op.Cast(y, to=IR_DTYPES[spec.dtype])  # [B, N, S, dv]
        g.output(y, "y", "attention output [B, N, S, dv]", ["B", "N", "S", "dv"])
        return _notes(spec)


def reference(
    spec: CopeSpec, feeds: dict[str, torch.Tensor], graph: str
) -> tuple[dict[str, torch.Tensor], float]:
    """The expected output of `graph` for `feeds`: `posenc.encodings.cope.cope_logits` (and
    softmax @ v) evaluated in float32 on the same values, cast to the spec dtype; and the
    tolerance (`tolerance`)."""
    q, k = feeds["q"].float(), feeds["k"].float()
    emb = (
        feeds["pos_emb"].float()
        if spec.pos_emb is None
        else torch.tensor(spec.pos_emb, dtype=torch.float32)
    )
    emb = emb[:, : spec.npos_max]
    logits = cope_logits(q, k, emb, spec.npos_max, spec.variant, reference_mask(spec, feeds))
    dtype = getattr(torch, spec.dtype)
    atol = tolerance(spec, q, k, emb, dtype=spec.dtype)
    if graph == "logits":
        return {"logits": logits.to(dtype)}, atol
    v = feeds["v"].float()
    y = torch.matmul(torch.softmax(logits, dim=-1), v)
    peak = float(v.abs().max())
    logit_error = tolerance(spec, q, k, emb, dtype="float32")
    return {"y": y.to(dtype)}, 2 * logit_error * peak + 2 * ATOL[spec.dtype] * (1 + peak)


def reference_mask(spec: CopeSpec, feeds: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The mask the graph applies for these feeds: the causal [S, T] one, the input, or None."""
    if spec.mask == "input":
        return feeds["attention_mask"]
    if spec.mask == "none":
        return None
    s, t = feeds["q"].shape[2], feeds["k"].shape[2]
    return torch.ones(s, t, dtype=torch.bool).tril(t - s)


def tolerance(
    spec: CopeSpec, q: torch.Tensor, k: torch.Tensor, emb: torch.Tensor, *, dtype: str
) -> float:
    """Bound on |graph - reference| for the logits, from where the two may differ.

    onnxruntime's Sigmoid is not torch's (MLAS's approximation, a few ulp; the float64 cumulative
    sum and the elementwise ops agree bit for bit, the MatMuls did on the CPUs tested and are
    otherwise within the magnitude term below). A gate error of
    eps = ATOL["float32"] moves a position by at most T * eps (the sum over <= T keys), and e
    by that times the steepest step between adjacent integer-position logits z (divided by
    sqrt(d) in `repo`); the logits themselves are within 2 ATOL[dtype] of their magnitude M <=
    max |qk| / sqrt(d) + max |z| (/ sqrt(d)), which covers the rounding to the output dtype.
    """
    scale = math.sqrt(spec.head_dim)
    z = torch.matmul(q, emb)  # [B, N, S, npos_max]
    step = float((z[..., 1:] - z[..., :-1]).abs().max()) if spec.npos_max > 1 else 0.0
    peak_z = float(z.abs().max())
    peak_qk = float(torch.matmul(q, k.transpose(-1, -2)).abs().max()) / scale
    damp = scale if spec.variant == "repo" else 1.0
    moved = k.shape[2] * ATOL["float32"] * step / damp
    return moved + 2 * ATOL[dtype] * (1 + peak_qk + peak_z / damp)


def sample_feeds(spec: CopeSpec, *, with_v: bool) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """Random q, k (and v, pos_emb with extra columns, a mask with every row attending
    somewhere) of a few shapes: S = T, a decode step (S < T, queries the last keys), one query;
    and saturated gates (q = k with a large norm: every gate near 1, so positions count keys and
    reach the npos_max - 1 clamp)."""
    gen = torch.Generator().manual_seed(0)
    d, dtype = spec.head_dim, getattr(torch, spec.dtype)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    keys = min(SAMPLE_KEYS, 2 * spec.npos_max + 8)
    out = [
        ("S = T", {"q": rand(2, 2, keys, d), "k": rand(2, 2, keys, d)}),
        ("decode S < T", {"q": rand(1, 3, 5, d), "k": rand(1, 3, keys, d)}),
        ("one query", {"q": rand(2, 1, 1, d), "k": rand(2, 1, keys, d)}),
    ]
    many = min(spec.npos_max + 8, 2 * SAMPLE_KEYS)
    unit = torch.nn.functional.normalize(torch.randn(d, generator=gen), dim=0)
    aligned = (unit * 4 * d**0.25).to(dtype).expand(1, 2, many, d)  # q.k / sqrt(d) = 16
    out.append(("saturated gates", {"q": aligned.contiguous(), "k": aligned.contiguous()}))
    for _, feeds in out:
        b, n, s, _ = feeds["q"].shape
        t = feeds["k"].shape[2]
        if spec.pos_emb is None:
            feeds["pos_emb"] = rand(d, spec.npos_max + 3)
        if with_v:
            feeds["v"] = rand(b, n, t, 5)
        if spec.mask == "input":
            mask = torch.rand(b, 1, s, t, generator=gen) < 0.7
            mask[..., 0] = True
            feeds["attention_mask"] = mask
    return out
