"""Unscaled RoPE (RoFormer; transformers `compute_default_rope_parameters` in each model)."""

from __future__ import annotations

from typing import Literal

from posenc.encodings.rope.variants._common import (
    RopeInputs,
    ScalingBase,
    VariantResult,
    default_inv_freq,
)
from posenc.encodings.rope.variants._hf import HfMapping, HfRopeParams


class DefaultScaling(ScalingBase):
    rope_type: Literal["default"] = "default"


def inv_freq(scaling: DefaultScaling, x: RopeInputs) -> VariantResult:
    """inv_freq[i] = base^(-2i/d), shape (d/2,); attention scaling 1."""
    return default_inv_freq(x.base, x), 1.0, {}


def from_hf(p: HfRopeParams) -> HfMapping:
    """No scaling keys to read."""
    return {"rope_type": "default"}, {}
