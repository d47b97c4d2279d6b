"""The fused kernel in Triton's interpreter, on the CPU: every launch shape `bench.fused_tune`
sweeps (angles x warps per program) writes the default shape's table, and the kernel's arithmetic
(positions, angles, scales, the casts, float64 to 16 bits through float32 rounded to odd) gives
`rope.compute.tables` bit for bit for every RoPE case of tests/runtime/fused_cases.py, at
reference and at exact (float64) precision.

Says nothing of bits or speed on a GPU: the interpreter runs the kernel with numpy, with torch's
CPU `cos`/`sin` patched in for libdevice's (which it lacks), and ignores the warps. It checks that
each shape launches and covers every element exactly as the default does (masks, block sizes),
and that everything but libdevice's cos and sin computes what the torch path does.
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
from typing import Any

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter
from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

import posenc.encodings._triton_trig as kernel
from bench.fused_tune import ELEMENTS, WARPS
from posenc.encodings import fused, parse_spec
from posenc.encodings.rope import RopeSpec, rope_inv_freq, tables
from posenc.encodings.rope.compute import rope_plan_for
from posenc.encodings.rounding import cast
from tests.runtime.fused_cases import rope_cases

kernel.libdevice = tl  # the interpreter patches tl's cos and sin, not libdevice's


def _torch_op(name: str) -> object:
    def op(self: InterpreterBuilder, arg: object) -> object:
        return self.unary_op(arg, lambda a: getattr(torch, name)(torch.from_numpy(a)).numpy())

    return op


InterpreterBuilder.create_cos = _torch_op("cos")  # torch's CPU cos and sin, as the torch path's
InterpreterBuilder.create_sin = _torch_op("sin")
_cast_impl = InterpreterBuilder.cast_impl


def _cast_rne(self: InterpreterBuilder, src: Any, dst_type: Any) -> Any:
    """float32 to bfloat16 rounded to nearest even, as the GPU does (checked there against
    torch); the interpreter's own truncates."""
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
        bf16 = torch.from_numpy(src.data).to(torch.bfloat16).view(torch.int16).numpy()
        return TensorHandle(bf16.view(np.uint16), tl.bfloat16)
    return _cast_impl(self, src, dst_type)


InterpreterBuilder.cast_impl = _cast_rne
_implicit_cvt = interpreter._implicit_cvt


def _float64_scalars(arg: Any) -> Any:
    """A Python float argument as the kernel's signature types it (`tl.float64`), where the
    interpreter would make it a float32 constant."""
    if isinstance(arg, float):
        return tl.tensor(TensorHandle(np.array([arg], dtype=np.float64), tl.float64), tl.float64)
    return _implicit_cvt(arg)


interpreter._implicit_cvt = _float64_scalars
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


def shapes() -> int:
    """How many (plan, shape) pairs write another table than the default shape does."""
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
    return differ


def arithmetic(precision: str, max_positions: int = 40) -> int:
    """How many RoPE cases at `precision` the kernel (torch's cos/sin for libdevice's) computes
    otherwise than `rope.compute.tables` on the CPU."""
    bad = []
    fused.CHECK_ROWS = 64  # each variant's first-launch probe, shorter: numpy runs the kernel
    cases = rope_cases(max_positions=max_positions, precision=precision)
    for name, case in cases:
        spec = parse_spec(case).canonical()
        assert isinstance(spec, RopeSpec)
        inv, scaling, _ = rope_inv_freq(spec, torch.device("cpu"))
        plan = rope_plan_for(spec, inv.numel())
        assert plan is not None
        got = fused.run(plan, inv, out_scale=scaling)
        assert got is not None, fused.FAILED
        want = tables(spec, inv, scaling, torch.arange(spec.max_positions))
        if list(got) != list(want) or not all(torch.equal(got[k], want[k]) for k in want):
            bad.append(name)
    print(
        f"{precision} precision: {len(cases) - len(bad)} of {len(cases)} RoPE cases equal", *bad[:5]
    )
    return len(bad)


@triton.jit
def _cast_kernel(x_ptr, out_ptr, n, block: tl.constexpr):  # type: ignore[no-untyped-def]
    at = tl.program_id(0) * block + tl.arange(0, block)
    x = tl.load(x_ptr + at, mask=at < n)
    tl.store(out_ptr + at, kernel._to_out(x, out_ptr.dtype.element_ty), mask=at < n)


def near_ties(out: torch.dtype, count: int = 200_000) -> torch.Tensor:
    """float64 values where rounding twice goes wrong: the midpoints between neighbouring `out`
    values, each moved by a float64 ulp or a few float32 ulps either way (float32's nearest is
    then often the midpoint itself), plus values float32 holds exactly, both signs."""
    gen = torch.Generator().manual_seed(0)
    low = (torch.rand(count, generator=gen, dtype=torch.float64) * 4 - 2).to(out)
    high = torch.nextafter(low, torch.full_like(low, float("inf")))
    mid = (low.double() + high.double()) / 2
    ulp32 = mid.abs() * 2.0**-24
    step = torch.randint(-3, 4, (count,), generator=gen).double()
    tiny = torch.nextafter(mid, torch.where(step > 0, mid + 1, mid - 1)) - mid
    return torch.cat([mid + tiny, mid - tiny, mid + step * ulp32 / 2, mid, low.double()])


def casts() -> int:
    """How many float64 values `_trig_triton._to_out` casts to bfloat16 or float16 otherwise
    than the torch path's `rounding.cast` (float32 rounded to odd, then to nearest even)."""
    differ = 0
    for out in (torch.bfloat16, torch.float16):
        x = near_ties(out)
        got = torch.empty(x.shape, dtype=out)
        _cast_kernel[(triton.cdiv(x.numel(), 1024),)](x, got, x.numel(), block=1024)
        want = cast(x, out)
        bad = int((got.view(torch.int16) != want.view(torch.int16)).sum())
        twice = int((x.float().to(out).view(torch.int16) != want.view(torch.int16)).sum())
        print(
            f"float64 -> {out}: {x.numel() - bad} of {x.numel()} equal the torch path's cast "
            f"(rounding twice would miss {twice})"
        )
        differ += bad
    return differ


def probe() -> int:
    """1 unless `fused.run`'s first-launch probe turns the fused path off for a kernel that writes
    one bit otherwise than torch's ops (and the caller gets None, for its torch path), else 0."""
    plan, n = PLANS["rope d128 full fp32"]
    assert plan is not None
    inv = 1.0 / (10000 ** (torch.arange(n, dtype=torch.float32) / n))
    real = kernel.launch

    def off_by_one_bit(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        args[1].view(torch.int32).view(-1)[-1] ^= 1  # the last cos element

    kernel.launch = off_by_one_bit
    fused._VERDICTS.clear()
    try:
        caught = fused.run(plan, inv) is None and bool(fused.FAILED)
        print("probe: a kernel one bit off is", "caught" if caught else "NOT caught", fused.FAILED)
    finally:
        kernel.launch = real
        fused.FAILED.clear()
        fused._VERDICTS.clear()
    return 0 if caught else 1


def main() -> int:
    np.seterr(all="ignore")
    checks = shapes() + casts() + probe()
    return 1 if checks + arithmetic("reference") + arithmetic("exact") else 0


if __name__ == "__main__":
    sys.exit(main())
