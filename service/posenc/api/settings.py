"""Service settings: the only place posenc reads the environment (prefix `POSENC_`).

Lists (`POSENC_WARM_PRESETS`, `POSENC_API_KEYS`) accept a JSON array or a comma-separated string.
Sizes are bytes. Request bodies have three caps: `max_body_bytes` (specs, config.json),
`max_infer_body_bytes` (`/v2` infer requests: positions as tensors) and `max_upload_bytes`
(weight tables uploaded to `/v1/uploads`, models sent to `/v1/check/onnx`); `table_store_bytes`
bounds the uploaded tables kept.
Memory has two budgets: `cache_bytes` (resident tables and prepared bodies) and `in_flight_bytes`
(request bodies, tables and rows being computed, and bodies being sent outside the cache, over
`/v1`, `/v2` and gRPC; new work beyond it is a 503); the parsers of uploads are bounded by counts
read before they allocate (`max_upload_tensors`, `max_onnx_entries`).
Connections have caps (`max_connections`, `max_connections_per_peer`, `grpc_max_connections`),
timeouts (`*_timeout_seconds`) and a minimum send rate (`min_send_rate_bytes`): api/server.py and
api/grpc/service.py.
`posenc serve` flags override the environment; tests pass values directly.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

MiB = 1 << 20
GiB = 1 << 30

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def _split(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            import json

            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    """Configuration of one posenc server process (environment variables `POSENC_<NAME>`)."""

    model_config = SettingsConfigDict(env_prefix="POSENC_", extra="ignore", frozen=True)

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8000
    grpc_port: Annotated[int | None, Field(ge=0, le=65535)] = Field(
        None,
        description="port of the Open Inference Protocol over gRPC (`inference."
        "GRPCInferenceService`, on `host`); off when unset, 0 picks a free port",
    )
    grpc_max_connections: Annotated[int, Field(ge=1)] = Field(
        256,
        description="open gRPC connections (grpc core's connection quota); one more is closed at "
        "once, so idle gRPC sockets cannot take the file descriptors HTTP needs",
    )
    grpc_max_concurrent_streams: Annotated[int, Field(ge=1)] = Field(
        32, description="calls in progress on one gRPC connection (HTTP/2 SETTINGS)"
    )
    grpc_idle_timeout_seconds: Annotated[float, Field(gt=0.0)] = Field(
        60.0, description="a gRPC connection with no call for this long is closed (GOAWAY)"
    )
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N")
    cache_bytes: Annotated[int, Field(ge=0)] = 2 * GiB
    in_flight_bytes: Annotated[int, Field(ge=1)] = Field(
        1 * GiB,
        description="tables being computed plus response bodies being sent outside the cache; "
        "at least twice max_response_bytes; more answer 503 (Retry-After)",
    )
    max_response_bytes: Annotated[int, Field(ge=1)] = 512 * MiB
    json_max_elements: Annotated[int, Field(ge=0)] = 1 << 18
    max_body_bytes: Annotated[int, Field(ge=1)] = 1 * MiB
    max_infer_body_bytes: Annotated[int, Field(ge=1)] = 64 * MiB
    max_upload_bytes: Annotated[int, Field(ge=1)] = 256 * MiB
    table_store_bytes: Annotated[int, Field(ge=0)] = 1 * GiB
    max_upload_tensors: Annotated[int, Field(ge=1)] = Field(
        1024,
        description="tensors a safetensors upload may declare, counted from its header (at most "
        "1 KiB of header per tensor) before the file is read; more answer 413",
    )
    max_onnx_entries: Annotated[int, Field(ge=1)] = Field(
        1 << 18,
        description="nodes, initializers, attributes and other entries of a model sent to "
        "/v1/check/onnx (subgraphs and functions included), counted from its bytes before it "
        "is parsed; more answer 413",
    )
    max_concurrent_computations: Annotated[int, Field(ge=1)] = 4
    retry_after_seconds: Annotated[int, Field(ge=1)] = 1
    max_connections: Annotated[int, Field(ge=1)] = Field(
        1024, description="open connections; a connection beyond is answered 503 and closed"
    )
    max_connections_per_peer: Annotated[int, Field(ge=1)] = Field(
        256,
        description="open connections from one client address; one more is answered 503 and "
        "closed (raise it behind a proxy that funnels every client through a few addresses)",
    )
    max_header_bytes: Annotated[int, Field(ge=1024)] = Field(
        64 * 1024, description="request line and headers of one request; more answer 431"
    )
    header_timeout_seconds: Annotated[float, Field(gt=0.0)] = Field(
        10.0, description="from a connection's (or request's) first byte to its complete headers"
    )
    body_timeout_seconds: Annotated[float, Field(gt=0.0)] = Field(
        60.0, description="from a request's headers to its complete body"
    )
    idle_timeout_seconds: Annotated[float, Field(gt=0.0)] = Field(
        5.0, description="a keep-alive connection idle between requests is closed"
    )
    send_timeout_seconds: Annotated[float, Field(gt=0.0)] = Field(
        30.0, description="a response whose client reads nothing for this long is cut"
    )
    min_send_rate_bytes: Annotated[int, Field(ge=0)] = Field(
        256 * 1024,
        description="bytes per second a client must read of a response that waits on it, over "
        "each send_rate_window_seconds; a slower reader is cut and its in-flight charge freed "
        "(0: off)",
    )
    send_rate_window_seconds: Annotated[float, Field(gt=0.0)] = Field(
        10.0, description="the window over which min_send_rate_bytes is measured"
    )
    warm_presets: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="preset names to compute at start-up, or 'all'"
    )
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    protect_docs_and_metrics: bool = Field(
        False,
        description="with api_keys: /metrics, /docs, /redoc and /openapi.json need a key too "
        "(health and GET /v2 stay open)",
    )
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    drain_seconds: Annotated[float, Field(ge=0.0)] = 5.0
    grace_seconds: Annotated[float, Field(ge=0.0)] = 30.0
    known_keys: Annotated[int, Field(ge=1)] = 1 << 16
    hot_routes: bool = Field(
        True,
        description="serve GET/POST /v1/tables and /v2 infer without FastAPI's dispatch "
        "(`api/hot.py`; the responses are the same either way)",
    )
    otel: bool = Field(
        False,
        description="FastAPI's native OpenTelemetry tracing, metrics and logs (needs a configured "
        "OpenTelemetry SDK); off, requests skip its per-request provider checks",
    )

    @field_validator("warm_presets", "api_keys", mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _split(value)

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        name = value.strip().lower()
        if not _DEVICE_RE.match(name):
            raise ValueError(f"must be auto, cpu, cuda or cuda:N, got {value!r}")
        return name

    @model_validator(mode="after")
    def _keys(self) -> Settings:
        if any(not k.get_secret_value() for k in self.api_keys):
            raise ValueError("api_keys must not contain empty keys")
        if self.protect_docs_and_metrics and not self.api_keys:
            raise ValueError("protect_docs_and_metrics needs api_keys (there is no key to ask)")
        return self

    @model_validator(mode="after")
    def _budgets(self) -> Settings:
        # the largest table must fit the in-flight budget, or it could never be served: one too
        # large for the cache is charged twice while a body built from it is sent (the tensors,
        # kept alive by the send, and the body)
        if self.in_flight_bytes < 2 * self.max_response_bytes:
            raise ValueError(
                f"in_flight_bytes ({self.in_flight_bytes}) must be at least twice "
                f"max_response_bytes ({self.max_response_bytes}): a table too large for the cache "
                "and the body built from it are both charged to it while sent"
            )
        return self
