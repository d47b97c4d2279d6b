"""A config.json as the mappers read it: `ConfigView` (values with the model's class defaults and
the key prefix errors name) and `Entry` (a spec before validation, what every mapper returns)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from posenc.encodings.config_values import check_number, fail
from posenc.encodings.errors import FieldProblem


@dataclass
class Entry:
    """A spec before validation: family, role (layer type or encoder/decoder), wire data, notes;
    `weights` names the checkpoint tensor a `learned` entry needs as `table_key` or `table`;
    `problem` is why the table cannot be built, raised only when the table is asked for;
    `config_keys` maps a spec field to the config key it came from, so that a spec validation
    error names the key of the file (`rope_scaling` -> `rope_parameters.full_attention`);
    `profiles` holds the fields a profile's consumer reads differently for this model
    (TensorRT-LLM's MLA kernel: `{"trtllm": {"width": "full"}}`), applied under that profile
    unless the request sets them."""

    family: str
    role: str | None
    data: dict[str, Any]
    notes: dict[str, Any]
    weights: str | None = None
    problem: FieldProblem | None = None
    config_keys: dict[str, str] | None = None
    profiles: dict[str, dict[str, Any]] | None = None


class ConfigView:
    """A config mapping with the model's class defaults and the key prefix used in errors.

    `defaults` are the transformers config class defaults of `model_type` (`MODEL_DEFAULTS`), used
    only for keys the file omits; None when the class is not listed (`has_class_defaults` False).
    """

    def __init__(
        self,
        data: Mapping[str, Any],
        prefix: str,
        model_type: str,
        defaults: Mapping[str, Any] | None,
    ) -> None:
        self.data = data
        self.prefix = prefix
        self.model_type = model_type
        self.defaults: Mapping[str, Any] = defaults or {}
        self.has_class_defaults = defaults is not None

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def get(self, name: str, default: Any = None) -> Any:
        value = self.data.get(name)
        if value is None:
            value = self.defaults.get(name, default)
        return value

    def number(self, name: str, *aliases: str, required: bool = True) -> Any:
        """The first present of `name` and `aliases` as int/float, else the class default."""
        for key in (name, *aliases):
            value = self.data.get(key)
            if value is not None:
                return check_number(self.key(key), value)
        for key in (name, *aliases):
            if key in self.defaults:
                return self.defaults[key]
        if required:
            fail(self.key(name), "required key missing", None)
        return None


def head_dim(view: ConfigView) -> int:
    """head_dim: explicit, else hidden_size // num_attention_heads (and the models' aliases)."""
    if view.has("qk_rope_head_dim"):
        return int(check_number(view.key("qk_rope_head_dim"), view.get("qk_rope_head_dim")))
    explicit = view.number("head_dim", required=False)
    if explicit:
        return int(explicit)
    hidden = view.number("hidden_size", "n_embd", "d_model")
    heads = view.number("num_attention_heads", "n_head", "n_heads")
    if not heads:
        fail(view.key("num_attention_heads"), "must be positive", heads)
    return int(hidden) // int(heads)


def max_positions(view: ConfigView) -> int | None:
    """max_position_embeddings, or the model's alias for it; None when the config has none."""
    value = view.number(
        "max_position_embeddings",
        "n_positions",
        "max_seq_len",
        "model_max_length",
        "seq_length",
        required=False,
    )
    return None if value is None else int(value)
