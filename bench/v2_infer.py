"""tritonclient infer latency against /v2/models/rope: decode, prefill, full cache; binary vs JSON.

    python -m bench.v2_infer [--device auto] [--append docs/benchmarks.md]

Starts `posenc serve` in its own process (so client and server do not share a GIL) with limits
raised for the largest case, then times `tritonclient.http.InferenceServerClient.infer` for the
RoPE table of Llama 3.1 8B (head_dim 128, rope_theta 5e5, llama3 scaling, 131072 rows, full-width
fp32 cos and sin as transformers uses them):

- decode: 1 position (4095): one row of cos and sin (1 KiB);
- prefill: positions 0..4095 (4 MiB);
- full cache: positions 0..131071 (128 MiB), the whole table through the protocol;
- decode past the table: position 200000, computed for that one position (not cached).

Every case is timed with binary outputs and with JSON outputs; latency is the wall time of one
`infer` call (request encoding, HTTP, server, response decoding to numpy). The cold first call,
which computes the table once, is reported separately.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import tritonclient.http as http

from bench._common import wait_ready

SPEC = {
    "head_dim": 128,
    "rope_theta": 500000.0,
    "max_positions": 131072,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}
PARAMS = {"spec": json.dumps(SPEC)}


@dataclass(frozen=True)
class Case:
    name: str
    positions: np.ndarray
    runs: dict[bool, int]  # binary -> timed iterations


CASES = (
    Case("decode (1 position)", np.array([4095], np.int64), {True: 300, False: 300}),
    Case("prefill (4096 positions)", np.arange(4096, dtype=np.int64), {True: 40, False: 8}),
    Case("full cache (131072 positions)", np.arange(131072, dtype=np.int64), {True: 8, False: 2}),
    Case("decode past the table (computed)", np.array([200000], np.int64), {True: 300, False: 300}),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start(device: str, port: int) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "posenc.cli", "serve", "--host", "127.0.0.1",
            "--port", str(port), "--device", device, "--log-level", "warning",
            "--cache-bytes", str(4 << 30), "--max-response-bytes", str(1 << 30),
            "--in-flight-bytes", str(2 << 30),
            "--json-max-elements", str(1 << 26), "--max-body-bytes", str(16 << 20)]  # fmt: skip
    return subprocess.Popen(args)


def infer(
    client: http.InferenceServerClient,
    positions: np.ndarray,
    binary: bool,
) -> tuple[float, http.InferResult]:
    """Seconds for one infer call, decoded to numpy, and its result."""
    item = http.InferInput("position_ids", list(positions.shape), "INT64")
    item.set_data_from_numpy(positions)
    outputs = [http.InferRequestedOutput(n, binary_data=binary) for n in ("cos", "sin")]
    start = time.perf_counter()
    result = client.infer("rope", [item], outputs=outputs, parameters=PARAMS)
    cos, sin = result.as_numpy("cos"), result.as_numpy("sin")
    elapsed = time.perf_counter() - start
    assert cos is not None
    assert sin is not None
    assert cos.shape == (*positions.shape, 128)
    return elapsed, result


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def machine(device: str, served_device: str) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    gpu = ""
    if served_device.startswith("cuda") and torch.cuda.is_available():
        gpu = f", GPU {torch.cuda.get_device_name(0)}"
    return (
        f"{cpu} ({os.cpu_count()} cores){gpu}; server device {served_device} "
        f"(--device {device}); Python {platform.python_version()}, torch {torch.__version__}, "
        f"tritonclient (sync, geventhttpclient), one uvicorn worker, loopback"
    )


SECTION = "/v2 (Open Inference Protocol) infer latency with tritonclient"


def append_run(path: Path, text: str) -> None:
    """Add a run at the end of the /v2 section of `path` (a `## ...` heading naming SECTION),
    creating the section at the end of the file when there is none."""
    existing = path.read_text() if path.exists() else ""
    lines = existing.split("\n")
    start = next(
        (i for i, line in enumerate(lines) if line.startswith("## ") and SECTION in line), None
    )
    if start is None:
        intro = (
            "RoPE rows for Llama 3.1 8B (head_dim 128, llama3 scaling, 131072-row table, "
            "full-width fp32 cos and sin) through `tritonclient.http`, binary against JSON "
            "outputs. `bench/v2_infer.py` documents the cases."
        )
        body = existing.rstrip("\n") + ("\n\n" if existing else "")
        path.write_text(body + f"## {SECTION}\n\n{intro}\n\n{text}")
        return
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    before = "\n".join(lines[:end]).rstrip("\n")
    after = "\n".join(lines[end:])
    path.write_text(before + "\n\n" + text.rstrip("\n") + "\n" + ("\n" + after if after else ""))


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.v2_infer", description=__doc__)
    parser.add_argument("--device", default="auto", help="server device: auto, cpu, cuda")
    parser.add_argument("--append", type=Path, help="append the results to this markdown file")
    parser.add_argument("--quick", action="store_true", help="a tenth of the iterations")
    args = parser.parse_args()

    port = free_port()
    proc = start(args.device, port)
    client = http.InferenceServerClient(
        f"127.0.0.1:{port}", connection_timeout=600, network_timeout=600
    )
    rows = []
    try:
        wait_ready(client, proc)
        cold, first = infer(client, np.array([0], np.int64), True)
        served_device = str(first.get_response()["parameters"]["posenc_device"])
        for case in CASES:
            line = [case.name]
            for binary in (True, False):
                n = max(1, case.runs[binary] // (10 if args.quick else 1))
                infer(client, case.positions, binary)  # warm (connection, allocator)
                times = [infer(client, case.positions, binary)[0] for _ in range(n)]
                p50 = statistics.median(times)
                p90 = sorted(times)[min(len(times) - 1, int(0.9 * len(times)))]
                line += [fmt_ms(p50), fmt_ms(p90), str(n)]
            print(" | ".join(line), flush=True)
            rows.append(line)
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=60)

    out_bytes = {
        CASES[0].name: "1 KiB",
        CASES[1].name: "4 MiB",
        CASES[2].name: "128 MiB",
        CASES[3].name: "1 KiB",
    }
    columns = ["case", "cos+sin bytes", "binary p50 ms", "binary p90 ms", "n",
               "JSON p50 ms", "JSON p90 ms", "n"]  # fmt: skip
    table = ["| " + " | ".join(columns) + " |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        table.append(f"| {r[0]} | {out_bytes[r[0]]} | " + " | ".join(r[1:]) + " |")
    command = "python -m bench.v2_infer" + (
        f" --device {args.device}" if args.device != "auto" else ""
    )
    text = "\n".join(
        [
            f"### {datetime.date.today().isoformat()}, server device {served_device}",
            "",
            f"Command: `{command}`. Machine: {machine(args.device, served_device)}.",
            f"Cold first call (computes the 131072-row table once, then cached): "
            f"{fmt_ms(cold)} ms.",
            "",
            *table,
            "",
        ]
    )
    print(text)
    if args.append:
        append_run(args.append, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
