"""Build the posenc image without needing a Docker daemon: `make image` runs `build`.

    python -m deploy.image build [--target cpu|cuda] [--tag NAME]

Engine: docker (BuildKit) when a daemon answers, else Debian's buildah (`make container-tools`
installs it), with `--format docker` (the default OCI format has no HEALTHCHECK) and `--layers`
(cached layers, so a code change rebuilds only the project layer). podman runs what buildah
builds; both use the same image store.

Base image (`PYTHON_IMAGE` build argument): the official python:3.11-slim-bookworm when it is in
the image store or a registry answers, else a Debian bookworm root made here with debootstrap
(python3, python3-venv) and imported as `localhost/posenc-python:3.11-bookworm`. The output says
which.

Host pip configuration: pip inside the build sees only deploy/docker/pip-host/, bind-mounted at
/run/pip-host for the dependency install (never copied into the image). This script fills it from
`pip config list` and pip's environment: the CA bundle (`cert`, for TLS-intercepting proxies), the
http(s) index and find-links URLs, and the lock's wheels found in local find-links directories,
hash-checked against the lock (`wheels/`, a find-links folder in the build). When torch's CPU index
does not answer and the lock's torch wheel is local, a PEP 503 index of those wheels (`simple/`)
stands in for it (`TORCH_CPU_INDEX`). One build at a time per checkout (a lock file).

The image and its layers' sizes are printed after every build. deploy/image_test.py (`make
image-test`) builds, runs and checks the image.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import html
import json
import os
import re
import resource
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PIP_HOST = REPO / "deploy" / "docker" / "pip-host"
PIP_HOST_MOUNT = "/run/pip-host"  # where the Dockerfile mounts PIP_HOST
OFFICIAL_BASE = "docker.io/library/python:3.11-slim-bookworm"
LOCAL_BASE = "localhost/posenc-python:3.11-bookworm"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
DEBIAN_MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
# Debian's minimal root plus the interpreter, venv support (ensurepip) and `python`.
DEBOOTSTRAP_PACKAGES = "python3,python3-venv,python-is-python3"
# Dropped from the debootstrap root: package lists and caches, documentation, translations.
SLIM = ("var/lib/apt/lists", "var/cache/apt", "var/cache/debconf", "usr/share/doc",
        "usr/share/man", "usr/share/info", "usr/share/locale", "var/log")  # fmt: skip
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def say(message: str) -> None:
    print(f"[image] {message}", flush=True)


def run(argv: list[str], **kwargs: Any) -> None:
    """Run a command, echoing it; raise when it fails (its output went to ours)."""
    say("$ " + " ".join(argv))
    subprocess.run(argv, check=True, text=True, **kwargs)


def quiet(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a command and capture its output; never raises on its exit status."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


@dataclass(frozen=True)
class Engine:
    """The container CLI in use: `docker` (daemon, BuildKit) or `podman` (buildah builds)."""

    cli: str

    @property
    def build(self) -> list[str]:
        if self.cli == "docker":
            return ["docker", "build"]
        # --format docker keeps HEALTHCHECK (the OCI image config has no such field).
        return ["buildah", "bud", "--format", "docker", "--layers"]

    @property
    def run_options(self) -> list[str]:
        """`run` options this host needs. podman 4.3 with crun refuses hosts with hybrid cgroups
        (v1 controllers plus a v2 mount): runc runs there. Without a systemd session podman asks
        runc for rlimits above those its own processes hold (it caps their process limit at
        kernel.pid_max), and the start fails: the container gets the limits it can have."""
        if self.cli == "docker":
            return []
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text(encoding="utf-8"))
        if nproc == resource.RLIM_INFINITY or nproc > pid_max:
            nproc = pid_max
        return ["--runtime", "runc", "--ulimit", f"nofile={nofile}:{nofile}",
                "--ulimit", f"nproc={nproc}:{nproc}"]  # fmt: skip

    def exists(self, image: str) -> bool:
        if self.cli == "docker":
            return quiet(["docker", "image", "inspect", image]).returncode == 0
        return quiet(["podman", "image", "exists", image]).returncode == 0

    def inspect(self, image: str) -> dict[str, object]:
        done = quiet([self.cli, "image", "inspect", image])
        if done.returncode != 0:
            raise SystemExit(f"no image {image}: {done.stderr.strip()}")
        (config,) = json.loads(done.stdout)
        return dict(config)


def find_engine() -> Engine:
    """docker when its daemon answers; else podman + buildah (`make container-tools`)."""
    if shutil.which("docker") and quiet(["docker", "info"], timeout=30).returncode == 0:
        return Engine("docker")
    missing = [t for t in ("buildah", "podman", "runc") if shutil.which(t) is None]
    if missing:
        raise SystemExit(
            f"no Docker daemon and no {', '.join(missing)}: run `make container-tools`"
        )
    return Engine("podman")


# --- base image ---------------------------------------------------------------------------------


def choose_base(engine: Engine) -> str:
    """The official python image when present or pullable, else the debootstrap one (made once)."""
    official = OFFICIAL_BASE
    if engine.exists(official):
        say(f"base image: {official} (official, already in the image store)")
        return official
    pulled = quiet([engine.cli, "pull", official], timeout=600)
    if pulled.returncode == 0:
        say(f"base image: {official} (official, pulled)")
        return official
    reason = (pulled.stderr.strip().splitlines() or ["no answer"])[-1]
    say(f"no registry answers for {official} ({reason})")
    if engine.exists(LOCAL_BASE):
        say(f"base image: {LOCAL_BASE} (Debian bookworm made with debootstrap, already built)")
        return LOCAL_BASE
    debootstrap_base(engine)
    say(f"base image: {LOCAL_BASE} (Debian bookworm made with debootstrap from {DEBIAN_MIRROR})")
    return LOCAL_BASE


def debootstrap_base(engine: Engine) -> None:
    """Debian bookworm minbase + Python 3.11 from `DEBIAN_MIRROR`, imported as LOCAL_BASE with
    the environment the official image sets (PATH, LANG)."""
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    if not Path(debootstrap).exists():
        raise SystemExit("debootstrap is not installed: run `make container-tools`")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="posenc-base-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "root"
        run([debootstrap, "--variant=minbase", f"--include={DEBOOTSTRAP_PACKAGES}", "bookworm",
             str(root), DEBIAN_MIRROR], stdout=subprocess.DEVNULL)  # fmt: skip
        for relative in SLIM:
            for entry in (root / relative).glob("*"):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        archive = Path(tmp) / "root.tar"
        run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(archive), "."])
        run([engine.cli, "import",
             "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "--change", "ENV LANG=C.UTF-8",
             "--change", 'CMD ["python3"]',
             str(archive), LOCAL_BASE], stdout=subprocess.DEVNULL)  # fmt: skip
    say(f"debootstrap base built in {time.monotonic() - started:.0f} s")


# --- the host's pip configuration ---------------------------------------------------------------


def pip_settings() -> dict[str, list[str]]:
    """Effective pip settings of this host (`pip config list`: files and PIP_* variables), by
    option name; environment values come last, as pip gives them precedence."""
    done = quiet([sys.executable, "-m", "pip", "config", "list"])
    settings: dict[str, list[str]] = {}
    files: list[tuple[str, str]] = []
    env: list[tuple[str, str]] = []
    for line in done.stdout.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        section, _, name = key.rpartition(".")
        pair = (name, value.strip().strip("'\""))
        (env if section == ":env:" else files).append(pair)
    for name, value in files + env:
        settings[name.removeprefix("default-")] = value.split()  # default-timeout is timeout
    return settings


def lock_pins(lock: Path) -> dict[str, tuple[str, set[str]]]:
    """`normalized name -> (version, sha256 hashes)` of a hash-pinned lock file."""
    pins: dict[str, tuple[str, set[str]]] = {}
    current = ""
    for line in lock.read_text(encoding="utf-8").splitlines():
        match = PIN.match(line)
        if match:
            current = normalize(match.group(1))
            pins[current] = (match.group(2), set())
        elif current:
            pins[current][1].update(HASH.findall(line))
    return pins


def normalize(name: str) -> str:
    """PEP 503 name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def local_dirs(values: list[str]) -> list[Path]:
    dirs = []
    for value in values:
        path = Path(value.removeprefix("file://")) if value.startswith(("file://", "/")) else None
        if path is not None and path.is_dir():
            dirs.append(path)
    return dirs


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def stage_pip_host(lock: Path) -> dict[str, str]:
    """Fill deploy/docker/pip-host from this host's pip configuration (module docstring); the
    build arguments it needs."""
    settings = pip_settings()
    pins = lock_pins(lock)
    for entry in PIP_HOST.iterdir():
        if entry.name != "README.md":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    wheels = PIP_HOST / "wheels"
    wheels.mkdir()
    staged: dict[str, list[tuple[str, str]]] = {}
    for directory in local_dirs(settings.get("find-links", [])):
        for wheel in sorted(directory.glob("*.whl")):
            name, version = wheel.name.split("-")[:2]
            pin = pins.get(normalize(name))
            if pin is None or pin[0] != version or (wheels / wheel.name).exists():
                continue
            digest = sha256(wheel)
            if digest not in pin[1]:
                continue
            try:
                os.link(wheel, wheels / wheel.name)  # same file system: no copy
            except OSError:
                shutil.copy2(wheel, wheels / wheel.name)
            staged.setdefault(normalize(name), []).append((wheel.name, digest))
    # A PEP 503 index of them (TORCH_CPU_INDEX's stand-in): a page for every pinned name, so that
    # pip finds no page missing.
    for name in pins:
        page = PIP_HOST / "simple" / name
        page.mkdir(parents=True)
        links = "".join(
            f'<a href="../../wheels/{html.escape(w)}#sha256={d}">{html.escape(w)}</a>\n'
            for w, d in staged.get(name, [])
        )
        (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    options: dict[str, str] = {}
    index_url = [u for u in settings.get("index-url", []) if u.startswith(("http:", "https:"))]
    if index_url:
        options["index-url"] = index_url[0]
    indexes = [u for u in settings.get("extra-index-url", []) if u.startswith(("http:", "https:"))]
    if indexes:
        options["extra-index-url"] = " ".join(indexes)
    remote = [u for u in settings.get("find-links", []) if u.startswith(("http:", "https:"))]
    options["find-links"] = " ".join([f"{PIP_HOST_MOUNT}/wheels", *remote])
    for option in ("trusted-host", "timeout", "retries", "proxy", "no-index"):
        if option in settings:
            options[option] = " ".join(settings[option])
    cert = settings.get("cert") or [os.environ.get("REQUESTS_CA_BUNDLE", "")]
    if cert[0] and Path(cert[0]).is_file():
        shutil.copy2(cert[0], PIP_HOST / "ca.pem")
        options["cert"] = f"{PIP_HOST_MOUNT}/ca.pem"
        say(f"pip in the build trusts this host's CA bundle ({cert[0]}), mounted, not copied")
    header = "# Written by deploy/image.py from this host's pip configuration; build-time only."
    body = "".join(f"{key} = {value}\n" for key, value in options.items())
    (PIP_HOST / "pip.conf").write_text(f"{header}\n[global]\n{body}")
    count = sum(len(v) for v in staged.values())
    say(f"host pip settings in {PIP_HOST.relative_to(REPO)}: {count} local wheels; {options}")

    args: dict[str, str] = {}
    if "cpu" in lock.name and not reachable(f"{TORCH_CPU_INDEX}/torch/", cert[0]):
        if "torch" not in staged:
            raise SystemExit(
                f"{TORCH_CPU_INDEX} does not answer and torch {pins['torch'][0]} is not in a "
                "local find-links directory: pass TORCH_CPU_INDEX=<an index holding it>"
            )
        args["TORCH_CPU_INDEX"] = f"file://{PIP_HOST_MOUNT}/simple"
        say(f"{TORCH_CPU_INDEX} does not answer: torch {pins['torch'][0]} comes from this host's "
            "wheel cache (TORCH_CPU_INDEX=the staged index)")  # fmt: skip
    return args


def reachable(url: str, cafile: str) -> bool:
    context = ssl.create_default_context(cafile=cafile or None)
    try:
        with urllib.request.urlopen(url, timeout=15, context=context):
            return True
    except (urllib.error.URLError, OSError):
        return False


# --- build and sizes ----------------------------------------------------------------------------


def build(engine: Engine, target: str, tag: str, extra_args: dict[str, str] | None = None) -> float:
    """Build `target` as `tag`; the seconds it took."""
    lock = REPO / "requirements" / f"image-{target}.txt"
    # One build at a time per checkout: a second one would restage the pip-host directory under
    # the first one's pip.
    guard = (REPO / "deploy" / "docker" / ".pip-host.lock").open("w")
    fcntl.flock(guard, fcntl.LOCK_EX)
    args = {"PYTHON_IMAGE": choose_base(engine), **stage_pip_host(lock), **(extra_args or {})}
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    stdin = None
    if engine.cli == "docker" and args["PYTHON_IMAGE"] == LOCAL_BASE:
        # No registry: BuildKit could not fetch the frontend the `# syntax=` line names; its
        # built-in frontend (Docker 23+) reads every instruction here, RUN --mount included.
        stdin = "".join(dockerfile.splitlines(keepends=True)[1:])
        say("no registry: building without the `# syntax=` line (BuildKit's built-in frontend)")
    argv = [*engine.build, "--target", target, "--tag", tag]
    argv += ["--file", "-" if stdin else str(REPO / "Dockerfile")]
    for key, value in args.items():
        argv += ["--build-arg", f"{key}={value}"]
    env = dict(os.environ, DOCKER_BUILDKIT="1")
    started = time.monotonic()
    try:
        run([*argv, str(REPO)], env=env, input=stdin)
    finally:
        guard.close()
    took = time.monotonic() - started
    say(f"built {tag} (target {target}) with {engine.build[0]} in {took:.0f} s")
    return took


@dataclass(frozen=True)
class Layer:
    size: int
    created_by: str


def layers(engine: Engine, image: str) -> list[Layer]:
    """The image's layers, bottom first, with their uncompressed sizes (history entries that
    added no files are left out)."""
    done = quiet([engine.cli, "history", "--no-trunc", "--format", "json", image])
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    # podman prints one JSON array; docker one JSON object per line.
    text = done.stdout.strip()
    entries = (
        json.loads(text) if text.startswith("[") else [json.loads(x) for x in text.splitlines()]
    )
    found = []
    for entry in reversed(entries):
        size = entry.get("size", entry.get("Size", 0))
        size = int(size) if isinstance(size, int | float) else parse_size(str(size))
        created = str(entry.get("CreatedBy", entry.get("createdBy", entry.get("created_by", ""))))
        if size > 0:
            found.append(Layer(size, created))
    return found


def parse_size(text: str) -> int:
    """'1.2GB' / '512kB' / '0B' -> bytes (docker's history strings, decimal units)."""
    match = re.fullmatch(r"([\d.]+)\s*([kMGT]?B)", text.strip())
    if match is None:
        return 0
    scale = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}[match.group(2)]
    return int(float(match.group(1)) * scale)


def human(size: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError


def print_sizes(engine: Engine, image: str) -> list[Layer]:
    config = engine.inspect(image)
    found = layers(engine, image)
    say(f"{image}: {human(float(str(config.get('Size', 0))))} uncompressed, {len(found)} layers:")
    for layer in found:
        what = re.sub(r"\s+", " ", layer.created_by.removeprefix("/bin/sh -c "))
        print(f"    {human(layer.size):>9}  {what[:110]}", flush=True)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build_parser = sub.add_parser("build", help="build the image and print its sizes")
    build_parser.add_argument("--target", choices=("cpu", "cuda"), default="cpu")
    build_parser.add_argument("--tag", default=None, help="default posenc:TARGET")
    options = parser.parse_args()
    engine = find_engine()
    say(f"engine: {engine.build[0]} builds, {engine.cli} runs")
    tag = options.tag or f"posenc:{options.target}"
    build(engine, options.target, tag)
    print_sizes(engine, tag)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
