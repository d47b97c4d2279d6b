"""Load: 50 and 200 concurrent clients mixing cache hits, cache-churning misses and 64 MiB tables
against one `posenc serve` process on loopback; throughput, latency, errors and the server's peak
RSS against its two memory budgets.

    python -m bench.load [--clients 50,200] [--requests 1500] [--seconds 150]
                         [--cache-mib 256] [--in-flight-mib 256] [--malloc image|default]

Per client count, a fresh server (`posenc serve --device cpu`, one uvicorn worker, the stated
`--cache-bytes` and `--in-flight-bytes`, `--max-response-bytes` 96 MiB, the other settings at
their defaults; `MALLOC_MMAP_THRESHOLD_` as the images set it, or with `--malloc default` none,
and `posenc serve` fixes the same threshold itself) is warmed (the hot tables computed, then fetched
twice over `--clients` connections), its RSS read (the baseline: interpreter, torch, the app, the
hot tables, the connections), then `--clients` asyncio tasks (httpx, one connection each, idle
connections expiring after 1 s) run until `--requests` requests are done or `--seconds` pass. Each
picks, from a seeded random stream:

- 70% hit: `GET /v1/tables/{key}` of one of 8 hot 1 MiB RoPE tables (safetensors);
- 25% churning miss: `POST /v1/tables` of a spec never asked before (4 MiB RoPE tables: each
  one evicts older entries);
- 5% large: one of 4 64 MiB RoPE tables (head_dim 128, 65,536 positions), as safetensors (the
  body is prepared once per entry: 64 MiB more) or as raw `cos` (a zero-copy view); with 256 MiB
  of cache they keep evicting each other and are recomputed.

A 503 with `Retry-After` (`overloaded`, `busy`) is the server shedding load as designed: the
client waits as told and retries, and the request counts once, its latency including the waits;
a request whose connection failed before any byte of the response arrived (the server's idle
timeout closed it as the request went out: HTTP/1.1's keep-alive race, which httpx does not
retry) is sent again once and counted ("stale retried"); a 200 whose connection failed mid-body
is counted as cut ("cut mid-body"): the server's minimum send rate (256 KiB/s over 10 s by
default) cuts a reader that slow, which these clients, many in one Python process, become on a
saturated machine; each must be one the server counted (`posenc_responses_cut_total`), else it
is an error. Anything else (another status, a short body, a second failure, a timeout) is an
error. Bodies
are read to the end and counted, not kept. The server's peak RSS is its `VmHWM`
(/proc/PID/status) at the end; the bound is cache budget + in-flight budget + baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._common import FIXED_MALLOC, header, load, mib, ms, table

MiB = 1 << 20
HOT = [{"kind": "rope", "head_dim": 64, "max_positions": 2048 + i} for i in range(8)]  # 1 MiB
LARGE = [{"kind": "rope", "head_dim": 128, "max_positions": 65536 + i} for i in range(4)]  # 64 MiB
CHURN_BASE = {"kind": "rope", "head_dim": 128}  # max_positions 4096 + n: 4 MiB, never repeated
MIX = (("hit", 0.70), ("miss", 0.25), ("large", 0.05))
MAX_RESPONSE = 96 * MiB


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of `pid` in KiB."""
    values = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                name, amount, _ = line.split()
                values[name] = int(amount)
    return values["VmRSS:"], values["VmHWM:"]


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    cache: int
    in_flight: int

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start(cache: int, in_flight: int, malloc: str) -> Server:
    port = free_port()
    exe = Path(sys.executable).with_name("posenc")
    env = {**os.environ, **(FIXED_MALLOC if malloc == "image" else {})}
    proc = subprocess.Popen(
        [str(exe), "serve", "--port", str(port), "--device", "cpu", "--log-level", "warning",
         "--cache-bytes", str(cache), "--in-flight-bytes", str(in_flight),
         "--max-response-bytes", str(MAX_RESPONSE), "--drain-seconds", "0"],
        env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"posenc serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("posenc serve did not become ready")
        time.sleep(0.1)
    return Server(proc, url, cache, in_flight)


def metrics(url: str) -> dict[str, float]:
    """The samples of /metrics by name, summed over their labels."""
    found: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, _, number = line.rpartition(" ")
            name = name.split("{", 1)[0]
            found[name] = found.get(name, 0.0) + float(number)
    return found


@dataclass
class Result:
    clients: int
    latencies: list[float] = field(default_factory=list)
    by_kind: dict[str, list[float]] = field(default_factory=dict)
    retried: int = 0
    stale: int = 0
    errors: list[str] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)
    """Responses cut mid-body (`CutMidBody`)."""
    received: int = 0
    seconds: float = 0.0
    baseline_kib: int = 0
    peak_kib: int = 0
    server: dict[str, float] = field(default_factory=dict)


class Workload:
    """The request stream: a seeded choice of kind per request, unique churn specs."""

    def __init__(self, seed: int, hot_paths: list[str], large_paths: list[str]) -> None:
        self.random = random.Random(seed)
        self.hot = hot_paths
        self.large = large_paths
        self.churn = itertools.count()
        self.kinds = [k for k, _ in MIX]
        self.weights = [w for _, w in MIX]

    def next(self) -> tuple[str, str, str, dict[str, Any] | None]:
        """(kind, method, url, json body)."""
        kind = self.random.choices(self.kinds, self.weights)[0]
        if kind == "hit":
            return kind, "GET", self.random.choice(self.hot), None
        if kind == "miss":
            spec = {**CHURN_BASE, "max_positions": 4096 + next(self.churn)}
            return kind, "POST", "/v1/tables", spec
        path = self.random.choice(self.large)
        if self.random.random() < 0.5:
            path += "?format=raw&tensor=cos"
        return kind, "GET", path, None


class NoResponse(Exception):  # noqa: N818 - what happened, not a failure of ours
    """The connection failed before any byte of a response arrived."""


class CutMidBody(Exception):  # noqa: N818 - what happened, not a failure of ours
    """The connection failed after a 200 response began: the server's minimum send rate (or
    send timeout) cuts a client that reads too slowly, which this process's clients become
    when the machine is saturated; counted apart, and checked against the server's own count
    of its cuts (`posenc_responses_cut_total`)."""


async def one(client: httpx.AsyncClient, method: str, url: str, body: Any) -> tuple[int, int, str]:
    """Status, body bytes read, Retry-After of one request (the body counted, not kept).
    Raises `NoResponse` when the connection failed before the response began."""
    try:
        stream = client.stream(method, url, json=body)
        response = await stream.__aenter__()
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as err:
        raise NoResponse(f"{type(err).__name__}: {err}") from err
    try:
        size = 0
        try:
            async for chunk in response.aiter_raw(1 << 20):
                size += len(chunk)
        except (httpx.RemoteProtocolError, httpx.ReadError) as err:
            if response.status_code != 200:
                raise
            raise CutMidBody(f"{type(err).__name__} after {size} bytes") from err
        declared = response.headers.get("content-length")
        if declared is not None and int(declared) != size:
            raise RuntimeError(f"short body: {size} of {declared} bytes")
        return response.status_code, size, response.headers.get("retry-after", "")
    finally:
        await stream.__aexit__(None, None, None)


async def drive(
    server: Server, clients: int, requests: int, seconds: float, work: Workload
) -> Result:
    """Warm `clients` connections with hits on the hot tables, read the baseline RSS, then run
    the mix until `requests` are done or `seconds` pass."""
    result = Result(clients)
    url = server.url
    started = 0
    # pooled connections expire well before the server's idle timeout (5 s)
    limits = httpx.Limits(
        max_connections=clients, max_keepalive_connections=clients, keepalive_expiry=1.0
    )
    headers = {"Accept-Encoding": "identity"}
    async with httpx.AsyncClient(
        base_url=url, limits=limits, timeout=120, headers=headers
    ) as client:
        # every connection opened and used, so that the baseline holds what each one costs
        for _ in range(2):
            await asyncio.gather(
                *(one(client, "GET", work.hot[i % len(work.hot)], None) for i in range(clients))
            )
        result.baseline_kib = rss_kib(server.proc.pid)[0]
        begin = time.perf_counter()
        deadline = begin + seconds

        async def worker() -> None:
            nonlocal started
            while started < requests and time.perf_counter() < deadline:
                started += 1
                kind, method, path, body = work.next()
                t0 = time.perf_counter()
                stale = False
                while True:
                    try:
                        status, size, retry = await one(client, method, path, body)
                    except NoResponse as err:
                        # HTTP/1.1's keep-alive race: the server closed an idle connection as
                        # the request went out on it; every request here is idempotent (a table
                        # is a pure function of its spec), so it is sent again once, as
                        # browsers and urllib3 do
                        if not stale:
                            stale = True
                            result.stale += 1
                            continue
                        result.errors.append(f"{kind}: twice: {err}")
                        break
                    except CutMidBody as err:
                        result.cut.append(f"{kind}: {err}")
                        break
                    except (httpx.HTTPError, RuntimeError) as err:
                        result.errors.append(f"{kind}: {type(err).__name__}: {err}")
                        break
                    result.received += size
                    if status == 503 and retry:
                        result.retried += 1
                        await asyncio.sleep(float(retry))
                        continue
                    if status != 200:
                        result.errors.append(f"{kind}: HTTP {status}")
                        break
                    elapsed = time.perf_counter() - t0
                    result.latencies.append(elapsed)
                    result.by_kind.setdefault(kind, []).append(elapsed)
                    break

        await asyncio.gather(*(worker() for _ in range(clients)))
        result.seconds = time.perf_counter() - begin
    return result


def warm(url: str) -> tuple[list[str], list[str]]:
    """Compute the hot tables and learn every path; returns (hot paths, large paths)."""
    with httpx.Client(base_url=url, timeout=300) as client:
        hot = [client.post("/v1/tables", json=s).headers["content-location"] for s in HOT]
        large = []
        for spec in LARGE:
            # rows=0:1 learns the key without keeping a 64 MiB entry before the baseline
            r = client.post("/v1/tables", json=spec, params={"rows": "0:1"})
            r.raise_for_status()
            large.append(r.headers["content-location"])
        for path in hot:
            client.get(path).raise_for_status()
    return hot, large


def run(clients: int, args: argparse.Namespace) -> Result:
    server = start(args.cache_mib * MiB, args.in_flight_mib * MiB, args.malloc)
    try:
        hot, large = warm(server.url)
        work = Workload(args.seed, hot, large)
        run_uvloop = _loop_runner()
        result = run_uvloop(drive(server, clients, args.requests, args.seconds, work))
        result.peak_kib = rss_kib(server.proc.pid)[1]
        result.server = metrics(server.url)
        # a cut the server did not count as one of its cuts is a failure
        counted = int(result.server.get("posenc_responses_cut_total", 0))
        if len(result.cut) > counted:
            result.errors += [f"cut, not by the server's rules: {c}" for c in result.cut[counted:]]
    finally:
        server.stop()
    return result


def _loop_runner() -> Any:
    try:
        import uvloop

        return uvloop.run
    except ImportError:
        return asyncio.run


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(results: list[Result], args: argparse.Namespace) -> str:
    cache, in_flight = args.cache_mib * MiB, args.in_flight_mib * MiB
    rows = []
    for r in results:
        done = len(r.latencies)
        bound = cache + in_flight + r.baseline_kib * 1024
        peak = r.peak_kib * 1024
        rows.append(
            [
                str(r.clients),
                f"{done:,}",
                f"{r.seconds:.1f}",
                f"{done / r.seconds:,.1f}",
                f"{r.received / r.seconds / MiB:,.0f}",
                ms(statistics.median(r.latencies)) if done else "-",
                ms(pct(r.latencies, 0.99)) if done else "-",
                f"{r.retried:,}",
                str(r.stale),
                f"{len(r.cut)} ({r.server.get('posenc_responses_cut_total', 0):.0f})",
                str(len(r.errors)),
                mib(r.baseline_kib * 1024),
                mib(peak),
                mib(bound),
                mib(r.server.get("posenc_in_flight_peak_bytes", 0)),
                "yes" if peak <= bound else "**no**",
            ]
        )
    lines = [
        table(
            [
                "clients",
                "requests",
                "s",
                "req/s",
                "MiB/s",
                "p50 ms",
                "p99 ms",
                "503 retried",
                "stale retried",
                "cut mid-body (server's count)",
                "errors",
                "baseline RSS",
                "peak RSS",
                "cache + in-flight + baseline",
                "in-flight peak",
                "within",
            ],
            rows,
        ),
        "",
        "Per kind (p50 / p99 ms, count):",
        "",
    ]
    kind_rows = []
    for r in results:
        for kind, _ in MIX:
            values = r.by_kind.get(kind, [])
            if values:
                kind_rows.append(
                    [
                        str(r.clients),
                        kind,
                        f"{len(values):,}",
                        ms(statistics.median(values)),
                        ms(pct(values, 0.99)),
                    ]
                )
    lines.append(table(["clients", "kind", "count", "p50 ms", "p99 ms"], kind_rows))
    lines += ["", "Server counters at the end (`/metrics`):", ""]
    names = [
        ("computations", "posenc_compute_seconds_count"),
        ("evictions", "posenc_cache_evictions_total"),
        ("refused: in-flight budget", "posenc_in_flight_refused_total"),
        ("refused: computations", "posenc_compute_rejected_total"),
        ("cache bytes", "posenc_cache_bytes"),
    ]
    counter_rows = []
    for r in results:
        row = [str(r.clients)]
        for label, name in names:
            v = r.server.get(name, 0.0)
            row.append(mib(v) if "bytes" in label else f"{v:,.0f}")
        counter_rows.append(row)
    lines.append(table(["clients", *(label for label, _ in names)], counter_rows))
    for r in results:
        for err in r.errors[:5]:
            lines.append(f"- error ({r.clients} clients): {err}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="50,200", help="comma-separated client counts")
    parser.add_argument("--requests", type=int, default=1500, help="requests per client count")
    parser.add_argument("--seconds", type=float, default=150, help="time limit per client count")
    parser.add_argument("--cache-mib", type=int, default=256, help="the server's cache budget")
    parser.add_argument("--in-flight-mib", type=int, default=256, help="its in-flight budget")
    parser.add_argument("--malloc", choices=["image", "default"], default="image")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    command = "python -m bench.load " + " ".join(argv if argv is not None else sys.argv[1:])
    before = load()
    results = [run(int(n), args) for n in args.clients.split(",")]
    print(header(command.strip(), before))
    print(
        f"\nserver: cache budget {args.cache_mib} MiB, in-flight budget {args.in_flight_mib} MiB, "
        f"max response {MAX_RESPONSE // MiB} MiB, malloc {args.malloc}; "
        f"mix {', '.join(f'{k} {w:.0%}' for k, w in MIX)}\n"
    )
    print(report(results, args))
    bad = any(r.errors or r.peak_kib * 1024 > args.cache_mib * MiB + args.in_flight_mib * MiB
              + r.baseline_kib * 1024 for r in results)  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
