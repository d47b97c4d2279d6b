"""Config keys a model's transformers code reads its own way (an outside probe's accepted-and-wrong
findings), each case derived from the installed transformers, judged through the server:

- GPT-NeoX's `rotary_pct` / `rotary_emb_base`: the config classes whose
  `convert_rope_params_to_dict` reads them setdefault both into the rope parameters; a file
  without a rope dict was served the class's default parameters (0.25 / 1.0, base 10000).
- `rope_scaling` beside `rope_parameters`: transformers reads the pair by model (the mixin's
  convert replaces `rope_parameters` by `rope_scaling`, the Gemma 3 family merges it into one
  layer type); reading `rope_parameters` alone served YaRN configs unscaled. Refused.
- Rope keys in a model posenc maps whose config class has no rope parameters (GPT-J, CodeGen
  hard-code base 10000 and no scaling): served as a scaled or rebased table before. Either
  refused or the same answer as without them (test_extra_rope_keys.py's rule, for the types
  that test leaves out because posenc maps them).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
from typing import Any

import httpx
import pytest

from posenc.encodings.hf_config import MAPPERS
from posenc.encodings.hf_config.classes import known_model_types
from posenc.encodings.hf_config.models import MODEL_DEFAULTS
from tests.conftest import ServerHandle
from tests.encodings.hf_config import released_sweep as released
from tests.encodings.hf_config import rope_sweep as sweep
from tests.encodings.hf_config.test_extra_rope_keys import assert_hand_added_keys_unread


def _convert_reads(model_type: str, key: str) -> bool:
    """Whether the config class's own `convert_rope_params_to_dict` reads `key`."""
    try:
        cls = sweep._config_class(model_type)
    except Exception:
        return False
    convert = getattr(cls, "convert_rope_params_to_dict", None)
    try:
        return convert is not None and f'"{key}"' in inspect.getsource(convert)
    except (OSError, TypeError):
        return False


NEOX = [t for t in known_model_types() if _convert_reads(t, "rotary_pct")]


def _mapped_without_rope() -> list[str]:
    """Model types posenc maps (a family mapper or `MODEL_DEFAULTS`) whose config class declares
    no rope parameters (no `rope_parameters` / `rope_theta` field), as the installed
    transformers declares it."""
    found = []
    for model_type in known_model_types():
        if model_type not in MAPPERS and model_type not in MODEL_DEFAULTS:
            continue
        try:
            cls = sweep._config_class(model_type)
        except Exception:
            continue
        if not dataclasses.is_dataclass(cls):
            continue
        names = {f.name for f in dataclasses.fields(cls)}
        if "rope_parameters" not in names and "rope_theta" not in names:
            found.append(model_type)
    return found


MAPPED_WITHOUT_ROPE = _mapped_without_rope()


def test_the_cases_are_found() -> None:
    assert {"gpt_neox", "gpt_neox_japanese"} <= set(NEOX), NEOX
    assert {"gptj", "codegen"} <= set(MAPPED_WITHOUT_ROPE), MAPPED_WITHOUT_ROPE


NEOX_CASES = [
    (model_type, pct, base, scaling)
    for model_type in NEOX
    for pct, base, scaling in itertools.product(
        (None, 0.25, 0.5, 1.0), (None, 20000.0), (None, {"type": "linear", "factor": 2.0})
    )
]


@pytest.mark.parametrize(
    ("model_type", "pct", "base", "scaling"),
    NEOX_CASES,
    ids=[f"{t}-pct{p}-base{b}-{'linear' if s else 'none'}" for t, p, b, s in NEOX_CASES],
)
def test_rotary_pct_and_base_are_read_as_transformers_reads_them(
    server: ServerHandle,
    client: httpx.Client,
    model_type: str,
    pct: float | None,
    base: float | None,
    scaling: dict[str, Any] | None,
) -> None:
    """A v4 GPT-NeoX file (no rope dict, or a v4 `rope_scaling`) with or without `rotary_pct`
    and `rotary_emb_base`: exact against the model's own rotary module and apply function."""
    data: dict[str, Any] = {
        "model_type": model_type,
        "hidden_size": 256,
        "num_attention_heads": 2,
        "max_position_embeddings": 64,
        "rope_scaling": copy.deepcopy(scaling),
    }
    if pct is not None:
        data["rotary_pct"] = pct
    if base is not None:
        data["rotary_emb_base"] = base
    ref = sweep.module_reference(copy.deepcopy(data))
    released.assert_exact(client, data, ref, server.device, may_refuse=False)


def _flat_or_nested(model_type: str) -> dict[str, Any]:
    try:
        data = released.default_config(model_type)
    except sweep.UnbuildableError as err:
        pytest.skip(str(err))
    return data


@pytest.mark.parametrize("model_type", sweep.rotary_model_types())
def test_rope_scaling_beside_rope_parameters_is_refused(
    client: httpx.Client, model_type: str
) -> None:
    """The class-default config (v5 `rope_parameters`) plus a v4 `rope_scaling`: where
    transformers' reading of the rope parameters changes with it, posenc refuses at
    `rope_scaling` (reading `rope_parameters` alone served them unscaled)."""
    data = _flat_or_nested(model_type)
    part = data["text_config"] if isinstance(data.get("text_config"), dict) else data
    if not part.get("rope_parameters"):
        pytest.skip("no rope_parameters in the default config")
    both = copy.deepcopy(data)
    both_part = both["text_config"] if both is not data and "text_config" in both else both
    both_part["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}

    def reading(config: dict[str, Any]) -> Any:
        try:
            with sweep._quiet():
                return sweep._text_config(sweep.load_config(copy.deepcopy(config))).rope_parameters
        except Exception as err:
            return f"{type(err).__name__}"

    if reading(both) == reading(data):
        pytest.skip("transformers reads the same rope parameters with rope_scaling beside them")

    def resolve(config: dict[str, Any]) -> httpx.Response:
        return client.post("/v1/resolve", json={"hf_config": config, "max_positions": 16})

    answer, without = resolve(both), resolve(data)
    assert answer.status_code < 500, answer.text[:300]
    if answer.status_code != 200:
        return  # refused (a composite whose text part is refused may fail on what remains)
    body = answer.json()
    if any(str(u.get("field", "")).endswith("rope_scaling") for u in body.get("unserved", [])):
        return  # the part is listed unserved at rope_scaling, its other parts served
    # else only a composite served part by part (BLT's patcher/encoder/decoder/global configs):
    # each part reads its own rope parameters, which the top-level pair leaves as they were
    assert without.status_code == 200, without.text[:300]
    assert body["specs"] == without.json()["specs"]
    loaded = sweep.load_config(copy.deepcopy(both))
    plain = sweep.load_config(copy.deepcopy(data))
    parts = {
        part
        for spec in body["specs"]
        if ":" in spec["name"]
        for part in spec["name"].split(":", 1)[1].split(".")[0].split("+")
    }
    assert parts, body["specs"]
    for part in parts:
        assert getattr(loaded, part).rope_parameters == getattr(plain, part).rope_parameters


@pytest.mark.parametrize("model_type", MAPPED_WITHOUT_ROPE)
def test_a_mapped_class_without_rope_parameters_refuses_hand_added_rope_keys(
    client: httpx.Client, model_type: str
) -> None:
    """test_extra_rope_keys.py's rule for the model types posenc maps."""
    assert_hand_added_keys_unread(client, model_type)
