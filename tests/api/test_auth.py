"""API keys: /v1 and /v2/models need `Authorization: Bearer <key>` when keys are set; health,
server metadata and metrics stay open."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import ServerHandle, start_server

KEYS = ["first-key-0123456789", "second-key-abcdef"]


@pytest.fixture(scope="module")
def locked() -> Iterator[ServerHandle]:
    with start_server(api_keys=KEYS) as srv:
        yield srv


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/kinds", None),
        ("GET", "/v1/presets", None),
        ("GET", "/v1/presets/llama-3.1-8b", None),
        ("POST", "/v1/tables", {"kind": "alibi", "num_heads": 4}),
        ("POST", "/v1/resolve", {"model_type": "bloom", "n_head": 4}),
        ("GET", "/v1/tables/" + "0" * 64, None),
        ("GET", "/v2/models/rope", None),
        ("GET", "/v2/models/alibi/ready", None),
    ],
)
def test_model_routes_need_a_key(
    locked: ServerHandle, method: str, path: str, body: object
) -> None:
    with locked.client() as c:
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": f"Basic {KEYS[0]}"},
            {"Authorization": "Bearer"},
            {"Authorization": KEYS[0]},
        ):
            r = c.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, headers
            assert r.json()["error_type"] == "unauthorized"
            assert r.headers["www-authenticate"].startswith("Bearer")
        for key in KEYS:
            r = c.request(method, path, json=body, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code != 401


def test_health_metrics_and_docs_stay_open(locked: ServerHandle) -> None:
    with locked.client() as c:
        for path in (
            "/v2/health/live",
            "/v2/health/ready",
            "/v2",
            "/metrics",
            "/docs",
            "/openapi.json",
        ):
            assert c.get(path).status_code == 200, path


def test_no_keys_means_open(client: httpx.Client) -> None:
    assert client.get("/v1/kinds").status_code == 200
