"""What a config class's `__post_init__` derives from a config.json, read as transformers does,
through the server (an outside probe of posenc found each case accepted with a wrong table or
refused though valid):

- `global_head_dim` (Gemma 4 and the classes copied from it): without a `per_layer_config` key,
  `__post_init__` builds `per_layer_config = {full layers: {"head_dim": global_head_dim}}`
  (default 512) and the rotary module reads `config.per_layer_config[layer_type]`. The model
  types are those the generated class data marks (`global_head_dim_layer_types`, measured from
  the installed transformers by `class_data._global_head_dim`; `test_class_data` holds the data
  file to it).

Each served table is judged bit for bit against the model's own rotary module
(`rope_sweep.module_reference`).
"""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest

from posenc.encodings.hf_config.classes import config_class, known_model_types
from tests.conftest import ServerHandle
from tests.encodings.hf_config import released_sweep as released
from tests.encodings.hf_config import rope_sweep as sweep


def _global_head_dim_types() -> list[str]:
    found = []
    for model_type in known_model_types():
        facts = config_class(model_type)
        if facts is not None and facts.defaults.get("global_head_dim_layer_types"):
            found.append(model_type)
    return found


GLOBAL_HEAD_DIM = _global_head_dim_types()

GLOBAL_HEAD_DIM_CASES = {
    "class default": {},
    "384": {"global_head_dim": 384},
    "512": {"global_head_dim": 512},
    # transformers builds per_layer_config only when the key is absent ("per_layer_config" not in
    # kwargs): an explicit null keeps head_dim for every layer
    "null per_layer_config": {"global_head_dim": 384, "per_layer_config": None},
}


def _exact(server: ServerHandle, client: httpx.Client, data: dict[str, Any]) -> None:
    ref = sweep.module_reference(data)
    answer = released.served(client, data, data, server.device)
    assert not isinstance(answer, sweep.Verdict), answer.line()
    verdict = sweep.judge(ref, answer)
    assert verdict.outcome == "exact", verdict.line()


def test_the_class_data_finds_the_global_head_dim_classes() -> None:
    assert {
        "gemma4_text",
        "gemma4_unified_text",
        "diffusion_gemma_text",
        "embedding_gemma2_text",
    } <= set(GLOBAL_HEAD_DIM), GLOBAL_HEAD_DIM


@pytest.mark.parametrize("case", GLOBAL_HEAD_DIM_CASES)
@pytest.mark.parametrize("model_type", GLOBAL_HEAD_DIM)
def test_global_head_dim_without_per_layer_config(
    server: ServerHandle, client: httpx.Client, model_type: str, case: str
) -> None:
    data = {"model_type": model_type, "num_hidden_layers": 6, **GLOBAL_HEAD_DIM_CASES[case]}
    _exact(server, client, data)


@pytest.mark.parametrize("case", ["class default", "384"])
def test_global_head_dim_in_a_composite_text_config(
    server: ServerHandle, client: httpx.Client, case: str
) -> None:
    """The Gemma 4 Unified wrapper: the text sub-config derives it the same way."""
    text = {"model_type": "gemma4_unified_text", "num_hidden_layers": 6}
    text.update(copy.deepcopy(GLOBAL_HEAD_DIM_CASES[case]))
    _exact(server, client, {"model_type": "gemma4_unified", "text_config": text})
