"""Casting a finished table to its output dtype with one rounding.

torch converts float64 to bfloat16/float16 through a round-to-nearest float32, rounding twice
(a value just off a bf16 tie can round to float32 exactly on the tie, then to even, away from
the nearest bf16). `cast` rounds once: float64 goes to float32 rounded to odd first, which a
later round-to-nearest into a format with at least 2 fewer mantissa bits turns into the direct
rounding (Boldo & Melquiond 2008). The torch paths (`rope.compute`, `xpos`) and the fused
kernel's reference (`fused.reference`) cast with it; the kernel does the same in its own code
(`_triton_trig._to_out`).
"""

from __future__ import annotations

import torch


def round_to_odd_fp32(x: torch.Tensor) -> torch.Tensor:
    """float64 -> float32 rounded to odd (Boldo & Melquiond 2008, "Emulation of FMA and
    correctly rounded sums: proved algorithms using rounding to odd"), same shape.

    Truncate towards zero, then set the last mantissa bit when inexact. A later round-to-nearest
    into a format with at least 2 fewer mantissa bits (bf16: 8, fp16: 11, fp32: 24) then equals
    rounding `x` directly. For finite values within fp32 range (RoPE tables are bounded by A).
    """
    f = x.to(torch.float32)
    too_far = f.to(torch.float64).abs() > x.abs()
    f = torch.where(too_far, torch.nextafter(f, torch.zeros_like(f)), f)
    inexact = (f.to(torch.float64) != x).to(torch.int32)
    return (f.view(torch.int32) | inexact).view(torch.float32)


def cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast a finished table to the output dtype with one rounding."""
    if t.dtype == torch.float64 and dtype in (torch.bfloat16, torch.float16):
        return round_to_odd_fp32(t).to(dtype)
    return t.to(dtype)
