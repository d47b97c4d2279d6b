"""Linear position interpolation (kaiokendev; Chen et al. 2023). transformers
`_compute_linear_scaling_rope_parameters`: `inv_freq /= factor`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from posenc.encodings.rope.variants._common import (
    RopeInputs,
    ScalingBase,
    VariantResult,
    default_inv_freq,
)
from posenc.encodings.rope.variants._hf import HfMapping, HfRopeParams
from posenc.encodings.rope.variants.default import DefaultScaling


class LinearScaling(ScalingBase):
    rope_type: Literal["linear"] = "linear"
    factor: Annotated[float, Field(ge=1.0)]

    def canonical(self) -> ScalingBase:
        # inv / 1.0 == inv exactly: factor 1 is the unscaled table, bit for bit.
        return DefaultScaling() if self.factor == 1.0 else self


def inv_freq(scaling: LinearScaling, x: RopeInputs) -> VariantResult:
    """inv_freq = base^(-2i/d) / factor, shape (d/2,); attention scaling 1."""
    inv = default_inv_freq(x.base, x)
    inv /= scaling.factor
    return inv, 1.0, {}


def from_hf(p: HfRopeParams) -> HfMapping:
    """`factor` (required)."""
    return {"rope_type": "linear", "factor": p.factor()}, {}
