"""The fused kernel's launch shape swept on a GPU: which one writes a 16 MiB table fastest.

    python -m bench.fused_tune [--quick] [--case NAME ...] [--trace]

Issue 36 asks for generation at 70% of the device's copy bandwidth from 16 MiB; the fused kernel
(`posenc.encodings._triton_trig`) at its first launch shape, 2048 angles per program at 4 warps,
measured 50% at 16 MiB on an H200, a 17 us call against 8.3 us of copy time. This bench picked
the shape it has now, 512 x 8 (96% there; docs/gpu.md, fifth run). Two costs can hold a table
below the copy bandwidth: the kernel's launch shape and the frequency vector's host-to-device
copy each call makes before the kernel. This bench separates them, for each launch shape
(angles per program x warps per program):

- kernel: CUDA events around `EVENT_CALLS` launches of the kernel alone (`fused.run` on
  frequencies already on the device), queued behind a spin kernel;
- call: the same around `EVENT_CALLS` whole `compute(spec, "cuda")` calls (frequencies computed
  on the CPU and copied, then the kernel), as `bench.compute` measures its device column.

`--trace` sweeps nothing: it prints the device's timeline of each case's queued calls and
kernels at the launch shape (torch.profiler: per kernel or copy, its median duration and the
device's idle time before it), where the call and the kernel alone differ, and of the kernel
after a pinned copy of 256 B and of 2 KiB (`memory.to_device`, as each call copies its
frequencies: 64 float32 for a d128 RoPE table, 512 for Whisper's 1024 dims). Whisper's 16 MiB
calls idled 7 us on each side of their copy where RoPE's idled 1.5 us (fifth GPU run): if the
idle time follows the copy's size, a 2 KiB copy costs it whatever kernel follows.

Every shape's table is checked bit for bit against the default shape's (the shape decides only
which program computes which element, never how). Output: markdown, per table and shape, the
device time per call and the share of the copy bandwidth (bytes written per second, measured in
the same run). It exits 1 when a case does not take the fused path, a shape's bits differ or the
kernel fails, and 2 without CUDA (nothing measured).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from typing import Any
from unittest import mock

import torch

from bench._common import header, load, mib, table
from bench.compute import EVENT_CALLS, copy_bandwidth, device_seconds, takes_fused
from posenc.encodings import compute, fused, parse_spec
from posenc.encodings.memory import to_device
from posenc.encodings.rope.compute import rope_inv_freq, rope_plan_for
from posenc.encodings.rope.spec import RopeSpec
from posenc.encodings.sinusoidal import SinusoidalSpec, fused_launch

CASES: dict[str, dict[str, Any]] = {
    "rope d128 fp32, 4 K": {"kind": "rope", "head_dim": 128, "max_positions": 4096},
    "rope d128 fp32, 16 K": {"kind": "rope", "head_dim": 128, "max_positions": 16384},
    "rope d128 fp32, 64 K": {"kind": "rope", "head_dim": 128, "max_positions": 65536},
    "rope d128 bf16, 32 K": {
        "kind": "rope",
        "head_dim": 128,
        "max_positions": 32768,
        "dtype": "bfloat16",
    },
    "rope d64 fp32 half width, 64 K": {
        "kind": "rope",
        "head_dim": 64,
        "max_positions": 65536,
        "width": "half",
    },
    "whisper 1024 fp32, 4 K": {
        "kind": "sinusoidal",
        "dim": 1024,
        "convention": "whisper",
        "max_positions": 4096,
    },
}
QUICK = ("rope d128 fp32, 16 K", "whisper 1024 fp32, 4 K")

ELEMENTS = (256, 512, 1024, 2048, 4096)
"""Angles per program tried. 8192 and 16384 were dropped after the fifth GPU run: 2-35% of the
copy bandwidth at every warp count in the fifth GPU run, and the first sweep that held them ran
past its 130 s limit there."""
WARPS = (2, 4, 8, 16)
"""Warps per program tried."""


def kernel_only(spec_json: dict[str, Any], device: torch.device) -> Callable[[], object] | None:
    """One launch of the fused kernel alone for a RoPE or sinusoidal spec, with the arguments its
    family's compute launches it with (frequencies moved to `device` once, beforehand), or None
    where the spec does not take the fused path."""
    canon = parse_spec(spec_json).canonical()
    if isinstance(canon, RopeSpec):
        inv, scaling, _ = rope_inv_freq(canon, device)
        plan = rope_plan_for(canon, inv.numel())
        if plan is None:
            return None
        return lambda: fused.run(plan, inv, out_scale=scaling)
    if isinstance(canon, SinusoidalSpec):
        found = fused_launch(canon, device)
        if found is None:
            return None
        frequencies, launch = found
        return partial(launch, to_device(frequencies, device))
    return None


COPY_BYTES = (256, 2048)
"""The pinned host-to-device copies `--trace` puts before a kernel alone: a d128 RoPE table's
64 float32 frequencies, and Whisper's 512."""


def after_copy(fn: Callable[[], object], nbytes: int, device: torch.device) -> Callable[[], None]:
    """`fn` after a copy of `nbytes` of float32 frequencies to `device` (`memory.to_device`, as a
    call copies its own), the copy unused."""
    host = torch.linspace(0.0, 1.0, nbytes // 4, dtype=torch.float32)

    def run() -> None:
        to_device(host, device)
        fn()

    return run


def timeline(fn: Callable[[], object]) -> list[list[str]]:
    """The device's timeline of `EVENT_CALLS` calls of `fn` queued behind a spin kernel (as
    `device_seconds` measures them), from torch.profiler's trace: per device operation (kernel,
    copy), how many ran, their median duration and the median idle time before each (from the
    end of the operation before it), in microseconds; the last row is the span per call."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(20_000_000)
        for _ in range(EVENT_CALLS):
            fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        prof.export_chrome_trace(trace.name)
        with open(trace.name) as saved:
            events = json.load(saved)["traceEvents"]
    ops = sorted(
        (e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy")),
        key=lambda e: float(e["ts"]),
    )
    spin = max(range(len(ops)), key=lambda i: float(ops[i]["dur"]))
    ops = ops[spin:]  # the spin kernel, then the queued calls
    durations: dict[str, list[float]] = {}
    idle: dict[str, list[float]] = {}
    for before, op in itertools.pairwise(ops):
        name = str(op["name"])
        durations.setdefault(name, []).append(float(op["dur"]))
        idle.setdefault(name, []).append(
            float(op["ts"]) - float(before["ts"]) - float(before["dur"])
        )
    rows = [
        [name, str(len(durations[name])), f"{statistics.median(durations[name]):.1f}",
         f"{statistics.median(idle[name]):.1f}"]
        for name in durations
    ]  # fmt: skip
    start = float(ops[1]["ts"]) if len(ops) > 1 else 0.0
    end = float(ops[-1]["ts"]) + float(ops[-1]["dur"])
    rows.append(["span per call", str(EVENT_CALLS), f"{(end - start) / EVENT_CALLS:.1f}", ""])
    return rows


NARROW_BLOCK_F = 64
"""`--trace` also times each kernel with at most this many frequencies per program: a d128 RoPE
table's tile (8 rows x 64 frequencies), where Whisper's 512 frequencies otherwise take 2 x 256
tiles, whose compiled kernel stages its frequencies through 1 KiB of shared memory behind a
barrier (`tools/fused_ptx.py`'s compile; RoPE's uses none). Every shape sweep so far kept 256."""


def same_tables(got: object, want: object) -> str:
    """'same bits' when two launches' outputs (dicts of tensors) are equal, else 'BITS DIFFER'."""
    assert isinstance(got, dict)
    assert isinstance(want, dict)
    equal = list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    return "same bits" if equal else "BITS DIFFER"


def traces(names: tuple[str, ...]) -> str:
    """The markdown of `timeline` for each case at the kernel's launch shape: the whole
    `compute` call, the kernel alone, the kernel after each copy of `COPY_BYTES`, and the kernel
    at `NARROW_BLOCK_F` frequencies per program (its bits against the default's in the row)."""
    device = torch.device("cuda", 0)
    module = fused.kernels()
    rows: list[list[str]] = []
    for name in names:
        spec = parse_spec(CASES[name])
        kernel = kernel_only(CASES[name], device)
        runs = {"call": partial(compute, spec, device), "kernel": kernel}
        if kernel is not None:
            for nbytes in COPY_BYTES:
                runs[f"kernel after a {nbytes:,} B copy"] = after_copy(kernel, nbytes, device)
        for what, fn in runs.items():
            if fn is not None:
                rows += [[name, what, *row] for row in timeline(fn)]
        if kernel is not None and module is not None:
            want = kernel()
            with mock.patch.object(module, "MAX_BLOCK_F", NARROW_BLOCK_F):
                same = same_tables(kernel(), want)
                what = f"kernel, {NARROW_BLOCK_F} frequencies per program ({same})"
                rows += [[name, what, *row] for row in timeline(kernel)]
    columns = ["table", "timed", "device operation", "n", "median us", "median idle before us"]
    return (
        f"device timeline (torch.profiler) of {EVENT_CALLS} calls queued behind a spin kernel\n\n"
        + table(columns, rows, "lllrrr")
    )


def sweep(names: tuple[str, ...]) -> tuple[str, list[str]]:
    """The markdown of the sweep over the cases `names`, and what failed: a case that does not
    take the fused path (nothing of the kernel measured), a shape whose bits differ from the
    default's, a kernel that failed."""
    device = torch.device("cuda", 0)
    module = fused.kernels()
    if module is None or not fused.usable(device):
        return "", [f"fused kernel not usable on this machine ({fused.FAILED or 'no triton'})"]
    bandwidth = copy_bandwidth(device)
    default_shape = module.ELEMENTS_PER_PROGRAM, module.NUM_WARPS
    rows: list[list[str]] = []
    failures: list[str] = []
    for name in names:
        spec = parse_spec(CASES[name])
        if not takes_fused(spec, device):
            failures.append(f"{name} does not take the fused path")
            continue
        reference = compute(spec, device).tensors
        nbytes = sum(t.numel() * t.element_size() for k, t in reference.items() if k != "inv_freq")
        launch = kernel_only(CASES[name], device)
        for elements in ELEMENTS:
            for warps in WARPS:
                with mock.patch.multiple(module, ELEMENTS_PER_PROGRAM=elements, NUM_WARPS=warps):
                    got = compute(spec, device).tensors
                    same = all(torch.equal(got[k], reference[k]) for k in reference)
                    call = device_seconds(partial(compute, spec, device))
                    kernel = device_seconds(launch) if launch is not None else None
                if fused.FAILED:
                    failures.append(f"the kernel failed at {elements} x {warps}: {fused.FAILED[0]}")
                    return "", failures
                if not same:
                    failures.append(f"{name}: {elements} x {warps} differs from the default's bits")
                default = (elements, warps) == default_shape
                rows.append(
                    [
                        name,
                        mib(nbytes),
                        f"{elements} x {warps}" + (" (default)" if default else ""),
                        "yes" if same else "**NO**",
                        f"{kernel * 1e6:.1f}" if kernel is not None else "-",
                        f"{nbytes / kernel / bandwidth:.0%}" if kernel is not None else "-",
                        f"{call * 1e6:.1f}",
                        f"**{nbytes / call / bandwidth:.0%}**",
                    ]
                )
                print(" | ".join(rows[-1]), file=sys.stderr, flush=True)  # kept if cut off
        torch.cuda.empty_cache()
    columns = [
        "table",
        "bytes",
        "angles x warps per program",
        "bits = default",
        "kernel us",
        "kernel of copy bw",
        "call us",
        "call of copy bw",
    ]
    text = (
        f"device: {torch.cuda.get_device_name(device)}; copy bandwidth (1 GiB fp32 `copy_`, "
        f"bytes written per second): {bandwidth / 1e9:,.0f} GB/s\n\n"
        f"kernel: the fused kernel alone (frequencies already on the device); call: one "
        f"`compute(spec, 'cuda')` (frequency copy and kernel); both CUDA events around "
        f"{EVENT_CALLS} calls queued behind a spin kernel\n\n" + table(columns, rows, "lrlrrrrr")
    )
    return text, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument(
        "--case", action="append", choices=tuple(CASES), help="only this case (repeatable)"
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="the device timeline of each case's queued calls at the launch shape, no sweep",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"no CUDA device (torch {torch.__version__}): nothing measured", file=sys.stderr)
        return 2
    before = load()
    names = tuple(args.case) if args.case else QUICK if args.quick else tuple(CASES)
    body, failures = (traces(names), []) if args.trace else sweep(names)
    command = "python -m bench.fused_tune" + (" --quick" if args.quick else "")
    command += "".join(f" --case '{name}'" for name in args.case or ())
    command += " --trace" if args.trace else ""
    print(header(command, before) + "\n\n" + body)
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
