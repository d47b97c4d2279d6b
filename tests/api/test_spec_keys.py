"""No invented defaults in the spec language (issue 30): for every rope_type transformers
validates, each key of its rope parameters removed in turn, `POST /v1/tables` (through the Python
client) answers a spec as transformers answers the same dict:

- transformers refuses it (`_validate_<type>_rope_parameters` raises `KeyError: Missing
  required keys`, e.g. llama3 without `low_freq_factor`): a 422 naming `rope_scaling.<key>`;
- transformers fills the key from the config's `max_position_embeddings`
  (`original_max_position_embeddings`, in `standardize_rope_params`), which a spec does not
  carry: a 422 naming it (the spec requires what the config would have told);
- transformers computes without it (its own default: `rope_theta` from `default_theta`, YaRN's
  betas and `truncate`, proportional's `factor`, the attention factors): the table is the model's
  rotary module's (`LlamaRotaryEmbedding` of the same dict), bit for bit, and q.k through its
  apply function agrees.

The rope types and keys are read from transformers' validation code (`rope_keys`), not listed
here. The keys a spec carries in place of config attributes transformers reads beside the dict
(`max_position_embeddings` for dynamic NTK and LongRoPE's factor) are given the config's value.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from posenc_client import Client, InvalidSpecError
from tests.conftest import ServerHandle
from tests.encodings.hf_config import rope_keys
from tests.encodings.hf_config import rope_sweep as sweep
from tests.encodings.hf_config.rope_keys import HEAD_DIM, VALUES

MAX_POSITION_EMBEDDINGS = 4096

SPEC_LEVEL = frozenset({"rope_theta"})
"""Keys of transformers' dict that are top-level fields of a rope spec."""

FROM_CONFIG = frozenset({"original_max_position_embeddings"})
"""Keys transformers fills from the config's `max_position_embeddings` when the dict omits them;
a spec has no such attribute, so it requires them."""

CONFIG_ATTRIBUTES: dict[str, dict[str, int]] = {
    "dynamic": {"max_position_embeddings": MAX_POSITION_EMBEDDINGS},
    "longrope": {"max_position_embeddings": MAX_POSITION_EMBEDDINGS},
}
"""Config attributes a variant's transformers function reads beside its dict
(`config.max_position_embeddings`), which a spec carries in `rope_scaling`."""

CASES = rope_keys.cases()


def _config(rope_type: str, removed: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {"rope_type": rope_type}
    params.update({k: VALUES[k] for k in rope_keys.keys(rope_type) if k != removed})
    return {
        "model_type": "llama",
        "hidden_size": 4 * HEAD_DIM,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rope_parameters": params,
    }


def _spec(rope_type: str, removed: str | None) -> dict[str, Any]:
    scaling: dict[str, Any] = {"rope_type": rope_type, **CONFIG_ATTRIBUTES.get(rope_type, {})}
    top: dict[str, Any] = {}
    for key in rope_keys.keys(rope_type):
        if key != removed:
            (top if key in SPEC_LEVEL else scaling)[key] = VALUES[key]
    return {
        "kind": "rope",
        "head_dim": HEAD_DIM,
        "max_positions": sweep.SEQ,
        "width": "half",
        "packing": "separate",
        "dtype": "float32",
        **top,
        "rope_scaling": scaling,
    }


@pytest.fixture(scope="module")
def pclient(server: ServerHandle) -> Any:
    with Client(server.url, retries=0) as client:
        yield client


def test_llama3_names_each_missing_key(pclient: Client) -> None:
    """The issue's case: llama3 with factor and original length but no band factors was served
    with 1 and 4; transformers raises `KeyError: Missing required keys`."""
    spec = _spec("llama3", None)
    for key in ("low_freq_factor", "high_freq_factor"):
        del spec["rope_scaling"][key]
    with pytest.raises(InvalidSpecError) as err:
        pclient.table(spec)
    fields = sorted(p.field for p in err.value.problems)
    assert fields == ["rope_scaling.high_freq_factor", "rope_scaling.low_freq_factor"], fields


@pytest.mark.parametrize(("rope_type", "removed"), CASES, ids=[f"{t}-{k}" for t, k in CASES])
def test_removed_key_is_answered_as_transformers_answers(
    pclient: Client, rope_type: str, removed: str | None
) -> None:
    data = _config(rope_type, removed)
    try:
        sweep.load_config(data)
        theirs: sweep.Reference | Exception = sweep.module_reference(data)
    except Exception as err:
        theirs = err
    spec = _spec(rope_type, removed)
    try:
        tables = pclient.table(spec)
    except InvalidSpecError as err:
        fields = [p.field for p in err.problems]
        refused_by_them = isinstance(theirs, KeyError)
        assert refused_by_them or removed in FROM_CONFIG, (
            f"transformers serves without {removed}; the spec language refuses: {fields}"
        )
        where = removed if removed in SPEC_LEVEL else f"rope_scaling.{removed}"
        assert where in fields, fields
        return
    assert not isinstance(theirs, Exception), (
        f"transformers: {type(theirs).__name__}: {theirs}; the spec language serves"
    )
    assert removed not in FROM_CONFIG, f"served without {removed}: a length was invented"
    # the reference bytes (a GPU server's own may differ by an ulp from transformers on the CPU)
    tables = pclient.table_by_key(tables.key, device="cpu")
    canonical = sweep.Table(
        name="spec",
        layer_types=None,
        rotary_dim=HEAD_DIM,
        head_dim=HEAD_DIM,
        pairing="half_split",
        interleaved_field=False,
        notes={},
        sign=1.0,
        cos=torch.as_tensor(tables["cos"], dtype=torch.float32),
        sin=torch.as_tensor(tables["sin"], dtype=torch.float32),
    )
    verdict = sweep.judge(theirs, [canonical])
    assert verdict.outcome == "exact", verdict.line()
