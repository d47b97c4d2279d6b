"""Llama 3.1 frequency-dependent scaling (Meta `apply_scaling` in llama-models; transformers
`_compute_llama3_parameters`).

wavelen = 2*pi/inv; wavelengths above orig/low_freq_factor are divided by factor, those below
orig/high_freq_factor kept, and those between smoothed with
`smooth = (orig/wavelen - low) / (high - low)`. Llama 3.1 8B: pairs 0..28 unscaled, 29..34 smoothed,
35..63 divided by 8. Llama 4 Scout has `low_freq_factor == high_freq_factor` (1, 1): the band is
empty and every pair is either kept or divided (transformers' op order, reproduced here).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Self

import torch
from pydantic import Field, model_validator

from posenc.encodings.errors import ConfigError, FieldProblem
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
    # Required, as transformers' `_validate_llama3_rope_parameters` requires them (`KeyError:
    # Missing required keys`): Llama 3.1's 1 and 4 are one model's values, not a default.
    low_freq_factor: Annotated[float, Field(gt=0.0)]
    high_freq_factor: Annotated[float, Field(gt=0.0)]
    # Required, as YaRN's: transformers fills it from the config's max_position_embeddings,
    # which a spec does not carry; no model's pre-training length is a safe default.
    original_max_position_embeddings: Annotated[int, Field(ge=1)]

    @model_validator(mode="after")
    def _order(self) -> Self:
        # transformers only logs `high_freq_factor <= low_freq_factor` and builds the model;
        # equal factors (Llama 4 Scout: 1 and 1) are served exactly as it computes them (an
        # empty smoothing band), a reversed band is refused.
        if self.high_freq_factor < self.low_freq_factor:
            raise field_error(
                [
                    Issue(
                        ("high_freq_factor",),
                        f"must be >= low_freq_factor ({self.low_freq_factor})",
                        self.high_freq_factor,
                    )
                ]
            )
        return self

    def check_frequencies(self, x: RopeInputs) -> list[Issue]:
        """Equal factors leave the smoothing band empty unless a wavelength equals the boundary
        `original / low_freq_factor` exactly: there transformers divides by high - low = 0 and
        its frequency is NaN or inf. Refused only then."""
        if self.high_freq_factor != self.low_freq_factor:
            return []
        inv, _, _ = inv_freq(self, x)
        bad = (~torch.isfinite(inv)).nonzero().flatten().tolist()
        if not bad:
            return []
        boundary = self.original_max_position_embeddings / self.low_freq_factor
        return [
            Issue(
                ("rope_scaling", "high_freq_factor"),
                f"equals low_freq_factor while the wavelength of pair {bad[0]} is exactly "
                f"original_max_position_embeddings / low_freq_factor = {boundary}: transformers "
                "divides by high_freq_factor - low_freq_factor = 0 there (a NaN frequency)",
                self.high_freq_factor,
            )
        ]


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


HF_REQUIRED = ("factor", "low_freq_factor", "high_freq_factor")
"""Keys a config.json's llama3 dict must carry: transformers'
`_validate_llama3_rope_parameters` raises `KeyError: Missing required keys` without them (its
`original_max_position_embeddings` and `rope_theta` are filled in by `standardize_rope_params`)."""


def from_hf(p: HfRopeParams) -> HfMapping:
    """`factor`, `low_freq_factor`, `high_freq_factor` (all required, as transformers requires
    them: no default is invented) and the original length."""
    missing = [name for name in HF_REQUIRED if p.params.get(name) is None]
    if missing:
        why = "required key missing: transformers' llama3 validation raises KeyError (Missing "
        why += f"required keys) without {missing}"
        raise ConfigError(
            "cannot map config", [FieldProblem(f"{p.key}.{name}", why, None) for name in missing]
        )
    original = p.original_length()
    data: dict[str, Any] = {
        "rope_type": "llama3",
        "factor": p.factor(),
        "original_max_position_embeddings": original,
    }
    for name in ("low_freq_factor", "high_freq_factor"):
        data[name] = p.value(name)
    return data, {}
