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
    """A config mapping with the model's class defaults and aliases, and the key prefix used in
    errors.

    `defaults` are the transformers config class defaults of `model_type` (generated:
    `classes.py`; plus `MODEL_DEFAULTS`), used only for keys the file omits; None when the class
    is not known to carry rope parameters (`has_class_defaults` False). `aliases` is the class's
    `attribute_map` (alias -> attribute: transformers reads JetMoE's `head_dim` as
    `kv_channels`). `applied` records each class default a read filled in, by config key (what
    `notes["defaults_applied"]` lists).
    """

    def __init__(
        self,
        data: Mapping[str, Any],
        prefix: str,
        model_type: str,
        defaults: Mapping[str, Any] | None,
        aliases: Mapping[str, str] | None = None,
    ) -> None:
        self.data = data
        self.prefix = prefix
        self.model_type = model_type
        self.defaults: Mapping[str, Any] = defaults or {}
        self.has_class_defaults = defaults is not None
        self.aliases: Mapping[str, str] = aliases or {}
        self.applied: dict[str, Any] = {}

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def _spellings(self, name: str) -> tuple[str, ...]:
        """`name`, the attribute it is an alias of, and that attribute's other aliases: the keys
        under which a config.json may carry the value transformers reads as `name`."""
        target = self.aliases.get(name, name)
        others = (alias for alias, attr in self.aliases.items() if attr == target)
        return tuple(dict.fromkeys((name, target, *others)))

    def present(self, name: str) -> tuple[str, Any] | None:
        """(key, value) of `name` in the file under any of its spellings, None when absent."""
        for key in self._spellings(name):
            value = self.data.get(key)
            if value is not None:
                return key, value
        return None

    def class_default(self, name: str) -> tuple[str, Any] | None:
        """(key, value) of the class default of `name` (or of the attribute it aliases)."""
        for key in self._spellings(name):
            if key in self.defaults:
                return key, self.defaults[key]
        return None

    def _apply(self, name: str) -> tuple[str, Any] | None:
        """The class default of `name` when the file has no key for it (an explicit null is
        the file's value: transformers then derives it, as posenc's fallbacks do)."""
        if any(key in self.data for key in self._spellings(name)):
            return None
        found = self.class_default(name)
        if found is not None:
            self.applied[self.key(found[0])] = found[1]
        return found

    def has(self, name: str) -> bool:
        """The file carries `name` (under any spelling): what marks a model's family."""
        return self.present(name) is not None

    def known(self, name: str) -> bool:
        """The file or the class default gives `name` (transformers reads either)."""
        return self.get(name) is not None

    def get(self, name: str, default: Any = None) -> Any:
        found = self.present(name) or self._apply(name)
        return default if found is None else found[1]

    def number(self, name: str, *aliases: str, required: bool = True) -> Any:
        """The first present of `name` and `aliases` (and their class aliases) as int/float,
        else the class default."""
        for key in (name, *aliases):
            found = self.present(key)
            if found is not None:
                return check_number(self.key(found[0]), found[1])
        for key in (name, *aliases):
            found = self._apply(key)
            if found is not None:
                return found[1]
        if required:
            fail(self.key(name), "required key missing", None)
        return None


def head_dim(view: ConfigView) -> int:
    """head_dim as transformers reads it: MLA's qk_rope_head_dim; the file's head_dim (or the
    attribute the class aliases it to: JetMoE's kv_channels), else the class default; else
    hidden_size // num_attention_heads, times the class's `head_dim_scale` (Zamba2: 2)."""
    if view.known("qk_rope_head_dim"):
        return int(check_number(view.key("qk_rope_head_dim"), view.get("qk_rope_head_dim")))
    explicit = view.number("head_dim", required=False)
    if explicit:
        return int(explicit)
    hidden = view.number("hidden_size", "n_embd", "d_model")
    heads = view.number("num_attention_heads", "n_head", "n_heads")
    if not heads:
        fail(view.key("num_attention_heads"), "must be positive", heads)
    # Zamba2Config.__post_init__: attention_head_dim = 2 * hidden_size // num_attention_heads
    # (a head_dim / attention_head_dim key of the file is set after it, and wins)
    scale = int(view.defaults.get("head_dim_scale", 1))
    return scale * int(hidden) // int(heads)


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
