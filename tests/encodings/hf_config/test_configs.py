"""Every config file in tests/data/configs maps to the expected specs; v4 and v5 shapes of one
model give the same content keys."""

from __future__ import annotations

import pytest

from posenc.encodings import content_key
from posenc.encodings.hf_config import from_hf_config, resolve_hf_config
from tests.encodings.hf_config.support import (
    CONFIGS,
    EXPECTED,
    RESOLVE_OVERRIDES,
    SOURCES,
    V4_V5_PAIRS,
    load,
    subset,
)


def test_every_config_file_is_listed() -> None:
    files = {p.name for p in CONFIGS.glob("*.json")}
    assert files == set(SOURCES) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_resolves_to_expected_specs(name: str) -> None:
    overrides = RESOLVE_OVERRIDES.get(name, {})
    resolved = resolve_hf_config(load(name), **overrides)
    assert [n.name for n in resolved] == list(EXPECTED[name])
    for named in resolved:
        subset(named.spec.model_dump(), EXPECTED[name][named.name], named.name)
    assert [n.spec for n in resolved] == from_hf_config(load(name), **overrides)


@pytest.mark.parametrize(("v4", "v5"), V4_V5_PAIRS)
def test_v4_and_v5_shapes_give_the_same_content_key(v4: str, v5: str) -> None:
    a, b = resolve_hf_config(load(v4)), resolve_hf_config(load(v5))
    assert {n.name: content_key(n.spec) for n in a} == {n.name: content_key(n.spec) for n in b}
