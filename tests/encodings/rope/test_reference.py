"""posenc's RoPE tables against transformers 5.23 on the CPU, bit for bit (`torch.equal`, fp32).

Two references for every `rope_type`:
- the init functions (`ROPE_INIT_FUNCTIONS` in `modeling_rope_utils.py`, the models'
  `compute_default_rope_parameters` and HunYuan's `compute_ntk_alpha_rope_parameters`):
  `inv_freq` (d/2,) and the attention scaling;
- the models' rotary modules' forward (`*RotaryEmbedding.forward`, with `dynamic_rope_update`):
  the cos/sin tables (S, d), plus the attention code that consumes them where the pairing or
  the softmax scale is the point (GPT-J, DeepSeek-V3).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from transformers import PreTrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
    apply_rotary_pos_emb_interleave,
)
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding
from transformers.models.gptj.modeling_gptj import (
    GPTJRotaryEmbedding,
    apply_rotary_pos_emb,
    create_sinusoidal_positions,
)
from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import (
    HunYuanDenseV1RotaryEmbedding,
)
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

from posenc.encodings import SpecError, content_key, parse_spec
from posenc.encodings.rope import VARIANTS
from tests.encodings.rope import hf_models as hf
from tests.encodings.rope.hf_models import hf_forward, ours, rows

# --------------------------------------------------------------------------------------------
# Init functions: inv_freq and attention scaling
# --------------------------------------------------------------------------------------------

PHI35_SPEC: dict[str, Any] = {
    "head_dim": 96,
    "rope_theta": 10000.0,
    "rope_scaling": {
        "rope_type": "longrope",
        "short_factor": hf.PHI35_SHORT_FACTOR,
        "long_factor": hf.PHI35_LONG_FACTOR,
        "original_max_position_embeddings": hf.PHI35_ORIG,
        "max_position_embeddings": hf.PHI35_MAX,
    },
}
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0}
DYNAMIC_SPEC = {**DYNAMIC, "max_position_embeddings": 2048}


@dataclass(frozen=True)
class InitCase:
    """One init function call and the posenc spec that must reproduce it."""

    name: str
    rope_type: str
    config: Callable[[], PreTrainedConfig]
    init: Callable[..., tuple[torch.Tensor, float]]
    spec: dict[str, Any]
    kwargs: dict[str, Any] = field(default_factory=dict)


def _layer_init(
    fn: Callable[..., tuple[torch.Tensor, float]], layer_type: str
) -> Callable[..., tuple[torch.Tensor, float]]:
    """Call `fn` the way Gemma4TextRotaryEmbedding does: on the per-layer-type config."""

    def call(config: Any, **kwargs: Any) -> tuple[torch.Tensor, float]:
        return fn(config.per_layer_config[layer_type], layer_type=layer_type, **kwargs)

    return call


INIT_CASES = [
    InitCase(
        "llama3-8b-default",
        "default",
        lambda: hf.llama(128, {"rope_type": "default"}, 500000.0),
        LlamaRotaryEmbedding.compute_default_rope_parameters,
        {"head_dim": 128, "rope_theta": 500000.0},
    ),
    InitCase(
        "pythia-partial-0.25",
        "default",
        hf.pythia,
        GPTNeoXRotaryEmbedding.compute_default_rope_parameters,
        {"head_dim": 256, "partial_rotary_factor": 0.25},
    ),
    InitCase(
        "linear-4",
        "linear",
        lambda: hf.llama(128, {"rope_type": "linear", "factor": 4.0}, 10000.0),
        ROPE_INIT_FUNCTIONS["linear"],
        {"head_dim": 128, "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    ),
    InitCase(
        "dynamic-at-init",
        "dynamic",
        lambda: hf.llama(64, DYNAMIC, 10000.0, 2048),
        ROPE_INIT_FUNCTIONS["dynamic"],
        {"head_dim": 64, "seq_len": 100, "rope_scaling": DYNAMIC_SPEC},
    ),
    InitCase(
        # what dynamic_frequency_update passes: seq_len = max(position_ids) + 1, an int64 tensor
        "dynamic-forward-5000",
        "dynamic",
        lambda: hf.llama(64, DYNAMIC, 10000.0, 2048),
        ROPE_INIT_FUNCTIONS["dynamic"],
        {"head_dim": 64, "seq_len": 5000, "rope_scaling": DYNAMIC_SPEC},
        {"seq_len": torch.tensor(5000)},
    ),
    InitCase(
        "qwen-yarn-4",
        "yarn",
        hf.qwen2_yarn,
        ROPE_INIT_FUNCTIONS["yarn"],
        {"head_dim": 128, "rope_theta": 1e6, "rope_scaling": hf.QWEN_YARN_ROPE},
    ),
    InitCase(
        "deepseek-v3-yarn-40",
        "yarn",
        hf.deepseek_v3,
        ROPE_INIT_FUNCTIONS["yarn"],
        {"head_dim": 64, "rope_theta": 10000.0, "rope_scaling": hf.DEEPSEEK_V3_ROPE},
    ),
    InitCase(
        "gpt-oss-yarn-no-truncate",
        "yarn",
        hf.gpt_oss,
        ROPE_INIT_FUNCTIONS["yarn"],
        {"head_dim": 64, "rope_theta": 150000.0, "rope_scaling": hf.GPT_OSS_ROPE},
    ),
    InitCase(
        "phi35-longrope-short",
        "longrope",
        hf.phi35_mini,
        ROPE_INIT_FUNCTIONS["longrope"],
        {**PHI35_SPEC, "seq_len": hf.PHI35_ORIG},
    ),
    InitCase(
        "phi35-longrope-long",
        "longrope",
        hf.phi35_mini,
        ROPE_INIT_FUNCTIONS["longrope"],
        {**PHI35_SPEC, "seq_len": hf.PHI35_ORIG + 1},
        {"seq_len": hf.PHI35_ORIG + 1},
    ),
    InitCase(
        "llama31-8b-llama3",
        "llama3",
        lambda: hf.llama(128, hf.LLAMA31_ROPE, 500000.0, 131072),
        ROPE_INIT_FUNCTIONS["llama3"],
        {"head_dim": 128, "rope_theta": 500000.0, "rope_scaling": hf.LLAMA31_ROPE},
    ),
    InitCase(
        "llama4-scout-llama3-equal-factors",
        "llama3",
        lambda: hf.llama(128, hf.LLAMA4_SCOUT_ROPE, 500000.0, 10485760),
        ROPE_INIT_FUNCTIONS["llama3"],
        {"head_dim": 128, "rope_theta": 500000.0, "rope_scaling": hf.LLAMA4_SCOUT_ROPE},
    ),
    InitCase(
        "gemma4-full-proportional",
        "proportional",
        hf.gemma4_text,
        _layer_init(ROPE_INIT_FUNCTIONS["proportional"], "full_attention"),
        {
            "head_dim": 512,
            "rope_theta": 1e6,
            "rope_scaling": {"rope_type": "proportional", "partial_rotary_factor": 0.25},
        },
    ),
    InitCase(
        "hunyuan-7b-ntk-alpha",
        "ntk_alpha",
        hf.hunyuan_dense,
        HunYuanDenseV1RotaryEmbedding.compute_ntk_alpha_rope_parameters,
        {"head_dim": 128, "rope_scaling": {"rope_type": "ntk_alpha", "alpha": 1000.0}},
    ),
]


def test_every_rope_type_has_a_reference_case() -> None:
    assert {c.rope_type for c in INIT_CASES} == set(VARIANTS)
    assert set(FORWARD_TYPES) == set(VARIANTS)


@pytest.mark.parametrize("case", INIT_CASES, ids=lambda c: c.name)
def test_inv_freq_and_attention_scaling_match_init_function(case: InitCase) -> None:
    inv_hf, scaling_hf = case.init(case.config(), device=torch.device("cpu"), **case.kwargs)
    table = ours(max_positions=8, **case.spec)
    inv = table.tensors["inv_freq"]
    assert inv.dtype == inv_hf.dtype == torch.float32
    assert torch.equal(inv, inv_hf)
    assert table.meta["attention_scaling"] == scaling_hf


def test_llama31_band_structure() -> None:
    """Field guide: Llama 3.1 8B pairs 0..28 unscaled, 29..34 smoothed, 35..63 divided by 8."""
    inv = ours(head_dim=128, rope_theta=5e5, max_positions=1, rope_scaling=hf.LLAMA31_ROPE)
    plain = ours(head_dim=128, rope_theta=5e5, max_positions=1).tensors["inv_freq"]
    scaled = inv.tensors["inv_freq"]
    assert torch.equal(scaled[:29], plain[:29])
    assert torch.equal(scaled[35:], plain[35:] / 8)
    assert bool(((scaled[29:35] < plain[29:35]) & (scaled[29:35] > plain[29:35] / 8)).all())


# --------------------------------------------------------------------------------------------
# Rotary modules' forward: full cos/sin tables
# --------------------------------------------------------------------------------------------

FORWARD_TYPES: dict[str, str] = {
    "default": "test_pythia_partial_rotary, test_gemma3_per_layer_type",
    "linear": "test_gemma3_per_layer_type",
    "dynamic": "test_dynamic_ntk_forward",
    "yarn": "test_qwen_yarn, test_deepseek_v3_*, test_gpt_oss_yarn_half_width",
    "longrope": "test_phi35_longrope_switch",
    "llama3": "test_llama31_*",
    "proportional": "test_gemma4_per_layer_type",
    "ntk_alpha": "test_hunyuan_ntk_alpha",
}


def assert_same(cos: torch.Tensor, sin: torch.Tensor, table: dict[str, torch.Tensor]) -> None:
    assert cos.dtype == table["cos"].dtype == torch.float32
    assert cos.shape == table["cos"].shape
    assert torch.equal(cos, table["cos"])
    assert torch.equal(sin, table["sin"])


def test_llama31_forward() -> None:
    module = LlamaRotaryEmbedding(hf.llama(128, hf.LLAMA31_ROPE, 500000.0, 131072))
    cos, sin = hf_forward(module, torch.arange(2048))
    table = ours(head_dim=128, rope_theta=5e5, max_positions=2048, rope_scaling=hf.LLAMA31_ROPE)
    assert_same(cos, sin, table.tensors)


def test_llama3_equal_factors_forward() -> None:
    """Llama 4 Scout's `low_freq_factor == high_freq_factor`: transformers builds it (the band
    between the two wavelengths is empty, every pair kept or divided by the factor) and posenc
    serves the same table bit for bit."""
    module = LlamaRotaryEmbedding(hf.llama(128, hf.LLAMA4_SCOUT_ROPE, 500000.0, 10485760))
    cos, sin = hf_forward(module, torch.arange(4096))
    table = ours(
        head_dim=128, rope_theta=5e5, max_positions=4096, rope_scaling=hf.LLAMA4_SCOUT_ROPE
    )
    assert_same(cos, sin, table.tensors)
    inv = table.tensors["inv_freq"]
    plain = ours(head_dim=128, rope_theta=5e5, max_positions=1).tensors["inv_freq"]
    wavelen = 2 * math.pi / plain
    kept = wavelen <= 8192.0
    assert torch.equal(inv[kept], plain[kept])
    assert torch.equal(inv[~kept], plain[~kept] / 16)


def test_llama3_equal_factors_on_a_boundary_wavelength_is_refused() -> None:
    """Equal factors with a wavelength exactly at original / low_freq_factor: transformers
    divides by high - low = 0 there and gets a NaN frequency; posenc refuses the spec naming
    `rope_scaling.high_freq_factor` (pair 0's wavelength is 2*pi in fp32)."""
    low = 8192 / (2 * math.pi)
    scaling = {**hf.LLAMA4_SCOUT_ROPE, "low_freq_factor": low, "high_freq_factor": low}
    inv_hf, _ = ROPE_INIT_FUNCTIONS["llama3"](hf.llama(128, scaling, 10000.0, 131072), "cpu")
    assert bool(inv_hf[0].isnan())
    with pytest.raises(SpecError) as info:
        parse_spec({"kind": "rope", "head_dim": 128, "max_positions": 8, "rope_scaling": scaling})
    assert [p.field for p in info.value.problems] == ["rope_scaling.high_freq_factor"]
    assert "NaN" in info.value.problems[0].message


@pytest.fixture(scope="module")
def llama31_long() -> tuple[LlamaRotaryEmbedding, dict[str, torch.Tensor]]:
    module = LlamaRotaryEmbedding(hf.llama(128, hf.LLAMA31_ROPE, 500000.0, 131072))
    table = ours(head_dim=128, rope_theta=5e5, max_positions=131072, rope_scaling=hf.LLAMA31_ROPE)
    return module, table.tensors


def test_llama31_long_131072(
    llama31_long: tuple[LlamaRotaryEmbedding, dict[str, torch.Tensor]],
) -> None:
    module, table = llama31_long
    cos, sin = hf_forward(module, torch.arange(131072))
    assert_same(cos, sin, table)


@pytest.mark.parametrize("position", [0, 1, 4095, 8191, 8192, 65537, 131071])
def test_llama31_decode_step_rows(
    llama31_long: tuple[LlamaRotaryEmbedding, dict[str, torch.Tensor]], position: int
) -> None:
    """A decode step asks for one position: HF computes that row alone (d elements, a vector
    tail of its own); it must equal that row of the precomputed table."""
    module, table = llama31_long
    cos, sin = hf_forward(module, torch.tensor([position]))
    assert torch.equal(cos[0], table["cos"][position])
    assert torch.equal(sin[0], table["sin"][position])


def test_qwen_yarn() -> None:
    module = Qwen2RotaryEmbedding(hf.qwen2_yarn())
    cos, sin = hf_forward(module, torch.arange(3000))
    table = ours(head_dim=128, rope_theta=1e6, max_positions=3000, rope_scaling=hf.QWEN_YARN_ROPE)
    assert_same(cos, sin, table.tensors)
    assert table.meta["attention_scaling"] == module.attention_scaling == 0.1 * math.log(4) + 1
    assert "softmax_scale_multiplier" not in table.meta


@pytest.mark.parametrize("length", [hf.PHI35_ORIG, hf.PHI35_ORIG + 1])
def test_phi35_longrope_switch(length: int) -> None:
    """Short factors up to original_max_position_embeddings, long ones from orig + 1."""
    module = Phi3RotaryEmbedding(hf.phi35_mini())
    cos, sin = hf_forward(module, torch.arange(length))
    table = ours(max_positions=length, **PHI35_SPEC)
    assert_same(cos, sin, table.tensors)
    assert table.meta["attention_scaling"] == module.attention_scaling
    assert module.attention_scaling == math.sqrt(1 + math.log(32) / math.log(4096))
    assert table.meta["longrope_factors"] == ("long" if length > hf.PHI35_ORIG else "short")
    assert table.meta["longrope_switch_point"] == hf.PHI35_ORIG
    # A short table of the long regime: the first rows of HF's long forward.
    head = ours(max_positions=64, seq_len=length, **PHI35_SPEC)
    assert torch.equal(head.tensors["cos"], cos[:64])
    assert torch.equal(head.tensors["sin"], sin[:64])


def test_phi35_short_and_long_keys_differ() -> None:
    short = parse_spec({"kind": "rope", "max_positions": 64, "seq_len": 4096, **PHI35_SPEC})
    long = parse_spec({"kind": "rope", "max_positions": 64, "seq_len": 4097, **PHI35_SPEC})
    assert content_key(short) != content_key(long)


def test_pythia_partial_rotary() -> None:
    """GPT-NeoX rotary_pct 0.25: the first 64 of 256 dims rotate; the table is 64 wide."""
    module = GPTNeoXRotaryEmbedding(hf.pythia())
    cos, sin = hf_forward(module, torch.arange(2048))
    table = ours(head_dim=256, partial_rotary_factor=0.25, max_positions=2048)
    assert cos.shape == (2048, 64)
    assert_same(cos, sin, table.tensors)
    same = parse_spec({"kind": "rope", "head_dim": 256, "rotary_dim": 64, "max_positions": 2048})
    assert content_key(same) == table.meta["key"]


def _rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved pairing from half-width tables: (x[2i], x[2i+1]) rotated by angle i."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).flatten(-2)


def _rotate_every_two_full(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved pairing from full-width interleaved tables: x*cos + (-x1, x0)*sin."""
    swapped = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return x * cos + swapped * sin


def test_gptj_interleaved_layout() -> None:
    """GPT-J: `create_sinusoidal_positions` gives [sin | cos] (P, rotary_dim) and
    `apply_rotary_pos_emb` repeat_interleaves them: our interleaved half and full tables.

    Read through the model's rotary module's public forward (sin, cos for position ids), not the
    buffer it keeps: transformers 5.24 moved that buffer from the attention into the module."""
    config = hf.gptj()
    rotary = GPTJRotaryEmbedding(config)
    sin_all, cos_all = rotary(torch.zeros(1), torch.arange(2048)[None])  # (1, 2048, 32) each
    embed = torch.cat((sin_all[0], cos_all[0]), dim=-1)  # (2048, 64): [sin | cos]
    assert torch.equal(embed, create_sinusoidal_positions(2048, 64))
    spec = {"head_dim": 256, "rotary_dim": 64, "max_positions": 2048, "interleaved": True}
    half = ours(width="half", **spec).tensors
    full = ours(width="full", **spec).tensors
    assert torch.equal(half["sin"], embed[:, :32])
    assert torch.equal(half["cos"], embed[:, 32:])
    assert torch.equal(full["cos"], torch.repeat_interleave(embed[:, 32:], 2, dim=-1))
    assert torch.equal(full["sin"], torch.repeat_interleave(embed[:, :32], 2, dim=-1))

    generator = torch.Generator().manual_seed(0)
    positions = torch.arange(0, 2048, 7)
    q = torch.randn(1, len(positions), 4, 64, generator=generator)  # (batch, seq, heads, rot)
    sin_g, cos_g = rotary(q, positions[None])  # (1, S, 32) each
    expected = apply_rotary_pos_emb(q, sin_g, cos_g)
    cos_h, sin_h = half["cos"][positions][None, :, None], half["sin"][positions][None, :, None]
    assert torch.equal(_rotate_pairs(q, cos_h, sin_h), expected)
    cos_f, sin_f = full["cos"][positions][None, :, None], full["sin"][positions][None, :, None]
    assert torch.equal(_rotate_every_two_full(q, cos_f, sin_f), expected)


DEEPSEEK_SPEC: dict[str, Any] = {
    "head_dim": 64,
    "rope_theta": 10000.0,
    "rope_scaling": hf.DEEPSEEK_V3_ROPE,
}


def test_deepseek_v3_yarn_tables() -> None:
    module = DeepseekV3RotaryEmbedding(hf.deepseek_v3())
    cos, sin = hf_forward(module, torch.arange(2048))
    table = ours(max_positions=2048, **DEEPSEEK_SPEC)
    assert_same(cos, sin, table.tensors)
    # mscale == mscale_all_dim: A = 1, all the scaling moves into the softmax scale.
    assert table.meta["attention_scaling"] == module.attention_scaling == 1.0


def test_deepseek_v3_rope_interleave() -> None:
    """`rope_interleave`: pairs (2i, 2i+1) rotate by angle i, output de-interleaved
    (`apply_rotary_pos_emb_interleave`); our interleaved full-width table gives the same."""
    config = hf.deepseek_v3()
    module = DeepseekV3RotaryEmbedding(config)
    positions = torch.arange(0, 2048, 3)
    cos, sin = module(torch.zeros(1), positions[None])
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, len(positions), 64, generator=generator)  # (batch, heads, seq, rope)
    k = torch.randn(1, 1, len(positions), 64, generator=generator)
    q_hf, k_hf = apply_rotary_pos_emb_interleave(q, k, cos, sin)

    full = ours(max_positions=2048, interleaved=True, **DEEPSEEK_SPEC).tensors
    c, s = full["cos"][positions][None, None], full["sin"][positions][None, None]
    for x, expected in ((q, q_hf), (k, k_hf)):
        rotated = _rotate_every_two_full(x, c, s)
        deinterleaved = torch.cat((rotated[..., 0::2], rotated[..., 1::2]), dim=-1)
        assert torch.equal(deinterleaved, expected)


def test_deepseek_v3_softmax_scale_multiplier() -> None:
    """DeepseekV3Attention.scaling = qk_head_dim**-0.5 * mscale * mscale with
    mscale = get_mscale(40, mscale_all_dim=1) (`yarn_apply_mscale`)."""
    config = hf.deepseek_v3()
    attention = DeepseekV3Attention(config, layer_idx=0)
    base_scale = config.qk_head_dim**-0.5
    multiplier = ours(max_positions=1, **DEEPSEEK_SPEC).meta["softmax_scale_multiplier"]
    assert multiplier == (0.1 * math.log(40.0) + 1.0) ** 2
    # Applied as a consumer would (one multiply), it reproduces HF's scale exactly; dividing
    # HF's scale back out rounds once more (1 ulp of the double).
    assert base_scale * multiplier == attention.scaling
    assert attention.scaling / base_scale == pytest.approx(multiplier, rel=2**-52, abs=0)


def test_gemma3_per_layer_type() -> None:
    module = Gemma3RotaryEmbedding(hf.gemma3_text())
    positions = torch.arange(2500)
    sliding = hf_forward(module, positions, layer_type="sliding_attention")
    full = hf_forward(module, positions, layer_type="full_attention")
    assert_same(*sliding, ours(head_dim=256, rope_theta=10000.0, max_positions=2500).tensors)
    linear = {"rope_type": "linear", "factor": 8.0}
    table = ours(head_dim=256, rope_theta=1e6, max_positions=2500, rope_scaling=linear)
    assert_same(*full, table.tensors)


def test_gemma4_per_layer_type() -> None:
    """Sliding layers: head_dim 256 default theta 1e4. Full layers: head_dim 512, proportional
    with partial_rotary_factor 0.25 (64 pairs rotate, 192 stay at cos 1 / sin 0), theta 1e6."""
    module = Gemma4TextRotaryEmbedding(hf.gemma4_text())
    positions = torch.arange(2000)
    sliding = hf_forward(module, positions, layer_type="sliding_attention")
    full = hf_forward(module, positions, layer_type="full_attention")
    assert_same(*sliding, ours(head_dim=256, rope_theta=10000.0, max_positions=2000).tensors)
    proportional = {"rope_type": "proportional", "partial_rotary_factor": 0.25}
    table = ours(head_dim=512, rope_theta=1e6, max_positions=2000, rope_scaling=proportional)
    assert_same(*full, table.tensors)
    assert table.meta["rotated_pairs"] == 64
    assert bool((table.tensors["cos"][:, 64:256] == 1).all())
    assert bool((table.tensors["sin"][:, 64:256] == 0).all())


def test_gpt_oss_yarn_half_width() -> None:
    """GPT-OSS: yarn with truncate=false, and the forward returns half-width (S, d/2) tables."""
    module = GptOssRotaryEmbedding(hf.gpt_oss())
    cos, sin = hf_forward(module, torch.arange(3000))
    spec = {"head_dim": 64, "rope_theta": 150000.0, "rope_scaling": hf.GPT_OSS_ROPE}
    table = ours(max_positions=3000, width="half", **spec)
    assert cos.shape == (3000, 32)
    assert_same(cos, sin, table.tensors)
    assert table.meta["attention_scaling"] == module.attention_scaling
    low, high = table.meta["yarn_correction_range"]
    assert not (float(low).is_integer() and float(high).is_integer())  # not floored/ceiled


def test_hunyuan_ntk_alpha() -> None:
    module = HunYuanDenseV1RotaryEmbedding(hf.hunyuan_dense())
    assert module.rope_type == "ntk_alpha"
    cos, sin = hf_forward(module, torch.arange(3000))
    ntk = {"rope_type": "ntk_alpha", "alpha": 1000.0}
    table = ours(head_dim=128, max_positions=3000, rope_scaling=ntk)
    assert_same(cos, sin, table.tensors)
    assert table.meta["effective_rope_theta"] == 10000.0 * 1000.0 ** (128 / 126)


@pytest.mark.parametrize("length", [1000, 2047, 2048, 2049, 3000, 5000])
def test_dynamic_ntk_forward(length: int) -> None:
    """Below max_position_embeddings (2048) HF keeps the init-time base; above it
    `dynamic_frequency_update` recomputes the base from max(position_ids)+1 as fp32 tensors."""
    module = LlamaRotaryEmbedding(hf.llama(64, DYNAMIC, 10000.0, 2048))
    cos, sin = hf_forward(module, torch.arange(length))
    table = ours(head_dim=64, max_positions=length, rope_scaling=DYNAMIC_SPEC)
    assert_same(cos, sin, table.tensors)
    assert torch.equal(table.tensors["inv_freq"], module.inv_freq)
    # A few rows of the same regime: the first rows of HF's forward at that length.
    head = ours(head_dim=64, max_positions=16, seq_len=length, rope_scaling=DYNAMIC_SPEC)
    assert torch.equal(head.tensors["cos"], cos[:16])


def test_dynamic_ntk_transformers_init_path_differs_from_forward_path() -> None:
    """transformers itself is inconsistent: `_compute_dynamic_ntk_parameters` with a Python int
    seq_len computes the base in double, while the forward passes an int64 tensor and computes
    it in fp32. We follow the forward (what a model runs); this pins the discrepancy."""
    config = hf.llama(64, DYNAMIC, 10000.0, 2048)
    by_int, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=5000)
    by_tensor, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=torch.tensor(5000))
    table = ours(head_dim=64, max_positions=1, seq_len=5000, rope_scaling=DYNAMIC_SPEC)
    assert torch.equal(table.tensors["inv_freq"], by_tensor)
    assert not torch.equal(by_int, by_tensor)
    assert torch.allclose(by_int, by_tensor, rtol=3e-7, atol=0)


# --------------------------------------------------------------------------------------------
# Half width computed once, duplicated == transformers computing on the full width
# --------------------------------------------------------------------------------------------

HEAD_DIMS = [*range(2, 66, 2), 80, 96, 126, 128, 130, 160, 192, 250, 256, 258, 512]
LENGTHS = [1, 3, 17, 129]


@pytest.mark.parametrize("scaling", ["default", "yarn"])
def test_half_width_duplicated_equals_hf_full_width(scaling: str) -> None:
    """HF evaluates cos/sin on cat(freqs, freqs) (S, d); we evaluate (S, d/2) once and lay it
    out. Sizes sweep every SIMD tail length (d/2 and S*d/2 mod 8/16) and the scalar path."""
    rope: dict[str, Any] = {"rope_type": "default"}
    if scaling == "yarn":  # A != 1 exercises the multiply after cos/sin
        rope = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512}
    for head_dim in HEAD_DIMS:
        module = LlamaRotaryEmbedding(hf.llama(head_dim, rope, 10000.0, 4096))
        for length in LENGTHS:
            positions = torch.arange(length) * 37 + 5
            cos, sin = hf_forward(module, positions)
            spec = parse_spec({"kind": "rope", "head_dim": head_dim, "max_positions": 1})
            if scaling == "yarn":
                spec = parse_spec(
                    {"kind": "rope", "head_dim": head_dim, "max_positions": 1, "rope_scaling": rope}
                )
            table = rows(spec, positions)
            assert torch.equal(cos, table["cos"]), (head_dim, length)
            assert torch.equal(sin, table["sin"]), (head_dim, length)
