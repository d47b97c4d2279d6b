"""Cache-hit latency and throughput over /v1 and /v2 against the framework floor and nginx.

    python -m bench.serve [--quick] [--rounds 3] [--connections 4] [--seconds 1.5] [--cold]

Three servers on loopback, each in its own process, answer with byte-identical bodies:

- posenc: `posenc serve --device cpu` (one uvicorn worker, logging at warning);
- floor: a bare Starlette app returning the same pre-built bytes (uvicorn + Starlette, no posenc
  code): what the framework costs;
- nginx: the same bytes as static files from the page cache (one worker, keep-alive, no access
  log, 1 MiB output buffers): the transport's ceiling on this machine.

Cases: a small table (RoPE head_dim 64 x 64 positions: 33 KiB safetensors) and a large one (head_dim
128 x 65536 positions: 64 MiB), as cache hits of `GET /v1/tables/{key}` (safetensors, prepared once;
`raw`: a zero-copy view of the cached tensor; `json`, prepared once), `POST /v1/tables` (the spec
parsed and hashed per request) and `POST /v2/models/rope/infer` (positions 0..P-1, cos and sin as
binary outputs, or as JSON for the small table). For every case the floor and nginx serve the body
posenc sent, so the three differ only in what produces the bytes (the floor and nginx answer a
POST too, reading or discarding its body).

- latency: sequential requests on one keep-alive connection (a raw-socket client reading into a
  preallocated buffer), p50 and p99;
- throughput: `wrk` (one thread, `--connections` connections) for bodies up to 1 MiB when it is
  installed, else `--connections` raw-socket client processes; large bodies always use the
  raw-socket clients, which read with large `recv_into` calls (wrk reads 8 KiB at a time);
- `--rounds` rounds, the three servers alternating (the one going first rotates), medians kept.

Client decode: the time to turn the received bytes into arrays, in process: `posenc_client`
(`Tables.from_safetensors`, zero-copy views), `safetensors.numpy.load` (copies), orjson + numpy for
the JSON body, tritonclient's `InferResult` for the /v2 bodies.

`--cold`: also `posenc.encodings.compute` of a few large specs per family (median of 3), and the
first `POST` of the large spec through the server (a miss: compute, serialise, send) is always
reported. The server runs with `--device` (cpu by default, so hits compare like with like).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench._common import IMG_DIR, header, load, mib, ms, pyplot, save, table

SMALL = {"kind": "rope", "head_dim": 64, "max_positions": 64}
LARGE = {"kind": "rope", "head_dim": 128, "max_positions": 65536}
WRK_MAX_BODY = 1 << 20
NGINX_PATHS = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")

COLD_SPECS: dict[str, dict[str, object]] = {
    "rope (Llama 3.1: llama3, 131072 x 128, fp32)": {
        "kind": "rope",
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


def post(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = f"POST {path} HTTP/1.1\r\nHost: bench\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def post_json(path: str, body: dict[str, object]) -> bytes:
    return post(path, json.dumps(body).encode(), {"Content-Type": "application/json"})


def v2_infer(spec: dict[str, Any], positions: int, binary: bool) -> bytes:
    """`POST /v2/models/rope/infer` for positions 0..P-1 (binary int64 input), cos and sin."""
    ids = np.arange(positions, dtype=np.int64).tobytes()
    params = {k: v for k, v in spec.items() if k != "kind"}
    head = {
        "inputs": [
            {
                "name": "position_ids",
                "shape": [positions],
                "datatype": "INT64",
                "parameters": {"binary_data_size": len(ids)},
            }
        ],
        "outputs": [
            {"name": name, "parameters": {"binary_data": binary}} for name in ("cos", "sin")
        ],
        "parameters": params,
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


def split(raw: bytes) -> tuple[str, str, dict[str, str], bytes]:
    """(method, path, headers, body) of a request built above."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    method, path, _ = lines[0].split(" ")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return method, path, headers, body


def latency(port: int, raw: bytes, capacity: int, n: int) -> tuple[float, float, int]:
    """p50 and p99 in seconds of `n` sequential requests (after a warm-up), and the body size."""
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
    return times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.99))], size


def _worker(port: int, raw: bytes, capacity: int, seconds: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    conn = Conn(port, capacity)
    conn.request(raw)
    done = 0
    end = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < end:
        status, _ = conn.request(raw)
        assert status == 200
        done += 1
    elapsed = time.perf_counter() - start
    conn.close()
    out.put(done / elapsed)


def socket_throughput(port: int, raw: bytes, capacity: int, seconds: float, clients: int) -> float:
    """Requests/s with `clients` processes hammering one keep-alive connection each."""
    # fork: the bench process runs no threads, and a spawn costs ~0.5 s of imports per client
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [
        ctx.Process(target=_worker, args=(port, raw, capacity, seconds, out))
        for _ in range(clients)
    ]
    for p in procs:
        p.start()
    rates = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    return float(sum(rates))


def wrk_throughput(
    wrk: str, port: int, raw: bytes, seconds: float, connections: int, scratch: Path
) -> float:
    """Requests/s measured by wrk (one thread); non-2xx answers are an error."""
    method, path, headers, body = split(raw)
    args = [wrk, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s"]
    if method != "GET":
        blob = scratch / f"wrk-{abs(hash(raw))}.body"
        blob.write_bytes(body)
        script = scratch / f"wrk-{abs(hash(raw))}.lua"
        lines = [f'wrk.method = "{method}"', f'local f = io.open("{blob}", "rb")']
        lines += ["wrk.body = f:read('*a')", "f:close()"]
        lines += [
            f'wrk.headers["{k}"] = "{v}"'
            for k, v in headers.items()
            if k.lower() not in ("host", "content-length")
        ]
        script.write_text("\n".join(lines) + "\n")
        args += ["-s", str(script)]
    out = subprocess.run(
        [*args, f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True, check=True
    ).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"wrk got errors from port {port}{path}:\n{out}")
    rps = next(line for line in out.splitlines() if line.startswith("Requests/sec:"))
    return float(rps.split()[1])


def floor_main(port: int, files: list[str]) -> None:
    """The floor: bare Starlette returning pre-built bytes at /0, /1, ... (one per file); a POST's
    body is read first, as any endpoint taking a body does."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    bodies = [Path(f).read_bytes() for f in files]

    async def body(request: Request) -> Response:
        if request.method == "POST":
            await request.body()
        return Response(
            bodies[int(request.path_params["i"])], media_type="application/octet-stream"
        )

    app = Starlette(routes=[Route("/{i:int}", body, methods=["GET", "POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


NGINX_CONF = """
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    # read() + write() through 1 MiB buffers: on the machine of docs/benchmarks.md sendfile
    # served 64 MiB bodies at 1.3-1.6 GB/s, this at 2.0 GB/s (small bodies: no difference)
    sendfile off;
    output_buffers 4 1m;
    tcp_nodelay on;
    keepalive_requests 10000000;
    keepalive_timeout 600s;
    client_max_body_size 64m;
    client_body_temp_path {root}/tmp/body;
    proxy_temp_path {root}/tmp/proxy;
    fastcgi_temp_path {root}/tmp/fastcgi;
    uwsgi_temp_path {root}/tmp/uwsgi;
    scgi_temp_path {root}/tmp/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {root}/files;
        default_type application/octet-stream;
        # static files answer POST with 405; serve the file instead (the body is discarded)
        location / {{ error_page 405 =200 $uri; }}
    }}
}}
"""


def nginx_binary() -> str | None:
    found = shutil.which("nginx")
    if found:
        return found
    return next((p for p in NGINX_PATHS if os.access(p, os.X_OK)), None)


def start_nginx(binary: str, root: Path, port: int, bodies: list[bytes]) -> subprocess.Popen[bytes]:
    """nginx serving bodies[i] at /i from `root` (files read once, so in the page cache)."""
    (root / "files").mkdir(parents=True)
    (root / "tmp").mkdir()
    for i, data in enumerate(bodies):
        (root / "files" / str(i)).write_bytes(data)
        (root / "files" / str(i)).read_bytes()
    for path in (root, root / "files", root / "tmp"):
        path.chmod(0o755)  # nginx workers drop to `nobody` when started as root
    (root / "nginx.conf").write_text(NGINX_CONF.format(root=root, port=port))
    argv = [binary, "-p", f"{root}/", "-c", str(root / "nginx.conf"), "-e", str(root / "error.log")]
    return subprocess.Popen([*argv, "-g", "daemon off;"])


def start_floor(port: int, bodies: list[bytes], scratch: Path) -> subprocess.Popen[bytes]:
    """The bare Starlette floor (`floor_main`) on `port`, answering `/<i>` with `bodies[i]`
    (written under `scratch`), once it answers."""
    files = []
    for i, body in enumerate(bodies):
        path = scratch / f"{i}.bin"
        path.write_bytes(body)
        files.append(str(path))
    floor = subprocess.Popen(
        [sys.executable, "-m", "bench.serve", "--floor-server", str(port), "--files", *files],
    )
    try:
        wait_up(port, get("/0"), floor)
    except BaseException:
        floor.kill()
        raise
    return floor


def wait_up(port: int, raw: bytes, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server for port {port} exited ({proc.returncode})")
        try:
            conn = Conn(port, 1 << 16)
            status, _ = conn.request(raw)
            conn.close()
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server on {port} did not come up")


def fetch(port: int, raw: bytes) -> tuple[bytes, dict[str, str]]:
    """One request with headers and body returned (setup only)."""
    import httpx

    method, path, headers, body = split(raw)
    r = httpx.request(
        method, f"http://127.0.0.1:{port}{path}", content=body or None, headers=headers, timeout=300
    )
    r.raise_for_status()
    return r.content, dict(r.headers)


@dataclass
class Case:
    name: str
    size: str
    request: bytes
    latency_n: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


SERVERS = ("posenc", "floor", "nginx")


@dataclass
class Measured:
    p50: float
    p99: float
    rps: float


@dataclass
class Row:
    case: Case
    client: str
    results: dict[str, Measured]


def measure(
    cases: list[Case],
    ports: dict[str, int],
    rounds: int,
    seconds: float,
    connections: int,
    wrk: str | None,
    scratch: Path,
) -> list[Row]:
    capacity = max(len(c.body) for c in cases) + 4096
    rows = []
    for index, case in enumerate(cases):
        requests = {
            "posenc": case.request,
            "floor": _same_method(case.request, f"/{index}"),
            "nginx": _same_method(case.request, f"/{index}"),
        }
        use_wrk = wrk is not None and len(case.body) <= WRK_MAX_BODY
        samples: dict[str, list[tuple[float, float, float]]] = {s: [] for s in ports}
        order = list(ports)
        for r in range(rounds):
            for server in order[r % len(order) :] + order[: r % len(order)]:
                port, raw = ports[server], requests[server]
                p50, p99, size = latency(port, raw, capacity, case.latency_n)
                assert size == len(case.body), (server, case.name, size, len(case.body))
                if use_wrk:
                    assert wrk is not None
                    rps = wrk_throughput(wrk, port, raw, seconds, connections, scratch)
                else:
                    rps = socket_throughput(port, raw, capacity, seconds, min(connections, 2))
                samples[server].append((p50, p99, rps))
        results = {
            s: Measured(*(statistics.median(x[i] for x in v) for i in range(3)))
            for s, v in samples.items()
        }
        client = f"wrk -c{connections}" if use_wrk else f"{min(connections, 2)} socket procs"
        rows.append(Row(case, client, results))
        posenc, floor = results["posenc"], results["floor"]
        print(
            f"  {case.name:44s} p50 {ms(posenc.p50):>7s} ms (floor {ms(floor.p50)}) "
            f"{posenc.rps:9,.0f} req/s (floor {floor.rps:,.0f}"
            + (f", nginx {results['nginx'].rps:,.0f})" if "nginx" in results else ")"),
            file=sys.stderr,
            flush=True,
        )
    return rows


def _same_method(raw: bytes, path: str) -> bytes:
    """The request with its path replaced (floor and nginx serve the body at /i)."""
    method, _, headers, body = split(raw)
    if method == "GET":
        return get(path)
    return post(
        path, body, {k: v for k, v in headers.items() if k not in ("Host", "Content-Length")}
    )


def decode_costs(cases: list[Case]) -> list[list[str]]:
    """Client-side decode of each distinct body kind, in process (median of repeated runs)."""
    import orjson
    import tritonclient.http as tc
    from safetensors.numpy import load as st_load

    from posenc_client import Tables

    def timed(fn: Callable[[], object]) -> float:
        fn()
        reps = []
        for _ in range(5):
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < 0.05:
                fn()
                n += 1
            reps.append((time.perf_counter() - start) / n)
        return statistics.median(reps)

    def json_arrays(body: bytes) -> object:
        data = orjson.loads(body)
        return {k: np.asarray(v["data"], dtype=np.float32) for k, v in data["tensors"].items()}

    def v2_arrays(case: Case) -> Callable[[], object]:
        length = int(case.headers.get("inference-header-content-length", 0)) or None

        def run() -> object:
            result = tc.InferResult.from_response_body(case.body, header_length=length)
            return result.as_numpy("cos"), result.as_numpy("sin")

        return run

    rows = []
    for case in cases:
        body = case.body
        if "safetensors" in case.name and "GET" in case.name:
            fns = {
                "posenc_client Tables.from_safetensors (views)": lambda b=body: (
                    Tables.from_safetensors(b)
                ),
                "safetensors.numpy.load (copies)": lambda b=body: st_load(b),
            }
        elif "json" in case.name and "/v1" in case.name:
            fns = {"orjson.loads + numpy.asarray": lambda b=body: json_arrays(b)}
        elif "/v2" in case.name:
            fns = {"tritonclient InferResult + as_numpy": v2_arrays(case)}
        else:
            continue
        for what, fn in fns.items():
            seconds = timed(fn)
            rows.append(
                [
                    f"{case.size}, {case.name}",
                    what,
                    mib(len(body)),
                    f"{seconds * 1e6:,.1f}",
                    f"{len(body) / seconds / 1e9:,.2f}",
                ]
            )
    return rows


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


def build_cases(posenc_port: int, quick: bool) -> tuple[list[Case], float]:
    """The cases with posenc's bodies fetched once (the first large POST is the cold miss)."""
    cold_start = time.perf_counter()
    _, large_headers = fetch(posenc_port, post_json("/v1/tables", LARGE))
    cold = time.perf_counter() - cold_start
    _, small_headers = fetch(posenc_port, post_json("/v1/tables", SMALL))
    small = f"/v1/tables/{small_headers['x-posenc-key']}"
    large = f"/v1/tables/{large_headers['x-posenc-key']}"
    raw = "?format=raw&tensor=cos"
    n_small, n_large = (200, 10) if quick else (600, 20)
    cases = [
        Case("/v1 GET safetensors", "small", get(small), n_small),
        Case("/v1 POST spec, safetensors", "small", post_json("/v1/tables", SMALL), n_small),
        Case("/v1 GET raw cos", "small", get(small + raw), n_small),
        Case("/v1 GET json", "small", get(small + "?format=json"), n_small),
        Case("/v2 infer, binary", "small", v2_infer(SMALL, 64, True), n_small),
        Case("/v2 infer, JSON", "small", v2_infer(SMALL, 64, False), n_small),
        Case("/v1 GET safetensors", "large", get(large), n_large),
        Case("/v1 GET raw cos", "large", get(large + raw), n_large),
        Case("/v2 infer, binary", "large", v2_infer(LARGE, 65536, True), n_large),
    ]
    for case in cases:
        fetch(posenc_port, case.request)  # the first /v2 answer says `miss`; later ones `hit`
        case.body, headers = fetch(posenc_port, case.request)
        case.headers = {k.lower(): v for k, v in headers.items()}
    return cases, cold


def results_markdown(rows: list[Row]) -> str:
    columns = [
        "table",
        "case",
        "body",
        "client",
        "p50 / p99 ms: posenc",
        "floor",
        "nginx",
        "req/s (MB/s): posenc",
        "floor",
        "nginx",
        "posenc / floor",
        "posenc / nginx",
    ]
    out = []
    for r in rows:
        res = r.results
        size = len(r.case.body)

        def lat(m: Measured) -> str:
            return f"{ms(m.p50)} / {ms(m.p99)}"

        def thr(m: Measured, size: int = size) -> str:
            return f"{m.rps:,.0f} ({m.rps * size / 1e6:,.0f})"

        nginx = res.get("nginx")
        out.append(
            [
                r.case.size,
                r.case.name,
                mib(size),
                r.client,
                lat(res["posenc"]),
                lat(res["floor"]),
                lat(nginx) if nginx else "-",
                thr(res["posenc"]),
                thr(res["floor"]),
                thr(nginx) if nginx else "-",
                f"**{res['posenc'].rps / res['floor'].rps:.2f}**",
                f"**{res['posenc'].rps / nginx.rps:.2f}**" if nginx else "-",
            ]
        )
    return table(columns, out, "llrlrrrrrrrr")


def targets(rows: list[Row]) -> str:
    """The issue's aims for large hits: >= 0.8 of the floor's and >= 0.5 of nginx's throughput."""
    lines = []
    for r in rows:
        if r.case.size != "large":
            continue
        res = r.results
        floor = res["posenc"].rps / res["floor"].rps
        verdict = "met" if floor >= 0.8 else "MISSED"
        text = f"- large {r.case.name}: {floor:.2f} of the floor ({verdict})"
        if "nginx" in res:
            ng = res["posenc"].rps / res["nginx"].rps
            text += f", {ng:.2f} of nginx ({'met' if ng >= 0.5 else 'MISSED'})"
        lines.append(text)
    return "\n".join(lines)


def plot(rows: list[Row], out_dir: Path | None) -> None:
    plt: Any = pyplot()
    if plt is None:
        return
    servers = [s for s in SERVERS if s in rows[0].results]
    labels = [f"{r.case.size}: {r.case.name}" for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 0.35 * len(rows) + 1.5), sharey=True)
    height = 0.8 / len(servers)
    colors = {"posenc": "tab:blue", "floor": "tab:orange", "nginx": "tab:green"}
    for k, server in enumerate(servers):
        ys = [i + k * height for i in range(len(rows))]
        mbps = [r.results[server].rps * len(r.case.body) / 1e6 for r in rows]
        p50 = [r.results[server].p50 * 1e3 for r in rows]
        ax1.barh(ys, mbps, height, label=server, color=colors[server])
        ax2.barh(ys, p50, height, label=server, color=colors[server])
    ax1.set_yticks([i + height for i in range(len(rows))], labels, fontsize=8)
    ax1.invert_yaxis()
    ax1.set_xscale("log")
    ax1.set_xlabel("throughput, MB/s (log)")
    ax2.set_xscale("log")
    ax2.set_xlabel("latency p50, ms (log)")
    fig.legend(*ax1.get_legend_handles_labels(), loc="upper center", ncol=3, fontsize=8,
               bbox_to_anchor=(0.5, 0.96))  # fmt: skip
    fig.suptitle("Cache hits: posenc vs the Starlette floor vs nginx static (same bytes)", y=1.0)
    save(fig, "serve_hits.png", out_dir)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    parser.add_argument(
        "--connections", type=int, default=4, help="wrk connections (socket clients: at most 2)"
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="throughput window per run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians kept)")
    parser.add_argument("--device", default="cpu", help="the server's --device (cpu, auto, cuda)")
    parser.add_argument("--cold", action="store_true", help="also time compute() per family")
    parser.add_argument("--no-plot", action="store_true", help="do not write docs/img PNGs")
    parser.add_argument("--floor-server", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--files", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.floor_server:
        floor_main(args.floor_server, args.files or [])
        return 0

    before = load()
    rounds = 2 if args.quick else args.rounds
    seconds = 1.0 if args.quick else args.seconds
    ports = {s: free_port() for s in SERVERS}
    exe = Path(sys.executable).with_name("posenc")
    server = subprocess.Popen(
        [str(exe), "serve", "--port", str(ports["posenc"]), "--device", args.device,
         "--log-level", "warning", "--max-response-bytes", str(256 << 20),
         "--cache-bytes", str(1 << 30)],
    )  # fmt: skip
    procs = [server]
    scratch = Path(tempfile.mkdtemp(prefix="posenc-bench-"))
    scratch.chmod(0o755)  # nginx workers (`nobody` under root) read the files below
    wrk = shutil.which("wrk")
    nginx = nginx_binary()
    try:
        wait_up(ports["posenc"], get("/v2/health/ready"), server)
        cases, cold_http = build_cases(ports["posenc"], args.quick)
        procs.append(start_floor(ports["floor"], [case.body for case in cases], scratch))
        if nginx is None:
            print("nginx not found: no static-file ceiling (`make nginx` installs it)")
            del ports["nginx"]
        else:
            ngx = start_nginx(nginx, scratch / "nginx", ports["nginx"], [c.body for c in cases])
            procs.append(ngx)
            wait_up(ports["nginx"], get("/0"), ngx)
        rows = measure(cases, ports, rounds, seconds, args.connections, wrk, scratch)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    decode = decode_costs(cases)
    cold = cold_compute() if args.cold else None
    shutil.rmtree(scratch, ignore_errors=True)

    command = "python -m bench.serve" + (" --quick" if args.quick else "")
    print(header(command, before))
    print(
        f"throughput client: {'wrk ' + wrk_version(wrk) if wrk else 'socket processes'} for "
        f"bodies up to {mib(WRK_MAX_BODY)}, raw-socket processes above; {rounds} rounds x "
        f"{seconds:g} s per server and case; nginx: {nginx_version(nginx) if nginx else 'absent'}"
    )
    print()
    print(results_markdown(rows))
    print()
    print(targets(rows))
    print()
    print(
        "cold POST of the large spec through the server (compute + serialise + send): "
        f"{ms(cold_http)} ms"
    )
    print()
    print("Client decode (in process, median):")
    print()
    print(table(["body", "decoder", "size", "µs", "GB/s"], decode, "llrrr"))
    if cold is not None:
        devices, timings = cold
        print()
        print(
            table(
                ["family (compute only, median of 3)", "table", *(f"{d} ms" for d in devices)],
                [[n, mib(size), *(ms(s) for s in secs)] for n, size, secs in timings],
            )
        )
    if not args.no_plot:
        plot(rows, IMG_DIR)
    return 0


def wrk_version(wrk: str | None) -> str:
    if wrk is None:
        return ""
    out = subprocess.run([wrk, "-v"], capture_output=True, text=True).stdout
    return out.split()[1] if out.split() else ""


def nginx_version(nginx: str) -> str:
    out = subprocess.run([nginx, "-v"], capture_output=True, text=True).stderr
    return out.strip().split("/")[-1]


if __name__ == "__main__":
    sys.exit(main())
