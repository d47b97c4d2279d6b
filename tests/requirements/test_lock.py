"""The lock files (requirements/*.txt, written by `make lock`) are what every environment installs:
each pins every package with its hashes, satisfies the ranges pyproject.toml claims, agrees with
the other environments on every shared package, and the suite's own environment is exactly the
suite's lock. `posenc.verified.VERIFIED_AGAINST` names the lock's reference releases."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from posenc.verified import VERIFIED_AGAINST, verified_against_text

REPO = Path(__file__).resolve().parents[2]
LOCKS = REPO / "requirements"
ENVIRONMENTS = ("suite", "image-cpu", "image-cuda", "client")
# Resolved in the suite's lock but left out of it (`--no-emit-package`): timm's torchvision has no
# CPU build here, and the tests use only timm.layers.
NOT_EMITTED = frozenset({"torchvision"})

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def read_lock(name: str) -> dict[str, tuple[Version, list[str]]]:
    """Canonical package name -> (pinned version, sha256 hashes) in `requirements/<name>.txt`."""
    pins: dict[str, tuple[Version, list[str]]] = {}
    current: str | None = None
    for raw in (LOCKS / f"{name}.txt").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _PIN.match(line)
        if match:
            current = canonicalize_name(match.group(1))
            assert current not in pins, f"{name}: {current} pinned twice"
            pins[current] = (Version(match.group(2)), [])
        elif line.startswith("--hash=sha256:"):
            assert current is not None, f"{name}: a hash before any pin"
            pins[current][1].append(line.removeprefix("--hash=sha256:").rstrip(" \\"))
        else:
            raise AssertionError(f"{name}: not a pin or a hash: {line[:80]!r}")
    return pins


def project(path: Path) -> dict[str, object]:
    data: dict[str, object] = tomllib.loads(path.read_text(encoding="utf-8"))["project"]
    return data


SERVICE = project(REPO / "pyproject.toml")
CLIENT = project(REPO / "clients" / "python" / "pyproject.toml")


def claims(proj: dict[str, object], extras: tuple[str, ...]) -> list[Requirement]:
    """The requirements pyproject.toml states for its dependencies plus `extras`."""
    found = [Requirement(r) for r in proj["dependencies"]]  # type: ignore[attr-defined]
    optional = proj.get("optional-dependencies", {})
    for extra in extras:
        found.extend(Requirement(r) for r in optional[extra])  # type: ignore[index]
    return found


CLAIMS = {
    "suite": [*claims(SERVICE, ("cpu", "test")), *claims(CLIENT, ("onnx",))],
    "image-cpu": claims(SERVICE, ("cpu",)),
    "image-cuda": claims(SERVICE, ("gpu",)),
    "client": claims(CLIENT, ()),
}


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_every_package_is_pinned_with_hashes(env: str) -> None:
    pins = read_lock(env)
    assert pins
    for name, (_, hashes) in pins.items():
        assert hashes, f"{env}: {name} has no hash"
        assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), name


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_lock_satisfies_what_pyproject_claims(env: str) -> None:
    """Every dependency pyproject.toml states is pinned, at a version inside its stated range."""
    pins = read_lock(env)
    for requirement in CLAIMS[env]:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{env}: {name} is not locked"
        version = pins[name][0]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{env}: {name}=={version} is outside pyproject's {requirement.specifier}"
        )
        for extra in requirement.extras:  # uvicorn[standard]: its extra's packages are locked too
            wanted = metadata.requires(requirement.name) if env == "suite" else None
            for line in wanted or []:
                extra_requirement = Requirement(line)
                marker = extra_requirement.marker
                if marker is not None and marker.evaluate({"extra": extra}):
                    assert canonicalize_name(extra_requirement.name) in pins, line


def test_torch_builds() -> None:
    """The suite and the cpu image pin torch's CPU build, the cuda image PyPI's CUDA build with
    its CUDA libraries; onnxruntime likewise (the CPU package, or onnxruntime-gpu)."""
    suite, cpu, cuda = read_lock("suite"), read_lock("image-cpu"), read_lock("image-cuda")
    assert suite["torch"][0].local == cpu["torch"][0].local == "cpu"
    assert cuda["torch"][0].local is None
    assert cuda["torch"][0].public == suite["torch"][0].public
    assert any(name.startswith("nvidia-cuda-runtime") for name in cuda)
    assert not any(name.startswith("nvidia-") for name in [*suite, *cpu])
    assert "onnxruntime" in cpu
    assert "onnxruntime-gpu" not in cpu
    assert "onnxruntime-gpu" in cuda
    assert "onnxruntime" not in cuda


def test_environments_agree_on_shared_packages() -> None:
    """The images ship the releases the suite tested: a package pinned in two locks has one
    version (torch's CPU and CUDA builds share their release)."""
    locks = {env: read_lock(env) for env in ENVIRONMENTS}
    for env, pins in locks.items():
        for name, (version, _) in pins.items():
            in_suite = locks["suite"].get(name)
            if in_suite is not None:
                assert version.public == in_suite[0].public, f"{env} {name}: {version}"


def test_this_environment_is_the_suite_lock() -> None:
    """What `make venv` installed is exactly the lock: every pinned package at its version."""
    for name, (version, _) in read_lock("suite").items():
        assert Version(metadata.version(name)) == version, name
    for name in NOT_EMITTED:
        assert name not in read_lock("suite")


def test_the_venv_recipe_installs_from_the_lock_only() -> None:
    """Every pip install of `make venv` is either the hash-checked lock or the two projects
    without dependencies and without build isolation (their backend comes from the lock)."""
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("$(STAMP): ", 1)[1].split("\n\n", 1)[0]
    installs = [line.strip() for line in recipe.splitlines() if "pip install" in line]
    assert len(installs) == 2
    assert "--require-hashes --no-deps" in installs[0]
    assert installs[0].endswith("-r requirements/suite.txt")
    assert "--no-deps --no-build-isolation -e . -e clients/python" in installs[1]


def test_verified_against_names_the_locked_references() -> None:
    suite = read_lock("suite")
    for name, release in VERIFIED_AGAINST.items():
        assert suite[canonicalize_name(name)][0].public == release, name
    assert verified_against_text().startswith(f"transformers {VERIFIED_AGAINST['transformers']}")


def test_readme_names_the_verified_releases() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"Proven against: {verified_against_text()} (the lock's" in " ".join(readme.split())


def test_optimum_lock_stands_apart() -> None:
    """`make optimum-check`'s environment (requirements/optimum.txt) is hashed like the others
    but resolved apart from the suite's pins: optimum-onnx needs transformers<4.58."""
    pins = read_lock("optimum")
    for name, (_, hashes) in pins.items():
        assert hashes, f"optimum: {name} has no hash"
    assert "optimum-onnx" in pins
    assert pins["torch"][0].local == "cpu"
    assert pins["transformers"][0] < Version("4.58")
    assert read_lock("suite")["transformers"][0] >= Version("4.58")


def test_vllm_lock_adds_to_the_suite() -> None:
    """`make vllm-check`'s lock (requirements/vllm.txt) is hashed like the others and installs
    on top of the suite's lock: vLLM's wheel and what its import needs, no package the suite
    pins (so neither moves the other; torch stays the suite's CPU build)."""
    pins = read_lock("vllm")
    for name, (_, hashes) in pins.items():
        assert hashes, f"vllm: {name} has no hash"
    assert "vllm" in pins
    assert not set(pins) & set(read_lock("suite")), set(pins) & set(read_lock("suite"))


def test_gguf_lock_adds_to_the_suite() -> None:
    """`make gguf-check`'s lock (requirements/gguf.txt) is hashed like the others and resolved
    against the suite's pins: llama-cpp-python and its diskcache added, every package the suite
    also pins (numpy, jinja2, markupsafe, typing-extensions) at the suite's release."""
    pins = read_lock("gguf")
    suite = read_lock("suite")
    for name, (version, hashes) in pins.items():
        assert hashes, f"gguf: {name} has no hash"
        if name in suite:
            assert version == suite[name][0], f"gguf {name}: {version}"
    assert set(pins) - set(suite) == {"llama-cpp-python", "diskcache"}
