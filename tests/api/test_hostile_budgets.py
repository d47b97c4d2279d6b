"""Hardening, round 3 (issue 32): every surface inside the memory budgets, and no single peer can
starve the server.

`/v2` and gRPC inferences are charged to the in-flight budget `/v1` uses (api/oip/context.py):
computed rows while they are computed, outputs and the protocol's copies of them until sent; work
beyond it is 503 with `Retry-After` (gRPC UNAVAILABLE with `retry-after`). The concurrent cases
run `posenc serve` in a subprocess and read its peak resident size (`VmHWM`, /proc/PID/status)
against the documented bound: the RSS of the ready server + cache budget + in-flight budget
(`bench/load.py`'s bound, with no further slack).

Slow readers are real loopback sockets with a 4 KiB receive buffer: their responses, larger than
what the kernel's socket buffers absorb, stay in flight until they read. One address holds at
most its share of the budget (`in_flight_bytes_per_peer`): other addresses are 127.0.0.2 on
loopback. Large gRPC answers are built off the event loop while health probes keep answering.
The default budgets under mixed load are tests/api/test_load_budget.py.
"""

from __future__ import annotations

import io
import json
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as tgrpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from posenc.api.grpc import convert
from posenc.api.grpc.proto import grpc_service_pb2 as pb
from posenc.runtime import InFlightBudget, Overloaded, for_peer
from tests import waiting
from tests.api.metrics_util import scrape, value
from tests.api.test_memory_budget import BIG, BIG2, OTHER, budget_of, status_line
from tests.conftest import ProcessHandle, ServerHandle, start_server, start_server_process

MiB = 1 << 20
PATIENCE = 20.0
"""Seconds a test waits for a condition or a socket before the case fails."""

ROPE = {"head_dim": 128, "max_positions": 1 << 20}
"""A RoPE spec whose table (1 GiB) no test cache keeps: every infer computes its rows (cos and
sin, 1 KiB per position in float32)."""


def wait_for(condition: Callable[[], bool]) -> bool:
    """`tests.waiting.wait_for` with this module's patience."""
    return waiting.wait_for(condition, PATIENCE)


def infer_request(
    positions: int, start: int = 0, spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A JSON `/v2` rope infer request of `positions` consecutive positions from `start`, binary
    outputs, for `spec` (default `ROPE`)."""
    return {
        "parameters": {"spec": json.dumps(spec or ROPE), "binary_data_output": True},
        "inputs": [
            {
                "name": "position_ids",
                "shape": [positions],
                "datatype": "INT64",
                "data": list(range(start, start + positions)),
            }
        ],
    }


def infer_body(positions: int, start: int = 0) -> bytes:
    """`infer_request` of `ROPE`, encoded."""
    return json.dumps(infer_request(positions, start)).encode()


def stalled_post(url: str, path: str, body: bytes) -> socket.socket:
    """A POST of `body` from a socket that reads nothing (small receive window)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(PATIENCE)
    sock.connect((host, int(port)))
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    sock.sendall(head.encode() + body)
    return sock


def grpc_infer(
    client: tgrpc.InferenceServerClient, positions: int, start: int = 0
) -> tgrpc.InferResult:
    item = tgrpc.InferInput("position_ids", [positions], "INT64")
    item.set_data_from_numpy(np.arange(start, start + positions, dtype=np.int64))
    return client.infer("rope", [item], parameters={"spec": json.dumps(ROPE)})


# --- 1. /v2 and gRPC answers inside the in-flight budget ----------------------------------


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerHandle]:
    with start_server(
        grpc_port=0,
        cache_bytes=4 * MiB,
        max_response_bytes=8 * MiB,
        in_flight_bytes=24 * MiB,
        # the stalled readers here hold their charges until the test closes them, however long
        # a loaded machine takes between steps: no send timeout or minimum rate cuts them first
        # (those are test_slow_readers_are_cut_and_others_get_through's)
        send_timeout_seconds=3600,
        min_send_rate_bytes=0,
    ) as handle:
        yield handle


def test_v2_and_grpc_outputs_are_charged_until_sent(srv: ServerHandle) -> None:
    """Two stalled 4 MiB `/v2` answers hold 8 MiB of the 24 MiB budget; a 6 MiB infer (12 MiB
    of rows computed, 6 MiB of outputs: 18 MiB, which fits an idle budget) does not fit beside
    them: 503 over HTTP, UNAVAILABLE over gRPC, with Retry-After; a small one still goes out;
    all comes back when the readers go."""
    budget = budget_of(srv)
    path = "/v2/models/rope/infer"
    assert wait_for(lambda: budget.held == 0)
    socks: list[socket.socket] = []
    grpc_client = tgrpc.InferenceServerClient(srv.grpc_url)
    try:
        # one after the other, each computed and being sent (its status line arrives after
        # that) before the next is asked, so what is held below is the two stalled answers'
        # outputs, not a computation's transient charge: this case once waited on the gauge
        # for it, and two stalled 6 MiB answers never fitted (the second's 12 MiB of rows
        # beside the first's outputs), so it passed on whichever transient the wait caught
        for start in (0, 1):
            socks.append(stalled_post(srv.url, path, infer_body(4096, start)))
            assert status_line(socks[-1]) == b"HTTP/1.1 200 OK"
        assert budget.held >= 8 * MiB, budget.held
        with srv.client() as client:
            refused = client.post(path, content=infer_body(6144, 2))
            assert refused.status_code == 503, refused.text[:300]
            assert refused.headers["retry-after"] == "1"
            assert "in-flight budget" in refused.json()["error"]
            small = client.post(path, content=infer_body(16))
            assert small.status_code == 200
        with pytest.raises(InferenceServerException) as grpc_refused:
            grpc_infer(grpc_client, 6144, 3)
        assert grpc_refused.value.status() == "StatusCode.UNAVAILABLE"
        assert "in-flight budget" in str(grpc_refused.value.message())
        assert budget.peak <= budget.max_bytes
    finally:
        for sock in socks:
            sock.close()
    assert wait_for(lambda: budget.held == 0), budget.held
    with srv.client() as client:
        assert client.post(path, content=infer_body(6144, 2)).status_code == 200
    result = grpc_infer(grpc_client, 6144, 3)
    assert result.as_numpy("cos").shape == (6144, 128)
    grpc_client.close()
    assert wait_for(lambda: budget.held == 0), budget.held


def test_computed_rows_take_a_computation_slot(srv: ServerHandle) -> None:
    """Rows computed for the asked positions count against `max_concurrent_computations` as the
    cache's computations do: with every slot held, a computed infer is 503 `Busy`."""
    cache = srv.state.require_cache()
    slots = [cache.slot() for _ in range(cache.max_concurrent)]
    for slot in slots:
        slot.__enter__()
    try:
        with srv.client() as client:
            r = client.post("/v2/models/rope/infer", content=infer_body(8))
        assert r.status_code == 503
        assert "computations already in flight" in r.json()["error"]
        assert r.headers["retry-after"] == "1"
    finally:
        for slot in slots:
            slot.__exit__(None, None, None)
    with srv.client() as client:
        assert client.post("/v2/models/rope/infer", content=infer_body(8)).status_code == 200


def status_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of `pid`, in bytes."""
    values = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                name, amount, _ = line.split()
                values[name.rstrip(":")] = int(amount) * 1024
    return values


LOAD = {
    "POSENC_CACHE_BYTES": str(16 * MiB),
    "POSENC_MAX_RESPONSE_BYTES": str(24 * MiB),
    "POSENC_IN_FLIGHT_BYTES": str(64 * MiB),
    "POSENC_SEND_TIMEOUT_SECONDS": str(PATIENCE),
    "POSENC_LOG_LEVEL": "warning",
}
CLIENTS = 12


@pytest.fixture(scope="module")
def proc() -> Iterator[ProcessHandle]:
    handle = start_server_process("--grpc-port", "0", env=LOAD)
    try:
        yield handle
    finally:
        handle.stop()


def test_concurrent_large_infers_stay_inside_the_budgets(proc: ProcessHandle) -> None:
    """12 concurrent 20 MiB infers over `/v2` (clients that hold their answers unread until all
    have a status) and 12 concurrent 8 MiB infers over gRPC: some admitted, the rest refused
    (503 / UNAVAILABLE), and the server's peak RSS within baseline + cache + in-flight."""
    path = "/v2/models/rope/infer"
    grpc_clients = [tgrpc.InferenceServerClient(proc.grpc_url) for _ in range(CLIENTS)]
    # 20 MiB answers: more than loopback's socket buffers absorb, so an admitted one that is
    # not read stays in flight
    http_clients = [httpx.Client(base_url=proc.url, timeout=PATIENCE) for _ in range(CLIENTS)]
    try:
        # every connection opened and used once, so that the baseline holds what each costs
        for client in http_clients:
            assert client.post(path, content=infer_body(64)).status_code == 200
        for grpc_client in grpc_clients:
            grpc_infer(grpc_client, 64)
        baseline = status_kib(proc.proc.pid)["VmRSS"]

        barrier = threading.Barrier(CLIENTS, timeout=PATIENCE)
        statuses: list[int] = []

        def over_http(i: int) -> None:
            with http_clients[i].stream("POST", path, content=infer_body(20480, i)) as r:
                statuses.append(r.status_code)
                if r.status_code == 503:
                    assert r.headers["retry-after"] == "1"
                barrier.wait()  # the admitted hold their answers unread until here
                r.read()

        run_all(over_http)
        assert len(statuses) == CLIENTS
        assert set(statuses) <= {200, 503}, statuses
        assert 1 <= statuses.count(200) < CLIENTS, statuses

        codes: list[str] = []

        def over_grpc(i: int) -> None:
            barrier.wait()
            try:
                result = grpc_infer(grpc_clients[i], 8192, i)
                assert result.as_numpy("cos").shape == (8192, 128)
                codes.append("OK")
            except InferenceServerException as exc:
                codes.append(str(exc.status()))

        barrier.reset()
        run_all(over_grpc)
        assert set(codes) <= {"OK", "StatusCode.UNAVAILABLE"}, codes
        assert "OK" in codes

        memory = status_kib(proc.proc.pid)
        bound = baseline + 16 * MiB + 64 * MiB
        assert memory["VmHWM"] <= bound, (memory, baseline)
        with httpx.Client(base_url=proc.url) as client:
            samples = scrape(client)
        assert value(samples, "posenc_in_flight_peak_bytes") <= 64 * MiB
        assert value(samples, "posenc_in_flight_bytes") == 0
    finally:
        for client in http_clients:
            client.close()
        for grpc_client in grpc_clients:
            grpc_client.close()


def run_all(fn: Callable[[int], Any]) -> None:
    """`fn(i)` for each client on its own thread; the first failure is raised."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            fn(i)
        except BaseException as exc:  # re-raised on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PATIENCE * 2)
    if errors:
        raise errors[0]


GRPC_CALLER = """
import json, sys, threading
import grpc, numpy as np
from tritonclient.grpc import service_pb2

url, spec, positions, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]


def request(start, count):
    message = service_pb2.ModelInferRequest(model_name="rope")
    message.parameters["spec"].string_param = spec
    message.inputs.add(name="position_ids", datatype="INT64", shape=[count])
    message.raw_input_contents.append(np.arange(start, start + count, dtype="<i8").tobytes())
    return message


options = [("grpc.max_receive_message_length", -1)]
with grpc.insecure_channel(url, options=options) as channel:
    infer = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=service_pb2.ModelInferRequest.SerializeToString,
        response_deserializer=None,
    )
    infer(request(0, 16), timeout=60)
    print("ready", flush=True)
    sys.stdin.readline()

    def run(i):
        with open(f"{out}.{i}", "wb") as f:
            f.write(infer(request(i, positions), timeout=120))

    workers = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
"""
"""Two concurrent ModelInfer calls from a process of their own (protobuf and grpc hold their
process's interpreter lock while they copy an answer: a client thread here would delay this
process's probes); the answers are written to `<out>.0` and `<out>.1` as received."""


def test_health_answers_while_large_grpc_answers_are_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two concurrent 64 MiB gRPC answers (65,536 positions of cos and sin, computed rows) are
    built off the event loop (`convert.infer_response_bytes`, run in worker threads): with both
    builds held at their start until a liveness probe has been answered, the probe is answered
    (a build on the loop would hold the loop, and the probe, until the deadline fails the case);
    the answers are exact (equal to the rows /v1 serves). Ordering, not speed: how long a probe
    waits while answers are built on a loaded machine is measured in bench/, not asserted."""
    positions = 65536
    inside = threading.Semaphore(0)
    probed = threading.Event()
    build = convert.infer_response_bytes

    def gated(*args: Any, **kwargs: Any) -> bytes:
        inside.release()
        assert probed.wait(PATIENCE * 3), "no probe answered while the answers were built"
        return build(*args, **kwargs)

    out = tmp_path / "answer"
    with start_server(
        grpc_port=0,
        cache_bytes=4 * MiB,
        max_response_bytes=64 * MiB,
        in_flight_bytes=1024 * MiB,
        in_flight_bytes_per_peer=1024 * MiB,
    ) as handle:
        # a process of its own: protobuf and grpc hold their process's interpreter lock while
        # they copy an answer
        caller = subprocess.Popen(
            [sys.executable, "-c", GRPC_CALLER, handle.grpc_url, json.dumps(ROPE),
             str(positions), str(out)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert caller.stdout is not None
            assert caller.stdin is not None
            assert caller.stdout.readline().strip() == "ready"
            monkeypatch.setattr(convert, "infer_response_bytes", gated)
            caller.stdin.write("go\n")
            caller.stdin.flush()
            for _ in range(2):  # both answers are being built, concurrently
                assert inside.acquire(timeout=PATIENCE * 3)
            with handle.client(timeout=PATIENCE * 3) as client:
                assert client.get("/v2/health/live").status_code == 200
            probed.set()
            assert caller.wait(PATIENCE * 3) == 0
        finally:
            probed.set()
            if caller.poll() is None:
                caller.kill()
                caller.wait()
        # the rows as /v1 serves the table of the first 8 positions (RoPE rows do not depend on
        # max_positions)
        with handle.client() as client:
            first = client.post(
                "/v1/tables",
                json={"kind": "rope", "head_dim": 128, "max_positions": 8},
                params={"format": "npz"},
            )
        table = np.load(io.BytesIO(first.content))
        for i in range(2):
            answer = out.with_suffix(f".{i}").read_bytes()
            response = service_pb2.ModelInferResponse.FromString(answer)
            assert [o.name for o in response.outputs] == ["cos", "sin"]
            for output, raw in zip(response.outputs, response.raw_output_contents, strict=True):
                assert list(output.shape) == [positions, 128]
                rows = np.frombuffer(raw, dtype="<f4").reshape(positions, 128)
                np.testing.assert_array_equal(rows[:4], table[output.name][i : i + 4])


def test_answer_bytes_are_the_message_protobuf_writes() -> None:
    """`convert.infer_response_bytes` (the answer written without protobuf's serialiser) parses,
    with protobuf, into the message `convert.infer_response` builds with it, alone and inside a
    `ModelStreamInferResponse`; outputs of several dtypes, one larger than `WIRE_CHUNK`, one
    empty, parameters and an id."""
    tensors = {
        "cos": torch.linspace(-1, 1, 3 * convert.WIRE_CHUNK // 4 + 5).reshape(-1, 1),
        "bf": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4),
        "ids": torch.arange(7, dtype=torch.int64),
        "empty": torch.zeros((0, 4), dtype=torch.float16),
    }
    parameters = {"posenc_key": "ab" * 32, "posenc_source": "computed", "n": 3, "ok": True}
    message = convert.infer_response("rope", "1", "req-7", tensors, parameters)
    unary = convert.infer_response_bytes("rope", "1", "req-7", tensors, parameters)
    assert pb.ModelInferResponse.FromString(unary) == message
    stream = convert.infer_response_bytes("rope", "1", "req-7", tensors, parameters, stream=True)
    assert pb.ModelStreamInferResponse.FromString(stream) == pb.ModelStreamInferResponse(
        infer_response=message
    )
    assert pb.ModelInferResponse.FromString(
        convert.infer_response_bytes("rope", "1", None, {}, {})
    ) == convert.infer_response("rope", "1", None, {}, {})


# --- 2. request bodies inside a budget; counts checked before allocation --------------------


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one response with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    headers = {k.lower(): v for k, v in headers.items()}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return int(lines[0].split()[1]), headers, body


def upload_head(url: str, size: int) -> socket.socket:
    """A socket that sent the headers of a `size`-byte .npy upload and 1 KiB of its body."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=PATIENCE)
    sock.sendall(
        f"POST /v1/uploads HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-npy\r\n"
        f"Content-Length: {size}\r\n\r\n".encode()
        + bytes(1024)
    )
    return sock


def test_upload_bodies_are_charged_before_they_are_read(srv: ServerHandle) -> None:
    """An 8 MiB upload in progress holds 16 MiB (the chunks and the joined body) of the 24 MiB
    budget from its headers on; a second one is 503 `overloaded` at once, before any of its body
    is read; the charge comes back when the first goes."""
    budget = budget_of(srv)
    assert wait_for(lambda: budget.held == 0)
    first = upload_head(srv.url, 8 * MiB)
    try:
        assert wait_for(lambda: budget.held >= 16 * MiB), budget.held
        second = upload_head(srv.url, 8 * MiB)
        with second:
            status, headers, body = read_response(second)
        assert status == 503
        assert headers["retry-after"] == "1"
        error = json.loads(body)
        assert set(error) == {"error", "error_type", "detail"}
        assert error["error_type"] == "overloaded"
        assert error["detail"]["requested_bytes"] == 16 * MiB
    finally:
        first.close()
    assert wait_for(lambda: budget.held == 0), budget.held
    table = np.arange(8 * 1024, dtype=np.float32).reshape(1024, 8)
    out = io.BytesIO()
    np.save(out, table)
    with srv.client() as client:
        r = client.post(
            "/v1/uploads", content=out.getvalue(), headers={"content-type": "application/x-npy"}
        )
    assert r.status_code == 201, r.text


def test_a_body_without_length_is_charged_as_it_arrives(srv: ServerHandle) -> None:
    """A chunked body is charged as it arrives: past what the budget holds, 503 `overloaded`."""
    budget = budget_of(srv)
    assert wait_for(lambda: budget.held == 0)
    first = upload_head(srv.url, 8 * MiB)
    try:
        assert wait_for(lambda: budget.held >= 16 * MiB), budget.held

        def chunks() -> Iterator[bytes]:
            for _ in range(8):
                yield bytes(1 * MiB)

        with srv.client() as client:
            r = client.post(
                "/v1/uploads", content=chunks(), headers={"content-type": "application/x-npy"}
            )
        assert r.status_code == 503, r.text[:300]
        assert r.json()["error_type"] == "overloaded"
    finally:
        first.close()
    assert wait_for(lambda: budget.held == 0), budget.held


def test_safetensors_header_declaring_many_tensors_is_refused_unread(srv: ServerHandle) -> None:
    """200,000 empty tensors declared: 413 `too_many_tensors` from the header's count (the
    default cap, 1024), before safetensors builds anything."""
    limit = srv.settings.max_upload_tensors
    for count in (200_000, limit + 1):
        header = {
            f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(count)
        }
        raw = json.dumps(header).encode()
        body = len(raw).to_bytes(8, "little") + raw
        with srv.client() as client:
            r = client.post(
                "/v1/uploads",
                content=body,
                params={"format": "safetensors"},
            )
        assert r.status_code == 413, r.text[:300]
        error = r.json()
        assert error["error_type"] == "too_many_tensors"
        assert error["detail"]["max_tensors"] == limit
        assert len(r.content) < 4096


def test_onnx_model_of_many_empty_nodes_is_refused_unparsed(srv: ServerHandle) -> None:
    """A model whose graph holds 300,000 empty nodes (600 KB on the wire, hundreds of MiB once
    parsed) is 413 `too_many_entries` from a count of its bytes (the default cap, 2^18)."""
    limit = srv.settings.max_onnx_entries
    graph = b"\x0a\x00" * (limit + 1)  # field 1 (node), length 0

    def varint(n: int) -> bytes:
        out = b""
        while n >= 0x80:
            out += bytes([n & 0x7F | 0x80])
            n >>= 7
        return out + bytes([n])

    model = b"\x3a" + varint(len(graph)) + graph  # ModelProto field 7 (graph)
    with srv.client() as client:
        key = client.post("/v1/tables", json={"kind": "rope", "head_dim": 8, "max_positions": 4})
        r = client.post(
            "/v1/check/onnx", params={"key": key.headers["x-posenc-key"]}, content=model
        )
    assert r.status_code == 413, r.text[:300]
    assert r.json()["error_type"] == "too_many_entries"
    assert r.json()["detail"] == {"max_entries": limit}


# --- 3. slow readers cannot starve others ----------------------------------------------------

# BIG (cos + sin: 2 x 6 MiB), BIG2 and OTHER (2 x 4 MiB): test_memory_budget's specs


@pytest.fixture(scope="module")
def rate_srv() -> Iterator[ServerHandle]:
    with start_server(
        cache_bytes=160 * MiB,
        max_response_bytes=12 * MiB + 4096,
        in_flight_bytes=24 * MiB + 8192,
        send_timeout_seconds=PATIENCE,
        min_send_rate_bytes=1 * MiB,
        send_rate_window_seconds=0.5,
    ) as handle:
        yield handle


def slow_reader(
    url: str, path: str, got: list[int], stop: threading.Event | None = None
) -> threading.Thread:
    """A thread GETting `path` from a socket with a 4 KiB window that reads 4 KiB every 20 ms
    (about 200 KiB/s: bytes keep moving, so the send timeout never fires) until the server
    closes the connection (or `stop` is set); the bytes it got are appended to `got`."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(PATIENCE)
    sock.connect((host, int(port)))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())

    def run() -> None:
        total = 0
        deadline = time.monotonic() + PATIENCE * 2
        try:
            while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                total += len(chunk)
                # the pacing under test (a reader trickling ~200 KiB/s), not a wait
                time.sleep(0.02)
        except OSError:
            pass
        finally:
            sock.close()
            got.append(total)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_slow_readers_are_cut_and_others_get_through(rate_srv: ServerHandle) -> None:
    """Two readers trickling 12 MiB answers at ~200 KiB/s hold the whole 24 MiB budget; under a
    minimum send rate of 1 MiB/s over 0.5 s windows they are cut, their charges come back, and a
    normal client's 8 MiB table goes out, well before they could have read their answers."""
    budget = budget_of(rate_srv)
    with rate_srv.client() as client:
        paths = [client.post("/v1/tables", json=s).headers["content-location"] for s in (BIG, BIG2)]
        assert wait_for(lambda: budget.held == 0)
        got: list[int] = []
        start = time.monotonic()
        readers = [slow_reader(rate_srv.url, path, got) for path in paths]
        assert wait_for(lambda: budget.held > 23 * MiB), budget.held
        statuses = []
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            r = client.post("/v1/tables", json=OTHER)
            statuses.append(r.status_code)
            if r.status_code == 200:
                break
            assert r.status_code == 503
            assert r.json()["error_type"] == "overloaded"
            time.sleep(0.1)
        assert statuses[-1] == 200, statuses
        for reader in readers:
            reader.join(PATIENCE * 2)
        elapsed = time.monotonic() - start
    # cut: far less than the 12 MiB each asked for, long before ~60 s of trickling
    assert len(got) == 2, got
    assert all(n < 6 * MiB for n in got), got
    assert elapsed < PATIENCE, elapsed
    assert wait_for(lambda: budget.held == 0), budget.held
    # /metrics counts the cuts by rule (a client cut mid-body can tell it from a failure)
    with rate_srv.client() as client:
        samples = scrape(client)
    assert value(samples, "posenc_responses_cut_total", reason="slow_reader") == 2
    assert value(samples, "posenc_responses_cut_total", reason="send_timeout") == 0


@pytest.fixture(scope="module")
def peer_srv() -> Iterator[ServerHandle]:
    """A 24 MiB budget, 12 MiB of it per peer, and no minimum send rate: only the share stands
    between slow readers and the budget."""
    with start_server(
        cache_bytes=160 * MiB,
        max_response_bytes=12 * MiB + 4096,
        in_flight_bytes=24 * MiB + 8192,
        in_flight_bytes_per_peer=12 * MiB + 4096,
        send_timeout_seconds=PATIENCE,
        min_send_rate_bytes=0,
    ) as handle:
        yield handle


def test_one_peer_holds_at_most_its_share_of_the_budget(peer_srv: ServerHandle) -> None:
    """Two slow readers of one address (127.0.0.1) trickling 12 MiB answers: the first holds its
    12 MiB, the second, which would take the address past its 12 MiB share, is 503 `overloaded`
    naming the share; a normal client of another address (127.0.0.2) gets its 8 MiB table while
    the first reader still trickles (before the share, the two readers held the whole budget
    and it got 503 for as long as they read), and so does the table the first address was
    refused; the budget comes back when the readers go."""
    budget = budget_of(peer_srv)
    other = httpx.HTTPTransport(local_address="127.0.0.2")
    with peer_srv.client() as client:
        paths = [client.post("/v1/tables", json=s).headers["content-location"] for s in (BIG, BIG2)]
        other_path = client.post("/v1/tables", json=OTHER).headers["content-location"]
    assert wait_for(lambda: budget.held == 0)
    stop = threading.Event()
    got: list[int] = []
    readers = [slow_reader(peer_srv.url, paths[0], got, stop)]
    try:
        assert wait_for(lambda: budget.peer_held("127.0.0.1") >= 12 * MiB), budget.held
        with peer_srv.client() as client:
            refused = client.get(paths[1])
        assert refused.status_code == 503, refused.status_code
        assert refused.headers["retry-after"] == "1"
        error = refused.json()
        assert error["error_type"] == "overloaded"
        assert "share of the in-flight budget" in error["error"]
        assert error["detail"]["max_in_flight_bytes_per_peer"] == 12 * MiB + 4096
        assert error["detail"]["peer_in_flight_bytes"] >= 12 * MiB
        # a second slow reader of the same address is refused the same way: it holds nothing
        readers.append(slow_reader(peer_srv.url, paths[1], got, stop))
        time.sleep(0.5)
        assert budget.held < 13 * MiB, budget.held
        with httpx.Client(base_url=peer_srv.url, transport=other, timeout=PATIENCE) as client:
            served = client.get(other_path)
            assert served.status_code == 200, served.text[:300]
            assert len(served.content) > 8 * MiB
            # the table its peer was refused: this address holds nothing else
            assert client.get(paths[1]).status_code == 200
        assert all(reader.is_alive() for reader in readers[:1])  # still trickling
        assert budget.peak <= 24 * MiB + 8192
    finally:
        stop.set()
        for reader in readers:
            reader.join(PATIENCE)
    assert wait_for(lambda: budget.held == 0), budget.held
    assert budget.peer_held("127.0.0.1") == 0
    with peer_srv.client() as client:
        assert value(scrape(client), "posenc_in_flight_refused_per_peer_total") >= 1


def test_peer_share_rules() -> None:
    """The share counts a peer's other requests: one request alone may exceed it (as one may
    take the whole budget), another request of that peer may not add to it past the share,
    another peer may; a shared charge counts toward the request that made it until its last
    holder goes; charges outside any request count toward no peer."""
    budget = InFlightBudget(100, max_peer_bytes=30)
    with for_peer("a") as first:
        big = budget.acquire("big", 40)  # alone: above the share, admitted
        more = budget.acquire(object(), 10)  # the same request adds to it
    assert (first.held, budget.peer_held("a")) == (50, 50)
    with for_peer("a"):
        with pytest.raises(Overloaded) as refused:
            budget.acquire(object(), 1)
        assert refused.value.peer == "a"
        assert (refused.value.held, refused.value.limit) == (50, 30)
        joined = budget.acquire("big", 40)  # joins a charge: no new bytes, no check
    with for_peer("b"):
        other = budget.acquire(object(), 30)
        shared = budget.acquire("big", 40)
    assert (budget.held, budget.peer_held("a"), budget.peer_held("b")) == (80, 50, 30)
    unscoped = budget.acquire(object(), 5)
    assert budget.peer_held("a") == 50
    for lease in (big, more, joined):
        lease.release()
    assert budget.peer_held("a") == 40  # "big" still held by b's send
    shared.release()
    for lease in (other, unscoped):
        lease.release()
    assert (budget.held, budget.peer_held("a"), budget.peer_held("b")) == (0, 0, 0)
    assert (budget.refused, budget.refused_peer) == (1, 1)


# --- 4. the gRPC port has a connection cap; HTTP health answers through the HTTP cap ----------


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closes `sock` (EOF or reset) within `PATIENCE` seconds."""
    return len(closed_within([sock], 1, PATIENCE)) == 1


def test_idle_grpc_connections_are_capped_and_http_keeps_answering() -> None:
    """40 idle TCP connections (no HTTP/2 preface, no token) to a gRPC port capped at 8: the 32
    over the cap are closed by the server at once, long before the 6 s handshake timeout, the
    process's file descriptors grow by at most the cap on the server's side (the in-process
    server shares this process), HTTP health keeps answering; the 8 admitted are closed at the
    handshake timeout, and gRPC serves again."""
    with start_server(grpc_port=0, grpc_max_connections=8, header_timeout_seconds=6.0) as srv:
        host, port = srv.grpc_url.rsplit(":", 1)
        before = open_fds()
        start = time.monotonic()
        socks = [socket.create_connection((host, int(port)), timeout=PATIENCE) for _ in range(40)]
        try:
            closed = closed_within(socks, 32, 3.0)
            assert len(closed) >= 32, len(closed)
            assert time.monotonic() - start < 5.0
            server_side = open_fds() - before - len(socks)
            assert server_side <= 8 + 2, server_side
            with srv.client() as client:
                assert client.get("/v2/health/live").status_code == 200
                assert client.get("/v2/health/ready").status_code == 200
            assert all(closed_by_server(s) for s in socks if s not in closed)  # handshake timeout
        finally:
            for s in socks:
                s.close()
        grpc_client = tgrpc.InferenceServerClient(srv.grpc_url)
        try:
            assert grpc_client.is_server_live()
        finally:
            grpc_client.close()


def closed_within(socks: list[socket.socket], count: int, seconds: float) -> list[socket.socket]:
    """The sockets the server closes (EOF or reset) until `count` of them are, or `seconds`."""
    closed: list[socket.socket] = []
    deadline = time.monotonic() + seconds
    pending = list(socks)
    while len(closed) < count and pending:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        readable, _, _ = select.select(pending, [], [], left)
        for sock in readable:
            try:
                data = sock.recv(65536)  # what the server sent before closing, if anything
            except OSError:
                data = b""
            if data == b"":
                pending.remove(sock)
                closed.append(sock)
    return closed


def test_health_probes_answer_through_the_connection_cap() -> None:
    """With every one of `max_connections` held by idle sockets of one peer, a new connection
    asking for anything else is 503 `too_many_connections`, but the liveness and readiness
    probes are answered (and the connection closed): no restart loop under a flood."""
    with start_server(max_connections=4, header_timeout_seconds=PATIENCE) as srv:
        host, port = srv.url.removeprefix("http://").split(":")
        idle = [socket.create_connection((host, int(port)), timeout=PATIENCE) for _ in range(4)]
        try:
            with srv.client() as client:
                refused = client.get("/v1/presets")
                assert refused.status_code == 503
                assert refused.json()["error_type"] == "too_many_connections"
            for path in ("/v2/health/live", "/v2/health/ready"):
                with srv.client() as client:
                    r = client.get(path)
                assert r.status_code == 200, (path, r.text)
                assert r.headers["connection"] == "close"
        finally:
            for s in idle:
                s.close()


# --- 7, 8. input ranks bounded; /v2 and gRPC errors excerpted --------------------------------


def http_infer(server: ServerHandle, name: str, shape: list[int]) -> httpx.Response:
    body = {"inputs": [{"name": name, "shape": shape, "datatype": "INT64", "data": [0]}]}
    with server.client() as client:
        return client.post("/v2/models/rope/infer", json=body)


def raw_grpc_infer(server: ServerHandle, name: str, shape: list[int]) -> grpc.RpcError:
    """A ModelInfer built by hand (tritonclient cannot build a 65-dimension input: numpy stops
    at 64); the error it gets."""
    request = service_pb2.ModelInferRequest(model_name="rope")
    request.inputs.add(name=name, datatype="INT64", shape=shape)
    request.raw_input_contents.append(bytes(8))
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failed:
            stub.ModelInfer(request, timeout=PATIENCE)
    return failed.value


def test_an_input_of_65_dimensions_is_a_400(server: ServerHandle) -> None:
    """numpy's limit is 64 dimensions: past `MAX_INPUT_RANK` (8) the shape is refused before any
    array is made, over HTTP (400) and gRPC (INVALID_ARGUMENT), never a 500."""
    for rank in (65, 9):
        r = http_infer(server, "position_ids", [1] * rank)
        assert r.status_code == 400, r.text[:300]
        assert f"shape has {rank} dimensions, more than 8" in r.json()["error"]
        failed = raw_grpc_infer(server, "position_ids", [1] * rank)
        assert failed.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"shape has {rank} dimensions" in failed.details()


def test_errors_never_echo_a_large_input(server: ServerHandle) -> None:
    """An input named with 500 kB: the error quotes an excerpt of at most `MAX_ERROR_CHARS`
    characters and says how much it left out, over HTTP and gRPC (a stock client reads it)."""
    name = "x" * 500_000
    r = http_infer(server, name, [1])
    assert r.status_code == 400
    assert len(r.content) <= 4096, len(r.content)
    assert "more characters left out" in r.json()["error"]
    failed = raw_grpc_infer(server, name, [1])
    assert failed.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(failed.details()) <= 4096
    assert "more characters left out" in failed.details()


# --- 12. lesser: quiet UNIMPLEMENTED; malformed requests in the error contract ----------------


SERVED_GRPC_METHODS = {
    "ServerLive",
    "ServerReady",
    "ServerMetadata",
    "ModelReady",
    "ModelMetadata",
    "ModelConfig",
    "ModelInfer",
    "ModelStreamInfer",
    "ModelStatistics",
    "RepositoryIndex",
}
"""The protocol's calls posenc serves (tests/api/test_grpc.py, test_triton_conventions.py)."""


def test_unimplemented_grpc_calls_are_answered_without_a_traceback(
    server: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    """Every call of a method posenc does not serve is UNIMPLEMENTED, and logs nothing at ERROR
    (the generated default raised NotImplementedError: one traceback per call, no key needed)."""
    caplog.set_level(logging.WARNING)
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        methods = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
        unserved = [m for m in methods if m.name not in SERVED_GRPC_METHODS]
        assert len(unserved) >= 10
        for method in unserved:
            name = method.name
            call = getattr(stub, name)
            request = getattr(service_pb2, method.input_type.name)()
            for _ in range(2):
                with pytest.raises(grpc.RpcError) as failed:
                    call(request, timeout=PATIENCE)
                assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED, name
                assert name in failed.value.details()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage()[:200] for r in errors]


def test_a_malformed_request_line_gets_the_error_contract(server: ServerHandle) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=PATIENCE) as sock:
        sock.sendall(b"GET /v2 HTTP/1.1 extra\x00\r\nHost: x\r\n\r\n")
        status, headers, body = read_response(sock)
    assert status == 400
    assert headers["content-type"] == "application/json"
    error = json.loads(body)
    assert set(error) == {"error", "error_type", "detail"}
    assert error["error_type"] == "bad_request"


def test_a_client_gone_mid_body_is_no_server_error(
    server: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    """A POST whose client closes before its body has arrived is answered (to no one) as a 400,
    without an ERROR traceback: bench/load.py's clients, cut by the keep-alive race, logged
    `unhandled error` (starlette's ClientDisconnect) with a traceback per request."""
    caplog.set_level(logging.WARNING)
    host, port = server.url.removeprefix("http://").split(":")

    def posts() -> float:
        with server.client() as client:
            return sum(
                count
                for (name, labels), count in scrape(client).items()
                if name == "posenc_http_requests_total"
                and ("route", "/v1/tables") in labels
                and ("method", "POST") in labels
            )

    before = posts()
    with socket.create_connection((host, int(port)), timeout=PATIENCE) as sock:
        head = b"POST /v1/tables HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        sock.sendall(head + b"Content-Length: 1000\r\n\r\n" + b'{"kind": "rope"')
    assert wait_for(lambda: posts() == before + 1)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage()[:200] for r in errors]


# --- 5. one peer cannot take every HTTP connection -------------------------------------------


def test_one_peer_cannot_take_every_connection() -> None:
    """One address holding `max_connections_per_peer` (4) idle sockets: its next connection is
    503 `too_many_connections` (health probes still answered); another address (127.0.0.2, on
    loopback too) is served."""
    with start_server(
        max_connections=64, max_connections_per_peer=4, header_timeout_seconds=PATIENCE
    ) as srv:
        host, port = srv.url.removeprefix("http://").split(":")
        idle = [socket.create_connection((host, int(port)), timeout=PATIENCE) for _ in range(4)]
        try:
            with srv.client() as client:
                refused = client.get("/v2")
                # the server may not have accepted all four yet: it counts what it accepted
                deadline = time.monotonic() + PATIENCE
                while refused.status_code == 200 and time.monotonic() < deadline:
                    time.sleep(0.05)
                    refused = client.get("/v2")
                assert refused.status_code == 503
                assert refused.json()["error_type"] == "too_many_connections"
                assert refused.json()["detail"] == {"max_connections_per_peer": 4}
                assert refused.headers["retry-after"] == "1"
            with srv.client() as client:
                assert client.get("/v2/health/live").status_code == 200
            other = httpx.HTTPTransport(local_address="127.0.0.2")
            with httpx.Client(base_url=srv.url, transport=other, timeout=PATIENCE) as client:
                assert client.get("/v2").status_code == 200
        finally:
            for s in idle:
                s.close()
        with srv.client() as client:
            answer = client.get("/v2")
            deadline = time.monotonic() + PATIENCE
            while answer.status_code != 200 and time.monotonic() < deadline:
                answer = client.get("/v2")
            assert answer.status_code == 200
