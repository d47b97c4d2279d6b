"""The fused CUDA path's plans, reference and dispatch, on any machine (issue 36).

A plan (`posenc.encodings.fused`) says in which columns the kernel writes each frequency's cos and
sin. `fused.reference` computes what the kernel writes with torch's ops (its positions, angles,
scales and casts in its order, written where the plan says): on the CPU it must give the torch
path's tables bit for bit, for every case of tests/runtime/fused_cases.py. The kernel probes each
variant against it on its first launch, and tests/runtime/test_fused_cuda.py compares the
kernel's own arithmetic on a GPU. Dispatch: without triton, or turned off, the torch path runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch

import posenc.encodings
from posenc.encodings import compute, fused, parse_spec
from posenc.encodings.rope import RopeSpec, rope_inv_freq, tables
from posenc.encodings.rope.compute import fused_tables, rope_plan_for
from posenc.encodings.sinusoidal import (
    SinusoidalSpec,
    arrange,
    float32_inv_freq,
    fused_table,
    sinusoidal_angles,
)
from tests.runtime.fused_cases import rope_cases, sinusoidal_cases

CPU = torch.device("cpu")
ROPE = rope_cases(max_positions=48) + rope_cases(max_positions=48, precision="exact")
"""Reference (float32) and exact (float64 compute) precision: the kernel takes exact tables
when `fused.FLOAT64` is on."""
SINUSOIDAL = [
    (name, case)
    for name, case in sinusoidal_cases(max_positions=48)
    if getattr(parse_spec(case).canonical(), "compute_dtype", None) == "float32"
]
"""The sinusoidal cases the fused path takes (float64 compute stays on torch)."""


@pytest.mark.parametrize("case", [c[1] for c in ROPE], ids=[c[0] for c in ROPE])
def test_rope_plans_lay_out_the_torch_tables(case: dict[str, Any]) -> None:
    spec = parse_spec(case).canonical()
    assert isinstance(spec, RopeSpec)
    inv, scaling, _ = rope_inv_freq(spec, CPU)
    positions = torch.arange(spec.max_positions)
    want = tables(spec, inv, scaling, positions)
    plan = rope_plan_for(spec, inv.numel())
    assert plan is not None
    got = fused.reference(plan, inv, out_scale=scaling)
    assert list(got) == list(want)
    for name, table in want.items():
        assert got[name].shape == table.shape
        assert got[name].dtype == table.dtype
        assert torch.equal(got[name], table), name


@pytest.mark.parametrize("case", [c[1] for c in SINUSOIDAL], ids=[c[0] for c in SINUSOIDAL])
def test_sinusoidal_plans_lay_out_the_torch_tables(case: dict[str, Any]) -> None:
    spec = parse_spec(case).canonical()
    assert isinstance(spec, SinusoidalSpec)
    n, half = spec.num_frequencies(), spec.dim // 2
    plan = fused.sinusoidal_plan(
        n=n, dim=spec.dim, rows=spec.num_rows(), layout=str(spec.layout), dtype=str(spec.dtype)
    )
    if spec.layout == "interleaved" and n > half:
        assert plan is None  # the extra sin column breaks the interleaved column rule
        return
    assert plan is not None
    angles = sinusoidal_angles(spec, CPU)
    (got,) = fused.reference(
        plan,
        float32_inv_freq(spec),
        pos_start=int(spec.position_offset or 0),
        pos_step=-1 if spec.position_step == -1 else 1,
        angle_scale=float(1.0 if spec.scale is None else spec.scale),
    ).values()  # the arguments `sinusoidal.fused_launch` launches the kernel with
    want = arrange(spec, angles).to(plan.dtype)
    assert torch.equal(got, want)


def test_plans_decline_what_the_kernel_does_not_cast_to() -> None:
    assert fused.rope_plan(
        half=4, rows=8, width="full", packing="separate", repeats_interleaved=False,
        dtype="float64",
    ) is None  # fmt: skip
    assert fused.sinusoidal_plan(n=4, dim=8, rows=8, layout="sin_cos", dtype="float64") is None


def test_without_triton_the_torch_path_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine whose torch has no triton (every CPU wheel): `kernels()` is None, CUDA devices
    are not `usable`, and the family functions hand back None for the torch path."""
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    monkeypatch.delitem(sys.modules, "posenc.encodings._triton_trig", raising=False)
    monkeypatch.delattr(posenc.encodings, "_triton_trig", raising=False)
    fused.kernels.cache_clear()
    try:
        assert fused.kernels() is None
        assert not fused.usable(torch.device("cuda"))
        assert not fused.usable(CPU)
        rope = parse_spec({"kind": "rope", "head_dim": 64, "max_positions": 16}).canonical()
        assert isinstance(rope, RopeSpec)
        inv, scaling, _ = rope_inv_freq(rope, CPU)
        assert fused_tables(rope, inv, scaling) is None
        sinus = parse_spec(
            {"kind": "sinusoidal", "convention": "whisper", "dim": 8, "max_positions": 4}
        ).canonical()
        assert isinstance(sinus, SinusoidalSpec)
        assert fused_table(sinus, torch.device("cuda")) is None
        table = compute(rope, "cpu").tensors
        assert torch.equal(table["cos"], tables(rope, inv, scaling, torch.arange(16))["cos"])
    finally:
        fused.kernels.cache_clear()


@pytest.mark.parametrize(
    ("value", "enabled"),
    [(None, True), ("1", True), ("0", False), ("false", False), ("off", False), ("No", False)],
)
def test_the_environment_flag_turns_the_fused_path_off(value: str | None, enabled: bool) -> None:
    """The server's `fused_kernels` setting (`POSENC_FUSED_KERNELS`) sets the switch when the
    app is built (in a process of its own: the switch is the process's)."""
    env = {k: v for k, v in os.environ.items() if k != "POSENC_FUSED_KERNELS"}
    if value is not None:
        env["POSENC_FUSED_KERNELS"] = value
    code = (
        "import torch\n"
        "from posenc.api.app import create_app\n"
        "from posenc.api.settings import Settings\n"
        "from posenc.encodings import fused\n"
        f"fused.ENABLED = {not enabled!r}  # the opposite: create_app must set it\n"
        "create_app(Settings())\n"
        "print(fused.ENABLED, fused.usable(torch.device('cuda')) if not fused.ENABLED else '-')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == str(enabled)
    if not enabled:
        assert out[1] == "False"  # off means off, whether or not triton and a GPU are there
