"""`resolve_hf_config`'s filters and overrides, and the `ConfigError` of every config it cannot
map, naming the config key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from posenc.encodings import ConfigError, compute
from posenc.encodings.hf_config import resolve_hf_config
from tests.encodings.hf_config.support import _problem_fields, load


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
        # a model_type transformers does not know: no class default fills the size in
        "missing head size",
        lambda: resolve_hf_config({"model_type": "custom_rope_lm", "rope_theta": 1e4}),
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
            {
                "model_type": "custom_rope_lm",
                "rope_theta": 1e4,
                "hidden_size": 64,
                "num_attention_heads": 4,
            }
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


def test_omitted_keys_take_the_config_class_defaults() -> None:
    """A key the file omits takes the transformers config class's default (LlamaConfig:
    hidden_size 4096, 32 heads, max_position_embeddings 2048; Qwen3Config's
    max_position_embeddings 32768), listed in `notes.defaults_applied`."""
    (llama,) = resolve_hf_config({"model_type": "llama", "rope_theta": 1e4})
    assert llama.spec.model_dump()["head_dim"] == 128
    assert llama.notes["defaults_applied"] == {
        "rope_parameters": {"rope_type": "default"},  # LlamaConfig's, less the file's rope_theta
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "max_position_embeddings": 2048,
    }
    (qwen3,) = resolve_hf_config(
        {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4}
    )
    assert qwen3.spec.model_dump()["max_positions"] == 32768
    assert qwen3.notes["defaults_applied"]["max_position_embeddings"] == 32768
