"""The `rope_scaling` union, discriminated on `rope_type` (transformers' key names)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from posenc.encodings.rope.variants.default import DefaultScaling
from posenc.encodings.rope.variants.dynamic import DynamicScaling
from posenc.encodings.rope.variants.linear import LinearScaling
from posenc.encodings.rope.variants.llama3 import Llama3Scaling
from posenc.encodings.rope.variants.longrope import LongRopeScaling
from posenc.encodings.rope.variants.ntk_alpha import NtkAlphaScaling
from posenc.encodings.rope.variants.proportional import ProportionalScaling
from posenc.encodings.rope.variants.yarn import YarnScaling

RopeScaling = Annotated[
    DefaultScaling
    | LinearScaling
    | DynamicScaling
    | YarnScaling
    | LongRopeScaling
    | Llama3Scaling
    | ProportionalScaling
    | NtkAlphaScaling,
    Field(discriminator="rope_type"),
]

__all__ = [
    "DefaultScaling",
    "DynamicScaling",
    "LinearScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "NtkAlphaScaling",
    "ProportionalScaling",
    "RopeScaling",
    "YarnScaling",
]
