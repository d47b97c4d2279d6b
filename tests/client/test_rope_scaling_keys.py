"""Contract: the client's flat RoPE scaling keywords are exactly the keys the server's variant
registry puts into `rope_scaling` (every registered variant's fields, less the keys a config.json
also writes at its top level). A new variant's keys fail this test until the client knows them."""

from __future__ import annotations

from posenc.encodings.rope.variants import CONFIG_LEVEL_KEYS, VARIANTS, flat_scaling_keys
from posenc_client._options import LENGTH_SCALED_TYPES, ROPE_SCALING_KEYS


def test_client_scaling_keys_equal_the_registry() -> None:
    assert set(ROPE_SCALING_KEYS) == set(flat_scaling_keys())


def test_config_level_keys_are_variant_fields() -> None:
    fields = {name for v in VARIANTS.values() for name in v.params.model_fields}
    assert fields >= CONFIG_LEVEL_KEYS


def test_client_length_scaled_types_equal_the_registry() -> None:
    """The variants whose parameters hold max_position_embeddings are the ones the client copies
    a flat max_position_embeddings into `rope_scaling` for."""
    scaled = {n for n, v in VARIANTS.items() if "max_position_embeddings" in v.params.model_fields}
    assert scaled == LENGTH_SCALED_TYPES
