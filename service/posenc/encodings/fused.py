"""The fused CUDA path: a RoPE or sinusoidal table's angles, cos/sin, scaling, layout and cast in
one Triton kernel launch (`posenc.encodings._triton_trig`), instead of torch's arange, outer
product, cos, sin, multiply, cat and cast kernels.

Bit-identical to the torch CUDA path it replaces (tests/runtime/test_fused_cuda.py): the same
operations in the compute dtype on the same operands (CPU-computed frequencies moved to the
device), the same accurate `cosf`/`sinf`, the same round-to-nearest-even cast. It is taken only
when the device is CUDA, triton imports, `ENABLED` is true and the spec maps (below); otherwise
the torch path runs unchanged. The server sets `ENABLED` from its `fused_kernels` setting
(`POSENC_FUSED_KERNELS`, `--no-fused-kernels`); tests and benches set it directly.

What maps: RoPE at reference precision without `trig: "polar"` (every scaling variant, since all
of them only change the frequency vector and the attention scaling; every width, packing,
full-width arrangement and output dtype); sinusoidal tables at float32 compute precision over a
contiguous position range, without PatchTST standardisation and without an odd interleaved
table's extra sin column. Polar trig, explicit position lists and standardised tables stay on
torch. So does exact precision (float64 compute) RoPE while `FLOAT64` is off: the kernel computes
it (float64 angles, CUDA's float64 `cos`/`sin`, `rope.compute.cast`'s rounding), but those bits
have not yet been compared with torch's on a GPU.

A plan says where the kernel writes cos and sin of frequency f in a row: column
`f * mul + add` of the row and, for full-width RoPE tables, the duplicate `dup` further
(`cat(c, c)`: +half; `repeat_interleave`: +1; doubled inside `pairs`). Plans are plain data,
checked against the torch layouts on the CPU (tests/encodings/test_fused_plan.py).
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass
from functools import cache
from types import ModuleType

import torch

from posenc.encodings.base import DTYPES

ENABLED: bool = True
"""Whether CUDA tables may take the fused kernel: the server sets it from its `fused_kernels`
setting (`POSENC_FUSED_KERNELS`, default on) when it builds the app."""

FLOAT64: bool = False
"""Whether exact precision (float64 compute) RoPE tables may take the kernel. Off until
tests/runtime/test_fused_cuda.py's float64 cases have passed on a GPU (they turn it on for
themselves); `bench.compute --fused-float64` measures it. The torch path serves meanwhile."""

COMPUTE_DTYPES = frozenset({torch.float32, torch.float64})
"""Frequency (compute) dtypes the kernel computes in."""

OUT_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})
"""Output dtypes the kernel casts to (float32 results, round-to-nearest-even)."""

_log = logging.getLogger(__name__)

_LAUNCH = threading.Lock()
"""Launches one at a time: a first launch compiles, and Triton's compile cache is not meant for
threads racing on it (a launch is microseconds: the kernel runs asynchronously)."""

ColumnMap = tuple[int, int, int]
"""(mul, add, dup): frequency f goes to column f * mul + add of a row, and dup further if dup."""


@dataclass(frozen=True)
class TrigPlan:
    """Where one kernel launch writes a table: output tensors (name -> shape, in order), which
    of them receives cos and sin, the row stride (elements), the column maps, how many
    frequencies have a cos (the rest only a sin) and the output dtype."""

    shapes: dict[str, tuple[int, ...]]
    cos_out: str
    sin_out: str
    row_stride: int
    cos_map: ColumnMap
    sin_map: ColumnMap
    n_cos: int
    dtype: torch.dtype


@cache
def kernels() -> ModuleType | None:
    """The Triton kernel module, or None where triton does not import (CPU wheels, no driver)."""
    try:
        return importlib.import_module("posenc.encodings._triton_trig")
    except Exception:  # ImportError, or triton failing to find its toolchain or driver
        return None


FAILED: list[str] = []
"""Why the kernel failed to compile or launch, once it has (the fused path is then off for the
process, with a warning logged: the torch path serves instead of an error)."""


def usable(device: torch.device) -> bool:
    """Whether a table on `device` may take the fused path at all (CUDA, enabled, triton, and
    the kernel has not failed in this process)."""
    return ENABLED and device.type == "cuda" and not FAILED and kernels() is not None


def rope_plan(
    *,
    half: int,
    rows: int,
    width: str,
    packing: str,
    repeats_interleaved: bool,
    dtype: str,
) -> TrigPlan | None:
    """The plan of a RoPE table of `rows` positions from `half` frequencies, laid out as
    `rope.compute.layout` lays it out, or None where the kernel does not apply."""
    out = DTYPES[dtype]
    if out not in OUT_DTYPES or half < 1 or rows < 1:
        return None
    if width == "half":
        w, m, a, dup = half, 1, 0, 0
    elif repeats_interleaved:
        w, m, a, dup = 2 * half, 2, 0, 1
    else:
        w, m, a, dup = 2 * half, 1, 0, half
    if packing == "cos_sin":
        return TrigPlan(
            {"cos_sin": (rows, 2 * w)}, "cos_sin", "cos_sin", 2 * w, (m, a, dup), (m, a + w, dup),
            half, out,
        )  # fmt: skip
    if packing == "pairs":
        pair = (2 * m, 2 * a, 2 * dup)
        return TrigPlan(
            {"pairs": (rows, w, 2)}, "pairs", "pairs", 2 * w, pair, (2 * m, 2 * a + 1, 2 * dup),
            half, out,
        )  # fmt: skip
    return TrigPlan(
        {"cos": (rows, w), "sin": (rows, w)}, "cos", "sin", w, (m, a, dup), (m, a, dup), half, out
    )


def sinusoidal_plan(*, n: int, dim: int, rows: int, layout: str, dtype: str) -> TrigPlan | None:
    """The plan of a sinusoidal table (rows, dim) from `n` frequencies (sin of every one, cos of
    the first dim // 2), laid out as `sinusoidal.arrange` lays it out; None where it does not
    map (an interleaved table with an extra sin frequency, or an unsupported dtype). A zero
    padding column (odd dim) is left unwritten: the caller zeroes it."""
    out = DTYPES[dtype]
    half = dim // 2
    if out not in OUT_DTYPES or n < 1 or rows < 1 or half > n:
        return None
    shapes: dict[str, tuple[int, ...]] = {"embedding": (rows, dim)}
    if layout == "interleaved":
        if n != half:
            return None
        return TrigPlan(shapes, "embedding", "embedding", dim, (2, 1, 0), (2, 0, 0), half, out)
    if layout == "cos_sin":
        return TrigPlan(shapes, "embedding", "embedding", dim, (1, 0, 0), (1, half, 0), half, out)
    return TrigPlan(shapes, "embedding", "embedding", dim, (1, n, 0), (1, 0, 0), half, out)


def run(
    plan: TrigPlan,
    inv: torch.Tensor,
    *,
    pos_start: int = 0,
    pos_step: int = 1,
    angle_scale: float = 1.0,
    out_scale: float = 1.0,
) -> dict[str, torch.Tensor] | None:
    """The plan's tensors, filled by one kernel launch from `inv` (n,) on a CUDA device, computed
    in its dtype (`COMPUTE_DTYPES`), or None when the kernel fails to compile or launch (`FAILED`:
    the caller's torch path runs).

    `kernels()` must not be None (callers check `usable` first)."""
    module = kernels()
    assert module is not None
    dev = inv.device
    outputs = {
        name: torch.empty(shape, dtype=plan.dtype, device=dev)
        for name, shape in plan.shapes.items()
    }
    try:
        with _LAUNCH:
            module.launch(
                inv.contiguous(),
                outputs[plan.cos_out],
                outputs[plan.sin_out],
                n_rows=next(iter(plan.shapes.values()))[0],
                n_cos=plan.n_cos,
                pos_start=pos_start,
                pos_step=pos_step,
                row_stride=plan.row_stride,
                cos_map=plan.cos_map,
                sin_map=plan.sin_map,
                angle_scale=angle_scale,
                out_scale=out_scale,
            )
    except Exception as err:  # a toolchain or driver problem triton only meets at compile time
        FAILED.append(f"{type(err).__name__}: {err}")
        _log.warning("fused CUDA kernel failed, torch's ops serve instead: %s", FAILED[0])
        return None
    return outputs
