"""Cache-hit latency and throughput of /v1/tables against the framework's floor, and cold compute.

    python -m bench.serve [--quick] [--connections 2]

Starts `posenc serve` (CPU, logging at warning) and a bare Starlette app that returns the same
pre-built bytes (the floor: what uvicorn + Starlette cost with no posenc code at all), each in its
own process on loopback, and measures both in one run with the same raw-socket HTTP/1.1 client
(keep-alive, `recv_into` a preallocated buffer, so the client costs as little as possible):

- latency: sequential GETs on one connection, p50 and p99;
- throughput: `--connections` client processes for a fixed time, requests/s and MB/s;
- each measured `--rounds` times, posenc and floor alternating, medians reported;

for a small table (~32 KiB: RoPE head_dim 64, 64 positions) and a large one (~64 MiB: RoPE
head_dim 128, 65536 positions), both as cache hits of `GET /v1/tables/{key}` in the default
safetensors format (bytes prepared once) and in `raw` (a zero-copy view of the cached tensor), plus
`POST /v1/tables` of the small spec (parsing and hashing the spec on every request). Ratios are
posenc / floor (latency: lower is better; throughput: higher is better).

Cold compute: `posenc.encodings.compute` per family on the CPU and on the GPU when there is one
(median of 3 runs after one warm-up of a different spec), and the first `POST` of the large spec
through the server (a miss: compute, serialise, send). The server itself runs with `--device`
(cpu by default, so the hit numbers compare like with like).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SMALL = {"kind": "rope", "head_dim": 64, "max_positions": 64}
LARGE = {"kind": "rope", "head_dim": 128, "max_positions": 65536}

COLD_SPECS: dict[str, dict[str, object]] = {
    "rope (Llama 3.1: llama3, 131072 x 128, fp32)": {
        "kind": "rope",
        "head_dim": 128,
        "rope_theta": 500000.0,
        "max_positions": 131072,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
    },
    "rope (YaRN, exact fp64 -> fp32, 32768 x 128)": {
        "kind": "rope",
        "head_dim": 128,
        "max_positions": 32768,
        "precision": "exact",
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    "alibi (32 heads, causal bias 2048 x 2048, fp32)": {
        "kind": "alibi",
        "num_heads": 32,
        "bias": "causal",
        "key_length": 2048,
    },
    "t5_bias (buckets 2048 x 2048)": {"kind": "t5_bias", "query_length": 2048, "key_length": 2048},
    "sinusoidal (whisper, 32768 x 1024)": {
        "kind": "sinusoidal",
        "dim": 1024,
        "max_positions": 32768,
        "convention": "whisper",
    },
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Conn:
    """A minimal keep-alive HTTP/1.1 client reading bodies into a preallocated buffer."""

    def __init__(self, port: int, capacity: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray(capacity)

    def request(self, raw: bytes) -> tuple[int, int]:
        """Send one request; return (status, body length)."""
        self.sock.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        view = memoryview(self.buf)
        got = len(rest)
        view[:got] = rest
        while got < length:
            n = self.sock.recv_into(view[got:length])
            if not n:
                raise ConnectionError("closed mid-body")
            got += n
        return status, length

    def close(self) -> None:
        self.sock.close()


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()


def post(path: str, body: dict[str, object]) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


def latency(port: int, raw: bytes, capacity: int, n: int) -> tuple[float, float, int]:
    """p50 and p99 in ms of `n` sequential requests (after 5% warm-up), and the body size."""
    conn = Conn(port, capacity)
    for _ in range(max(3, n // 20)):
        conn.request(raw)
    times = []
    size = 0
    for _ in range(n):
        start = time.perf_counter()
        status, size = conn.request(raw)
        times.append(time.perf_counter() - start)
        assert status == 200, status
    conn.close()
    times.sort()
    return (
        times[len(times) // 2] * 1e3,
        times[min(len(times) - 1, int(len(times) * 0.99))] * 1e3,
        size,
    )


def _worker(port: int, raw: bytes, capacity: int, seconds: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    conn = Conn(port, capacity)
    conn.request(raw)
    done = 0
    nbytes = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        status, size = conn.request(raw)
        assert status == 200
        done += 1
        nbytes += size
    conn.close()
    out.put((done, nbytes))


def throughput(
    port: int, raw: bytes, capacity: int, seconds: float, clients: int
) -> tuple[float, float]:
    """(requests/s, MB/s) with `clients` processes hammering one keep-alive connection each."""
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [
        ctx.Process(target=_worker, args=(port, raw, capacity, seconds, out))
        for _ in range(clients)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    done = sum(r[0] for r in results)
    nbytes = sum(r[1] for r in results)
    return done / seconds, nbytes / seconds / 1e6


def floor_main(port: int, files: list[str]) -> None:
    """The floor: bare Starlette returning pre-built bytes at /0, /1, ... (one per file)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    bodies = [Path(f).read_bytes() for f in files]

    async def table(request: Request) -> Response:
        return Response(
            bodies[int(request.path_params["i"])], media_type="application/octet-stream"
        )

    app = Starlette(routes=[Route("/{i:int}", table)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def wait_up(port: int, path: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            conn = Conn(port, 1 << 16)
            status, _ = conn.request(get(path))
            conn.close()
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server on {port} did not come up")


def fetch(port: int, raw: bytes, capacity: int) -> tuple[bytes, dict[str, str]]:
    """One request with headers and body returned (setup only)."""
    import httpx

    method, _, rest = raw.partition(b" ")
    path = rest.split(b" ")[0].decode()
    body = raw.partition(b"\r\n\r\n")[2]
    r = httpx.request(
        method.decode(), f"http://127.0.0.1:{port}{path}", content=body or None, timeout=120
    )
    r.raise_for_status()
    return r.content, dict(r.headers)


@dataclass
class Row:
    name: str
    size: int
    posenc: tuple[float, float, float, float]  # p50, p99, req/s, MB/s
    floor: tuple[float, float, float, float]


def cold_compute(runs: int = 3) -> tuple[list[str], list[tuple[str, int, list[float]]]]:
    """Median seconds of `compute(spec, device)` per family spec on the CPU and, when there is
    one, the first CUDA device (synchronised): (devices, [(name, bytes, seconds per device)])."""
    import torch

    from posenc.encodings import compute, parse_spec
    from posenc.runtime import resolve_device
    from posenc.runtime.device import synchronize

    devices = [torch.device("cpu")]
    if (auto := resolve_device("auto")).type == "cuda":
        devices.append(auto)
    warm = parse_spec({"kind": "rope", "head_dim": 8, "max_positions": 8})
    for device in devices:
        compute(warm, device)
        synchronize(device)
    out = []
    for name, raw in COLD_SPECS.items():
        spec = parse_spec(raw)
        medians = []
        for device in devices:
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                compute(spec, device)
                synchronize(device)
                times.append(time.perf_counter() - start)
            medians.append(statistics.median(times))
        out.append((name, spec.output_bytes(), medians))
    return [str(d) for d in devices], out


def machine() -> str:
    cpu = ""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next(line for line in lscpu.splitlines() if line.startswith("Model name"))
        cpu = model.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError, StopIteration):
        cpu = platform.processor()
    import torch

    return (
        f"{cpu}, {os.cpu_count()} CPUs (nproc), Python {platform.python_version()}, "
        f"torch {torch.__version__}, {platform.system()} {platform.release()}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    parser.add_argument(
        "--connections", type=int, default=2, help="client processes for throughput"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians kept)")
    parser.add_argument("--device", default="cpu", help="the server's --device (cpu, auto, cuda)")
    parser.add_argument("--floor-server", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--files", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.floor_server:
        floor_main(args.floor_server, args.files or [])
        return 0

    scale = 0.2 if args.quick else 1.0
    load_before = f"{os.getloadavg()[0]:.2f}"
    seconds = 1.0 if args.quick else 3.0
    posenc_port, floor_port = free_port(), free_port()
    exe = Path(sys.executable).with_name("posenc")
    server = subprocess.Popen(
        [str(exe), "serve", "--port", str(posenc_port), "--device", args.device,
         "--log-level", "warning", "--max-response-bytes", str(256 << 20),
         "--cache-bytes", str(1 << 30)],
    )  # fmt: skip
    procs = [server]
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"posenc-bench-{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    try:
        wait_up(posenc_port, "/v2/health/ready")
        cold_start = time.perf_counter()
        large_body, large_headers = fetch(posenc_port, post("/v1/tables", LARGE), 0)
        cold_http = time.perf_counter() - cold_start
        small_body, small_headers = fetch(posenc_port, post("/v1/tables", SMALL), 0)
        small_key, large_key = small_headers["x-posenc-key"], large_headers["x-posenc-key"]
        small_raw, _ = fetch(posenc_port, get(f"/v1/tables/{small_key}?format=raw&tensor=cos"), 0)
        large_raw, _ = fetch(posenc_port, get(f"/v1/tables/{large_key}?format=raw&tensor=cos"), 0)
        bodies = [small_body, large_body, small_raw, large_raw]
        files = []
        for i, body in enumerate(bodies):
            path = tmp / f"{i}.bin"
            path.write_bytes(body)
            files.append(str(path))
        floor = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.serve",
                "--floor-server",
                str(floor_port),
                "--files",
                *files,
            ]
        )
        procs.append(floor)
        wait_up(floor_port, "/0")

        small_url, large_url = f"/v1/tables/{small_key}", f"/v1/tables/{large_key}"
        raw = "?format=raw&tensor=cos"
        cases = [
            ("small, safetensors, GET by key", get(small_url), get("/0"), 2000),
            ("small, safetensors, POST spec", post("/v1/tables", SMALL), get("/0"), 2000),
            ("small, raw cos, GET by key", get(small_url + raw), get("/2"), 2000),
            ("large, safetensors, GET by key", get(large_url), get("/1"), 60),
            ("large, raw cos, GET by key", get(large_url + raw), get("/3"), 60),
        ]
        capacity = max(len(b) for b in bodies) + 4096
        rows = []
        for name, ours, theirs, n in cases:
            n = max(20, int(n * scale))
            # alternate posenc and floor, `rounds` times, and keep medians: the machine may be
            # shared, and a burst of other load then hits both sides alike
            runs: dict[int, list[tuple[float, float, float, float]]] = {0: [], 1: []}
            size = 0
            for _ in range(args.rounds):
                for side, (port, raw) in enumerate(((posenc_port, ours), (floor_port, theirs))):
                    p50, p99, size = latency(port, raw, capacity, n)
                    rps, mbps = throughput(port, raw, capacity, seconds, args.connections)
                    runs[side].append((p50, p99, rps, mbps))
            medians = [
                tuple(statistics.median(r[i] for r in runs[side]) for i in range(4))
                for side in (0, 1)
            ]
            rows.append(Row(name, size, medians[0], medians[1]))  # type: ignore[arg-type]
        cold = cold_compute()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        for f in tmp.glob("*.bin"):
            f.unlink()
        tmp.rmdir()

    quick = " --quick" if args.quick else ""
    print(f"machine: {machine()}")
    load_after = f"{os.getloadavg()[0]:.2f}"
    print(
        f"command: python -m bench.serve{quick} --connections {args.connections} "
        f"--rounds {args.rounds}; load average before/after: {load_before} / {load_after}"
    )
    print()
    print(
        "| case | body | posenc p50 / p99 ms | floor p50 / p99 ms | p50 ratio "
        "| posenc req/s (MB/s) | floor req/s (MB/s) | throughput ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        (p50, p99, rps, mbps), (f50, f99, frps, fmbps) = r.posenc, r.floor
        print(
            f"| {r.name} | {r.size / 1024:,.0f} KiB | {p50:.3f} / {p99:.3f} "
            f"| {f50:.3f} / {f99:.3f} | {p50 / f50:.2f} | {rps:,.0f} ({mbps:,.0f}) "
            f"| {frps:,.0f} ({fmbps:,.0f}) | {rps / frps:.2f} |"
        )
    print()
    print(
        "cold POST of the large spec through the server (compute + serialise + send): "
        f"{cold_http * 1e3:.0f} ms"
    )
    print()
    devices, timings = cold
    print(
        "| family (compute only, median of 3) | table | "
        + " | ".join(f"{d} ms" for d in devices)
        + " |"
    )
    print("|---|---:|" + "---:|" * len(devices))
    for name, size, secs in timings:
        cells = " | ".join(f"{sec * 1e3:,.1f}" for sec in secs)
        print(f"| {name} | {size / (1 << 20):,.1f} MiB | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
