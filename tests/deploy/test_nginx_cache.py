"""The shipped nginx cache configuration (deploy/k8s/base/nginx.conf) in front of a real posenc,
both on loopback. Only addresses, ports and paths are templated; every caching directive is the
shipped one. nginx comes from Debian (`make test` installs nginx-light when missing).

Proves: the second fetch of a table (or ONNX model) is a cache HIT with identical bytes;
negotiated formats are cached apart; 404s and other routes are not cached; concurrent misses reach
posenc once; ranges are served from the cache; and cached tables are still served while posenc is
down and after it restarts (with an empty key index).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import ProcessHandle, start_server_process
from tests.deploy.support import K8S, free_port, tool, wait_http

pytestmark = pytest.mark.xdist_group("nginx-cache")

NGINX_CONF = K8S / "base" / "nginx.conf"
NGINX_INSTALL = "run `make test` (it installs Debian's nginx-light) or apt-get install nginx-light"
SPEC = {"kind": "rope", "head_dim": 64, "max_positions": 4096}  # 2 MiB of cos + sin
KEY = re.compile(r"^[0-9a-f]{64}$")


def render_config(root: Path, upstream_port: int, listen_port: int) -> str:
    """The shipped nginx.conf with loopback addresses and paths under `root`.

    Each replacement must match the shipped file, so a change there that would leave this test
    running a different configuration fails here instead.
    """
    text = NGINX_CONF.read_text(encoding="utf-8")
    replacements = (
        # First, so the paths inserted below (under /tmp themselves) are not rewritten again.
        ("/tmp/", f"{root}/run/"),
        ("/var/cache/nginx/", f"{root}/cache/"),
        ("error_log /dev/stderr", f"error_log {root}/error.log"),
        ("access_log /dev/stdout", f"access_log {root}/access.log"),
        ("server posenc:8000;", f"server 127.0.0.1:{upstream_port};"),
        ("listen 8080;", f"listen 127.0.0.1:{listen_port};"),
    )
    for old, new in replacements:
        assert old in text, f"{NGINX_CONF} no longer contains {old!r}; update render_config"
        text = text.replace(old, new)
    return text


@dataclass
class Stack:
    """posenc (a subprocess on a fixed port) behind nginx with the shipped configuration."""

    root: Path
    posenc_port: int
    posenc: ProcessHandle
    nginx: subprocess.Popen[bytes]
    nginx_url: str
    fetched: dict[str, bytes] = field(default_factory=dict)

    @property
    def posenc_url(self) -> str:
        return f"http://127.0.0.1:{self.posenc_port}"

    def access_log(self) -> list[str]:
        return (self.root / "access.log").read_text(encoding="utf-8").splitlines()

    def error_log(self) -> str:
        path = self.root / "error.log"
        return path.read_text(encoding="utf-8") if path.exists() else ""

    def stop_posenc(self) -> None:
        self.posenc.signal(signal.SIGTERM)
        assert self.posenc.proc.wait(timeout=60) == 0, "".join(self.posenc.lines)

    def start_posenc(self) -> None:
        self.posenc = _posenc(self.posenc_port)


def _posenc(port: int = 0) -> ProcessHandle:
    handle = start_server_process("--port", str(port), "--drain-seconds", "0")
    wait_http(f"{handle.url}/v2/health/ready", timeout=60)
    return handle


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    nginx = tool("nginx", NGINX_INSTALL)
    posenc = _posenc()
    posenc_port = int(posenc.url.rsplit(":", 1)[1])
    # nginx's workers drop to `nobody` when the tests run as root: the tree must be traversable.
    root = Path(tempfile.mkdtemp(prefix="posenc-nginx-"))
    root.chmod(0o755)
    for sub in ("run", "cache"):
        (root / sub).mkdir(mode=0o755)
    listen_port = free_port()
    (root / "nginx.conf").write_text(render_config(root, posenc_port, listen_port))
    argv = [nginx, "-p", f"{root}/", "-c", str(root / "nginx.conf"), "-e", str(root / "error.log")]
    check = subprocess.run([*argv, "-t"], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    with (root / "nginx.out").open("wb") as sink:
        proc = subprocess.Popen([*argv, "-g", "daemon off;"], stdout=sink, stderr=subprocess.STDOUT)
    started = Stack(root, posenc_port, posenc, proc, f"http://127.0.0.1:{listen_port}")
    try:
        wait_http(f"{started.nginx_url}/healthz", timeout=30)
        yield started
    finally:
        proc.send_signal(signal.SIGQUIT)  # graceful: finish responses, then exit
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        started.posenc.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def key(stack: Stack) -> str:
    """A table key resolved through nginx (POST passes through to posenc, uncached)."""
    response = httpx.post(f"{stack.nginx_url}/v1/tables", json=SPEC, timeout=60)
    assert response.status_code == 200, response.text
    assert "x-cache-status" not in response.headers
    key = response.headers["x-posenc-key"]
    assert KEY.match(key)
    return key


def _get(url: str, **headers: str) -> httpx.Response:
    return httpx.get(url, headers={"Accept-Encoding": "identity", **headers}, timeout=60)


@pytest.mark.parametrize("query", ["", "?format=raw&tensor=cos", "?format=npz"])
def test_second_fetch_is_a_hit_with_identical_bytes(stack: Stack, key: str, query: str) -> None:
    path = f"/v1/tables/{key}{query}"
    first = _get(stack.nginx_url + path)
    second = _get(stack.nginx_url + path)
    direct = _get(stack.posenc_url + path)
    assert first.status_code == second.status_code == direct.status_code == 200
    assert first.headers["x-cache-status"] == "MISS"
    assert second.headers["x-cache-status"] == "HIT"
    assert second.content == first.content == direct.content
    assert len(second.content) > 0
    # The immutable headers pass through unchanged, so caches downstream may keep it too.
    for header in ("etag", "cache-control", "content-type", "x-posenc-key"):
        assert second.headers[header] == direct.headers[header]
    assert "immutable" in second.headers["cache-control"]
    stack.fetched[path] = second.content


def test_onnx_models_are_cached(stack: Stack) -> None:
    created = httpx.post(f"{stack.nginx_url}/v1/onnx", json={"spec": SPEC}, timeout=120)
    assert created.status_code == 200, created.text
    location = created.headers["content-location"]
    assert re.fullmatch(r"/v1/onnx/[0-9a-f]{64}", location)
    first = _get(stack.nginx_url + location)
    second = _get(stack.nginx_url + location)
    assert first.status_code == second.status_code == 200
    assert (first.headers["x-cache-status"], second.headers["x-cache-status"]) == ("MISS", "HIT")
    assert second.content == first.content == created.content
    assert "immutable" in second.headers["cache-control"]
    stack.fetched[location] = second.content


def test_negotiated_formats_are_cached_apart(stack: Stack, key: str) -> None:
    path = f"{stack.nginx_url}/v1/tables/{key}"
    npy = {"Accept": "application/x-npy"}
    default = _get(path)
    first = _get(path + "?tensor=sin", **npy)
    second = _get(path + "?tensor=sin", **npy)
    assert first.status_code == second.status_code == 200, first.text
    assert second.headers["x-cache-status"] == "HIT"
    assert second.content == first.content
    assert second.content.startswith(b"\x93NUMPY")
    assert second.headers["content-type"] != default.headers["content-type"]
    assert _get(path).content == default.content


def test_unknown_keys_and_errors_are_not_cached(stack: Stack) -> None:
    """A key not resolved yet is 404 now and may be 200 later: nginx must not keep the 404."""
    path = f"{stack.nginx_url}/v1/tables/{'0' * 64}"
    for _ in range(2):
        response = _get(path)
        assert response.status_code == 404
        assert response.headers["x-cache-status"] == "MISS"
        assert response.json()["error_type"] == "unknown_key"


def test_other_routes_pass_through_uncached(stack: Stack) -> None:
    for path in ("/v2/health/ready", "/v1/presets", "/metrics"):
        for _ in range(2):
            response = _get(stack.nginx_url + path)
            assert response.status_code == 200, path
            assert "x-cache-status" not in response.headers, path


def test_concurrent_misses_reach_posenc_once(stack: Stack, key: str) -> None:
    path = f"/v1/tables/{key}?format=raw&tensor=cos&rows=0:1024"
    bodies: list[bytes] = []
    barrier = threading.Barrier(8)

    def fetch() -> None:
        barrier.wait()
        response = _get(stack.nginx_url + path)
        assert response.status_code == 200
        bodies.append(response.content)

    threads = [threading.Thread(target=fetch) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(bodies) == 8
    assert len(set(bodies)) == 1
    assert len(bodies[0]) == 1024 * 64 * 4
    lines = [line for line in stack.access_log() if f'"GET {path} ' in line]
    assert len(lines) == 8, lines
    assert sum("cache=MISS" in line for line in lines) == 1, lines


def test_ranges_are_served_from_the_cache(stack: Stack, key: str) -> None:
    path = f"{stack.nginx_url}/v1/tables/{key}?format=raw&tensor=sin"
    full = _get(path)
    assert _get(path).headers["x-cache-status"] == "HIT"
    part = _get(path, Range="bytes=1000-1999")
    assert part.status_code == 206
    assert part.headers["x-cache-status"] == "HIT"
    assert part.content == full.content[1000:2000]


def test_cached_tables_survive_posenc_stopping_and_restarting(stack: Stack, key: str) -> None:
    path = f"/v1/tables/{key}?format=raw&tensor=cos"
    cached = _get(stack.nginx_url + path)
    assert cached.status_code == 200
    assert _get(stack.nginx_url + path).headers["x-cache-status"] == "HIT"

    stack.stop_posenc()
    with pytest.raises(httpx.ConnectError):
        _get(stack.posenc_url + "/v2/health/live")
    while_down = _get(stack.nginx_url + path)
    assert while_down.status_code == 200
    assert while_down.headers["x-cache-status"] == "HIT"
    assert while_down.content == cached.content
    # Not cached, so not served: the pass-through routes need posenc.
    assert _get(stack.nginx_url + "/v1/presets").status_code == 502

    stack.start_posenc()
    # The restarted process has not resolved this key (only presets are known at start) ...
    assert _get(stack.posenc_url + path).status_code == 404
    # ... and nginx still serves every table it cached before, byte for byte.
    after = _get(stack.nginx_url + path)
    assert after.status_code == 200
    assert after.headers["x-cache-status"] == "HIT"
    assert after.content == cached.content
    for earlier, body in stack.fetched.items():
        again = _get(stack.nginx_url + earlier)
        assert again.headers["x-cache-status"] == "HIT", earlier
        assert again.content == body, earlier
    # nginx reconnects to the restarted upstream for everything else.
    assert _get(stack.nginx_url + "/v1/presets").status_code == 200
    assert "[emerg]" not in stack.error_log()
    assert "[crit]" not in stack.error_log()


def test_nginx_writes_only_to_the_pod_volumes() -> None:
    """On a read-only root filesystem nginx may write only under /tmp and /var/cache/nginx (the
    cache pod's emptyDirs), logs go to the container's stdout/stderr, and no `user` switch."""
    text = NGINX_CONF.read_text(encoding="utf-8")
    writes: dict[str, set[str]] = {}
    for directive, path in re.findall(
        r"^\s*(pid|client_body_temp_path|proxy_temp_path|proxy_cache_path|error_log|access_log)"
        r"\s+(\S+?);?\s",
        text,
        re.MULTILINE,
    ):
        writes.setdefault(directive, set()).add(path)
    assert set(writes) == {
        "pid", "client_body_temp_path", "proxy_temp_path", "proxy_cache_path", "error_log",
        "access_log",
    }  # fmt: skip
    for directive, paths in writes.items():
        for path in paths:
            if directive.endswith("_log"):
                assert path in ("/dev/stdout", "/dev/stderr", "off"), directive
            else:
                assert path.startswith(("/tmp/", "/var/cache/nginx/")), (directive, path)
    assert not re.search(r"^\s*user\s", text, re.MULTILINE)
