"""Shared by the hf_config tests: the config files in tests/data/configs, where each came from
(`SOURCES`), the specs each maps to (`EXPECTED`), and helpers to load configs, compare spec
fields and build transformers' own config objects.

Provenance of the config files (`SOURCES`): the published config.json of the named checkpoint
(the fields that matter; quantization and auto_map blocks left out), transformers 5.23's own
re-serialisation of one (`__v5`: `AutoConfig.for_model(...).to_diff_dict()`, the v5
`rope_parameters` shape), or a labelled variant of a published file. The vision files hold the
published config.json fields as public copies of them quote them (id2label/label2id left out;
transformers_version left out where the copies disagree).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from posenc.encodings import ConfigError
from posenc.encodings.hf_config.classes import config_class, known_model_types

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "configs"
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


def _problem_fields(err: ConfigError) -> list[str]:
    return [p.field for p in err.problems]


def nested_types() -> list[str]:
    """Rotary model types whose config class keeps rope parameters per layer type."""
    found = []
    for model_type in known_model_types():
        cls = config_class(model_type)
        params = cls.defaults.get("rope_parameters") if cls is not None else None
        if (
            isinstance(params, dict)
            and params
            and all(v is None or isinstance(v, dict) for v in params.values())
        ):
            found.append(model_type)
    return found
