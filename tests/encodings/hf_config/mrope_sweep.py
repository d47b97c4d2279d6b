"""The M-RoPE sweep: every multimodal-RoPE model type of the installed transformers, its config
resolved by posenc and compared with the model's own rotary module on (3, N) position ids whose
three axes differ (issue 18); NeoMME's module reads two axes (row, column): (2, N) ids, and the
models that keep rope parameters per layer type (NeoMME, Cohere Compass) are compared per layer
type (issue 30).

Enumeration (`mrope_model_types`): every model_type of `CONFIG_MAPPING_NAMES` whose modeling
module defines a text `*RotaryEmbedding` (not a vision one) with `recomposition_frequencies` (the
per-axis recombination of M-RoPE) over `mrope_section` or over the axes its forward expands the
position ids to, read from the installed package, not a hand list; the
composites' vision, audio and vocoder sub-configs (`is_sub_config`) are left out. Configs
(`cases`): each type's class defaults (`to_dict()`) and the rope sweep's YaRN variant, in the v5
and v4 config.json forms, plus released checkpoints' config.json (`RELEASED`).

The reference (`reference`): transformers reads the config.json (`from_dict`), the text config's
own rotary module (`<Model>TextRotaryEmbedding(config)`, the class the text model builds) runs
`forward(x, position_ids)` on (3, 1, N) ids, and the modeling module's `apply_rotary_pos_emb`
rotates random q and k with its cos/sin.

The verdict (`judge`) of posenc's answer (`resolve_config`, what `POST /v1/resolve` runs):
- `rejected`: a `ConfigError` naming a key of the config.json;
- `exact`: the entry has `notes["mrope"]`; posenc's half-width table gathered per
  `pair_axes` and widened per `pairing` equals the model's cos/sin bit for bit, the model's own
  apply function gives bit-equal q and k from both, and posenc's declared pairing and rotary
  width reproduce the model's q.k (relative 1e-5, as the rope sweep);
- `wrong`: anything else posenc accepted; `unbuildable`: transformers cannot build or run it.
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
import re
from collections.abc import Mapping
from typing import Any

import torch

from tests.encodings.hf_config import rope_sweep as sweep

N = 40
"""Tokens per reference forward."""

ROWS = 4096
"""Rows of the posenc table (max_positions override): above every position id used."""


@functools.cache
def mrope_model_types() -> tuple[str, ...]:
    """model_types whose modeling module has a text rotary class with per-axis recomposition."""
    from transformers.models.auto.configuration_auto import (
        CONFIG_MAPPING_NAMES,
        model_type_to_module_name,
    )

    root = sweep._models_root()
    found = []
    for model_type, class_name in CONFIG_MAPPING_NAMES.items():
        if is_sub_config(model_type, class_name):
            continue
        module = model_type_to_module_name(model_type)
        path = root.joinpath(*module.split(".")) / f"modeling_{module.split('.')[-1]}.py"
        if path.exists() and _text_rotary_names(path.read_text(encoding="utf-8")):
            found.append(model_type)
    return tuple(sorted(found))


SUB_CONFIG_WORDS = (
    *("vision", "visual", "vqmodel"),
    "audio",
    *("vocoder", "code2wav", "token2wav", "dit", "bigvgan"),
)
"""Words of a model_type or config class name that make it a multimodal model's vision, audio
or vocoder sub-config: its modeling module is the composite's (hence its M-RoPE text rotary
class), but its config has no text model to resolve. The Omni talkers are text decoders with
M-RoPE that posenc serves: they stay."""


def is_sub_config(model_type: str, class_name: str) -> bool:
    """A vision / audio / vocoder sub-config of a multimodal model (`SUB_CONFIG_WORDS`)."""
    words = re.findall(r"[a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", class_name).lower())
    words += re.findall(r"[a-z0-9]+", model_type.lower())
    return any(w in SUB_CONFIG_WORDS for w in words)


def _text_rotary_names(source: str) -> list[str]:
    names = []
    for match in re.finditer(
        r"^class (\w*RotaryEmbedding)\b(.*?)(?=^class |\Z)", source, re.M | re.S
    ):
        name, body = match.group(1), match.group(2)
        if (
            "vision" not in name.lower()
            and "def recomposition_frequencies" in body
            and ("self.mrope_section" in body or _AXES.search(body))
        ):
            names.append(name)
    return names


_AXES = re.compile(r"position_ids = position_ids\.expand\((\d+), -1, -1\)")
"""A rotary forward that expands the position ids over its axes itself (NeoMME's two, Cohere
Compass's three): the axis count of (A, B, N) ids it reads."""


_SECTION_AXES = "position_ids = position_ids.expand(len(self.mrope_section), -1, -1)"
"""A rotary forward that expands the position ids over one axis per `mrope_section` entry
(HunYuan-VL: HunyuanOCR's four)."""


def axis_count(rotary: type, module: Any = None) -> int:
    """How many position axes the rotary class's forward reads (3 unless it expands to others;
    `len(module.mrope_section)` for a built `module` whose forward expands over its section)."""
    text = sweep.source(rotary)
    if module is not None and _SECTION_AXES in text:
        return len(module.mrope_section)
    found = _AXES.search(text)
    return int(found.group(1)) if found else 3


RELEASED: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2-VL-7B-Instruct": {
        "model_type": "qwen2_vl",
        "hidden_size": 3584,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vision_config": {
            "depth": 32,
            "embed_dim": 1280,
            "hidden_size": 3584,
            "num_heads": 16,
            "in_chans": 3,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    },
    "Qwen/Qwen2.5-VL-7B-Instruct": {
        "model_type": "qwen2_5_vl",
        "hidden_size": 3584,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 128000,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vision_config": {
            "hidden_size": 1280,
            "num_heads": 16,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "window_size": 112,
            "temporal_patch_size": 2,
            "fullatt_block_indexes": [7, 15, 23, 31],
            "tokens_per_second": 2,
        },
    },
    "Qwen/Qwen3-VL-8B-Instruct": {
        "model_type": "qwen3_vl",
        "text_config": {
            "model_type": "qwen3_vl_text",
            "head_dim": 128,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "max_position_embeddings": 262144,
            "rope_scaling": {
                "mrope_interleaved": True,
                "mrope_section": [24, 20, 20],
                "rope_type": "default",
            },
            "rope_theta": 5000000,
        },
        "vision_config": {
            "model_type": "qwen3_vl",
            "hidden_size": 1152,
            "num_heads": 16,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 2304,
        },
    },
    "zai-org/GLM-4.1V-9B-Thinking": {
        "model_type": "glm4v",
        "text_config": {
            "model_type": "glm4v_text",
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 2,
            "partial_rotary_factor": 0.5,
            "max_position_embeddings": 65536,
            "rope_theta": 10000.0,
            "rope_scaling": {"type": "default", "mrope_section": [8, 12, 12]},
        },
        "vision_config": {
            "hidden_size": 1536,
            "num_heads": 12,
            "image_size": 336,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    },
    "baidu/ERNIE-4.5-VL-28B-A3B-PT": {
        "model_type": "ernie4_5_vl_moe",
        "text_config": {
            "model_type": "ernie4_5_vl_moe_text",
            "hidden_size": 2560,
            "num_attention_heads": 20,
            "num_key_value_heads": 4,
            "max_position_embeddings": 131072,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 500000.0,
                "mrope_section": [22, 22, 20],
            },
        },
        "vision_config": {
            "hidden_size": 1280,
            "num_heads": 16,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_merge_size": 2,
        },
    },
    "Qwen/Qwen2.5-Omni-7B": {
        "model_type": "qwen2_5_omni",
        "thinker_config": {
            "model_type": "qwen2_5_omni_thinker",
            "text_config": {
                "model_type": "qwen2_5_omni_text",
                "hidden_size": 3584,
                "num_attention_heads": 28,
                "num_key_value_heads": 4,
                "max_position_embeddings": 32768,
                "rope_theta": 1000000.0,
                "rope_scaling": {
                    "mrope_section": [16, 24, 24],
                    "rope_type": "default",
                    "type": "default",
                },
            },
        },
    },
}
"""The RoPE facts of released checkpoints' config.json files (their M-RoPE keys, sizes that set
head_dim and rotary width, the vision tower's rotary facts as in tests/api/test_vision_rope.py;
layer counts and vocabularies left at the class defaults, since only the rotary module is
built)."""


_COHERE_TEXT: dict[str, Any] = {
    "model_type": "cohere_compass_text",
    "num_hidden_layers": 4,
    "layer_types": [
        "sliding_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
    ],
}

BUILT: dict[str, dict[str, Any]] = {
    "cohere_compass_text: per-layer sections, YaRN on full attention": {
        **_COHERE_TEXT,
        "rope_parameters": {
            "sliding_attention": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [16, 24, 24],
            },
            "full_attention": {
                "rope_type": "yarn",
                "rope_theta": 1000000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 8192,
                "mrope_section": [24, 20, 20],
            },
        },
    },
    "cohere_compass: NoPE full attention, flat keys beside the layer types": {
        "model_type": "cohere_compass",
        "text_config": {
            **_COHERE_TEXT,
            "rope_parameters": {
                "rope_theta": 50000.0,
                "rope_type": "default",
                "sliding_attention": {"rope_type": "default", "rope_theta": 50000.0},
                "full_attention": None,
            },
        },
    },
    # tencent/HunyuanOCR's text model, flat (HunYuanVLConfig folds flat text keys into
    # text_config): the v4 "xdrope" type with NTK alpha 1000 and four axes of 16 pairs each,
    # hidden 1024, 16 heads of 128, 8 KV heads, as mlx-vlm's hunyuan_vl port carries them (its
    # test config and TextModelArgs defaults; vLLM's XDRotaryEmbedding test uses the same
    # [16, 16, 16, 16]); the released config.json itself was not in the reference corpus
    "hunyuan_vl: HunyuanOCR, xdrope [16, 16, 16, 16], alpha 1000": {
        "model_type": "hunyuan_vl",
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "attention_head_dim": 128,
        "max_position_embeddings": 32768,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "alpha": 1000.0,
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "type": "xdrope",
            "xdrope_section": [16, 16, 16, 16],
        },
    },
    "hunyuan_vl_text: three axes [16, 24, 24], default RoPE": {
        "model_type": "hunyuan_vl_text",
        "hidden_size": 1024,
        "num_attention_heads": 8,
        "head_dim": 128,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [16, 24, 24],
        },
    },
}
"""Configs of M-RoPE types whose class defaults transformers cannot run (Cohere Compass's config
class has no rope parameters: its rotary module raises KeyError 'full_attention'; HunYuan-VL's
has no `mrope_section`: its rotary module takes len(None)): rope
parameters per layer type as its `convert_rope_params_to_dict` and rotary module read them (each
type's own inverse frequency and `mrope_section`, a null type running without rotation, the
flat `rope_theta` / `rope_type` of hub files popped), the other keys the class defaults."""


def cases() -> list[tuple[str, str, str]]:
    """(model_type, variant, form) of every case: class defaults and YaRN in both forms per type,
    each released checkpoint (variant = its name, form "file") and each `BUILT` config (form
    "built")."""
    out = [
        (t, variant, form)
        for t in mrope_model_types()
        for variant in sweep.GENERIC_VARIANTS
        for form in sweep.FORMS
    ]
    out += [(str(data["model_type"]), name, "file") for name, data in RELEASED.items()]
    out += [(str(data["model_type"]), name, "built") for name, data in BUILT.items()]
    return out


def case_config(model_type: str, variant: str, form: str) -> dict[str, Any]:
    """The config.json of a case: a released file, the class defaults as they are (only the rotary
    module is built: nothing to shrink; composite configs keep their own nesting, such as the
    Omni models' thinker_config), or the rope sweep's YaRN variant."""
    if form == "file":
        return copy.deepcopy(RELEASED[variant])
    if form == "built":
        return copy.deepcopy(BUILT[variant])
    if variant == "default":
        with sweep._quiet():
            config = sweep._config_class(model_type)()
        data = json.loads(json.dumps(config.to_dict(), default=str))
        return sweep.to_v4(data) if form == "v4" else data
    return sweep.case_config(model_type, variant, form)


def positions(length: int = N, axes: int = 3) -> torch.Tensor:
    """(axes, N) position ids whose axes all differ (a wrong axis shows in every section)."""
    n = torch.arange(length)
    return torch.stack([n, (n * 7 + 3) % 97, (n * 13 + 5) % 89, (n * 5 + 11) % 83][:axes])


def _text_config(config: Any) -> Any:
    if getattr(config, "thinker_config", None) is not None:
        config = config.thinker_config
    return sweep._open(sweep._text_config(config))


def _module(config: Any) -> Any:
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    name = model_type_to_module_name(str(config.model_type))
    return importlib.import_module(f"transformers.models.{name}.modeling_{name.split('.')[-1]}")


def _rotary_class(module: Any, text: Any) -> type:
    """The rotary class the text config's model builds (`self.rotary_emb = <Class>(...)` in the
    `__init__` of the module's model class for this config class)."""
    names = _text_rotary_names(sweep.source(module))
    built = set()
    for obj in vars(module).values():
        if isinstance(obj, type) and getattr(obj, "config_class", None) is type(text):
            init = obj.__dict__.get("__init__")
            found = re.search(r"self\.rotary_emb = (\w+)\(", sweep.source(init)) if init else None
            if found:
                built.add(found.group(1))
    mrope = tuple(getattr(module, n) for n in names if hasattr(module, n))
    chosen = [
        cls
        for cls in (getattr(module, b, None) for b in sorted(built))
        if isinstance(cls, type) and issubclass(cls, mrope)
    ]
    if not chosen and built:
        raise sweep.UnbuildableError(
            f"{type(text).__name__}'s model builds {sorted(built)}: no M-RoPE"
        )
    if not chosen and len(mrope) == 1:
        chosen = list(mrope)
    if len(chosen) != 1:
        raise sweep.UnbuildableError(f"no text rotary class for {type(text).__name__}")
    return chosen[0]


def reference(data: Mapping[str, Any], ids: torch.Tensor | None = None) -> dict[str, Any]:
    """The model's cos/sin (N, W) per layer type (`layers`: None for a single table) for
    (A, N) ids (default `positions` over the rotary's own axis count, `ids`), its apply
    function and rotary class name."""
    config = sweep.load_config(data)
    text = _text_config(config)
    module = _module(text)
    layers: dict[str | None, tuple[torch.Tensor, torch.Tensor]] = {}
    try:
        cls = _rotary_class(module, text)
        with sweep._quiet():
            rotary = cls(text)
            if ids is None:
                ids = positions(N, axis_count(cls, rotary))
            x = torch.zeros(1, dtype=torch.float32)
            kinds = getattr(rotary, "rope_type", None)
            for layer_type in sorted(kinds) if isinstance(kinds, Mapping) else [None]:
                kwargs = {} if layer_type is None else {"layer_type": layer_type}
                cos, sin = rotary(x, ids[:, None, :], **kwargs)
                layers[layer_type] = (cos[0].float(), sin[0].float())
    except sweep.UnbuildableError:
        raise
    except Exception as err:
        raise sweep.UnbuildableError(f"rotary: {type(err).__name__}: {str(err)[:160]}") from None
    apply = getattr(module, "apply_rotary_pos_emb", None)
    if apply is None:
        raise sweep.UnbuildableError(f"{module.__name__} has no apply_rotary_pos_emb")
    only = layers.get(None)
    return {
        "cos": None if only is None else only[0],
        "sin": None if only is None else only[1],
        "layers": layers,
        "ids": ids,
        "apply": apply,
        "rotary": type(rotary).__name__,
        "head_dim": int(
            getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        ),
    }


def widen(half: torch.Tensor, pairing: str) -> torch.Tensor:
    """(N, d/2) -> (N, d): cat(c, c) for half split (and a spec's `full_layout: cat`),
    repeat_interleave for interleaved pairs."""
    if pairing == "interleaved":
        return half.repeat_interleave(2, dim=-1)
    return torch.cat([half, half], dim=-1)


def gather(table: torch.Tensor, ids: torch.Tensor, axes: list[int]) -> torch.Tensor:
    """(P, W) table, (A, N) ids, per-column axes -> (N, W): column i from row ids[axes[i]]
    (W = d/2 with `pair_axes`, d with HunYuan-VL's `channel_axes` over the full width)."""
    columns = torch.arange(len(axes))
    rows = ids[torch.tensor(axes)]  # (d/2, N)
    return table[rows.T, columns[None, :]]


def posenc_entries(
    data: Mapping[str, Any],
) -> dict[str | None, tuple[Any, dict[str, Any], torch.Tensor, torch.Tensor]]:
    """resolve_config's rope entries by layer type (None: the one `rope` table), each (spec,
    notes, half-width float32 cos, sin)."""
    from posenc.api.specs import resolve_config
    from posenc.encodings import compute

    named = [
        n
        for n in resolve_config({"hf_config": copy.deepcopy(dict(data)), "max_positions": ROWS})
        if n.spec.kind == "rope"
    ]
    if not named:
        raise AssertionError("expected a rope table, got none")
    out = {}
    for entry in named:
        role = entry.name.split(":", 1)[1] if ":" in entry.name else None
        spec = entry.spec.canonical()
        half = spec.model_copy(update={"width": "half", "packing": "separate", "dtype": "float32"})
        table = compute(half, device="cpu")
        out[role] = (spec, dict(entry.notes), table.tensors["cos"], table.tensors["sin"])
    return out


def posenc_entry(data: Mapping[str, Any]) -> tuple[Any, dict[str, Any], torch.Tensor, torch.Tensor]:
    """resolve_config's one rope entry (spec, notes) and its half-width float32 table."""
    entries = posenc_entries(data)
    if list(entries) != [None]:
        raise AssertionError(f"expected one rope table, got {list(entries)}")
    return entries[None]


def judge(data: Mapping[str, Any]) -> sweep.Verdict:
    """The verdict of one config (see the module docstring); a model with a table per layer
    type is judged on each, posenc's `rope:<layer type>` against the module's forward for
    that layer type."""
    from posenc.encodings import SpecError

    try:
        ref = reference(data)
    except sweep.UnbuildableError as err:
        return sweep.Verdict("unbuildable", [str(err)])
    except Exception as err:
        return sweep.Verdict("unbuildable", [f"config: {type(err).__name__}: {str(err)[:160]}"])
    try:
        mine = posenc_entries(data)
    except SpecError as err:
        return sweep.rejection(err, data)
    if list(mine) == [None]:
        # one distinct table (posenc names it `rope`): every layer type's
        mine = dict.fromkeys(ref["layers"], mine[None])
    if set(mine) != set(ref["layers"]):
        model, served = sorted(map(str, ref["layers"])), sorted(map(str, mine))
        return sweep.Verdict("wrong", [f"tables: model {model}, posenc {served}"])
    reasons: list[str] = []
    facts: dict[str, Any] = {}
    for layer_type, (cos_m, sin_m) in ref["layers"].items():
        spec, notes, cos_t, sin_t = mine[layer_type]
        verdict = _judge_table(ref, ref["ids"], cos_m, sin_m, spec, notes, cos_t, sin_t)
        where = "" if layer_type is None else f"{layer_type}: "
        reasons += [where + r for r in verdict.reasons]
        if layer_type is None:
            facts = verdict.facts
        else:
            for name, value in verdict.facts.items():
                facts.setdefault(name, {})[layer_type] = value
    return sweep.Verdict("wrong" if reasons else "exact", reasons, facts)


def _judge_table(
    ref: Mapping[str, Any],
    ids: torch.Tensor,
    cos_m: torch.Tensor,
    sin_m: torch.Tensor,
    spec: Any,
    notes: Mapping[str, Any],
    cos_t: torch.Tensor,
    sin_t: torch.Tensor,
) -> sweep.Verdict:
    """One table against the model's cos/sin for it (see the module docstring)."""
    mrope = notes.get("mrope")
    if not isinstance(mrope, dict):
        return sweep.Verdict("wrong", ["accepted without notes['mrope']"])
    if len(mrope.get("axes", ())) != ids.shape[0]:
        return sweep.Verdict("wrong", [f"axes: model {ids.shape[0]}, posenc {mrope.get('axes')}"])
    pairing = str(notes.get("pairing"))
    facts = {"layout": mrope["layout"], "section": mrope["mrope_section"], "pairing": pairing}
    # the module's own full-width layout: cat(c, c) where the spec says so (HY-V4-VL's module
    # emits it beside interleaved pairs; its apply repeat_interleaves the first half)
    layout = "half_split" if getattr(spec, "full_layout", None) == "cat" else pairing
    if "channel_axes" in mrope:
        # HunYuan-VL: the full-width table (cat(c, c)) gathered per channel
        cos = gather(widen(cos_t, layout), ids, mrope["channel_axes"])
        sin = gather(widen(sin_t, layout), ids, mrope["channel_axes"])
    else:
        cos = widen(gather(cos_t, ids, mrope["pair_axes"]), layout)
        sin = widen(gather(sin_t, ids, mrope["pair_axes"]), layout)
    reasons = []
    if cos.shape != cos_m.shape:
        return sweep.Verdict(
            "wrong", [f"width: model {tuple(cos_m.shape)}, posenc {tuple(cos.shape)}"], facts
        )
    if not (torch.equal(cos, cos_m) and torch.equal(sin, sin_m)):
        diff = float(torch.maximum((cos - cos_m).abs(), (sin - sin_m).abs()).max())
        reasons.append(f"cos/sin differ (max |d| {diff:.3g})")
    torch.manual_seed(0)
    q = torch.randn(1, 2, ids.shape[1], ref["head_dim"])
    k = torch.randn(1, 2, ids.shape[1], ref["head_dim"])
    rotary = int(spec.resolved_rotary_dim())
    q_model, k_model = ref["apply"](q, k, cos_m[None], sin_m[None])
    q_mine, k_mine = ref["apply"](q, k, cos[None], sin[None])
    if not (torch.equal(q_model, q_mine) and torch.equal(k_model, k_mine)):
        reasons.append("the model's apply_rotary_pos_emb differs with posenc's cos/sin")
    c, s = cos[:, : rotary // 2], sin[:, : rotary // 2]
    if layout == "interleaved":
        c, s = cos[:, 0:rotary:2], sin[:, 0:rotary:2]
    want = q_model[0, 0].double() @ k_model[0, 0].double().T
    if "channel_axes" in mrope:
        # the pairs of a channel map are no single angle each: rotate_half over the declared
        # rotary width with the gathered full-width cos/sin, channel by channel
        got = (
            _rotate_channels(q[0, 0], cos, sin, rotary)
            @ _rotate_channels(k[0, 0], cos, sin, rotary).T
        )
    else:
        got_q = sweep.rotate(q[0].double(), c, s, rotary, pairing)
        got_k = sweep.rotate(k[0].double(), c, s, rotary, pairing)
        got = got_q[0] @ got_k[0].T
    scale = float(q[0, 0].norm(dim=-1).max() * k[0, 0].norm(dim=-1).max())
    err = float((want - got).abs().max()) / scale
    if not err < sweep.QK_RTOL:
        reasons.append(f"q.k off by {err:.3g} under posenc's {pairing} over {rotary} channels")
    return sweep.Verdict("wrong" if reasons else "exact", reasons, facts)


def _rotate_channels(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int
) -> torch.Tensor:
    """(N, D) x rotated over its first `rotary` channels as half-split pairs (channel c with
    c + rotary/2) by full-width (N, rotary) cos/sin, in float64: x*cos + rotate_half(x)*sin."""
    x = x.double()
    r, rest = x[:, :rotary], x[:, rotary:]
    half = rotary // 2
    turned = torch.cat((-r[:, half:], r[:, :half]), dim=-1)
    out = r * cos[:, :rotary].double() + turned * sin[:, :rotary].double()
    return torch.cat((out, rest), dim=-1)


def run_case(model_type: str, variant: str, form: str) -> sweep.Verdict:
    try:
        data = case_config(model_type, variant, form)
    except Exception as err:
        return sweep.Verdict("unbuildable", [f"config: {type(err).__name__}: {str(err)[:160]}"])
    return judge(data)


def render(results: Mapping[tuple[str, str, str], sweep.Verdict]) -> str:
    """The docs/models.md section of the M-RoPE types."""
    from posenc.encodings.hf_config.mrope import MROPE_MODELS

    lines = [
        "## Multimodal RoPE (M-RoPE)",
        "",
        "Generated with the table above by `make models-doc` "
        "(`tests/encodings/hf_config/mrope_sweep.py`): every model type whose modeling module "
        "recombines per-axis (temporal, height, width; NeoMME's row, column) frequencies, each "
        "config resolved by posenc and compared on (3, N) (NeoMME: (2, N)) position ids whose "
        "axes differ, per layer type where the model keeps rope parameters per layer type: "
        "`exact` is bit-equal cos/sin (posenc's table gathered per `notes.mrope.pair_axes`) and "
        "equal q, k after the model's own `apply_rotary_pos_emb`; `built` cases are configs its "
        "class defaults cannot give (`mrope_sweep.BUILT`). `get_rope_index` is the rule of `POST "
        "/v1/mrope/position_ids` for the model's position ids.",
        "",
        "| model type | layout | mrope_section | pairing | get_rope_index | outcome |",
        "|---|---|---|---|---|---|",
    ]
    by_type: dict[str, list[tuple[str, str, sweep.Verdict]]] = {}
    for (model_type, variant, form), verdict in results.items():
        by_type.setdefault(model_type, []).append((variant, form, verdict))
    for model_type in sorted(by_type):
        entries = by_type[model_type]
        facts = next((v.facts for _, _, v in entries if v.facts), {})
        known = MROPE_MODELS.get(model_type)
        rule = known.rule if known is not None and known.rule else "-"
        groups: dict[str, list[str]] = {}
        for variant, form, verdict in entries:
            why = (
                f" ({sweep._cell(verdict.reasons[0][:100])})" if verdict.outcome != "exact" else ""
            )
            groups.setdefault(f"{verdict.outcome}{why}", []).append(f"{variant}/{form}")
        outcome = "<br>".join(f"{k}: {', '.join(v)}" for k, v in groups.items())
        lines.append(
            f"| {model_type} | {_fact(facts.get('layout'))} | {_fact(facts.get('section'))} "
            f"| {_fact(facts.get('pairing'))} | {rule} | {outcome} |"
        )
    return "\n".join(lines) + "\n"


def _fact(value: Any) -> str:
    """A table cell of one fact; one per layer type (`layer: value`, joined) where they differ."""
    if value is None:
        return "-"
    if isinstance(value, dict):
        distinct = {json.dumps(v) for v in value.values()}
        if len(distinct) == 1:
            return str(next(iter(value.values())))
        return "<br>".join(f"{k}: {v}" for k, v in sorted(value.items()))
    return str(value)


def run_all() -> dict[tuple[str, str, str], sweep.Verdict]:
    return {case: run_case(*case) for case in cases()}


if __name__ == "__main__":
    torch.set_num_threads(1)
    for case, verdict in run_all().items():
        print("/".join(case), verdict.line()[:200], json.dumps(verdict.facts))
