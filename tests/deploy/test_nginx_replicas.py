"""The scale-out recipe of docs/service.md ("Scaling out"): three `posenc serve` replicas behind
the shipped nginx cache (deploy/k8s/base/nginx.conf, its one upstream server replaced by the
three), one of them restarted, driven by posenc-client, tritonclient and curl (issue 35).

Proves: the table URLs one replica hands out are answered through nginx whichever replica nginx
picks (round robin), including the restarted one, with the bytes, ETag and `Repr-Digest` each
replica answers directly; every replica served table GETs it never resolved; the client library
fetches a model's tables and URLs through the fleet; /v2 inference through nginx agrees with the
tables; and curl, given a URL, needs nothing else. nginx comes from Debian (`make nginx`).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http

from posenc_client import Client
from tests.api.v2client import make_input, spec_param
from tests.api.wire import decode
from tests.conftest import ProcessHandle, start_server_process
from tests.deploy.support import free_port, tool, wait_http
from tests.deploy.test_nginx_cache import NGINX_INSTALL, render_config

pytestmark = [pytest.mark.xdist_group("nginx-cache"), pytest.mark.slow]

CONFIGS = Path(__file__).parent.parent / "data" / "configs"
REPLICAS = 3
SPECS = [
    {"kind": "rope", "head_dim": 32, "max_positions": 256, "rope_theta": 10000.0},
    {"kind": "alibi", "num_heads": 8},
    {"kind": "sinusoidal", "dim": 32, "max_positions": 128},
]
QUERIES = ["", "?format=npz", "?format=json"]
COMPARED = ("etag", "repr-digest", "content-type", "x-posenc-key", "cache-control")
SERVED = re.compile(
    r'^posenc_http_requests_total\{method="GET",route="/v1/tables/\{key\}",status="200"\} (\S+)$',
    re.MULTILINE,
)


def _replica(port: int) -> ProcessHandle:
    handle = start_server_process("--port", str(port), "--drain-seconds", "0")
    wait_http(f"{handle.url}/v2/health/ready", timeout=120)
    return handle


@dataclass
class Fleet:
    root: Path
    ports: list[int]
    replicas: list[ProcessHandle]
    nginx: subprocess.Popen[bytes]
    nginx_url: str

    def direct(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    def restart(self, i: int) -> None:
        self.replicas[i].signal(signal.SIGTERM)
        assert self.replicas[i].proc.wait(timeout=60) == 0, "".join(self.replicas[i].lines)
        self.replicas[i] = _replica(self.ports[i])


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    nginx = tool("nginx", NGINX_INSTALL)
    ports = [free_port() for _ in range(REPLICAS)]
    replicas: list[ProcessHandle] = []
    root = Path(tempfile.mkdtemp(prefix="posenc-fleet-"))
    root.chmod(0o755)
    proc = None
    try:
        for port in ports:
            replicas.append(_replica(port))
        for sub in ("run", "cache"):
            (root / sub).mkdir(mode=0o755)
        listen = free_port()
        text = render_config(root, ports[0], listen)
        one = f"server 127.0.0.1:{ports[0]};"
        assert text.count(one) == 1
        text = text.replace(one, " ".join(f"server 127.0.0.1:{p};" for p in ports))
        (root / "nginx.conf").write_text(text)
        argv = [
            nginx,
            "-p",
            f"{root}/",
            "-c",
            str(root / "nginx.conf"),
            "-e",
            str(root / "error.log"),
        ]
        check = subprocess.run([*argv, "-t"], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
        with (root / "nginx.out").open("wb") as sink:
            proc = subprocess.Popen(
                [*argv, "-g", "daemon off;"], stdout=sink, stderr=subprocess.STDOUT
            )
        started = Fleet(root, ports, replicas, proc, f"http://127.0.0.1:{listen}")
        wait_http(f"{started.nginx_url}/healthz", timeout=30)
        yield started
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGQUIT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        for handle in replicas:
            handle.stop()
        shutil.rmtree(root, ignore_errors=True)


def _curl(url: str, out: Path) -> dict[str, str]:
    """GET `url` with curl into `out`; the response headers (lower-case names)."""
    curl = tool("curl", "apt-get install curl")
    done = subprocess.run(
        [curl, "-sS", "--fail", "-D", "-", "-o", str(out), url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    headers = {}
    for line in done.stdout.splitlines()[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return headers


def _served(base: str) -> float:
    """GET /v1/tables/... answered 200 by one replica since its start (its /metrics)."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    found = SERVED.search(text)
    return float(found.group(1)) if found else 0.0


def _check_everywhere(fleet: Fleet, urls: list[str], queries: list[str], tmp: Path) -> None:
    """Each URL and query: curl through nginx, and each replica directly, answer the same bytes,
    ETag and digest."""
    for n, url in enumerate(urls):
        for query in queries:
            body = tmp / f"{n}{len(query)}.bin"
            headers = _curl(f"{fleet.nginx_url}{url}{query}", body)
            for i in range(REPLICAS):
                direct = httpx.get(
                    f"{fleet.direct(i)}{url}{query}",
                    headers={"Accept-Encoding": "identity"},
                    timeout=120,
                )
                assert direct.status_code == 200, (i, url, direct.text)
                assert direct.content == body.read_bytes(), (i, url, query)
                for name in COMPARED:
                    assert direct.headers.get(name) == headers.get(name), (i, url, query, name)


def test_a_fleet_behind_nginx_answers_every_url_through_a_restart(
    fleet: Fleet, tmp_path: Path
) -> None:
    # URLs handed out by whichever replica nginx picks for the POSTs and the resolve
    urls = []
    with httpx.Client(base_url=fleet.nginx_url, timeout=120) as c:
        for spec in SPECS:
            r = c.post("/v1/tables", json=spec)
            assert r.status_code == 200, r.text
            urls.append(r.headers["content-location"])
    config = json.loads((CONFIGS / "google__gemma-3-4b-it.json").read_text())
    with Client(fleet.nginx_url, cache=tmp_path / "client") as client:
        resolved = client.resolve(config, max_positions=256)
        urls += [spec.url for spec in resolved]
        tables = client.tables_for_model(config, max_positions=256)
        assert set(tables) == {spec.name for spec in resolved}
    assert len(set(urls)) == len(urls) == len(SPECS) + 2

    _check_everywhere(fleet, urls, QUERIES[:2], tmp_path)
    before = [_served(fleet.direct(i)) for i in range(REPLICAS)]
    assert all(n > 0 for n in before), before  # every replica answered URLs it never resolved

    fleet.restart(1)
    assert _served(fleet.direct(1)) == 0
    _check_everywhere(fleet, urls, QUERIES[2:], tmp_path)  # new entries: nginx misses
    assert _served(fleet.direct(1)) > 0  # the restarted replica answered the old URLs

    # the client, with an empty cache, by URL through the fleet: the tables it fetched before
    with Client(fleet.nginx_url, cache=tmp_path / "again") as client:
        for spec in resolved:
            again = client.table_by_key(spec.url)
            for name in tables[spec.name]:
                assert np.array_equal(again[name], tables[spec.name][name]), (spec.name, name)

    # /v2 through nginx (round robin, the restarted replica included) agrees with the tables
    rope = SPECS[0]
    whole = decode(httpx.get(f"{fleet.nginx_url}{urls[0]}", timeout=60))
    triton = triton_http.InferenceServerClient(fleet.nginx_url.removeprefix("http://"))
    ids = np.array([0, 5, 17, 255], dtype=np.int64)
    for _ in range(REPLICAS * 2):
        result = triton.infer(
            "rope", [make_input("position_ids", ids)], parameters=spec_param(rope)
        )
        cos = result.as_numpy("cos")
        assert cos is not None
        assert np.array_equal(cos, whole["cos"].numpy()[ids])
