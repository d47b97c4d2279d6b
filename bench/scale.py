"""Time and server memory as tables grow, and under cache churn.

    python -m bench.scale [--quick] [--device cpu] [--no-plot]

Each part starts its own `posenc serve` (one uvicorn worker, `--device`, cpu by default) and reads
the server's resident memory from `/proc/<pid>/status` (VmRSS; VmHWM is the peak) and the cache's
own accounting from `/metrics` (`posenc_cache_bytes`: tensors plus prepared bodies).

- growth: `POST /v1/tables` (a miss: compute, serialise as safetensors, send) then `GET` of the
  same key (a hit: the prepared bytes) for RoPE tables of 4 K to 1 M positions (head_dim 128,
  fp32 cos+sin: 4 MiB to 1 GiB) and ALiBi causal biases of 8 to 128 heads (1024 x 1024, fp32:
  32 MiB to 512 MiB); RSS after each, against the baseline (RSS of the ready server after one
  small table) plus what the cache holds.
- churn: a server with a small budget (`--cache-bytes`, 256 MiB) receives many distinct specs
  (RoPE with distinct lengths: 8-32 MiB tensors, as much again in prepared bodies), so most
  requests evict; RSS is sampled after every request. The server must stay within budget plus a
  fixed baseline. Run twice: with glibc's defaults and with `MALLOC_MMAP_THRESHOLD_=131072`
  (large allocations always mmapped, hence returned to the system when freed) to show what the
  allocator adds. On CUDA the server's GPU memory (nvidia-smi) is reported too.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import IMG_DIR, header, load, mib, ms, pyplot, save, table
from bench.serve import Conn, free_port, get, post_json, wait_up

GROWTH_POSITIONS = (4096, 16384, 65536, 262144, 1048576)
GROWTH_HEADS = (8, 16, 32, 64, 128)
CHURN_BUDGET = 256 << 20
CHURN_ENVS: dict[str, dict[str, str]] = {
    "glibc defaults": {},
    "MALLOC_ARENA_MAX=2": {"MALLOC_ARENA_MAX": "2"},
    "MALLOC_MMAP_THRESHOLD_=131072": {"MALLOC_MMAP_THRESHOLD_": "131072"},
    "MALLOC_MMAP_THRESHOLD_=131072, THP_MEM_ALLOC_ENABLE=1": {
        "MALLOC_MMAP_THRESHOLD_": "131072",
        "THP_MEM_ALLOC_ENABLE": "1",
    },
}
"""Allocator settings the churn runs under: glibc's, fewer arenas, a fixed mmap threshold
(large blocks always mmapped, so unmapped when freed), and that plus transparent huge pages for
torch's CPU tensors (fewer page faults)."""


def rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of `pid` in bytes."""
    values = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                name, kib, _ = line.split()
                values[name] = int(kib) * 1024
    return values["VmRSS:"], values["VmHWM:"]


def gpu_memory(pid: int) -> int | None:
    """Bytes of GPU memory `pid` holds per nvidia-smi, or None without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    out = subprocess.run(
        [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    for line in out.splitlines():
        p, _, used = line.partition(",")
        if p.strip() == str(pid):
            return int(used.strip()) << 20
    return 0


def metric(port: int, name: str) -> float:
    conn = Conn(port, 1 << 22)
    conn.sock.sendall(get("/metrics"))
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        body += conn.sock.recv(1 << 20)
    conn.close()
    match = re.search(rf"^{name}\s+([0-9.e+]+)$", body.decode(), re.M)
    return float(match.group(1)) if match else 0.0


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


def start(device: str, cache_bytes: int, env: dict[str, str] | None = None) -> Server:
    port = free_port()
    exe = Path(sys.executable).with_name("posenc")
    proc = subprocess.Popen(
        [str(exe), "serve", "--port", str(port), "--device", device, "--log-level", "warning",
         "--cache-bytes", str(cache_bytes), "--max-response-bytes", str(1100 << 20),
         "--in-flight-bytes", str(2200 << 20)],
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    wait_up(port, get("/v2/health/ready"), proc)
    return Server(proc, port)


def baseline(server: Server) -> int:
    """RSS after one small table: imports, allocator arenas and kernels warmed."""
    conn = Conn(server.port, 1 << 20)
    conn.request(post_json("/v1/tables", {"kind": "rope", "head_dim": 64, "max_positions": 64}))
    conn.close()
    return rss(server.proc.pid)[0]


@dataclass
class Step:
    label: str
    nbytes: int
    miss: float
    hit: float
    rss: int
    peak: int
    cache: float
    gpu: int | None


def growth(device: str, quick: bool) -> tuple[int, list[Step]]:
    positions = GROWTH_POSITIONS[:3] if quick else GROWTH_POSITIONS
    heads = GROWTH_HEADS[:3] if quick else GROWTH_HEADS
    specs: list[tuple[str, dict[str, Any]]] = [
        (f"rope {p:,} x 128", {"kind": "rope", "head_dim": 128, "max_positions": p})
        for p in positions
    ]
    specs += [
        (
            f"alibi {h} heads, 1024 x 1024",
            {"kind": "alibi", "num_heads": h, "bias": "causal", "key_length": 1024},
        )
        for h in heads
    ]
    server = start(device, 4 << 30)
    steps = []
    try:
        base = baseline(server)
        for label, spec in specs:
            request = post_json("/v1/tables", spec)
            conn = Conn(server.port, 2 << 30 if "1,048,576" in label else 1 << 30)
            start_t = time.perf_counter()
            status, size = conn.request(request)
            miss = time.perf_counter() - start_t
            assert status == 200, status
            hits = []
            for _ in range(3):
                start_t = time.perf_counter()
                conn.request(request)
                hits.append(time.perf_counter() - start_t)
            conn.close()
            now, peak = rss(server.proc.pid)
            cache = metric(server.port, "posenc_cache_bytes")
            steps.append(
                Step(
                    label, size, miss, statistics.median(hits), now, peak, cache,
                    gpu_memory(server.proc.pid),
                )
            )  # fmt: skip
            print(
                f"  {label:28s} {mib(size):>10s} miss {ms(miss):>7s} ms hit {ms(steps[-1].hit):>7s}"
                f" ms RSS {mib(now)} cache {mib(cache)}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        server.stop()
    return base, steps


@dataclass
class Churn:
    label: str
    base: int
    samples: list[tuple[int, int, float]]  # (request index, RSS, cache bytes)
    peak: int
    evictions: float
    seconds: float


def churn(device: str, n: int, env: dict[str, str], label: str) -> Churn:
    server = start(device, CHURN_BUDGET, env)
    rng = random.Random(0)
    lengths = rng.sample(range(8192, 32768), n)
    samples = []
    try:
        base = baseline(server)
        conn = Conn(server.port, 64 << 20)
        start_t = time.perf_counter()
        for i, p in enumerate(lengths):
            status, _ = conn.request(
                post_json("/v1/tables", {"kind": "rope", "head_dim": 128, "max_positions": p})
            )
            assert status == 200, status
            if i % 5 == 4 or i == n - 1:
                samples.append(
                    (i + 1, rss(server.proc.pid)[0], metric(server.port, "posenc_cache_bytes"))
                )
        seconds = time.perf_counter() - start_t
        conn.close()
        peak = rss(server.proc.pid)[1]
        evictions = metric(server.port, "posenc_cache_evictions_total")
    finally:
        server.stop()
    return Churn(label, base, samples, peak, evictions, seconds)


def plot(base: int, steps: list[Step], churns: list[Churn], out_dir: Path | None) -> None:
    plt: Any = pyplot()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    rope = [s for s in steps if s.label.startswith("rope")]
    x = [s.nbytes / (1 << 20) for s in rope]
    ax1.plot(x, [s.miss * 1e3 for s in rope], "o-", label="miss (compute + serialise + send)")
    ax1.plot(x, [s.hit * 1e3 for s in rope], "o-", label="hit (prepared bytes)")
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel("RoPE table (safetensors), MiB")
    ax1.set_ylabel("ms")
    ax1.set_title("Table growth: 4 K -> 1 M positions")
    ax1.legend(fontsize=8)
    for c in churns:
        idx = [s[0] for s in c.samples]
        ax2.plot(
            idx, [(s[1] - c.base) / (1 << 20) for s in c.samples], label=f"RSS - base, {c.label}"
        )
    if churns:
        c = churns[0]
        ax2.plot(
            [s[0] for s in c.samples],
            [s[2] / (1 << 20) for s in c.samples],
            "--",
            label="cache bytes",
        )
    ax2.axhline(CHURN_BUDGET / (1 << 20), color="black", linewidth=0.8, label="budget")
    ax2.set_xlabel("distinct specs requested")
    ax2.set_ylabel("MiB")
    ax2.set_title(f"Cache churn, budget {mib(CHURN_BUDGET)}")
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save(fig, "scale.png", out_dir)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller tables, fewer specs")
    parser.add_argument("--device", default="cpu", help="the server's --device")
    parser.add_argument("--specs", type=int, default=150, help="distinct specs in the churn")
    parser.add_argument("--no-plot", action="store_true", help="do not write docs/img PNGs")
    args = parser.parse_args(argv)
    before = load()
    base, steps = growth(args.device, args.quick)
    n = 40 if args.quick else args.specs
    churns = [churn(args.device, n, env, label) for label, env in CHURN_ENVS.items()]
    command = "python -m bench.scale" + (" --quick" if args.quick else "")
    command += f" --device {args.device}" if args.device != "cpu" else ""
    print(header(command, before))
    print()
    print(f"Growth (one server, --cache-bytes 4 GiB; baseline RSS {mib(base)}):")
    print()
    gpu = any(s.gpu is not None for s in steps)
    rows = [
        [
            s.label,
            mib(s.nbytes),
            ms(s.miss),
            ms(s.hit),
            f"{s.nbytes / s.hit / 1e9:,.2f}",
            mib(s.rss),
            mib(s.peak),
            mib(s.cache),
            mib(s.rss - base - s.cache)
            if s.rss - base >= s.cache
            else "-" + mib(base + s.cache - s.rss),
            *([mib(s.gpu or 0)] if gpu else []),
        ]
        for s in steps
    ]
    columns = ["table", "safetensors", "miss ms", "hit ms", "hit GB/s", "RSS", "peak RSS",
               "cache holds", "RSS - baseline - cache",
               *(["GPU memory"] if gpu else [])]  # fmt: skip
    print(table(columns, rows))
    print()
    print(
        f"Churn (--cache-bytes {mib(CHURN_BUDGET)}, {n} distinct RoPE specs of 8-32 MiB tensors):"
    )
    print()
    crows = []
    for c in churns:
        worst = max(s[1] for s in c.samples)
        over = worst - c.base
        crows.append(
            [
                c.label,
                mib(c.base),
                mib(worst),
                mib(c.peak),
                mib(over),
                f"{over / CHURN_BUDGET:.2f}",
                f"{c.evictions:.0f}",
                f"{n / c.seconds:,.1f}",
                "yes" if over <= CHURN_BUDGET + (64 << 20) else "**no**",
            ]
        )
    print(
        table(
            ["allocator", "baseline RSS", "max RSS", "peak (VmHWM)", "max RSS - baseline",
             "/ budget", "evictions", "specs/s", "within budget + 64 MiB"],
            crows,
        )
    )  # fmt: skip
    if not args.no_plot:
        plot(base, steps, churns, IMG_DIR)
    return 0


if __name__ == "__main__":
    sys.exit(main())
