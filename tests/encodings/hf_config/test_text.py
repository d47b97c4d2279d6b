"""Text models without RoPE against transformers: ALiBi slopes from the BLOOM / Falcon / MPT
builders (and Baichuan's choice between ALiBi and RoPE), T5 buckets and bias from
`T5Attention.compute_bias`, the sinusoid tables of Whisper, Marian and M2M100."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.encodings import compute
from posenc.encodings.hf_config import resolve_hf_config
from tests.encodings.hf_config.support import N, hf_config, load

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


def _get_interleave(n: int) -> list[float]:
    """Baichuan-13B's ALiBi slopes, transcribed from baichuan-inc/Baichuan-13B-Base
    `modeling_baichuan.py` (remote code, not installable here)."""

    def _get_interleave_power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return _get_interleave_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        _get_interleave_power_of_2(closest_power_of_2)
        + _get_interleave(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


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
    # Baichuan-13B's own slopes (`torch.Tensor(_get_interleave(n_head))`), not posenc's
    assert torch.equal(compute(named.spec).tensors["slopes"], torch.Tensor(_get_interleave(40)))
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
