"""Registry of RoPE scaling variants: `rope_type` -> its parameter model, `inv_freq` and `from_hf`.

A variant is one module (named as its `rope_type`) defining the parameter model, whose
`rope_type` literal is the variant's name, `inv_freq` and `from_hf` (`_common.py`, `_hf.py`), plus
one `register_variant` line here. Everything that lists variants derives from `VARIANTS`: the
`rope_scaling` union (`rope/scaling.py`), the config.json rope types (`hf_config.ROPE_TYPES`) and
the flat scaling keys (`flat_scaling_keys`, which the client's list must equal).
"""

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
from posenc.encodings.rope.variants._common import InvFreqFn, RopeInputs, ScalingBase, Switch
from posenc.encodings.rope.variants._hf import FromHfFn, HfMapping, HfRopeParams


@dataclass(frozen=True)
class Variant:
    """One registered variant: its name, parameter model, `inv_freq` and `from_hf`."""

    rope_type: str
    params: type[ScalingBase]
    inv_freq: InvFreqFn
    from_hf: FromHfFn


VARIANTS: dict[str, Variant] = {}

CONFIG_LEVEL_KEYS = frozenset({"max_position_embeddings", "partial_rotary_factor"})
"""Keys some variants hold in `rope_scaling` that a config.json also writes at its top level,
meaning the model's (its length, its rotary fraction): a flat spelling keeps them there."""


def register_variant(params: type[ScalingBase], inv_freq: InvFreqFn, from_hf: FromHfFn) -> None:
    """Register a scaling variant under its `rope_type` literal; registering a name twice raises."""
    rope_type = params.model_fields["rope_type"].default
    if not isinstance(rope_type, str):
        raise TypeError(f"{params.__name__}.rope_type needs a string default, got {rope_type!r}")
    if rope_type in VARIANTS:
        raise ValueError(f"rope_type {rope_type!r} is already registered")
    VARIANTS[rope_type] = Variant(rope_type, params, inv_freq, from_hf)


def flat_scaling_keys() -> frozenset[str]:
    """The keys a flat, config.json-style spelling moves into `rope_scaling`: every registered
    variant's fields, less `CONFIG_LEVEL_KEYS`."""
    fields = {name for v in VARIANTS.values() for name in v.params.model_fields}
    return frozenset(fields - CONFIG_LEVEL_KEYS)


register_variant(default.DefaultScaling, default.inv_freq, default.from_hf)
register_variant(linear.LinearScaling, linear.inv_freq, linear.from_hf)
register_variant(dynamic.DynamicScaling, dynamic.inv_freq, dynamic.from_hf)
register_variant(yarn.YarnScaling, yarn.inv_freq, yarn.from_hf)
register_variant(longrope.LongRopeScaling, longrope.inv_freq, longrope.from_hf)
register_variant(llama3.Llama3Scaling, llama3.inv_freq, llama3.from_hf)
register_variant(proportional.ProportionalScaling, proportional.inv_freq, proportional.from_hf)
register_variant(ntk_alpha.NtkAlphaScaling, ntk_alpha.inv_freq, ntk_alpha.from_hf)

__all__ = [
    "CONFIG_LEVEL_KEYS",
    "VARIANTS",
    "HfMapping",
    "HfRopeParams",
    "RopeInputs",
    "ScalingBase",
    "Switch",
    "Variant",
    "flat_scaling_keys",
    "register_variant",
]
