"""The variant registry is the one list of RoPE variants: every entry is complete (parameter
model named as its module, `inv_freq`, `from_hf`), and what lists variants elsewhere derives
from it (the `rope_scaling` union, `hf_config.ROPE_TYPES`)."""

from __future__ import annotations

import typing
from typing import Any

import pytest

from posenc.encodings.config_values import fail
from posenc.encodings.hf_config import ROPE_TYPES
from posenc.encodings.rope import RopeSpec
from posenc.encodings.rope.variants import VARIANTS, HfRopeParams, register_variant
from posenc.encodings.rope.variants.default import DefaultScaling

# One rope parameter dict per variant, as a config.json writes it (d = 8: four pairs).
HF_PARAMS: dict[str, dict[str, Any]] = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32, "mscale_all_dim": 1.0},
    "longrope": {
        "rope_type": "longrope",
        "short_factor": [1.0, 1.0, 1.5, 2.0],
        "long_factor": [1.0, 2.0, 3.0, 4.0],
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "proportional": {"rope_type": "proportional", "partial_rotary_factor": 0.5},
    "ntk_alpha": {"rope_type": "ntk_alpha", "alpha": 1000.0},
}


def _params(rope_type: str) -> HfRopeParams:
    return HfRopeParams(
        params=HF_PARAMS[rope_type],
        key="rope_parameters",
        max_position_embeddings=4096,
        max_position_embeddings_key="max_position_embeddings",
        original_length=lambda: 1024,
    )


def test_every_variant_has_a_from_hf_case() -> None:
    assert set(HF_PARAMS) == set(VARIANTS)


@pytest.mark.parametrize("rope_type", sorted(VARIANTS))
def test_entries_are_complete_and_named_as_their_module(rope_type: str) -> None:
    variant = VARIANTS[rope_type]
    assert variant.rope_type == rope_type
    assert variant.params.__module__.rsplit(".", 1)[-1] == rope_type
    assert variant.inv_freq.__module__ == variant.params.__module__
    assert variant.from_hf.__module__ == variant.params.__module__


@pytest.mark.parametrize("rope_type", sorted(VARIANTS))
def test_from_hf_maps_to_a_valid_spec_of_its_variant(rope_type: str) -> None:
    data, notes = VARIANTS[rope_type].from_hf(_params(rope_type))
    assert data["rope_type"] == rope_type
    assert isinstance(notes, dict)
    spec = RopeSpec.model_validate({"head_dim": 8, "max_positions": 16, "rope_scaling": data})
    assert type(spec.rope_scaling) is VARIANTS[rope_type].params


def test_the_rope_scaling_union_is_the_registry() -> None:
    union = RopeSpec.model_fields["rope_scaling"].annotation
    assert list(typing.get_args(union)) == [v.params for v in VARIANTS.values()]


def test_config_rope_types_are_the_registered_transformers_names() -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    assert set(ROPE_TYPES) == {"default", *ROPE_INIT_FUNCTIONS}
    assert list(ROPE_TYPES) == [n for n in VARIANTS if n in ROPE_TYPES]


def test_registering_a_name_twice_raises() -> None:
    def from_hf(p: HfRopeParams) -> Any:
        fail(p.key, "unused")

    with pytest.raises(ValueError, match="already registered"):
        register_variant(DefaultScaling, VARIANTS["default"].inv_freq, from_hf)
