"""Service settings: the only place posenc reads the environment (prefix `POSENC_`).

Lists (`POSENC_WARM_PRESETS`, `POSENC_API_KEYS`) accept a JSON array or a comma-separated string.
Sizes are bytes. Request bodies have three caps: `max_body_bytes` (specs, config.json),
`max_infer_body_bytes` (`/v2` infer requests: positions as tensors) and `max_upload_bytes`
(weight tables uploaded to `/v1/uploads`, models sent to `/v1/check/onnx`); `table_store_bytes`
bounds the uploaded tables kept.
Memory has two budgets: `cache_bytes` (resident tables and prepared bodies) and `in_flight_bytes`
(request bodies, tables and rows being computed, and bodies being sent outside the cache, over
`/v1`, `/v2` and gRPC; new work beyond it is a 503; the requests of one client address hold at
most `in_flight_bytes_per_peer` of it); the parsers of uploads are bounded by counts
read before they allocate (`max_upload_tensors`, `max_onnx_entries`).
Connections have caps (`max_connections`, `max_connections_per_peer`, `grpc_max_connections`),
timeouts (`*_timeout_seconds`) and a minimum send rate (`min_send_rate_bytes`): api/server.py and
api/grpc/service.py.
Byte sizes (the `*_bytes` fields) accept an integer or a size as people write it: `4GiB`,
`512MiB`, `1.5GB` (`parse_bytes`: binary `KiB`..`TiB`, decimal `kB`..`TB`).
`posenc serve` (`posenc/cli.py`) has one flag per field, generated from this class, overriding the
environment; `unknown_environment` names the `POSENC_*` variables no field (and no client
variable) reads. Tests pass values directly.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

MiB = 1 << 20
GiB = 1 << 30

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")

ENV_PREFIX = "POSENC_"

CLIENT_VARIABLES = frozenset(
    {
        "POSENC_URL",
        "POSENC_API_KEY",
        "POSENC_CACHE_DIR",
        "POSENC_CACHE_MAX_BYTES",
        "POSENC_OFFLINE",
    }
)
"""`POSENC_*` variables read by posenc-client (and its tests), not by the server: never warned
about."""

_SERVICE_LINK_RE = re.compile(r"^POSENC_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT_\d+_\w+)$")
"""The variables Kubernetes injects for a Service named `posenc` (`enableServiceLinks`)."""

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: Any) -> Any:
    """A byte count from `value`: an int as is, or a string `<number>[unit]` with the units
    people write (`4GiB`, `512MiB`, `1.5GB`, `1048576`, `100B`; case-insensitive; binary `KiB`,
    `MiB`, `GiB`, `TiB`; decimal `kB`, `MB`, `GB`, `TB`). A bare `k`/`m`/`g` is refused: Docker
    reads `512m` as MiB, others as MB. A size that is not a whole number of bytes, or an unknown
    unit, is a ValueError; other types go to int validation.
    """
    if not isinstance(value, str):
        return value
    match = _SIZE_RE.match(value)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"a byte size such as 4GiB, 512MiB, 1.5GB or 1048576 is expected, got {value!r}"
        )
    try:
        size = Decimal(match.group(1)) * _UNITS[unit]
    except InvalidOperation as err:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"not a number: {value!r}") from err
    if size != size.to_integral_value():
        raise ValueError(f"{value!r} is not a whole number of bytes")
    return int(size)


def format_bytes(size: int) -> str:
    """`size` in the largest binary unit that divides it exactly (`2GiB`, `256KiB`, `1000`)."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


Bytes = Annotated[int, BeforeValidator(parse_bytes)]
"""A byte count, read by `parse_bytes`."""


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

    host: str = Field("127.0.0.1", description="interface to bind (0.0.0.0: every interface)")
    port: Annotated[int, Field(ge=0, le=65535)] = Field(
        8000, description="TCP port of HTTP; 0 picks a free port"
    )
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
    cache_bytes: Annotated[Bytes, Field(ge=0)] = Field(
        2 * GiB, description="byte budget of resident tables and prepared bodies (LRU)"
    )
    in_flight_bytes: Annotated[Bytes, Field(ge=1)] = Field(
        1 * GiB,
        description="tables being computed plus response bodies being sent outside the cache; "
        "at least twice max_response_bytes; more answer 503 (Retry-After)",
    )
    in_flight_bytes_per_peer: Annotated[Bytes, Field(ge=1)] = Field(
        256 * MiB,
        description="one client address's share of in_flight_bytes: a request adding to what "
        "its address's other requests hold beyond it answers 503 (one request alone may exceed "
        "it; raise it to in_flight_bytes behind a proxy that funnels every client through a few "
        "addresses)",
    )
    max_response_bytes: Annotated[Bytes, Field(ge=1)] = Field(
        512 * MiB, description="largest table served; larger ones answer 413"
    )
    json_max_elements: Annotated[int, Field(ge=0)] = Field(
        1 << 18, description="largest table served as JSON, in elements"
    )
    max_body_bytes: Annotated[Bytes, Field(ge=1)] = Field(
        1 * MiB, description="largest request body (specs, config.json); more answer 413"
    )
    max_infer_body_bytes: Annotated[Bytes, Field(ge=1)] = Field(
        64 * MiB, description="largest /v2 infer request body (positions as tensors)"
    )
    max_upload_bytes: Annotated[Bytes, Field(ge=1)] = Field(
        256 * MiB,
        description="largest weight table uploaded to /v1/uploads or model sent to /v1/check/onnx",
    )
    table_store_bytes: Annotated[Bytes, Field(ge=0)] = Field(
        1 * GiB, description="byte budget of the uploaded weight tables kept"
    )
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
    max_concurrent_computations: Annotated[int, Field(ge=1)] = Field(
        4, description="tables computed at once; more wait, then answer 503"
    )
    retry_after_seconds: Annotated[int, Field(ge=1)] = Field(1, description="Retry-After of a 503")
    max_connections: Annotated[int, Field(ge=1)] = Field(
        1024, description="open connections; a connection beyond is answered 503 and closed"
    )
    max_connections_per_peer: Annotated[int, Field(ge=1)] = Field(
        256,
        description="open connections from one client address; one more is answered 503 and "
        "closed (raise it behind a proxy that funnels every client through a few addresses)",
    )
    max_header_bytes: Annotated[Bytes, Field(ge=1024)] = Field(
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
    min_send_rate_bytes: Annotated[Bytes, Field(ge=0)] = Field(
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
    presets_dir: str = Field(
        "",
        description="a directory of model config.json files (<name>.json or <name>/config.json) "
        "served as presets beside the built-in ones, warmable by name; none: built-in only",
    )
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="bearer keys /v1, /v2/models and /v2/repository need (comma-separated or a "
        "JSON array); none: open",
    )
    protect_docs_and_metrics: bool = Field(
        False,
        description="with api_keys: /metrics, /docs, /redoc and /openapi.json need a key too "
        "(health and GET /v2 stay open)",
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="text, or json (one object a line)"
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="critical, error, warning, info or debug"
    )
    drain_seconds: Annotated[float, Field(ge=0.0)] = Field(
        5.0, description="after SIGTERM, seconds readiness answers 503 before the server closes"
    )
    grace_seconds: Annotated[float, Field(ge=0.0)] = Field(
        30.0, description="seconds in-flight requests get to finish at shutdown"
    )
    known_keys: Annotated[int, Field(ge=1)] = Field(
        1 << 16, description="table keys remembered for GET /v1/tables/{key} (LRU)"
    )
    hot_routes: bool = Field(
        True,
        description="serve GET/POST /v1/tables and /v2 infer without FastAPI's dispatch "
        "(`api/hot.py`; the responses are the same either way)",
    )
    prepared_answers: bool = Field(
        True,
        description="answer a repeated /v1/tables cache hit from its headers and body built "
        "once, and a repeated /v2 decode step (HTTP, gRPC unary or stream) from a template of "
        "its answer (`api/serving/prepared.py`, `api/oip/steps.py`, `api/grpc/steps.py`; the "
        "responses are the same either way)",
    )
    fused_kernels: bool = Field(
        True,
        description="on a CUDA device with triton, compute RoPE and sinusoidal tables with one "
        "fused kernel (`encodings/fused.py`: bit-identical to torch's ops, fewer launches); "
        "false keeps torch's ops",
    )
    root_path: str = Field(
        "",
        description="path prefix a reverse proxy serves posenc under (uvicorn's root_path, e.g. "
        "/posenc): links, redirects and the OpenAPI document carry it",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="origins browsers may call posenc from (CORS; comma-separated or a JSON "
        "array, * for any); none: no CORS headers",
    )
    otel: bool = Field(
        False,
        description="FastAPI's native OpenTelemetry tracing, metrics and logs (needs a configured "
        "OpenTelemetry SDK); off, requests skip its per-request provider checks",
    )

    @field_validator("warm_presets", "api_keys", "cors_origins", mode="before")
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

    @field_validator("root_path")
    @classmethod
    def _root_path(cls, value: str) -> str:
        path = value.strip().rstrip("/")
        if path and not path.startswith("/"):
            raise ValueError(f"must be empty or start with '/', got {value!r}")
        return path

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


def env_name(field: str) -> str:
    """The environment variable of a `Settings` field: `POSENC_<FIELD>`."""
    return ENV_PREFIX + field.upper()


def unknown_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """One warning per `POSENC_*` variable of `environ` (the process environment when omitted)
    that no `Settings` field reads and posenc-client does not either, naming the closest valid
    variable (difflib) when there is one."""
    env = os.environ if environ is None else environ
    known = [env_name(name) for name in Settings.model_fields]
    warnings = []
    links = []
    for name in sorted(env):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known or upper in CLIENT_VARIABLES:
            continue
        if _SERVICE_LINK_RE.match(upper):
            links.append(name)
            continue
        # compared without the prefix, which every name shares
        fields = [k.removeprefix(ENV_PREFIX) for k in known]
        close = difflib.get_close_matches(upper.removeprefix(ENV_PREFIX), fields, n=1)
        hint = f"; did you mean {ENV_PREFIX}{close[0]}?" if close else ""
        warnings.append(f"unknown environment variable {name} is ignored{hint}")
    if links:
        warnings.append(
            f"environment variables {', '.join(links)} are ignored: Kubernetes service links of "
            "a Service named posenc (they also set POSENC_PORT to tcp://...); set "
            "enableServiceLinks: false on the pod"
        )
    return warnings
