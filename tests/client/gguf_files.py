"""Tiny GGUF files laid out as llama.cpp's converter lays them out, written with the `gguf`
package's `GGUFWriter`, and the configs they are converted from.

`convert(config, arch)` transcribes the RoPE part of llama.cpp's `convert_hf_to_gguf.py`
(ggml-org/llama.cpp@01b77b5793989e0a1508a2fe3757d4e743a7bbd1, `conversion/base.py`
`TextModel.set_gguf_parameters`: the scaling keys from the config's rope parameters;
`LlamaModel.set_gguf_parameters` / `generate_extra_tensors`: `rope.dimension_count` and the
Llama 3 divisors `rope_freqs`, computed in float32 torch with the converter's own formula;
`Phi3MiniModel`: `rope_factors_long/short`, `rope.scaling.attn_factor` and the original
context; `DeepseekV2Model`: the RoPE head width and `yarn_log_multiplier = 0.1 *
mscale_all_dim`; `Gemma3Model`: linear scaling, no local base key). The weights are one
placeholder embedding: only the metadata and the RoPE tensors matter to posenc.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

Keys = dict[str, tuple[Any, gguf.GGUFValueType]]

F = gguf.GGUFValueType.FLOAT32
U32 = gguf.GGUFValueType.UINT32
S = gguf.GGUFValueType.STRING

BASE = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "max_position_embeddings": 4096}  # fmt: skip

CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama_default": ("llama", {"model_type": "llama", **BASE, "rope_theta": 10000.0}),
    "llama3": (
        "llama",
        {
            "model_type": "llama",
            **BASE,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        },
    ),
    "qwen2_yarn": (
        "qwen2",
        {
            "model_type": "qwen2",
            **BASE,
            "rope_theta": 1000000.0,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 1024,
            },
        },
    ),
    "qwen3_yarn": (
        "qwen3",
        {
            "model_type": "qwen3",
            **BASE,
            "head_dim": 128,
            "rope_theta": 1000000.0,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 1024,
            },
        },
    ),
    "phi3_longrope": (
        "phi3",
        {
            "model_type": "phi3",
            **BASE,
            "num_key_value_heads": 4,
            "original_max_position_embeddings": 1024,
            "rope_theta": 10000.0,
            "rope_scaling": {
                "type": "longrope",
                "short_factor": [1.0 + 0.05 * i for i in range(32)],
                "long_factor": [1.0 + 0.5 * i for i in range(32)],
            },
        },
    ),
    "deepseek2_yarn": (
        "deepseek2",
        {
            "model_type": "deepseek_v2",
            **BASE,
            "num_key_value_heads": 4,
            "rope_theta": 10000.0,
            "qk_rope_head_dim": 32,
            "qk_nope_head_dim": 64,
            "v_head_dim": 64,
            "kv_lora_rank": 64,
            "q_lora_rank": None,
            "rope_scaling": {
                "type": "yarn",
                "factor": 40.0,
                "original_max_position_embeddings": 128,
                "mscale": 0.707,
                "mscale_all_dim": 0.707,
                "beta_fast": 32,
                "beta_slow": 1,
            },
        },
    ),
    "gemma3_linear": (
        "gemma3",
        {
            "model_type": "gemma3_text",
            **BASE,
            "num_hidden_layers": 6,
            "head_dim": 64,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            "sliding_window": 512,
        },
    ),
}


QUIRKS: dict[str, tuple[str, dict[str, Any]]] = {
    # the converter reads old_context_len from the config's top level (default 8192), not from
    # rope_scaling: a Llama 3 config whose original length is not 8192 gets wrong divisors
    "llama3_orig512": (
        "llama",
        {
            **CONFIGS["llama3"][1],
            "rope_scaling": {
                **CONFIGS["llama3"][1]["rope_scaling"],
                "original_max_position_embeddings": 512,
            },
        },
    ),
}
"""Configs the converter gets wrong (not part of the all-correct sweep)."""


def _llama3_factors(config: dict[str, Any]) -> np.ndarray:
    """`LlamaModel.generate_extra_tensors` (the converter's own float32 torch arithmetic;
    `old_context_len` read from the config's top level, as it does, default 8192)."""
    rope = config["rope_scaling"]
    base = config.get("rope_theta", 10000.0)
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = rope.get("factor", 8.0)
    low_freq_factor = rope.get("low_freq_factor", 1.0)
    high_freq_factor = rope.get("high_freq_factor", 4.0)
    old_context_len = config.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    rope_factors: list[Any] = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            rope_factors.append(1)
        elif wavelen > low_freq_wavelen:
            rope_factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (
                high_freq_factor - low_freq_factor
            )
            rope_factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(rope_factors, dtype=torch.float32).numpy()


def convert(name: str) -> tuple[str, dict[str, Any], Keys, dict[str, np.ndarray]]:
    """The architecture, config, metadata and RoPE tensors the converter writes for
    `CONFIGS[name]` (or `QUIRKS[name]`)."""
    arch, config = CONFIGS[name] if name in CONFIGS else QUIRKS[name]
    keys, tensors = convert_config(arch, config)
    return arch, config, keys, tensors


def convert_config(arch: str, config: dict[str, Any]) -> tuple[Keys, dict[str, np.ndarray]]:
    """The metadata and RoPE tensors the converter writes for `config` as `arch` (a config with
    `rope_theta` and `rope_scaling` at its top level)."""
    keys: Keys = {}

    def put(key: str, value: Any, kind: gguf.GGUFValueType) -> None:
        keys[f"{arch}.{key}"] = (value, kind)

    n_head = config["num_attention_heads"]
    head = config.get("head_dim") or config["hidden_size"] // n_head
    put("context_length", config["max_position_embeddings"], U32)
    put("embedding_length", config["hidden_size"], U32)
    put("block_count", config["num_hidden_layers"], U32)
    put("attention.head_count", n_head, U32)
    put("attention.head_count_kv", config["num_key_value_heads"], U32)
    if config.get("head_dim"):
        put("attention.key_length", head, U32)
        put("attention.value_length", head, U32)
    tensors: dict[str, np.ndarray] = {}
    rope = dict(config.get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type"))
    put("rope.freq_base", config["rope_theta"], F)
    if arch in ("llama", "qwen2", "qwen3", "deepseek2"):
        # TextModel.set_gguf_parameters
        if rope_type == "linear":
            put("rope.scaling.type", "linear", S)
            put("rope.scaling.factor", rope["factor"], F)
        elif rope_type == "yarn":
            put("rope.scaling.type", "yarn", S)
            put("rope.scaling.factor", rope["factor"], F)
            put(
                "rope.scaling.original_context_length",
                rope["original_max_position_embeddings"],
                U32,
            )
            if "beta_fast" in rope:
                put("rope.scaling.yarn_beta_fast", float(rope["beta_fast"]), F)
            if "beta_slow" in rope:
                put("rope.scaling.yarn_beta_slow", float(rope["beta_slow"]), F)
    if arch == "llama":
        put("rope.dimension_count", head, U32)
        if rope_type == "llama3":
            tensors["rope_freqs.weight"] = _llama3_factors(config)
    if arch == "phi3":
        put("rope.dimension_count", head, U32)
        orig = config["original_max_position_embeddings"]
        scale = config["max_position_embeddings"] / orig
        attn_factor = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
        put("rope.scaling.attn_factor", attn_factor, F)
        put("rope.scaling.original_context_length", orig, U32)
        tensors["rope_factors_long.weight"] = np.asarray(rope["long_factor"], np.float32)
        tensors["rope_factors_short.weight"] = np.asarray(rope["short_factor"], np.float32)
    if arch == "deepseek2":
        put("rope.dimension_count", config["qk_rope_head_dim"], U32)
        keys[f"{arch}.attention.head_count_kv"] = (1, U32)
        put("attention.key_length", config["kv_lora_rank"] + config["qk_rope_head_dim"], U32)
        put("attention.value_length", config["kv_lora_rank"], U32)
        put("attention.kv_lora_rank", config["kv_lora_rank"], U32)
        if rope_type == "yarn":
            put("rope.scaling.yarn_log_multiplier", 0.1 * rope["mscale_all_dim"], F)
    if arch == "gemma3" and rope:
        put("rope.scaling.type", "linear", S)
        put("rope.scaling.factor", rope["factor"], F)
    return keys, tensors


def write(path: Path, arch: str, keys: Keys, tensors: dict[str, np.ndarray]) -> Path:
    """Write a GGUF file with `keys`, one placeholder weight and `tensors`."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, (value, kind) in keys.items():
        writer.add_key_value(key, value, kind)
    writer.add_tensor("token_embd.weight", np.zeros((8, 16), np.float32))
    for name, value in tensors.items():
        dtype = np.float16 if value.dtype == np.float16 else np.float32
        writer.add_tensor(name, np.ascontiguousarray(value, dtype=dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
