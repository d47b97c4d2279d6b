"""Compose files: structurally valid (a strict subset of the Compose Specification: the keys these
files use, with their types; a typo fails), and consistent with the image and the nginx config.
`docker compose config` would be the real check; no Docker CLI with Compose exists here."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy.support import DEPLOY, image_config

_STRINGS = {"type": "array", "items": {"type": "string"}}
_DURATION = {"type": "string", "pattern": r"^(\d+(ms|s|m|h))+$"}
_ENV = {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}}

SERVICE: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "build": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "context": {"type": "string"},
                "dockerfile": {"type": "string"},
                "target": {"type": "string"},
            },
        },
        "image": {"type": "string"},
        "env_file": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["path"],
                "properties": {"path": {"type": "string"}, "required": {"type": "boolean"}},
            },
        },
        "environment": _ENV,
        "ports": _STRINGS,
        "volumes": _STRINGS,
        "user": {"type": "string", "pattern": r"^\d+:\d+$"},
        "read_only": {"type": "boolean"},
        "tmpfs": _STRINGS,
        "cap_drop": _STRINGS,
        "security_opt": _STRINGS,
        "stop_grace_period": _DURATION,
        "restart": {"enum": ["no", "always", "on-failure", "unless-stopped"]},
        "depends_on": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "condition": {
                        "enum": [
                            "service_started",
                            "service_healthy",
                            "service_completed_successfully",
                        ]
                    }
                },
            },
        },
        "healthcheck": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "test": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                "interval": _DURATION,
                "timeout": _DURATION,
                "retries": {"type": "integer"},
                "start_period": _DURATION,
            },
        },
        "deploy": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "resources": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "reservations": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "devices": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "additionalProperties": False,
                                        "required": ["capabilities"],
                                        "properties": {
                                            "driver": {"type": "string"},
                                            "count": {
                                                "oneOf": [
                                                    {"type": "integer"},
                                                    {"const": "all"},
                                                ]
                                            },
                                            "capabilities": _STRINGS,
                                        },
                                    },
                                }
                            },
                        }
                    },
                }
            },
        },
    },
}

COMPOSE: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["services"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]*$"},
        "services": {"type": "object", "additionalProperties": SERVICE},
        "volumes": {"type": "object", "additionalProperties": {"type": ["object", "null"]}},
    },
}


def compose(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((DEPLOY / name).read_text(encoding="utf-8"))
    return document


@pytest.mark.parametrize("name", ["compose.yaml", "compose.gpu.yaml"])
def test_compose_file_is_structurally_valid(name: str) -> None:
    jsonschema.Draft202012Validator(COMPOSE).validate(compose(name))


def test_subset_schema_rejects_a_typo() -> None:
    broken = compose("compose.yaml")
    broken["services"]["posenc"]["healtcheck"] = broken["services"]["posenc"].pop("healthcheck")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(COMPOSE).validate(broken)


def test_cpu_service_matches_the_image() -> None:
    service = compose("compose.yaml")["services"]["posenc"]
    image = image_config("cpu")
    assert service["build"] == {"context": "..", "dockerfile": "Dockerfile", "target": "cpu"}
    assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
    assert service["user"] == image["user"]
    health = image["healthcheck"].args
    assert all(part in health for part in service["healthcheck"]["test"][1:])
    paths = [entry["path"] for entry in service["env_file"]]
    assert paths == ["./posenc.env.example", "./posenc.env"]
    assert service["env_file"][1]["required"] is False
    assert (DEPLOY / paths[0]).is_file()
    assert service["read_only"] is True
    assert "/tmp" in service["tmpfs"]


def test_cache_service_uses_the_shipped_nginx_config() -> None:
    cache = compose("compose.yaml")["services"]["cache"]
    (config,) = (v for v in cache["volumes"] if v.endswith(":/etc/nginx/nginx.conf:ro"))
    assert (DEPLOY / config.split(":", 1)[0]).resolve() == DEPLOY / "k8s" / "base" / "nginx.conf"
    assert any(v.endswith(":/var/cache/nginx") for v in cache["volumes"])
    assert cache["depends_on"] == {"posenc": {"condition": "service_healthy"}}
    nginx_conf = (DEPLOY / "k8s" / "base" / "nginx.conf").read_text(encoding="utf-8")
    # The upstream `posenc:8000` is the compose service name and its port.
    assert "server posenc:8000;" in nginx_conf
    assert "127.0.0.1:8000:8000" in compose("compose.yaml")["services"]["posenc"]["ports"]


def test_gpu_override_reserves_a_gpu() -> None:
    service = compose("compose.gpu.yaml")["services"]["posenc"]
    assert service["build"] == {"target": "cuda"}
    assert service["environment"]["POSENC_DEVICE"] == "cuda"
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
