"""Fixed NTK-alpha scaling (Hunyuan; transformers `HunYuanDenseV1RotaryEmbedding.
compute_ntk_alpha_rope_parameters`): `base' = base * alpha ** (d / (d - 2))`."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from posenc.encodings.rope.variants._common import (
    Issue,
    RopeInputs,
    ScalingBase,
    VariantResult,
    default_inv_freq,
)
from posenc.encodings.rope.variants._hf import HfMapping, HfRopeParams
from posenc.encodings.rope.variants.default import DefaultScaling


class NtkAlphaScaling(ScalingBase):
    rope_type: Literal["ntk_alpha"] = "ntk_alpha"
    alpha: Annotated[float, Field(gt=0.0)]

    # Not a transformers rope_type: HunYuan's rotary class selects it for "dynamic" with `alpha`.
    in_transformers: ClassVar[bool] = False

    def check_dim(self, dim: int) -> list[Issue]:
        if dim <= 2:
            return [
                Issue(("rotary_dim",), f"NTK-alpha needs rotary dim > 2 (d/(d-2)), got {dim}", dim)
            ]
        return []

    def canonical(self) -> ScalingBase:
        # base * 1 ** e == base exactly: alpha 1 is the unscaled table, bit for bit.
        return DefaultScaling() if self.alpha == 1.0 else self


def inv_freq(scaling: NtkAlphaScaling, x: RopeInputs) -> VariantResult:
    """inv_freq = base'^(-2i/d), shape (d/2,); attention scaling 1; facts: the effective base."""
    base = x.base * scaling.alpha ** (x.dim / (x.dim - 2))
    return default_inv_freq(base, x), 1.0, {"effective_rope_theta": base}


def from_hf(p: HfRopeParams) -> HfMapping:
    """`alpha` (required); notes: the config's rope_type and why the table is fixed."""
    notes = {
        "config_rope_type": "dynamic",
        "ntk_alpha": (
            "fixed NTK-alpha base (transformers HunYuan): alpha set, so not length dependent"
        ),
    }
    return {"rope_type": "ntk_alpha", "alpha": p.value("alpha")}, notes
