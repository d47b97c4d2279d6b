"""The container's stop contract, on a real `posenc serve` process started exactly as the image
starts it: the Dockerfile's exec-form ENTRYPOINT + CMD (no shell, no flags), configured only by
`POSENC_*` environment variables (the image's ENV plus what a ConfigMap would add), health probed
by the image's HEALTHCHECK script.

On SIGTERM (what `docker stop` and the kubelet send): readiness and the health check turn
unhealthy while the server still answers, requests in flight when the listener closes complete
with every byte, and the process exits 0 within POSENC_DRAIN_SECONDS + POSENC_GRACE_SECONDS, even
when a client never finishes reading. tests/api/test_lifecycle.py covers the drain of a request
still uploading its body, with `posenc serve` flags; these cover the image's process contract.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from tests.deploy.support import REPO, dockerfile_stages, free_port, image_config

START_TIMEOUT = 120.0
# A 32 MiB table (cos of the llama-3.2-1b preset: 131072 positions x 64, float32), warmed at start.
PRESET = "llama-3.2-1b"
SLOW_CHUNK = 1 << 20
SLOW_PAUSE = 0.25  # seconds per MiB: a full read takes ~8 s, twice the drain below
DRAIN = 4.0
GRACE = 20.0
# The server's own timing (its last log line) may slip this much on a loaded 2-core machine ...
SERVER_SLACK = 2.0
# ... and the interpreter then takes this long at most to exit (torch's teardown alone takes
# 1-3 s there). Kubernetes' terminationGracePeriodSeconds leaves 15 s for it (test_k8s_manifests).
TEARDOWN_SLACK = 10.0
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ", re.MULTILINE)


def _healthcheck_script() -> Path:
    """The file the image runs as its HEALTHCHECK, found through the Dockerfile's COPY."""
    health = image_config("cpu")["healthcheck"].args
    for stage in dockerfile_stages():
        for copy in stage.find("COPY"):
            source, destination = copy.args.split()[-2:]
            if destination in health:
                return REPO / source
    pytest.fail("the HEALTHCHECK script is not copied into the image")


@dataclass
class Container:
    """posenc started as the image starts it, on loopback."""

    proc: subprocess.Popen[bytes]
    port: int
    env: dict[str, str]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def healthcheck(self) -> int:
        """Exit status of the image's HEALTHCHECK command against this process."""
        done = subprocess.run(
            [sys.executable, str(_healthcheck_script())],
            env=self.env,
            capture_output=True,
            timeout=30,
        )
        return done.returncode

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def last_log_time(self) -> float:
        """Wall-clock time of the server's last log line (its shutdown being the last thing)."""
        stamps = LOG_TIME.findall(self.output())
        assert stamps, self.output()
        return datetime.strptime(stamps[-1], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def start_container(tmp_path: Path, **settings: str) -> Container:
    image = image_config("cpu")
    entrypoint = image["entrypoint"]
    assert entrypoint == ["/opt/venv/bin/posenc"]
    # The venv's console script stands in for /opt/venv/bin/posenc.
    argv = [str(Path(sys.executable).with_name("posenc")), *image["cmd"]]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSENC_")}
    env.update({k: v for k, v in image["env"].items() if k.startswith("POSENC_")})
    # Tests here bind the loopback only; the image binds 0.0.0.0. The image's gRPC port (8001)
    # moves to a free one too: two of these servers (or any other on 8001) must not collide.
    if "POSENC_GRPC_PORT" in env:
        env["POSENC_GRPC_PORT"] = str(free_port())
    env.update(POSENC_HOST="127.0.0.1", POSENC_PORT=str(port), **settings)
    log = tmp_path / "posenc.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)
    container = Container(proc, port, env, log)
    deadline = time.monotonic() + START_TIMEOUT
    while container.healthcheck() != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"posenc did not become healthy:\n{container.output()}")
        time.sleep(0.2)
    return container


@pytest.fixture
def container(tmp_path: Path) -> Iterator[Container]:
    started = start_container(
        tmp_path,
        POSENC_WARM_PRESETS=PRESET,
        POSENC_DRAIN_SECONDS=str(DRAIN),
        POSENC_GRACE_SECONDS=str(GRACE),
        POSENC_LOG_LEVEL="info",
    )
    yield started
    if started.proc.poll() is None:
        started.proc.kill()
        started.proc.wait(timeout=30)


def _table_url(container: Container) -> str:
    preset = httpx.get(f"{container.url}/v1/presets/{PRESET}", timeout=30).json()
    (part,) = (p for p in preset["parts"] if p["name"] == "rope")
    return f"{container.url}{part['url']}?format=raw&tensor=cos"


def _slow_read(url: str, started: threading.Event) -> tuple[int, int, str, float]:
    """GET `url`, reading 1 MiB at a time with a pause: (status, bytes, sha256, finish time)."""
    digest = hashlib.sha256()
    size = 0
    with httpx.Client(timeout=60) as client, client.stream("GET", url) as response:
        for chunk in response.iter_bytes(SLOW_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            started.set()
            # the pacing under test (a slow reader still draining at SIGTERM), not a wait
            time.sleep(SLOW_PAUSE)
        return response.status_code, size, digest.hexdigest(), time.monotonic()


def test_sigterm_drains_then_exits(container: Container) -> None:
    url = _table_url(container)
    reference = httpx.get(url, timeout=60)
    assert reference.status_code == 200
    expected = (len(reference.content), hashlib.sha256(reference.content).hexdigest())
    assert expected[0] == 32 << 20

    readers = 4
    events = [threading.Event() for _ in range(readers)]
    with ThreadPoolExecutor(readers) as pool:
        futures: list[Future[tuple[int, int, str, float]]] = [
            pool.submit(_slow_read, url, event) for event in events
        ]
        for event in events:
            assert event.wait(30), "a slow reader never received its first chunk"

        sent, sent_wall = time.monotonic(), time.time()
        container.proc.send_signal(signal.SIGTERM)

        # Draining (DRAIN seconds): the listener is open; readiness and the health check say
        # "stop routing here"; liveness and other routes still answer.
        ready = httpx.get(f"{container.url}/v2/health/ready", timeout=5)
        assert ready.status_code == 503, ready.text
        assert ready.json()["detail"]["draining"] is True
        assert container.healthcheck() != 0
        assert httpx.get(f"{container.url}/v2/health/live", timeout=5).status_code == 200
        assert httpx.get(f"{container.url}/v1/presets", timeout=5).status_code == 200

        results = [future.result(timeout=60) for future in futures]

    code = container.proc.wait(timeout=60)
    exited = time.monotonic()
    output = container.output()
    assert code == 0, output
    assert "draining" in output.lower()
    for status, size, digest, finished in results:
        assert (status, size, digest) == (200, *expected), output
        # The reads outlasted the drain: they were in flight when the listener closed.
        assert finished - sent > DRAIN
    # The server waited for them, and stopped well within DRAIN + GRACE.
    assert exited >= max(r[3] for r in results) - 0.5
    assert container.last_log_time() - sent_wall < DRAIN + GRACE, output
    assert exited - sent < DRAIN + GRACE + TEARDOWN_SLACK, output
    # Gone: the health check fails and nothing listens.
    assert container.healthcheck() != 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{container.url}/v2/health/live", timeout=5)


def test_exit_is_bounded_by_the_grace_when_a_client_stalls(tmp_path: Path) -> None:
    """A client that stops reading cannot hold the process past DRAIN + GRACE."""
    drain, grace = 0.5, 2.0
    container = start_container(
        tmp_path,
        POSENC_WARM_PRESETS=PRESET,
        POSENC_DRAIN_SECONDS=str(drain),
        POSENC_GRACE_SECONDS=str(grace),
    )
    try:
        url = _table_url(container)
        with httpx.Client(timeout=60) as client, client.stream("GET", url) as response:
            assert response.status_code == 200
            # Keep the iterator (dropping it would close the connection): read one chunk, then
            # stop reading with ~31 MiB outstanding, and ask the server to stop.
            chunks = response.iter_bytes(SLOW_CHUNK)
            next(chunks)
            sent, sent_wall = time.monotonic(), time.time()
            container.proc.send_signal(signal.SIGTERM)
            code = container.proc.wait(timeout=drain + grace + 30)
            elapsed = time.monotonic() - sent
            with pytest.raises(httpx.HTTPError):
                for _ in chunks:
                    pass
        output = container.output()
        assert code == 0, output
        # The server gave up on the stalled response at the grace, not before, not much after.
        stopped = container.last_log_time() - sent_wall
        assert drain + grace <= stopped < drain + grace + SERVER_SLACK, (stopped, output)
        assert elapsed < drain + grace + SERVER_SLACK + TEARDOWN_SLACK, (elapsed, output)
    finally:
        if container.proc.poll() is None:
            container.proc.kill()
            container.proc.wait(timeout=30)
