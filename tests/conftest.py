"""Shared server fixtures: a real uvicorn serving posenc on loopback.

- `start_server(**settings) -> ServerHandle`: uvicorn in a background thread on a free port
  (the socket is bound before uvicorn starts, so parallel xdist workers never collide), configured
  as `posenc serve` configures it (`server_config`: connection cap and timeouts). The handle
  has `.url`, `.app`, `.state`, `.device`, `.client()` and `.stop()`, and is a context manager.
- `server` (session scope, one per xdist worker, with its gRPC service on `.grpc_url`) and
  `client` (an httpx.Client on it).
- `SERVER_DEVICES`: params for a fixture that runs its servers on the CPU and, where CUDA is
  present, on the GPU.
- `start_server_process(*args, env=...) -> ProcessHandle`: `posenc serve --port 0` in a
  subprocess, for tests that need real signals; its URL is read from uvicorn's start-up line.

Settings passed to `start_server` override the environment (`POSENC_*`), as `posenc serve` flags do.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn
from fastapi import FastAPI

from posenc.api import Settings, create_app
from posenc.api.server import server_config
from posenc.api.state import AppState

START_TIMEOUT = 60.0

SERVER_DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")),
]
"""Devices a server fixture runs on: the CPU everywhere, the GPU where there is one."""


def _share_cores() -> int | None:
    """Under pytest-xdist, give each worker its share of the CPU cores for torch's intra-op
    threads (at least one) unless `OMP_NUM_THREADS` says otherwise; the same number goes to
    `OMP_NUM_THREADS` for the servers and tools the tests start as subprocesses.

    torch's default (one thread per core in every worker) oversubscribes the machine: with
    `-n 2` on 2 cores, four spinning threads make a (24, 128) @ (128, 24) float64 matmul take
    ~30 ms instead of ~0.2 ms, and the model sweeps ran twice as long. Pure scheduling: the
    tests and the tables they check are unchanged (same kernels, fewer threads). Returns the
    thread count set, None where nothing was changed (`-n 0`, or `OMP_NUM_THREADS` given)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers or "OMP_NUM_THREADS" in os.environ:
        return None
    threads = max(1, (os.cpu_count() or 1) // max(1, int(workers)))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    return threads


_share_cores()


@dataclass
class ServerHandle:
    """A running in-process server: its base URL, app, settings and thread."""

    url: str
    app: FastAPI
    settings: Settings
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def state(self) -> AppState:
        """The app's `AppState` (cache, metrics, lifecycle) for white-box assertions."""
        state: AppState = self.app.state.posenc
        return state

    @property
    def device(self) -> torch.device:
        """The device the server computes on (resolved in its lifespan)."""
        assert self.state.device is not None
        return self.state.device

    @property
    def grpc_url(self) -> str:
        """`host:port` of the server's gRPC service (started with `grpc_port=0`)."""
        port = self.state.grpc_port
        assert port is not None, "started without grpc_port"
        return f"127.0.0.1:{port}"

    def client(self, **kwargs: Any) -> httpx.Client:
        """An httpx client on this server (no compression, generous timeout)."""
        kwargs.setdefault("timeout", 60.0)
        headers = {"Accept-Encoding": "identity", **kwargs.pop("headers", {})}
        return httpx.Client(base_url=self.url, headers=headers, **kwargs)

    def stop(self) -> None:
        """Shut the server down and wait for its thread."""
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(wait_ready: bool = True, **settings: Any) -> ServerHandle:
    """Start posenc under uvicorn in a thread on 127.0.0.1 and a free port.

    `settings` are `posenc.api.Settings` fields (`cache_bytes=...`, `api_keys=[...]`); the log
    level defaults to warning. With `wait_ready`, returns once `/v2/health/ready` answers 200.
    """
    settings.setdefault("log_level", "warning")
    config_settings = Settings(**settings)
    app = create_app(config_settings)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    config = server_config(
        app,
        config_settings,
        log_level=config_settings.log_level,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True
    )
    thread.start()
    handle = ServerHandle(f"http://127.0.0.1:{port}", app, config_settings, server, thread)
    deadline = time.monotonic() + START_TIMEOUT
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("posenc server did not start")
        time.sleep(0.01)
    if wait_ready:
        with handle.client() as client:
            while client.get("/v2/health/ready").status_code != 200:
                if time.monotonic() > deadline:
                    handle.stop()
                    raise RuntimeError("posenc server did not become ready")
                time.sleep(0.02)
    return handle


@dataclass
class ProcessHandle:
    """`posenc serve` running in a subprocess; `lines` collects its stderr."""

    proc: subprocess.Popen[str]
    url: str = ""
    grpc_url: str = ""
    lines: list[str] = field(default_factory=list)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        """Send `sig` to the server process."""
        self.proc.send_signal(sig)

    def stop(self) -> None:
        """Kill the process if it is still running."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def start_server_process(
    *args: str, env: dict[str, str] | None = None, exe: Path | None = None
) -> ProcessHandle:
    """Run `posenc serve --port 0 ARGS` and wait until uvicorn reports its address (and the gRPC
    service its port, `grpc_url`, when ARGS hold `--grpc-port`). `exe`: another environment's
    `posenc` entry point (default: this one's)."""
    exe = exe or Path(sys.executable).with_name("posenc")
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(
        [str(exe), "serve", "--host", "127.0.0.1", "--port", "0", "--log-level", "info", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )
    handle = ProcessHandle(proc)
    found = threading.Event()
    pattern = re.compile(r"Uvicorn running on (http://\S+)")
    grpc_pattern = re.compile(r"gRPC \(\S+\) on (\S+:\d+)")

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            handle.lines.append(line)
            grpc_match = grpc_pattern.search(line)
            if grpc_match:
                handle.grpc_url = grpc_match.group(1)
            match = pattern.search(line)
            if match:
                handle.url = match.group(1)
                found.set()

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(START_TIMEOUT):
        handle.stop()
        raise RuntimeError("posenc serve did not start:\n" + "".join(handle.lines))
    return handle


@pytest.fixture(scope="session")
def server() -> Iterator[ServerHandle]:
    """One posenc server per test session (per xdist worker) with test-sized limits, serving
    gRPC too (`grpc_url`)."""
    with start_server(
        grpc_port=0,
        cache_bytes=512 << 20,
        max_response_bytes=160 << 20,
        json_max_elements=100_000,
        max_body_bytes=1 << 20,
        max_concurrent_computations=4,
    ) as handle:
        yield handle


@pytest.fixture(scope="session")
def etag_for(server: ServerHandle) -> Callable[[str], str]:
    """The strong ETag the session server sends for a representation tag (`key`,
    `key.npz`...): `"<tag>"` from the CPU, `"<tag>@cuda:0"` from a GPU (api/tables.py)."""
    suffix = "" if server.device.type == "cpu" else f"@{server.device}"
    return lambda tag: f'"{tag}{suffix}"'


@pytest.fixture(scope="session")
def client(server: ServerHandle) -> Iterator[httpx.Client]:
    """An httpx client on the session server."""
    with server.client() as c:
        yield c
