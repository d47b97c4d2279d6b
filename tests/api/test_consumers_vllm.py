"""vLLM's own rotary classes fed the tables posenc serves (issue 29), run by `make vllm-check`.

vLLM 0.33's wheel declares CUDA's torch 2.14 and transformers<5.21, which the suite's lock cannot
hold, yet its rotary classes import on torch 2.13's CPU build and run their native path
(`forward_native`, the pure-torch reference vLLM's kernel tests compare its CUDA kernels with;
`vllm/model_executor/layers/rotary_embedding/base.py`). `make vllm-check` builds .venv-vllm from
the suite's lock plus `requirements/vllm.txt` (the wheel without its dependencies and the
packages its import needs) and runs this file there; in the suite's environment, which has no
vLLM, the whole file is skipped.

Each cell: vLLM's class with its `cos_sin_cache` replaced by the table posenc serves (profile
`vllm`, a config resolved by the server) rotates fixed q/k exactly as transformers' rotary
module plus the model's apply function does (within 2 fp32 ulps), and so does the class on the
cache it builds itself. vLLM's LongRoPE class is not run: it reads `get_current_vllm_config()`
(a model config loaded from the hub) in its constructor; profile `vllm` refuses LongRoPE
(tests/api/test_consumers.py::test_vllm_profile_refuses_longrope).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import torch

from tests.api.test_consumers import (
    LLAMA31_ROPE,
    MAX_ULPS,
    SEQ,
    _apply,
    _case,
    _module_tables,
    _qk,
    _served,
    _ulps,
)

pytest.importorskip("vllm", reason="vLLM runs in .venv-vllm only (make vllm-check)")

VLLM_ROWS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "llama": ("llama", None),
    "llama31": ("llama", LLAMA31_ROPE),
    "qwen2": ("qwen2", None),
    "gptj": ("gptj", None),
    "gpt_neox": ("gpt_neox", None),
}
"""Matrix rows: name -> (model type, rope parameters replacing the class defaults): half-split
Llama, Qwen2 and GPT-NeoX (partial rotary), Llama 3.1's llama3 scaling, GPT-J's interleaved
pairs (`is_neox_style=False`)."""


def _vllm_rope(spec: dict[str, Any], rope: dict[str, Any] | None) -> torch.nn.Module:
    """vLLM's class for the served spec, built as `get_rope` builds it for the model:
    `RotaryEmbedding` (base.py) or `Llama3RotaryEmbedding` (llama3_rope.py), float32, with
    head_size = rotary_dim (the rotated channels only, as transformers' apply takes them)."""
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
    from vllm.model_executor.layers.rotary_embedding.llama3_rope import Llama3RotaryEmbedding

    d = int(spec["rotary_dim"])
    common: dict[str, Any] = {
        "head_size": d,
        "rotary_dim": d,
        "max_position_embeddings": SEQ,
        "base": float(spec["rope_theta"]),
        "is_neox_style": not spec["interleaved"],
        "dtype": torch.float32,
    }
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

    # A CustomOp reads the current config when built (vLLM's own tests: `default_vllm_config`);
    # this CUDA wheel infers no device on a CPU machine, so the config names it.
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        if rope is None:
            return RotaryEmbedding(**common)
        return Llama3RotaryEmbedding(
            **common,
            scaling_factor=rope["factor"],
            low_freq_factor=rope["low_freq_factor"],
            high_freq_factor=rope["high_freq_factor"],
            orig_max_position=rope["original_max_position_embeddings"],
        )


def _run(rope: torch.nn.Module, d: int) -> torch.Tensor:
    """vLLM's `forward_native(positions, query, key)` on `_qk`'s heads, (tokens, heads * d) in
    and out; returned as (q|k, B, H, S, D) like `_apply`."""
    q, k = _qk(d)
    flat = [t[0].transpose(0, 1).reshape(SEQ, -1) for t in (q, k)]
    with torch.no_grad():
        out_q, out_k = rope.forward_native(torch.arange(SEQ), flat[0].clone(), flat[1].clone())
    return torch.stack([t.reshape(SEQ, -1, d).transpose(0, 1)[None] for t in (out_q, out_k)])


@pytest.mark.parametrize("row", list(VLLM_ROWS))
def test_vllm_rotary_reads_the_served_table(client: httpx.Client, row: str) -> None:
    model_type, rope = VLLM_ROWS[row]
    data = _case(model_type)
    if rope is not None:
        data["rope_parameters"] = dict(rope)
    served = _served(client, data, profile="vllm")
    spec = served["spec"]
    d = int(spec["rotary_dim"])
    assert spec["interleaved"] == (served["notes"]["pairing"] == "interleaved")
    module, tables = _module_tables(data)
    cos_m, sin_m = tables[None]
    want = _apply(module.apply_rotary_pos_emb, cos_m[0], sin_m[0], d)
    vllm_rope = _vllm_rope(spec, rope)
    own = _run(vllm_rope, d)
    assert tuple(served["cos_sin"].shape) == tuple(vllm_rope.cos_sin_cache.shape)
    vllm_rope.cos_sin_cache = served["cos_sin"]
    got = _run(vllm_rope, d)
    assert _ulps(got, want) <= MAX_ULPS, _ulps(got, want)
    assert _ulps(own, want) <= MAX_ULPS, _ulps(own, want)
