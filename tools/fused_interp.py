"""The fused kernel's launch shapes in Triton's interpreter, on the CPU: every shape
`bench.fused_tune` sweeps (angles x warps per program) writes the default shape's table.

Says nothing of bits or speed on a GPU: the interpreter runs the kernel with numpy, with
`tl.cos`/`tl.sin` in place of libdevice (which it lacks), and ignores the warps. It checks that
each shape launches and covers every element exactly as the default does (masks, block sizes).
Needs triton, which the CPU environment does not install:

    pip install --no-deps --target /tmp/tsite triton==3.6.0
    PYTHONPATH=/tmp/tsite:service:. .venv/bin/python tools/fused_interp.py
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import types

os.environ["TRITON_INTERPRET"] = "1"

import torch
import triton.language as tl

import posenc.encodings._triton_trig as kernel
from bench.fused_tune import ELEMENTS, WARPS
from posenc.encodings import fused

kernel.libdevice = tl  # the interpreter patches tl's cos and sin, not libdevice's
kernel.torch = types.SimpleNamespace(  # launch's `torch.cuda.device(...)`: no CUDA here
    cuda=types.SimpleNamespace(device=lambda _: contextlib.nullcontext())
)

PLANS = {
    "rope d128 full fp32": (fused.rope_plan(half=64, rows=300, width="full",
        packing="separate", repeats_interleaved=False, dtype="float32"), 64),
    "rope d64 half bf16": (fused.rope_plan(half=32, rows=257, width="half",
        packing="separate", repeats_interleaved=False, dtype="bfloat16"), 32),
    "rope pairs interleaved fp16": (fused.rope_plan(half=16, rows=100, width="full",
        packing="pairs", repeats_interleaved=True, dtype="float16"), 16),
    "sinusoidal 1024 fp32": (fused.sinusoidal_plan(n=512, dim=1024, rows=70,
        layout="sin_cos", dtype="float32"), 512),
}  # fmt: skip


def launch(plan: fused.TrigPlan, inv: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {name: torch.zeros(shape, dtype=plan.dtype) for name, shape in plan.shapes.items()}
    kernel.launch(
        inv,
        out[plan.cos_out],
        out[plan.sin_out],
        n_rows=next(iter(plan.shapes.values()))[0],
        n_cos=plan.n_cos,
        pos_start=0,
        pos_step=1,
        row_stride=plan.row_stride,
        cos_map=plan.cos_map,
        sin_map=plan.sin_map,
        angle_scale=1.0,
        out_scale=1.0,
    )
    return out


def main() -> int:
    differ = 0
    default = kernel.ELEMENTS_PER_PROGRAM, kernel.NUM_WARPS
    for name, (plan, n) in PLANS.items():
        assert plan is not None
        inv = 1.0 / (10000 ** (torch.arange(n, dtype=torch.float32) / n))
        reference = launch(plan, inv)
        assert all(t.abs().sum() > 0 for t in reference.values()), "nothing written"
        bad = []
        for elements, warps in itertools.product(ELEMENTS, WARPS):
            kernel.ELEMENTS_PER_PROGRAM, kernel.NUM_WARPS = elements, warps
            got = launch(plan, inv)
            if not all(torch.equal(got[k], reference[k]) for k in reference):
                bad.append(f"{elements} x {warps}")
        kernel.ELEMENTS_PER_PROGRAM, kernel.NUM_WARPS = default
        differ += len(bad)
        print(f"{name}: {len(ELEMENTS) * len(WARPS) - len(bad)} shapes equal the default", *bad)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
