"""Mapping transformers `config.json` contents to specs: every position table a model needs.

`resolve_hf_config(config)` reads a config dict (the file's JSON, no hub access, no transformers
import) and returns one `NamedSpec` per distinct table, with the facts a runtime must know beside
the table in `notes`. The rules reproduce transformers 5.x (`modeling_rope_utils.py`,
`RotaryEmbeddingConfigMixin.standardize_rope_params`, each model's config class and modeling code):

| config                                        | spec                                            |
|-----------------------------------------------|-------------------------------------------------|
| v4 `rope_scaling` {`type`/`rope_type`, ...}   | `rope`; rope_type picks the scaling variant     |
| + top-level rope_theta, partial_rotary_factor | (`type` is accepted for `rope_type`)            |
| v5 `rope_parameters` {rope_theta, ...}        | the same spec (equal content keys)              |
| v5 nested {"sliding_attention": {..}, ...}    | one `rope:<layer_type>` per distinct table      |
| Gemma 3 v4 (`rope_local_base_freq`)           | sliding: default RoPE; full: `rope_scaling`     |
| `head_dim`, else hidden_size // heads         | head_dim; rotary dim int(head_dim * prf)        |
| GPT-NeoX `rotary_pct`, `rotary_emb_base`      | partial rotary (default 0.25), base             |
| GPT-J / CodeGen `rotary_dim`                  | rotary_dim, base 10000, interleaved pairs       |
| MLA `qk_rope_head_dim`, `rope_interleave`     | head_dim = qk_rope_head_dim, interleaved pairs  |
| `original_max_position_embeddings`            | top-level wins (Phi-3), then the rope dict's,   |
| (llama3 / yarn / longrope)                    | then max_position_embeddings                    |
| longrope or yarn without factor               | factor = max_position_embeddings / original     |
| dynamic                                       | DynamicScaling(max_position_embeddings=...)     |
| HunYuan "dynamic" with `alpha`                | `ntk_alpha` (fixed, not length dependent)       |
| Phi-3 "su" / "yarn"                           | `longrope` (Phi3Config's legacy names)          |
| Gemma 4 `proportional`, per-layer head_dim    | `proportional`, head_dim of that layer type     |
| BLOOM `n_head`                                | `alibi` slopes                                  |
| Falcon `alibi: true`                          | `alibi`, slope_scale 1/sqrt(head_dim)           |
| MPT `attn_config.alibi`, `alibi_bias_max`     | `alibi`, alibi_bias_max                         |
| Baichuan 13B (hidden 5120, 40 heads)          | `alibi` (the 7B variants are RoPE)              |
| T5 `relative_attention_num_buckets`,          | `t5_bias:encoder` (bidirectional) and           |
| `relative_attention_max_distance`             | `t5_bias:decoder` (causal)                      |
| Whisper `max_source_positions`, `d_model`     | `sinusoidal:encoder` (decoder is learned)       |
| Marian `max_position_embeddings`, `d_model`   | `sinusoidal` (marian convention, both stacks)   |
| M2M100 `pad_token_id`                         | `sinusoidal` (fairseq, padding_idx, offset 2)   |
| ViT `image_size`, `patch_size`, `hidden_size` | `learned` (hf_vit; the table by `table_key`)    |
| Swin `window_size`                            | `relative_index` (swin window)                  |
| + `use_absolute_embeddings`                   | + `learned` (timm bicubic, no antialias)        |
| BEiT / data2vec-vision relative position bias | `relative_index` (beit scheme: class token)     |
| (`use_[shared_]relative_position_bias`)       |                                                 |
| + `use_absolute_position_embeddings`          | + `learned` (hf_vit; the table by `table_key`)  |
| ViTMAE `hidden_size`, `decoder_hidden_size`   | `sinusoidal_2d:encoder` / `:decoder` (mae)      |

Vision configs (transformers `modeling_vit.py`, `modeling_swin.py`, `modeling_beit.py`,
`modeling_data2vec_vision.py`, `modeling_vit_mae.py`): the patch grid is `image_size //
patch_size` per axis (ints or [h, w] pairs). A learned absolute table is checkpoint weights that no
config carries: its spec names `table_shape` and needs the uploaded table's `table_key` (or an
inline `table`) as an override; without one the mapping raises `ConfigError` naming `table_key`.
`new_grid` (learned) and `window_size` (relative_index) overrides give other resolutions.

Multimodal configs are read through their `text_config`. `max_positions` defaults to
`max_position_embeddings` (or the model's alias for it). Missing keys take the defaults of the
model's transformers config class where that class is listed in `MODEL_DEFAULTS`; anything that
cannot be mapped (learned absolute positions of text models, unknown rope types, unknown models
without position fields, missing required keys) raises `ConfigError` naming the key and its
value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel

from posenc.encodings.base import FAMILIES, SpecBase, content_key, validate_as
from posenc.encodings.errors import ConfigError, FieldProblem, SpecError
from posenc.encodings.rope.variants import longrope as longrope_variant
from posenc.encodings.rope.variants import yarn as yarn_variant

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
"""rope_type values a config may name (transformers' ROPE_INIT_FUNCTIONS plus "default")."""

ORIGINAL_LENGTH_TYPES = frozenset({"llama3", "yarn", "longrope"})
"""Types whose `original_max_position_embeddings` transformers fills in when it is missing."""

MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    # Class defaults of the transformers 5 config classes, used only for keys config.json omits.
    "llama": {"rope_theta": 10000.0, "max_position_embeddings": 2048},
    "mistral": {"rope_theta": 10000.0},
    "qwen2": {"rope_theta": 10000.0},
    "qwen3": {"rope_theta": 10000.0},
    "phi3": {"rope_theta": 10000.0, "original_max_position_embeddings": 4096},
    "gemma3_text": {
        "head_dim": 256,
        "hidden_size": 2304,
        "num_attention_heads": 8,
        "max_position_embeddings": 131072,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10000.0,
        "num_hidden_layers": 26,
        "sliding_window_pattern": 6,
    },
    "gemma4_text": {"head_dim": 256, "global_head_dim": 512, "max_position_embeddings": 131072},
    "gpt_neox": {"rotary_pct": 0.25, "rotary_emb_base": 10000.0},
    "gptj": {"rotary_dim": 64, "n_positions": 2048},
    "codegen": {"rotary_dim": 64, "n_positions": 2048},
    "deepseek_v2": {"rope_theta": 10000.0},
    "deepseek_v3": {"rope_theta": 10000.0},
    "gpt_oss": {"rope_theta": 150000.0, "head_dim": 64},
    "hunyuan_v1_dense": {"rope_theta": 10000.0},
    "hunyuan_v1_moe": {"rope_theta": 10000.0},
    "falcon": {"rope_theta": 10000.0, "alibi": False},
    "baichuan": {"rope_theta": 10000.0},
    "mpt": {"max_seq_len": 2048},
    "t5": {"relative_attention_num_buckets": 32, "relative_attention_max_distance": 128},
    "mt5": {"relative_attention_num_buckets": 32, "relative_attention_max_distance": 128},
    "umt5": {"relative_attention_num_buckets": 32, "relative_attention_max_distance": 128},
    "vit": {"image_size": 224, "patch_size": 16, "hidden_size": 768},
    "swin": {
        "image_size": 224,
        "patch_size": 4,
        "embed_dim": 96,
        "window_size": 7,
        "num_heads": [3, 6, 12, 24],
        "use_absolute_embeddings": False,
    },
    "beit": {
        "image_size": 224,
        "patch_size": 16,
        "hidden_size": 768,
        "num_attention_heads": 12,
        "use_absolute_position_embeddings": False,
        "use_relative_position_bias": False,
        "use_shared_relative_position_bias": False,
    },
    "data2vec-vision": {
        "image_size": 224,
        "patch_size": 16,
        "hidden_size": 768,
        "num_attention_heads": 12,
        "use_absolute_position_embeddings": False,
        "use_relative_position_bias": False,
        "use_shared_relative_position_bias": False,
    },
    "vit_mae": {
        "image_size": 224,
        "patch_size": 16,
        "hidden_size": 768,
        "decoder_hidden_size": 512,
    },
}

TEXT_MODEL_TYPES = {"gemma3": "gemma3_text", "gemma4": "gemma4_text"}
"""Multimodal model_type -> the model_type of its `text_config` when the latter omits it."""

INTERLEAVED_MODELS = frozenset({"gptj", "codegen"})
"""Checkpoints whose rotary pairs are (2i, 2i+1) (`rotate_every_two`)."""

MLA_INTERLEAVE_DEFAULT = {"deepseek_v2": True, "deepseek_v3": True, "minicpm3": False}
"""Pairing of multi-head latent attention models that may omit `rope_interleave`."""

NTK_ALPHA_MODELS = frozenset({"hunyuan_v1_dense", "hunyuan_v1_moe"})
"""Models whose "dynamic" rope_type with an `alpha` is fixed NTK-alpha scaling."""

T5_MODELS = frozenset({"t5", "mt5", "umt5"})

LEARNED_MODELS = frozenset(
    {
        "gpt2",
        "gpt_neo",
        "gpt_bigcode",
        "opt",
        "bert",
        "roberta",
        "xlm-roberta",
        "distilbert",
        "electra",
        "albert",
        "bart",
        "mbart",
        "biogpt",
    }
)
"""Text models with learned absolute position embeddings: checkpoint weights, not a formula
(vision models with learned tables map to `learned` specs that take the uploaded table)."""

BEIT_MODELS = frozenset({"beit", "data2vec-vision"})

ROPE_KEYS = (
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "rotary_pct",
    "rotary_emb_base",
    "rotary_dim",
    "qk_rope_head_dim",
    "partial_rotary_factor",
)
"""Keys whose presence marks a RoPE model even when its model_type is not listed anywhere."""

SCALAR_ROPE_KEYS = frozenset({"rope_type", "type", "rope_theta", "factor", "partial_rotary_factor"})

SLOPES_NOTE = "serve slopes; full bias only for runtimes without an ALiBi input"

_S = TypeVar("_S", bound=BaseModel)


@dataclass(frozen=True)
class NamedSpec:
    """One table a model needs: `name` is the family or "family:role" ("rope",
    "rope:sliding_attention", "t5_bias:decoder", "sinusoidal:encoder"), `spec` the validated spec,
    `notes` what a runtime must know beside the table (scales, switch points, pairing, ...)."""

    name: str
    spec: SpecBase
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Entry:
    """A spec before validation: family, role (layer type or encoder/decoder), wire data, notes;
    `weights` names the checkpoint tensor a `learned` entry needs as `table_key` or `table`;
    `problem` is why the table cannot be built, raised only when the table is asked for."""

    family: str
    role: str | None
    data: dict[str, Any]
    notes: dict[str, Any]
    weights: str | None = None
    problem: FieldProblem | None = None


def _fail(key: str, message: str, value: Any = None) -> NoReturn:
    raise ConfigError("cannot map config", [FieldProblem(key, message, value)])


def _scaling_model(model: type[_S], data: Mapping[str, Any], key: str) -> _S:
    """Validate rope parameters early (their notes need them), naming config keys on failure."""
    try:
        return validate_as(model, data, "rope_scaling")
    except SpecError as err:
        problems = [
            FieldProblem(f"{key}.{p.field}" if p.field != "(spec)" else key, p.message, p.value)
            for p in err.problems
        ]
        raise ConfigError("cannot map config", problems) from None


class _View:
    """A config mapping with the model's class defaults and the key prefix used in errors."""

    def __init__(self, data: Mapping[str, Any], prefix: str, model_type: str) -> None:
        self.data = data
        self.prefix = prefix
        self.model_type = model_type
        self.defaults = MODEL_DEFAULTS.get(model_type, {})

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
                return _check_number(self.key(key), value)
        for key in (name, *aliases):
            if key in self.defaults:
                return self.defaults[key]
        if required:
            _fail(self.key(name), "required key missing", None)
        return None


def _check_number(key: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(key, "must be a number", value)
    return value


def _text_view(config: Mapping[str, Any]) -> _View:
    """The language-model part of a config: `text_config` of multimodal configs, else the config."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        _fail("model_type", "required: a transformers model_type string", model_type)
    text = config.get("text_config")
    if isinstance(text, Mapping):
        text_type = text.get("model_type") or TEXT_MODEL_TYPES.get(model_type, model_type)
        return _View(text, "text_config.", str(text_type))
    return _View(config, "", model_type)


def _head_dim(view: _View) -> int:
    """head_dim: explicit, else hidden_size // num_attention_heads (and the models' aliases)."""
    if view.has("qk_rope_head_dim"):
        return int(_check_number(view.key("qk_rope_head_dim"), view.get("qk_rope_head_dim")))
    explicit = view.number("head_dim", required=False)
    if explicit:
        return int(explicit)
    hidden = view.number("hidden_size", "n_embd", "d_model")
    heads = view.number("num_attention_heads", "n_head", "n_heads")
    if not heads:
        _fail(view.key("num_attention_heads"), "must be positive", heads)
    return int(hidden) // int(heads)


def _max_positions(view: _View) -> int | None:
    value = view.number(
        "max_position_embeddings",
        "n_positions",
        "max_seq_len",
        "model_max_length",
        "seq_length",
        required=False,
    )
    return None if value is None else int(value)


# ---------------------------------------------------------------------------------------------
# RoPE


def _rope_layers(view: _View) -> tuple[str, dict[str | None, dict[str, Any] | None]]:
    """(key prefix, {layer_type or None: raw rope parameters}) from the v5 or v4 shape."""
    if view.model_type == "gemma3_text" and not view.has("rope_parameters"):
        # Gemma3TextConfig.convert_rope_params_to_dict: rope_scaling applies to full attention only;
        # sliding layers use rope_local_base_freq with the default RoPE.
        scaling = view.data.get("rope_scaling") or {}
        if not isinstance(scaling, Mapping):
            _fail(view.key("rope_scaling"), "must be an object", scaling)
        full = {"rope_type": "default", **scaling}
        full.setdefault("rope_theta", view.get("rope_theta"))
        sliding = {"rope_type": "default", "rope_theta": view.get("rope_local_base_freq")}
        return view.key("rope_scaling"), {"sliding_attention": sliding, "full_attention": full}
    if view.has("rope_parameters"):
        name, params = "rope_parameters", view.data["rope_parameters"]
    elif view.has("rope_scaling"):
        name, params = "rope_scaling", view.data["rope_scaling"]
    elif view.model_type == "gpt_oss":
        # GptOssConfig fills YaRN defaults when the config carries no rope parameters.
        name = "rope_parameters"
        params = {
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        }
    else:
        name, params = "rope_parameters", {}
    if not isinstance(params, Mapping):
        _fail(view.key(name), "must be an object", params)
    nested = bool(params) and all(
        k not in SCALAR_ROPE_KEYS and (v is None or isinstance(v, Mapping))
        for k, v in params.items()
    )
    if nested:
        return view.key(name), {str(k): (None if v is None else dict(v)) for k, v in params.items()}
    return view.key(name), {None: dict(params)}


def _declared_layer_types(view: _View) -> list[str]:
    """config.layer_types, or Gemma 3's pattern (every `sliding_window_pattern`-th layer full)."""
    declared = view.data.get("layer_types")
    if isinstance(declared, list):
        return [str(t) for t in declared]
    if view.model_type == "gemma3_text":
        pattern = int(view.number("sliding_window_pattern"))
        layers = int(view.number("num_hidden_layers"))
        return [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
        ]
    return []


def _layer_head_dim(view: _View, layer_type: str | None) -> int:
    """head_dim of one layer type: Gemma 4 full-attention layers use `global_head_dim` (or the
    `per_layer_config` override), every other layer the global head_dim."""
    per_layer = view.data.get("per_layer_config")
    layer_types = view.data.get("layer_types")
    if layer_type is not None and isinstance(per_layer, Mapping) and isinstance(layer_types, list):
        dims = {
            override.get("head_dim")
            for idx, override in per_layer.items()
            if isinstance(override, Mapping)
            and str(idx).isdigit()
            and int(idx) < len(layer_types)
            and layer_types[int(idx)] == layer_type
        }
        dims.discard(None)
        if len(dims) > 1:
            _fail(
                view.key("per_layer_config"), f"layers of {layer_type} disagree on head_dim", dims
            )
        if dims:
            return int(_check_number(view.key("per_layer_config"), dims.pop()))
    if view.model_type == "gemma4_text" and layer_type == "full_attention" and per_layer is None:
        return int(view.number("global_head_dim"))
    return _head_dim(view)


def _rope_type(view: _View, params: Mapping[str, Any], key: str) -> str:
    raw = params.get("rope_type") or params.get("type") or "default"
    if not isinstance(raw, str):
        _fail(f"{key}.rope_type", "must be a string", raw)
    rope_type = raw
    if view.model_type == "phi3" and rope_type in ("su", "yarn"):
        rope_type = "longrope"  # Phi3Config.convert_rope_params_to_dict
    if rope_type == "dynamic" and view.model_type in NTK_ALPHA_MODELS and params.get("alpha"):
        rope_type = "ntk_alpha"  # HunYuanDenseV1RotaryEmbedding: a fixed alpha is not dynamic
    if rope_type in ("mrope", "3d") or params.get("mrope_section") is not None:
        _fail(
            f"{key}.mrope_section",
            "multimodal RoPE (per-axis position ids) is not a 1-D table",
            params.get("mrope_section", raw),
        )
    if rope_type not in (*ROPE_TYPES, "ntk_alpha"):
        _fail(f"{key}.rope_type", f"unsupported rope_type; supported: {list(ROPE_TYPES)}", raw)
    return rope_type


def _original_length(
    view: _View, params: Mapping[str, Any], key: str, nested: bool, mpe: int | None
) -> int:
    """transformers' `standardize_rope_params`: a top-level value wins (Phi-3), then the value in
    the rope parameters, then the config class default, then max_position_embeddings."""
    candidates: list[tuple[str, Any]] = []
    if not nested:
        candidates.append(
            (
                view.key("original_max_position_embeddings"),
                view.data.get("original_max_position_embeddings"),
            )
        )
    candidates.append(
        (f"{key}.original_max_position_embeddings", params.get("original_max_position_embeddings"))
    )
    if not nested:
        candidates.append(("(default)", view.defaults.get("original_max_position_embeddings")))
    candidates.append((view.key("max_position_embeddings"), mpe))
    for where, value in candidates:
        if value is not None:
            return int(_check_number(where, value))
    _fail(f"{key}.original_max_position_embeddings", "required key missing", None)


def _factor(params: Mapping[str, Any], key: str, required: bool = True) -> float | None:
    value = params.get("factor")
    if value is None:
        if required:
            _fail(f"{key}.factor", "required key missing", None)
        return None
    return float(_check_number(f"{key}.factor", value))


def _scaling(
    view: _View,
    rope_type: str,
    params: Mapping[str, Any],
    key: str,
    nested: bool,
    mpe: int | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(rope_scaling wire dict, notes) for one rope parameter dict."""
    notes: dict[str, Any] = {}
    if rope_type == "default":
        return {"rope_type": "default"}, notes
    if rope_type == "linear":
        return {"rope_type": "linear", "factor": _factor(params, key)}, notes
    if rope_type == "ntk_alpha":
        alpha = float(_check_number(f"{key}.alpha", params.get("alpha")))
        notes["config_rope_type"] = "dynamic"
        notes["ntk_alpha"] = (
            "fixed NTK-alpha base (transformers HunYuan): alpha set, so not length dependent"
        )
        return {"rope_type": "ntk_alpha", "alpha": alpha}, notes
    if rope_type == "dynamic":
        if mpe is None:
            _fail(view.key("max_position_embeddings"), "dynamic NTK needs it", None)
        notes["length_dependent"] = (
            "dynamic NTK: the table depends on the sequence length (seq_len, default "
            "max_positions); transformers recomputes it from max(position_ids)+1 past "
            f"max_position_embeddings={mpe} and resets below it"
        )
        return {
            "rope_type": "dynamic",
            "factor": _factor(params, key),
            "max_position_embeddings": mpe,
        }, notes
    if rope_type == "proportional":
        data: dict[str, Any] = {"rope_type": "proportional"}
        factor = _factor(params, key, required=False)
        if factor is not None:
            data["factor"] = factor
        prf = params.get("partial_rotary_factor")
        if prf is not None:
            data["partial_rotary_factor"] = float(
                _check_number(f"{key}.partial_rotary_factor", prf)
            )
        return data, notes
    orig = _original_length(view, params, key, nested, mpe)
    if rope_type == "llama3":
        data = {
            "rope_type": "llama3",
            "factor": _factor(params, key),
            "original_max_position_embeddings": orig,
        }
        for name in ("low_freq_factor", "high_freq_factor"):
            if params.get(name) is not None:
                data[name] = float(_check_number(f"{key}.{name}", params[name]))
        return data, notes
    if rope_type == "yarn":
        factor = _factor(params, key, required=False)
        if factor is None:
            # _compute_yarn_parameters: factor = max_position_embeddings / original length.
            if mpe is None:
                _fail(view.key("max_position_embeddings"), "yarn without factor needs it", None)
            factor = mpe / orig
        data = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": orig}
        for name in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor"):
            if params.get(name):  # transformers: `get(...) or default`; 0 means unset
                data[name] = float(_check_number(f"{key}.{name}", params[name]))
        if params.get("truncate") is not None:
            data["truncate"] = bool(params["truncate"])
        scaling = _scaling_model(yarn_variant.YarnScaling, data, key)
        notes["attention_scaling"] = yarn_variant.attention_scaling(scaling)
        multiplier = yarn_variant.softmax_scale_multiplier(scaling)
        if multiplier is not None:
            notes["softmax_scale_multiplier"] = multiplier
        return data, notes
    # longrope
    for name in ("short_factor", "long_factor"):
        if not isinstance(params.get(name), list):
            _fail(f"{key}.{name}", "required: a list of rotary_dim/2 numbers", params.get(name))
    data = {
        "rope_type": "longrope",
        "short_factor": list(params["short_factor"]),
        "long_factor": list(params["long_factor"]),
        "original_max_position_embeddings": orig,
    }
    factor = _factor(params, key, required=False)
    if factor is not None:
        data["factor"] = factor
    elif mpe is not None:
        data["max_position_embeddings"] = mpe
    else:
        _fail(f"{key}.factor", "longrope needs factor or max_position_embeddings", None)
    if params.get("attention_factor") is not None:
        data["attention_factor"] = float(
            _check_number(f"{key}.attention_factor", params["attention_factor"])
        )
    scaling_lr = _scaling_model(longrope_variant.LongRopeScaling, data, key)
    notes["attention_scaling"] = longrope_variant.attention_scaling(scaling_lr)
    notes["longrope_switch_point"] = orig
    notes["longrope"] = (
        f"short_factor for seq_len <= {orig}, long_factor above (seq_len defaults to "
        "max_positions); keys cached under the short table are invalid after the switch "
        "(transformers#33129)"
    )
    return data, notes


def _interleaved(view: _View) -> bool | None:
    """Pairing of the checkpoint: True for (2i, 2i+1) pairs, None for half split (profile's
    choice, False for the transformers profile)."""
    if view.model_type in INTERLEAVED_MODELS:
        return True
    if view.has("qk_rope_head_dim"):
        if view.has("rope_interleave"):
            return bool(view.data["rope_interleave"])
        if view.model_type in MLA_INTERLEAVE_DEFAULT:
            return MLA_INTERLEAVE_DEFAULT[view.model_type] or None
        _fail(
            view.key("rope_interleave"),
            f"model_type {view.model_type!r} uses qk_rope_head_dim but its pairing is unknown",
            None,
        )
    return None


def _rope_entries(view: _View) -> list[_Entry]:
    key, layers = _rope_layers(view)
    nested = list(layers) != [None]
    declared = _declared_layer_types(view)
    if nested and declared:
        # Only layer types the model's layers use, in the order they first appear (transformers
        # builds one rotary table per type in set(config.layer_types)).
        layers = {t: layers[t] for t in dict.fromkeys(declared) if t in layers}
    mpe = _max_positions(view)
    interleaved = _interleaved(view)
    entries: list[_Entry] = []
    for layer_type, params in layers.items():
        lkey = key if layer_type is None else f"{key}.{layer_type}"
        if params is None:
            continue  # a NoPE layer type (rope parameters saved as null)
        rope_type = _rope_type(view, params, lkey)
        head_dim = _layer_head_dim(view, layer_type)
        theta = _rope_theta(view, params, lkey, layer_type)
        scaling, notes = _scaling(view, rope_type, params, lkey, nested, mpe)
        data: dict[str, Any] = {
            "kind": "rope",
            "head_dim": head_dim,
            "rope_theta": theta,
            "rope_scaling": scaling,
        }
        if mpe is not None:
            data["max_positions"] = mpe
        if rope_type != "proportional":
            data["rotary_dim"] = _rotary_dim(view, params, lkey, head_dim)
        if interleaved is not None:
            data["interleaved"] = interleaved
        notes = {
            "rope_type": rope_type,
            "pairing": "interleaved" if interleaved else "half_split",
            **notes,
        }
        if view.model_type in INTERLEAVED_MODELS:
            notes["transformers_layout"] = (
                "embed_positions = cat(sin, cos) half width, repeat_interleave'd at apply time"
            )
        if view.has("qk_rope_head_dim"):
            notes.update(_mla_notes(view, notes, bool(interleaved)))
        entries.append(_Entry("rope", layer_type, data, notes))
    if not entries:
        _fail(key, "no layer type has rope parameters", None)
    return entries


def _rope_theta(view: _View, params: Mapping[str, Any], key: str, layer_type: str | None) -> float:
    if params.get("rope_theta") is not None:
        return float(_check_number(f"{key}.rope_theta", params["rope_theta"]))
    if view.model_type in INTERLEAVED_MODELS:
        return 10000.0  # GPT-J/CodeGen `create_sinusoidal_positions` hard-codes the base
    if view.model_type == "gpt_neox":
        # GPTNeoXConfig reads rotary_emb_base, never a top-level rope_theta.
        return float(view.number("rotary_emb_base"))
    if view.model_type == "gemma4_text" and layer_type is not None:
        default = {"sliding_attention": 10000.0, "full_attention": 1_000_000.0}.get(layer_type)
        if default is not None:
            return default
    value = view.data.get("rope_theta")
    if value is None:
        value = view.defaults.get("rope_theta")
    if value is None:
        _fail(
            view.key("rope_theta"),
            f"missing, and model_type {view.model_type!r} has no known default",
            None,
        )
    return float(_check_number(view.key("rope_theta"), value))


def _rotary_dim(view: _View, params: Mapping[str, Any], key: str, head_dim: int) -> int:
    if view.model_type in INTERLEAVED_MODELS:
        return int(view.number("rotary_dim"))
    prf = params.get("partial_rotary_factor")
    where = f"{key}.partial_rotary_factor"
    if prf is None:
        where = view.key("partial_rotary_factor")
        prf = view.data.get("partial_rotary_factor")
    if prf is None and view.model_type == "gpt_neox":
        where = view.key("rotary_pct")
        prf = view.number("rotary_pct")
    if prf is None:
        return head_dim
    prf = _check_number(where, prf)
    if not 0 < prf <= 1:
        _fail(where, "must be in (0, 1]", prf)
    return int(head_dim * prf)


def _mla_notes(view: _View, notes: Mapping[str, Any], interleaved: bool) -> dict[str, Any]:
    """DeepSeek-style attention multiplies its softmax scale by get_mscale(f, mscale_all_dim)**2
    (`yarn_apply_mscale`, transformers#47435); no cos/sin table carries that factor."""
    nope = view.number("qk_nope_head_dim", required=False) or 0
    rope = int(view.get("qk_rope_head_dim"))
    base_scale = (int(nope) + rope) ** -0.5
    multiplier = float(notes.get("softmax_scale_multiplier", 1.0))
    return {
        "softmax_scale": base_scale * multiplier,
        "softmax_scale_note": (
            "attention scores use (qk_nope_head_dim + qk_rope_head_dim)**-0.5 times "
            "softmax_scale_multiplier; apply it in the attention kernel"
        ),
        "transformers_layout": (
            "transformers permutes q/k to half split and uses cat(c, c); the checkpoint pairs "
            "(2i, 2i+1)"
            if interleaved
            else "half split, cat(c, c)"
        ),
    }


def _has_rope(view: _View) -> bool:
    return any(view.has(k) for k in ROPE_KEYS)


# ---------------------------------------------------------------------------------------------
# ALiBi, T5, sinusoidal


def _alibi_entry(view: _View, num_heads: int, notes: dict[str, Any], **fields: Any) -> _Entry:
    data = {"kind": "alibi", "num_heads": num_heads, **fields}
    return _Entry("alibi", None, data, {"serve": SLOPES_NOTE, **notes})


def _bloom(view: _View) -> list[_Entry]:
    heads = int(view.number("n_head", "num_attention_heads"))
    notes = {
        "bias_form": "row_constant",
        "transformers": "build_alibi_tensor: slopes * key position (cumsum of the attention "
        "mask - 1), added before the 1/sqrt(head_dim)-scaled scores",
    }
    return [_alibi_entry(view, heads, notes)]


def _falcon(view: _View) -> list[_Entry]:
    heads = int(view.number("num_attention_heads", "n_head"))
    head_dim = _head_dim(view)
    notes = {
        "bias_form": "row_constant",
        "slope_scale": f"1/sqrt(head_dim={head_dim})",
        "transformers": "FalconModel adds build_alibi_tensor(...) / sqrt(head_dim) to the mask; "
        "its slopes are rounded to bfloat16 before the multiply",
    }
    return [_alibi_entry(view, heads, notes, slope_scale=1.0 / math.sqrt(head_dim))]


def _mpt(view: _View) -> list[_Entry]:
    attn = view.data.get("attn_config") or {}
    if not isinstance(attn, Mapping):
        _fail(view.key("attn_config"), "must be an object", attn)
    if attn.get("alibi") is False:
        _fail(
            view.key("attn_config.alibi"),
            "false: MPT then uses learned absolute position embeddings (checkpoint weights)",
            False,
        )
    heads = int(view.number("n_heads", "num_attention_heads"))
    bias_max = attn.get("alibi_bias_max")
    fields: dict[str, Any] = {}
    notes: dict[str, Any] = {
        "bias_form": "mpt",
        "transformers": "build_mpt_alibi_tensor(num_heads, max_seq_len): slopes * (j - (L-1))",
    }
    if bias_max is not None:
        fields["alibi_bias_max"] = float(
            _check_number(view.key("attn_config.alibi_bias_max"), bias_max)
        )
        if fields["alibi_bias_max"] != 8.0:
            notes["transformers_bias_max"] = (
                "transformers' MptModel always builds the bias with alibi_bias_max=8"
            )
    return [_alibi_entry(view, heads, notes, **fields)]


def _baichuan(view: _View) -> list[_Entry]:
    """Baichuan-13B / Baichuan2-13B (hidden 5120, 40 heads) use ALiBi; the 7B models use RoPE.
    The remote code, not config.json, makes the choice; the size is the only signal."""
    hidden = view.number("hidden_size")
    heads = int(view.number("num_attention_heads"))
    if hidden == 5120 and heads == 40:
        notes = {
            "bias_form": "row_constant",
            "variant": "Baichuan 13B (ALiBi); chosen from hidden_size=5120, 40 heads",
        }
        return [_alibi_entry(view, heads, notes)]
    entries = _rope_entries(view)
    for entry in entries:
        entry.notes["variant"] = "Baichuan 7B (RoPE); chosen from hidden_size, num_attention_heads"
    return entries


def _t5(view: _View) -> list[_Entry]:
    buckets = int(view.number("relative_attention_num_buckets"))
    distance = int(view.number("relative_attention_max_distance"))
    heads = view.number("num_heads", "num_attention_heads", required=False)
    base: dict[str, Any] = {
        "kind": "t5_bias",
        "num_buckets": buckets,
        "max_distance": distance,
    }
    length = view.number("n_positions", required=False)
    if length is not None:
        base["key_length"] = int(length)
    notes: dict[str, Any] = {
        "bias": "the (num_buckets, num_heads) relative_attention_bias weights are in the "
        "checkpoint; pass them as relative_attention_bias to get the bias table",
        "scaling": "T5 adds the bias to unscaled scores (no 1/sqrt(d))",
    }
    if heads is not None:
        notes["num_heads"] = int(heads)
    if length is not None:
        notes["key_length"] = f"from n_positions={int(length)}; override key_length per request"
    if view.model_type == "umt5":
        notes["per_layer"] = "UMT5: every layer has its own relative_attention_bias weights"
    entries = [
        _Entry("t5_bias", "encoder", {**base, "bidirectional": True}, dict(notes)),
        _Entry("t5_bias", "decoder", {**base, "bidirectional": False}, dict(notes)),
    ]
    if view.data.get("is_encoder_decoder") is False:
        entries = entries[:1] if not view.data.get("is_decoder") else entries[1:]
    return entries


def _whisper(view: _View) -> list[_Entry]:
    dim = int(view.number("d_model"))
    rows = int(view.number("max_source_positions"))
    data = {"kind": "sinusoidal", "dim": dim, "max_positions": rows, "convention": "whisper"}
    notes = {
        "decoder": "Whisper's decoder positions are learned (max_target_positions="
        f"{view.get('max_target_positions')} rows of checkpoint weights): no formula",
        "transformers": "WhisperEncoder.embed_positions = sinusoids(max_source_positions, d_model)",
    }
    return [_Entry("sinusoidal", "encoder", data, notes)]


def _marian(view: _View) -> list[_Entry]:
    if view.data.get("static_position_embeddings") is False:
        _fail(
            view.key("static_position_embeddings"),
            "false: learned position embeddings are checkpoint weights, not a formula",
            False,
        )
    dim = int(view.number("d_model"))
    rows = int(view.number("max_position_embeddings"))
    data = {"kind": "sinusoidal", "dim": dim, "max_positions": rows, "convention": "marian"}
    notes = {
        "shared": "encoder and decoder use the same static table "
        "(MarianSinusoidalPositionalEmbedding)",
        "rows": "position ids 0..max_position_embeddings-1 (decoding offsets by the cache length)",
    }
    return [_Entry("sinusoidal", None, data, notes)]


def _m2m100(view: _View) -> list[_Entry]:
    dim = int(view.number("d_model"))
    rows = int(view.number("max_position_embeddings"))
    pad = int(view.number("pad_token_id"))
    data = {
        "kind": "sinusoidal",
        "dim": dim,
        "max_positions": rows + 2,
        "convention": "fairseq",
        "padding_idx": pad,
    }
    notes = {
        "offset": 2,
        "rows": f"position ids: tokens use padding_idx+1={pad + 1}.. (create_position_ids_from_"
        "input_ids); the padding row is zero; max_position_embeddings + 2 rows",
        "shared": "encoder and decoder use the same table (M2M100SinusoidalPositionalEmbedding)",
    }
    return [_Entry("sinusoidal", None, data, notes)]


# ---------------------------------------------------------------------------------------------
# Vision transformers


def _pair(view: _View, name: str) -> tuple[int, int]:
    """An int-or-[h, w] config value (`image_size`, `patch_size`) as (h, w), as transformers'
    `PatchEmbeddings` read them (`value if isinstance(value, Iterable) else (value, value)`)."""
    value = view.get(name)
    if value is None:
        _fail(view.key(name), "required key missing", None)
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            _fail(view.key(name), "must be an int or [height, width]", value)
        h, w = (_check_number(view.key(name), v) for v in value)
    else:
        h = w = _check_number(view.key(name), value)
    if int(h) != h or int(w) != w or h < 1 or w < 1:
        _fail(view.key(name), "must hold positive integers", value)
    return int(h), int(w)


def _patch_grid(view: _View) -> tuple[int, int]:
    """(image_size // patch_size) per axis: the patch grid every vision table is laid out on."""
    ih, iw = _pair(view, "image_size")
    ph, pw = _pair(view, "patch_size")
    gh, gw = ih // ph, iw // pw
    if gh < 1 or gw < 1:
        _fail(view.key("patch_size"), "larger than image_size: no patches", [ph, pw])
    return gh, gw


def _learned_entry(
    view: _View,
    grid: tuple[int, int],
    dim: int,
    prefix: int,
    weights: str,
    notes: dict[str, Any],
) -> _Entry:
    """A learned absolute table (prefix + gh * gw, dim) of the checkpoint, resampled as the model's
    `interpolate_pos_encoding` does; `new_grid` defaults to the config's grid (the table as is)."""
    gh, gw = grid
    data: dict[str, Any] = {
        "kind": "learned",
        "table_shape": [prefix + gh * gw, dim],
        "grid": [gh, gw],
        "new_grid": [gh, gw],
    }
    problem = None
    if prefix:
        # ViTEmbeddings / BeitEmbeddings.interpolate_pos_encoding: class token kept, the square
        # grid (torch_int(sqrt(num_positions))) bicubic-resampled to size=(h, w) without antialias.
        if gh != gw:
            problem = FieldProblem(
                view.key("image_size"),
                f"a {gh}x{gw} patch grid: transformers' interpolate_pos_encoding reshapes the "
                "learned table to a square grid",
                view.get("image_size"),
            )
        data["method"] = "hf_vit"
    else:
        # SwinEmbeddings.interpolate_pos_encoding: no class token; the same bicubic call, which is
        # timm's resample without antialias.
        data.update(
            method="timm",
            num_prefix_tokens=0,
            interpolation="bicubic",
            antialias=False,
            align_corners=False,
        )
    notes = {
        "weights": f"{weights} of the checkpoint, shape (1, {prefix + gh * gw}, {dim}): upload "
        "it and pass table_key (or pass table inline)",
        "resample": "new_grid [height // patch_size, width // patch_size] gives the table that "
        "interpolate_pos_encoding=True adds for other image sizes",
        **notes,
    }
    return _Entry("learned", None, data, notes, weights=weights, problem=problem)


def _vit(view: _View) -> list[_Entry]:
    """ViT (`modeling_vit.ViTEmbeddings`): a learned (1 + gh * gw, hidden_size) table."""
    grid = _patch_grid(view)
    dim = int(view.number("hidden_size"))
    notes = {"transformers": "ViTEmbeddings.position_embeddings, class token row first"}
    return [_learned_entry(view, grid, dim, 1, "embeddings.position_embeddings", notes)]


def _swin(view: _View) -> list[_Entry]:
    """Swin (`modeling_swin.SwinRelativePositionBias`): every window attention gathers its
    (2W - 1)^2-row bias table through the same (W^2, W^2) index; W = `window_size`."""
    window = view.number("window_size")
    if int(window) != window or window < 1:
        _fail(view.key("window_size"), "must be a positive integer", window)
    heads = view.get("num_heads")
    notes: dict[str, Any] = {
        "bias": "each block has its own ((2W-1)^2, num_heads) relative_position_bias_table "
        "(checkpoint weights); pass one as relative_position_bias_table for that block's bias, "
        "or upload it and pass relative_position_bias_table_key and _shape",
        "transformers": "SwinRelativePositionBias.relative_position_index: this (N, N) index "
        "flattened; the shifted-window mask (SW-MSA) is separate and not a position table",
        "window_clamp": "SwinLayer uses min(resolution) as the window (and no shift) for stages "
        "whose feature map is not larger than window_size",
    }
    if isinstance(heads, list):
        notes["num_heads_per_stage"] = list(heads)
    entries = [
        _Entry(
            "relative_index",
            None,
            {"kind": "relative_index", "scheme": "swin", "window_size": [int(window)] * 2},
            notes,
        )
    ]
    if view.get("use_absolute_embeddings"):
        grid = _patch_grid(view)
        dim = int(view.number("embed_dim"))
        extra = {"transformers": "SwinEmbeddings.position_embeddings: no class token"}
        entries.append(_learned_entry(view, grid, dim, 0, "embeddings.position_embeddings", extra))
    return entries


def _beit(view: _View) -> list[_Entry]:
    """BEiT / data2vec-vision (`modeling_beit.BeitRelativePositionBias`,
    `modeling_data2vec_vision.Data2VecVisionRelativePositionBias`): the class-token index over the
    patch grid, per layer and/or shared; optionally a learned absolute table (`BeitEmbeddings`)."""
    grid = _patch_grid(view)
    per_layer = bool(view.get("use_relative_position_bias"))
    shared = bool(view.get("use_shared_relative_position_bias"))
    absolute = bool(view.get("use_absolute_position_embeddings"))
    if not (per_layer or shared or absolute):
        _fail(
            view.key("use_relative_position_bias"),
            "no position encoding: use_absolute_position_embeddings, use_relative_position_bias "
            "and use_shared_relative_position_bias are all false",
            view.get("use_relative_position_bias"),
        )
    entries: list[_Entry] = []
    if per_layer or shared:
        tables = []
        if per_layer:
            tables.append("every layer has its own table (use_relative_position_bias)")
        if shared:
            tables.append("one table shared by all layers (use_shared_relative_position_bias)")
        heads = view.number("num_attention_heads", required=False)
        notes: dict[str, Any] = {
            "bias": f"{' plus '.join(tables)}: ((2Wh-1)(2Ww-1)+3, num_attention_heads={heads}) "
            "relative_position_bias_table checkpoint weights; pass one as "
            "relative_position_bias_table (or upload it and pass relative_position_bias_table_key "
            "and _shape) for its bias (transformers adds both when both are set)",
            "transformers": "generate_relative_position_index(window_size), window_size = "
            "image_size // patch_size; class token at row/column 0",
            "resolution": "other image sizes: override window_size [height // patch_size, "
            "width // patch_size] for the index; transformers then also resamples the table "
            "bilinearly, which the bias output does not reproduce",
        }
        data = {"kind": "relative_index", "scheme": "beit", "window_size": list(grid)}
        entries.append(_Entry("relative_index", None, data, notes))
    if absolute:
        dim = int(view.number("hidden_size"))
        extra = {"transformers": "BeitEmbeddings.position_embeddings, class token row first"}
        entries.append(_learned_entry(view, grid, dim, 1, "embeddings.position_embeddings", extra))
    return entries


def _vit_mae(view: _View) -> list[_Entry]:
    """ViTMAE (`modeling_vit_mae.ViTMAEEmbeddings.initialize_weights`, `ViTMAEDecoder.
    initialize_weights`): fixed 2-D sin-cos tables on a square grid of int(sqrt(num_patches)),
    zero class-token row first, at hidden_size (encoder) and decoder_hidden_size (decoder)."""
    gh, gw = _patch_grid(view)
    patches = gh * gw
    side = int(patches**0.5)
    if side * side != patches:
        _fail(
            view.key("image_size"),
            f"{patches} patches: ViTMAE builds its table on a square grid of "
            "int(sqrt(num_patches)) and cannot initialise it",
            view.get("image_size"),
        )
    dims = {
        "encoder": int(view.number("hidden_size")),
        "decoder": int(view.number("decoder_hidden_size")),
    }
    notes = {
        "encoder": "ViTMAEEmbeddings.position_embeddings (requires_grad=False)",
        "decoder": "ViTMAEDecoder.decoder_pos_embed (ViTMAEForPreTraining only)",
    }
    base = {
        "kind": "sinusoidal_2d",
        "style": "mae",
        "grid_height": side,
        "grid_width": side,
        "cls_token": True,
    }
    common = {
        "layout": "[sin(x w), cos(x w), sin(y w), cos(y w)] (transformers' half rotation of "
        "build_2d_sinusoidal_position_embedding), zero class-token row first",
        "resample": "interpolate_pos_encoding=True resamples this table bicubically (the "
        "learned family's hf_vit method on the uploaded table)",
    }
    if dims["encoder"] == dims["decoder"]:
        note = {"transformers": f"{notes['encoder']}; {notes['decoder']}: one table", **common}
        return [_Entry("sinusoidal_2d", None, {**base, "dim": dims["encoder"]}, note)]
    return [
        _Entry(
            "sinusoidal_2d",
            role,
            {**base, "dim": dim},
            {"transformers": notes[role], **common},
        )
        for role, dim in dims.items()
    ]


def _entries(view: _View) -> list[_Entry]:
    mt = view.model_type
    if mt == "vit":
        return _vit(view)
    if mt == "swin":
        return _swin(view)
    if mt in BEIT_MODELS:
        return _beit(view)
    if mt == "vit_mae":
        return _vit_mae(view)
    if mt in T5_MODELS:
        return _t5(view)
    if mt == "whisper":
        return _whisper(view)
    if mt == "marian":
        return _marian(view)
    if mt == "m2m_100":
        return _m2m100(view)
    if mt == "bloom":
        return _bloom(view)
    if mt == "mpt":
        return _mpt(view)
    if mt in ("falcon", "RefinedWeb", "RefinedWebModel") and view.get("alibi"):
        return _falcon(view)
    if mt == "baichuan":
        return _baichuan(view)
    if mt in LEARNED_MODELS:
        _fail(
            view.key("model_type"),
            "learned absolute position embeddings are checkpoint weights, not a formula",
            mt,
        )
    if mt in MODEL_DEFAULTS or _has_rope(view):
        return _rope_entries(view)
    _fail(
        view.key("model_type"),
        "unknown model_type without rope/alibi/relative-bias/sinusoidal fields",
        mt,
    )


# ---------------------------------------------------------------------------------------------
# Public API


def _apply_overrides(entry: _Entry, overrides: Mapping[str, Any]) -> dict[str, Any]:
    fields = FAMILIES[entry.family].spec_type.model_fields
    data = dict(entry.data)
    for name, value in overrides.items():
        if name not in fields or name == "kind":
            continue
        if name in ("rotary_dim", "partial_rotary_factor"):
            data.pop("rotary_dim", None)
            data.pop("partial_rotary_factor", None)
        data[name] = value
    return data


def _validate(entry: _Entry, data: Mapping[str, Any]) -> SpecBase:
    family = FAMILIES[entry.family]
    what = entry.family if entry.role is None else f"{entry.family}:{entry.role}"
    if entry.problem is not None:
        raise ConfigError("cannot map config", [entry.problem])
    if entry.weights is not None and data.get("table") is None and data.get("table_key") is None:
        _fail(
            "table_key",
            f"learned absolute positions: config.json does not carry the checkpoint's "
            f"{entry.weights} (table_shape {data.get('table_shape')}); upload it (POST "
            "/v1/uploads) and pass table_key=..., or pass table=... inline",
            None,
        )
    try:
        return validate_as(family.spec_type, data, what)
    except SpecError as err:
        problems = [
            FieldProblem(
                "max_position_embeddings",
                "missing from the config: pass max_positions=... for the rows wanted",
                None,
            )
            if p.field == "max_positions" and p.message == "Field required"
            else p
            for p in err.problems
        ]
        raise ConfigError(f"config maps to an invalid {what} spec", problems) from None


@dataclass
class _Group:
    family: str
    role: str | None
    spec: SpecBase
    notes: dict[str, Any]
    layer_types: list[str] = field(default_factory=list)


def resolve_hf_config(
    config: Mapping[str, Any],
    /,
    *,
    kind: str | None = None,
    layer_type: str | None = None,
    **overrides: Any,
) -> list[NamedSpec]:
    """Every position table a transformers model needs, from its config.json contents.

    Args:
        config: the config dict (v4 `rope_scaling` or v5 `rope_parameters` shape; multimodal
            configs are read through `text_config`).
        kind: keep only this family ("rope", "alibi", "t5_bias", "sinusoidal",
            "relative_index", "learned", "sinusoidal_2d"); other tables are not validated.
        layer_type: keep only specs used by this layer type ("sliding_attention",
            "full_attention") or role ("encoder", "decoder").
        overrides: spec fields applied to every produced spec whose family has the field
            (`max_positions`, `dtype`, `profile`, `precision`, `seq_len`, `interleaved`,
            `key_length`, `table_key`, `new_grid`, `window_size`, ...).

    Returns:
        One `NamedSpec` per distinct table, in config order: name "family" when the model needs
        one table of that family, "family:role" per layer type or role otherwise.

    Raises:
        ConfigError: naming the key that cannot be mapped, or an override no produced spec takes.
    """
    if not isinstance(config, Mapping):
        raise ConfigError(
            "a config must be a JSON object",
            [FieldProblem("(config)", "expected an object", type(config).__name__)],
        )
    view = _text_view(config)
    groups: dict[str, _Group] = {}
    entries = _entries(view)
    for entry in entries:
        if kind is not None and entry.family != kind:
            continue  # not validated: a table not asked for cannot fail the request
        spec = _validate(entry, _apply_overrides(entry, overrides))
        key = content_key(spec)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(entry.family, entry.role, spec, dict(entry.notes))
        if entry.family == "rope" and entry.role is not None:
            group.layer_types.append(entry.role)
    per_family: dict[str, int] = {}
    for group in groups.values():
        per_family[group.family] = per_family.get(group.family, 0) + 1
    result: list[NamedSpec] = []
    declared = view.data.get("layer_types")
    for group in groups.values():
        role = group.role
        if group.family == "rope":
            role = "+".join(group.layer_types) if per_family["rope"] > 1 else None
        name = group.family if role is None else f"{group.family}:{role}"
        notes = dict(group.notes)
        if group.layer_types:
            notes["layer_types"] = list(group.layer_types)
        if kind is not None and group.family != kind:
            continue
        if layer_type is not None and not _serves(group, layer_type, declared):
            continue
        result.append(NamedSpec(name=name, spec=group.spec, notes=notes))
    if not result:
        families = sorted({e.family for e in entries})
        if kind is not None and kind not in families:
            _fail("kind", f"the config has no {kind!r} table; it has {families}", kind)
        roles = sorted({r for g in groups.values() for r in (*g.layer_types, g.role) if r})
        _fail("layer_type", f"no table for this layer type; known: {roles}", layer_type)
    _check_overrides(result, overrides)
    return result


def _serves(group: _Group, layer_type: str, declared: Any) -> bool:
    if group.layer_types:
        return layer_type in group.layer_types
    if group.role is not None:
        return group.role == layer_type
    # One table for every layer: it serves any declared layer type (or any, if none declared).
    return not isinstance(declared, list) or layer_type in declared


def _check_overrides(result: list[NamedSpec], overrides: Mapping[str, Any]) -> None:
    for name in overrides:
        if name == "kind" or not any(
            name in FAMILIES[n.spec.kind].spec_type.model_fields for n in result
        ):
            kinds = sorted({n.spec.kind for n in result})
            _fail(name, f"no produced spec ({kinds}) has this field", overrides[name])


def from_hf_config(config: Mapping[str, Any], /, **overrides: Any) -> list[SpecBase]:
    """The specs of `resolve_hf_config(config, **overrides)`, without names and notes."""
    return [n.spec for n in resolve_hf_config(config, **overrides)]


__all__ = ["MODEL_DEFAULTS", "NamedSpec", "from_hf_config", "resolve_hf_config"]
