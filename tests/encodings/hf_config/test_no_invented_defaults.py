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


def _mla_config(model_type: str, factor: float | None) -> dict[str, Any]:
    """The rope sweep's (shrunk) class-default config of an MLA family whose config class derives
    partial_rotary_factor from qk_rope_head_dim / head_dim, with every layer type's factor
    removed (None) or set."""
    data = sweep.case_config(model_type, "default", "v5")
    params = data["rope_parameters"]
    for part in (params, *params.values()):
        if isinstance(part, dict) and ("rope_theta" in part or "rope_type" in part):
            part.pop("partial_rotary_factor", None)
            if factor is not None:
                part["partial_rotary_factor"] = factor
    return data


@pytest.mark.parametrize("model_type", ["mistral4", "dots3_note_text"])
def test_mla_partial_factor_takes_the_class_default(model_type: str) -> None:
    """Mistral4Config setdefaults (Dots3NoteTextConfig sets) partial_rotary_factor to
    qk_rope_head_dim / head_dim: rope parameters without it are served exact against the
    model's rotary module, the default listed in notes.defaults_applied (issue 30: it was
    refused with 'int(head_dim 128 * None)')."""
    data = _mla_config(model_type, None)
    tables = sweep.posenc_tables(data, sweep.SEQ)
    verdict = sweep.judge(sweep._model_or_module(data, sweep.SEQ), tables)
    assert verdict.outcome == "exact", verdict.line()
    for table in tables:
        applied = table.notes["defaults_applied"]
        keys = [k for k in applied if k.endswith(".partial_rotary_factor")]
        assert keys, applied
        assert all(0 < applied[k] < 1 for k in keys), applied


@pytest.mark.parametrize(("model_type", "factor"), [("mistral4", 0.75), ("dots3_note_text", 0.5)])
def test_mla_partial_factor_refusal_states_the_reason(model_type: str, factor: float) -> None:
    """A factor whose width is not qk_rope_head_dim is refused naming the key, the reason the
    numbers transformers uses (no None leaking into it): Mistral 4 would rotate other channels
    than its q_rot, dots.3 note overwrites the file's value."""
    data = _mla_config(model_type, factor)
    with pytest.raises(SpecError) as raised:
        sweep.posenc_tables(data, sweep.SEQ)
    (problem, *_) = raised.value.problems
    assert problem.field.endswith(".partial_rotary_factor") or problem.field == (
        "rope_parameters.partial_rotary_factor"
    )
    assert "None" not in problem.message, problem.message
    assert str(factor) in problem.message
    assert "qk_rope_head_dim" in problem.message
    if model_type == "dots3_note_text":
        assert "convert_rope_params_to_dict" in problem.message
