"""/v2 infer latency over gRPC against HTTP: tritonclient.grpc and tritonclient.http, one server.

    python -m bench.grpc_infer [--device auto] [--quick]    (markdown for docs/benchmarks.md)

Starts `posenc serve --grpc-port` in its own process (client and server do not share a GIL) and
times one `infer` call (request encoding, transport, server, decoding to numpy) for the RoPE table
of Llama 3.1 8B (`bench.v2_infer`'s spec: head_dim 128, llama3 scaling, 131072 rows, full-width
fp32 cos and sin), with binary outputs on both protocols:

- decode: 1 position (4095), one row of cos and sin (1 KiB);
- decode past the table: position 200000, computed for that one position (not cached);
- prefill: positions 0..4095 (4 MiB);
- full cache: positions 0..131071 (128 MiB).

Clients: tritonclient.http (sync, geventhttpclient), tritonclient.grpc (sync, unary ModelInfer)
and, for the decode steps, tritonclient.grpc's stream (ModelStreamInfer: one request sent, its
response awaited, per step). The sides alternate in rounds (`bench._common.alternate`), so a
burst of load on a shared machine hits them alike; each sample is the median of a batch of calls.
"""

from __future__ import annotations

import argparse
import datetime
import queue
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as http

from bench._common import alternate, header, load, ms, table, wait_ready
from bench.v2_infer import PARAMS, free_port


@dataclass(frozen=True)
class Case:
    name: str
    positions: np.ndarray[Any, Any]
    batch: int  # calls per sample
    rounds: int  # samples per side
    stream: bool  # also time the gRPC stream


CASES = (
    Case("decode (1 position, cached)", np.array([4095], np.int64), 50, 12, True),
    Case("decode past the table (computed)", np.array([200000], np.int64), 50, 12, True),
    Case("prefill (4096 positions, 4 MiB)", np.arange(4096, dtype=np.int64), 5, 10, False),
    Case("full cache (131072 positions, 128 MiB)", np.arange(131072, dtype=np.int64), 1, 5, False),
)


def start(device: str, port: int, grpc_port: int) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "posenc.cli", "serve", "--host", "127.0.0.1",
            "--port", str(port), "--grpc-port", str(grpc_port), "--device", device,
            "--log-level", "warning", "--cache-bytes", str(4 << 30),
            "--max-response-bytes", str(1 << 30), "--in-flight-bytes", str(2 << 30)]  # fmt: skip
    return subprocess.Popen(args)


def http_call(client: http.InferenceServerClient, positions: np.ndarray[Any, Any]) -> Any:
    item = http.InferInput("position_ids", list(positions.shape), "INT64")
    item.set_data_from_numpy(positions)
    outputs = [http.InferRequestedOutput(n, binary_data=True) for n in ("cos", "sin")]
    result = client.infer("rope", [item], outputs=outputs, parameters=PARAMS)
    return result.as_numpy("cos"), result.as_numpy("sin")


def grpc_call(client: grpcclient.InferenceServerClient, positions: np.ndarray[Any, Any]) -> Any:
    item = grpcclient.InferInput("position_ids", list(positions.shape), "INT64")
    item.set_data_from_numpy(positions)
    outputs = [grpcclient.InferRequestedOutput(n) for n in ("cos", "sin")]
    result = client.infer("rope", [item], outputs=outputs, parameters=PARAMS)
    return result.as_numpy("cos"), result.as_numpy("sin")


class Stream:
    """tritonclient.grpc's ModelStreamInfer as one step at a time: send, await the response."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def __call__(self, positions: np.ndarray[Any, Any]) -> Any:
        item = grpcclient.InferInput("position_ids", list(positions.shape), "INT64")
        item.set_data_from_numpy(positions)
        outputs = [grpcclient.InferRequestedOutput(n) for n in ("cos", "sin")]
        self.client.async_stream_infer("rope", [item], outputs=outputs, parameters=PARAMS)
        result, error = self.results.get(timeout=60)
        if error is not None:
            raise error
        return result.as_numpy("cos"), result.as_numpy("sin")

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def sample(call: Callable[[np.ndarray[Any, Any]], Any], case: Case) -> Callable[[], float]:
    """One sample: the median seconds of `case.batch` calls."""

    def run() -> float:
        times = []
        for _ in range(case.batch):
            start = time.perf_counter()
            call(case.positions)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    return run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_infer", description=__doc__)
    parser.add_argument("--device", default="auto", help="server device: auto, cpu, cuda")
    parser.add_argument("--quick", action="store_true", help="a third of the rounds")
    args = parser.parse_args()

    load_before = load()
    port, grpc_port = free_port(), free_port()
    proc = start(args.device, port, grpc_port)
    h = http.InferenceServerClient(f"127.0.0.1:{port}", connection_timeout=600,
                                   network_timeout=600)  # fmt: skip
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    rows = []
    try:
        wait_ready(g, proc)
        stream = Stream(f"127.0.0.1:{grpc_port}")
        start_cold = time.perf_counter()
        grpc_call(g, np.array([0], np.int64))  # computes the table once
        cold = time.perf_counter() - start_cold
        item = grpcclient.InferInput("position_ids", [1], "INT64")
        item.set_data_from_numpy(np.array([1], np.int64))
        response = g.infer("rope", [item], parameters=PARAMS).get_response()
        served = response.parameters["posenc_device"].string_param
        for case in CASES:
            # the same bytes both ways, checked once per case
            want, got = http_call(h, case.positions), grpc_call(g, case.positions)
            assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True)), case.name
            sides = [
                sample(lambda p: http_call(h, p), case),
                sample(lambda p: grpc_call(g, p), case),
            ]
            if case.stream:
                sides.append(sample(stream, case))
            rounds = max(3, case.rounds // (3 if args.quick else 1))
            medians, samples = alternate(sides, rounds)
            spread = [f"{ms(min(s))}-{ms(max(s))}" for s in samples]
            row = [case.name, f"{ms(medians[0])} ({spread[0]})", f"{ms(medians[1])} ({spread[1]})",
                   f"{medians[0] / medians[1]:.2f}x",
                   f"{ms(medians[2])} ({spread[2]})" if case.stream else "-",
                   f"{rounds} x {case.batch}"]  # fmt: skip
            print(" | ".join(row), flush=True)
            rows.append(row)
        stream.close()
    finally:
        g.close()
        h.close()
        proc.terminate()
        proc.wait(timeout=60)

    command = (
        "python -m bench.grpc_infer"
        + (f" --device {args.device}" if args.device != "auto" else "")
        + (" --quick" if args.quick else "")
    )
    columns = ["case", "HTTP ms (range)", "gRPC ms (range)", "HTTP / gRPC",
               "gRPC stream ms (range)", "rounds x calls"]  # fmt: skip
    text = "\n".join(
        [
            f"### {datetime.date.today().isoformat()}, server device {served}",
            "",
            header(command, load_before).replace("\n", "; ") + ".",
            f"Cold first call (computes the 131072-row table once): {ms(cold)} ms. Latency of "
            "one call, median of the samples (each the median of a batch), binary outputs.",
            "",
            table(columns, rows),
            "",
        ]
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
