"""Fixtures of the client tests: a `Client` on the shared real server (tests/conftest.py), each
test with its own disk cache, and a session-wide client whose cache the end-to-end tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from posenc_client import Client
from tests.conftest import ServerHandle
from tests.hub import HubEnv, hub_environment


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def pclient(server: ServerHandle, cache_dir: Path) -> Iterator[Client]:
    """A client on the session server with an empty disk cache of its own."""
    with Client(server.url, cache=cache_dir, retries=0) as client:
        yield client


@pytest.fixture(scope="session")
def shared_client(
    server: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Client]:
    """One client (and disk cache) for the end-to-end tests."""
    with Client(server.url, cache=tmp_path_factory.mktemp("posenc-cache")) as client:
        yield client


@pytest.fixture
def hub_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubEnv]:
    """huggingface_hub offline on a local cache of the real configs (`tests.hub`)."""
    yield from hub_environment(tmp_path, monkeypatch)
