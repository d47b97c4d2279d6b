"""Registry of RoPE scaling variants: `rope_type` -> (parameter model, inv_freq function)."""

from __future__ import annotations

from dataclasses import dataclass

from posenc.encodings.rope.variants import (
    default,
    dynamic,
    linear,
    llama3,
    longrope,
    ntk_alpha,
    proportional,
    yarn,
)
from posenc.encodings.rope.variants._common import InvFreqFn, RopeInputs, ScalingBase


@dataclass(frozen=True)
class Variant:
    rope_type: str
    params: type[ScalingBase]
    inv_freq: InvFreqFn


VARIANTS: dict[str, Variant] = {}


def register_variant(rope_type: str, params: type[ScalingBase], fn: InvFreqFn) -> None:
    """Register a scaling variant; registering a name twice raises."""
    if rope_type in VARIANTS:
        raise ValueError(f"rope_type {rope_type!r} is already registered")
    VARIANTS[rope_type] = Variant(rope_type, params, fn)


register_variant("default", default.DefaultScaling, default.inv_freq)
register_variant("linear", linear.LinearScaling, linear.inv_freq)
register_variant("dynamic", dynamic.DynamicScaling, dynamic.inv_freq)
register_variant("yarn", yarn.YarnScaling, yarn.inv_freq)
register_variant("longrope", longrope.LongRopeScaling, longrope.inv_freq)
register_variant("llama3", llama3.Llama3Scaling, llama3.inv_freq)
register_variant("proportional", proportional.ProportionalScaling, proportional.inv_freq)
register_variant("ntk_alpha", ntk_alpha.NtkAlphaScaling, ntk_alpha.inv_freq)

__all__ = ["VARIANTS", "RopeInputs", "ScalingBase", "Variant", "register_variant"]
