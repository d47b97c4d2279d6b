"""Rotation of x by half-width cos/sin caches, shared by `rope/rotary` and `xpos/rotary`, and
the half-width to full-width layout of their cos_sin graphs.

x is [B, N, S, H] (or [B, S, N*H] with `num_heads`); cos and sin are [B, S, d/2], one column per
rotated pair, already scaled (RoPE's attention scaling, xPos's per-pair decay): the first d
channels of each head are rotated with the given pairing (half split or interleaved), the rest
pass through. Three implementations:

- `decomposed`: Slice/Mul/Sub/Add/Concat, any opset. Half split `y1 = x1*c - x2*s`,
  `y2 = x2*c + x1*s` (transformers' `q*cos + rotate_half(q)*sin`, bit for bit); interleaved the
  same on even/odd channels (GPT-J's and torchscale's `rotate_every_two`). bfloat16 runs in
  float32 (onnxruntime has no CPU bfloat16 arithmetic) and is rounded once.
- `onnx`: `RotaryEmbedding` (opset 23) with 3-D caches and no position_ids.
- `contrib`: `com.microsoft.RotaryEmbedding`, which needs 2-D caches: the gathered rows become a
  [B*S, d/2] cache indexed by arange(B*S).
"""

from __future__ import annotations

import onnx_ir as ir
import torch

from posenc.encodings import FieldProblem
from posenc.onnx._graph import Graph
from posenc.onnx._options import ExportOptions


def rotary_problems(dtype: str, options: ExportOptions) -> list[FieldProblem]:
    """Refusals shared by the rotary graphs: RotaryEmbedding needs opset 23; onnxruntime has no
    CPU bfloat16 kernel for either RotaryEmbedding op, so those cannot be verified."""
    problems = []
    if options.op == "onnx" and options.opset < 23:
        problems.append(
            FieldProblem("opset", "op 'onnx' (RotaryEmbedding) exists from opset 23", options.opset)
        )
    if options.op in ("onnx", "contrib") and dtype == "bfloat16":
        problems.append(
            FieldProblem(
                "dtype",
                f"onnxruntime has no CPU bfloat16 kernel for op {options.op!r} "
                "(RotaryEmbedding), so it cannot be verified: use op 'decomposed'",
                dtype,
            )
        )
    return problems


def x_input(g: Graph, dtype: str, head_dim: int, heads: int | None) -> ir.Value:
    """Declare `x`: [B, N, S, H], or [B, S, N*H] with `heads`."""
    if heads:
        return g.input("x", dtype, ["B", "S", heads * head_dim], f"x [B, S, {heads}*{head_dim}]")
    return g.input("x", dtype, ["B", "N", "S", head_dim], f"x [B, N, S, {head_dim}]")


def rotate(
    g: Graph,
    x: ir.Value,
    pos: ir.Value,
    cos: ir.Value,
    sin: ir.Value,
    *,
    op_kind: str,
    head_dim: int,
    rotary_dim: int,
    interleaved: bool,
    heads: int | None,
    dtype: str,
) -> ir.Value:
    """x rotated by cos/sin [B, S, d/2] (module docstring); `pos` [B, S] sizes the contrib cache."""
    op = g.op
    h, d = head_dim, rotary_dim
    attrs: dict[str, int] = {"interleaved": int(interleaved)}
    if d != h:
        attrs["rotary_embedding_dim"] = d
    if heads:
        attrs["num_heads"] = heads
    y: ir.Value
    if op_kind == "onnx":
        y = op.RotaryEmbedding(x, cos, sin, **attrs)  # like x
    elif op_kind == "contrib":
        assert g.contrib is not None
        cache_cos: ir.Value = op.Reshape(cos, [-1, d // 2])  # [B*S, d/2]
        cache_sin: ir.Value = op.Reshape(sin, [-1, d // 2])  # [B*S, d/2]
        rows: ir.Value = op.Range(0, op.Size(pos), 1)  # int64 [B*S]
        ids: ir.Value = op.Reshape(rows, op.Shape(pos))  # int64 [B, S]: row of each token
        y = g.contrib.RotaryEmbedding(x, ids, cache_cos, cache_sin, **attrs)  # like x
        y.type, y.shape = x.type, x.shape  # no schema in onnx: state what the op returns
    else:
        y = _decomposed(g, x, cos, sin, h, d, interleaved, heads, dtype)  # like x
    return y


def _decomposed(
    g: Graph,
    x: ir.Value,
    cos: ir.Value,
    sin: ir.Value,
    h: int,
    d: int,
    interleaved: bool,
    heads: int | None,
    dtype: str,
) -> ir.Value:
    """Rotate x with plain ops (module docstring)."""
    op = g.op
    if dtype == "bfloat16":
        x = op.Cast(x, to=ir.DataType.FLOAT)  # like x, float32
        cos = op.Cast(cos, to=ir.DataType.FLOAT)  # [B, S, d/2]
        sin = op.Cast(sin, to=ir.DataType.FLOAT)  # [B, S, d/2]
    if heads:
        x4: ir.Value = op.Reshape(x, [0, 0, heads, h])  # [B, S, N, H]
        c: ir.Value = op.Unsqueeze(cos, [2])  # [B, S, 1, d/2]
        s: ir.Value = op.Unsqueeze(sin, [2])  # [B, S, 1, d/2]
    else:
        x4 = x  # [B, N, S, H]
        c = op.Unsqueeze(cos, [1])  # [B, 1, S, d/2]
        s = op.Unsqueeze(sin, [1])  # [B, 1, S, d/2]
    rot: ir.Value = op.Slice(x4, [0], [d], [3]) if d < h else x4  # [.., .., .., d]
    rotated: ir.Value
    if interleaved:
        even: ir.Value = op.Slice(rot, [0], [d], [3], [2])  # [.., .., .., d/2]
        odd: ir.Value = op.Slice(rot, [1], [d], [3], [2])  # [.., .., .., d/2]
        y_even: ir.Value = op.Sub(op.Mul(even, c), op.Mul(odd, s))  # [.., .., .., d/2]
        y_odd: ir.Value = op.Add(op.Mul(odd, c), op.Mul(even, s))  # [.., .., .., d/2]
        stacked: ir.Value = op.Concat(
            op.Unsqueeze(y_even, [4]), op.Unsqueeze(y_odd, [4]), axis=4
        )  # [.., .., .., d/2, 2]
        rotated = op.Reshape(stacked, [0, 0, 0, -1])  # [.., .., .., d]
    else:
        first: ir.Value = op.Slice(rot, [0], [d // 2], [3])  # [.., .., .., d/2]
        second: ir.Value = op.Slice(rot, [d // 2], [d], [3])  # [.., .., .., d/2]
        y1: ir.Value = op.Sub(op.Mul(first, c), op.Mul(second, s))  # [.., .., .., d/2]
        y2: ir.Value = op.Add(op.Mul(second, c), op.Mul(first, s))  # [.., .., .., d/2]
        rotated = op.Concat(y1, y2, axis=3)  # [.., .., .., d]
    y: ir.Value = (
        op.Concat(rotated, op.Slice(x4, [d], [h], [3]), axis=3) if d < h else rotated
    )  # [.., .., .., H]
    if heads:
        y = op.Reshape(y, [0, 0, -1])  # [B, S, N*H]
    if dtype == "bfloat16":
        y = op.Cast(y, to=ir.DataType.BFLOAT16)  # like x
    return y


def full_width(g: Graph, half: ir.Value, interleaved: bool) -> ir.Value:
    """[B, S, d/2] -> [B, S, d]: `repeat_interleave(c, 2)` or `cat(c, c)`."""
    op = g.op
    if interleaved:
        col: ir.Value = op.Unsqueeze(half, [-1])  # [B, S, d/2, 1]
        pairs: ir.Value = op.Concat(col, col, axis=-1)  # [B, S, d/2, 2]
        full: ir.Value = op.Reshape(pairs, [0, 0, -1])  # [B, S, d]
        return full
    doubled: ir.Value = op.Concat(half, half, axis=-1)  # [B, S, d]
    return doubled


def reference_rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int, interleaved: bool
) -> torch.Tensor:
    """x [B, N, S, H] rotated by half-width cos/sin [B, S, d/2] (cast to x's dtype first, as
    transformers and torchscale do), evaluated in float64 and rounded once to x's dtype."""
    c = cos.to(x.dtype).double()[:, None]  # [B, 1, S, d/2]
    s = sin.to(x.dtype).double()[:, None]
    d = rotary_dim
    xd = x.double()
    rot, rest = xd[..., :d], xd[..., d:]
    if interleaved:
        even, odd = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack((even * c - odd * s, odd * c + even * s), dim=-1).flatten(-2)
    else:
        first, second = rot[..., : d // 2], rot[..., d // 2 :]
        rotated = torch.cat((first * c - second * s, second * c + first * s), dim=-1)
    return torch.cat((rotated, rest), dim=-1).to(x.dtype)
