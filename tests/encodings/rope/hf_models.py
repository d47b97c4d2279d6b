"""Real-model RoPE parameters and small transformers 5.23 configs that carry them.

The rotary modules only read the config, so hidden sizes and layer counts are tiny; the RoPE
values are the published ones (config.json of each model). Every builder returns a fresh config:
transformers mutates `rope_parameters` in place while standardising it.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import (
    DeepseekV3Config,
    Gemma3TextConfig,
    Gemma4TextConfig,
    GPTJConfig,
    GPTNeoXConfig,
    GptOssConfig,
    HunYuanDenseV1Config,
    LlamaConfig,
    Phi3Config,
    Qwen2Config,
)

from posenc.encodings import Table, compute, parse_spec

# meta-llama/Llama-3.1-8B: head_dim 128, rope_theta 5e5.
LLAMA31_ROPE: dict[str, Any] = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# meta-llama/Llama-4-Scout-17B-16E: head_dim 128, rope_theta 5e5; low_freq_factor ==
# high_freq_factor (transformers only logs it and builds the model: an empty smoothing band).
LLAMA4_SCOUT_ROPE: dict[str, Any] = {
    "rope_type": "llama3",
    "factor": 16.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
}

# microsoft/Phi-3.5-mini-instruct: hidden 3072 / 32 heads = head_dim 96, rope_theta 1e4,
# max_position_embeddings 131072, original_max_position_embeddings 4096 (so factor 32).
PHI35_LONG_FACTOR = [
    1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601,
    1.5899999141693115, 1.600000023841858, 1.6200000047683716, 2.620000123977661,
    3.2300000190734863, 3.2300000190734863, 4.789999961853027, 7.400000095367432,
    7.700000286102295, 9.09000015258789, 12.199999809265137, 17.670000076293945,
    24.46000099182129, 28.57000160217285, 30.420001983642578, 30.840002059936523,
    32.590003967285156, 32.93000411987305, 42.320003509521484, 44.96000289916992,
    50.340003967285156, 50.45000457763672, 57.55000305175781, 57.93000411987305,
    58.21000289916992, 60.1400032043457, 62.61000442504883, 62.62000274658203,
    62.71000289916992, 63.1400032043457, 63.1400032043457, 63.77000427246094,
    63.93000411987305, 63.96000289916992, 63.970001220703125, 64.02999877929688,
    64.06999969482422, 64.08000183105469, 64.12000274658203, 64.41000366210938,
    64.4800033569336, 64.51000213623047, 64.52999877929688, 64.83999633789062,
]  # fmt: skip
PHI35_SHORT_FACTOR = [
    1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705,
    1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842,
    1.0499999523162842, 1.0699999332427979, 1.0999999046325684, 1.1099998950958252,
    1.1599998474121094, 1.1599998474121094, 1.1699998378753662, 1.2899998426437378,
    1.339999794960022, 1.679999828338623, 1.7899998426437378, 1.8199998140335083,
    1.8499997854232788, 1.8799997568130493, 1.9099997282028198, 1.9399996995925903,
    1.9899996519088745, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
    2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0299997329711914,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
    2.0799996852874756, 2.0899996757507324, 2.189999580383301, 2.2199995517730713,
    2.5899994373321533, 2.729999542236328, 2.749999523162842, 2.8399994373321533,
]  # fmt: skip
PHI35_ORIG = 4096
PHI35_MAX = 131072

# deepseek-ai/DeepSeek-V3: qk_rope_head_dim 64, qk_nope_head_dim 128, rope_theta 1e4.
DEEPSEEK_V3_ROPE: dict[str, Any] = {
    "rope_type": "yarn",
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
}

# Qwen2.5 / Qwen3 long-context recipe: yarn factor 4 over 32768, rope_theta 1e6, head_dim 128.
QWEN_YARN_ROPE: dict[str, Any] = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 32768,
}

# openai/gpt-oss-20b: head_dim 64, rope_theta 150000, yarn with truncate false.
GPT_OSS_ROPE: dict[str, Any] = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}

_TINY: dict[str, Any] = {"num_hidden_layers": 1, "intermediate_size": 16, "vocab_size": 32}


def _fresh(params: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(params)


def llama(
    head_dim: int, rope: dict[str, Any], rope_theta: float, max_position_embeddings: int = 8192
) -> LlamaConfig:
    """A Llama config (LlamaRotaryEmbedding, and every ROPE_INIT_FUNCTIONS entry, read it)."""
    return LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters={**_fresh(rope), "rope_theta": rope_theta},
        **_TINY,
    )


def qwen2_yarn() -> Qwen2Config:
    return Qwen2Config(
        hidden_size=256,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=131072,
        rope_parameters={**_fresh(QWEN_YARN_ROPE), "rope_theta": 1e6},
        **_TINY,
    )


def phi35_mini() -> Phi3Config:
    return Phi3Config(
        hidden_size=3072,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=PHI35_MAX,
        original_max_position_embeddings=PHI35_ORIG,
        rope_scaling={
            "rope_type": "longrope",
            "long_factor": list(PHI35_LONG_FACTOR),
            "short_factor": list(PHI35_SHORT_FACTOR),
        },
        rope_theta=10000.0,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        **_TINY,
    )


def pythia(rotary_pct: float = 0.25) -> GPTNeoXConfig:
    """EleutherAI/pythia-1b: hidden 2048, 8 heads (head_dim 256), rotary_pct 0.25 (64 dims)."""
    return GPTNeoXConfig(
        hidden_size=2048,
        num_attention_heads=8,
        max_position_embeddings=2048,
        rotary_pct=rotary_pct,
        rotary_emb_base=10000,
        **_TINY,
    )


def gptj() -> GPTJConfig:
    """EleutherAI/gpt-j-6b: n_embd 4096, 16 heads (head_dim 256), rotary_dim 64, 2048 positions."""
    return GPTJConfig(n_embd=4096, n_head=16, rotary_dim=64, n_positions=2048, n_layer=1)


def deepseek_v3() -> DeepseekV3Config:
    return DeepseekV3Config(
        hidden_size=256,
        num_attention_heads=2,
        num_key_value_heads=2,
        q_lora_rank=None,
        kv_lora_rank=64,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        max_position_embeddings=163840,
        rope_parameters={**_fresh(DEEPSEEK_V3_ROPE), "rope_theta": 10000.0},
        rope_interleave=True,
        n_routed_experts=2,
        num_experts_per_tok=1,
        n_group=1,
        topk_group=1,
        moe_intermediate_size=16,
        first_k_dense_replace=1,
        **_TINY,
    )


def gemma3_text() -> Gemma3TextConfig:
    """google/gemma-3-4b-it text: head_dim 256; sliding layers default RoPE theta 1e4, full
    layers linear factor 8 theta 1e6."""
    return Gemma3TextConfig(
        hidden_size=512,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=256,
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        },
        intermediate_size=16,
        vocab_size=32,
    )


def gemma4_text() -> Gemma4TextConfig:
    """Gemma 4 text defaults: sliding head_dim 256 default theta 1e4; full (global) head_dim 512,
    proportional RoPE with partial_rotary_factor 0.25, theta 1e6."""
    return Gemma4TextConfig(
        hidden_size=512,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        intermediate_size=16,
        vocab_size=32,
        vocab_size_per_layer_input=32,
    )


def gpt_oss() -> GptOssConfig:
    return GptOssConfig(
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=131072,
        rope_parameters={**_fresh(GPT_OSS_ROPE), "rope_theta": 150000.0},
        num_local_experts=2,
        num_experts_per_tok=1,
        **_TINY,
    )


def hunyuan_dense() -> HunYuanDenseV1Config:
    """tencent/Hunyuan-7B-Instruct: head_dim 128, rope_theta 1e4, "dynamic" with alpha 1000
    (transformers turns a fixed alpha into ntk_alpha)."""
    return HunYuanDenseV1Config(
        hidden_size=256,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=128,
        max_position_embeddings=32768,
        rope_parameters={
            "rope_type": "dynamic",
            "alpha": 1000.0,
            "factor": 1.0,
            "rope_theta": 10000.0,
        },
        **_TINY,
    )


def hf_forward(
    module: torch.nn.Module, positions: torch.Tensor, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin from a transformers rotary module for int64 `positions` (N,), batch dim dropped."""
    x = torch.zeros(1, dtype=torch.float32)
    cos, sin = module(x, positions[None, :], **kwargs)
    return cos[0], sin[0]


def ours(**fields: Any) -> Table:
    """posenc's table for a RoPE spec given as wire fields (kind added), on the CPU."""
    return compute(parse_spec({"kind": "rope", **fields}), "cpu")


def rows(spec: Any, positions: torch.Tensor, cast: bool = True) -> dict[str, torch.Tensor]:
    """posenc's table at arbitrary int64 `positions` (N,) through the compute path (variant
    inv_freq, half-width cos/sin, layout), as `compute` runs it for arange(max_positions).
    `cast=False` keeps the compute dtype (float64 for precision exact) and the half width."""
    from posenc.encodings.rope import half_cos_sin, layout, rope_inv_freq

    canon = spec.canonical()
    inv, attention_scaling, _ = rope_inv_freq(canon, torch.device("cpu"))
    cos, sin = half_cos_sin(canon, inv, attention_scaling, positions)
    if not cast:
        return {"cos": cos, "sin": sin, "inv_freq": inv}
    return layout(canon, cos, sin)
