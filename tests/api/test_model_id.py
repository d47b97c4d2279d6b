"""`model_id` in POST /v1/resolve (`posenc.api.hub`): the server reads a Hugging Face model id's
config.json from its own Hugging Face cache (a local cache of the real configs in
tests/data/configs, `tests.hub`), offline (HF_HUB_OFFLINE) from the cache only, online from the
Hub (a loopback stand-in answering as the Hub does). Nothing reaches the network."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import start_server
from tests.hub import ERRORS, HubEnv, closed_port_url, hub_environment, model_files

MODELS = model_files()
LLAMA = "meta-llama/Llama-3.1-8B"


@pytest.fixture
def hub_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubEnv]:
    yield from hub_environment(tmp_path, monkeypatch)


def _resolve(client: httpx.Client, body: dict[str, Any]) -> httpx.Response:
    return client.post("/v1/resolve", json=body)


def _keys(answer: httpx.Response) -> list[tuple[str, str]]:
    assert answer.status_code == 200, answer.text
    return [(s["name"], s["key"]) for s in answer.json()["specs"]]


def _config(model_id: str, revision: str = "main") -> dict[str, Any]:
    data: dict[str, Any] = json.loads(MODELS[model_id][revision].read_text())
    return data


@pytest.mark.parametrize("model_id", sorted(MODELS))
def test_every_model_id_resolves_as_its_config(
    hub_env: HubEnv, client: httpx.Client, model_id: str
) -> None:
    """The same answer (status, specs or error) as the config.json sent as hf_config, plus
    `model: {id, commit}` naming the snapshot read."""
    by_config = _resolve(client, {"hf_config": _config(model_id)})
    by_id = _resolve(client, {"model_id": model_id})
    assert by_id.status_code == by_config.status_code
    if by_config.status_code != 200:
        assert by_id.json() == by_config.json()
        return
    assert by_id.json()["specs"] == by_config.json()["specs"]
    commit = hub_env.cache.commits[model_id]["main"]
    assert by_id.json()["model"] == {"id": model_id, "commit": commit}
    assert "model" not in by_config.json()


def test_revisions_and_overrides(hub_env: HubEnv, client: httpx.Client) -> None:
    commit = hub_env.cache.commits[LLAMA]["v5"]
    expected = _keys(_resolve(client, {"hf_config": _config(LLAMA, "v5"), "max_positions": 64}))
    for model_id in (f"{LLAMA}@v5", f"{LLAMA}@{commit}"):
        answer = _resolve(client, {"model_id": model_id, "max_positions": 64})
        assert _keys(answer) == expected
        assert answer.json()["model"] == {"id": model_id, "commit": commit}


@pytest.mark.parametrize(
    "value",
    ["llama", "a/b/c", "org/name@", "../etc/passwd", "org/na--me", 42, None, ["org/name"]],
)
def test_invalid_model_id(hub_env: HubEnv, client: httpx.Client, value: Any) -> None:
    """422 invalid_model_id naming the field, for anything not ORG/NAME[@REVISION]."""
    answer = _resolve(client, {"model_id": value})
    assert answer.status_code == 422
    body = answer.json()
    assert body["error_type"] == "invalid_model_id"
    assert body["detail"][0]["field"] == "model_id"


def test_model_id_beside_hf_config(hub_env: HubEnv, client: httpx.Client) -> None:
    answer = _resolve(client, {"model_id": LLAMA, "hf_config": _config(LLAMA)})
    assert answer.status_code == 422
    assert answer.json()["error_type"] == "invalid_model_id"
    assert "not both" in answer.json()["error"]


def test_not_cached_offline(hub_env: HubEnv, client: httpx.Client) -> None:
    """HF_HUB_OFFLINE: 404 model_not_cached naming the id and the server's cache."""
    for model_id in ("acme/not-cached", f"{LLAMA}@no-such-tag"):
        answer = _resolve(client, {"model_id": model_id})
        assert answer.status_code == 404
        body = answer.json()
        assert body["error_type"] == "model_not_cached"
        assert body["detail"][0] == {
            "field": "model_id",
            "message": body["detail"][0]["message"],
            "value": model_id,
        }
        assert model_id in body["error"]
        assert str(hub_env.cache.root) in body["error"]


def test_online_hub_errors(hub_env: HubEnv, client: httpx.Client) -> None:
    """Online, the Hub's refusals are 404 unknown_model with the reason; a cached revision
    answers from the cache."""
    hub_env.online(hub_env.fake.url)
    reasons = {
        "missing/repository": "no such repository",
        "gated/repository": "gated",
        f"{LLAMA}@no-such-branch": "no revision 'no-such-branch'",
        "no/config-json": "no config.json",
    }
    assert set(reasons) == set(ERRORS)
    for model_id, reason in reasons.items():
        answer = _resolve(client, {"model_id": model_id})
        assert answer.status_code == 404, answer.text
        assert answer.json()["error_type"] == "unknown_model"
        assert reason in answer.json()["error"]


def test_without_huggingface_hub(hub_env: HubEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """501 hub_not_installed, on a server of its own (the session server's metrics must count no
    5xx: test_errors.py)."""
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with start_server() as server, server.client() as client:
        answer = _resolve(client, {"model_id": LLAMA})
    assert answer.status_code == 501
    assert answer.json()["error_type"] == "hub_not_installed"
    assert "posenc[hub]" in answer.json()["error"]


def test_hub_unreachable(hub_env: HubEnv) -> None:
    """Online with the Hub refusing connections: a cached model answers from the cache, an
    uncached one is a 502 hub_unreachable naming the refusal (at once: `hub.hub_refuses` spares
    huggingface_hub's ~23 s of retries; on a server of its own, whose metrics may count a 5xx)."""
    hub_env.online(closed_port_url())
    with start_server() as server, server.client(timeout=120) as client:
        cached = _resolve(client, {"model_id": LLAMA})
        assert cached.json()["model"]["commit"] == hub_env.cache.commits[LLAMA]["main"]
        answer = _resolve(client, {"model_id": "acme/not-cached"})
    assert answer.status_code == 502
    body = answer.json()
    assert body["error_type"] == "hub_unreachable"
    assert "acme/not-cached" in body["error"]
    assert str(hub_env.cache.root) in body["error"]
    assert "refused)" in body["error"]


@pytest.mark.parametrize("side", ["server", "client"])
def test_hub_refuses_only_what_cannot_answer(
    hub_env: HubEnv, monkeypatch: pytest.MonkeyPatch, side: str
) -> None:
    """`hub_refuses`: a refused connection is a reason; a Hub that accepts connections, or one
    behind a proxy (which decides), is None: huggingface_hub asks it. Two copies, the server's
    (`posenc.api.hub`) and the client's (`posenc_client._hub`: the client never imports the
    server), held to the same answers."""
    if side == "server":
        from posenc.api.hub import hub_refuses
    else:
        from posenc_client._hub import hub_refuses

    url = closed_port_url()
    assert hub_refuses(url) == f"connection to 127.0.0.1:{url.rsplit(':', 1)[1]} refused"
    assert hub_refuses(hub_env.fake.url) is None
    assert hub_refuses("ftp://127.0.0.1:1") is None  # not a scheme it knows: the Hub client's
    monkeypatch.setenv("HTTP_PROXY", hub_env.fake.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert hub_refuses(url) is None


def test_client_maps_the_new_error_types(hub_env: HubEnv, client: httpx.Client) -> None:
    """The Python client's classes for the server's answers (`_exceptions._BY_ERROR_TYPE`)."""
    from posenc_client import InvalidSpecError, NotFoundError
    from posenc_client._exceptions import error_class

    assert issubclass(error_class(422, "invalid_model_id"), InvalidSpecError)
    assert issubclass(error_class(404, "model_not_cached"), NotFoundError)
    assert issubclass(error_class(404, "unknown_model"), NotFoundError)
