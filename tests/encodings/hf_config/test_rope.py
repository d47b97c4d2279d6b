"""RoPE mappings against transformers: the cos/sin of every RoPE config file equal the model's
rotary embedding module (torch.equal, fp32, CPU), length-dependent tables follow the sequence
length, GPT-J's `create_sinusoidal_positions`, Gemma 4's per-layer head_dim, transformers' own
default configs, and the notes a runtime needs."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import pytest
import torch
from transformers import AutoConfig

from posenc.encodings import compute
from posenc.encodings.hf_config import NamedSpec, resolve_hf_config
from tests.encodings.hf_config.support import EXPECTED, N, hf_config, load


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
    if spec.canonical().packing == "pairs":  # DeepSeek-V2, Llama 4: view_as_real(freqs_cis)
        assert spec.canonical().width == "half"
        pairs = table.tensors["pairs"]
        return pairs[..., 0], pairs[..., 1]
    cos, sin = table.tensors["cos"], table.tensors["sin"]
    d = cos.shape[-1]
    if spec.canonical().width == "half":  # GPT-J's module: half-width (sin, cos)
        return cos, sin
    if spec.canonical().repeats_interleaved():
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
        # DeepSeek-V2's complex freqs_cis (torch.polar, up to 2 ulp from torch.cos/sin of the
        # same angles): posenc's `trig: polar` table is its real and imaginary parts bit for bit,
        # from bit-identical inverse frequencies.
        assert named.spec.canonical().trig == "polar"
        cfg = hf_config(config)
        rotary = _rotary_class(cfg.model_type)(cfg)
        assert torch.equal(compute(named.spec).tensors["inv_freq"], rotary.inv_freq)
        assert torch.equal(cos, our_cos)
        assert torch.equal(sin, our_sin)
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
