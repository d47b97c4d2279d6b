"""Llama 3.1 frequency-dependent scaling (Meta `apply_scaling` in llama-models; transformers
`_compute_llama3_parameters`).

wavelen = 2*pi/inv; wavelengths above orig/low_freq_factor are divided by factor, those below
orig/high_freq_factor kept, and those between smoothed with
`smooth = (orig/wavelen - low) / (high - low)`. Llama 3.1 8B: pairs 0..28 unscaled, 29..34 smoothed,
35..63 divided by 8.
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
    default_inv_freq,
    field_error,
)
from posenc.encodings.rope.variants._hf import HfMapping, HfRopeParams


class Llama3Scaling(ScalingBase):
    rope_type: Literal["llama3"] = "llama3"
    factor: Annotated[float, Field(ge=1.0)]
    low_freq_factor: Annotated[float, Field(gt=0.0)] = 1.0
    high_freq_factor: Annotated[float, Field(gt=0.0)] = 4.0
    original_max_position_embeddings: Annotated[int, Field(ge=1)] = 8192

    @model_validator(mode="after")
    def _order(self) -> Self:
        if self.high_freq_factor <= self.low_freq_factor:
            raise field_error(
                [
                    Issue(
                        ("high_freq_factor",),
                        f"must be > low_freq_factor ({self.low_freq_factor})",
                        self.high_freq_factor,
                    )
                ]
            )
        return self


def inv_freq(scaling: Llama3Scaling, x: RopeInputs) -> VariantResult:
    """Llama 3 inverse frequencies, shape (d/2,); attention scaling 1."""
    inv = default_inv_freq(x.base, x)
    factor = scaling.factor
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    original = scaling.original_max_position_embeddings
    low_freq_wavelen = original / low
    high_freq_wavelen = original / high
    wavelen = 2 * math.pi / inv
    inv_llama = torch.where(wavelen > low_freq_wavelen, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_llama), 1.0, {}


def from_hf(p: HfRopeParams) -> HfMapping:
    """`factor` (required), the original length, `low_freq_factor` / `high_freq_factor` when set."""
    original = p.original_length()
    data: dict[str, Any] = {
        "rope_type": "llama3",
        "factor": p.factor(),
        "original_max_position_embeddings": original,
    }
    for name in ("low_freq_factor", "high_freq_factor"):
        value = p.optional(name)
        if value is not None:
            data[name] = value
    return data, {}
