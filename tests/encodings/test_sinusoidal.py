"""`sinusoidal` family: transformers references (bit-exact), published formulas (golden, float64
numpy), validation, canonical forms and properties.

Tolerances. The float64 goldens below are the published formulas evaluated independently in
numpy. A float64-computed table (`compute_dtype: float64`) is rounded once, so it must match within
`ATOL["float32"]`. A float32-computed table inherits fp32 rounding of the frequency and of the
angle: the angle's relative error is a few fp32 ulp, which becomes an absolute error in sin/cos of
about `|angle| * 2^-23`; those comparisons use `ATOL["float32"] * max(1, max|angle|)` (field guide
section 4: fp32 vs fp64 differ by 1.2e-4 at 2k positions). The diffusion timestep conventions,
whose fp32 code posenc does not reproduce bit for bit, are held element by element instead:
within `ANGLE_ULPS` fp32 ulp of each element's own angle, against the float64 formula and against
their fp32 code run in torch float32.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.encodings import SpecError, canonical_dict, compute, content_key, parse_spec
from posenc.encodings.base import FAMILIES
from posenc.encodings.sinusoidal import CONVENTIONS, SinusoidalSpec
from tests.tolerances import ATOL


def table(**fields: Any) -> torch.Tensor:
    return compute(parse_spec({"kind": "sinusoidal", **fields})).tensors["embedding"]


def angle_tol(max_angle: float) -> float:
    return ATOL["float32"] * max(1.0, max_angle)


# --- independent float64 goldens, written from the published code --------------------------


def golden_vaswani(positions: np.ndarray, d: int) -> np.ndarray:
    """Paper section 3.5: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d))."""
    i = np.arange(d // 2, dtype=np.float64)
    angle = positions[:, None] / np.power(10000.0, 2 * i / d)[None, :]
    out = np.zeros((len(positions), d))
    out[:, 0::2] = np.sin(angle)
    out[:, 1::2] = np.cos(angle)
    return out


def golden_t2t(length: int, channels: int, start_index: int = 0) -> np.ndarray:
    """tensor2tensor common_attention.get_timing_signal_1d (min_timescale 1, max 1e4)."""
    position = np.arange(length, dtype=np.float64) + start_index
    num_timescales = channels // 2
    increment = math.log(1e4 / 1.0) / max(num_timescales - 1, 1)
    inv_timescales = 1.0 * np.exp(np.arange(num_timescales, dtype=np.float64) * -increment)
    scaled_time = position[:, None] * inv_timescales[None, :]
    signal = np.concatenate([np.sin(scaled_time), np.cos(scaled_time)], axis=1)
    return np.pad(signal, [[0, 0], [0, channels % 2]])


def golden_fairseq(num_embeddings: int, dim: int, padding_idx: int | None) -> np.ndarray:
    """fairseq SinusoidalPositionalEmbedding.get_embedding."""
    half_dim = dim // 2
    step = math.log(10000) / (half_dim - 1)
    freqs = np.exp(np.arange(half_dim, dtype=np.float64) * -step)
    emb = np.arange(num_embeddings, dtype=np.float64)[:, None] * freqs[None, :]
    emb = np.concatenate([np.sin(emb), np.cos(emb)], axis=1)
    if dim % 2 == 1:
        emb = np.concatenate([emb, np.zeros((num_embeddings, 1))], axis=1)
    if padding_idx is not None:
        emb[padding_idx, :] = 0
    return emb


def golden_diffusers(
    timesteps: np.ndarray,
    embedding_dim: int,
    flip_sin_to_cos: bool = False,
    downscale_freq_shift: float = 1,
    scale: float = 1,
    max_period: int = 10000,
) -> np.ndarray:
    """diffusers models/embeddings.py get_timestep_embedding."""
    half_dim = embedding_dim // 2
    exponent = -math.log(max_period) * np.arange(half_dim, dtype=np.float64)
    exponent = exponent / (half_dim - downscale_freq_shift)
    emb = timesteps[:, None] * np.exp(exponent)[None, :]
    emb = scale * emb
    emb = np.concatenate([np.sin(emb), np.cos(emb)], axis=-1)
    if flip_sin_to_cos:
        emb = np.concatenate([emb[:, half_dim:], emb[:, :half_dim]], axis=-1)
    if embedding_dim % 2 == 1:
        emb = np.pad(emb, [[0, 0], [0, 1]])
    return emb


def golden_guided_diffusion(timesteps: np.ndarray, dim: int, max_period: int = 10000) -> np.ndarray:
    """guided-diffusion nn.py timestep_embedding."""
    half = dim // 2
    freqs = np.exp(-math.log(max_period) * np.arange(half, dtype=np.float64) / half)
    args = timesteps[:, None] * freqs[None]
    embedding = np.concatenate([np.cos(args), np.sin(args)], axis=-1)
    if dim % 2:
        embedding = np.concatenate([embedding, np.zeros_like(embedding[:, :1])], axis=-1)
    return embedding


# --- the published code itself, transcribed and run in torch float32 -------------------------


def torch32_vaswani(max_len: int, d_model: int) -> torch.Tensor:
    """The PyTorch tutorial's `PositionalEncoding` buffer (pe[:, 0::2] = sin, pe[:, 1::2] = cos),
    transcribed, in torch float32."""
    position = torch.arange(max_len).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def torch32_t2t(length: int, channels: int, start_index: int = 0) -> torch.Tensor:
    """tensor2tensor `get_timing_signal_1d` (min_timescale 1, max 1e4), its TensorFlow float32
    ops transcribed to torch float32."""
    position = torch.arange(length, dtype=torch.float32) + start_index
    num_timescales = channels // 2
    increment = math.log(1e4 / 1.0) / max(float(num_timescales) - 1, 1)
    inv_timescales = 1.0 * torch.exp(torch.arange(num_timescales, dtype=torch.float32) * -increment)
    scaled_time = position[:, None] * inv_timescales[None, :]
    signal = torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)
    return torch.nn.functional.pad(signal, (0, channels % 2))


def torch32_fairseq(num_embeddings: int, dim: int, padding_idx: int | None) -> torch.Tensor:
    """fairseq `SinusoidalPositionalEmbedding.get_embedding`, transcribed, in torch float32."""
    half_dim = dim // 2
    step = math.log(10000) / (half_dim - 1)
    freqs = torch.exp(torch.arange(half_dim, dtype=torch.float) * -step)
    emb = torch.arange(num_embeddings, dtype=torch.float).unsqueeze(1) * freqs.unsqueeze(0)
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1).view(num_embeddings, -1)
    if dim % 2 == 1:
        emb = torch.cat([emb, torch.zeros(num_embeddings, 1)], dim=1)
    if padding_idx is not None:
        emb[padding_idx, :] = 0
    return emb


def torch32_diffusers(
    timesteps: torch.Tensor, dim: int, shift: float, scale: float
) -> torch.Tensor:
    """diffusers `get_timestep_embedding` (flip_sin_to_cos False), transcribed, in float32."""
    half_dim = dim // 2
    exponent = -math.log(10000) * torch.arange(start=0, end=half_dim, dtype=torch.float32)
    exponent = exponent / (half_dim - shift)
    emb = timesteps[:, None].float() * torch.exp(exponent)[None, :]
    emb = scale * emb
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    return torch.nn.functional.pad(emb, (0, dim % 2, 0, 0))


def torch32_guided_diffusion(
    timesteps: torch.Tensor, dim: int, max_period: int = 10000
) -> torch.Tensor:
    """guided-diffusion `nn.py` `timestep_embedding` (openai/guided-diffusion), transcribed, in
    torch float32."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(start=0, end=half, dtype=torch.float32) / half
    )
    args = timesteps[:, None].float() * freqs[None]
    embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
    return embedding


def timestep_angles(
    timesteps: np.ndarray, dim: int, shift: float, scale: float = 1.0, max_period: int = 10000
) -> np.ndarray:
    """The float64 angle behind every element of a (T, dim) timestep table: each frequency's
    angle twice (its sin and its cos), 0 for an odd dim's pad column."""
    half = dim // 2
    freqs = np.exp(-math.log(max_period) * np.arange(half, dtype=np.float64) / (half - shift))
    angles = scale * timesteps[:, None] * freqs[None, :]
    return np.pad(np.concatenate([angles, angles], axis=1), ((0, 0), (0, dim % 2)))


ANGLE_ULPS = 9
"""How far posenc's fp32 diffusers and guided-diffusion tables may be from the float64 formula
and from diffusers' own fp32 code, element by element: `ANGLE_ULPS * 2^-23 * max(1, |angle|)`,
the README's "within 9 fp32 ulp of each element's angle" (measured: 8.5 against diffusers' fp32
op order at `scale` 1000, 4.7 at scale 1; 4.1 against the float64 formula)."""


def assert_within_angle_ulps(ours: torch.Tensor, want: np.ndarray, angles: np.ndarray) -> None:
    """|ours - want| <= ANGLE_ULPS * 2^-23 * max(1, |angle|) for every element."""
    assert tuple(ours.shape) == want.shape == angles.shape
    bound = ANGLE_ULPS * 2.0**-23 * np.maximum(1.0, np.abs(angles))
    excess = np.abs(ours.double().numpy() - want) / bound
    assert excess.max() <= 1.0, f"{excess.max() * ANGLE_ULPS:.3g} ulp of the angle"


def assert_close(ours: torch.Tensor, golden: np.ndarray, tol: float) -> None:
    assert tuple(ours.shape) == golden.shape
    err = np.abs(ours.double().numpy() - golden).max()
    assert err <= tol, f"max |error| {err:.3g} > {tol:.3g}"


# --- transformers references: bit-exact -----------------------------------------------------


@pytest.mark.parametrize(("dim", "length"), [(384, 1500), (1280, 1500), (6, 10)])
def test_whisper_sinusoids_bit_exact(dim: int, length: int) -> None:
    from transformers.models.whisper.modeling_whisper import sinusoids

    assert torch.equal(
        table(dim=dim, max_positions=length, convention="whisper"), sinusoids(length, dim)
    )


def test_whisper_encoder_position_table_bit_exact() -> None:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    config = WhisperConfig(
        d_model=64,
        encoder_layers=1,
        encoder_attention_heads=2,
        encoder_ffn_dim=32,
        max_source_positions=30,
        num_mel_bins=8,
    )
    weight = WhisperEncoder(config).embed_positions.weight.detach()
    assert torch.equal(table(dim=64, max_positions=30, convention="whisper"), weight)


@pytest.mark.parametrize(("dim", "length"), [(512, 128), (1024, 64), (7, 20)])
def test_marian_weights_bit_exact(dim: int, length: int) -> None:
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    ref = MarianSinusoidalPositionalEmbedding(length, dim).create_weight()
    assert torch.equal(table(dim=dim, max_positions=length, convention="marian"), ref)


def test_marian_model_position_weight_bit_exact() -> None:
    from transformers import MarianConfig
    from transformers.models.marian.modeling_marian import MarianModel

    config = MarianConfig(
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=16,
        decoder_ffn_dim=16,
        max_position_embeddings=40,
        vocab_size=50,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    weight = MarianModel(config).encoder.embed_positions.weight.detach()
    assert torch.equal(table(dim=32, max_positions=40, convention="marian"), weight)


@pytest.mark.parametrize(("dim", "length"), [(512, 128), (7, 20), (5, 9)])
def test_xlm_distilbert_interleaved_float64_bit_exact(dim: int, length: int) -> None:
    """XLM/DistilBERT `create_sinusoidal_embeddings`: the paper's interleaved table in float64."""
    from transformers.models.xlm.modeling_xlm import create_sinusoidal_embeddings

    ref = create_sinusoidal_embeddings(length, dim, torch.empty(length, dim))
    ours = table(
        dim=dim,
        max_positions=length,
        convention="vaswani",
        compute_dtype="float64",
        odd_dim="extra_sin",
    )
    assert torch.equal(ours, ref)


@pytest.mark.parametrize(("dim", "max_position_embeddings"), [(1024, 1024), (512, 200), (7, 11)])
def test_m2m100_weights_bit_exact(dim: int, max_position_embeddings: int) -> None:
    """M2M100 buffer: max_position_embeddings + 2 rows indexed by position id; row 1 (pad) is 0."""
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding

    module = M2M100SinusoidalPositionalEmbedding(max_position_embeddings, dim, padding_idx=1)
    full = table(dim=dim, max_positions=max_position_embeddings + 2, convention="fairseq")
    assert torch.equal(full, module.weights)
    # Only the rows real tokens use (position ids 2..): offset 2, no padding row in range.
    used = table(
        dim=dim, max_positions=max_position_embeddings, convention="fairseq", position_offset=2
    )
    assert torch.equal(used, module.weights[2:])


def test_m2m100_forward_rows_are_table_rows_by_position_id() -> None:
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding

    module = M2M100SinusoidalPositionalEmbedding(16, 24, padding_idx=1)
    input_ids = torch.tensor([[5, 6, 7, 1, 1], [9, 8, 7, 6, 5]])
    out = module(input_ids)
    position_ids = module.create_position_ids_from_input_ids(input_ids, 1)
    ours = table(dim=24, max_positions=18, convention="fairseq")
    assert torch.equal(out, ours[position_ids])
    assert torch.equal(out[0, 3:], torch.zeros(2, 24))


@pytest.mark.parametrize("module_path", ["speech_to_text", "fsmt"])
def test_fairseq_copies_bit_exact(module_path: str) -> None:
    if module_path == "speech_to_text":
        from transformers.models.speech_to_text.modeling_speech_to_text import (
            Speech2TextSinusoidalPositionalEmbedding as Ref,
        )
    else:
        from transformers.models.fsmt.modeling_fsmt import SinusoidalPositionalEmbedding as Ref
    for dim, rows in ((256, 100), (9, 13)):
        ref = Ref.get_embedding(rows, dim, 1)
        assert torch.equal(table(dim=dim, max_positions=rows, convention="fairseq"), ref)


def test_musicgen_cos_sin_bit_exact() -> None:
    from transformers.models.musicgen.modeling_musicgen import MusicgenSinusoidalPositionalEmbedding

    ref = MusicgenSinusoidalPositionalEmbedding(200, 64).weights
    ours = table(
        dim=64, max_positions=200, convention="fairseq", padding_idx=None, layout="cos_sin"
    )
    assert torch.equal(ours, ref)


def test_output_dtype_is_cast_last() -> None:
    fp32 = table(dim=32, max_positions=50, convention="whisper")
    for dtype in ("float16", "bfloat16"):
        ours = table(dim=32, max_positions=50, convention="whisper", dtype=dtype)
        assert ours.dtype == getattr(torch, dtype)
        assert torch.equal(ours, fp32.to(ours.dtype))


# --- published code run in float32: bit for bit where posenc follows its op order ------------


@pytest.mark.parametrize("dim", [6, 64, 512])
def test_vaswani_float32_is_the_pytorch_tutorial_bit_for_bit(dim: int) -> None:
    assert torch.equal(table(dim=dim, max_positions=512), torch32_vaswani(512, dim))


@pytest.mark.parametrize("channels", [64, 63])
def test_tensor2tensor_float32_is_its_transcribed_code_bit_for_bit(channels: int) -> None:
    spec = {"dim": channels, "max_positions": 300, "convention": "tensor2tensor"}
    assert torch.equal(table(**spec), torch32_t2t(300, channels))
    assert torch.equal(table(**spec, position_offset=7), torch32_t2t(300, channels, 7))


@pytest.mark.parametrize("dim", [128, 33])
def test_fairseq_float32_is_get_embedding_bit_for_bit(dim: int) -> None:
    ours = table(dim=dim, max_positions=200, convention="fairseq")
    assert torch.equal(ours, torch32_fairseq(200, dim, padding_idx=1))


def test_diffusers_float32_is_not_its_op_order() -> None:
    """posenc's float32 frequencies follow fairseq's order `exp(k * -(ln(base) / den))`, not
    diffusers' `exp(-ln(base) * k / den)`: the diffusers and guided_diffusion conventions are not
    bit for bit their fp32 code (README), only within `ANGLE_ULPS` of each element's angle (below);
    this pins the difference so a claim of bit-equality cannot pass unnoticed."""
    timesteps = torch.tensor([0.0, 1.0, 0.5, 17.25, 999.0, 261.0, 3.0])
    spec = {"dim": 320, "positions": timesteps.tolist(), "convention": "diffusers"}
    assert not torch.equal(table(**spec), torch32_diffusers(timesteps, 320, 1.0, 1.0))


@pytest.mark.parametrize(
    ("dim", "shift", "scale"), [(320, 1.0, 1.0), (33, 1.0, 1.0), (64, 0.5, 1000.0)]
)
def test_diffusers_float32_is_within_angle_ulps_of_its_code(
    dim: int, shift: float, scale: float
) -> None:
    """What the README claims instead of bit-equality: each element within `ANGLE_ULPS` fp32
    ulp of its angle from diffusers' fp32 `get_timestep_embedding` run in torch float32."""
    timesteps = torch.tensor([0.0, 1.0, 0.5, 17.25, 999.0, 261.0, 3.0])
    spec = {
        "dim": dim,
        "positions": timesteps.tolist(),
        "convention": "diffusers",
        "freq_shift": shift,
        "scale": scale,
    }
    theirs = torch32_diffusers(timesteps, dim, shift, scale).double().numpy()
    angles = timestep_angles(timesteps.double().numpy(), dim, shift, scale)
    assert_within_angle_ulps(table(**spec), theirs, angles)


@pytest.mark.parametrize("dim", [128, 129, 96, 320])
def test_guided_diffusion_float32_is_within_angle_ulps_of_its_code(dim: int) -> None:
    """guided-diffusion's fp32 `timestep_embedding` against posenc's fp32 table: within
    `ANGLE_ULPS` of each element's angle, and bit for bit when dim // 2 is a power of two (its
    `k / half` is then exact, and its order is fairseq's; 96 and 320 are not)."""
    timesteps = torch.tensor([0.0, 999.0, 10.5, 250.0, 3.75, 1.0, 0.5])
    spec = {"dim": dim, "positions": timesteps.tolist(), "convention": "guided_diffusion"}
    ours, theirs = table(**spec), torch32_guided_diffusion(timesteps, dim)
    angles = timestep_angles(timesteps.double().numpy(), dim, 0.0)
    assert_within_angle_ulps(ours, theirs.double().numpy(), angles)
    half = dim // 2
    assert torch.equal(ours, theirs) == (half & (half - 1) == 0)


# --- published formulas without a transformers implementation: golden ----------------------


def test_vaswani_golden() -> None:
    positions = np.arange(512, dtype=np.float64)
    golden = golden_vaswani(positions, 64)
    assert_close(table(dim=64, max_positions=512), golden, angle_tol(511))
    assert_close(table(dim=64, max_positions=512, compute_dtype="float64"), golden, ATOL["float32"])


@pytest.mark.parametrize("channels", [64, 63])
def test_tensor2tensor_golden(channels: int) -> None:
    golden = golden_t2t(300, channels)
    spec = {"dim": channels, "max_positions": 300, "convention": "tensor2tensor"}
    assert_close(table(**spec), golden, angle_tol(299))
    assert_close(table(**spec, compute_dtype="float64"), golden, ATOL["float32"])
    shifted = table(**spec, position_offset=7)
    assert_close(shifted, golden_t2t(300, channels, start_index=7), angle_tol(306))


@pytest.mark.parametrize("dim", [128, 33])
def test_fairseq_golden(dim: int) -> None:
    golden = golden_fairseq(200, dim, padding_idx=1)
    assert_close(table(dim=dim, max_positions=200, convention="fairseq"), golden, angle_tol(199))


@pytest.mark.parametrize(
    ("dim", "flip", "shift", "scale"),
    [(320, False, 1.0, 1.0), (320, True, 0.0, 1.0), (33, False, 1.0, 1.0), (64, True, 0.5, 1000.0)],
)
def test_diffusers_golden(dim: int, flip: bool, shift: float, scale: float) -> None:
    timesteps = np.array([0.0, 1.0, 0.5, 17.25, 999.0, 261.0, 3.0])
    golden = golden_diffusers(timesteps, dim, flip, shift, scale)
    spec = {
        "dim": dim,
        "positions": timesteps.tolist(),
        "convention": "diffusers",
        "layout": "cos_sin" if flip else "sin_cos",
        "freq_shift": shift,
        "scale": scale,
    }
    angles = timestep_angles(timesteps, dim, shift, scale)
    if flip:
        angles = np.concatenate([angles[:, dim // 2 : 2 * (dim // 2)], angles[:, : dim // 2]], 1)
        angles = np.pad(angles, ((0, 0), (0, dim % 2)))
    assert_within_angle_ulps(table(**spec), golden, angles)
    assert_close(table(**spec, compute_dtype="float64"), golden, ATOL["float32"])


def test_guided_diffusion_golden() -> None:
    timesteps = np.array([0.0, 999.0, 10.5, 250.0, 3.75])
    for dim in (128, 129):
        golden = golden_guided_diffusion(timesteps, dim)
        spec = {"dim": dim, "positions": timesteps.tolist(), "convention": "guided_diffusion"}
        assert_within_angle_ulps(table(**spec), golden, timestep_angles(timesteps, dim, 0.0))
        assert_close(table(**spec, compute_dtype="float64"), golden, ATOL["float32"])


def test_fp32_error_grows_with_position_and_float64_fixes_it() -> None:
    """Field guide 4: fp32 vs fp64 of one formula differ by ~1e-4 at thousands of positions."""
    golden = golden_fairseq(4096, 64, padding_idx=None)
    fp32 = table(dim=64, max_positions=4096, convention="fairseq", padding_idx=None)
    fp64 = table(
        dim=64, max_positions=4096, convention="fairseq", padding_idx=None, compute_dtype="float64"
    )
    err32 = np.abs(fp32.double().numpy() - golden).max()
    err64 = np.abs(fp64.double().numpy() - golden).max()
    assert 1e-5 < err32 <= angle_tol(4095)
    assert err64 <= ATOL["float32"]


# --- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"dim": 7, "max_positions": 4, "convention": "whisper"}, "dim"),
        ({"dim": 7, "max_positions": 4}, "dim"),
        ({"dim": 0, "max_positions": 4}, "dim"),
        ({"dim": -8, "max_positions": 4}, "dim"),
        ({"dim": 8, "max_positions": 0}, "max_positions"),
        ({"dim": 8}, "max_positions"),
        ({"dim": 8, "max_positions": 4, "positions": [0.0]}, "max_positions"),
        ({"dim": 8, "positions": []}, "positions"),
        ({"dim": 8, "positions": [0.0, float("nan")]}, "positions.1"),
        ({"dim": 8, "positions": [float("inf")]}, "positions.0"),
        ({"dim": 8, "positions": [1.0], "position_offset": 3}, "position_offset"),
        ({"dim": 8, "max_positions": 4, "freq_shift": 4.0}, "freq_shift"),
        ({"dim": 8, "max_positions": 4, "base": 0.0}, "base"),
        ({"dim": 8, "max_positions": 4, "base": float("nan")}, "base"),
        ({"dim": 8, "max_positions": 4, "scale": float("inf")}, "scale"),
        ({"dim": 8, "max_positions": 4, "position_offset": -1}, "position_offset"),
        ({"dim": 8, "max_positions": 4, "layout": "zigzag"}, "layout"),
        ({"dim": 8, "max_positions": 4, "convention": "bert"}, "convention"),
        ({"dim": 8, "max_positions": 4, "dtype": "int8"}, "dtype"),
        ({"dim": 8, "max_positions": 4, "colour": 1}, "colour"),
    ],
)
def test_invalid_specs_name_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"kind": "sinusoidal", **fields})
    assert field in [p.field for p in info.value.problems], info.value


def test_explicit_positions_are_capped() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"kind": "sinusoidal", "dim": 4, "positions": [0.5] * 65537})
    assert info.value.problems[0].field == "positions"


def test_outputs_do_not_allocate() -> None:
    spec = parse_spec(
        {"kind": "sinusoidal", "dim": 65536, "max_positions": 1 << 24, "dtype": "bfloat16"}
    )
    (info,) = spec.outputs().values()
    assert info.shape == (1 << 24, 65536)
    assert spec.output_bytes() == 2 * (1 << 40)


def test_family_is_registered() -> None:
    assert FAMILIES["sinusoidal"].spec_type is SinusoidalSpec
    assert set(CONVENTIONS) == set(
        SinusoidalSpec.model_fields["convention"].annotation.__args__[0].__args__
    )


# --- canonical forms ------------------------------------------------------------------------


def test_convention_expands_to_explicit_fields() -> None:
    spec = parse_spec({"kind": "sinusoidal", "dim": 8, "max_positions": 4, "convention": "fairseq"})
    explicit = {k: v for k, v in canonical_dict(spec).items()}
    assert "convention" not in explicit
    assert explicit["padding_idx"] == 1
    assert explicit["freq_shift"] == 1.0
    assert content_key(parse_spec(explicit)) == content_key(spec)


def test_canonical_normalisations() -> None:
    def key(**f: Any) -> str:
        return content_key(parse_spec({"kind": "sinusoidal", **f}))

    # a convention and its hand-written spelling; conventions that coincide for even dims
    whisper = key(dim=8, max_positions=4, convention="whisper")
    assert whisper == key(dim=8, max_positions=4, freq_shift=1, layout="sin_cos")
    assert whisper == key(dim=8, max_positions=4, convention="tensor2tensor")
    assert whisper == key(dim=8, max_positions=4, convention="diffusers", compute_dtype="float32")
    assert whisper != key(dim=8, max_positions=4, convention="fairseq")
    # consecutive integer positions are rows offset..offset+P-1
    assert key(dim=8, positions=[3.0, 4.0, 5.0]) == key(dim=8, max_positions=3, position_offset=3)
    # a padding position outside the table changes nothing
    assert key(dim=8, max_positions=4, position_offset=2, convention="fairseq") == key(
        dim=8, max_positions=4, position_offset=2, convention="fairseq", padding_idx=None
    )
    # positions equal in float32 give the same fp32 table
    assert key(dim=8, positions=[0.1, 7.0]) == key(dim=8, positions=[0.1 + 1e-12, 7.0])
    assert key(dim=8, positions=[0.1, 7.0], compute_dtype="float64") != key(
        dim=8, positions=[0.1 + 1e-12, 7.0], compute_dtype="float64"
    )
    # one frequency: base and shift are irrelevant
    assert key(dim=2, max_positions=5, base=3.0, freq_shift=0.5) == key(dim=2, max_positions=5)
    # the odd-dim rule is irrelevant for even dims
    assert key(dim=8, max_positions=4, odd_dim="zero_pad") == key(dim=8, max_positions=4)
    # Marian's odd dims divide by dim / 2
    spec = parse_spec({"kind": "sinusoidal", "dim": 7, "max_positions": 3, "convention": "marian"})
    assert canonical_dict(spec)["freq_shift"] == -0.5


def test_explicit_null_padding_overrides_the_convention() -> None:
    ours = table(dim=8, max_positions=4, convention="fairseq", padding_idx=None)
    assert bool((ours[1] != 0).any())


# --- properties -----------------------------------------------------------------------------


@st.composite
def sinusoidal_specs(draw: st.DrawFn) -> dict[str, Any]:
    dim = draw(st.integers(2, 48))
    convention = draw(st.sampled_from([None, *CONVENTIONS]))
    fields: dict[str, Any] = {"kind": "sinusoidal", "dim": dim}
    if convention:
        fields["convention"] = convention
    odd_dim = draw(st.sampled_from(["zero_pad", "extra_sin"]))
    if dim % 2:
        fields["odd_dim"] = odd_dim
    if draw(st.booleans()):
        fields["max_positions"] = draw(st.integers(1, 40))
        if draw(st.booleans()):
            fields["position_offset"] = draw(st.integers(0, 5000))
    else:
        fields["positions"] = draw(
            st.lists(st.floats(-3000, 3000, allow_nan=False), min_size=1, max_size=20)
        )
    if draw(st.booleans()):
        fields["layout"] = draw(st.sampled_from(["interleaved", "sin_cos", "cos_sin"]))
    if draw(st.booleans()):
        fields["freq_shift"] = draw(st.sampled_from([0.0, 1.0, 0.5, -2.0]))
    if draw(st.booleans()):
        fields["base"] = draw(st.floats(1.5, 1e6))
    if draw(st.booleans()):
        fields["scale"] = draw(st.floats(-50.0, 50.0))
    if draw(st.booleans()):
        fields["compute_dtype"] = draw(st.sampled_from(["float32", "float64"]))
    if draw(st.booleans()):
        fields["padding_idx"] = draw(st.sampled_from([None, 0, 1, 3]))
    return fields


def build(fields: dict[str, Any]) -> SinusoidalSpec | None:
    try:
        spec = parse_spec(fields)
    except SpecError:
        return None  # e.g. freq_shift >= dim // 2
    assert isinstance(spec, SinusoidalSpec)
    return spec


def pairs(spec: SinusoidalSpec, emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sin, cos) columns of each of the K = dim // 2 frequency pairs."""
    c = spec.canonical()
    half = c.dim // 2
    k = torch.arange(half)
    if c.layout == "interleaved":
        return emb[:, 2 * k], emb[:, 2 * k + 1]
    if c.layout == "cos_sin":
        return emb[:, half + k], emb[:, k]
    return emb[:, k], emb[:, c.num_frequencies() + k]


@settings(max_examples=120, deadline=None)
@given(sinusoidal_specs())
def test_tables_are_bounded_unit_pairs(fields: dict[str, Any]) -> None:
    spec = build(fields)
    if spec is None:
        return
    result = compute(spec)
    emb = result.tensors["embedding"]
    (info,) = spec.outputs().values()
    assert tuple(emb.shape) == info.shape
    assert str(emb.dtype).removeprefix("torch.") == info.dtype
    assert torch.isfinite(emb).all()
    assert emb.abs().max() <= 1.0
    sin, cos = pairs(spec, emb.double())
    norm = sin**2 + cos**2
    c = spec.canonical()
    rows = torch.ones(emb.shape[0], dtype=torch.bool)
    if c.padding_idx is not None:
        positions = (
            torch.tensor(c.positions, dtype=torch.float64)
            if c.positions is not None
            else torch.arange(c.position_offset or 0, (c.position_offset or 0) + emb.shape[0])
        )
        rows = positions != c.padding_idx
        assert (emb[~rows] == 0).all()
    # the fp32 output rounds sin and cos separately: a few ulp of 1
    assert ((norm[rows] - 1).abs() <= 4 * ATOL["float32"]).all()
    if c.dim % 2 and c.odd_dim == "zero_pad":
        assert (emb[:, -1] == 0).all()


@settings(max_examples=80, deadline=None)
@given(sinusoidal_specs(), st.randoms())
def test_canonical_key_is_stable(fields: dict[str, Any], rnd: random.Random) -> None:
    spec = build(fields)
    if spec is None:
        return
    key = content_key(spec)
    items = list(fields.items())
    rnd.shuffle(items)
    assert content_key(parse_spec(dict(items))) == key
    # the canonical spelling (convention expanded, no convention) names the same table
    explicit = parse_spec(canonical_dict(spec))
    assert content_key(explicit) == key
    assert torch.equal(compute(explicit).tensors["embedding"], compute(spec).tensors["embedding"])


# --- relative-distance rows, the pow frequency rule, PatchTST's standardisation ------------


def test_new_fields_at_their_defaults_leave_the_canonical_form_unchanged() -> None:
    """frequencies 'exp', position_step 1 and no standardize are left out of the canonical form:
    the content keys of every spec written before them are unchanged."""
    plain = canonical_dict(parse_spec({"kind": "sinusoidal", "dim": 8, "max_positions": 4}))
    assert not {"frequencies", "position_step", "standardize"} & set(plain)
    spelled = {"kind": "sinusoidal", "dim": 8, "max_positions": 4, "frequencies": "exp"}
    assert content_key(parse_spec({**spelled, "position_step": 1})) == content_key(
        parse_spec({"kind": "sinusoidal", "dim": 8, "max_positions": 4})
    )
    # float64 is Marian's order under either rule: one table, one key
    f64 = {"kind": "sinusoidal", "dim": 8, "max_positions": 4, "compute_dtype": "float64"}
    assert content_key(parse_spec({**f64, "frequencies": "pow"})) == content_key(parse_spec(f64))


@pytest.mark.parametrize("convention", ["parakeet", "espnet", "transformer_xl", "tensor2tensor"])
def test_descending_rows_are_the_explicit_distances(convention: str) -> None:
    """position_step -1: row r is position position_offset - r, as the explicit positions give."""
    length = 9
    ours = table(
        dim=16,
        max_positions=2 * length - 1,
        position_offset=length - 1,
        position_step=-1,
        convention=convention,
    )
    distances = [float(length - 1 - r) for r in range(2 * length - 1)]
    assert torch.equal(ours, table(dim=16, positions=distances, convention=convention))


def test_pow_frequencies_are_transformers_rope_init() -> None:
    """frequencies 'pow': the angles at position 1 are `1.0 / (10000 ** (arange(0, d, 2) / d))`
    in float32 (transformers' RoPE init order), bit for bit; 'exp' differs on some of them."""
    dim = 1024
    rope = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    pow_row = table(dim=dim, max_positions=1, position_offset=1, convention="parakeet")
    assert torch.equal(pow_row[0, 0::2], torch.sin(rope))
    exp_row = table(dim=dim, max_positions=1, position_offset=1, convention="espnet")
    assert not torch.equal(exp_row, pow_row)


def test_patchtst_standardisation_is_patchtsts_own() -> None:
    """standardize 'patchtst' is PatchTSTPositionalEncoding._init_pe's sincos table."""
    from transformers import PatchTSTConfig
    from transformers.models.patchtst.modeling_patchtst import PatchTSTPositionalEncoding

    config = PatchTSTConfig(d_model=48, context_length=40, patch_length=4, patch_stride=4)
    theirs = PatchTSTPositionalEncoding._init_pe(config, 10).detach()
    ours = table(dim=48, max_positions=10, convention="espnet", standardize="patchtst")
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"positions": [1.0, 0.0], "position_step": -1}, "position_step"),
        ({"max_positions": 4, "position_step": 2}, "position_step"),
        ({"max_positions": 4, "frequencies": "log"}, "frequencies"),
        ({"max_positions": 4, "standardize": "z"}, "standardize"),
    ],
)
def test_new_fields_are_validated(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"kind": "sinusoidal", "dim": 8, **fields})
    assert field in [p.field for p in info.value.problems], info.value


def test_padding_row_of_descending_rows() -> None:
    """A padding position among descending rows zeroes its own row."""
    ours = table(dim=8, max_positions=5, position_offset=3, position_step=-1, padding_idx=1)
    assert not bool(ours[2].any())  # row 2 is position 3 - 2 = 1
    assert bool(ours[1].any())
    assert bool(ours[3].any())
