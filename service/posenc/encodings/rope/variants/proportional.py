"""Proportional RoPE (Gemma 4; transformers `_compute_proportional_rope_parameters`).

`int(partial_rotary_factor * head_dim // 2)` pairs rotate with exponents 2i/head_dim (denominator
head_dim, not the rotated width); the remaining pairs get inv_freq 0 (cos 1, sin 0). The table is
always head_dim wide; inv_freq is divided by factor.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import torch
from pydantic import Field

from posenc.encodings.rope.variants._common import RopeInputs, ScalingBase, VariantResult, exponents
from posenc.encodings.rope.variants._hf import HfMapping, HfRopeParams
from posenc.encodings.rope.variants.default import DefaultScaling


class ProportionalScaling(ScalingBase):
    rope_type: Literal["proportional"] = "proportional"
    factor: Annotated[float, Field(ge=1.0)] = 1.0
    partial_rotary_factor: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0

    spans_head_dim: ClassVar[bool] = True

    def canonical(self) -> ScalingBase:
        # Every pair rotating over head_dim, divided by 1.0: the unscaled table, bit for bit.
        if self.partial_rotary_factor == 1.0 and self.factor == 1.0:
            return DefaultScaling()
        return self


def inv_freq(scaling: ProportionalScaling, x: RopeInputs) -> VariantResult:
    """Proportional inverse frequencies, shape (head_dim/2,); attention scaling 1; facts: how many
    pairs rotate."""
    head_dim = x.head_dim
    rope_angles = int(scaling.partial_rotary_factor * head_dim // 2)
    rotated = 1.0 / (x.base ** exponents(2 * rope_angles, x, denominator=head_dim))
    nope = head_dim // 2 - rope_angles
    inv = (
        torch.cat((rotated, torch.zeros(nope, dtype=x.dtype, device=x.device)), dim=0)
        if nope > 0
        else rotated
    )
    inv /= scaling.factor
    return inv, 1.0, {"rotated_pairs": rope_angles}


def from_hf(p: HfRopeParams) -> HfMapping:
    """`factor` and the dict's own `partial_rotary_factor`, when set (the rotary dim is head_dim:
    the variant rotates its part itself)."""
    data: dict[str, Any] = {"rope_type": "proportional"}
    for name in ("factor", "partial_rotary_factor"):
        value = p.optional(name)
        if value is not None:
            data[name] = value
    return data, {}
