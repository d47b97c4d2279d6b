"""transformers' config classes as data: each model_type's `attribute_map` (the aliases its
`PreTrainedConfig.__getattribute__` resolves: JetMoE's `head_dim` is `kv_channels`, Zamba2's
`attention_head_dim`) and the class defaults of the keys `/v1/resolve` reads, from
`transformers_classes.json`.

The file is generated from the installed transformers by `make models-data`
(`tests/encodings/hf_config/class_data.py`, which documents each entry) and compared with it by
`tests/encodings/hf_config/test_class_data.py`; the server reads it without importing
transformers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any


@dataclass(frozen=True)
class ConfigClass:
    """One config class: its name, `attribute_map` (alias -> attribute), the defaults of the
    keys posenc reads (`rope_theta` only for classes with rope parameters) and, for a composite
    class that lays them under the file's `text_config` dict, its text sub-config's init
    kwargs (`text_config_defaults`)."""

    name: str
    attribute_map: Mapping[str, str]
    defaults: Mapping[str, Any]
    text_config_defaults: Mapping[str, Any]

    @property
    def rotary(self) -> bool:
        """The class carries rope parameters (a `rope_parameters` or `rope_theta` field)."""
        return "rope_theta" in self.defaults or "rope_theta_by_layer_type" in self.defaults


@cache
def _data() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("transformers_classes.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def transformers_version() -> str:
    """The transformers release the data file was generated from."""
    return str(_data()["transformers"])


def known_model_types() -> list[str]:
    """Every model_type of the transformers release the data file was generated from."""
    return sorted(_data()["models"])


@cache
def config_class(model_type: str) -> ConfigClass | None:
    """The config class facts of `model_type`, None for a model_type transformers does not know."""
    facts = _data()["models"].get(model_type)
    if facts is None:
        return None
    return ConfigClass(
        name=str(facts["class"]),
        attribute_map=dict(facts.get("attribute_map", {})),
        defaults=dict(facts.get("defaults", {})),
        text_config_defaults=dict(facts.get("text_config_defaults", {})),
    )
