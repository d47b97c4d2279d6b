"""libdevice's cos/sin in a Triton kernel against torch's CUDA cos/sin of the same values, float64
and float32: the one thing the fused kernel's bits rest on that no CPU can check (docs/gpu.md,
"Sixth run": 0 of 26,777,216 differ in each). Needs CUDA and triton:
`python tools/gpu_trig_check.py` (the last step of tools/gpu_check36.sh); exit 1 if any differ.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice


@triton.jit  # type: ignore[misc, unused-ignore]
def _trig(x_ptr, c_ptr, s_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]  # noqa: N803
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m)
    tl.store(c_ptr + i, libdevice.cos(x), mask=m)
    tl.store(s_ptr + i, libdevice.sin(x), mask=m)


def value_sets(dt: torch.dtype, dev: torch.device) -> dict[str, torch.Tensor]:
    """Uniform angles, Llama 3's (262,144 positions x 64 frequencies, base 500,000) and values
    within 1e-9 of multiples of pi/2, where argument reduction is hardest."""
    g = torch.Generator(device=dev).manual_seed(0)
    pos = torch.arange(262144, device=dev, dtype=dt)
    inv = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, device=dev, dtype=dt) / 128))
    half_pi = torch.arange(1, 2_000_001, device=dev, dtype=dt) * 1.5707963267948966
    two_pi = 6.283185307179586
    return {
        "uniform [0, 2pi)": torch.rand(4_000_000, generator=g, device=dev, dtype=dt) * two_pi,
        "uniform [0, 3e5)": torch.rand(4_000_000, generator=g, device=dev, dtype=dt) * 3e5,
        "llama3 angles 262144 x 64": torch.outer(pos, inv).reshape(-1),
        "near multiples of pi/2": half_pi
        + torch.randn(2_000_000, generator=g, device=dev, dtype=dt) * 1e-9,
    }


def main() -> int:
    dev = torch.device("cuda")
    differ = 0
    for dt in (torch.float64, torch.float32):
        for name, x in value_sets(dt, dev).items():
            x = x.contiguous()
            c, s = torch.empty_like(x), torch.empty_like(x)
            _trig[(triton.cdiv(x.numel(), 1024),)](x, c, s, x.numel(), BLOCK=1024)
            dc = int((c != torch.cos(x)).sum())
            ds = int((s != torch.sin(x)).sum())
            differ += dc + ds
            print(f"{dt!s:14} {name:28} n={x.numel():>10,} cos differ {dc:>7,} sin differ {ds:>7,}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
