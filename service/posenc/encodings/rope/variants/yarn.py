"""YaRN (Peng et al. 2023, arXiv:2309.00071). transformers `_compute_yarn_parameters`.

`inv = inter * (1 - ef) + extra * ef` with extra = 1/pos_freqs, inter = 1/(factor * pos_freqs),
ef = 1 - ramp over the correction range [low, high] found from beta_fast/beta_slow rotations at
the original length (floored/ceiled when `truncate`, the default; GPT-OSS sets it false).
Attention scaling A = attention_factor, else get_mscale(f, mscale)/get_mscale(f, mscale_all_dim)
when both are set, else get_mscale(f) (a lone mscale is ignored, as in transformers). DeepSeek-V2/V3
also multiply the softmax scale by get_mscale(f, mscale_all_dim)**2 in attention: reported as
`softmax_scale_multiplier`, since no cos/sin table carries it.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Self

import torch
from pydantic import Field, model_validator

from posenc.encodings.rope.variants._common import RopeInputs, ScalingBase, VariantResult, exponents


class YarnScaling(ScalingBase):
    rope_type: Literal["yarn"] = "yarn"
    factor: Annotated[float, Field(ge=1.0)]
    original_max_position_embeddings: Annotated[int, Field(ge=1)]
    beta_fast: Annotated[float, Field(gt=0.0)] = 32.0
    beta_slow: Annotated[float, Field(gt=0.0)] = 1.0
    mscale: Annotated[float | None, Field(ge=0.0)] = None
    mscale_all_dim: Annotated[float | None, Field(ge=0.0)] = None
    attention_factor: Annotated[float | None, Field(gt=0.0)] = None
    truncate: bool = True

    @model_validator(mode="after")
    def _betas(self) -> Self:
        if self.beta_fast < self.beta_slow:
            raise ValueError(
                f"beta_fast ({self.beta_fast}) must be >= beta_slow ({self.beta_slow})"
            )
        return self


def get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction: 1 for scale <= 1, else 0.1 * mscale * ln(scale) + 1."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def attention_scaling(s: YarnScaling) -> float:
    if s.attention_factor is not None:
        return s.attention_factor
    if s.mscale and s.mscale_all_dim:
        return float(get_mscale(s.factor, s.mscale) / get_mscale(s.factor, s.mscale_all_dim))
    return get_mscale(s.factor)


def correction_range(s: YarnScaling, dim: int, base: float) -> tuple[float, float]:
    """[low, high] pair indices of the ramp, clamped to [0, d-1]."""

    def corr(rotations: float) -> float:
        return (dim * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi))) / (
            2 * math.log(base)
        )

    low, high = corr(s.beta_fast), corr(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def inv_freq(scaling: YarnScaling, x: RopeInputs) -> VariantResult:
    """YaRN inverse frequencies, shape (d/2,), with A and the correction range as facts."""
    pos_freqs = x.base ** exponents(x.dim, x)
    inv_extrapolation = 1.0 / pos_freqs
    inv_interpolation = 1.0 / (scaling.factor * pos_freqs)
    low, high = correction_range(scaling, x.dim, x.base)
    lo, hi = low, high
    if lo == hi:
        hi += 0.001  # transformers: prevent the singularity
    ramp_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    ramp = torch.clamp(
        (torch.arange(x.dim // 2, dtype=ramp_dtype) - lo) / (hi - lo), 0, 1
    ).to(device=x.device, dtype=x.dtype)
    extrapolation_factor = 1 - ramp
    inv = (
        inv_interpolation * (1 - extrapolation_factor)
        + inv_extrapolation * extrapolation_factor
    )
    a = attention_scaling(scaling)
    facts: dict[str, object] = {"yarn_correction_range": [low, high]}
    if scaling.mscale_all_dim:
        facts["softmax_scale_multiplier"] = get_mscale(scaling.factor, scaling.mscale_all_dim) ** 2
    return inv, a, facts
