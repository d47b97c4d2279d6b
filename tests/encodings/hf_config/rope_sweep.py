"""The RoPE sweep: every model type of the installed transformers that builds a rotary embedding,
run through posenc's `/v1/resolve` mapping and compared with the model itself (issue 17).

Enumeration (`rotary_model_types`): every model_type of transformers' `CONFIG_MAPPING_NAMES`
whose modeling module defines a rotary class (`ROTARY_CLASS`), read from the installed package
(not a hand list), and every model_type whose class-default config posenc resolves to a rope
table (`served_model_types`). Configs (`sweep_cases`): per model type its class defaults and a
YaRN variant (`GENERIC_VARIANTS`), plus the RoPE facts of released checkpoints
(`CHECKPOINTS`), each written as config.json in the v5 `rope_parameters` form (`to_dict()`)
and in the v4 form the Hub still serves (`rope_scaling`, top-level `rope_theta` /
`partial_rotary_factor`, `to_v4`). Every config is shrunk to a few layers and two heads without
touching its rotary geometry (`_shrink`): head_dim, rotary width, theta and scaling stay as the
model type defines them. Where the sweep cannot shrink a config (an attribute, key or validator
of the class it does not know), the case is the unshrunk class defaults with the variant's keys
(`_unshrunk`), judged at its rotary module when the model is too large: posenc is always asked.

The reference (`reference`): transformers loads the config.json (`from_dict`, the same conversion
`from_pretrained` does), builds the text model (`AutoModel.from_config`, eager attention) and runs
a forward over positions 0..S-1, with every module-level `apply_rotary*` function of the modeling
module wrapped: for each decoder layer the wrapper records the query and key before and after the
model's own rotation and the cos/sin (or complex frequencies) it was given. An attention layer that
never calls it is a NoPE layer.

The verdict (`judge`) for posenc's answer (`resolve_config`, the function `/v1/resolve` calls):
- `rejected`: a `ConfigError` / `SpecError` whose problem names a key of the config.json;
- `exact`: for every rotating layer, the table of its layer type equals the model's cos/sin bit
  for bit (in the model's own arrangement: half width, `cat(c, c)`, `repeat_interleave` or
  complex), and q.k after the model's rotation equals q.k rotated with posenc's table under the
  pairing (`notes["pairing"]`) and rotary width (`rotary_dim`) posenc declares; NoPE layers are the
  ones posenc lists in `notes["nope_layers"]`;
- `wrong`: anything else that posenc accepted (with a diagnosis: which pairing, width, direction or
  scale the model uses instead);
- `unbuildable`: transformers itself cannot build or run the tiny model (the reason is kept);
- `harness_failure`: a config.json the sweep wrote that transformers cannot load where the same
  case's v5 form loads, or the sweep's own code failing to write one (a failing test).
Every recorded layer is judged, and the rotary module again at `LONG_POSITIONS`
(`long_positions`).

`python -m tests.encodings.hf_config.rope_sweep --write-docs` runs every case and writes
`docs/models.md` (with the M-RoPE section of `mrope_sweep`) and `docs/models-outcomes.json` (the
ratchet, `ratchet`); `--summary` prints the counts and the accepted-and-wrong cases.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import functools
import importlib
import inspect
import json
import linecache
import math
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

SEQ = 24
"""Positions every reference forward covers (0..SEQ-1), unless a case needs a longer sequence."""

QK_RTOL = 1e-5
"""q.k agreement, relative to max |q||k| of the layer: fp32 rotations of equal tables in another
op order differ by ~1e-7; a wrong pairing, width, direction or scale differs by 1e-2 and more."""

MAX_PARAMS = 100_000_000
"""A shrunk model larger than this is not built (a config class whose sizes _shrink misses)."""

REPO = Path(__file__).resolve().parents[3]
DOCS = REPO / "docs" / "models.md"

NOT_SOFTMAX = ("linear", "lightning", "mamba", "delta", "conv", "recurrent", "ssm")
"""Mixers named *Attention that attend without positions by design (not NoPE layers)."""

OUTCOMES = ("exact", "module_exact", "rejected", "wrong", "unbuildable", "harness_failure")
"""Verdicts, in report order (`module_exact`: exact at the rotary module, `module_reference`;
`harness_failure`: the sweep's own config.json is one transformers cannot load)."""

VERIFIED = frozenset({"exact", "module_exact"})
"""Outcomes that verify posenc's answer: a committed case with one of them must keep it."""

OUTCOMES_FILE = REPO / "docs" / "models-outcomes.json"
"""The committed outcome of every case of the RoPE and M-RoPE sweeps (`make models-doc`): the
ratchet (`ratchet`) fails a verified case that stops being verified, and any other change until
the file is regenerated."""

VISION_WORDS = ("vision", "visual", "audio", "image", "patch", "speech", "talker", "code2wav")


# ---------------------------------------------------------------------------------------------
# Enumeration


def _wanted_layers(text: Any, rotary: Any) -> dict[int, str | None]:
    """The first layer of each softmax layer type the rotary module computes tables for
    (`layer_type` in its forward): {layer index: type}; {0: None} for one shared table."""
    types = getattr(text, "layer_types", None)
    if "layer_type" not in inspect.signature(rotary.forward).parameters or not isinstance(
        types, list
    ):
        return {0: None}
    return {types.index(t): t for t in dict.fromkeys(types) if not any(w in t for w in NOT_SOFTMAX)}


def _models_root() -> Path:
    import transformers

    return Path(transformers.__file__).resolve().parent / "models"


ROTARY_CLASS = re.compile(r"^class (\w*(?:Rotary|Rope|RoPE)\w*)\b", re.M)
"""A rotary class of a modeling module, by name: `*RotaryEmbedding`, `*RotaryPositionalEmbedding`
(CLVP, the Wav2Vec2 / SeamlessM4T conformers), `*RopePositionEmbedding` (DINOv3, Sapiens2),
`*RopeAttention` / `*RoPEAttention` (V-JEPA 2, SAM 2/3 video)."""


@functools.cache
def rotary_model_types() -> tuple[str, ...]:
    """Every model_type whose modeling module defines a rotary class (`ROTARY_CLASS`: a source
    scan of the installed transformers, no import of the modeling modules at collection), and
    every model_type whose class-default config posenc serves a rope table for
    (`served_model_types`): whatever posenc answers is judged or refused here."""
    from transformers.models.auto.configuration_auto import (
        CONFIG_MAPPING_NAMES,
        model_type_to_module_name,
    )

    root = _models_root()
    found = set(served_model_types())
    for model_type in CONFIG_MAPPING_NAMES:
        module = model_type_to_module_name(model_type)
        path = root.joinpath(*module.split(".")) / f"modeling_{module.split('.')[-1]}.py"
        if path.exists() and ROTARY_CLASS.search(path.read_text(encoding="utf-8")):
            found.add(model_type)
    return tuple(sorted(found))


@functools.cache
def served_model_types() -> tuple[str, ...]:
    """Every model_type of `CONFIG_MAPPING` whose class-default config.json (`to_dict()`) posenc
    resolves to a rope table (`resolve_config`, what `/v1/resolve` runs, with max_positions)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from posenc.api.specs import resolve_config

    found = []
    for model_type in CONFIG_MAPPING_NAMES:
        try:
            with _quiet():
                data = _json(_config_class(model_type)())
        except Exception:
            continue  # transformers cannot build the class defaults: nothing to resolve
        try:
            named = resolve_config({"hf_config": data, "max_positions": SEQ, "kind": "rope"})
        except Exception:
            continue
        if any(item.spec.kind == "rope" for item in named):
            found.append(model_type)
    return tuple(sorted(found))


def transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


# ---------------------------------------------------------------------------------------------
# Configs

# Per-model overrides that shrink a config without touching its rotary geometry.
_SMALL = {
    "intermediate_size": 32,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "ffn_hidden_size": 32,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "moe_num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_topk": 2,
    "n_group": 1,
    "topk_group": 1,
    "n_shared_experts": 1,
    "vocab_size": 128,
    "vocab_size_per_layer_input": 128,
    "q_lora_rank": 32,
    "kv_lora_rank": 32,
    "first_k_dense_replace": 0,
}
_MIN_LAYERS = 4


@dataclass(frozen=True)
class Checkpoint:
    """The RoPE facts of a released checkpoint, as text-config keyword overrides (`kwargs`), or a
    v4 config.json edit (`v4`: keys set on the text part of the v4 form, None deletes)."""

    name: str
    source: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    v4: Mapping[str, Any] | None = None
    lengths: tuple[int, ...] = ()


def _lr_factors(n: int, top: float) -> list[float]:
    """n LongRoPE factors rising from 1 to `top` (the shape of Phi-3.5's published lists)."""
    return [round(1.0 + (top - 1.0) * (i / (n - 1)) ** 2, 4) for i in range(n)]


# Released checkpoints' RoPE facts (their config.json values; lengths scaled down where the
# value only sets a switch point, with the ratios that set the scales kept).
CHECKPOINTS: dict[str, tuple[Checkpoint, ...]] = {
    "llama": (
        Checkpoint(
            "llama3",
            "meta-llama/Llama-3.1-8B",
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 500000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                },
                "max_position_embeddings": 131072,
            },
        ),
        Checkpoint(
            "linear",
            "lmsys/vicuna-7b-v1.5-16k",
            {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}},
        ),
        Checkpoint(
            "dynamic",
            "Llama 2 + dynamic NTK factor 2 (transformers docs)",
            {
                "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
                "max_position_embeddings": 32,
            },
            lengths=(SEQ, 48),
        ),
    ),
    "llama4_text": (
        Checkpoint(
            "scout",
            "meta-llama/Llama-4-Scout-17B-16E (llama3, low_freq_factor == high_freq_factor)",
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 500000.0,
                    "factor": 16.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 1.0,
                    "original_max_position_embeddings": 8192,
                },
                "max_position_embeddings": 10485760,
            },
        ),
    ),
    "phi3": (
        Checkpoint(
            "longrope",
            "microsoft/Phi-3.5-mini-instruct (lengths / 64)",
            {
                "rope_parameters": {
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "short_factor": _lr_factors(48, 2.84),
                    "long_factor": _lr_factors(48, 64.84),
                },
                "original_max_position_embeddings": 64,
                "max_position_embeddings": 2048,
                "hidden_size": 192,  # head_dim 96, as hidden 3072 / 32 heads
            },
            lengths=(SEQ, 72),
        ),
    ),
    "phimoe": (
        Checkpoint(
            "longrope",
            "microsoft/Phi-3.5-MoE-instruct (short/long_mscale 1.243; lengths / 64)",
            {
                "rope_parameters": {
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "short_factor": _lr_factors(64, 2.75),
                    "long_factor": _lr_factors(64, 64.5),
                    "short_mscale": 1.243163121016122,
                    "long_mscale": 1.243163121016122,
                    "original_max_position_embeddings": 64,
                },
                "max_position_embeddings": 2048,
            },
            lengths=(SEQ, 72),
        ),
    ),
    "qwen2": (
        Checkpoint(
            "qwen25_yarn",
            "Qwen/Qwen2.5-7B-Instruct (model card YaRN)",
            {
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 1000000.0,
                    "factor": 4.0,
                    "original_max_position_embeddings": 32768,
                },
                "max_position_embeddings": 131072,
            },
        ),
    ),
    "deepseek_v2": (
        Checkpoint(
            "v2_lite",
            "deepseek-ai/DeepSeek-V2-Lite",
            {
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 10000.0,
                    "factor": 40.0,
                    "original_max_position_embeddings": 4096,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "mscale": 0.707,
                    "mscale_all_dim": 0.707,
                },
                "max_position_embeddings": 163840,
            },
        ),
    ),
    "deepseek_v3": (
        Checkpoint(
            "v3",
            "deepseek-ai/DeepSeek-V3",
            {
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 10000.0,
                    "factor": 40.0,
                    "original_max_position_embeddings": 4096,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "mscale": 1.0,
                    "mscale_all_dim": 1.0,
                },
                "max_position_embeddings": 163840,
            },
        ),
    ),
    "olmo3": (
        Checkpoint(
            "olmo3_think",
            "allenai/Olmo-3-7B-Think (v4: rope_scaling + layer_types)",
            v4={
                "rope_theta": 500000.0,
                "rope_scaling": {
                    "rope_type": "yarn",
                    "factor": 8.0,
                    "original_max_position_embeddings": 8192,
                    "attention_factor": 1.2079441541679836,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                },
                "max_position_embeddings": 65536,
            },
        ),
    ),
    "gemma3_text": (
        Checkpoint(
            "linear",
            "google/gemma-3-4b-it (v4: rope_local_base_freq, linear factor 8)",
            v4={
                "rope_theta": 1000000.0,
                "rope_local_base_freq": 10000.0,
                "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            },
        ),
    ),
    "gemma3n_text": (
        Checkpoint(
            "local_base",
            "google/gemma-3n-E4B (v4: rope_local_base_freq)",
            v4={"rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": None},
        ),
    ),
    "modernbert": (
        Checkpoint(
            "global_local",
            "answerdotai/ModernBERT-base (v4: global_rope_theta / local_rope_theta)",
            v4={"global_rope_theta": 160000.0, "local_rope_theta": 10000.0, "rope_theta": None},
        ),
    ),
    "minimax_m2": (
        Checkpoint(
            "rotary_dim",
            "MiniMaxAI/MiniMax-M2 (head_dim 128, rotary_dim 64)",
            v4={"rotary_dim": 64, "head_dim": 128, "rope_theta": 5000000.0},
        ),
    ),
    "gpt_oss": (
        Checkpoint(
            "gpt_oss_20b",
            "openai/gpt-oss-20b",
            {
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 150000.0,
                    "factor": 32.0,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "truncate": False,
                    "original_max_position_embeddings": 4096,
                },
            },
        ),
    ),
    "hunyuan_v1_dense": (
        Checkpoint(
            "ntk_alpha",
            "tencent/Hunyuan-7B-Instruct (dynamic + alpha 1000)",
            {
                "rope_parameters": {
                    "rope_type": "dynamic",
                    "alpha": 1000.0,
                    "factor": 1.0,
                    "rope_theta": 10000.0,
                },
                "head_dim": 128,
            },
        ),
    ),
    "cohere": (
        Checkpoint(
            "command_r",
            "CohereForAI/c4ai-command-r-v01",
            {"rope_parameters": {"rope_type": "default", "rope_theta": 8000000.0}},
        ),
    ),
    "cohere2": (
        Checkpoint(
            "command_r7b",
            "CohereForAI/c4ai-command-r7b-12-2024",
            {"rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}},
        ),
    ),
    "glm": (
        Checkpoint(
            "glm4_9b",
            "THUDM/glm-4-9b-chat-hf (partial_rotary_factor 0.5)",
            {
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.5,
                },
                "head_dim": 128,
            },
        ),
    ),
    "exaone4": (
        Checkpoint(
            "llama3",
            "LGAI-EXAONE/EXAONE-4.0-32B",
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 1000000.0,
                    "factor": 16.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                },
                "max_position_embeddings": 131072,
            },
        ),
    ),
    "gpt_neox": (
        Checkpoint(
            "rotary_pct",
            "EleutherAI/gpt-neox-20b (v4: rotary_pct 0.25, rotary_emb_base)",
            v4={"rotary_pct": 0.25, "rotary_emb_base": 10000, "rope_theta": None},
        ),
    ),
    "phi": (
        Checkpoint(
            "phi2",
            "microsoft/phi-2 (partial_rotary_factor 0.4)",
            v4={"partial_rotary_factor": 0.4, "rope_theta": 10000.0, "hidden_size": 160},
        ),
    ),
    "stablelm": (
        Checkpoint(
            "stablelm2",
            "stabilityai/stablelm-2-1_6b (partial_rotary_factor 0.25)",
            v4={"partial_rotary_factor": 0.25, "rope_theta": 10000},
        ),
    ),
}

GENERIC_VARIANTS = ("default", "yarn")
"""Every model type: its class defaults, and YaRN factor 4 over a quarter of its length."""

FORMS = ("v5", "v4")


def sweep_cases() -> list[tuple[str, str, str]]:
    """(model_type, variant, form) for every case, in a stable order."""
    cases = []
    for model_type in rotary_model_types():
        for variant in GENERIC_VARIANTS:
            cases += [(model_type, variant, form) for form in FORMS]
        for checkpoint in CHECKPOINTS.get(model_type, ()):
            cases += [
                (model_type, checkpoint.name, f) for f in case_forms(model_type, checkpoint.name)
            ]
    return cases


class UnbuildableError(Exception):
    """transformers cannot build or run the case's tiny model: the reason is the message."""


def _config_class(model_type: str) -> Any:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


def _text_config(config: Any) -> Any:
    try:
        text = config.get_text_config(decoder=True)
    except ValueError:
        text = getattr(config, "text_config", None)
    # A text config that is no attribute of the config (Moonshine returns a copy of itself, or a
    # plain dict) is the config itself: its model reads the top level.
    if text is None or not any(v is text for v in vars(config).values()):
        return config
    return text


def _text_key(config: Any, text: Any) -> str:
    """The attribute holding the text sub-config (`text_config`; Dia's `decoder_config`)."""
    return next(k for k, v in vars(config).items() if v is text)


def _per_layer_attrs(config: Any, layers: int) -> dict[str, list[Any]]:
    return {
        name: value
        for name, value in vars(config).items()
        if isinstance(value, list) and len(value) == layers and not name.startswith("_")
    }


def _special_ids(config: Any) -> int:
    """The largest pad/bos/eos token id of the config, so a shrunk vocabulary holds it."""
    top = 0
    for name, value in vars(config).items():
        if name == "decoder_start_token_id":
            values = value if isinstance(value, list) else [value]
            top = max([top, *(v for v in values if isinstance(v, int))])
    return top


def _shrink(text: Any) -> dict[str, Any]:
    """Keyword overrides that make the text config tiny with its rotary geometry unchanged: a few
    layers covering every layer type (and the first four indices, where NoPE patterns start), two
    query and two key/value heads of the same head_dim, small MLPs and vocabulary."""
    kwargs: dict[str, Any] = {}
    layers = getattr(text, "num_hidden_layers", None)
    if isinstance(layers, int) and layers > 0:
        types = getattr(text, "layer_types", None)
        keep = set(range(min(_MIN_LAYERS, layers)))
        if isinstance(types, list):
            keep |= {types.index(t) for t in dict.fromkeys(types)}
        indices = sorted(keep)
        kwargs["num_hidden_layers"] = len(indices)
        for name, values in _per_layer_attrs(text, layers).items():
            kwargs[name] = [values[i] for i in indices]
        per_layer = text.to_dict().get("per_layer_config")
        if isinstance(per_layer, dict):
            kwargs["per_layer_config"] = {
                str(indices.index(int(k))).zfill(len(str(k))): v
                for k, v in per_layer.items()
                if int(k) in indices
            }
        if isinstance(getattr(text, "num_kv_shared_layers", None), int):
            kwargs["num_kv_shared_layers"] = 0
    heads = getattr(text, "num_attention_heads", None)
    hidden = getattr(text, "hidden_size", None)
    head_dim = getattr(text, "head_dim", None)
    if isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
        if not head_dim:
            head_dim = hidden // heads
        params = inspect.signature(type(text).__init__).parameters
        kwargs["num_attention_heads"] = 2
        if hasattr(text, "num_key_value_heads"):
            kwargs["num_key_value_heads"] = 2
        kwargs["hidden_size"] = 2 * int(head_dim)
        settable = not isinstance(getattr(type(text), "head_dim", None), property)
        if settable and ("head_dim" in params or hasattr(text, "head_dim")):
            kwargs["head_dim"] = int(head_dim)
    for name, value in _SMALL.items():
        current = kwargs.get(name, getattr(text, name, None))
        if isinstance(current, int) and not isinstance(current, bool) and current > value:
            kwargs[name] = value
        elif isinstance(current, list) and all(isinstance(v, int) for v in current):
            kwargs[name] = [min(v, value) for v in current]
    if "vocab_size" in kwargs:
        # Token ids do not touch positions: small ones let the vocabulary shrink.
        for index, name in enumerate(("pad_token_id", "bos_token_id", "eos_token_id")):
            value = getattr(text, name, None)
            if isinstance(value, int):
                kwargs[name] = index
            elif isinstance(value, list) and value:
                kwargs[name] = [index]
        kwargs["vocab_size"] = max(kwargs["vocab_size"], _special_ids(text) + 1)
    experts = any(
        isinstance(getattr(text, n, None), int)
        for n in ("n_routed_experts", "num_experts", "num_local_experts")
    )
    if experts and hasattr(text, "num_experts_per_tok") and text.num_experts_per_tok is None:
        kwargs["num_experts_per_tok"] = 2
    return kwargs


def _open(config: Any) -> Any:
    """Let heterogeneous (per-layer) configs answer global attribute reads."""
    if hasattr(config, "allow_global_per_layer_attribute_access"):
        config.allow_global_per_layer_attribute_access = True
    return config


def _merge_rope(text: Any, rope: Mapping[str, Any]) -> Any:
    """`rope` applied to the text config's rope_parameters: flat, or to every non-null layer type
    of a nested dict (scaling of released checkpoints applies to all rotated layer types, except
    where the checkpoint's own dict says otherwise)."""
    current = copy.deepcopy(getattr(text, "rope_parameters", None) or {})
    labels = set(getattr(text, "layer_types", None) or ()) | set(
        getattr(text, "_rope_type_labels", None) or ()
    )
    nested = [k for k in current if k in labels]
    if nested:
        for key in nested:
            if current[key] is not None and current[key].get("rope_type", "default") == "default":
                current[key] = {**current[key], **rope}
        return current
    return {**current, **rope}


def _yarn(text: Any) -> dict[str, Any]:
    mpe = getattr(text, "max_position_embeddings", None) or 4096
    return {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": max(mpe // 4, 64),
    }


def build_v5(model_type: str, variant: str) -> dict[str, Any]:
    """The case's config.json in the v5 form (`to_dict()` of the shrunk, varied config)."""
    result = _build_cached(model_type, variant)
    if isinstance(result, Exception):
        raise result
    return copy.deepcopy(result)


@functools.lru_cache(maxsize=4)
def _build_cached(model_type: str, variant: str) -> dict[str, Any] | Exception:
    """The case's v5 config.json, or the exception building it raised: an `UnbuildableError`
    (transformers' own failure) or any other (the harness's: `harness_failure`)."""
    try:
        return _build_v5(model_type, variant)
    except Exception as err:
        return err


_FALLBACKS: dict[tuple[str, str], str] = {}
"""(model_type, variant) -> why the shrunk config failed, for the cases built instead from the
unshrunk class defaults (`_unshrunk`): the harness's own limits, never a reason to skip posenc."""


def fallback_reason(model_type: str, variant: str) -> str | None:
    """Why the case's config is the unshrunk class defaults (None: it is shrunk)."""
    build_v5(model_type, variant)
    return _FALLBACKS.get((model_type, variant))


def _variant(text: Any, model_type: str, variant: str) -> tuple[dict[str, Any], set[str]]:
    """The text-config keyword overrides of the variant and the keys it sets."""
    checkpoint = next((c for c in CHECKPOINTS.get(model_type, ()) if c.name == variant), None)
    if variant == "yarn":
        if not getattr(text, "rope_parameters", None):
            raise UnbuildableError("the config class has no rope_parameters to vary")
        return {"rope_parameters": _merge_rope(text, _yarn(text))}, {"rope_parameters"}
    if checkpoint is not None:
        extra = dict(checkpoint.kwargs)
        if "rope_parameters" in extra:
            extra["rope_parameters"] = _merge_rope(text, extra["rope_parameters"])
        return extra, set(extra)
    return {}, set()


def _build_v5(model_type: str, variant: str) -> dict[str, Any]:
    """The shrunk config (`_shrunk`); where the harness cannot shrink it (an attribute, key or
    validator of the config class it does not know), the class defaults unshrunk with only the
    variant's keys set (`_unshrunk`: its rotary module is judged when the whole model is too
    large). A failure of the class defaults themselves is transformers' (`UnbuildableError`)."""
    cls = _config_class(model_type)
    with _quiet():
        try:
            default = cls()
        except Exception as err:
            raise UnbuildableError(f"{cls.__name__}() fails: {type(err).__name__}: {err}") from None
        text = _open(_text_config(default))
        overrides, varied = _variant(text, model_type, variant)
        try:
            data = _shrunk(cls, default, text, overrides, varied)
        except Exception as err:
            _FALLBACKS[(model_type, variant)] = f"{type(err).__name__}: {str(err)[:160]}"
            data = _unshrunk(default, text, overrides)
    checkpoint = next((c for c in CHECKPOINTS.get(model_type, ()) if c.name == variant), None)
    if checkpoint is not None and checkpoint.v4 is not None:
        data = to_v4(data)
        part = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
        for key, value in checkpoint.v4.items():
            if value is None:
                part.pop(key, None)
            else:
                part[key] = copy.deepcopy(value)
    return data


def _json(config: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(config.to_dict(), default=str))
    for part in (data, data.get("text_config")):
        if isinstance(part, dict):
            part.pop("allow_global_per_layer_attribute_access", None)
    return data


def _unshrunk(default: Any, text: Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The class defaults' config.json with the variant's keys written into its text part, as a
    hand-edited file would carry them."""
    data = _json(default)
    part = data if text is default else data[_text_key(default, text)]
    for key, value in overrides.items():
        part[key] = json.loads(json.dumps(value, default=str))
    return data


def _shrunk(
    cls: Any, default: Any, text: Any, overrides: Mapping[str, Any], varied: set[str]
) -> dict[str, Any]:
    kwargs = {**_shrink(text), **overrides}
    if "hidden_size" in overrides:
        kwargs.pop("head_dim", None)
    config = None
    failure: Exception | None = None
    # A composite config may check token ids against the text vocabulary: keep it then. A
    # config whose validators refuse any shrinking (Mamba hybrids tie layer and state sizes) is
    # kept at full size with only the variant's keys: its rotary module is judged alone
    # (`module_reference`) when the model is too large to build.
    unshrunk = {k: v for k, v in kwargs.items() if k not in _shrink(text) or k in varied}
    attempts = (kwargs, {k: v for k, v in kwargs.items() if k != "vocab_size"}, unshrunk)
    for attempt in attempts:
        try:
            if text is default:
                config = cls(**{**_plain(default), **attempt})
            else:
                text_data = {**_plain(text), **attempt}
                type(text)(**copy.deepcopy(text_data))  # the text part alone must build
                config = cls(**{**_plain(default), _text_key(default, text): text_data})
            break
        except Exception as err:
            failure = err
    if config is None:
        raise UnbuildableError(
            f"shrunk config fails: {type(failure).__name__}: {str(failure)[:200]}"
        ) from None
    return _json(config)


def _plain(config: Any) -> dict[str, Any]:
    data = config.to_dict()
    for key in ("model_type", "transformers_version", "architectures", "_name_or_path"):
        data.pop(key, None)
    return data


def _per_layer_type(params: Any) -> bool:
    return (
        isinstance(params, dict)
        and bool(params)
        and all(isinstance(v, dict) or v is None for v in params.values())
    )


def to_v4(data: Mapping[str, Any], nested: bool = False) -> dict[str, Any]:
    """The v4 config.json of a v5 one: `rope_parameters` becomes top-level `rope_theta` and
    `partial_rotary_factor` plus `rope_scaling` (omitted for the default type); a per-layer-type
    dict is written as its full-attention (else first) entry, as v4 files carried one, or with
    `nested` as the per-layer-type dict itself under `rope_scaling` (`case_config`: for classes
    whose v4 reading takes no single entry)."""
    out = copy.deepcopy(dict(data))
    part = out.get("text_config") if isinstance(out.get("text_config"), dict) else out
    params = part.pop("rope_parameters", None)
    if not isinstance(params, dict) or not params:
        return out
    if nested and _per_layer_type(params):
        part["rope_scaling"] = params
        return out
    if _per_layer_type(params):
        chosen = params.get("full_attention") or next(
            (v for v in params.values() if isinstance(v, dict)), {}
        )
        params = dict(chosen)
    params = dict(params)
    theta = params.pop("rope_theta", None)
    if theta is not None:
        part["rope_theta"] = theta
    prf = params.pop("partial_rotary_factor", None)
    if prf is not None:
        part["partial_rotary_factor"] = prf
    params.pop("type", None)
    if params.get("rope_type", "default") != "default":
        part["rope_scaling"] = params
    return out


def case_config(model_type: str, variant: str, form: str) -> dict[str, Any]:
    """The case's config.json: the v5 form, or its v4 form (`to_v4`; per-layer-type rope
    parameters nested under `rope_scaling` where transformers cannot read the single entry)."""
    v5 = build_v5(model_type, variant)
    part = v5.get("text_config") if isinstance(v5.get("text_config"), dict) else v5
    if form == "v4" and "rope_parameters" in part:
        v4 = to_v4(v5)
        layer_types = part["rope_parameters"]
        if _per_layer_type(layer_types) and not _reads_layer_types(v4, set(layer_types)):
            return to_v4(v5, nested=True)
        return v4
    return v5


def _reads_layer_types(data: Mapping[str, Any], layer_types: set[str]) -> bool:
    """transformers loads `data` with rope parameters for each of `layer_types` (a class whose
    v4 reading keeps one flat dict fails or builds a model that looks a layer type up)."""
    try:
        params = getattr(_text_config(load_config(data)), "rope_parameters", None)
    except Exception:
        return False
    return _per_layer_type(params) and layer_types <= set(params)


def case_forms(model_type: str, variant: str) -> tuple[str, ...]:
    """The config.json forms the sweep writes for this variant (`sweep_cases`)."""
    checkpoint = next((c for c in CHECKPOINTS.get(model_type, ()) if c.name == variant), None)
    return ("v4",) if checkpoint is not None and checkpoint.v4 is not None else FORMS


def case_lengths(model_type: str, variant: str) -> tuple[int, ...]:
    checkpoint = next((c for c in CHECKPOINTS.get(model_type, ()) if c.name == variant), None)
    return (checkpoint.lengths if checkpoint and checkpoint.lengths else None) or (SEQ,)


# ---------------------------------------------------------------------------------------------
# The reference: the model's own forward, its rotation recorded per layer


@dataclass
class LayerCapture:
    """One layer's first rotation: q/k before and after (B, ., ., D) and the cos/sin it used."""

    q_in: torch.Tensor
    k_in: torch.Tensor
    q_out: torch.Tensor
    k_out: torch.Tensor
    cos: torch.Tensor | None
    sin: torch.Tensor | None
    freqs: torch.Tensor | None  # complex frequencies (Llama 4, DeepSeek-V2)
    function: str


@dataclass
class Reference:
    """What the model did: rotated layers, NoPE layers (attention without rotation), layer types."""

    length: int
    layers: dict[int, LayerCapture]
    nope: list[int]
    layer_types: list[str] | None
    text_model_type: str
    module_only: bool = False
    """True when only the rotary module and the apply function ran (`module_reference`): the
    model's NoPE layers and its layer-to-table wiring were not observed."""


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            transformers.logging.set_verbosity(level)


def load_config(data: Mapping[str, Any]) -> Any:
    """transformers' reading of a config.json dict (what `from_pretrained` does with the file)."""
    cls = _config_class(str(data["model_type"]))
    with _quiet():
        return cls.from_dict(json.loads(json.dumps(data)))


def _apply_functions(module: Any) -> dict[str, Callable[..., Any]]:
    return {
        name: fn
        for name, fn in vars(module).items()
        if name.startswith("apply_rotary")
        and callable(fn)
        and not any(w in name for w in ("vision", "2d", "time"))
    }


def _decoder_layers(model: torch.nn.Module, count: int) -> torch.nn.ModuleList | None:
    for _, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return module
    return None


def _is_attention(module: torch.nn.Module) -> bool:
    name = type(module).__name__
    return (
        name.endswith("Attention")
        and "Linear" not in name
        and "Cross" not in name
        and not any(w in name.lower() for w in (*VISION_WORDS, *NOT_SOFTMAX))
    )


def _unpack(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return {}
    return dict(bound.arguments)


def _record(
    calls: dict[int, list[tuple[str, dict[str, Any], Any]]], state: dict[str, int]
) -> Callable[[str, Callable[..., Any]], Callable[..., Any]]:
    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = fn(*args, **kwargs)
            bound = _unpack(fn, args, kwargs)
            calls.setdefault(state["layer"], []).append((name, bound, result))
            return result

        return wrapper

    return wrap


def _capture_layer(entries: list[tuple[str, dict[str, Any], Any]]) -> LayerCapture | None:
    """q/k in and out from the layer's apply calls: (q, k, cos, sin) -> (q, k), (xq, xk,
    freqs_cis) -> (xq, xk), or one tensor per call (GPT-J: q first, then k)."""
    singles: list[tuple[str, dict[str, Any], Any]] = []
    for name, bound, result in entries:
        tensors = {k: v for k, v in bound.items() if isinstance(v, torch.Tensor)}
        names = list(tensors)
        q_name = next((n for n in names if n in ("q", "xq", "query", "query_states")), None)
        k_name = next((n for n in names if n in ("k", "xk", "key", "key_states")), None)
        freqs = next((tensors[n] for n in names if "freq" in n), None)
        cos, sin = tensors.get("cos"), tensors.get("sin")
        if q_name and k_name and isinstance(result, tuple) and len(result) >= 2:
            return LayerCapture(
                tensors[q_name], tensors[k_name], result[0], result[1], cos, sin, freqs, name
            )
        if isinstance(result, torch.Tensor):
            singles.append((name, bound, result))
    if len(singles) >= 2:
        (name, b1, r1), (_, b2, r2) = singles[:2]
        x1 = next(
            v for k, v in b1.items() if isinstance(v, torch.Tensor) and k not in ("cos", "sin")
        )
        x2 = next(
            v for k, v in b2.items() if isinstance(v, torch.Tensor) and k not in ("cos", "sin")
        )
        return LayerCapture(x1, x2, r1, r2, b1.get("cos"), b1.get("sin"), None, name)
    return None


Builder = Callable[[dict[str, Any], int], Reference]


def _memoised(label: str) -> Callable[[Builder], Callable[[str, int], Reference]]:
    """A reference builder memoised by (config JSON, length), its failures too: each config runs
    once per worker; an unexpected exception becomes an `UnbuildableError` naming `label`."""

    def wrap(build: Builder) -> Callable[[str, int], Reference]:
        @functools.lru_cache(maxsize=8)
        def cached(key: str, length: int) -> Reference | UnbuildableError:
            try:
                return build(json.loads(key), length)
            except UnbuildableError as err:
                return err
            except Exception as err:
                return UnbuildableError(f"{label}: {type(err).__name__}: {str(err)[:200]}")

        def run(key: str, length: int) -> Reference:
            result = cached(key, length)
            if isinstance(result, UnbuildableError):
                raise result
            return result

        return run

    return wrap


def reference(data: Mapping[str, Any], length: int = SEQ) -> Reference:
    """The model's rotation for this config.json over positions 0..length-1 (memoised by the
    config transformers loads, so the v4 and v5 forms of one config run the model once)."""
    config = load_config(data)
    key = json.dumps(config.to_dict(), sort_keys=True, default=str)
    return _reference(key, length)


def _text_model(text: Any) -> torch.nn.Module:
    """AutoModel for the text config, else the modeling module's `*Model` whose config_class it
    is (text parts of composite models that AutoModel does not list)."""
    from transformers import AutoModel

    try:
        return AutoModel.from_config(text, attn_implementation="eager")
    except ValueError as err:
        if "Unrecognized configuration class" not in str(err):
            raise
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    name = model_type_to_module_name(str(text.model_type))
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name.split('.')[-1]}")
    candidates = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, torch.nn.Module)
        and getattr(obj, "config_class", None) is type(text)
        and obj.__name__.endswith("Model")
    ]
    if not candidates:
        raise UnbuildableError(f"no model class for {type(text).__name__}")
    chosen = min(candidates, key=lambda c: len(c.__name__))
    return chosen._from_config(text, attn_implementation="eager")  # type: ignore[attr-defined]


@_memoised("reference")
def _reference(data: dict[str, Any], length: int) -> Reference:
    config = load_config(data)
    text = _open(_text_config(config))
    try:
        with _quiet():
            with torch.device("meta"):
                shape = _text_model(text)
            size = sum(p.numel() for p in shape.parameters())
            if size > MAX_PARAMS:
                raise UnbuildableError(
                    f"{size / 1e6:.0f}M parameters after shrinking (limit {MAX_PARAMS / 1e6:.0f}M)"
                )
            torch.manual_seed(0)
            model = _text_model(text)
    except UnbuildableError:
        raise
    except Exception as err:
        raise UnbuildableError(
            f"AutoModel.from_config: {type(err).__name__}: {str(err)[:200]}"
        ) from None
    model.eval()
    module = sys.modules[type(model).__module__]
    functions = _apply_functions(module)
    if not functions:
        raise UnbuildableError(f"{type(model).__name__}'s module has no apply_rotary function")
    count = int(getattr(text, "num_hidden_layers", 0) or 0)
    layers = _decoder_layers(model, count)
    if layers is None:
        raise UnbuildableError(f"no ModuleList of num_hidden_layers={count} layers")
    calls: dict[int, list[tuple[str, dict[str, Any], Any]]] = {}
    attention: set[int] = set()
    state = {"layer": -1}
    handles = []
    for index, layer in enumerate(layers):

        def enter(_mod: Any, _args: Any, index: int = index) -> None:
            state["layer"] = index

        handles.append(layer.register_forward_pre_hook(enter))
        for sub in layer.modules():
            if _is_attention(sub):

                def seen(_mod: Any, _args: Any, index: int = index) -> None:
                    attention.add(index)

                handles.append(sub.register_forward_pre_hook(seen))
    wrap = _record(calls, state)
    saved = dict(functions)
    for name, fn in functions.items():
        setattr(module, name, wrap(name, fn))
    vocab = int(getattr(text, "vocab_size", 0) or 0)
    ids = (torch.arange(length) % max(vocab - 1, 1) + 1)[None]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only contend with the other workers
    try:
        with torch.no_grad(), _quiet():
            try:
                model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
            except TypeError:
                model(input_ids=ids)
    except Exception as err:
        raise UnbuildableError(f"forward: {type(err).__name__}: {str(err)[:200]}") from None
    finally:
        torch.set_num_threads(threads)
        for name, fn in saved.items():
            setattr(module, name, fn)
        for handle in handles:
            handle.remove()
    captured = {}
    for index, entries in calls.items():
        if index < 0:
            continue
        layer_capture = _capture_layer(entries)
        if layer_capture is not None:
            captured[index] = layer_capture
    if not captured:
        raise UnbuildableError("the text model's forward never called its apply_rotary function")
    types = getattr(text, "layer_types", None)
    if isinstance(types, list):
        attention = {i for i in attention if not any(w in str(types[i]) for w in NOT_SOFTMAX)}
    return Reference(
        length=length,
        layers=captured,
        nope=sorted(attention - set(captured)),
        layer_types=list(types) if isinstance(types, list) else None,
        text_model_type=str(text.model_type),
    )


# ---------------------------------------------------------------------------------------------
# The rotary module alone: when transformers cannot build or run the whole tiny model


@functools.cache
def _class_lines(filename: str) -> dict[str, int]:
    """qualname -> 0-based first line (its first decorator's) of every class defined in the
    file, the first definition of each name in source order: what `inspect.findsource` finds for
    a class (its `_ClassFinder`), from one parse of the file instead of one per class."""
    lines = linecache.getlines(filename)
    found: dict[str, int] = {}

    def visit(node: ast.AST, stack: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                qualname = ".".join((*stack, child.name))
                first = child.decorator_list[0] if child.decorator_list else child
                found.setdefault(qualname, first.lineno - 1)
                visit(child, (*stack, child.name))
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, (*stack, child.name, "<locals>"))
            else:
                visit(child, stack)

    visit(ast.parse("".join(lines)), ())
    return found


@functools.cache
def source(obj: Any) -> str:
    """`inspect.getsource(obj)`, once per object, and for a class from one parse of its file
    (`_class_lines`): Python 3.11's `inspect` parses the whole modeling file on every class it
    is asked for, and the sweeps ask for the same classes in every case of a model type (a
    quarter of the sweep's time) and for every class of a module (`test_axial_only.py`)."""
    if isinstance(obj, type):
        filename = inspect.getsourcefile(obj)
        start = _class_lines(filename).get(obj.__qualname__) if filename else None
        if filename and start is not None:
            return "".join(inspect.getblock(linecache.getlines(filename)[start:]))
    return inspect.getsource(obj)


def _modeling_module(text: Any) -> Any:
    """The modeling module beside the text config's class (`configuration_x` -> `modeling_x`)."""
    name = type(text).__module__.replace(".configuration_", ".modeling_")
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise UnbuildableError(f"no modeling module {name}: {err}") from None


def _text_rotary_class(module: Any, text: Any) -> type[torch.nn.Module]:
    """The module's one text `*RotaryEmbedding` class (vision/audio rotaries are issue 18's);
    of several, the one the classes configured by `text` construct."""
    found = [
        obj
        for name, obj in vars(module).items()
        if isinstance(obj, type)
        and issubclass(obj, torch.nn.Module)
        and name.endswith("RotaryEmbedding")
        and obj.__module__ == module.__name__
        and not any(w in name.lower() for w in VISION_WORDS)
    ]
    if len(found) > 1:
        built: set[str] = set()
        for obj in vars(module).values():
            if isinstance(obj, type) and getattr(obj, "config_class", None) is type(text):
                built |= set(re.findall(r"\b(\w+RotaryEmbedding)\(", source(obj)))
        found = [c for c in found if c.__name__ in built] or found
    if len(found) != 1:
        names = sorted(c.__name__ for c in found)
        raise UnbuildableError(f"rotary module: {len(found)} text rotary classes {names}")
    return found[0]


_APPLY_CALL = re.compile(r"\b(apply_rotary\w*)\(")


def _attention_apply(module: Any) -> tuple[str, Callable[..., Any]]:
    """The apply function the module's (text, softmax) attention classes call: read from their
    source, so that a module with several (`apply_rotary_pos_emb` and `..._interleave`) is
    judged by the one its attention uses; several called (a choice at run time) is not judged."""
    functions = _apply_functions(module)
    called: set[str] = set()
    for name, obj in vars(module).items():
        if (
            isinstance(obj, type)
            and issubclass(obj, torch.nn.Module)
            and obj.__module__ == module.__name__
            and name.endswith("Attention")
            and not any(w in name.lower() for w in (*VISION_WORDS, *NOT_SOFTMAX))
        ):
            called |= set(_APPLY_CALL.findall(source(obj))) & set(functions)
    if not called and len(functions) == 1:
        called = set(functions)
    if len(called) != 1:
        raise UnbuildableError(
            f"rotary module: the attention calls {sorted(called) or 'no'} apply function(s)"
        )
    name = called.pop()
    return name, functions[name]


def _rotary_outputs(
    rotary: torch.nn.Module, length: int, layer_type: str | None
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(cos, sin, complex freqs) of the rotary module's forward over positions 0..length-1."""
    x = torch.zeros(1, length, 2)
    position_ids = torch.arange(length)[None]
    kwargs = {} if layer_type is None else {"layer_type": layer_type}
    with torch.no_grad():
        out = rotary(x, position_ids, **kwargs)
    if isinstance(out, torch.Tensor) and out.is_complex():
        return None, None, out
    if isinstance(out, tuple) and len(out) == 2:
        cos, sin = out
        if cos.dim() > 3 or (cos.dim() == 3 and cos.shape[0] != 1):
            raise UnbuildableError(
                f"rotary module: cos of shape {tuple(cos.shape)} (multimodal RoPE: issue 18)"
            )
        return cos, sin, None
    raise UnbuildableError(f"rotary module: forward returned {type(out).__name__}")


def _apply_once(
    name: str,
    fn: Callable[..., Any],
    width: int,
    length: int,
    tables: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None],
) -> LayerCapture | None:
    """The apply function on random q/k of `width` channels (two heads), in the (B, H, S, D)
    layout and else (B, S, H, D); None when neither fits its signature or shapes."""
    cos, sin, freqs = tables
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    # One tensor at a time (`apply_rotary_pos_emb(x, cos, sin)`: Gemma 4, DiffusionGemma) or q
    # and k together.
    single = len(params) > 1 and "cos" in params[1].name
    generator = torch.Generator().manual_seed(0)
    for shape in ((1, 2, length, width), (1, length, 2, width)):
        q = torch.randn(shape, generator=generator)
        k = torch.randn(shape, generator=generator)
        args: dict[str, Any] = {} if single else {params[0].name: q, params[1].name: k}
        for p in params[1 if single else 2 :]:
            if "cos" in p.name and cos is not None:
                args[p.name] = cos
            elif "sin" in p.name and sin is not None:
                args[p.name] = sin
            elif "freq" in p.name and freqs is not None:
                args[p.name] = freqs
            elif p.default is p.empty:
                return None
        try:
            with torch.no_grad():
                out = (fn(q, **args), fn(k, **args)) if single else fn(**args)
        except (RuntimeError, IndexError, ValueError, TypeError):
            continue
        if (
            isinstance(out, tuple)
            and len(out) >= 2
            and out[0].shape == q.shape
            and out[1].shape == k.shape
        ):
            return LayerCapture(q, k, out[0], out[1], cos, sin, freqs, name)
    return None


def _widths(text: Any, tables: tuple[Any, Any, Any]) -> list[int]:
    """q/k widths to try: the attention's head_dim (the apply function then decides which
    channels rotate), the rope part of MLA heads, and the table's own width."""
    heads = getattr(text, "num_attention_heads", None)
    hidden = getattr(text, "hidden_size", None)
    widths = [
        getattr(text, "head_dim", None),
        hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None,
        getattr(text, "qk_rope_head_dim", None),
    ]
    cos, _, freqs = tables
    table = cos if cos is not None else freqs
    if table is not None:
        widths.append(int(table.shape[-1]) * (2 if freqs is not None else 1))
    return [w for w in dict.fromkeys(widths) if isinstance(w, int) and w > 0]


def _own_rotary(
    module: Any, text: Any
) -> tuple[type[torch.nn.Module], str, Callable[..., Any]] | None:
    """The `*RotaryEmbedding` class of any name (an audio/speech one: Dots3NoteAudio..., PeAudio
    Encoder..., KyutaiSpeechToText...) that `text`'s own config class configures (its `config`
    annotation names that class; else the module's only rotary class), with the apply function
    that its `<prefix>Attention` class calls, where the rotary class's forward is 1-D (no
    mrope_section); None otherwise."""
    classes = [
        obj
        for name, obj in vars(module).items()
        if isinstance(obj, type)
        and issubclass(obj, torch.nn.Module)
        and name.endswith("RotaryEmbedding")
        and obj.__module__ == module.__name__
    ]
    annotated = [
        c
        for c in classes
        if (p := inspect.signature(c.__init__).parameters.get("config")) is not None
        and p.annotation is type(text)
    ]
    found = annotated if annotated else classes
    if len(found) != 1 or "mrope_section" in source(found[0]):
        return None
    cls = found[0]
    attention = vars(module).get(cls.__name__.removesuffix("RotaryEmbedding") + "Attention")
    functions = _apply_functions(module)
    if attention is None:
        return None
    called = set(_APPLY_CALL.findall(source(attention))) & set(functions)
    if len(called) != 1:
        return None
    name = called.pop()
    return cls, name, functions[name]


@_memoised("rotary module")
def _module_reference(data: dict[str, Any], length: int) -> Reference:
    config = load_config(data)
    text = _open(_text_config(config))
    params = getattr(text, "rope_parameters", None) or {}
    if isinstance(params, Mapping) and any(
        isinstance(v, Mapping) and "mrope_section" in v for v in (params, *params.values())
    ):
        raise UnbuildableError("rotary module: multimodal RoPE (mrope_section: issue 18)")
    module = _modeling_module(text)
    try:
        cls = _text_rotary_class(module, text)
        if "mrope_section" in source(cls):
            raise UnbuildableError(
                f"rotary module: {cls.__name__} applies mrope_section (multimodal RoPE: issue 18)"
            )
        name, fn = _attention_apply(module)
        try:
            with _quiet():
                rotary = cls(config=text)
        except Exception as err:
            raise UnbuildableError(
                f"rotary module: {cls.__name__}(config): {type(err).__name__}: {str(err)[:160]}"
            ) from None
    except UnbuildableError as err:
        # An audio/speech config (not a text one) configuring a 1-D rotary of its own.
        own = _own_rotary(module, text)
        if own is None:
            raise
        cls, name, fn = own
        try:
            with _quiet():
                rotary = cls(config=text)
        except Exception:
            raise err from None
    wanted = _wanted_layers(text, rotary)
    layers = {}
    for index, layer_type in wanted.items():
        try:
            with _quiet():
                tables = _rotary_outputs(rotary, length, layer_type)
        except UnbuildableError:
            raise
        except Exception as err:
            if layer_type is not None and isinstance(err, (KeyError, AttributeError)):
                continue  # a layer type without a rope (its layers are NoPE or not attention)
            raise UnbuildableError(
                f"rotary module: forward: {type(err).__name__}: {str(err)[:160]}"
            ) from None
        capture = next(
            (
                c
                for w in _widths(text, tables)
                if (c := _apply_once(name, fn, w, length, tables)) is not None
            ),
            None,
        )
        if capture is None:
            raise UnbuildableError(f"rotary module: {name} fits no q/k width of the config")
        layers[index] = capture
    if not layers:
        raise UnbuildableError("rotary module: no layer type has a rope")
    return Reference(
        length=length,
        layers=layers,
        nope=[],
        layer_types=list(text.layer_types) if None not in wanted.values() else None,
        text_model_type=str(text.model_type),
        module_only=True,
    )


def module_reference(data: Mapping[str, Any], length: int = SEQ) -> Reference:
    """The model's rotation from its own text `*RotaryEmbedding` (built from the text config
    transformers loads, forward over positions 0..length-1, per layer type when its forward
    takes one) and the apply function its attention calls, run on random q/k: what the sweep
    compares when the whole tiny model cannot be built or run. NoPE layers and which layer
    takes which table are not observed (`Reference.module_only`)."""
    return _module_reference(json.dumps(dict(data), sort_keys=True, default=str), length)


# ---------------------------------------------------------------------------------------------
# posenc's side and the verdict


@dataclass
class Table:
    """One resolved rope table: its layer types (None: every layer), rotary width, declared
    pairing, notes and half-width cos/sin (S, d/2)."""

    name: str
    layer_types: list[str] | None
    rotary_dim: int
    head_dim: int
    pairing: str
    interleaved_field: bool | None
    notes: dict[str, Any]
    sign: float  # -1: posenc declares a reversed rotation (notes["rotation"])
    cos: torch.Tensor
    sin: torch.Tensor


@dataclass
class Verdict:
    outcome: str  # exact | rejected | wrong | unbuildable
    reasons: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.outcome}: {'; '.join(self.reasons)}" if self.reasons else self.outcome

    def label(self) -> str:
        """The outcome as docs/models-outcomes.json records it (`, accepted`: posenc answers a
        config no reference could judge)."""
        return f"{self.outcome}{', accepted' if self.facts.get('accepted') else ''}"


def case_id(case: tuple[str, str, str]) -> str:
    return "/".join(case)


@functools.cache
def committed_outcomes() -> dict[str, Any]:
    """docs/models-outcomes.json: {"transformers": version, "rope": {case id: label}, "mrope":
    {case id: label}}."""
    data: dict[str, Any] = json.loads(OUTCOMES_FILE.read_text(encoding="utf-8"))
    return data


def ratchet(sweep_name: str, results: Mapping[tuple[str, str, str], Verdict]) -> list[str]:
    """What these results break of the committed outcomes (`OUTCOMES_FILE`, section
    `sweep_name`): a case committed `exact`/`module_exact` that is now anything else (coverage
    lost: never fixed by regenerating the file alone), and any other change or new case (the
    committed file drifts from the sweep: `make models-doc`)."""
    where = OUTCOMES_FILE.relative_to(REPO)
    committed = committed_outcomes()[sweep_name]
    problems = []
    for case, verdict in results.items():
        key, got = case_id(case), verdict.label()
        want = committed.get(key)
        if want is None:
            problems.append(f"{key}: {got}, a case {where} does not list (make models-doc)")
        elif want.split(",")[0] in VERIFIED and verdict.outcome not in VERIFIED:
            problems.append(f"{key}: coverage lost: committed {want}, now {verdict.line()[:300]}")
        elif want != got:
            problems.append(
                f"{key}: committed {want}, now {verdict.line()[:300]}: {where} drifts from the "
                "sweep (make models-doc, and commit docs/)"
            )
    return problems


def outcomes_json(
    rope: Mapping[tuple[str, str, str], Verdict], mrope: Mapping[tuple[str, str, str], Verdict]
) -> str:
    """The text of `OUTCOMES_FILE` for these results."""
    data = {
        "transformers": transformers_version(),
        "rope": {case_id(c): v.label() for c, v in sorted(rope.items())},
        "mrope": {case_id(c): v.label() for c, v in sorted(mrope.items())},
    }
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def posenc_tables(data: Mapping[str, Any], length: int) -> list[Table]:
    """resolve_config (what POST /v1/resolve runs) with max_positions=length, every rope table
    computed at half width in float32."""
    from posenc.api.specs import resolve_config
    from posenc.encodings import compute

    named = resolve_config({"hf_config": copy.deepcopy(dict(data)), "max_positions": length})
    tables = []
    for item in named:
        spec = item.spec.canonical()
        if spec.kind != "rope":
            continue
        half = spec.model_copy(update={"width": "half", "packing": "separate", "dtype": "float32"})
        table = compute(half, device="cpu")
        tables.append(
            _table(item.name, item.notes, spec, table.tensors["cos"], table.tensors["sin"])
        )
    return tables


def _table(name: str, notes: Mapping[str, Any], spec: Any, cos: Any, sin: Any) -> Table:
    types = notes.get("layer_types")
    return Table(
        name=name,
        layer_types=list(types) if isinstance(types, list) else None,
        rotary_dim=int(spec.resolved_rotary_dim()),
        head_dim=int(spec.head_dim),
        pairing=str(notes.get("pairing", "half_split")),
        interleaved_field=spec.interleaved,
        notes=dict(notes),
        sign=-1.0 if notes.get("rotation") == "reversed" else 1.0,
        cos=torch.as_tensor(cos, dtype=torch.float32),
        sin=torch.as_tensor(sin, dtype=torch.float32),
    )


def _config_keys(data: Mapping[str, Any]) -> set[str]:
    keys = set(data)
    text = data.get("text_config")
    if isinstance(text, Mapping):
        keys |= {f"text_config.{k}" for k in text}
    return keys | {"model_type"}


def rejection(err: Exception, data: Mapping[str, Any]) -> Verdict:
    """A rejection is fine when one of its problems names a key of the config (or model_type)."""
    problems = getattr(err, "problems", []) or []
    fields = [str(getattr(p, "field", "")) for p in problems]
    keys = _config_keys(data)
    named = [
        f
        for f in fields
        if any(f == k or f.startswith(k + ".") or f.startswith(k + "[") for k in keys)
    ]
    if str(getattr(err, "message", err)).startswith("cannot map config"):
        # hf_config's own refusals: the field is a config key, present or required and missing.
        named += [f for f in fields if f and not f.startswith("(")]
    message = "; ".join(f"{getattr(p, 'field', '')}: {getattr(p, 'message', '')}" for p in problems)
    if named:
        return Verdict("rejected", [message or str(err)], {"keys": named})
    return Verdict("wrong", [f"rejected without naming a config key: {err} ({message})"])


def _rows(x: torch.Tensor, length: int) -> torch.Tensor:
    """(.., S, W) -> (S, W): the first batch entry of a cos/sin/freqs argument."""
    while x.dim() > 2:
        x = x[0]
    return x[:length]


def _model_half(cap: LayerCapture, length: int) -> tuple[str, torch.Tensor, torch.Tensor] | None:
    """The model's cos/sin as (arrangement, half-width cos, half-width sin)."""
    if cap.freqs is not None and cap.freqs.is_complex():
        f = _rows(cap.freqs, length)
        return "complex", f.real.float(), f.imag.float()
    if cap.cos is None or cap.sin is None:
        return None
    cos, sin = _rows(cap.cos, length).float(), _rows(cap.sin, length).float()
    w = cos.shape[-1]
    if (
        w % 2 == 0
        and torch.equal(cos[:, : w // 2], cos[:, w // 2 :])
        and torch.equal(sin[:, : w // 2], sin[:, w // 2 :])
        and w > 2
    ):
        return "cat", cos[:, : w // 2], sin[:, : w // 2]
    if (
        w % 2 == 0
        and torch.equal(cos[:, 0::2], cos[:, 1::2])
        and torch.equal(sin[:, 0::2], sin[:, 1::2])
    ):
        return "repeat_interleave", cos[:, 0::2], sin[:, 0::2]
    return "half", cos, sin


def _to_hsd(x: torch.Tensor, length: int) -> torch.Tensor:
    """(B, H, S, D) or (B, S, H, D) -> (H, S, D) float64."""
    x = x.detach()
    while x.dim() > 4:
        x = x[0]
    if x.dim() == 4:
        x = x[0]
    if x.dim() == 2:
        x = x[None]
    if x.shape[1] != length and x.shape[0] == length:
        x = x.transpose(0, 1)
    return x.double()


def rotate(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rotary: int,
    pairing: str,
    sign: float = 1.0,
) -> torch.Tensor:
    """x (H, S, D) rotated on its first `rotary` channels with half-width cos/sin (S, rotary/2)."""
    c, s = cos.double()[None], sign * sin.double()[None]
    half = rotary // 2
    out = x.clone()
    if pairing == "interleaved":
        x1, x2 = x[..., 0:rotary:2], x[..., 1:rotary:2]
        out[..., 0:rotary:2] = x1 * c - x2 * s
        out[..., 1:rotary:2] = x2 * c + x1 * s
    else:
        x1, x2 = x[..., :half], x[..., half:rotary]
        out[..., :half] = x1 * c - x2 * s
        out[..., half:rotary] = x2 * c + x1 * s
    return out


def _scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q[0] @ k[0].transpose(-1, -2)


def _qk_error(
    cap: LayerCapture,
    length: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rotary: int,
    pairing: str,
    sign: float = 1.0,
    trailing: bool = False,
) -> float:
    """max |q.k(posenc) - q.k(model)| relative to max |q||k|, head 0 against key head 0.
    `trailing` (notes `rotary_channels: "trailing"`, DeepSeek-V4's [nope | rope] heads): the
    table rotates the last `rotary` channels; q and k are rolled to put them first (q.k is the
    same under one channel permutation of both)."""
    q_in, k_in = _to_hsd(cap.q_in, length), _to_hsd(cap.k_in, length)
    if trailing:
        q_in, k_in = torch.roll(q_in, rotary, -1), torch.roll(k_in, rotary, -1)
    q_out, k_out = _to_hsd(cap.q_out, length), _to_hsd(cap.k_out, length)
    if q_in.shape[-1] < rotary or cos.shape[-1] * 2 < rotary or q_in.shape != q_out.shape:
        return math.inf
    c, s = cos[:length, : rotary // 2], sin[:length, : rotary // 2]
    if c.shape[-1] * 2 != rotary:
        return math.inf
    want = _scores(q_out, k_out)
    got = _scores(
        rotate(q_in, c, s, rotary, pairing, sign), rotate(k_in, c, s, rotary, pairing, sign)
    )
    scale = float(q_in[0].norm(dim=-1).max() * k_in[0].norm(dim=-1).max()) or 1.0
    return float((want - got).abs().max()) / scale


def _diagnose(
    cap: LayerCapture, length: int, table: Table, model: tuple[str, Any, Any] | None
) -> str:
    """Which pairing / width / direction / scale makes q.k agree, to say why posenc is wrong."""
    width = cap.q_in.shape[-1]
    found = []
    cos, sin = table.cos, table.sin
    options = []
    if model is not None:
        options.append(("the model's own cos/sin", model[1], model[2]))
    options.append(("posenc's cos/sin", cos, sin))
    widths = sorted({table.rotary_dim, width, 2 * (model[1].shape[-1] if model else 0)} - {0})
    for label, c, s in options:
        for rotary in widths:
            for pairing in ("half_split", "interleaved"):
                for sign in (1.0, -1.0):
                    if _qk_error(cap, length, c, s, rotary, pairing, sign) < QK_RTOL:
                        direction = "" if sign > 0 else ", opposite rotation direction"
                        found.append(f"{pairing} over {rotary} channels{direction} with {label}")
        if found:
            break
    return "model matches " + " or ".join(found[:2]) if found else "no pairing/width/direction fits"


def _measure(cap: LayerCapture, length: int, model: tuple[str, Any, Any] | None) -> dict[str, Any]:
    """The model's own pairing, rotary width and direction: the layout under which its cos/sin
    reproduce its q.k (what docs/models.md reports)."""
    if model is None:
        return {}
    rotary = 2 * int(model[1].shape[-1])
    for pairing in ("half_split", "interleaved"):
        for sign in (1.0, -1.0):
            if _qk_error(cap, length, model[1], model[2], rotary, pairing, sign) < QK_RTOL:
                return {"pairing": pairing, "rotary_dim": rotary, "reversed": sign < 0}
    return {"pairing": "?", "rotary_dim": rotary, "reversed": False}


def _table_for(tables: list[Table], layer_type: str | None) -> Table | None:
    if len(tables) == 1 and tables[0].layer_types is None:
        return tables[0]
    for table in tables:
        if table.layer_types is not None and layer_type in table.layer_types:
            return table
    if layer_type is None and len(tables) == 1:
        return tables[0]
    return None


def _ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return math.inf
    spacing = torch.finfo(torch.float32).eps * torch.maximum(a.abs(), b.abs()).clamp_min(1e-30)
    return float(((a - b).abs() / spacing).max()) if a.numel() else 0.0


def model_facts(ref: Reference) -> dict[str, Any]:
    """What the model does, per layer type: its apply function, cos/sin arrangement, pairing,
    rotary width and direction (measured), its NoPE layers and layer types."""
    facts: dict[str, Any] = {"nope": ref.nope, "layer_types": sorted(set(ref.layer_types or []))}
    for index, cap in sorted(ref.layers.items()):
        tag = ref.layer_types[index] if ref.layer_types else "all"
        if tag in facts.setdefault("layers", {}):
            continue
        model = _model_half(cap, ref.length)
        facts["layers"][tag] = {
            "function": cap.function,
            "arrangement": model[0] if model else None,
            **_measure(cap, ref.length, model),
        }
    return facts


def judge(ref: Reference, tables: list[Table]) -> Verdict:
    """The verdict for an accepted config: exact, or wrong with the reasons."""
    reasons: list[str] = []
    facts = model_facts(ref)
    if not tables:
        return Verdict("wrong", ["accepted without a rope table"], facts)
    declared_nope = sorted({int(i) for t in tables for i in t.notes.get("nope_layers", [])})
    if declared_nope != ref.nope and not ref.module_only:
        reasons.append(f"NoPE layers: model {ref.nope}, posenc declares {declared_nope}")
    for table in tables:
        if table.interleaved_field is not None and (
            table.interleaved_field != (table.pairing == "interleaved")
        ):
            reasons.append(
                f"{table.name}: notes say {table.pairing}, "
                f"spec interleaved={table.interleaved_field}"
            )
    # Every recorded layer, not one per layer type: a layer given another table than its type's
    # (or another scale) is as wrong as a wrong type.
    for index, cap in sorted(ref.layers.items()):
        layer_type = ref.layer_types[index] if ref.layer_types else None
        tag = f"layer {index} ({layer_type})" if layer_type else f"layer {index}"
        table = _table_for(tables, layer_type)
        if table is None:
            reasons.append(f"{tag}: no table")
            continue
        model = _model_half(cap, ref.length)
        if model is None:
            reasons.append(f"{tag}: the model's cos/sin were not recorded")
        else:
            mine_c, mine_s = table.cos[: ref.length], table.sin[: ref.length]
            theirs_c, theirs_s = model[1], model[2]
            if theirs_c.shape != mine_c.shape:
                reasons.append(
                    f"{tag}: rotary width: model cos/sin {tuple(theirs_c.shape)} half width, "
                    f"posenc {tuple(mine_c.shape)} (rotary_dim {table.rotary_dim})"
                )
            elif not (torch.equal(theirs_c, mine_c) and torch.equal(theirs_s, mine_s)):
                ulps = max(_ulps(theirs_c, mine_c), _ulps(theirs_s, mine_s))
                ratio = float(theirs_c[0, 0] / mine_c[0, 0]) if float(mine_c[0, 0]) else math.nan
                diff = float((theirs_c - mine_c).abs().max())
                reasons.append(
                    f"{tag}: cos/sin differ (max |d| {diff:.3g}, {ulps:.3g} ulp, "
                    f"row-0 scale model/posenc {ratio:.6g})"
                )
        err = _qk_error(
            cap,
            ref.length,
            table.cos,
            table.sin,
            table.rotary_dim,
            table.pairing,
            table.sign,
            table.notes.get("rotary_channels") == "trailing",
        )
        if not err < QK_RTOL:
            why = _diagnose(cap, ref.length, table, model)
            direction = " reversed" if table.sign < 0 else ""
            reasons.append(
                f"{tag}: q.k off by {err:.3g} (relative) under posenc's{direction} "
                f"{table.pairing} over {table.rotary_dim} channels: {why}"
            )
    return Verdict("wrong" if reasons else "exact", reasons, facts)


def _model_or_module(data: Mapping[str, Any], length: int) -> Reference:
    """The whole tiny model's rotation, else its rotary module's (`module_reference`); an
    UnbuildableError names both failures, the rotary module's first."""
    try:
        return reference(data, length)
    except UnbuildableError as err:
        whole = str(err)
    except Exception as err:
        whole = f"reference: {type(err).__name__}: {str(err)[:200]}"
    try:
        return module_reference(data, length)
    except UnbuildableError as err:
        raise UnbuildableError(f"{err}; whole model: {whole}") from None


def _v4_unloadable(model_type: str, variant: str, data: Mapping[str, Any]) -> str | None:
    """Why transformers cannot load the v4 file `to_v4` (and the checkpoint's v4 edits) wrote,
    where it loads the v5 form of the same case: the harness's file is wrong, not the model."""
    try:
        load_config(data)
        return None
    except Exception as err:
        v4_error = f"{type(err).__name__}: {str(err)[:160]}"
    try:
        load_config(build_v5(model_type, variant))
    except Exception:
        return None  # transformers refuses the case in either form: unbuildable
    return f"the v4 config.json written by to_v4 does not load in transformers: {v4_error}"


def _asked(data: Mapping[str, Any], length: int) -> tuple[bool, Verdict | None, dict[str, bool]]:
    """posenc's answer where no reference can judge it: (accepted, the rejection verdict, facts:
    `rope` whether a rope table is among what posenc serves, `loads` whether transformers reads
    the config.json at all; a config it cannot read is no model posenc's table could be wrong
    for, so only a served rope table of a readable config needs a verified sibling case)."""
    from posenc.encodings import SpecError

    try:
        tables = posenc_tables(data, length)
    except SpecError as refused:
        return False, rejection(refused, data), {}
    try:
        load_config(data)
        loads = True
    except Exception:
        loads = False
    return True, None, {"rope": bool(tables), "loads": loads}


LONG_POSITIONS = (0, 1, 1023, 4097, 16381, 32767)
"""Positions of the long-position check (`long_positions`): far past the forward's SEQ rows,
where an fp32 angle computed in another order than the model's is off by many ulp."""


def long_positions(
    data: Mapping[str, Any], tables_at: Callable[[int], list[Table]] | None = None
) -> list[str] | None:
    """The model's own text rotary module (`module_reference`'s) run on `LONG_POSITIONS` against
    posenc's table rows at those positions, bit for bit per layer type: the reasons it differs
    ([] when equal), or None where the check does not apply (no 1-D rotary module to build, or a
    rope_type whose table depends on the sequence length: dynamic NTK and LongRoPE, judged at
    their checkpoints' own lengths). `tables_at(rows)`: posenc's tables for this config (a
    composite's part: `part_tables`), else `posenc_tables(data, rows)`."""
    from posenc.encodings import SpecError

    try:
        config = load_config(data)
        text = _open(_text_config(config))
        module = _modeling_module(text)
        try:
            cls = _text_rotary_class(module, text)
        except UnbuildableError:
            own = _own_rotary(module, text)
            if own is None:
                return None
            cls = own[0]
        if "mrope_section" in source(cls):
            return None
        with _quiet():
            rotary = cls(config=text)
    except Exception:
        return None
    kinds = getattr(rotary, "rope_type", None)
    rope_types = {str(v) for v in kinds.values()} if isinstance(kinds, Mapping) else {str(kinds)}
    params = getattr(text, "rope_parameters", None) or {}
    if isinstance(params, Mapping):
        for part in (params, *params.values()):
            if isinstance(part, Mapping):
                rope_types.add(str(part.get("rope_type", part.get("type", ""))))
    if rope_types & {"dynamic", "longrope"}:
        return None
    rows = max(LONG_POSITIONS) + 1
    try:
        tables = posenc_tables(data, rows) if tables_at is None else tables_at(rows)
    except SpecError:
        return None
    wanted = _wanted_layers(text, rotary)
    ids = torch.tensor(LONG_POSITIONS)
    reasons = []
    for layer_type in wanted.values():
        kwargs = {} if layer_type is None else {"layer_type": layer_type}
        try:
            with torch.no_grad(), _quiet():
                out = rotary(torch.zeros(1, len(ids), 2), ids[None], **kwargs)
        except Exception:
            continue  # a layer type without a rope (as in `module_reference`)
        if isinstance(out, torch.Tensor) and out.is_complex():
            cap = LayerCapture(ids, ids, ids, ids, None, None, out, "")
        elif isinstance(out, tuple) and len(out) == 2 and out[0].dim() <= 3:
            cap = LayerCapture(ids, ids, ids, ids, out[0], out[1], None, "")
        else:
            return None
        model = _model_half(cap, len(ids))
        table = _table_for(tables, layer_type)
        if model is None or table is None:
            return None
        mine_c, mine_s = table.cos[ids], table.sin[ids]
        if model[1].shape != mine_c.shape:
            shapes = f"{tuple(model[1].shape)}, posenc {tuple(mine_c.shape)}"
            reasons.append(f"{layer_type or 'all'}: at long positions the model's width {shapes}")
        elif not (torch.equal(model[1], mine_c) and torch.equal(model[2], mine_s)):
            ulps = max(_ulps(model[1], mine_c), _ulps(model[2], mine_s))
            reasons.append(
                f"{layer_type or 'all'}: cos/sin at positions {list(LONG_POSITIONS)} differ "
                f"({ulps:.3g} ulp)"
            )
    return reasons


def run_case(model_type: str, variant: str, form: str) -> Verdict:
    """Build, resolve and judge one case; never raises for a model-side failure. posenc is asked
    for every case that has a config.json. A case whose model (and rotary module) transformers
    cannot run is `rejected` when posenc refuses it naming a config key (a refusal needs no
    reference), else `unbuildable` (`accepted` when posenc answers it); one judged only at the
    rotary module is `module_exact` when exact. `harness_failure`: the sweep's own v4 file does
    not load in transformers where the v5 form does (posenc is still asked). A case whose config
    the harness cannot shrink is built from the unshrunk class defaults (`facts["unshrunk"]`)."""
    from posenc.encodings import SpecError

    try:
        data = case_config(model_type, variant, form)
    except UnbuildableError as err:
        return Verdict("unbuildable", [str(err)])
    except Exception as err:
        return Verdict("harness_failure", [f"config: {type(err).__name__}: {str(err)[:200]}"])
    unshrunk = _FALLBACKS.get((model_type, variant))
    extra = {"unshrunk": unshrunk} if unshrunk else {}
    if form == "v4" and (why := _v4_unloadable(model_type, variant, data)) is not None:
        accepted, _, _ = _asked(data, SEQ)
        return Verdict("harness_failure", [why], {"accepted": accepted, **extra})
    if model_type in _rotary_parts():
        return _run_composite(model_type, data, extra)
    verdicts = []
    for length in case_lengths(model_type, variant):
        try:
            ref = _model_or_module(data, length)
        except UnbuildableError as err:
            accepted, refusal, answer = _asked(data, length)
            if refusal is not None and refusal.outcome == "rejected":
                refusal.facts = {"unbuildable": str(err), **extra}
                return refusal
            facts = {"accepted": accepted, **answer, **extra}
            return Verdict("unbuildable", [str(err)], facts)
        try:
            tables = posenc_tables(data, length)
        except SpecError as err:
            verdict = rejection(err, data)
            verdict.facts = {**model_facts(ref), **extra}
            return verdict
        verdict = judge(ref, tables)
        verdict.facts.update(extra)
        if ref.module_only:
            verdict.facts["module_only"] = True
        if length != SEQ:
            verdict.reasons = [f"S={length}: {r}" for r in verdict.reasons]
        verdicts.append(verdict)
    reasons = [r for v in verdicts for r in v.reasons]
    if reasons:
        return Verdict("wrong", reasons, verdicts[0].facts)
    # once per config: its v5 form (a checkpoint transcribed only as v4: that form)
    long = (
        long_positions(data)
        if form == "v5" or FORMS[0] not in case_forms(model_type, variant)
        else None
    )
    if long:
        return Verdict("wrong", [f"long positions: {r}" for r in long], verdicts[0].facts)
    if long is not None:
        verdicts[0].facts["long_positions"] = max(LONG_POSITIONS)
    module_only = any(v.facts.get("module_only") for v in verdicts)
    return Verdict("module_exact" if module_only else "exact", [], verdicts[0].facts)


def _rotary_parts() -> Mapping[str, Mapping[str, str]]:
    """posenc's composites served per part (`hf_config.models.ROTARY_PARTS`): config key -> the
    part's model_type."""
    from posenc.encodings.hf_config.models import ROTARY_PARTS

    return ROTARY_PARTS


def part_tables(tables: list[Table], key: str) -> list[Table]:
    """A composite's tables of part `key` (named by roles `key` or `key.<layer type>`), their
    layer types those inside the part (None: every layer of it)."""
    found = []
    for table in tables:
        roles = [r for r in table.layer_types or [] if r == key or r.startswith(f"{key}.")]
        if roles:
            inner = None if roles == [key] else [r[len(key) + 1 :] for r in roles]
            found.append(replace(table, layer_types=inner))
    return found


def _run_composite(model_type: str, data: Mapping[str, Any], extra: dict[str, Any]) -> Verdict:
    """A composite of `_rotary_parts` judged part by part: posenc resolves the whole config; each
    part's tables (`part_tables`) are judged against that part's own model or rotary module
    (built from the part's sub-config as transformers loads it), and at `LONG_POSITIONS`."""
    from posenc.encodings import SpecError

    try:
        tables = posenc_tables(data, SEQ)
    except SpecError as err:
        verdict = rejection(err, data)
        verdict.facts.update(extra)
        return verdict
    reasons: list[str] = []
    facts: dict[str, Any] = {**extra, "layers": {}, "layer_types": [], "nope": [], "parts": {}}
    module_only = False
    long_checked = True
    parts = _rotary_parts()[model_type]
    for key, part_type in parts.items():
        part = data.get(key)
        if not isinstance(part, Mapping):
            continue
        part_data = {"model_type": part_type, **part}
        try:
            ref = _model_or_module(part_data, SEQ)
        except UnbuildableError as err:
            return Verdict("unbuildable", [f"{key}: {err}"], {"accepted": True, **extra})
        mine = part_tables(tables, key)
        verdict = judge(ref, mine)
        reasons += [f"{key}: {r}" for r in verdict.reasons]
        module_only = module_only or ref.module_only
        part_facts = model_facts(ref)
        facts["parts"][key] = part_facts
        for tag, layer in part_facts.get("layers", {}).items():
            facts["layers"][key if tag == "all" else f"{key}.{tag}"] = layer
        facts["layer_types"] += [f"{key}.{t}" for t in part_facts.get("layer_types", [])]
        long = long_positions(
            part_data, lambda rows, key=key: part_tables(posenc_tables(data, rows), key)
        )
        reasons += [f"{key}: long positions: {r}" for r in long or []]
        long_checked = long_checked and long is not None
    if reasons:
        return Verdict("wrong", reasons, facts)
    if long_checked:
        facts["long_positions"] = max(LONG_POSITIONS)
    if module_only:
        facts["module_only"] = True
    return Verdict("module_exact" if module_only else "exact", [], facts)


# ---------------------------------------------------------------------------------------------
# docs/models.md


def run_all(progress: bool = False) -> dict[tuple[str, str, str], Verdict]:
    import time

    results = {}
    for case in sweep_cases():
        start = time.perf_counter()
        results[case] = run_case(*case)
        if progress:
            took = time.perf_counter() - start
            print(f"{took:.2f}s {'/'.join(case)}: {results[case].line()[:160]}", file=sys.stderr)
    return results


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(results: Mapping[tuple[str, str, str], Verdict]) -> str:
    from posenc.verified import VERIFIED_AGAINST

    version = VERIFIED_AGAINST["transformers"]
    counts: dict[str, int] = {}
    for verdict in results.values():
        counts[verdict.outcome] = counts.get(verdict.outcome, 0) + 1
    by_type: dict[str, list[tuple[str, str, Verdict]]] = {}
    for (model_type, variant, form), verdict in results.items():
        by_type.setdefault(model_type, []).append((variant, form, verdict))
    lines = [
        "# Model types and their position tables",
        "",
        "Generated by `make models-doc` (`python -m tests.encodings.hf_config.rope_sweep "
        "--write-docs`, with `docs/models-outcomes.json`, the per-case outcomes the sweep's "
        "tests hold every case to): do not edit by hand. Every model type of transformers "
        f"{version} (`posenc.verified`) whose modeling module defines a rotary class "
        "(`*Rotary*` / `*Rope*` / `*RoPE*`), and every model type whose class-default config "
        "posenc resolves to a rope table, each config (class defaults, YaRN, released "
        "checkpoints' RoPE facts; the unshrunk class defaults where the sweep cannot shrink "
        "the config) in the v5 `rope_parameters` and the v4 `rope_scaling` config.json forms, "
        "resolved by posenc (`/v1/resolve`) and compared with the model's own forward "
        "(`tests/encodings/hf_config/rope_sweep.py`): `exact` is bit-equal cos/sin and equal "
        "q.k after the model's own rotation at every rotating layer, the NoPE layers posenc "
        "declares, and (once per config, its v5 form) bit-equal cos/sin of the model's rotary "
        "module at positions "
        f"{', '.join(str(p) for p in LONG_POSITIONS)} (all rope types but dynamic NTK and "
        "LongRoPE, whose checkpoints run at their own lengths); `module_exact` is the same "
        "check on the model's own text rotary module and the apply function its attention "
        "calls, where the whole tiny model cannot be built or run (NoPE layers and the "
        "layer-to-table wiring not observed: the types verified only so are listed below); "
        "`rejected` names the key posenc cannot map; `wrong` is accepted and different; "
        "`unbuildable` is a config transformers itself cannot build into a text model or "
        "rotary module (`accepted` when posenc answers it anyway; every type posenc answers "
        "has at least one config verified `exact` or `module_exact`); `harness_failure` (a "
        "failing test) is a config.json the sweep wrote that transformers cannot load.",
        "",
        f"Cases: {len(results)}; "
        + ", ".join(f"{k} {counts[k]}" for k in OUTCOMES if k in counts)
        + ".",
        "",
        "| model type | variants | pairing | rotary width | layer types | NoPE layers | outcome "
        "| verified against |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model_type in sorted(by_type):
        entries = by_type[model_type]
        variants = ", ".join(dict.fromkeys(v for v, _, _ in entries))
        facts: dict[str, Any] = {}
        for _, _, verdict in entries:
            if verdict.facts.get("layers"):
                facts = verdict.facts
                break
        layers = facts.get("layers", {})
        pairing = "; ".join(
            dict.fromkeys(
                str(v.get("pairing", "-")) + (" (reversed)" if v.get("reversed") else "")
                for v in layers.values()
            )
        )
        width = ", ".join(
            f"{t}: {v.get('rotary_dim')}" if len(layers) > 1 else str(v.get("rotary_dim"))
            for t, v in layers.items()
        )
        types = ", ".join(facts.get("layer_types") or []) or "-"
        nope = ", ".join(str(i) for i in facts.get("nope", [])) or "-"
        groups: dict[str, list[str]] = {}
        for variant, form, verdict in entries:
            why = f" ({_cell(verdict.reasons[0][:120])})" if verdict.reasons else ""
            label = f"{verdict.outcome}{', accepted' if verdict.facts.get('accepted') else ''}"
            groups.setdefault(f"{label}{why}", []).append(f"{variant}/{form}")
        outcome = "<br>".join(f"{k}: {', '.join(v)}" for k, v in groups.items())
        lines.append(
            f"| {model_type} | {variants} | {pairing or '-'} | {width or '-'} | {types} | {nope} "
            f"| {outcome} | transformers {version} |"
        )
    return (
        "\n".join(lines + module_only_lines(results) + alias_lines() + vision_lines(version)) + "\n"
    )


def module_only_types(labels: Mapping[str, str]) -> list[str]:
    """Model types with a case verified `module_exact` and none `exact` (case id -> label, as
    docs/models-outcomes.json records them): posenc's tables proven at the rotary module only."""
    outcomes: dict[str, set[str]] = {}
    for key, label in labels.items():
        outcomes.setdefault(key.split("/")[0], set()).add(label.split(",")[0])
    return sorted(t for t, o in outcomes.items() if "module_exact" in o and "exact" not in o)


def module_only_lines(results: Mapping[tuple[str, str, str], Verdict]) -> list[str]:
    types = module_only_types({case_id(c): v.label() for c, v in results.items()})
    return [
        "",
        "## Verified at the rotary module only (`module_exact`)",
        "",
        f"{len(types)} model types whose whole tiny model transformers cannot build or run: "
        "posenc's tables equal their rotary module's cos/sin and q.k after their apply function, "
        "but their NoPE layers and which layer takes which table are not observed: "
        + ", ".join(f"`{t}`" for t in types)
        + ".",
    ]


def alias_lines() -> list[str]:
    """The docs/models.md section naming the alias table resolve reads config.json keys through:
    its file, its generator and the transformers release it was generated from, and every alias
    of a key resolve reads (a config class's `attribute_map` entry), with the model types whose
    class declares it. Read from the committed data file (`test_class_data.py` holds it to the
    installed transformers)."""
    from tests.encodings.hf_config import class_data

    data = json.loads(class_data.DATA.read_text(encoding="utf-8"))
    models: dict[str, Any] = data["models"]
    keys = set(data["keys"])
    aliases: dict[tuple[str, str], list[str]] = {}
    for model_type, entry in models.items():
        for key, target in (entry.get("attribute_map") or {}).items():
            if key in keys:
                aliases.setdefault((key, target), []).append(model_type)
    with_map = sum(1 for entry in models.values() if entry.get("attribute_map"))
    lines = [
        "",
        "## Config keys as transformers reads them (the alias table)",
        "",
        f"`/v1/resolve` reads a config.json's keys as transformers {data['transformers']} reads "
        "them, without importing it: through "
        f"`{class_data.DATA.relative_to(REPO)}`, generated by `make models-data` "
        "(`python -m tests.encodings.hf_config.class_data --write`) from every config class of "
        "`CONFIG_MAPPING_NAMES` in the installed transformers: each class's `attribute_map` "
        "(`PreTrainedConfig.__getattribute__` reads the key as the attribute it names), the "
        "dataclass defaults of the keys resolve reads, `default_theta` and `default_rope_type` "
        "(`RotaryEmbeddingConfigMixin`), and the head_dim a class's `__post_init__` derives; "
        "`tests/encodings/hf_config/test_class_data.py` fails when the file drifts from the "
        f"installed release. {len(models)} model types, {with_map} with an `attribute_map`; the "
        "aliases of the keys resolve reads:",
        "",
        "| key | read from | model types |",
        "|---|---|---|",
    ]
    for (key, target), types in sorted(aliases.items()):
        names = ", ".join(f"`{t}`" for t in sorted(types))
        lines.append(f"| `{key}` | `{target}` | {names} |")
    return lines


def vision_lines(version: str) -> list[str]:
    """The vision rotary modules of the installed transformers (enumerated from its modeling
    sources, `tests/encodings/vision_reference.py`): served as a `vision_rope` style (its tower's
    cos/sin and q.k bit-exact in `tests/encodings/test_vision_rope.py`) or refused, with why."""
    from posenc.encodings.hf_config.vision_rope import REFUSED_CLASSES, ROTARY_CLASSES
    from tests.encodings.vision_reference import rotary_classes

    found = rotary_classes()
    served = sum(1 for name in found if name in ROTARY_CLASSES)
    lines = [
        "",
        "## Vision rotary modules (`vision_rope`)",
        "",
        f"Every vision rotary module of transformers {version} (a class named "
        "`*Vision*Rotary*Embedding` / `*ViT*Rope*Embedding`, or a DINOv3 backbone's "
        "`*Dinov3*RotaryEmbedding`, in a modeling module), served as a "
        "`vision_rope` style (cos/sin of the tower's grid in its patch order, and q.k after its "
        "own apply function, bit for bit: `tests/encodings/test_vision_rope.py`) or refused "
        f"with the reason. Served {served} of {len(found)}.",
        "",
        "| module | model | outcome | verified against |",
        "|---|---|---|---|",
    ]
    for name in sorted(found, key=lambda n: (found[n], n)):
        if name in ROTARY_CLASSES:
            outcome = f"exact: style `{ROTARY_CLASSES[name]}`"
        else:
            outcome = f"refused ({_cell(REFUSED_CLASSES.get(name, 'not listed'))})"
        lines.append(f"| {name} | {found[name]} | {outcome} | transformers {version} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-docs", action="store_true", help=f"write {DOCS.relative_to(REPO)}")
    parser.add_argument("--summary", action="store_true", help="print counts and wrong cases")
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("model_types", nargs="*", help="only these model types")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.model_types:
        results = {case: run_case(*case) for case in sweep_cases() if case[0] in args.model_types}
    else:
        results = run_all(progress=args.progress)
    if args.write_docs:
        from tests.encodings.hf_config import mrope_sweep

        mrope_results = mrope_sweep.run_all()
        mrope = mrope_sweep.render(mrope_results)
        DOCS.write_text(render(results) + "\n" + mrope, encoding="utf-8")
        OUTCOMES_FILE.write_text(outcomes_json(results, mrope_results), encoding="utf-8")
    if args.summary or not args.write_docs:
        counts: dict[str, int] = {}
        for verdict in results.values():
            counts[verdict.outcome] = counts.get(verdict.outcome, 0) + 1
        for case, verdict in results.items():
            if verdict.outcome != "exact" or args.model_types:
                print(f"{'/'.join(case)}: {verdict.line()}")
        print(counts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
