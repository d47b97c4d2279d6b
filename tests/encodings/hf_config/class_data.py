"""The generator of `service/posenc/encodings/hf_config/transformers_classes.json`: what every
config class of the installed transformers says about the keys posenc's `/v1/resolve` reads, so
that the server reads a config.json as transformers does without importing it (issue 30 item 1,
issue 39 item 4).

Per model_type of `CONFIG_MAPPING_NAMES` (its config class):
- `attribute_map`: the class's aliases (`PreTrainedConfig.__getattribute__` reads `head_dim` as
  `kv_channels` in JetMoE, `attention_head_dim` in Zamba2, `n_embd` as `hidden_size` in GPT-2...);
- `defaults`: the dataclass field default of each key of `KEYS` (or the attribute it is an
  alias of) the class declares (a key a
  config.json omits takes it; None defaults are left out: the class derives those values); for
  a class with rope parameters (a `rope_parameters` or `rope_theta` field), `rope_theta` is its
  `default_theta` unless a `rope_theta` field says otherwise
  (`RotaryEmbeddingConfigMixin.convert_rope_params_to_dict`; a per-layer-type `default_theta`
  is kept as `rope_theta_by_layer_type`, read by the family's own conversion), `rope_parameters`
  the default instance's (a file without rope parameters gets them: `__post_init__` may add
  keys no field names) and `rope_type` its `default_rope_type` when that is not "default" (the
  axial models), `partial_rotary_factor` where `__post_init__` supplies one no field declares
  (`_post_init_partial`), `head_dim_scale` k where `__post_init__` derives head_dim = k *
  hidden_size // num_attention_heads when the file gives none (Zamba2: 2),
  `global_head_dim` and `global_head_dim_layer_types` where `__post_init__` builds
  `per_layer_config` from a `global_head_dim` kwarg (`_global_head_dim`: Gemma 4's family),
  `layer_types_pattern` where it derives `layer_types` from a `sliding_window_pattern` when
  the file gives none (`_layer_types_pattern`: Cohere 2, EXAONE 4, Gemma 3);
  `unread_top_level` the top-level rope keys the class does not read (`_unread_top_level`:
  Laguna's, Mellum's no-op `convert_rope_params_to_dict`; Apertus' rope_theta beside a default
  `rope_parameters` that has one) and `default_partial_unread` the layer types ("" for one
  table) whose rotary module's `compute_default_rope_parameters` ignores `partial_rotary_factor`
  (`_default_partial_unread`: Llama's `dim = head_dim`);
- `text_config_defaults`: for a composite class that lays its text sub-config's init kwargs under
  the file's `text_config` (Voxtral Realtime), those of `KEYS`.

`python -m tests.encodings.hf_config.class_data --write` (`make models-data`) rewrites the file;
`test_class_data.py` fails when the committed file differs from what this generates.

Source: transformers `configuration_utils.py` (`PreTrainedConfig.attribute_map`),
`modeling_rope_utils.py` (`RotaryEmbeddingConfigMixin.default_theta`, `default_rope_type`),
each `models/<name>/configuration_<name>.py`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "service" / "posenc" / "encodings" / "hf_config" / "transformers_classes.json"

KEYS = (
    # sizes a rotary table is built from, with the aliases classes declare for them
    "head_dim",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "n_embd",
    "n_head",
    "n_heads",
    "d_model",
    "embed_dim",
    "kv_channels",
    "attention_head_dim",
    "global_head_dim",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "rope_interleave",
    # the base and the rotary width
    "rope_theta",
    "partial_rotary_factor",
    "rotary_pct",
    "rotary_emb_base",
    "rotary_dim",
    "rope_local_base_freq",
    "global_rope_theta",
    "local_rope_theta",
    # lengths
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "original_max_position_embeddings",
    # layers
    "num_hidden_layers",
    "sliding_window",
    "sliding_window_pattern",
    "no_rope_layer_interval",
)
"""The config keys `hf_config` reads through `ConfigView.get` / `number` (a missing key takes the
class default)."""

SCALARS = (bool, int, float, str)


def _rotary(names: set[str]) -> bool:
    """A class with rope parameters (every config class has the mixin's `default_theta`)."""
    return "rope_parameters" in names or "rope_theta" in names


def _default_rope_parameters(cls: type) -> Any:
    """`rope_parameters` of the class's default instance: what a config.json without rope
    parameters gets (`__post_init__` may set more than the fields say: Qwen3-Next's
    `kwargs.setdefault("partial_rotary_factor", 0.25)`); None when `cls()` fails."""
    try:
        params = cls().rope_parameters  # type: ignore[attr-defined]
    except Exception:
        return None
    return json.loads(json.dumps(params, default=str)) if params else None


def _text_config_defaults(cls: type) -> dict[str, Any] | None:
    """The `text_config` init kwargs of a composite class that lays them under a text_config
    dict the file gives (`{**init_kwargs, **text_config}` in its `__post_init__`: Voxtral
    Realtime), restricted to `KEYS`; None when it does not (transformers' generic
    `SubConfigSpec.create_subconfig` uses them only when the file has no text_config)."""
    spec = (getattr(cls, "sub_configs_defaults", None) or {}).get("text_config")
    kwargs = dict(getattr(spec, "init_kwargs", None) or {})
    if not kwargs:
        return None
    try:
        given = cls(text_config={}).text_config  # type: ignore[call-arg]
        plain = type(given)()
    except Exception:
        return None

    def read(config: Any, key: str) -> Any:
        if key == "rope_theta":
            return (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
        return getattr(config, key, None)

    # the keys a text_config dict without them gets from the init kwargs, not the text class
    return {
        k: kwargs[k]
        for k in KEYS
        if k in kwargs
        and isinstance(kwargs[k], SCALARS)
        and read(given, k) == kwargs[k] != read(plain, k)
    } or None


def _head_dim_scale(cls: type, fields: set[str]) -> int | None:
    """k where the class derives head_dim = k * hidden_size // num_attention_heads in
    `__post_init__` (no head_dim field: Zamba2's attention_head_dim, k = 2; a head_dim key of the
    file, set after it, wins); None for the usual k = 1 or a field."""
    target = dict(getattr(cls, "attribute_map", {}) or {}).get("head_dim", "head_dim")
    if target in fields or "qk_rope_head_dim" in fields:
        return None
    try:
        sizes = []
        for scale in (1, 2):
            config = cls()
            hidden = config.hidden_size * scale  # type: ignore[attr-defined]
            config = cls(hidden_size=hidden)  # type: ignore[call-arg]
            sizes.append((config.head_dim, hidden, config.num_attention_heads))  # type: ignore[attr-defined]
    except Exception:
        return None
    ratios = {
        (head_dim * heads) // hidden
        for head_dim, hidden, heads in sizes
        if isinstance(head_dim, int) and (head_dim * heads) % hidden == 0
    }
    if len(ratios) != 1 or len(sizes) != 2 or ratios == {1}:
        return None
    return ratios.pop()


def _post_init_partial(cls: type, fields: set[str]) -> float | None:
    """The `partial_rotary_factor` a class's `__post_init__` puts in rope parameters that name
    none (GLM's, Nemotron's, Persimmon's `kwargs.setdefault("partial_rotary_factor", 0.5)`,
    Qwen3-Next's 0.25, Moonshine's 0.9: `convert_rope_params_to_dict` setdefaults it into a
    file's `rope_parameters`), for a class without a `partial_rotary_factor` field; None when the
    value is derived from other sizes (Mistral 4's qk_rope_head_dim / head_dim: it changes when
    one of them does) or the class adds none."""
    if "partial_rotary_factor" in fields:
        return None
    flat = {"rope_type": "default", "rope_theta": 10000.0}
    try:
        base = cls()
        values = {cls(rope_parameters=dict(flat)).rope_parameters.get("partial_rotary_factor")}  # type: ignore[call-arg, attr-defined]
        for key in ("hidden_size", "head_dim", "qk_rope_head_dim", "num_attention_heads"):
            size = getattr(base, key, None) if key in fields else None
            if isinstance(size, int) and size > 0:
                config = cls(rope_parameters=dict(flat), **{key: 2 * size})  # type: ignore[call-arg]
                values.add(config.rope_parameters.get("partial_rotary_factor"))  # type: ignore[attr-defined]
    except Exception:
        return None
    if len(values) != 1:
        return None
    value = values.pop()
    return float(value) if isinstance(value, (int, float)) else None


def _global_head_dim(cls: type) -> tuple[int, list[str]] | None:
    """(default, layer types) where the class's `__post_init__` builds `per_layer_config` from a
    `global_head_dim` kwarg when the file gives no `per_layer_config` (Gemma 4 and the classes
    copied from it: `global_head_dim = kwargs.pop("global_head_dim", 512)`, the head_dim of
    every full-attention layer; the rotary module reads `config.per_layer_config[layer_type]`):
    the layer types whose head_dim follows the kwarg (measured with two values) and the head_dim
    they get without it; None when no layer follows it."""
    followed: list[set[str]] = []
    try:
        for probe in (100, 200):
            config = cls(global_head_dim=probe)  # type: ignore[call-arg]
            if not getattr(config, "is_heterogeneous", False):
                return None
            per_layer = config.per_layer_config  # type: ignore[attr-defined]
            types = set(config.layer_types)  # type: ignore[attr-defined]
            followed.append({t for t in types if per_layer[t].head_dim == probe})
        base = cls()
        if len(followed) != 2 or followed[0] != followed[1] or not followed[0]:
            return None
        defaults = {base.per_layer_config[t].head_dim for t in followed[0]}  # type: ignore[attr-defined]
    except Exception:
        return None
    if len(defaults) != 1:
        return None
    return int(defaults.pop()), sorted(followed[0])


def _pattern_types(layers: int, pattern: int, last_full: bool) -> list[str]:
    types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if last_full and types:
        types[-1] = "full_attention"
    return types


def _layer_types_pattern(cls: type) -> dict[str, Any] | None:
    """How `__post_init__` derives `layer_types` when the file gives none, where it is every
    p-th layer full attention (`"sliding_attention" if (i + 1) % p else "full_attention"`):
    p the file's `sliding_window_pattern` (Cohere 2's `kwargs.pop("sliding_window_pattern", 4)`,
    EXAONE 4's field, EmbeddingGemma 2's with the last layer forced to full attention).
    Measured from the class at several layer counts and patterns: `{"default": p, "last_full":
    bool, "key": "sliding_window_pattern"}`; None when the class derives no such pattern, only
    p = 1, or a fixed one (a class that ignores `sliding_window_pattern` may read its pattern
    from another key: AFMoE's `global_attn_every_n_layers`)."""
    counts = (7, 8, 12, 13)
    try:
        base = {n: list(cls(num_hidden_layers=n).layer_types) for n in counts}  # type: ignore[call-arg, attr-defined]
        given = {
            (n, p): list(cls(num_hidden_layers=n, sliding_window_pattern=p).layer_types)  # type: ignore[call-arg, attr-defined]
            for n in counts
            for p in (2, 3)
        }
    except Exception:
        return None
    for last_full in (False, True):
        found = [
            d
            for d in range(2, 13)
            if all(base[n] == _pattern_types(n, d, last_full) for n in counts)
        ]
        if len(found) != 1:
            continue
        rule: dict[str, Any] = {"default": found[0], "last_full": last_full}
        if all(given[n, p] == _pattern_types(n, p, last_full) for n, p in given):
            return {**rule, "key": "sliding_window_pattern"}
    return None


PROBE_THETA = 12345.0
PROBE_FACTOR = 0.375
PROBE_SCALING = {"rope_type": "linear", "factor": 8.0}


def _rope_dicts(params: Any) -> list[dict[str, Any]]:
    """The rope parameter dicts of a config's `rope_parameters`: itself when flat, else each
    layer type's."""
    if not isinstance(params, dict):
        return []
    if all(v is None or isinstance(v, dict) for v in params.values()) and params:
        return [v for v in params.values() if isinstance(v, dict)]
    return [params]


def _reads(cls: type, key: str, **given: Any) -> bool:
    """Whether `cls(**given, key=probe)` carries the probe value into its rope parameters as
    transformers' own reading does (`convert_rope_params_to_dict` + `standardize_rope_params`:
    a rope_scaling dict read is one with rope_theta filled in). A class that raises for the
    value does not ignore it silently (Phi-3's validation of a linear rope_scaling): read; a
    class without rope parameters reads its own fields (ESM's `config.rope_theta`)."""
    probe: Any = {"rope_theta": PROBE_THETA, "partial_rotary_factor": PROBE_FACTOR}.get(key)
    if key == "rope_scaling":
        probe = dict(PROBE_SCALING)
    try:
        config = cls(**given, **{key: probe})
    except Exception:
        return True
    if not hasattr(config, "rope_parameters"):
        fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else ()
        return key in fields
    dicts = _rope_dicts(config.rope_parameters)
    if key == "rope_scaling":
        return any(
            d.get("factor") == 8.0 and d.get("rope_type") == "linear" and "rope_theta" in d
            for d in dicts
        )
    return any(d.get(key) == probe for d in dicts)


def _unread_top_level(cls: type) -> dict[str, list[str]] | None:
    """The top-level rope keys (`rope_theta`, `partial_rotary_factor`, `rope_scaling`) a
    config.json gives that the class does not read (`cls(key=probe)` leaves its rope parameters
    without the probe value): under "alone" without a `rope_parameters` in the file (a no-op
    `convert_rope_params_to_dict`: Laguna, Mellum, ZAYA, ...; or a class whose default
    `rope_parameters` already has the key: Apertus' rope_theta), under "beside_parameters" with
    the class's default `rope_parameters` less that key (only a no-op conversion ignores it
    there). None when the class reads every key."""
    try:
        default = getattr(cls(), "rope_parameters", None)
    except Exception:
        return None
    alone = [
        k for k in ("partial_rotary_factor", "rope_scaling", "rope_theta") if not _reads(cls, k)
    ]
    beside = []
    for key in ("partial_rotary_factor", "rope_theta"):
        if not isinstance(default, dict) or not default:
            break
        params = json.loads(json.dumps(default))
        for d in _rope_dicts(params):
            d.pop(key, None)
        if not _reads(cls, key, rope_parameters=params):
            beside.append(key)
    if not alone and not beside:
        return None
    return {"alone": alone, "beside_parameters": beside}


def _inv_freq(rotary: Any, compute: Any, config: Any, layer_type: str) -> Any:
    """The inverse frequencies the rotary module builds for `layer_type` ("" for its one
    table): its `{layer_type}_inv_freq` / `inv_freq` buffer (what the model runs: Gemma 4's
    module reads each layer type's head_dim), else `compute_default_rope_parameters`."""
    try:
        module = rotary(config=config)
    except Exception:
        module = None
    name = f"{layer_type}_inv_freq" if layer_type else "inv_freq"
    buffers = dict(module.named_buffers()) if module is not None else {}
    if name in buffers:
        return buffers[name]
    if compute is None:
        raise LookupError(f"{rotary.__name__} has no {name} buffer")
    kwargs = {"layer_type": layer_type} if layer_type else {}
    return compute(config, **kwargs)[0]


def _default_partial_unread(cls: type) -> list[str] | None:
    """The layer types ("" for a class with one table) whose rotary module computes the default
    RoPE without reading `partial_rotary_factor`: the text `*RotaryEmbedding` of the class's
    modeling module (`rope_sweep._text_rotary_class`) gives as many inverse frequencies from
    `compute_default_rope_parameters` at factor 0.5 as at 1.0, the same buffer (Llama,
    Mistral, Qwen 2/3, Gemma, ...: `dim = head_dim`; Phi-3, GLM, StableLM read it). None
    when none ignores it or the module cannot be probed. The module's own buffers are
    compared (`_inv_freq`), so that a module computing from its layer type's sizes (Gemma 4's
    full-attention layers) is probed as it runs."""
    from tests.encodings.hf_config import rope_sweep

    try:
        default = cls().rope_parameters  # type: ignore[attr-defined]
        module = rope_sweep._modeling_module(cls())
    except Exception:
        return None
    try:
        rotary = rope_sweep._text_rotary_class(module, cls())
    except Exception:
        # an audio/speech config configuring a 1-D rotary of its own (`rope_sweep._own_rotary`)
        own = rope_sweep._own_rotary(module, cls())
        if own is None:
            return None
        rotary = own[0]
    compute = getattr(rotary, "compute_default_rope_parameters", None)
    if not isinstance(default, dict) or not default:
        return None
    nested = all(v is None or isinstance(v, dict) for v in default.values())
    layer_types = [k for k, v in default.items() if v is not None] if nested else [""]
    unread = []
    for layer_type in layer_types:
        tables = []
        for factor in (0.5, 1.0):
            params = json.loads(json.dumps(default))
            one = params[layer_type] if layer_type else params
            for k in [k for k in one if k != "rope_theta"]:
                one.pop(k)
            one.update(rope_type="default", partial_rotary_factor=factor)
            one.setdefault("rope_theta", 10000.0)
            try:
                config = cls(rope_parameters=params)  # type: ignore[call-arg]
                tables.append(_inv_freq(rotary, compute, config, layer_type))
            except Exception:
                break
        same = len(tables) == 2 and tables[0].shape == tables[1].shape
        if same and bool((tables[0] == tables[1]).all()):
            unread.append(layer_type)
    return sorted(unread) or None


def class_facts(cls: type) -> dict[str, Any]:
    """`attribute_map` and the defaults of `KEYS` of one config class."""
    fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    aliases = dict(getattr(cls, "attribute_map", {}) or {})
    defaults: dict[str, Any] = {}
    # each key, and the attribute a key is an alias of (Moonshine's num_attention_heads is
    # encoder_num_attention_heads)
    for key in dict.fromkeys([*KEYS, *(aliases[k] for k in KEYS if k in aliases)]):
        field = fields.get(key)
        if field is None or field.default is dataclasses.MISSING:
            continue
        value = field.default
        if isinstance(value, SCALARS) and value is not None:
            defaults[key] = value
    if _rotary(set(fields)):
        theta = cls.default_theta  # type: ignore[attr-defined]
        if isinstance(theta, dict):
            # bases per layer type, read by the class's own conversion (posenc's family
            # mappers): no one default base
            defaults["rope_theta_by_layer_type"] = {str(k): float(v) for k, v in theta.items()}
        elif "rope_theta" not in defaults:
            defaults["rope_theta"] = float(theta)
        params = _default_rope_parameters(cls)
        if params:
            defaults["rope_parameters"] = params
        partial = _post_init_partial(cls, set(fields))
        if partial is not None:
            defaults["partial_rotary_factor"] = partial
        scale = _head_dim_scale(cls, set(fields))
        if scale is not None:
            defaults["head_dim_scale"] = scale
        global_head_dim = _global_head_dim(cls)
        if global_head_dim is not None:
            defaults.setdefault("global_head_dim", global_head_dim[0])
            defaults["global_head_dim_layer_types"] = global_head_dim[1]
        pattern = _layer_types_pattern(cls)
        if pattern is not None:
            defaults["layer_types_pattern"] = pattern
        rope_type = getattr(cls, "default_rope_type", "default")
        if rope_type != "default":
            defaults["rope_type"] = rope_type
        unread = _unread_top_level(cls)
        if unread is not None:
            defaults["unread_top_level"] = unread
        partial_unread = _default_partial_unread(cls)
        if partial_unread is not None:
            defaults["default_partial_unread"] = partial_unread
    facts: dict[str, Any] = {"class": cls.__name__}
    if aliases:
        facts["attribute_map"] = dict(sorted(aliases.items()))
    facts["defaults"] = dict(sorted(defaults.items()))
    text = _text_config_defaults(cls)
    if text:
        facts["text_config_defaults"] = dict(sorted(text.items()))
    return facts


def generate() -> dict[str, Any]:
    """The data file's content for the installed transformers."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    transformers.logging.set_verbosity_error()
    models: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model_type in sorted(CONFIG_MAPPING_NAMES):
            try:
                cls = CONFIG_MAPPING[model_type]
            except Exception:  # a config class that cannot be imported here
                continue
            models[model_type] = class_facts(cls)
    return {
        "source": "generated by `make models-data` (tests/encodings/hf_config/class_data.py) "
        "from the installed transformers: each config class's attribute_map and the defaults "
        "of the keys posenc reads; do not edit",
        "transformers": str(transformers.__version__),
        "keys": list(KEYS),
        "models": models,
    }


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {DATA.relative_to(REPO)}")
    args = parser.parse_args(argv)
    text = render(generate())
    if args.write:
        DATA.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
