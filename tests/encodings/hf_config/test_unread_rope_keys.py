"""Rope keys a model's transformers code does not read are refused, never applied (the outside
probe's accepted-and-wrong cases), through the server, every case derived from the installed
transformers:

- `partial_rotary_factor` with the default RoPE: Llama, Mistral, Qwen 2/3, Gemma, OLMo 2, ...
  build their default table in their own `compute_default_rope_parameters` with `dim =
  head_dim` and never read the factor (transformers rotates the whole head), while Phi-3, GLM,
  StableLM, Persimmon, ... read it. The oracle is the model's rotary module at factor 0.5 and at
  1.0: equal tables mean the factor goes unread, and posenc must refuse it naming the key;
  different ones mean it is read, and posenc's table must equal the model's (or be refused).
- a top-level `rope_theta` / `rope_scaling` the config class does not read: a no-op
  `convert_rope_params_to_dict` (Laguna, Mellum, ZAYA, DiffusionGemma: the class's nested
  defaults apply; Mellum keeps a v4 `rope_scaling` as a flat dict its rotary module cannot
  read), or a default `rope_parameters` that already holds a base (Apertus: 12e6 whatever the
  top level says). The oracle is transformers' own reading of the file (`from_dict`).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import httpx
import pytest
import torch

from posenc.encodings.hf_config.classes import known_model_types
from tests.conftest import ServerHandle
from tests.encodings.hf_config import released_sweep as released
from tests.encodings.hf_config import rope_sweep as sweep

BUILD_FAILED = re.compile(r"rotary module: \w+\(config\): ")
"""The sweep's error when transformers' rotary module raises for the config (its others say the
sweep cannot pick or judge the module: multimodal RoPE, several apply functions)."""

PROBE_THETA = 1234567.0
"""A base no config class defaults to: found in transformers' reading only if it read it."""


def _rotary_types() -> list[str]:
    """Model types whose transformers config class declares rope parameters (dataclass
    fields), as the installed transformers says."""
    found = []
    for model_type in known_model_types():
        try:
            cls = sweep._config_class(model_type)
        except Exception:
            continue
        names = (
            {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
        )
        if "rope_parameters" in names or "rope_theta" in names:
            found.append(model_type)
    return found


ROTARY = _rotary_types()


def _part(data: dict[str, Any]) -> dict[str, Any]:
    text = data.get("text_config")
    return text if isinstance(text, dict) else data


def _default_flat(model_type: str) -> dict[str, Any]:
    """The class's default config.json whose text part has flat rope parameters of the default
    type; skipped otherwise (a composite served part by part is its parts' model types')."""
    if model_type in sweep._rotary_parts():
        pytest.skip("a composite of rotary stacks: each part is its own model type")
    try:
        data = released.default_config(model_type)
    except sweep.UnbuildableError as err:
        pytest.skip(str(err))
    params = _part(data).get("rope_parameters")
    if not isinstance(params, dict) or params.get("rope_type") != "default":
        pytest.skip("no flat default-type rope parameters in the default config")
    if params.get("partial_rotary_factor") not in (None, 1.0):
        pytest.skip("the class default already rotates a fraction")
    return data


def _tensors(ref: sweep.Reference) -> list[torch.Tensor | None]:
    return [
        t
        for _, cap in sorted(ref.layers.items())
        for t in (cap.cos, cap.sin, cap.freqs, cap.q_out, cap.k_out)
    ]


def _same(a: sweep.Reference, b: sweep.Reference) -> bool:
    """The model rotated alike in both (same tables, same rotated q/k)."""
    x, y = _tensors(a), _tensors(b)
    return len(x) == len(y) and all(
        (s is None and t is None)
        or (s is not None and t is not None and s.shape == t.shape and torch.equal(s, t))
        for s, t in zip(x, y, strict=True)
    )


def _refused_at(client: httpx.Client, data: Mapping[str, Any], key: str) -> list[str]:
    """The fields of posenc's 422 for `data` (asserting it is one)."""
    response = client.post("/v1/resolve", json={"hf_config": dict(data), "max_positions": 16})
    assert response.status_code == 422, f"accepted: {response.text[:400]}"
    body = response.json()
    assert {"error", "error_type"} <= set(body), body
    fields = [str(p["field"]) for p in body["detail"]]
    assert any(f.endswith(key) for f in fields), fields
    return fields


def _forms(data: dict[str, Any], factor: float) -> dict[str, dict[str, Any]]:
    """The default config with `factor` in its rope parameters (v5) and at the top level beside
    rope parameters without it (what transformers setdefaults into them)."""
    nested = copy.deepcopy(data)
    params = _part(nested)["rope_parameters"]
    params["partial_rotary_factor"] = factor
    top = copy.deepcopy(data)
    _part(top)["partial_rotary_factor"] = factor
    _part(top)["rope_parameters"].pop("partial_rotary_factor", None)
    return {"rope_parameters": nested, "top_level": top}


def test_the_enumeration_finds_the_probe_cases() -> None:
    assert {"llama", "qwen3", "gemma", "phi3", "laguna", "mellum", "zaya"} <= set(ROTARY)
    assert len(ROTARY) > 200, len(ROTARY)


@pytest.mark.parametrize("form", ["rope_parameters", "top_level"])
@pytest.mark.parametrize("model_type", ROTARY)
def test_partial_factor_of_the_default_rope_is_read_or_refused(
    server: ServerHandle, client: httpx.Client, model_type: str, form: str
) -> None:
    data = _default_flat(model_type)
    asked = _forms(data, 0.5)[form]
    try:
        half = sweep.module_reference(asked)
        full = sweep.module_reference(_forms(data, 1.0)[form])
    except sweep.UnbuildableError as err:
        if not BUILD_FAILED.search(str(err)):
            pytest.skip(str(err))  # the sweep cannot judge this module: nothing observed
        raised = str(err)
    else:
        raised = None
    if raised is not None:
        # transformers cannot build the module from it: posenc serves no table either
        response = client.post("/v1/resolve", json={"hf_config": asked, "max_positions": 16})
        specs = response.json().get("specs", []) if response.status_code == 200 else []
        assert not [s for s in specs if s["kind"] == "rope"], (
            f"transformers raises ({raised}); posenc served: {response.text[:400]}"
        )
        return
    if _same(half, full):
        # the model ignores the factor: the file asks for a rotation the model does not do
        _refused_at(client, asked, "partial_rotary_factor")
        return
    released.assert_exact(client, asked, half, server.device, may_refuse=True)


def test_llama_partial_factor_is_refused_and_one_is_served(client: httpx.Client) -> None:
    """The probe's repro (hidden 1024, 8 heads, theta 1e6): 0.5 is a 422 in either form; 1.0,
    a no-op, keeps serving the whole head."""
    base = {"model_type": "llama", "hidden_size": 1024, "num_attention_heads": 8}
    nested = {**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    nested["rope_parameters"]["partial_rotary_factor"] = 0.5
    top = {**base, "rope_theta": 1e6, "partial_rotary_factor": 0.5}
    assert _refused_at(client, nested, "partial_rotary_factor") == [
        "rope_parameters.partial_rotary_factor"
    ]
    assert _refused_at(client, top, "partial_rotary_factor") == ["partial_rotary_factor"]
    response = client.post("/v1/resolve", json={"hf_config": {**top, "partial_rotary_factor": 1.0}})
    assert response.status_code == 200, response.text
    spec = response.json()["specs"][0]["spec"]
    assert (spec["head_dim"], spec["rotary_dim"], spec["rope_theta"]) == (128, 128, 1e6), spec


def _read_theta(data: Mapping[str, Any]) -> bool | None:
    """Whether transformers' reading of `data` carries PROBE_THETA into its rope parameters;
    None when it cannot read the file."""
    try:
        config = sweep._text_config(sweep.load_config(data))
    except Exception:
        return None
    if not hasattr(config, "rope_parameters"):
        return getattr(config, "rope_theta", None) == PROBE_THETA  # ESM: config.rope_theta
    params = getattr(config, "rope_parameters", None) or {}
    dicts = [v for v in params.values() if isinstance(v, dict)] or [params]
    return any(d.get("rope_theta") == PROBE_THETA for d in dicts)


@pytest.mark.parametrize("model_type", ROTARY)
def test_a_top_level_rope_theta_the_class_does_not_read_is_refused(
    server: ServerHandle, client: httpx.Client, model_type: str
) -> None:
    """The default config without rope parameters and with a top-level rope_theta (a v4
    file): where transformers' reading leaves the base out, posenc refuses it (naming the key
    or the model type); where it reads it, posenc's table is the model's or refused."""
    try:
        data = released.default_config(model_type)
    except sweep.UnbuildableError as err:
        pytest.skip(str(err))
    part = _part(data)
    for key in ("rope_parameters", "rope_scaling", "rope_theta", "rotary_emb_base"):
        part.pop(key, None)
    part["rope_theta"] = PROBE_THETA
    read = _read_theta(data)
    if read is False:
        response = client.post("/v1/resolve", json={"hf_config": data, "max_positions": 16})
        specs = response.json().get("specs", []) if response.status_code == 200 else []
        assert not [s for s in specs if s["kind"] == "rope"], (
            f"transformers leaves rope_theta unread, posenc served: {response.text[:400]}"
        )
        return
    if read is None:
        pytest.skip("transformers cannot read the file")
    try:
        ref = sweep.module_reference(data)
    except sweep.UnbuildableError as err:
        pytest.skip(str(err))
    released.assert_exact(client, data, ref, server.device, may_refuse=True)


@pytest.mark.parametrize("model_type", ROTARY)
def test_a_v4_rope_scaling_the_class_does_not_convert_is_refused(
    client: httpx.Client, model_type: str
) -> None:
    """A top-level linear `rope_scaling` (factor 8) without rope parameters: where
    transformers' reading does not convert it into rope parameters with a base (Mellum's no-op
    conversion keeps it flat without rope_theta, and its rotary module raises KeyError
    'full_attention'), posenc serves no rope table."""
    try:
        data = released.default_config(model_type)
    except sweep.UnbuildableError as err:
        pytest.skip(str(err))
    part = _part(data)
    part.pop("rope_parameters", None)
    part["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}
    try:
        config = sweep._text_config(sweep.load_config(data))
    except Exception as err:
        pytest.skip(f"transformers refuses the file: {type(err).__name__}")
    params = getattr(config, "rope_parameters", None) or {}
    dicts = [v for v in params.values() if isinstance(v, dict)] or [params]
    if any(
        d.get("rope_type") == "linear" and d.get("factor") == 8.0 and "rope_theta" in d
        for d in dicts
    ):
        pytest.skip("transformers converts it: judged by the rope sweeps")
    response = client.post("/v1/resolve", json={"hf_config": data, "max_positions": 16})
    specs = response.json().get("specs", []) if response.status_code == 200 else []
    assert not [s for s in specs if s["kind"] == "rope"], (
        f"transformers leaves rope_scaling unconverted ({params}); posenc served: "
        f"{response.text[:400]}"
    )
