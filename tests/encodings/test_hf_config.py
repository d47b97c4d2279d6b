"""`resolve_hf_config` against real config.json files and transformers' own modules.

Every file in tests/data/configs is mapped and the produced table is compared with what
transformers builds from the same dict (`AutoConfig.for_model`, no hub access): RoPE cos/sin from
the model's rotary embedding module (torch.equal, fp32, CPU), ALiBi slopes from the BLOOM / Falcon
/ MPT builders, T5 buckets and bias from `T5Attention.compute_bias`, the sinusoid tables of
Whisper, Marian and M2M100, and the vision tables: Swin's `relative_position_index` buffers of a
`SwinModel`, BEiT's `generate_relative_position_index` and bias, ViT's learned table through
`ViTEmbeddings.interpolate_pos_encoding`, and ViTMAE's fixed sin-cos tables (bit for bit).

Provenance of the config files (`SOURCES`): the published config.json of the named checkpoint
(the fields that matter; quantization and auto_map blocks left out), transformers 5.23's own
re-serialisation of one (`__v5`: `AutoConfig.for_model(...).to_diff_dict()`, the v5
`rope_parameters` shape), or a labelled variant of a published file. The vision files hold the
published config.json fields as public copies of them quote them (id2label/label2id left out;
transformers_version left out where the copies disagree).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig

from posenc.encodings import ConfigError, compute, content_key
from posenc.encodings.alibi import reference_slopes
from posenc.encodings.hf_config import NamedSpec, from_hf_config, resolve_hf_config
from tests.tolerances import ATOL

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
N = 300
"""Positions compared per table."""

SOURCES: dict[str, str] = {
    "meta-llama__Llama-3.1-8B.json": "published",
    "meta-llama__Llama-3.1-8B__v5.json": "transformers 5.23 re-serialisation (v5 shape)",
    "meta-llama__Llama-3.2-1B.json": "published",
    "meta-llama__Llama-2-7b-hf.json": "published (no rope_theta key: the class default)",
    "mistralai__Mistral-7B-v0.3.json": "published",
    "Qwen__Qwen2.5-7B-Instruct.json": "published",
    "Qwen__Qwen2.5-7B-Instruct__yarn.json": "published + the model card's YaRN rope_scaling",
    "Qwen__Qwen3-8B.json": "published",
    "microsoft__Phi-3.5-mini-instruct.json": "published",
    "microsoft__Phi-3.5-mini-instruct__v5.json": "transformers 5.23 re-serialisation",
    "google__gemma-3-4b-it.json": "published (v4, minimal: class defaults fill the rest)",
    "google__gemma-3-4b-it__v5.json": "transformers 5.23 re-serialisation (nested per layer)",
    "EleutherAI__gpt-neox-20b.json": "published",
    "EleutherAI__gpt-neox-20b__v5.json": "transformers 5.23 re-serialisation",
    "EleutherAI__gpt-j-6b.json": "published",
    "deepseek-ai__DeepSeek-V3.json": "published (quantization_config, auto_map left out)",
    "openai__gpt-oss-20b.json": "published (quantization_config left out)",
    "lmsys__vicuna-7b-v1.5-16k.json": "vicuna-7b-v1.5-16k style: linear factor 4 on Llama 2",
    "synthetic__Llama-2-7b-dynamic-ntk.json": "Llama-2-7b + rope_scaling dynamic factor 2 "
    "(transformers docs' example; not a published checkpoint)",
    "tencent__Hunyuan-7B-Instruct.json": "the RoPE fields of tencent/Hunyuan-7B-Instruct "
    "(dynamic + alpha 1000); head_dim spelled out, transformers' ntk_alpha path reads it",
    "bigscience__bloom-560m.json": "published",
    "tiiuae__falcon-rw-1b.json": "published",
    "mosaicml__mpt-7b.json": "published (init_config, auto_map left out)",
    "google-t5__t5-small.json": "published (task_specific_params left out)",
    "openai__whisper-tiny.json": "published (token lists left out)",
    "Helsinki-NLP__opus-mt-en-de.json": "published (id2label left out)",
    "facebook__m2m100_418M.json": "published",
    "microsoft__swin-tiny-patch4-window7-224.json": "published fields as public copies quote them "
    "(id2label/label2id, transformers_version left out)",
    "microsoft__beit-base-patch16-224.json": "published fields as public copies quote them "
    "(id2label/label2id, transformers_version left out)",
    "google__vit-base-patch16-224-in21k.json": "published",
    "facebook__vit-mae-base.json": "published",
}

# name -> the spec fields that matter (a subset of model_dump), per config file.
EXPECTED: dict[str, dict[str, dict[str, Any]]] = {
    "meta-llama__Llama-3.1-8B.json": {
        "rope": {
            "head_dim": 128,
            "rotary_dim": 128,
            "rope_theta": 500000.0,
            "max_positions": 131072,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        }
    },
    "meta-llama__Llama-3.2-1B.json": {
        "rope": {
            "head_dim": 64,
            "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 32.0},
        }
    },
    "meta-llama__Llama-2-7b-hf.json": {
        "rope": {"head_dim": 128, "rope_theta": 10000.0, "max_positions": 4096}
    },
    "mistralai__Mistral-7B-v0.3.json": {
        "rope": {"head_dim": 128, "rope_theta": 1e6, "max_positions": 32768}
    },
    "Qwen__Qwen2.5-7B-Instruct.json": {"rope": {"head_dim": 128, "rope_theta": 1e6}},
    "Qwen__Qwen2.5-7B-Instruct__yarn.json": {
        "rope": {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32768,
                "truncate": True,
            }
        }
    },
    "Qwen__Qwen3-8B.json": {"rope": {"head_dim": 128, "max_positions": 40960}},
    "microsoft__Phi-3.5-mini-instruct.json": {
        "rope": {
            "head_dim": 96,
            "max_positions": 131072,
            "rope_scaling": {
                "rope_type": "longrope",
                "original_max_position_embeddings": 4096,
                "max_position_embeddings": 131072,
            },
        }
    },
    "google__gemma-3-4b-it.json": {
        "rope:sliding_attention": {"head_dim": 256, "rope_theta": 10000.0},
        "rope:full_attention": {
            "head_dim": 256,
            "rope_theta": 1e6,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        },
    },
    "EleutherAI__gpt-neox-20b.json": {"rope": {"head_dim": 96, "rotary_dim": 24}},
    "EleutherAI__gpt-j-6b.json": {
        "rope": {"head_dim": 256, "rotary_dim": 64, "interleaved": True, "max_positions": 2048}
    },
    "deepseek-ai__DeepSeek-V3.json": {
        "rope": {
            "head_dim": 64,
            "rotary_dim": 64,
            "interleaved": True,
            "max_positions": 163840,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 40.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 4096,
            },
        }
    },
    "openai__gpt-oss-20b.json": {
        "rope": {
            "head_dim": 64,
            "rope_theta": 150000.0,
            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "truncate": False},
        }
    },
    "lmsys__vicuna-7b-v1.5-16k.json": {
        "rope": {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}
    },
    "synthetic__Llama-2-7b-dynamic-ntk.json": {
        "rope": {
            "rope_scaling": {
                "rope_type": "dynamic",
                "factor": 2.0,
                "max_position_embeddings": 4096,
            }
        }
    },
    "tencent__Hunyuan-7B-Instruct.json": {
        "rope": {"head_dim": 128, "rope_scaling": {"rope_type": "ntk_alpha", "alpha": 1000.0}}
    },
    "bigscience__bloom-560m.json": {"alibi": {"num_heads": 16, "slope_scale": 1.0}},
    "tiiuae__falcon-rw-1b.json": {"alibi": {"num_heads": 32, "slope_scale": 0.125}},
    "mosaicml__mpt-7b.json": {"alibi": {"num_heads": 32, "alibi_bias_max": 8.0}},
    "google-t5__t5-small.json": {
        "t5_bias:encoder": {"num_buckets": 32, "max_distance": 128, "bidirectional": True},
        "t5_bias:decoder": {"num_buckets": 32, "max_distance": 128, "bidirectional": False},
    },
    "openai__whisper-tiny.json": {
        "sinusoidal:encoder": {"dim": 384, "max_positions": 1500, "convention": "whisper"}
    },
    "Helsinki-NLP__opus-mt-en-de.json": {
        "sinusoidal": {"dim": 512, "max_positions": 512, "convention": "marian"}
    },
    "facebook__m2m100_418M.json": {
        "sinusoidal": {
            "dim": 1024,
            "max_positions": 1026,
            "convention": "fairseq",
            "padding_idx": 1,
        }
    },
    "microsoft__swin-tiny-patch4-window7-224.json": {
        "relative_index": {"scheme": "swin", "window_size": [7, 7]}
    },
    "microsoft__beit-base-patch16-224.json": {
        "relative_index": {"scheme": "beit", "window_size": [14, 14]}
    },
    "google__vit-base-patch16-224-in21k.json": {
        "learned": {
            "method": "hf_vit",
            "table_key": "0" * 64,
            "table_shape": [197, 768],
            "grid": [14, 14],
            "new_grid": [14, 14],
        }
    },
    "facebook__vit-mae-base.json": {
        "sinusoidal_2d:encoder": {
            "style": "mae",
            "dim": 768,
            "grid_height": 14,
            "grid_width": 14,
            "cls_token": True,
        },
        "sinusoidal_2d:decoder": {"style": "mae", "dim": 512, "grid_height": 14, "cls_token": True},
    },
}

RESOLVE_OVERRIDES: dict[str, dict[str, Any]] = {
    # A learned table is checkpoint weights: the mapping needs the uploaded table's key.
    "google__vit-base-patch16-224-in21k.json": {"table_key": "0" * 64},
}

V4_V5_PAIRS = [
    ("meta-llama__Llama-3.1-8B.json", "meta-llama__Llama-3.1-8B__v5.json"),
    ("microsoft__Phi-3.5-mini-instruct.json", "microsoft__Phi-3.5-mini-instruct__v5.json"),
    ("google__gemma-3-4b-it.json", "google__gemma-3-4b-it__v5.json"),
    ("EleutherAI__gpt-neox-20b.json", "EleutherAI__gpt-neox-20b__v5.json"),
]
for _v4, _v5 in V4_V5_PAIRS:
    EXPECTED[_v5] = EXPECTED[_v4]
EXPECTED["Qwen__Qwen2.5-7B-Instruct__yarn.json"]["rope"].update(head_dim=128, rope_theta=1e6)


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONFIGS / name).read_text())
    return data


def subset(actual: Mapping[str, Any], expected: Mapping[str, Any], where: str) -> None:
    for key, value in expected.items():
        assert key in actual, f"{where}.{key} missing"
        if isinstance(value, Mapping):
            subset(actual[key], value, f"{where}.{key}")
        else:
            assert actual[key] == value, f"{where}.{key}: {actual[key]!r} != {value!r}"


def hf_config(config: Mapping[str, Any]) -> Any:
    """transformers' config object for a config dict (its text config for multimodal ones)."""
    rest = {k: v for k, v in config.items() if k != "model_type"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = AutoConfig.for_model(config["model_type"], **rest)
    return getattr(cfg, "text_config", None) or cfg


def test_every_config_file_is_listed() -> None:
    files = {p.name for p in CONFIGS.glob("*.json")}
    assert files == set(SOURCES) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_resolves_to_expected_specs(name: str) -> None:
    overrides = RESOLVE_OVERRIDES.get(name, {})
    resolved = resolve_hf_config(load(name), **overrides)
    assert [n.name for n in resolved] == list(EXPECTED[name])
    for named in resolved:
        subset(named.spec.model_dump(), EXPECTED[name][named.name], named.name)
    assert [n.spec for n in resolved] == from_hf_config(load(name), **overrides)


@pytest.mark.parametrize(("v4", "v5"), V4_V5_PAIRS)
def test_v4_and_v5_shapes_give_the_same_content_key(v4: str, v5: str) -> None:
    a, b = resolve_hf_config(load(v4)), resolve_hf_config(load(v5))
    assert {n.name: content_key(n.spec) for n in a} == {n.name: content_key(n.spec) for n in b}


# ---------------------------------------------------------------------------------------------
# RoPE: cos/sin tables against the model's rotary embedding module


def _rotary_class(model_type: str) -> Any:
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    module_name = model_type_to_module_name(model_type.removesuffix("_text"))
    module = __import__(f"transformers.models.{module_name}.modeling_{module_name}", fromlist=["_"])
    classes = [
        getattr(module, n)
        for n in dir(module)
        if n.endswith("RotaryEmbedding") and "Vision" not in n and "Text" in n
    ] or [getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding")]
    assert len(classes) == 1, (model_type, classes)
    return classes[0]


def hf_cos_sin(
    config: Mapping[str, Any], positions: torch.Tensor, layer_type: str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' cos/sin rows for `positions` (fp32, CPU), as its forward returns them."""
    cfg = hf_config(config)
    x = torch.zeros(1, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rotary = _rotary_class(cfg.model_type)(cfg)
        args = (
            (x, positions[None, :]) if layer_type is None else (x, positions[None, :], layer_type)
        )
        out = rotary(*args)
    if isinstance(out, torch.Tensor):  # DeepSeek-V2 style complex freqs_cis
        return out.real[0], out.imag[0]
    cos, sin = out
    return cos[0], sin[0]


def ours_half(named: NamedSpec, rows: int, **overrides: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Our half-width cos/sin (rows, d/2) plus a check of the full-width layout."""
    spec = named.spec.model_copy(update={"max_positions": rows, **overrides})
    table = compute(spec)
    cos, sin = table.tensors["cos"], table.tensors["sin"]
    d = cos.shape[-1]
    if spec.canonical().interleaved:
        half_c, half_s = cos[:, 0::2], sin[:, 0::2]
        assert torch.equal(cos[:, 1::2], half_c)
        assert torch.equal(sin[:, 1::2], half_s)
    else:
        half_c, half_s = cos[:, : d // 2], sin[:, : d // 2]
        assert torch.equal(cos[:, d // 2 :], half_c)
        assert torch.equal(sin[:, d // 2 :], half_s)
    return half_c, half_s


def hf_half(cos: torch.Tensor, d_half: int) -> torch.Tensor:
    """transformers' full-width cat(c, c) (or GPT-OSS's half-width) reduced to (rows, d/2)."""
    if cos.shape[-1] == 2 * d_half:
        assert torch.equal(cos[:, :d_half], cos[:, d_half:])
    return cos[:, :d_half]


ROPE_FILES = sorted(
    n
    for n, exp in EXPECTED.items()
    if any(k.startswith("rope") for k in exp) and n != "EleutherAI__gpt-j-6b.json"
)


@pytest.mark.parametrize("name", ROPE_FILES)
def test_rope_tables_equal_transformers(name: str) -> None:
    config = load(name)
    resolved = resolve_hf_config(config, max_positions=N)
    positions = torch.arange(N)
    for named in resolved:
        layer_type = named.notes.get("layer_types", [None])[0]
        our_cos, our_sin = ours_half(named, N)
        cos, sin = hf_cos_sin(config, positions, layer_type)
        d_half = our_cos.shape[-1]
        assert torch.equal(hf_half(cos, d_half), our_cos), named.name
        assert torch.equal(hf_half(sin, d_half), our_sin), named.name


@pytest.mark.parametrize(
    ("name", "seq_len"),
    [
        ("microsoft__Phi-3.5-mini-instruct.json", 4096),  # last length on the short factors
        ("microsoft__Phi-3.5-mini-instruct.json", 4097),  # first length on the long factors
        ("synthetic__Llama-2-7b-dynamic-ntk.json", 4096),
        ("synthetic__Llama-2-7b-dynamic-ntk.json", 6000),  # transformers' forward-time update
    ],
)
def test_length_dependent_tables_follow_the_sequence_length(name: str, seq_len: int) -> None:
    """transformers picks the table from max(position_ids)+1; our spec from seq_len."""
    config = load(name)
    (named,) = resolve_hf_config(config, seq_len=seq_len)
    positions = torch.cat((torch.arange(N), torch.tensor([seq_len - 1])))
    cos, sin = hf_cos_sin(config, positions, None)
    our_cos, our_sin = ours_half(named, N)
    d_half = our_cos.shape[-1]
    assert torch.equal(hf_half(cos, d_half)[:N], our_cos)
    assert torch.equal(hf_half(sin, d_half)[:N], our_sin)


def test_gptj_table_equals_create_sinusoidal_positions() -> None:
    from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions

    config = load("EleutherAI__gpt-j-6b.json")
    (named,) = resolve_hf_config(config, max_positions=N)
    our_cos, our_sin = ours_half(named, N)
    hf = create_sinusoidal_positions(N, config["rotary_dim"])  # cat(sin, cos), half width each
    assert torch.equal(hf[:, : our_sin.shape[1]], our_sin)
    assert torch.equal(hf[:, our_sin.shape[1] :], our_cos)


def test_gemma4_proportional_per_layer_head_dim() -> None:
    """Gemma 4 as transformers serialises its defaults: proportional RoPE on full-attention
    layers with their own head_dim (per_layer_config), default RoPE on sliding layers."""
    from transformers import Gemma4TextConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = Gemma4TextConfig().to_dict()
    resolved = {n.name: n for n in resolve_hf_config(config, max_positions=N)}
    assert set(resolved) == {"rope:sliding_attention", "rope:full_attention"}
    full = resolved["rope:full_attention"].spec.model_dump()
    assert full["head_dim"] == 512
    assert full["rope_scaling"] == {
        "rope_type": "proportional",
        "factor": 1.0,
        "partial_rotary_factor": 0.25,
    }
    for named in resolved.values():
        layer_type = named.notes["layer_types"][0]
        our_cos, our_sin = ours_half(named, N)
        cos, sin = hf_cos_sin(config, torch.arange(N), layer_type)
        assert torch.equal(hf_half(cos, our_cos.shape[1]), our_cos), named.name
        assert torch.equal(hf_half(sin, our_sin.shape[1]), our_sin), named.name


@pytest.mark.parametrize("model_type", ["deepseek_v2", "minicpm3", "falcon"])
def test_transformers_default_configs(model_type: str) -> None:
    """Configs as transformers serialises its class defaults (v5 shape): DeepSeek-V2's complex
    freqs_cis (interleaved pairs), MiniCPM3's half-split MLA, Falcon's rotary (alibi false)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.for_model(model_type).to_dict()
    (named,) = resolve_hf_config(config, max_positions=N)
    interleaved = model_type == "deepseek_v2"
    assert named.notes["pairing"] == ("interleaved" if interleaved else "half_split")
    our_cos, our_sin = ours_half(named, N)
    cos, sin = hf_cos_sin(config, torch.arange(N), None)
    if interleaved:
        # torch.polar (DeepSeek-V2's freqs_cis) is within an ulp of cos/sin of the same angles;
        # the inverse frequencies themselves are bit-identical.
        cfg = hf_config(config)
        rotary = _rotary_class(cfg.model_type)(cfg)
        assert torch.equal(compute(named.spec).tensors["inv_freq"], rotary.inv_freq)
        torch.testing.assert_close(cos, our_cos, rtol=0, atol=ATOL["float32"])
        torch.testing.assert_close(sin, our_sin, rtol=0, atol=ATOL["float32"])
        return
    assert torch.equal(hf_half(cos, our_cos.shape[1]), our_cos)
    assert torch.equal(hf_half(sin, our_sin.shape[1]), our_sin)


def test_notes_carry_what_the_runtime_needs() -> None:
    (deepseek,) = resolve_hf_config(load("deepseek-ai__DeepSeek-V3.json"))
    multiplier = (0.1 * 1.0 * math.log(40) + 1.0) ** 2
    assert deepseek.notes["softmax_scale_multiplier"] == pytest.approx(multiplier, rel=1e-15)
    assert deepseek.notes["softmax_scale"] == pytest.approx((128 + 64) ** -0.5 * multiplier)
    assert deepseek.notes["pairing"] == "interleaved"
    assert compute(deepseek.spec.model_copy(update={"max_positions": 8})).meta[
        "softmax_scale_multiplier"
    ] == pytest.approx(multiplier)
    (phi,) = resolve_hf_config(load("microsoft__Phi-3.5-mini-instruct.json"))
    assert phi.notes["longrope_switch_point"] == 4096
    assert phi.notes["attention_scaling"] == pytest.approx(
        math.sqrt(1 + math.log(131072 / 4096) / math.log(4096))
    )
    (oss,) = resolve_hf_config(load("openai__gpt-oss-20b.json"))
    assert oss.notes["attention_scaling"] == pytest.approx(0.1 * math.log(32) + 1)
    (bloom,) = resolve_hf_config(load("bigscience__bloom-560m.json"))
    assert "serve slopes" in bloom.notes["serve"]
    (whisper,) = resolve_hf_config(load("openai__whisper-tiny.json"))
    assert "learned" in whisper.notes["decoder"]


def test_gpt_oss_layer_types_share_one_table() -> None:
    (named,) = resolve_hf_config(load("openai__gpt-oss-20b.json"))
    assert named.name == "rope"
    assert resolve_hf_config(load("openai__gpt-oss-20b.json"), layer_type="sliding_attention")


# ---------------------------------------------------------------------------------------------
# ALiBi


def _slopes(name: str) -> torch.Tensor:
    (named,) = resolve_hf_config(load(name))
    return compute(named.spec).tensors["slopes"]


def test_bloom_slopes_match_transformers() -> None:
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    hf = _get_alibi_slopes(16, torch.device("cpu"))
    torch.testing.assert_close(_slopes("bigscience__bloom-560m.json"), hf, rtol=1e-6, atol=0)


def test_falcon_slopes_match_transformers() -> None:
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    config = load("tiiuae__falcon-rw-1b.json")
    heads, head_dim = 32, config["hidden_size"] // 32
    alibi = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), heads, torch.float32)
    hf_bf16_slopes = alibi[:, 0, 1]  # slope * key position 1, slopes rounded to bf16
    ours = _slopes("tiiuae__falcon-rw-1b.json")
    scale = 1.0 / math.sqrt(head_dim)
    assert torch.equal((ours / scale).bfloat16().float(), hf_bf16_slopes)


def test_mpt_slopes_match_transformers() -> None:
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    alibi = build_mpt_alibi_tensor(32, 2, alibi_bias_max=8)  # (H, 1, 2): slope * [-1, 0]
    torch.testing.assert_close(_slopes("mosaicml__mpt-7b.json"), -alibi[:, 0, 0], rtol=1e-6, atol=0)


def test_baichuan_13b_is_alibi_and_7b_is_rope() -> None:
    # Published Baichuan-13B-Base / Baichuan-7B fields that decide the position scheme.
    big = {
        "model_type": "baichuan",
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "model_max_length": 4096,
    }
    (named,) = resolve_hf_config(big)
    assert named.name == "alibi"
    assert named.spec.model_dump()["num_heads"] == 40
    torch.testing.assert_close(
        compute(named.spec).tensors["slopes"],
        torch.tensor(reference_slopes(40), dtype=torch.float64).float(),
        rtol=0,
        atol=0,
    )
    small = {
        "model_type": "baichuan",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "max_position_embeddings": 4096,
    }
    (rope,) = resolve_hf_config(small)
    assert rope.name == "rope"
    assert rope.spec.model_dump()["head_dim"] == 128


# ---------------------------------------------------------------------------------------------
# T5 relative position buckets


@pytest.mark.parametrize("role", ["encoder", "decoder"])
def test_t5_bias_matches_compute_bias(role: str) -> None:
    from transformers.models.t5.modeling_t5 import T5Attention

    config = load("google-t5__t5-small.json")
    (named,) = resolve_hf_config(config, layer_type=role, key_length=N)
    assert named.name == f"t5_bias:{role}"
    cfg = hf_config(config)
    cfg.is_decoder = role == "decoder"
    torch.manual_seed(0)
    attention = T5Attention(cfg, has_relative_attention_bias=True)
    weights = attention.relative_attention_bias.weight.detach()
    with torch.no_grad():
        hf = attention.compute_bias(N, N)[0]
    spec = named.spec.model_copy(update={"relative_attention_bias": weights.tolist()})
    assert torch.equal(compute(spec).tensors["bias"], hf)


# ---------------------------------------------------------------------------------------------
# Sinusoidal tables


def _embedding(name: str) -> torch.Tensor:
    (named,) = resolve_hf_config(load(name))
    return compute(named.spec).tensors["embedding"]


def test_whisper_encoder_sinusoids() -> None:
    from transformers.models.whisper.modeling_whisper import sinusoids

    assert torch.equal(_embedding("openai__whisper-tiny.json"), sinusoids(1500, 384))


def test_marian_static_positions() -> None:
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    module = MarianSinusoidalPositionalEmbedding(512, 512, padding_idx=58100)
    assert torch.equal(_embedding("Helsinki-NLP__opus-mt-en-de.json"), module.create_weight())


def test_m2m100_positions_with_offset_and_padding_row() -> None:
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding

    module = M2M100SinusoidalPositionalEmbedding(1024, 1024, padding_idx=1)
    assert torch.equal(_embedding("facebook__m2m100_418M.json"), module.weights)


# ---------------------------------------------------------------------------------------------
# Vision transformers: Swin / BEiT relative indices, ViT learned tables, ViTMAE sin-cos


def _quiet(build: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build()


def test_swin_index_equals_every_buffer_of_a_swin_model() -> None:
    """SwinModel built from the published config (embed_dim shrunk to 6: the index depends on
    window_size only): every block's relative_position_index buffer is our (N, N) index."""
    from transformers import SwinModel

    config = load("microsoft__swin-tiny-patch4-window7-224.json")
    (named,) = resolve_hf_config(config)
    index = compute(named.spec).tensors["index"]
    assert index.shape == (49, 49)
    torch.manual_seed(0)
    model = _quiet(lambda: SwinModel(hf_config({**config, "embed_dim": 6})))
    buffers = [b for n, b in model.named_buffers() if n.endswith("relative_position_index")]
    assert len(buffers) == sum(config["depths"])
    for buffer in buffers:
        assert buffer.dtype == index.dtype
        assert torch.equal(buffer, index.reshape(-1))
    assert named.notes["num_heads_per_stage"] == [3, 6, 12, 24]


def test_swin_bias_equals_relative_position_bias_forward() -> None:
    from transformers.models.swin.modeling_swin import SwinRelativePositionBias

    config = load("microsoft__swin-tiny-patch4-window7-224.json")
    torch.manual_seed(0)
    module = SwinRelativePositionBias(3, (7, 7))
    with torch.no_grad():
        module.relative_position_bias_table.normal_()
        hf = module()[0]
    table = module.relative_position_bias_table.detach().tolist()
    (named,) = resolve_hf_config(config, relative_position_bias_table=table)
    assert torch.equal(compute(named.spec).tensors["bias"], hf)


def test_swin_absolute_embeddings_resample_as_swin_embeddings() -> None:
    from transformers.models.swin.modeling_swin import SwinEmbeddings

    config = {
        **load("microsoft__swin-tiny-patch4-window7-224.json"),
        "use_absolute_embeddings": True,
        "embed_dim": 8,
    }
    with pytest.raises(ConfigError) as info:
        resolve_hf_config(config)
    assert _problem_fields(info.value) == ["table_key"]
    torch.manual_seed(0)
    module = SwinEmbeddings(hf_config(config))
    with torch.no_grad():
        module.position_embeddings.normal_()
    table = module.position_embeddings.detach()[0]
    for height, width in ((224, 224), (160, 160), (320, 256)):
        new_grid = [height // 4, width // 4]
        (named,) = resolve_hf_config(
            config, kind="learned", table=table.tolist(), new_grid=new_grid
        )
        assert named.spec.model_dump()["num_prefix_tokens"] == 0
        embeddings = torch.zeros(1, new_grid[0] * new_grid[1], 8)
        with torch.no_grad():
            hf = module.interpolate_pos_encoding(embeddings, height, width)[0]
        assert torch.equal(compute(named.spec).tensors["embedding"], hf), (height, width)


def test_beit_index_and_bias_equal_beit_relative_position_bias() -> None:
    from transformers.models.beit.modeling_beit import BeitRelativePositionBias

    config = load("microsoft__beit-base-patch16-224.json")
    (bare,) = resolve_hf_config(config)
    index = compute(bare.spec).tensors["index"]
    hf_index = BeitRelativePositionBias.generate_relative_position_index((14, 14))
    assert index.shape == (197, 197)
    assert torch.equal(index, hf_index)
    torch.manual_seed(0)
    module = _quiet(lambda: BeitRelativePositionBias(hf_config(config)))
    with torch.no_grad():
        module.relative_position_bias_table.normal_()
        hf = module((14, 14))[0]
    table = module.relative_position_bias_table.detach().tolist()
    (named,) = resolve_hf_config(config, relative_position_bias_table=table)
    assert torch.equal(compute(named.spec).tensors["bias"], hf)
    # the checkpoint's table uploaded to a TableStore and named by key: the same spec key and bias
    from posenc.encodings.weights import TableStore, resolve_tables

    store = TableStore()
    key = store.put(module.relative_position_bias_table.detach())
    (by_key,) = resolve_hf_config(
        config,
        relative_position_bias_table_key=key,
        relative_position_bias_table_shape=[732, 12],
    )
    assert content_key(by_key.spec) == content_key(named.spec)
    assert torch.equal(compute(resolve_tables(by_key.spec, store)).tensors["bias"], hf)


def test_data2vec_vision_shared_bias_on_a_non_square_grid() -> None:
    """data2vec-vision as transformers serialises it, shared bias, 224x160 images (a 14x10 patch
    grid, so height and width cannot be swapped unnoticed)."""
    from transformers import Data2VecVisionModel

    config = _quiet(
        lambda: AutoConfig.for_model(
            "data2vec-vision",
            use_shared_relative_position_bias=True,
            image_size=[224, 160],
            hidden_size=8,
            num_attention_heads=2,
            intermediate_size=8,
            num_hidden_layers=1,
        ).to_dict()
    )
    (named,) = resolve_hf_config(config)
    assert named.spec.model_dump()["window_size"] == [14, 10]
    assert "shared" in named.notes["bias"]
    model = _quiet(lambda: Data2VecVisionModel(hf_config(config)))
    bias = model.encoder.relative_position_bias
    assert tuple(bias.window_size) == (14, 10)
    hf_index = bias.generate_relative_position_index(tuple(bias.window_size))
    assert torch.equal(compute(named.spec).tensors["index"], hf_index)


def test_beit_absolute_embeddings_need_the_uploaded_table() -> None:
    config = {
        **load("microsoft__beit-base-patch16-224.json"),
        "use_absolute_position_embeddings": True,
    }
    with pytest.raises(ConfigError) as info:
        resolve_hf_config(config)
    assert _problem_fields(info.value) == ["table_key"]
    assert "embeddings.position_embeddings" in info.value.problems[0].message
    (index,) = resolve_hf_config(config, kind="relative_index")
    assert index.name == "relative_index"
    names = [n.name for n in resolve_hf_config(config, table_key="1" * 64)]
    assert names == ["relative_index", "learned"]
    # A 14x10 grid: the learned table cannot be resampled, the index still resolves.
    wide = {**config, "image_size": [224, 160]}
    with pytest.raises(ConfigError) as info:
        resolve_hf_config(wide, table_key="1" * 64)
    assert _problem_fields(info.value) == ["image_size"]
    (index,) = resolve_hf_config(wide, kind="relative_index")
    assert index.spec.model_dump()["window_size"] == [14, 10]


@pytest.mark.parametrize(("height", "width"), [(224, 224), (384, 384), (320, 240), (160, 160)])
def test_vit_learned_table_equals_interpolate_pos_encoding(height: int, width: int) -> None:
    """The table uploaded to a TableStore, bound by key, resampled to the model's grid: exactly
    what ViTEmbeddings adds with interpolate_pos_encoding=True."""
    from transformers.models.vit.modeling_vit import ViTEmbeddings

    from posenc.encodings.weights import TableStore, resolve_tables

    config = load("google__vit-base-patch16-224-in21k.json")
    torch.manual_seed(0)
    module = _quiet(lambda: ViTEmbeddings(hf_config(config)))
    store = TableStore()
    key = store.put(module.position_embeddings.detach())
    new_grid = [height // 16, width // 16]
    (named,) = resolve_hf_config(config, table_key=key, new_grid=new_grid)
    assert named.name == "learned"
    spec = resolve_tables(named.spec, store)
    embeddings = torch.zeros(1, 1 + new_grid[0] * new_grid[1], 768)
    with torch.no_grad():
        hf = module.interpolate_pos_encoding(embeddings, height, width)[0]
    assert torch.equal(compute(spec).tensors["embedding"], hf)


def test_vit_mae_tables_equal_initialize_weights() -> None:
    from transformers.models.vit_mae.modeling_vit_mae import ViTMAEDecoder, ViTMAEEmbeddings

    config = load("facebook__vit-mae-base.json")
    cfg = hf_config({**config, "decoder_num_hidden_layers": 1})
    torch.manual_seed(0)
    embeddings = ViTMAEEmbeddings(cfg)
    embeddings.initialize_weights()
    decoder = ViTMAEDecoder(cfg, num_patches=embeddings.patch_embeddings.num_patches)
    hf = {
        "sinusoidal_2d:encoder": embeddings.position_embeddings.detach()[0],
        "sinusoidal_2d:decoder": decoder.decoder_pos_embed.detach()[0],
    }
    resolved = resolve_hf_config(config)
    assert [n.name for n in resolved] == list(hf)
    for named in resolved:
        ours = compute(named.spec).tensors["embedding"]
        assert ours.dtype == hf[named.name].dtype == torch.float32
        assert torch.equal(ours, hf[named.name]), named.name


def test_vit_mae_equal_widths_share_one_table() -> None:
    config = {**load("facebook__vit-mae-base.json"), "decoder_hidden_size": 768}
    (named,) = resolve_hf_config(config)
    assert named.name == "sinusoidal_2d"
    assert resolve_hf_config(config, layer_type="decoder") == [named]


# ---------------------------------------------------------------------------------------------
# Filters, overrides, errors


def test_filters_and_overrides() -> None:
    gemma = load("google__gemma-3-4b-it.json")
    (full,) = resolve_hf_config(gemma, layer_type="full_attention", dtype="bfloat16")
    assert full.name == "rope:full_attention"
    assert full.spec.model_dump()["dtype"] == "bfloat16"
    assert resolve_hf_config(gemma, kind="rope") == resolve_hf_config(gemma)
    (whisper,) = resolve_hf_config(load("openai__whisper-tiny.json"), max_positions=10)
    assert whisper.spec.model_dump()["max_positions"] == 10
    (neox,) = resolve_hf_config(load("EleutherAI__gpt-neox-20b.json"), profile="vllm")
    assert compute(neox.spec.model_copy(update={"max_positions": 4})).tensors["cos_sin"].shape == (
        4,
        24,
    )


def _problem_fields(err: ConfigError) -> list[str]:
    return [p.field for p in err.problems]


ERROR_CASES: list[tuple[str, Callable[[], Any], str]] = [
    (
        "learned absolute positions",
        lambda: resolve_hf_config({"model_type": "gpt2", "n_positions": 1024, "n_embd": 768}),
        "model_type",
    ),
    (
        "unknown model without position fields",
        lambda: resolve_hf_config({"model_type": "mystery", "hidden_size": 64}),
        "model_type",
    ),
    (
        "unknown rope type",
        lambda: resolve_hf_config(
            {**load("meta-llama__Llama-2-7b-hf.json"), "rope_scaling": {"type": "fancy"}}
        ),
        "rope_scaling.rope_type",
    ),
    (
        "multimodal rope",
        lambda: resolve_hf_config(
            {
                **load("Qwen__Qwen2.5-7B-Instruct.json"),
                "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            }
        ),
        "rope_scaling.mrope_section",
    ),
    (
        "missing head size",
        lambda: resolve_hf_config({"model_type": "llama", "rope_theta": 1e4}),
        "hidden_size",
    ),
    (
        "unknown model without rope_theta",
        lambda: resolve_hf_config(
            {
                "model_type": "mystery",
                "rope_scaling": None,
                "partial_rotary_factor": 0.5,
                "hidden_size": 64,
                "num_attention_heads": 4,
            }
        ),
        "rope_theta",
    ),
    (
        "no length for the rows",
        lambda: resolve_hf_config(
            {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4}
        ),
        "max_position_embeddings",
    ),
    (
        "override no spec takes",
        lambda: resolve_hf_config(load("bigscience__bloom-560m.json"), profile="hf"),
        "profile",
    ),
    (
        "override named like the argument",
        lambda: resolve_hf_config(load("bigscience__bloom-560m.json"), config={}),
        "config",
    ),
    (
        "kind the model lacks",
        lambda: resolve_hf_config(load("bigscience__bloom-560m.json"), kind="rope"),
        "kind",
    ),
    (
        "mpt without alibi",
        lambda: resolve_hf_config(
            {**load("mosaicml__mpt-7b.json"), "attn_config": {"alibi": False}}
        ),
        "attn_config.alibi",
    ),
    (
        "longrope factors of the wrong length",
        lambda: resolve_hf_config(
            {
                **load("microsoft__Phi-3.5-mini-instruct.json"),
                "rope_scaling": {
                    **load("microsoft__Phi-3.5-mini-instruct.json")["rope_scaling"],
                    "short_factor": [1.0] * 47,
                },
            }
        ),
        "rope_scaling",
    ),
    (
        "vit without its uploaded table",
        lambda: resolve_hf_config(load("google__vit-base-patch16-224-in21k.json")),
        "table_key",
    ),
    (
        "beit without any position encoding",
        lambda: resolve_hf_config(
            {**load("microsoft__beit-base-patch16-224.json"), "use_relative_position_bias": False}
        ),
        "use_relative_position_bias",
    ),
    (
        "vit_mae with a non-square patch count",
        lambda: resolve_hf_config(
            {**load("facebook__vit-mae-base.json"), "image_size": [224, 160]}
        ),
        "image_size",
    ),
    (
        "vit with a non-square grid (interpolation reshapes to a square)",
        lambda: resolve_hf_config(
            {**load("google__vit-base-patch16-224-in21k.json"), "image_size": [224, 160]},
            table_key="0" * 64,
        ),
        "image_size",
    ),
    (
        "swin window that is not an integer",
        lambda: resolve_hf_config(
            {**load("microsoft__swin-tiny-patch4-window7-224.json"), "window_size": 7.5}
        ),
        "window_size",
    ),
    (
        "patch larger than the image",
        lambda: resolve_hf_config({**load("facebook__vit-mae-base.json"), "patch_size": 256}),
        "patch_size",
    ),
    (
        "text_config path in the key",
        lambda: resolve_hf_config(
            {"model_type": "gemma3", "text_config": {"rope_scaling": {"rope_type": "bogus"}}}
        ),
        "text_config.rope_scaling.full_attention.rope_type",
    ),
]


@pytest.mark.parametrize(("what", "call", "field"), ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_unmappable_configs_raise_config_error(
    what: str, call: Callable[[], Any], field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.error_type == "unsupported_config"
    assert any(f.startswith(field) for f in _problem_fields(info.value)), (
        what,
        _problem_fields(info.value),
    )
