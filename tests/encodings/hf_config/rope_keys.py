"""transformers' rope parameter keys, read from its own validation code: each
`_validate_<type>_rope_parameters` of `RotaryEmbeddingConfigMixin` is run and its
`_check_received_keys` call recorded (required and optional keys), not listed here; only the
values put in test dicts are (`VALUES`, chosen away from the defaults so that a default applied
in place of a value shows). Shared by the resolve test (`test_no_invented_defaults.py`) and the
spec-language test (`tests/api/test_spec_keys.py`).
"""

from __future__ import annotations

import functools
from typing import Any
from unittest import mock

import pytest

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


def rope_types() -> list[str]:
    """The validated types transformers' rotary modules compute (`axial`, the vision towers'
    2-D rotary, is the vision sweep's)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return sorted(t for t in validated_keys() if t == "default" or t in ROPE_INIT_FUNCTIONS)


def keys(rope_type: str) -> list[str]:
    """The keys of `rope_type`'s dict a test removes in turn (`SKIPPED_KEYS` aside)."""
    required, optional = validated_keys()[rope_type]
    return sorted((required | optional) - SKIPPED_KEYS)


def cases() -> list[tuple[str, str | None]]:
    """(rope_type, removed key), None: the whole dict."""
    return [(t, key) for t in rope_types() for key in [None, *keys(t)]]
