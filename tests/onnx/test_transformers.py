"""The rotary graphs equal transformers' own rotation: each model's rotary module computes cos/sin
for the position ids and its `apply_rotary_pos_emb` rotates q; the exported graph gets the same q
and position ids. Real configs (tests/encodings/rope/hf_models.py): Llama 3.1 (llama3), Qwen2.5
(yarn), DeepSeek-V3 (yarn, interleaved), Phi-3.5-mini (longrope, on both sides of its switch),
Pythia (GPT-NeoX partial rotary), GPT-J (interleaved, partial, [B, S, N, H] layout)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3RotaryEmbedding,
    apply_rotary_pos_emb_interleave,
)
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
from transformers.models.gpt_neox.modeling_gpt_neox import (
    apply_rotary_pos_emb as neox_apply,
)
from transformers.models.gptj.modeling_gptj import (
    apply_rotary_pos_emb as gptj_apply,
)
from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

from posenc.encodings import parse_spec
from posenc.onnx import export
from tests.encodings.rope import hf_models
from tests.onnx.cases import assert_close, run
from tests.tolerances import ATOL

Rotate = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(q [B, N, S, H], position_ids [B, S]) -> transformers' rotated q."""


def _same(y: torch.Tensor) -> torch.Tensor:
    return y


def _deinterleave(y: torch.Tensor) -> torch.Tensor:
    """DeepSeek's `apply_rotary_pos_emb_interleave` returns the rotated pairs de-interleaved
    (evens then odds), for q and k alike, so q.k is unchanged; the graph, like ONNX
    RotaryEmbedding(interleaved=1) and GPT-J, keeps the pairs in place."""
    return torch.cat((y[..., 0::2], y[..., 1::2]), dim=-1)


@dataclass(frozen=True)
class Case:
    spec: dict[str, Any]
    rotate: Rotate
    positions: tuple[tuple[int, ...], ...]
    heads: int = 2
    layout: Callable[[torch.Tensor], torch.Tensor] = _same


def _module_rotate(module: torch.nn.Module, apply: Callable[..., Any]) -> Rotate:
    def rotate(q: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cos, sin = module(q, pos)
        rotated, _ = apply(q, q, cos, sin)
        return rotated  # type: ignore[no-any-return]

    return rotate


def _gptj_rotate(rotary_dim: int, max_positions: int) -> Rotate:
    """GPTJAttention.forward's rotary part: [B, S, N, H] layout, gathered sincos, first
    rotary_dim channels rotated with `rotate_every_two`."""
    table = create_sinusoidal_positions(max_positions, rotary_dim)

    def rotate(q: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        bsnh = q.transpose(1, 2)
        sincos = table[pos].to(q.dtype)
        sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)
        rot = gptj_apply(bsnh[..., :rotary_dim], sin, cos)
        return torch.cat((rot, bsnh[..., rotary_dim:]), dim=-1).transpose(1, 2)

    return rotate


def _cases() -> dict[str, Case]:
    llama = hf_models.llama(128, hf_models.LLAMA31_ROPE, 500000.0, max_position_embeddings=131072)
    phi = hf_models.phi35_mini()
    deepseek = hf_models.deepseek_v3()
    longrope = {
        "rope_type": "longrope",
        "short_factor": hf_models.PHI35_SHORT_FACTOR,
        "long_factor": hf_models.PHI35_LONG_FACTOR,
        "original_max_position_embeddings": hf_models.PHI35_ORIG,
        "max_position_embeddings": hf_models.PHI35_MAX,
    }
    return {
        "llama3.1": Case(
            {
                "head_dim": 128,
                "rope_theta": 500000.0,
                "rope_scaling": hf_models.LLAMA31_ROPE,
                "max_positions": 9000,
            },
            _module_rotate(LlamaRotaryEmbedding(llama), apply_rotary_pos_emb),
            ((0, 1, 2, 8191), (8192, 8193, 8500, 8999)),
        ),
        "qwen2.5-yarn": Case(
            {
                "head_dim": 128,
                "rope_theta": 1e6,
                "rope_scaling": hf_models.QWEN_YARN_ROPE,
                "max_positions": 33000,
            },
            _module_rotate(Qwen2RotaryEmbedding(hf_models.qwen2_yarn()), apply_rotary_pos_emb),
            ((0, 5, 100, 32767), (32768, 32800, 32900, 32999)),
        ),
        "deepseek-v3-yarn-interleaved": Case(
            {
                "head_dim": 64,
                "rope_theta": 10000.0,
                "rope_scaling": hf_models.DEEPSEEK_V3_ROPE,
                "interleaved": True,
                "max_positions": 5000,
            },
            _module_rotate(DeepseekV3RotaryEmbedding(deepseek), apply_rotary_pos_emb_interleave),
            ((0, 1, 4095, 4096), (4500, 4600, 4700, 4999)),
            layout=_deinterleave,
        ),
        "phi3.5-longrope-short": Case(
            {"head_dim": 96, "rope_scaling": longrope, "max_positions": 4200},
            _module_rotate(Phi3RotaryEmbedding(phi), apply_rotary_pos_emb),
            ((0, 1, 2, 3), (4000, 4001, 4094, 4095)),  # L = 4096: short factors
        ),
        "phi3.5-longrope-long": Case(
            {"head_dim": 96, "rope_scaling": longrope, "max_positions": 4200},
            _module_rotate(Phi3RotaryEmbedding(phi), apply_rotary_pos_emb),
            ((0, 1, 2, 3), (4000, 4001, 4095, 4096)),  # L = 4097: long factors
        ),
        "pythia-partial": Case(
            {"head_dim": 256, "partial_rotary_factor": 0.25, "max_positions": 2048},
            _module_rotate(GPTNeoXRotaryEmbedding(hf_models.pythia()), neox_apply),
            ((0, 1, 2, 3), (1000, 2045, 2046, 2047)),
        ),
        "gpt-j-interleaved-partial": Case(
            {"head_dim": 256, "rotary_dim": 64, "interleaved": True, "max_positions": 2048},
            _gptj_rotate(64, 2048),
            ((0, 1, 2, 3), (1000, 2045, 2046, 2047)),
        ),
    }


CASES = _cases()


@pytest.mark.parametrize("mode", ["table", "compute"])
@pytest.mark.parametrize("op", ["decomposed", "onnx", "contrib"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_rotary_graph_equals_transformers(name: str, op: str, mode: str) -> None:
    case = CASES[name]
    spec = parse_spec({"kind": "rope", **case.spec})
    pos = torch.tensor(case.positions)
    b, s = pos.shape
    gen = torch.Generator().manual_seed(3)
    q = torch.rand(b, case.heads, s, int(case.spec["head_dim"]), generator=gen) * 2 - 1
    with torch.no_grad():
        want = case.rotate(q, pos)
    # [B, S, N*H] input (num_heads) for contrib, which needs it for partial rotary
    heads = case.heads if op == "contrib" else None
    model = export(spec, "rotary", op=op, mode=mode, opset=23, num_heads=heads)
    feed = q.transpose(1, 2).reshape(b, s, -1) if heads else q
    y = run(model, {"x": feed, "position_ids": pos})["y"]
    if heads:
        y = y.reshape(b, s, case.heads, -1).transpose(1, 2)
    assert_close(case.layout(y), want, 2 * ATOL["float32"])


@pytest.mark.parametrize("name", ["llama3.1", "phi3.5-longrope-long"])
def test_float16_rotary_matches_transformers_in_float16(name: str) -> None:
    case = CASES[name]
    spec = parse_spec({"kind": "rope", **case.spec, "dtype": "float16"})
    pos = torch.tensor(case.positions)
    gen = torch.Generator().manual_seed(4)
    q = torch.rand(*pos.shape[:1], case.heads, pos.shape[1], spec.head_dim, generator=gen) * 2 - 1
    q = q.half()
    with torch.no_grad():
        want = case.rotate(q, pos)  # cos/sin cast to fp16, rotation in fp16, as transformers
    y = run(export(spec, "rotary", mode="compute"), {"x": q, "position_ids": pos})["y"]
    assert_close(y, want, 2 * ATOL["float16"])
