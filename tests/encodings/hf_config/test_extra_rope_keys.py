"""A config with rope keys its model does not read is never served a wrong table (issue 30:
accepted-and-wrong checks), through the server.

Three ways a hand-written config.json carries rope keys transformers reads otherwise, each derived
from the installed transformers:

- a model type whose config class declares no rope parameters (`classes.ConfigClass.rotary`
  False) and that posenc reads with no family mapper: GLM-Image's and HunYuan-VL's vision towers
  (learned positions interpolated over the patch grid), RoFormer, CLVP, wav2vec2-BERT (a fixed
  rotary base), ... Their model never reads `rope_parameters` / `rope_theta` / `rope_scaling`;
  before, generic RoPE was served from the hand-added key (179 types).
- a flat `rope_parameters` in a class that keeps them per layer type (Gemma 3 / 4, ModernBERT,
  MiMo-V2-Flash, LFM3, ...): the rotary module reads `rope_parameters[layer_type]`.
- rope parameters without `partial_rotary_factor` in a class whose `__post_init__` supplies one
  (`kwargs.setdefault("partial_rotary_factor", 0.5)`: GLM, Nemotron, Persimmon, Qwen3-Next ...):
  transformers rotates that fraction, posenc rotated the full head before.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import httpx
import pytest

from posenc.encodings.hf_config import MAPPERS
from posenc.encodings.hf_config.classes import config_class, known_model_types
from posenc.encodings.hf_config.models import MODEL_DEFAULTS
from tests.conftest import ServerHandle
from tests.encodings.hf_config import released_sweep as released
from tests.encodings.hf_config import rope_sweep as sweep
from tests.encodings.hf_config import support

EXTRA_KEYS: dict[str, dict[str, Any]] = {
    "rope_parameters": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    "rope_theta": {"rope_theta": 10000.0},
    "rope_scaling": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_theta": 1e4},
}
FLAT = {"rope_type": "default", "rope_theta": 10000.0}


def _class(model_type: str) -> Any:
    return sweep._config_class(model_type)


def _no_rope_types() -> list[str]:
    """Model types read by the generic reader whose config class has no rope field, as the
    installed transformers declares it (the dataclass fields), not as posenc's data says."""
    found = []
    for model_type in known_model_types():
        if model_type in MAPPERS or model_type in MODEL_DEFAULTS:
            continue
        try:
            cls = _class(model_type)
        except Exception:
            continue
        names = (
            {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
        )
        if "rope_parameters" not in names and "rope_theta" not in names:
            found.append(model_type)
    return found


def _partial_types() -> list[str]:
    """Rotary model types with a `__post_init__` partial_rotary_factor (the generated data)."""
    return [
        t
        for t in known_model_types()
        if (cls := config_class(t)) is not None and "partial_rotary_factor" in cls.defaults
    ]


NO_ROPE = _no_rope_types()
NESTED = support.nested_types()
PARTIAL = _partial_types()


def test_the_sweeps_find_the_cases() -> None:
    assert {"glm_image_vision", "hunyuan_vl_vision", "roformer"} <= set(NO_ROPE), NO_ROPE
    assert len(NO_ROPE) > 100, len(NO_ROPE)
    assert {"gemma3_text", "modernbert", "mimo_v2_flash"} <= set(NESTED), NESTED
    assert {"glm", "nemotron", "qwen3_next", "persimmon"} <= set(PARTIAL), PARTIAL


def assert_hand_added_keys_unread(client: httpx.Client, model_type: str) -> None:
    """The class-default config with each of `EXTRA_KEYS` added: the model does not read them,
    so the answer is the answer without them (a composite's text model keeps its tables), or a
    refusal."""
    try:
        base = released.default_config(model_type)
    except sweep.UnbuildableError:
        base = {"model_type": model_type}

    def answer(config: dict[str, Any]) -> tuple[int, Any]:
        response = client.post("/v1/resolve", json={"hf_config": config, "max_positions": 16})
        assert response.status_code < 500, response.text
        body = response.json()
        return response.status_code, body.get("specs") if response.status_code == 200 else None

    without = answer(base)
    for key, extra in EXTRA_KEYS.items():
        status, specs = answer({**copy.deepcopy(base), **extra})
        if status == 200:
            assert (status, specs) == without, f"{key}: served {specs} (without it: {without})"


@pytest.mark.parametrize("model_type", NO_ROPE)
def test_a_class_without_rope_parameters_refuses_hand_added_rope_keys(
    client: httpx.Client, model_type: str
) -> None:
    assert_hand_added_keys_unread(client, model_type)


@pytest.mark.parametrize("model_type", NESTED)
def test_flat_rope_parameters_of_a_per_layer_type_class_are_refused(
    client: httpx.Client, model_type: str
) -> None:
    try:
        data = released.default_config(model_type)
    except sweep.UnbuildableError as err:
        pytest.skip(str(err))
    part = data["text_config"] if isinstance(data.get("text_config"), dict) else data
    part["rope_parameters"] = dict(FLAT)
    # the oracle: transformers does not read the flat dict as one table for every layer: its
    # reading nests the parameters by layer type (the Gemma 3 family, from its class defaults)
    # or its rotary module cannot be built from them (KeyError, the class's validation)
    try:
        with sweep._quiet():
            params = dict(sweep._text_config(sweep.load_config(data)).rope_parameters or {})
    except Exception:
        params = {}
    if not any(isinstance(v, dict) for v in params.values()):
        with pytest.raises(sweep.UnbuildableError):
            sweep.module_reference(data)
    response = client.post("/v1/resolve", json={"hf_config": data, "max_positions": 16})
    specs = response.json().get("specs", []) if response.status_code == 200 else []
    assert not [s for s in specs if s["kind"] == "rope"], response.text
    if response.status_code != 200:
        fields = [p["field"] for p in response.json()["detail"]]
        assert any(f.endswith("rope_parameters") for f in fields) or any(
            f.endswith("model_type") for f in fields
        ), fields


@pytest.mark.parametrize("model_type", PARTIAL)
def test_rope_parameters_without_a_factor_take_the_class_default(
    server: ServerHandle, client: httpx.Client, model_type: str
) -> None:
    """The default config with its rope parameters written without `partial_rotary_factor`
    (top level and nested): exact against the model's own rotary module and apply function
    (transformers setdefaults the class's factor), or refused naming a key."""
    try:
        data = released.default_config(model_type)
    except sweep.UnbuildableError as err:
        pytest.skip(str(err))
    part = data["text_config"] if isinstance(data.get("text_config"), dict) else data
    params = part.get("rope_parameters")
    if not isinstance(params, dict) or "rope_type" not in params:
        pytest.skip("no flat rope parameters in the default config")
    part.pop("partial_rotary_factor", None)
    part["rope_parameters"] = {k: v for k, v in params.items() if k != "partial_rotary_factor"}
    try:
        ref = sweep.module_reference(data)
    except sweep.UnbuildableError as err:
        ref = None
        reason = str(err)
    answer = released.served(client, data, data, server.device)
    if isinstance(answer, sweep.Verdict):
        assert answer.outcome == "rejected", answer.line()
        return
    if ref is None:
        pytest.skip(f"served, and transformers cannot build the module to judge it: {reason}")
    verdict = sweep.judge(ref, answer)
    assert verdict.outcome == "exact", verdict.line()
