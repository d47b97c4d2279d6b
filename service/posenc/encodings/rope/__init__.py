"""RoPE family: spec, scaling variants and computation."""

from posenc.encodings.rope.compute import (
    compute_rope,
    half_cos_sin,
    layout,
    rope_inv_freq,
    tables,
)
from posenc.encodings.rope.profiles import PROFILES, ConsumerProfile
from posenc.encodings.rope.spec import RopeSpec
from posenc.encodings.rope.variants import VARIANTS

__all__ = [
    "PROFILES",
    "VARIANTS",
    "ConsumerProfile",
    "RopeSpec",
    "compute_rope",
    "half_cos_sin",
    "layout",
    "rope_inv_freq",
    "tables",
]
