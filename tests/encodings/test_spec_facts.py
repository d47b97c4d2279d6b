"""`spec_facts` (encodings/base.py): a spec's canonical form, key and outputs, worked out once
per spec object, are what working them out again gives; they go with the spec."""

from __future__ import annotations

import gc

import pytest
import torch

from posenc.encodings import SpecBase, canonical_dict, compute, parse_spec
from posenc.encodings.base import _FACTS, _dict_of, _key_of, spec_facts
from posenc.presets import load_presets

SPECS = {
    f"{name}/{part.name}": part.spec
    for name, preset in load_presets().items()
    for part in preset.parts
}
"""Every curated preset's parts: real specs of the families the presets cover."""


@pytest.mark.parametrize("name", sorted(SPECS))
def test_facts_are_those_worked_out_per_call(name: str) -> None:
    spec: SpecBase = type(SPECS[name]).model_validate(canonical_dict(SPECS[name]))
    facts = spec_facts(spec)
    assert spec_facts(spec) == facts
    canon = spec.canonical()
    assert facts.canon == canon
    assert facts.spec_dict == _dict_of(canon)
    assert facts.key == _key_of(_dict_of(canon))
    assert facts.outputs == canon.outputs()


def test_compute_with_facts_remembered_is_compute_without() -> None:
    spec = parse_spec({"kind": "rope", "head_dim": 8, "max_positions": 16})
    first = compute(spec)
    _FACTS.pop(id(spec), None)
    again = compute(spec)
    assert first.meta == again.meta
    for name, tensor in first.tensors.items():
        assert torch.equal(tensor, again.tensors[name])


@pytest.mark.parametrize(
    "body",
    [{"kind": "alibi", "num_heads": 12}, {"kind": "rope", "head_dim": 8, "max_positions": 16}],
)
def test_facts_go_with_their_spec(body: dict[str, object]) -> None:
    """Whether its canonical form is the spec itself (ALiBi) or a copy (RoPE)."""
    spec = parse_spec(body)
    spec_facts(spec)
    ident = id(spec)
    assert ident in _FACTS
    del spec
    gc.collect()
    assert ident not in _FACTS
