"""GPU tables do not drift from the CPU reference with the position (found on an H100, docs/gpu.md).

CUDA's `pow`/`exp` differ from the CPU's by an ulp or two on some elements of a frequency vector,
and an angle is position x frequency, so a GPU-computed frequency moved cos by 4.5e-4 at 131072
positions. Every family computes its frequencies on the CPU (as the reference builds them) and
only the per-position work on the device: the frequencies are then bit-identical, and cos/sin
within 2 ulp of 1.0 at any position. The comparison needs CUDA (skipped without a GPU).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from posenc.encodings import compute, parse_spec

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ULP_AT_ONE = 2.0**-23
"""float32's spacing just below 1.0 is 2**-24; trig tables are bounded by 1 (times A for RoPE)."""

LONG: list[dict[str, Any]] = [
    {"kind": "rope", "head_dim": 128, "rope_theta": 10000.0, "max_positions": 131072},
    {
        "kind": "rope",
        "head_dim": 128,
        "rope_theta": 500000.0,
        "max_positions": 131072,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    {
        "kind": "rope",
        "head_dim": 64,
        "max_positions": 65536,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 16384,
        },
    },
    {"kind": "sinusoidal", "dim": 1280, "max_positions": 32768, "convention": "whisper"},
    {"kind": "sinusoidal", "dim": 512, "max_positions": 32768, "convention": "marian"},
    {"kind": "xpos", "head_dim": 128, "max_positions": 32768},
]


@pytest.mark.parametrize("spec", LONG, ids=lambda s: f"{s['kind']}-{s.get('max_positions')}")
def test_the_cases_are_valid_specs(spec: dict[str, Any]) -> None:
    """Checked on every machine, so a CPU-only run catches a broken case list."""
    assert parse_spec(spec).canonical().kind == spec["kind"]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("spec", LONG, ids=lambda s: f"{s['kind']}-{s.get('max_positions')}")
def test_gpu_tables_stay_within_an_ulp_of_the_cpu_at_every_position(spec: dict[str, Any]) -> None:
    parsed = parse_spec(spec)
    cpu = compute(parsed, "cpu").tensors
    gpu = {name: t.cpu() for name, t in compute(parsed, "cuda").tensors.items()}
    assert set(cpu) == set(gpu)
    if "inv_freq" in cpu:
        assert torch.equal(cpu["inv_freq"], gpu["inv_freq"])
    for name, table in cpu.items():
        if table.is_floating_point():
            scale = max(1.0, float(table.abs().max()))
            worst = float((table.double() - gpu[name].double()).abs().max())
            assert worst <= 2 * ULP_AT_ONE * scale, f"{name}: {worst:.3g}"
