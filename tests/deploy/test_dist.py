"""The distributions as a user installs them (issue 33): `make dist` builds posenc's and
posenc-client's wheels and sdists; every file the packages read at run time ships in the wheel;
posenc's wheel, installed alone in a fresh virtual environment with the runtime lock
(requirements/image-cpu.txt: what `make serve` and the CPU image install, no test tools), serves
a table through its own `posenc serve` entry point, equal to the one this environment computes.

The fresh environment is installed with uv (in the suite's lock) from the package index and the
machine's torch wheel (`PIP_FIND_LINKS`, default /opt/wheels, as `make lock` reads it): uv's
cache links files, pip would copy the 1 GiB of torch (minutes). posenc-client's wheel alone is
tests/client/test_fresh_venv.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load

from posenc.encodings import compute, parse_spec
from tests.conftest import start_server_process

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("fresh_venv")]


def _run(*args: str | Path, cwd: Path = ROOT) -> str:
    done = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, cwd=cwd, check=False
    )
    assert done.returncode == 0, f"{' '.join(map(str, args))}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run("make", "--no-print-directory", "-s", "dist", f"DIST={out}")
    return out


def _tracked(*roots: str) -> set[str]:
    """Tracked files under `roots`, as package paths (`posenc/...`), .proto sources aside (the
    generated stubs ship; the .proto files are `make grpc-stubs`' input)."""
    listed = _run("git", "ls-files", *roots).split()
    out = set()
    for path in listed:
        if path.endswith(".proto"):
            continue
        for root in roots:
            if path.startswith(root + "/"):
                out.add(path.removeprefix(root + "/"))
    return out


def test_make_dist_builds_every_package_with_its_files(dist: Path) -> None:
    names = sorted(p.name for p in dist.iterdir() if not p.name.startswith("."))
    assert names == [
        "posenc-0.1.0-py3-none-any.whl",
        "posenc-0.1.0.tar.gz",
        "posenc_client-0.1.0-py3-none-any.whl",
        "posenc_client-0.1.0.tar.gz",
    ], names
    server = set(zipfile.ZipFile(dist / "posenc-0.1.0-py3-none-any.whl").namelist())
    need = {p for p in _tracked("service") if p.startswith("posenc/")}
    need |= {p for p in _tracked("clients/python/src") if p.startswith("posenc_check/")}
    assert need, "no tracked files found"
    assert need <= server, sorted(need - server)
    client = set(zipfile.ZipFile(dist / "posenc_client-0.1.0-py3-none-any.whl").namelist())
    need = _tracked("clients/python/src")
    assert need <= client, sorted(need - client)
    with tarfile.open(dist / "posenc-0.1.0.tar.gz") as sdist:
        members = set(sdist.getnames())
    assert {"posenc-0.1.0/pyproject.toml", "posenc-0.1.0/service/posenc/api/app.py"} <= members
    with tarfile.open(dist / "posenc_client-0.1.0.tar.gz") as sdist:
        members = set(sdist.getnames())
    assert "posenc_client-0.1.0/pyproject.toml" in members
    entry = zipfile.ZipFile(dist / "posenc-0.1.0-py3-none-any.whl").read(
        "posenc-0.1.0.dist-info/entry_points.txt"
    )
    assert b"posenc = posenc.cli:main" in entry


def test_the_server_wheel_alone_serves_a_table(dist: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    _run(base, "-m", "venv", venv)
    python = venv / "bin" / "python"
    uv = Path(sys.executable).with_name("uv")
    find_links = os.environ.get("PIP_FIND_LINKS", "/opt/wheels")
    _run(uv, "pip", "install", "--quiet", "--python", python, "--require-hashes", "--no-deps",
         "--find-links", find_links, "-r", ROOT / "requirements" / "image-cpu.txt")  # fmt: skip
    _run(uv, "pip", "install", "--quiet", "--python", python, "--no-deps",
         dist / "posenc-0.1.0-py3-none-any.whl")  # fmt: skip
    # the runtime only: neither the test tools nor the references are there
    absent = _run(python, "-c", "import importlib.util as u; print([m for m in "
                  "('pytest', 'transformers', 'posenc_client') if u.find_spec(m)])")  # fmt: skip
    assert absent.strip() == "[]", absent
    where = _run(python, "-c", "import posenc; print(posenc.__file__)")
    assert where.startswith(str(venv)), where  # the wheel's files, not this tree's

    proc = start_server_process(exe=venv / "bin" / "posenc")
    try:
        spec = {"kind": "rope", "head_dim": 64, "max_positions": 256, "rope_theta": 500000.0}
        with httpx.Client(base_url=proc.url, timeout=60) as client:
            assert client.get("/v2/health/ready").status_code == 200
            answer = client.post("/v1/tables", json=spec)
            # /docs offline: the runtime lock carries the bundles (fastapi-offline)
            bundles = [
                client.get(f"/docs/assets/{n}")
                for n in ("swagger-ui-bundle.js", "redoc.standalone.js")
            ]
        assert answer.status_code == 200, answer.text[:300]
        assert [b.status_code for b in bundles] == [200, 200]
        got = load(answer.content)
        want = compute(parse_spec(spec), torch.device("cpu")).tensors
        assert set(got) == set(want)
        assert all(torch.equal(got[name], want[name]) for name in want)
    finally:
        proc.stop()
