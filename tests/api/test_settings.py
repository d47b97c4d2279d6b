"""Settings: the environment (POSENC_*) is read in one place, lists accept both spellings."""

from __future__ import annotations

import json
import logging

import pytest
from pydantic import ValidationError

from posenc.api import Settings
from posenc.api.server import JsonFormatter


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "POSENC_DEVICE",
        "POSENC_API_KEYS",
        "POSENC_WARM_PRESETS",
        "POSENC_PORT",
        "POSENC_GRPC_PORT",
    ):
        monkeypatch.delenv(name, raising=False)
    s = Settings()
    assert (s.host, s.port, s.device) == ("127.0.0.1", 8000, "auto")
    assert s.grpc_port is None  # gRPC is off unless asked for
    assert s.api_keys == []
    assert s.warm_presets == []


def test_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSENC_DEVICE", "CUDA:1")
    monkeypatch.setenv("POSENC_API_KEYS", "alpha, beta")
    monkeypatch.setenv("POSENC_WARM_PRESETS", json.dumps(["llama-3.1-8b", "t5-base"]))
    monkeypatch.setenv("POSENC_CACHE_BYTES", "1048576")
    monkeypatch.setenv("POSENC_GRPC_PORT", "8001")
    s = Settings()
    assert s.grpc_port == 8001
    monkeypatch.setenv("POSENC_IN_FLIGHT_BYTES", str(1536 << 20))
    monkeypatch.setenv("POSENC_MAX_CONNECTIONS", "50")
    monkeypatch.setenv("POSENC_HEADER_TIMEOUT_SECONDS", "2.5")
    s = Settings()
    assert (s.in_flight_bytes, s.max_connections, s.header_timeout_seconds) == (1536 << 20, 50, 2.5)
    assert s.device == "cuda:1"
    assert [k.get_secret_value() for k in s.api_keys] == ["alpha", "beta"]
    assert "alpha" not in repr(s)  # keys are secrets
    assert s.warm_presets == ["llama-3.1-8b", "t5-base"]
    assert s.cache_bytes == 1 << 20
    assert Settings(device="cpu").device == "cpu"  # arguments override the environment


@pytest.mark.parametrize(
    "bad",
    [
        {"device": "gpu"},
        {"port": 70000},
        {"grpc_port": 70000},
        {"grpc_port": -1},
        {"cache_bytes": -1},
        {"api_keys": [""]},
        {"log_format": "xml"},
        {"in_flight_bytes": 1 << 20, "max_response_bytes": 2 << 20},
        {"max_connections": 0},
        {"max_header_bytes": 100},
        {"header_timeout_seconds": 0},
        {"body_timeout_seconds": -1},
        {"send_timeout_seconds": 0},
    ],
)
def test_invalid(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Settings(**bad)  # type: ignore[arg-type]


def test_json_log_lines() -> None:
    record = logging.LogRecord("posenc.api", logging.INFO, __file__, 1, "warmed %s", ("x",), None)
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "info"
    assert line["logger"] == "posenc.api"
    assert line["message"] == "warmed x"
