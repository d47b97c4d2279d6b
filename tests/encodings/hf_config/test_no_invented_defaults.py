"""No invented defaults (issue 30 item 3): for every rope_type transformers validates, each key
of its rope parameters removed in turn, posenc's `/v1/resolve` mapping answers as transformers
does: where transformers refuses the config (`_validate_<type>_rope_parameters` raises
`KeyError: Missing required keys`), posenc refuses naming the key; where it fills a value in,
posenc's table is the model's rotary module's, bit for bit.

The rope types and their required and optional keys are read from transformers' own validation
code (`rope_keys`), not listed here.
"""

from __future__ import annotations

from typing import Any

import pytest

from posenc.encodings import SpecError
from tests.encodings.hf_config import rope_keys
from tests.encodings.hf_config import rope_sweep as sweep
from tests.encodings.hf_config.rope_keys import HEAD_DIM, VALUES, validated_keys

_rope_types = rope_keys.rope_types
_keys = rope_keys.keys
CASES = rope_keys.cases()


def test_every_rope_type_and_key_comes_from_transformers() -> None:
    """The types are transformers' validators (those its rotary modules compute: `axial` is the
    vision towers' 2-D rotary, served or refused by the vision sweep), and every key they
    name has a value here."""
    types = set(validated_keys())
    assert {"default", "linear", "dynamic", "yarn", "longrope", "llama3"} <= types
    assert types - set(_rope_types()) <= {"axial"}
    for rope_type in _rope_types():
        missing = set(_keys(rope_type)) - set(VALUES)
        assert not missing, f"{rope_type}: no test value for {missing}"
    assert validated_keys()["llama3"][0] >= {"low_freq_factor", "high_freq_factor", "factor"}


def _config(rope_type: str, removed: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {"rope_type": rope_type}
    params.update({k: VALUES[k] for k in _keys(rope_type) if k != removed})
    return {
        "model_type": "llama",
        "hidden_size": 4 * HEAD_DIM,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "max_position_embeddings": 4096,
        "rope_parameters": params,
    }


def _transformers(data: dict[str, Any]) -> sweep.Reference | Exception:
    try:
        sweep.load_config(data)
    except Exception as err:
        return err
    return sweep.module_reference(data)


@pytest.mark.parametrize(("rope_type", "removed"), CASES, ids=[f"{t}-{k}" for t, k in CASES])
def test_removed_key_is_answered_as_transformers_answers(
    rope_type: str, removed: str | None
) -> None:
    data = _config(rope_type, removed)
    theirs = _transformers(data)
    try:
        mine: list[sweep.Table] | SpecError = sweep.posenc_tables(data, sweep.SEQ)
    except SpecError as err:
        mine = err
    if isinstance(theirs, Exception):
        assert isinstance(theirs, KeyError), f"transformers: {type(theirs).__name__}: {theirs}"
        assert isinstance(mine, SpecError), f"transformers refuses ({theirs}); posenc serves"
        fields = [p.field for p in mine.problems]
        assert f"rope_parameters.{removed}" in fields, fields
        return
    assert not isinstance(mine, SpecError), f"transformers serves; posenc refuses: {mine}"
    verdict = sweep.judge(theirs, mine)
    assert verdict.outcome == "exact", verdict.line()
    applied = mine[0].notes.get("defaults_applied", {})
    if removed == "original_max_position_embeddings":
        # transformers' standardize_rope_params fills it from max_position_embeddings
        assert applied.get(f"rope_parameters.{removed}") == 4096, mine[0].notes
