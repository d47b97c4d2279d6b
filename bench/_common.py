"""Helpers shared by the benches: the machine line, load, timing rounds, markdown, plots.

Every bench prints markdown (the machine, the command, the load average before and after, then its
tables) so that a run can be pasted into `docs/benchmarks.md`; plots go to `docs/img/` as PNG
(matplotlib, a test extra; without it the bench says so and prints its tables only).
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

IMG_DIR = Path(__file__).resolve().parent.parent / "docs" / "img"


def cpu_model() -> str:
    """The CPU's model name from lscpu (or platform's guess)."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        line = next(row for row in lscpu.splitlines() if row.startswith("Model name"))
        return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or platform.machine()


def machine() -> str:
    """One line: CPU, core count, memory, Python, torch (threads), kernel, GPU when present."""
    import torch

    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        mem = f", {kib / (1 << 20):.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    gpu = ""
    if torch.cuda.is_available():
        gpu = f", GPU {torch.cuda.get_device_name(0)}"
    return (
        f"{cpu_model()}, {os.cpu_count()} CPUs{mem}{gpu}; Python {platform.python_version()}, "
        f"torch {torch.__version__} ({torch.get_num_threads()} intra-op threads), "
        f"{platform.system()} {platform.release()}"
    )


def load() -> str:
    """The 1-minute load average, formatted."""
    return f"{os.getloadavg()[0]:.2f}"


def header(command: str, load_before: str) -> str:
    """The lines every bench prints first: machine, command, load before and after."""
    return (
        f"machine: {machine()}\n"
        f"command: `{command}`; load average (1 min) before / after: {load_before} / {load()}"
    )


def time_call(fn: Callable[[], object], min_seconds: float = 0.02) -> float:
    """Seconds per call of `fn`, repeated until one measurement lasts `min_seconds`."""
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    if once >= min_seconds:
        return once
    reps = max(1, int(min_seconds / max(once, 1e-7)))
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def alternate(
    sides: Sequence[Callable[[], float]], rounds: int
) -> tuple[list[float], list[list[float]]]:
    """Run each side's measurement `rounds` times, alternating sides and rotating which goes
    first (a burst of load from a shared machine then hits every side alike); medians per side
    and every sample."""
    samples: list[list[float]] = [[] for _ in sides]
    for r in range(rounds):
        order = list(range(len(sides)))
        shift = r % len(sides)
        for i in order[shift:] + order[:shift]:
            samples[i].append(sides[i]())
    return [statistics.median(s) for s in samples], samples


def ms(seconds: float) -> str:
    """Milliseconds with sensible precision."""
    value = seconds * 1e3
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.1f}"
    return f"{value:.3f}"


def mib(nbytes: float) -> str:
    """A size in KiB, MiB or GiB."""
    if nbytes >= 1 << 30:
        return f"{nbytes / (1 << 30):.2f} GiB"
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):,.1f} MiB"
    return f"{nbytes / 1024:,.1f} KiB"


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A markdown table; `align` is one letter per column (l or r), right by default after the
    first column."""
    align = align or "l" + "r" * (len(columns) - 1)
    rule = "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"
    lines = ["| " + " | ".join(columns) + " |", rule]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def pyplot() -> object | None:
    """matplotlib.pyplot with the Agg backend, or None (with a message) when not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: no plots; pip install matplotlib)")
        return None
    return plt


def save(fig: object, name: str, out_dir: Path | None) -> None:
    """Write `fig` as `out_dir/name` (PNG) and say where."""
    if out_dir is None:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    fig.savefig(path, dpi=110, bbox_inches="tight")  # type: ignore[attr-defined]
    print(f"plot: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "131072"}
"""glibc's default mmap threshold, fixed: every allocation of 128 KiB or more is fresh pages,
as a table entering the cache is. Left dynamic (the default), glibc raises the threshold after
the first large free, and whether a timed call reuses warm heap memory or faults in new pages
then depends on what ran before it: mid-size timings become bimodal (1x or 3x)."""


def reexec_with(module: str, env: dict[str, str]) -> None:
    """Re-run `python -m module` with the same arguments and `env` added, unless already set
    (allocator settings are read once, at process start)."""
    import sys

    if all(os.environ.get(k) == v for k, v in env.items()):
        return
    os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], {**os.environ, **env})


class ReadyProbe(Protocol):
    """A tritonclient client (HTTP or gRPC): anything with `is_server_ready()`."""

    def is_server_ready(self) -> bool: ...


def wait_ready(client: ReadyProbe, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    """Poll `client.is_server_ready()` until the server process `proc` is ready (or fails)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("posenc serve exited")
        try:
            if client.is_server_ready():
                return
        except Exception:  # not listening yet
            pass
        time.sleep(0.2)
    raise RuntimeError("posenc serve did not become ready")
