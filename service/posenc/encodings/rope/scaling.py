"""The `rope_scaling` union, discriminated on `rope_type` (transformers' key names).

Its members are the registered variants' parameter models, in registry order (`VARIANTS`); type
checkers see their common base.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Union

from pydantic import Field

from posenc.encodings.rope.variants import VARIANTS, ScalingBase
from posenc.encodings.rope.variants.default import DefaultScaling

if TYPE_CHECKING:
    RopeScaling = ScalingBase
else:
    RopeScaling = Annotated[
        Union[tuple(v.params for v in VARIANTS.values())],  # noqa: UP007
        Field(discriminator="rope_type"),
    ]

__all__ = ["DefaultScaling", "RopeScaling", "ScalingBase"]
