"""Start-up and shutdown: readiness after warm-up, SIGTERM drains in-flight requests, the
`posenc serve` entry point."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.api.metrics_util import scrape, value
from tests.conftest import start_server, start_server_process
from tests.waiting import wait_for


def test_ready_only_after_warm_up() -> None:
    # ~384 MiB of tables on the CPU: long enough that the first probe lands during warm-up
    warm = ["gemma-3-27b", "llama-3.1-8b"]
    with (
        start_server(wait_ready=False, device="cpu", warm_presets=warm, cache_bytes=1 << 30) as srv,
        srv.client() as c,
    ):
        assert c.get("/v2/health/live").json() == {"live": True}
        r = c.get("/v2/health/ready")
        assert r.status_code == 503, "warm-up finished before the first probe?"
        assert r.json()["error_type"] == "not_ready"
        assert r.headers["retry-after"] == "1"
        assert wait_for(lambda: c.get("/v2/health/ready").status_code == 200, timeout=120)
        assert c.get("/v2/health/ready").json() == {"ready": True}
        for name in warm:
            for part in c.get(f"/v1/presets/{name}").json()["parts"]:
                params = {"format": "raw", "tensor": "inv_freq"}
                r = c.get(part["table_url"], params=params)
                assert r.headers["x-posenc-cache"] == "hit"


def test_unknown_warm_preset_fails_fast() -> None:
    with pytest.raises(ValueError, match="unknown presets"):
        start_server(warm_presets=["gpt-7"])


def _slow_request(url: str, body: bytes) -> socket.socket:
    """Open a connection and send the headers and half of a POST body: an in-flight request."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    head = (
        f"POST /v1/tables?format=json HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body[: len(body) // 2])
    return sock


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            if len(rest) >= length:
                return int(head.split()[1]), rest[:length]
    raise AssertionError("connection closed before a full response")


def _refused(url: str) -> bool:
    """Whether a connection to `url` is refused (any answer, or no answer in time, is not). A
    connection reset before any answer counts as refused: it is one the kernel had queued on the
    listening socket when the server closed it (the server stopped accepting)."""
    try:
        httpx.get(url, timeout=2)
    except httpx.ConnectError:
        return True
    except httpx.ReadError as err:
        return isinstance(err.__cause__, ConnectionResetError) or "reset" in str(err).lower()
    except httpx.TimeoutException:
        return False
    return False


def test_sigterm_drains_in_flight_requests() -> None:
    proc = start_server_process(
        "--device", "cpu", "--drain-seconds", "1.0", "--grace-seconds", "10"
    )
    try:
        body = json.dumps({"kind": "alibi", "num_heads": 8}).encode()
        with httpx.Client(base_url=proc.url, timeout=10) as c:
            assert wait_for(lambda: c.get("/v2/health/ready").status_code == 200, timeout=60)
            sock = _slow_request(proc.url, body)
            # the half-sent request is in the app (the scrape itself is the other one in flight)
            in_flight = "posenc_http_requests_in_flight"
            assert wait_for(lambda: value(scrape(c), in_flight) >= 2)
            proc.signal(signal.SIGTERM)
            # draining (1 s): still serving, but not ready
            assert wait_for(lambda: c.get("/v2/health/ready").status_code == 503, timeout=0.9)
            r = c.get("/v2/health/ready")
            assert r.status_code == 503
            assert r.json()["detail"]["draining"] is True
            assert c.get("/v2/health/live").status_code == 200
        # the drain is over: uvicorn has stopped accepting connections
        assert wait_for(lambda: _refused(f"{proc.url}/v2/health/live"), timeout=9)
        assert proc.proc.poll() is None, "exited with a request still in flight"
        sock.sendall(body[len(body) // 2 :])
        status, payload = _read_response(sock)
        sock.close()
        assert status == 200
        assert len(json.loads(payload)["tensors"]["slopes"]["data"]) == 8
        assert proc.proc.wait(timeout=15) == 0
        log = "".join(proc.lines)
        assert "draining" in log
    finally:
        proc.stop()


def test_serve_fails_cleanly_on_a_missing_device() -> None:
    exe = Path(sys.executable).with_name("posenc")
    result = subprocess.run(
        [str(exe), "serve", "--port", "0", "--device", "cuda:7"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # a configuration error: one line and exit 2, before anything starts (no lifespan traceback)
    assert result.returncode == 2
    assert "cuda:7" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_serve_rejects_bad_settings(capsys: pytest.CaptureFixture[str]) -> None:
    from posenc.cli import main

    assert main(["serve", "--device", "tpu"]) == 2
    assert "device" in capsys.readouterr().err
