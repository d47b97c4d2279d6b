"""YaRN (Peng et al. 2023, arXiv:2309.00071). transformers `_compute_yarn_parameters`.

`inv = inter * (1 - ef) + extra * ef`, shape (d/2,), with extra = 1/pos_freqs,
inter = 1/(factor * pos_freqs), ef = 1 - ramp over the correction range [low, high] found from
beta_fast/beta_slow rotations at the original length (floored/ceiled when `truncate`, the default;
GPT-OSS sets it false). Attention scaling A = attention_factor, else
get_mscale(f, mscale)/get_mscale(f, mscale_all_dim) when both are set, else get_mscale(f) (a lone
mscale is ignored, as in transformers). DeepSeek-V2/V3 also multiply the softmax scale by
get_mscale(f, mscale_all_dim)**2 in attention (transformers `yarn_apply_mscale`, #47435): reported
as `softmax_scale_multiplier`, since no cos/sin table carries it.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Self

import torch
from pydantic import Field, model_validator

from posenc.encodings.rope.variants._common import (
    Issue,
    RopeInputs,
    ScalingBase,
    VariantResult,
    exponents,
    field_error,
)
from posenc.encodings.rope.variants._hf import HfMapping, HfRopeParams


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
            raise field_error(
                [Issue(("beta_fast",), f"must be >= beta_slow ({self.beta_slow})", self.beta_fast)]
            )
        return self

    def canonical(self) -> YarnScaling:
        # transformers tests `if mscale and mscale_all_dim`: 0 and None read the same, and mscale
        # only counts next to mscale_all_dim and without an explicit attention_factor.
        all_dim = self.mscale_all_dim or None
        mscale = (
            self.mscale if (self.mscale and all_dim and self.attention_factor is None) else None
        )
        return self.model_copy(update={"mscale": mscale, "mscale_all_dim": all_dim})


def get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction: 1 for scale <= 1, else 0.1 * mscale * ln(scale) + 1."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def attention_scaling(s: YarnScaling) -> float:
    """A, folded into cos and sin (transformers `attention_factor`)."""
    if s.attention_factor is not None:
        return s.attention_factor
    if s.mscale and s.mscale_all_dim:
        return float(get_mscale(s.factor, s.mscale) / get_mscale(s.factor, s.mscale_all_dim))
    return get_mscale(s.factor)


def softmax_scale_multiplier(s: YarnScaling) -> float | None:
    """get_mscale(f, mscale_all_dim)**2, the factor DeepSeek-V2/V3 apply to 1/sqrt(qk_head_dim);
    None when mscale_all_dim is unset (no model applies one then)."""
    if not s.mscale_all_dim:
        return None
    m = get_mscale(s.factor, s.mscale_all_dim)
    return m * m


def correction_range(s: YarnScaling, dim: int, base: float) -> tuple[float, float]:
    """[low, high] pair indices of the ramp, clamped to [0, d-1] (transformers
    `find_correction_range`)."""

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
    # transformers builds the ramp in fp32 on the CPU, then moves it; exact builds it in float64.
    ramp_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    linear = (torch.arange(x.dim // 2, dtype=ramp_dtype) - lo) / (hi - lo)
    ramp = torch.clamp(linear, 0, 1).to(device=x.device, dtype=x.dtype)
    extrapolation_factor = 1 - ramp
    inv = inv_interpolation * (1 - extrapolation_factor) + inv_extrapolation * extrapolation_factor
    facts: dict[str, object] = {"yarn_correction_range": [low, high]}
    multiplier = softmax_scale_multiplier(scaling)
    if multiplier is not None:
        facts["softmax_scale_multiplier"] = multiplier
    return inv, attention_scaling(scaling), facts


def from_hf(p: HfRopeParams) -> HfMapping:
    """`factor` (required as a key, as transformers' `_validate_yarn_rope_parameters` requires
    it; a null value is max_position_embeddings / original length, as
    `_compute_yarn_parameters` fills it), the original length, the optional keys; notes: A and
    the softmax multiplier."""
    if "factor" not in p.params:
        p.fail(
            "factor",
            "required key missing: transformers' yarn validation raises KeyError (Missing "
            "required keys) without it (null means max_position_embeddings / "
            "original_max_position_embeddings)",
            None,
        )
    original = p.original_length()
    factor = p.optional("factor")
    if factor is None:
        factor = p.needs_max_position_embeddings("yarn without factor needs it") / original
    data: dict[str, Any] = {
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": original,
    }
    for name in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor"):
        if p.params.get(name):  # transformers: `get(...) or default`; 0 means unset
            data[name] = p.value(name)
    if p.params.get("truncate") is not None:
        if p.nested and not p.params["truncate"]:
            # `truncate = config.rope_parameters.get("truncate", True)`: the top level of the
            # model's rope parameters, never a per-layer-type (or per-rope-key) dict's
            p.fail(
                "truncate",
                "not read: transformers' _compute_yarn_parameters reads truncate from the top "
                "level of rope_parameters only, so a nested dict's truncate is always True in "
                "the model; remove it (or give true)",
                p.params["truncate"],
            )
        data["truncate"] = bool(p.params["truncate"])
    scaling = p.validated(YarnScaling, data)
    notes: dict[str, Any] = {"attention_scaling": attention_scaling(scaling)}
    multiplier = softmax_scale_multiplier(scaling)
    if multiplier is not None:
        notes["softmax_scale_multiplier"] = multiplier
    return data, notes
