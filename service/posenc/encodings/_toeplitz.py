"""Toeplitz tables from their diagonals: biases that depend on the relative position only.

ALiBi's causal/symmetric/bottom-right biases and T5's buckets and bias are functions of
r = j - i (key column minus query row): each (Q, K) table holds only Q + K - 1 distinct values.
Computing those once per head and copying them out writes the table in one pass, with no (Q, K)
index or distance grid (and no per-element arithmetic, so the values are exactly those computed).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from posenc.encodings.memory import empty


def toeplitz(diagonals: torch.Tensor, q: int, k: int) -> torch.Tensor:
    """(..., Q, K) contiguous with `out[..., i, j] = diagonals[..., Q - 1 - i + j]`.

    `diagonals` (..., Q + K - 1) holds the value of each relative position r = j - i, from
    r = -(Q - 1) to K - 1. A strided view reads `diagonals[..., a + j]` at (a, j) (a Hankel
    matrix); the rows are then taken in reverse order, a = Q - 1 - i. On the CPU numpy copies
    the view into the output (`memory.empty`: a mapping of its own when large) through a
    row-reversed view of it, a negative stride torch cannot express; elsewhere torch.flip
    writes a contiguous result when Q >= K, and otherwise (it would lay the result out
    column-major) the rows are copied one by one (Q < K copies of K elements each).
    """
    lead = diagonals.shape[:-1]
    n = diagonals.shape[-1]
    if n != q + k - 1:
        raise ValueError(f"need Q + K - 1 = {q + k - 1} diagonals, got {n}")
    diagonals = diagonals.contiguous()
    strides = (*diagonals.stride()[:-1], 1, 1)
    hankel = diagonals.as_strided((*lead, q, k), strides)
    if diagonals.device.type == "cpu":
        out = empty((*lead, q, k), diagonals.dtype)
        if out.numel():
            np.copyto(_bits(out)[..., ::-1, :], _bits(hankel))
        return out
    if q >= k:
        return hankel.flip(-2).contiguous()
    out = torch.empty((*lead, q, k), dtype=diagonals.dtype, device=diagonals.device)
    for i in range(q):
        out[..., i, :] = diagonals[..., q - 1 - i : q - 1 - i + k]
    return out


def _bits(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """A numpy view of a CPU tensor's elements (bfloat16 as its int16 bits: copies are exact)."""
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()
