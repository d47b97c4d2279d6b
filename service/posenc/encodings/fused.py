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
table's extra sin column; exact precision (float64 compute) RoPE too, in float64 (float64
angles, CUDA's float64 `cos`/`sin`, `rounding.cast`'s single rounding), while `FLOAT64` is on.
Polar trig, explicit position lists and standardised tables stay on torch.

A plan says where the kernel writes cos and sin of frequency f in a row: column
`f * mul + add` of the row and, for full-width RoPE tables, the duplicate `dup` further
(`cat(c, c)`: +half; `repeat_interleave`: +1; doubled inside `pairs`). Plans are plain data,
checked against the torch layouts on the CPU (tests/encodings/test_fused_plan.py).
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from types import ModuleType
from typing import Any

import torch

from posenc.encodings.base import DTYPES
from posenc.encodings.memory import to_device
from posenc.encodings.rounding import cast

ENABLED: bool = True
"""Whether CUDA tables may take the fused kernel: the server sets it from its `fused_kernels`
setting (`POSENC_FUSED_KERNELS`, default on) when it builds the app."""

FLOAT64: bool = True
"""Whether exact precision (float64 compute) RoPE tables may take the kernel. On since
tests/runtime/test_fused_cuda.py's float64 cases passed on an H200 (docs/gpu.md, "Sixth run":
every config, layout and dtype bit for bit torch's CUDA path); off, the torch path serves them."""

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


RESIDENT_ENTRIES = 64
"""Frequency vectors `resident` keeps on the device (least recently used out)."""

RESIDENT_MAX_BYTES = 16 * 1024
"""The largest vector `resident` keeps (4,096 float32 frequencies: an 8,192-wide table); larger
ones are copied per call. At most `RESIDENT_ENTRIES` x this per device: 1 MiB."""

_RESIDENT: OrderedDict[tuple[int, torch.dtype, bytes], torch.Tensor] = OrderedDict()
"""(CUDA device index, dtype, the vector's bytes) -> the vector on that device; `"cuda"` keys
as the current device, the one its tensors go to."""
_RESIDENT_LOCK = threading.Lock()


def resident(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU frequency vector `t` (n,) on CUDA `device`, copied there once per content: later calls
    with the same bits (the same table at other lengths, dtypes or layouts, or recomputed after
    the cache dropped it) get the same device tensor, which callers only read (it is the kernel's
    input, never part of a table).

    Why: a pinned host-to-device copy of 2 KiB (Whisper's 512 float32 frequencies) held an H200
    idle about 13 us around each 16 MiB Whisper table's 8 us kernel, where RoPE d128's 256 B
    copy costs about 2 us (docs/gpu.md, "Sixth run"). Keyed by device index, dtype and the
    vector's bytes; vectors over `RESIDENT_MAX_BYTES` are copied per call (`memory.to_device`)."""
    if device.type != "cuda" or t.numel() * t.element_size() > RESIDENT_MAX_BYTES:
        return to_device(t, device)
    index = torch.cuda.current_device() if device.index is None else device.index
    key = (index, t.dtype, t.contiguous().view(torch.uint8).numpy().tobytes())
    with _RESIDENT_LOCK:
        found = _RESIDENT.get(key)
        if found is not None:
            _RESIDENT.move_to_end(key)
            return found
    moved = to_device(t, device)
    with _RESIDENT_LOCK:
        _RESIDENT[key] = moved
        while len(_RESIDENT) > RESIDENT_ENTRIES:
            _RESIDENT.popitem(last=False)
    return moved


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


def _rows(plan: TrigPlan) -> int:
    """The rows of a plan's table (its first tensor's leading dim)."""
    return next(iter(plan.shapes.values()))[0]


def _outputs(
    plan: TrigPlan, device: torch.device, make: Callable[..., torch.Tensor] = torch.empty
) -> dict[str, torch.Tensor]:
    """The plan's tensors, made by `make` (torch.empty or torch.zeros) on `device`."""
    return {
        name: make(shape, dtype=plan.dtype, device=device) for name, shape in plan.shapes.items()
    }


def _fill(
    module: ModuleType,
    plan: TrigPlan,
    inv: torch.Tensor,
    outputs: dict[str, torch.Tensor],
    **args: Any,
) -> None:
    """One kernel launch writing the plan's `outputs` from `inv`; `args`: `run`'s positions and
    scales."""
    module.launch(
        inv.contiguous(),
        outputs[plan.cos_out],
        outputs[plan.sin_out],
        n_rows=_rows(plan),
        n_cos=plan.n_cos,
        row_stride=plan.row_stride,
        cos_map=plan.cos_map,
        sin_map=plan.sin_map,
        **args,
    )


def reference(
    plan: TrigPlan,
    inv: torch.Tensor,
    *,
    pos_start: int = 0,
    pos_step: int = 1,
    angle_scale: float = 1.0,
    out_scale: float = 1.0,
) -> dict[str, torch.Tensor]:
    """What `run` writes, from torch's ops on `inv`'s device: positions `pos_start + r * pos_step`
    to the compute dtype, `angles = positions[:, None] * inv[None, :]` (times `angle_scale`),
    `cos`/`sin` (times `out_scale`), `rounding.cast` to the plan's dtype, written where the plan
    says; elements the plan does not write are zero. The torch paths compute their tables with
    these ops in this order (tests/encodings/test_fused_plan.py checks it for every test case),
    so the kernel's bits equal this where they equal the torch paths'."""
    rows = _rows(plan)
    dev = inv.device
    positions = pos_start + torch.arange(rows, dtype=torch.int64, device=dev) * pos_step
    angles = positions.to(inv.dtype)[:, None] * inv[None, :]
    if angle_scale != 1.0:
        angles = angles * angle_scale
    outputs = _outputs(plan, dev, torch.zeros)
    f = torch.arange(inv.numel(), device=dev)
    for trig, (mul, add, dup), name, count in (
        (torch.cos, plan.cos_map, plan.cos_out, plan.n_cos),
        (torch.sin, plan.sin_map, plan.sin_out, inv.numel()),
    ):
        values = trig(angles[:, :count])
        if out_scale != 1.0:
            values = values * out_scale
        values = cast(values, plan.dtype)
        table = outputs[name].view(rows, plan.row_stride)
        columns = f[:count] * mul + add
        table[:, columns] = values
        if dup:
            table[:, columns + dup] = values
    return outputs


CHECK_ROWS = 1024
"""Rows of the probe `run` checks each kernel variant with, the first time it launches it."""

CHECK_SPAN = 1 << 18
"""Positions the probe reaches at least (262144, the longest test config's length): its rows are
spread this far, so the angles cover the large arguments where cos/sin reduce the slow way."""

_VERDICTS: set[tuple[object, ...]] = set()
"""Variants (`_variant`) whose probe gave torch's bits in this process."""


def _variant(
    module: ModuleType, plan: TrigPlan, inv: torch.Tensor, scaled: tuple[bool, bool]
) -> tuple[object, ...]:
    """What decides the kernel's compiled code for a launch (dtypes, column maps, row stride,
    aliasing, tile, scale flags), as a key: each distinct one is probed once."""
    return (
        str(inv.device), inv.dtype, inv.numel(), plan.dtype, plan.cos_out == plan.sin_out,
        plan.row_stride, plan.cos_map, plan.sin_map, plan.n_cos, scaled,
        module.ELEMENTS_PER_PROGRAM, module.NUM_WARPS, module.MAX_BLOCK_F,
    )  # fmt: skip


def _bits(t: torch.Tensor) -> torch.Tensor:
    """`t`'s bit patterns (NaN equals itself, -0.0 differs from 0.0)."""
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _probe(
    module: ModuleType,
    plan: TrigPlan,
    inv: torch.Tensor,
    *,
    pos_start: int,
    pos_step: int,
    angle_scale: float,
    out_scale: float,
) -> str | None:
    """None when the kernel writes `reference`'s bits for `CHECK_ROWS` rows of this launch's
    variant (its own frequencies and scales, positions spread over `CHECK_SPAN` or the table's
    length, in its direction), else what differs. Caller holds `_LAUNCH`."""
    step = pos_step * max(1, max(_rows(plan), CHECK_SPAN) // CHECK_ROWS)
    probe = replace(
        plan, shapes={name: (CHECK_ROWS, *shape[1:]) for name, shape in plan.shapes.items()}
    )
    args: dict[str, Any] = {"pos_start": pos_start, "pos_step": step,
                            "angle_scale": angle_scale, "out_scale": out_scale}  # fmt: skip
    got = _outputs(probe, inv.device, torch.zeros)
    _fill(module, probe, inv, got, **args)
    want = reference(probe, inv, **args)
    differ = {name: int((_bits(got[name]) != _bits(want[name])).sum()) for name in want}
    if not any(differ.values()):
        return None
    counts = ", ".join(f"{name} {n} of {want[name].numel()}" for name, n in differ.items())
    dtypes = (str(t).removeprefix("torch.") for t in (plan.dtype, inv.dtype))
    return "its {} table from {} frequencies on {} differs from torch's ops in {} elements".format(
        *dtypes, inv.device, counts
    )


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
    in its dtype (`COMPUTE_DTYPES`), or None when the kernel fails to compile or launch, or when
    its first launch of a variant writes other bits than torch's ops (`_probe`; `FAILED`: the
    caller's torch path runs, and the fused path stays off in this process).

    `kernels()` must not be None (callers check `usable` first)."""
    module = kernels()
    assert module is not None
    outputs = _outputs(plan, inv.device)
    args: dict[str, Any] = {
        "pos_start": pos_start,
        "pos_step": pos_step,
        "angle_scale": angle_scale,
        "out_scale": out_scale,
    }
    try:
        with _LAUNCH:
            variant = _variant(module, plan, inv, (angle_scale != 1.0, out_scale != 1.0))
            if variant not in _VERDICTS:
                differs = _probe(module, plan, inv, **args)
                if differs is not None:
                    FAILED.append(f"the fused kernel's bits are not torch's here: {differs}")
                    _log.warning("fused CUDA kernel off, torch's ops serve instead: %s", FAILED[0])
                    return None
                _VERDICTS.add(variant)
            _fill(module, plan, inv, outputs, **args)
    except torch.cuda.OutOfMemoryError:
        raise  # the probe's few MiB on a full device: the cache's CPU fallback, not a failure
    except Exception as err:  # a toolchain or driver problem triton only meets at compile time
        FAILED.append(f"{type(err).__name__}: {err}")
        _log.warning("fused CUDA kernel failed, torch's ops serve instead: %s", FAILED[0])
        return None
    return outputs
