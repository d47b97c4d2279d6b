"""Contextual Position Encoding: a torch reference (Golovneva et al. 2024, "Contextual Position
Encoding: Learning to Count What's Important", arXiv:2405.18719; reference code: the paper's
listing (`CoPE` and `SelfAttn`) and facebookresearch/RAM
`projects/cope/src/cope/context_position.py`, `ContextPosSelfAttn`).

CoPE depends on q and k, so there is no table to precompute and it is not a registered family: the
learned input is the position embedding `pos_emb` (d, npos) (the repository's parameter is
(1, d, npos)). This module is the reference the ONNX CoPE subgraph is checked against.

For queries q (..., Lq, d), keys k (..., Lk, d), with s = sqrt(d) and an optional 0/1 mask m:

    gates  g[i, j]   = sigmoid(q_i . k_j / s), 0 where m[i, j] = 0
    pos    p[i, j]   = min(sum_{t >= j} g[i, t], npos_max - 1)       reverse cumulative sum
    ints   z[i, n]   = q_i . pos_emb[:, n]                            n = 0 .. npos - 1
    interp e[i, j]   = z[i, ceil p] * (p - floor p) + z[i, floor p] * (1 - (p - floor p))

and the attention logits (before softmax) per `variant`:

- `"repo"` (RAM `ContextPosSelfAttn.forward`, default flags): `(q.k + e) / s + log m`. The gates
  are `sigmoid(q.k / s) * m` (the mask multiplies the gates).
- `"paper"` (the paper's listing; the repository with `--cope-nodiv` orders the scaling the same
  way): `q.k / s + log m + e`. The gates are `sigmoid(q.k / s + log m)` (the mask enters through
  the log before the sigmoid).

So the two differ in exactly one place for a 0/1 mask: the position logits e are divided by
sqrt(d) in `repo` and added unscaled in `paper` (sqrt(d) times stronger for the same pos_emb).
Both gate on q.k / sqrt(d); the paper's equations (3)-(5) write sigmoid(q^T k) and
softmax(q^T (k + e[p])) with no sqrt(d) at all, which neither code does. For a fractional mask the
gates would differ too (m * sigmoid(x) against sigmoid(x + log m)); masks here are boolean.

Masked logits are -inf (log 0), as both references produce; `npos_max` clamps positions (the
repository's `npos`, default block size + 1, since position 0 is possible). Every op runs in the
inputs' dtype in the references' order.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

Variant = Literal["repo", "paper"]
VARIANTS: tuple[Variant, ...] = ("repo", "paper")


def cope_positions(gates: torch.Tensor, npos_max: int) -> torch.Tensor:
    """Contextual positions (..., Lq, Lk): the reverse cumulative sum of `gates` along keys
    (`gates.flip(-1).cumsum(-1).flip(-1)`), clamped to at most `npos_max - 1`."""
    positions = gates.flip(-1).cumsum(dim=-1).flip(-1)
    return positions.clamp(max=npos_max - 1)


def interpolated_position_logits(
    q: torch.Tensor, pos_emb: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """e (..., Lq, Lk): `q @ pos_emb` (..., Lq, npos) read at ceil and floor of each fractional
    position and blended linearly with weight `positions - floor(positions)` on the ceiling."""
    logits_int = torch.matmul(q, pos_emb)
    ceil = positions.ceil().long()
    floor = positions.floor().long()
    logits_ceil = logits_int.gather(-1, ceil)
    logits_floor = logits_int.gather(-1, floor)
    w = positions - floor
    return logits_ceil * w + logits_floor * (1 - w)


def _check(q: torch.Tensor, k: torch.Tensor, pos_emb: torch.Tensor, npos_max: int) -> None:
    if q.dim() < 2 or k.dim() < 2 or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q (..., Lq, d) and k (..., Lk, d) must share d; got {list(q.shape)}, {list(k.shape)}"
        )
    if pos_emb.dim() < 2 or pos_emb.shape[-2] != q.shape[-1]:
        raise ValueError(f"pos_emb must be (..., d, npos) with d={q.shape[-1]}")
    if not 1 <= npos_max <= pos_emb.shape[-1]:
        raise ValueError(f"npos_max must be in [1, {pos_emb.shape[-1]}] (pos_emb columns)")


def cope_logits(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_emb: torch.Tensor,
    npos_max: int,
    variant: Variant = "repo",
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention logits (..., Lq, Lk) with CoPE, before the softmax (module docstring).

    Args:
        q: queries (..., Lq, d).
        k: keys (..., Lk, d), the same leading dims (the gates use these keys: the repository's
            `key_cope` without `--cope-sep-key`).
        pos_emb: learned position embedding (d, npos) or broadcastable (..., d, npos).
        npos_max: positions are clamped to npos_max - 1 (<= npos).
        variant: "repo" or "paper".
        mask: optional boolean (True = attend) or 0/1 tensor broadcastable to (..., Lq, Lk).
    """
    _check(q, k, pos_emb, npos_max)
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    scale = math.sqrt(q.shape[-1])
    m = None if mask is None else mask.to(q.dtype)
    qk = torch.matmul(q, k.transpose(-1, -2))
    if variant == "repo":
        gates = torch.sigmoid(qk / scale)
        if m is not None:
            gates = gates * m
        e = interpolated_position_logits(q, pos_emb, cope_positions(gates, npos_max))
        logits = (qk + e) / scale
        return logits if m is None else logits + m.log()
    logits = qk / scale
    if m is not None:
        logits = logits + m.log()
    e = interpolated_position_logits(q, pos_emb, cope_positions(torch.sigmoid(logits), npos_max))
    return logits + e


def cope_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pos_emb: torch.Tensor,
    npos_max: int,
    variant: Variant = "repo",
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(`cope_logits(...)`) @ v: (..., Lq, dv), the attention output of both references
    (without dropout)."""
    attn = torch.softmax(cope_logits(q, k, pos_emb, npos_max, variant, mask), dim=-1)
    return torch.matmul(attn, v)
