"""Small answers against the framework's floor, before and after, in one run.

    python -m bench.floor [--seconds 1.5] [--rounds 5] [--baseline REV] [--quick] [--device cuda]

Servers on loopback, each its own process with one uvicorn worker:

- floor: a bare Starlette app answering the same bytes (`bench.serve.floor_main`: a POST's body
  is read first), what the framework costs;
- posenc: `posenc serve --device cpu` from this tree (`--device cuda`: a GPU server, its tables
  in device memory);
- baseline (with `--baseline REV`): the same command from `service/` of git revision REV
  (extracted with `git archive`, put first on `PYTHONPATH`), so a change is measured against its
  parent in the same run, on the same noisy machine. REV may also name a directory that holds
  such an extracted `service/` (a tree prepared beforehand, or one that is not a git revision).

Cases (cache hits; every server's body is checked to be the bytes posenc sent):

- `/v1 GET` of the 33.6 KiB safetensors table (RoPE head_dim 64 x 64 positions) and of the
  64 MiB one (head_dim 128 x 65536), by key;
- `/v1 POST` of the small spec (the body parsed and looked up per request);
- `/v2` decode step: `POST /v2/models/rope/infer` for one position, cos and sin as binary
  outputs (the step a decode loop sends).

Then the per-call compute overhead of a 1 KiB table (`compute_overhead`, in process; alone with
`--compute-only`).

Each measurement is sequential requests on one keep-alive connection (`bench.serve.Conn`, a raw
socket reading into a preallocated buffer) for `--seconds`; servers alternate within a round (the
one going first rotates) and the median of `--rounds` is kept. Requests per second and the ratio
to the floor are printed as markdown, then each server's CPU per request over the same windows
(user and system time of its process, from `/proc`): on a shared machine the rates move with
the neighbours' load, the CPU a request costs much less.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench._common import header, load, table
from bench.serve import (
    LARGE,
    SMALL,
    Conn,
    _same_method,
    fetch,
    free_port,
    get,
    post,
    post_json,
    start_floor,
    wait_up,
)

ROOT = Path(__file__).resolve().parent.parent


def decode_step(spec: dict[str, object], position: int) -> bytes:
    """`POST /v2/models/rope/infer` for one position (binary int64 input), cos and sin binary."""
    import json

    ids = np.array([position], dtype=np.int64).tobytes()
    head = {
        "inputs": [
            {
                "name": "position_ids",
                "shape": [1],
                "datatype": "INT64",
                "parameters": {"binary_data_size": len(ids)},
            }
        ],
        "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in ("cos", "sin")],
        "parameters": {k: v for k, v in spec.items() if k != "kind"},
    }
    text = json.dumps(head).encode()
    return post(
        "/v2/models/rope/infer",
        text + ids,
        {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(text)),
        },
    )


@dataclass
class Case:
    name: str
    request: bytes
    body: bytes = b""


def server_cpu(pid: int | None) -> float:
    """Seconds of CPU (user and system) the process `pid` has used (Linux `/proc`; 0 without)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sequential_rps(
    port: int, raw: bytes, capacity: int, seconds: float, size: int, pid: int | None = None
) -> tuple[float, float]:
    """(requests per second, the server's CPU µs per request) of sequential requests on one
    keep-alive connection (`pid`: the server's process; without it the CPU is 0)."""
    conn = Conn(port, capacity)
    for _ in range(20):
        conn.request(raw)
    done = 0
    cpu = server_cpu(pid)
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        status, got = conn.request(raw)
        if status != 200 or got != size:
            raise RuntimeError(f"port {port}: status {status}, {got} bytes (expected {size})")
        done += 1
    elapsed = time.perf_counter() - start
    cpu = server_cpu(pid) - cpu
    conn.close()
    return done / elapsed, cpu / done * 1e6


def posenc_server(port: int, source: Path | None, device: str) -> subprocess.Popen[bytes]:
    """`posenc serve --device <device>` on `port`, from `source` (a `service/` directory) or
    this tree."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(source), env.get("PYTHONPATH", "")]).rstrip(":")
    return subprocess.Popen(
        [sys.executable, "-m", "posenc.cli", "serve", "--port", str(port), "--device", device,
         "--log-level", "warning", "--max-response-bytes", str(256 << 20),
         "--cache-bytes", str(1 << 30)],
        env=env,
    )  # fmt: skip


def extract(rev: str, into: Path) -> Path:
    """`service/` of git revision `rev`, extracted under `into`; where `rev` names a directory
    holding `service/posenc` (a tree extracted beforehand), that `service/`."""
    if (Path(rev) / "service" / "posenc").is_dir():
        return Path(rev).resolve() / "service"
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "service/posenc"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "service"


def build_cases(port: int, others: list[int]) -> list[Case]:
    """The cases with posenc's bodies (the tables resolved on `others` too: a bare key is
    answered by the server that resolved it)."""
    for other in others:
        fetch(other, post_json("/v1/tables", SMALL))
        fetch(other, post_json("/v1/tables", LARGE))
    _, small_headers = fetch(port, post_json("/v1/tables", SMALL))
    _, large_headers = fetch(port, post_json("/v1/tables", LARGE))
    cases = [
        Case("/v1 GET safetensors, small", get(f"/v1/tables/{small_headers['x-posenc-key']}")),
        Case("/v1 POST spec, small", post_json("/v1/tables", SMALL)),
        Case("/v2 decode step (1 position, binary)", decode_step(SMALL, 17)),
        Case("/v1 GET safetensors, large", get(f"/v1/tables/{large_headers['x-posenc-key']}")),
    ]
    for case in cases:
        fetch(port, case.request)
        case.body, _ = fetch(port, case.request)
    return cases


TINY = {"kind": "rope", "head_dim": 8, "max_positions": 16}
"""A 1 KiB table (cos and sin, 16 x 8 float32): what a call costs besides the math."""


def compute_overhead(repeats: int = 2000, rounds: int = 7) -> list[list[str]]:
    """µs of thread CPU per call, in process, medians of `rounds` alternating rounds: the
    family's math alone (`Family.compute` on the canonical spec), `compute` of a spec seen
    before (its facts remembered: `spec_facts`) and of a spec never seen (the facts worked out
    per call, as every call did before they were remembered)."""
    import torch

    from posenc.encodings import compute, parse_spec
    from posenc.encodings.base import _FACTS, FAMILIES, spec_facts

    spec = parse_spec(TINY)
    canon = spec_facts(spec).canon
    family = FAMILIES[canon.kind]
    cpu = torch.device("cpu")

    def math() -> None:
        family.compute(canon, cpu)

    def seen() -> None:
        compute(spec)

    def unseen() -> None:
        _FACTS.pop(id(spec), None)
        compute(spec)

    cases = {"math only": math, "compute, spec seen": seen, "compute, facts per call": unseen}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            for _ in range(50):
                fn()
            start = time.thread_time()
            for _ in range(repeats):
                fn()
            samples[name].append((time.thread_time() - start) / repeats * 1e6)
    med = {name: statistics.median(v) for name, v in samples.items()}
    base = med["math only"]
    return [
        [name, f"{value:.1f}", "" if name == "math only" else f"{value - base:.1f}"]
        for name, value in med.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="window per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (median kept)")
    parser.add_argument(
        "--baseline", help="a git revision (or a directory holding its service/) to measure beside"
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds of 0.5 s (smoke run)")
    parser.add_argument("--compute-only", action="store_true", help="only the compute overhead")
    parser.add_argument("--device", default="cpu", help="the posenc servers' device (cpu, cuda)")
    args = parser.parse_args(argv)
    if args.compute_only:
        print(
            table(["1 KiB table (rope 16 x 8)", "µs per call", "over the math"], compute_overhead())
        )
        return 0
    rounds, seconds = (2, 0.5) if args.quick else (args.rounds, args.seconds)

    before = load()
    scratch = Path(tempfile.mkdtemp(prefix="posenc-floor-"))
    names = ["floor", "posenc"] + (["baseline"] if args.baseline else [])
    ports = {name: free_port() for name in names}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(posenc_server(ports["posenc"], None, args.device))
        if args.baseline:
            source = extract(args.baseline, scratch)
            procs.append(posenc_server(ports["baseline"], source, args.device))
        for name in names[1:]:
            wait_up(ports[name], get("/v2/health/ready"), procs[names.index(name) - 1])
        cases = build_cases(ports["posenc"], [ports[n] for n in names[2:]])
        procs.append(start_floor(ports["floor"], [case.body for case in cases], scratch))
        pids = {name: procs[(names.index(name) - 1) % len(names)].pid for name in names}
        rows = []
        cpu_rows: list[list[str]] = []
        for index, case in enumerate(cases):
            requests = {name: case.request for name in names}
            requests["floor"] = _same_method(case.request, f"/{index}")
            for name in names:
                body, _ = fetch(ports[name], requests[name])
                if name != "baseline" and body != case.body:
                    raise RuntimeError(f"{name} sent other bytes for {case.name}")
            capacity = len(case.body) + 4096
            samples: dict[str, list[float]] = {name: [] for name in names}
            cpus: dict[str, list[float]] = {name: [] for name in names}
            for r in range(rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    rate, cpu = sequential_rps(
                        ports[name], requests[name], capacity, seconds, len(case.body), pids[name]
                    )
                    samples[name].append(rate)
                    cpus[name].append(cpu)
            rps = {name: statistics.median(v) for name, v in samples.items()}
            us = {name: statistics.median(v) for name, v in cpus.items()}
            cpu_row = [case.name, f"{us['floor']:,.0f}", f"{us['posenc']:,.0f}"]
            cpu_row += [f"**{us['floor'] / us['posenc']:.2f}**"]
            if args.baseline:
                cpu_row += [f"{us['baseline']:,.0f}", f"{us['floor'] / us['baseline']:.2f}"]
            cpu_rows.append(cpu_row)
            row = [case.name, f"{len(case.body) / 1024:,.1f} KiB", f"{rps['floor']:,.0f}"]
            row += [f"{rps['posenc']:,.0f}", f"**{rps['posenc'] / rps['floor']:.2f}**"]
            if args.baseline:
                row += [f"{rps['baseline']:,.0f}", f"{rps['baseline'] / rps['floor']:.2f}"]
            rows.append(row)
            print(" | ".join(row), file=sys.stderr, flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        shutil.rmtree(scratch, ignore_errors=True)

    command = "python -m bench.floor" + (f" --baseline {args.baseline}" if args.baseline else "")
    command += f" --device {args.device}" if args.device != "cpu" else ""
    print(header(command, before))
    print(f"sequential requests on one keep-alive connection, {rounds} rounds x {seconds:g} s")
    print()
    columns = ["case", "body", "floor req/s", "posenc req/s", "posenc / floor"]
    if args.baseline:
        columns += [f"{args.baseline} req/s", f"{args.baseline} / floor"]
    print(table(columns, rows, "llrrrrr"[: len(columns)]))
    print()
    print(
        "The servers' CPU (user and system, from /proc) per request over the same windows, "
        "medians; floor / server is the rate the server would reach against the floor if "
        "CPU alone set it:"
    )
    print()
    columns = ["case", "floor µs", "posenc µs", "floor / posenc"]
    if args.baseline:
        columns += [f"{args.baseline} µs", f"floor / {args.baseline}"]
    print(table(columns, cpu_rows, "lrrrrr"[: len(columns)]))
    print()
    print("Per-call compute overhead (thread CPU, in process, this tree):")
    print()
    print(table(["1 KiB table (rope 16 x 8)", "µs per call", "over the math"], compute_overhead()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
