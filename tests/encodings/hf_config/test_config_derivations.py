"""What a config class's `__post_init__` derives from a config.json, read as transformers does,
through the server (an outside probe of posenc found each case accepted with a wrong table or
refused though valid):

- `global_head_dim` (Gemma 4 and the classes copied from it): without a `per_layer_config` key,
  `__post_init__` builds `per_layer_config = {full layers: {"head_dim": global_head_dim}}`
  (default 512) and the rotary module reads `config.per_layer_config[layer_type]`. The model
  types are those the generated class data marks (`global_head_dim_layer_types`, measured from
  the installed transformers by `class_data._global_head_dim`; `test_class_data` holds the data
  file to it).

- `layer_types` from `sliding_window_pattern`: a config class whose `__post_init__` derives them
  when the file gives none (Cohere 2's `kwargs.pop("sliding_window_pattern", 4)`, EXAONE 4) was
  refused where posenc needs them (which layers skip RoPE). The model types are those whose
  mapper reads NoPE layers by layer type and whose class data has a `layer_types_pattern`
  (measured by `class_data._layer_types_pattern`).

- Phi-3's `original_max_position_embeddings` (`standardize_rope_params`): filled only for a
  rope_type spelled llama3 / yarn / longrope, with a top-level value first, then the class's own
  field (Phi3Config: 4096), then the rope parameters' value (posenc put the class field after
  the rope parameters' value: a wrong attention factor). Phi-3's legacy "su" is renamed to
  longrope after it: transformers loads it only when `rope_scaling` carries its own value
  (without one it raises KeyError, while posenc served a table); the rotary module standardizes
  again as longrope, so the table takes the same order.

- YaRN `truncate` in a nested rope parameter dict (per layer type, or DeepSeek-V4's per rope
  key): `_compute_yarn_parameters` reads `config.rope_parameters.get("truncate", True)`, the top
  level only, so the model always truncates; posenc honoured `truncate: false` (max |d cos| 0.32
  on Gemma 3). The model types are those whose class default rope parameters are nested; the
  oracle shows the key unread (the model's tables with it equal those without it), and posenc
  must refuse it naming the key.

Each served table is judged bit for bit against the model's own rotary module
(`rope_sweep.module_reference`).
"""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest
import torch

from posenc.encodings.hf_config import MAPPERS
from posenc.encodings.hf_config.classes import config_class, known_model_types
from posenc.encodings.hf_config.rope import RopeModel
from tests.conftest import ServerHandle
from tests.encodings.hf_config import released_sweep as released
from tests.encodings.hf_config import rope_sweep as sweep
from tests.encodings.hf_config import support
from tests.encodings.hf_config.support import load


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


def _pattern_types() -> list[str]:
    found = []
    for model_type, mapper in sorted(MAPPERS.items()):
        facts = config_class(model_type)
        if (
            isinstance(mapper, RopeModel)
            and type(mapper).nope_layers is RopeModel.nope_layers
            and mapper.nope in ("full_attention", "full_attention_when_windowed", "windowed_only")
            and facts is not None
            and facts.defaults.get("layer_types_pattern")
        ):
            found.append(model_type)
    return found


PATTERN = _pattern_types()


def _without_layer_types(model_type: str) -> dict[str, Any]:
    """The sweep's tiny class-default config of `model_type` (4 layers), less `layer_types`."""
    data = sweep.case_config(model_type, "default", "v5")
    data.pop("layer_types", None)
    return data


def _exact(server: ServerHandle, client: httpx.Client, data: dict[str, Any]) -> None:
    ref = sweep.module_reference(data)
    released.assert_exact(client, data, ref, server.device, may_refuse=False)


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


def test_the_class_data_finds_the_pattern_classes() -> None:
    assert {"cohere2", "exaone4"} <= set(PATTERN), PATTERN


@pytest.mark.parametrize("pattern", [None, 2, 3, 4])
@pytest.mark.parametrize("model_type", PATTERN)
def test_layer_types_derived_from_sliding_window_pattern(
    server: ServerHandle, client: httpx.Client, model_type: str, pattern: int | None
) -> None:
    """No `layer_types`: transformers derives them (from the file's `sliding_window_pattern` or
    the class default); the whole tiny model is the reference, so which layers skip RoPE is
    judged too."""
    data = _without_layer_types(model_type)
    if pattern is not None:
        data["sliding_window_pattern"] = pattern
    ref = sweep.reference(data)
    released.assert_exact(client, data, ref, server.device, may_refuse=False)


@pytest.mark.parametrize("pattern", [0, "LLLG"])
@pytest.mark.parametrize("model_type", ["cohere2"])
def test_a_sliding_window_pattern_transformers_cannot_read_is_refused(
    client: httpx.Client, model_type: str, pattern: Any
) -> None:
    data = {**_without_layer_types(model_type), "sliding_window_pattern": pattern}
    with pytest.raises((ZeroDivisionError, TypeError)):
        sweep.load_config(data)
    response = client.post("/v1/resolve", json={"hf_config": data, "max_positions": 16})
    assert response.status_code == 422, response.text
    fields = [p["field"] for p in response.json()["detail"]]
    assert fields == ["sliding_window_pattern"], response.text


PHI3 = "microsoft__Phi-3.5-mini-instruct.json"

PHI3_CASES: dict[str, tuple[int | None, str, int | None]] = {
    # (top-level original_max_position_embeddings, rope_scaling type, its own value)
    "su, own 8192, top 2048": (2048, "su", 8192),
    "su, own 8192, no top": (None, "su", 8192),
    "longrope, own 8192, no top (class field 4096)": (None, "longrope", 8192),
    "longrope, own 8192, top 2048": (2048, "longrope", 8192),
    "yarn, own 8192, no top": (None, "yarn", 8192),
}


def _phi3(top: int | None, rope_type: str, own: int | None) -> dict[str, Any]:
    data = load(PHI3)
    data.pop("original_max_position_embeddings")
    if top is not None:
        data["original_max_position_embeddings"] = top
    data["rope_scaling"] = {**data["rope_scaling"], "type": rope_type}
    if own is not None:
        data["rope_scaling"]["original_max_position_embeddings"] = own
    return data


@pytest.mark.parametrize("case", PHI3_CASES)
def test_phi3_original_length_as_standardize_rope_params_reads_it(
    server: ServerHandle, client: httpx.Client, case: str
) -> None:
    _exact(server, client, _phi3(*PHI3_CASES[case]))


def test_phi3_su_without_its_own_original_length_is_refused(client: httpx.Client) -> None:
    data = _phi3(4096, "su", None)
    with pytest.raises(KeyError, match="original_max_position_embeddings"):
        sweep.load_config(copy.deepcopy(data))
    response = client.post("/v1/resolve", json={"hf_config": data, "max_positions": 16})
    assert response.status_code == 422, response.text
    (problem,) = response.json()["detail"]
    assert problem["field"] == "rope_scaling.original_max_position_embeddings", problem
    assert "su" in problem["message"], problem


NESTED = support.nested_types()


def _same_rotation(a: sweep.Reference, b: sweep.Reference) -> bool:
    if a.layers.keys() != b.layers.keys():
        return False
    for index, layer in a.layers.items():
        other = b.layers[index]
        for name in ("cos", "sin", "freqs"):
            x, y = getattr(layer, name), getattr(other, name)
            if (x is None) != (y is None) or (x is not None and not torch.equal(x, y)):
                return False
    return True


def test_the_class_data_finds_the_nested_classes() -> None:
    assert {"gemma3_text", "modernbert", "deepseek_v4", "olmo3"} <= set(NESTED), NESTED


@pytest.mark.parametrize("model_type", NESTED)
def test_yarn_truncate_in_a_nested_dict_is_refused(client: httpx.Client, model_type: str) -> None:
    try:
        data = sweep.case_config(model_type, "default", "v5")
    except sweep.UnbuildableError as err:
        pytest.skip(str(err))
    part = data["text_config"] if isinstance(data.get("text_config"), dict) else data
    params = part.get("rope_parameters")
    if not isinstance(params, dict) or not any(isinstance(v, dict) for v in params.values()):
        pytest.skip(f"the sweep's config has no nested rope parameters: {params}")
    layer_type = next(k for k, v in params.items() if isinstance(v, dict))
    yarn = {
        **params[layer_type],
        "rope_type": "yarn",
        "factor": 8.0,
        "rope_theta": 1_000_000.0,
        "original_max_position_embeddings": 4096,
    }
    params[layer_type] = yarn
    without = copy.deepcopy(data)
    params[layer_type] = {**yarn, "truncate": False}
    # the oracle: transformers does not read it (the same rotation with and without it)
    try:
        read = sweep.module_reference(data)
        unread = sweep.module_reference(without)
    except sweep.UnbuildableError as err:
        pytest.skip(f"transformers cannot build the rotary module: {err}")
    assert _same_rotation(read, unread)
    response = client.post("/v1/resolve", json={"hf_config": data, "max_positions": 16})
    assert response.status_code == 422, response.text
    fields = [p["field"] for p in response.json()["detail"]]
    prefix = "text_config." if part is not data else ""
    assert f"{prefix}rope_parameters.{layer_type}.truncate" in fields, response.text
