"""Every `POSENC_` variable the deployment files set or document is a real setting, every setting
is documented in deploy/posenc.env.example, and the values shipped there and in the ConfigMaps load
through the server's own `Settings` class."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from posenc.api.settings import Settings
from posenc.presets import load_presets
from tests.deploy.support import DEPLOY, K8S, by_name, image_config, kustomize, yaml_documents

EXAMPLE = DEPLOY / "posenc.env.example"
FIELDS = {f"POSENC_{name.upper()}" for name in Settings.model_fields}


def env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as Compose and `docker run --env-file` read them (no quoting used)."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path}:{number}: {line!r}"
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", key), f"{path}:{number}: {line!r}"
        assert not value.startswith(("'", '"')), f"{path}:{number}: unquoted values only"
        values[key] = value
    return values


def load(values: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings read from the environment, exactly as a container reads them."""
    for key in [k for k in os.environ if k.startswith("POSENC_")]:
        monkeypatch.delenv(key)
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return Settings()


def _compose_environment() -> dict[str, str]:
    found: dict[str, str] = {}
    for name in ("compose.yaml", "compose.gpu.yaml"):
        document = yaml.safe_load((DEPLOY / name).read_text(encoding="utf-8"))
        for service in document["services"].values():
            found.update({k: str(v) for k, v in service.get("environment", {}).items()})
    return found


def _kserve_environment() -> dict[str, str]:
    (runtime,) = yaml_documents(K8S / "kserve" / "servingruntime.yaml")
    (container,) = runtime["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def _configmaps() -> dict[str, dict[str, Any]]:
    return {
        variant: by_name(kustomize(K8S / path))["ConfigMap/posenc-config"]["data"]
        for variant, path in (("base", "base"), ("gpu", "overlays/gpu"))
    }


def test_example_documents_every_setting() -> None:
    documented = env_file(EXAMPLE)
    assert set(documented) == FIELDS
    text = EXAMPLE.read_text(encoding="utf-8")
    for key in FIELDS:
        # Each variable has a comment right above it.
        assert re.search(rf"#[^\n]*\n{key}=", text), f"{key} has no comment"


def test_example_values_are_the_defaults_or_the_container_binding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded = load(env_file(EXAMPLE), monkeypatch)
    defaults = Settings.model_construct()
    for name in Settings.model_fields:
        if name == "host":
            assert loaded.host == "0.0.0.0"
        elif name == "grpc_port":  # off by default, on in the containers (Triton's port)
            assert loaded.grpc_port == 8001
        else:
            assert getattr(loaded, name) == getattr(defaults, name), name


@pytest.mark.parametrize(
    "source", ["compose", "kserve", "configmap-base", "configmap-gpu", "dockerfile"]
)
def test_deployment_variables_are_settings_and_load(
    source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if source == "compose":
        values = _compose_environment()
    elif source == "kserve":
        values = _kserve_environment()
    elif source == "dockerfile":
        values = {
            k: v
            for target in ("cpu", "cuda")
            for k, v in image_config(target)["env"].items()
            if k.startswith("POSENC_")
        }
    else:
        values = _configmaps()[source.removeprefix("configmap-")]
    posenc = {k: v for k, v in values.items() if k.startswith("POSENC_")}
    assert posenc, source
    assert set(posenc) <= FIELDS, set(posenc) - FIELDS
    if source != "dockerfile":
        load({**env_file(EXAMPLE), **posenc}, monkeypatch)


def test_secret_is_the_api_keys_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = by_name(kustomize(K8S / "base"))["Secret/posenc-api-keys"]["stringData"]
    assert set(secret) == {"POSENC_API_KEYS"} <= FIELDS
    # Empty means: no authentication.
    assert load(secret, monkeypatch).api_keys == []
    keys = load({"POSENC_API_KEYS": "k1,k2"}, monkeypatch).api_keys
    assert [k.get_secret_value() for k in keys] == ["k1", "k2"]


def test_compose_stop_grace_outlasts_the_drain() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))
    service = compose["services"]["posenc"]
    grace = re.fullmatch(r"(\d+)s", service["stop_grace_period"])
    assert grace is not None
    example = env_file(EXAMPLE)
    drain = float(example["POSENC_DRAIN_SECONDS"]) + float(example["POSENC_GRACE_SECONDS"])
    assert int(grace.group(1)) > drain


@pytest.mark.parametrize("variant", ["base", "gpu"])
def test_warmed_presets_exist(variant: str) -> None:
    names = _configmaps()[variant]["POSENC_WARM_PRESETS"].split(",")
    assert names
    assert set(names) <= set(load_presets())
