"""No invented defaults (issue 30 item 3): for every rope_type transformers validates, each key
of its rope parameters removed in turn, posenc's `/v1/resolve` mapping answers as transformers
does: where transformers refuses the config (`_validate_<type>_rope_parameters` raises
`KeyError: Missing required keys`), posenc refuses naming the key; where it fills a value in,
posenc's table is the model's rotary module's, bit for bit.

The rope types and their required and optional keys are read from transformers' own validation
code (each `_validate_<type>_rope_parameters` is run and its `_check_received_keys` call
recorded), not listed here; only the values put in the dicts are (`VALUES`, chosen away from the
defaults so that a default applied in place of a value shows).
"""

from __future__ import annotations

import functools
from typing import Any
from unittest import mock

import pytest

from posenc.encodings import SpecError
from tests.encodings.hf_config import rope_sweep as sweep

HEAD_DIM = 64
VALUES: dict[str, Any] = {
    "rope_theta": 50000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 1024,
    "low_freq_factor": 2.0,
    "high_freq_factor": 8.0,
    "attention_factor": 1.25,
    "beta_fast": 24.0,
    "beta_slow": 2.0,
    "mscale": 0.9,
    "mscale_all_dim": 0.7,
    "truncate": False,
    "short_factor": [1.0 + 0.01 * i for i in range(HEAD_DIM // 2)],
    "long_factor": [1.0 + 0.2 * i for i in range(HEAD_DIM // 2)],
}
"""The value of each key in the test dicts (a key transformers adds that is missing here fails
`test_every_key_has_a_value`)."""

SKIPPED_KEYS = frozenset({"rope_type", "partial_rotary_factor"})
"""Not removed: `rope_type` names the case; `partial_rotary_factor` is every type's optional
width (the RoPE sweep covers it)."""


class _RecordedError(Exception):
    pass


@functools.cache
def validated_keys() -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """rope_type -> (required keys, optional keys) of transformers' validation of its dict."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import RotaryEmbeddingConfigMixin

    config = LlamaConfig()
    found: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
    prefix, suffix = "_validate_", "_rope_parameters"
    for name in dir(RotaryEmbeddingConfigMixin):
        if not (name.startswith(prefix) and name.endswith(suffix)):
            continue
        rope_type = name[len(prefix) : -len(suffix)]
        seen: dict[str, frozenset[str]] = {}

        def record(
            rope_type: str,
            received: set[str],
            required: set[str],
            optional_keys: set[str] | None = None,
            ignore_keys: set[str] | None = None,
            seen: dict[str, frozenset[str]] = seen,
        ) -> None:
            seen["required"] = frozenset(required)
            seen["optional"] = frozenset(optional_keys or ())
            raise _RecordedError

        with (
            mock.patch.object(
                RotaryEmbeddingConfigMixin, "_check_received_keys", staticmethod(record)
            ),
            pytest.raises(_RecordedError),
        ):
            getattr(config, name)({"rope_type": rope_type}, ignore_keys=None)
        found[rope_type] = (seen["required"], seen["optional"])
    return found


def _rope_types() -> list[str]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return sorted(t for t in validated_keys() if t == "default" or t in ROPE_INIT_FUNCTIONS)


def _keys(rope_type: str) -> list[str]:
    required, optional = validated_keys()[rope_type]
    return sorted((required | optional) - SKIPPED_KEYS)


CASES = [(t, key) for t in _rope_types() for key in [None, *_keys(t)]]


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
