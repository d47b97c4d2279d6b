"""The catalog of `error_type`s: every error the service sends, as a typed record (its name, its
HTTP status and when it is sent).

`ApiError` is raised with one of these records, the domain errors' `error_type`s
(`posenc.encodings.errors`, `posenc.onnx`) are records here too, and every route declares the
records it can answer (`responses(...)` in its decorator: the OpenAPI document lists them per
status, each with its summary). The client maps every name to an exception class
(`posenc_client._exceptions`); its test reads this catalog. A new error is one record here, its
client class and its tests.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ErrorType:
    """One `error_type`: its `name`, `status` (the HTTP status it is sent with; `statuses` lists
    every one it may take, the first the default) and `summary` (when it is sent)."""

    name: str
    statuses: tuple[int, ...]
    summary: str

    @property
    def status(self) -> int:
        return self.statuses[0]


ERROR_TYPES: dict[str, ErrorType] = {}
"""Every `error_type` the service sends, by name."""


def _error(name: str, status: int | tuple[int, ...], summary: str) -> ErrorType:
    if name in ERROR_TYPES:
        raise ValueError(f"error_type {name!r} registered twice")
    if ";" in summary:  # `responses` joins the summaries of one status with "; "
        raise ValueError(f"error_type {name!r}: a summary without ';'")
    statuses = status if isinstance(status, tuple) else (status,)
    record = ERROR_TYPES[name] = ErrorType(name, statuses, summary)
    return record


# 400: the request is malformed
BAD_REQUEST = _error("bad_request", 400, "a malformed HTTP request")
INVALID_JSON = _error("invalid_json", 400, "the body is not one JSON object")
UNKNOWN_FORMAT = _error("unknown_format", 400, "`format` names no format served here")
UNKNOWN_TENSOR = _error("unknown_tensor", 400, "`tensor` names no tensor of the table or file")
TENSOR_REQUIRED = _error(
    "tensor_required", 400, "one tensor is sent but there are several: add tensor=NAME"
)
UNSUPPORTED_DTYPE = _error(
    "unsupported_dtype", 400, "a numpy format asked for a dtype numpy lacks (bfloat16)"
)
INVALID_ROWS = _error("invalid_rows", 400, "`rows` malformed or outside the table's positions")
ROWS_UNSUPPORTED = _error("rows_unsupported", 400, "`rows` on tensors without a position axis")
INVALID_MAX_POINTS = _error(
    "invalid_max_points", 400, "`max_points` not an integer from 1 to json_max_elements"
)
INVALID_POOL = _error("invalid_pool", 400, "`pool` of a preview neither `none` nor `block`")
INVALID_MINUS = _error(
    "invalid_minus",
    400,
    "`minus` of a preview names a table of another kind, or one whose tensor differs in shape",
)
INVALID_DEVICE = _error("invalid_device", 400, "`device` of a table request other than `cpu`")
INVALID_TABLE_URL = _error(
    "invalid_table_url",
    (400, 414),
    "a table URL's key or spec part is malformed (414: its spec part over 4096 characters)",
)
KEY_MISMATCH = _error(
    "key_mismatch", 400, "the spec a table URL carries does not have the URL's content key"
)
AMBIGUOUS_CONFIG = _error(
    "ambiguous_config",
    400,
    "a config or preset with several tables: pick one (the detail says how)",
)
INVALID_TABLE = _error("invalid_table", 400, "an upload that is not one real (N, D) table")
INVALID_MODEL = _error(
    "invalid_model", 400, "not an ONNX model, or a baked cache that is not a (P, d/2) table"
)
# 401, 403, 404, 405, 406
UNAUTHORIZED = _error("unauthorized", 401, "a missing or invalid bearer key")
FORBIDDEN = _error("forbidden", 403, "forbidden")
NOT_FOUND = _error("not_found", 404, "no such route or file")
UNKNOWN_KEY = _error("unknown_key", 404, "a content or export key this server does not know")
UNKNOWN_PRESET = _error("unknown_preset", 404, "no preset of this name (GET /v1/presets)")
UNKNOWN_PRESET_PART = _error("unknown_preset_part", 404, "the preset has no part of this name")
UNKNOWN_TABLE = _error("unknown_table", 404, "no uploaded table with this key in the store")
UNKNOWN_MODEL = _error(
    "unknown_model",
    404,
    "`model_id` names no Hub repository, revision or config.json the server can read (or gated)",
)
MODEL_NOT_CACHED = _error(
    "model_not_cached",
    404,
    "the server is offline (HF_HUB_OFFLINE) and its Hugging Face cache lacks the `model_id`",
)
METHOD_NOT_ALLOWED = _error("method_not_allowed", 405, "a method the path does not take (Allow)")
NOT_ACCEPTABLE = _error("not_acceptable", 406, "Accept names no format served")
# 413 and the other size limits
TOO_LARGE = _error(
    "too_large", 413, "the table (or an upload) over its limit (the detail names size and limit)"
)
TOO_LARGE_FOR_JSON = _error(
    "too_large_for_json", 413, "a JSON table over json_max_elements: use a binary format"
)
BODY_TOO_LARGE = _error(
    "body_too_large", 413, "the request body over its route's cap (Content-Length or streamed)"
)
TOO_MANY_TENSORS = _error(
    "too_many_tensors", 413, "an uploaded safetensors header declaring too many tensors"
)
TOO_MANY_ENTRIES = _error(
    "too_many_entries", 413, "a model sent to the check holding too many graph entries"
)
UNSUPPORTED_MEDIA_TYPE = _error(
    "unsupported_media_type", 415, "a Content-Encoding other than identity"
)
RANGE_NOT_SATISFIABLE = _error(
    "range_not_satisfiable", 416, "a Range outside the raw body (Content-Range: bytes */size)"
)
# 422: well-formed but invalid
INVALID_REQUEST = _error("invalid_request", 422, "invalid path or query parameters")
INVALID_SPEC = _error("invalid_spec", 422, "an invalid spec: the detail lists each field")
UNKNOWN_KIND = _error("unknown_kind", 422, "a spec of no known kind (GET /v1/kinds)")
UNSUPPORTED_CONFIG = _error(
    "unsupported_config", 422, "a config.json posenc cannot map exactly (the field and reason)"
)
UNSUPPORTED_EXPORT = _error(
    "unsupported_export", 422, "a spec and export options naming no graph posenc builds"
)
INVALID_MODEL_ID = _error(
    "invalid_model_id", 422, "`model_id` not a string ORG/NAME[@REVISION], or beside hf_config"
)
NO_ROPE_CACHES = _error("no_rope_caches", 422, "the model holds no RoPE cache to check")
SITE_LIMIT = _error("site_limit", 422, "the model holds more cache sites than the check reads")
# 5xx
INTERNAL_ERROR = _error("internal_error", 500, "a bug (logged with its traceback)")
EXPORT = _error("export", 500, "a graph failed verification (logged, never sent as wrong)")
HUB_NOT_INSTALLED = _error(
    "hub_not_installed", 501, "a `model_id` on a server without huggingface_hub (posenc[hub])"
)
HUB_UNREACHABLE = _error(
    "hub_unreachable", 502, "the Hugging Face Hub unreachable for a `model_id` the cache lacks"
)
UNAVAILABLE = _error("unavailable", 503, "unavailable")
BUSY = _error("busy", 503, "too many computations in flight (Retry-After)")
OVERLOADED = _error("overloaded", 503, "the in-flight byte budget is spent (Retry-After)")
STARTING = _error("starting", 503, "the server is starting or stopping (Retry-After)")
NOT_READY = _error("not_ready", 503, "warming up or draining")
# answered by the HTTP server itself (`api/server.py`), before any route
TOO_MANY_CONNECTIONS = _error(
    "too_many_connections", 503, "over max_connections (or per peer), the connection closed"
)
REQUEST_TIMEOUT = _error("request_timeout", 408, "the request's head or body came too slowly")
HEADERS_TOO_LARGE = _error("headers_too_large", 431, "request line and headers over the cap")

BY_STATUS: dict[int, ErrorType] = {
    e.status: e
    for e in (
        BAD_REQUEST,
        UNAUTHORIZED,
        FORBIDDEN,
        NOT_FOUND,
        METHOD_NOT_ALLOWED,
        NOT_ACCEPTABLE,
        TOO_LARGE,
        UNSUPPORTED_MEDIA_TYPE,
        RANGE_NOT_SATISFIABLE,
        INVALID_REQUEST,
        UNAVAILABLE,
    )
}
"""The generic `error_type` of an HTTP status Starlette raises itself (404 unknown route, ...)."""

HTTP_ERROR = "http_error"
"""The `error_type` of any other status Starlette raises (none is expected)."""

# the errors several routes share
BODY: tuple[ErrorType, ...] = (BODY_TOO_LARGE, UNSUPPORTED_MEDIA_TYPE, INVALID_JSON)
"""A route reading a JSON body."""
SPEC: tuple[ErrorType, ...] = (INVALID_SPEC, UNKNOWN_KIND, UNSUPPORTED_CONFIG, AMBIGUOUS_CONFIG)
SPEC += (UNKNOWN_PRESET, UNKNOWN_PRESET_PART, UNKNOWN_TABLE)
"""A route taking a spec object (fields, a config or a preset; an uploaded table by key)."""
MODEL_ID: tuple[ErrorType, ...] = (INVALID_MODEL_ID, UNKNOWN_MODEL, MODEL_NOT_CACHED)
MODEL_ID += (HUB_NOT_INSTALLED, HUB_UNREACHABLE)
"""A route taking a Hugging Face `model_id` (`api.hub`)."""
COMPUTE: tuple[ErrorType, ...] = (BUSY, OVERLOADED, STARTING)
"""A route computing (or looking up) a table."""
TABLE: tuple[ErrorType, ...] = (
    UNKNOWN_FORMAT,
    NOT_ACCEPTABLE,
    UNKNOWN_TENSOR,
    TENSOR_REQUIRED,
    UNSUPPORTED_DTYPE,
)
TABLE += (INVALID_ROWS, ROWS_UNSUPPORTED, TOO_LARGE, TOO_LARGE_FOR_JSON, RANGE_NOT_SATISFIABLE)
TABLE += (INVALID_DEVICE,)
"""A route sending a table representation (`serving.table.serve_table`)."""
TABLE_URL: tuple[ErrorType, ...] = (
    INVALID_TABLE_URL,
    KEY_MISMATCH,
    UNKNOWN_KEY,
    INVALID_SPEC,
    UNKNOWN_KIND,
)
"""A route naming a table by its URL (`/v1/tables/{key}[.{spec}]`)."""


def responses(
    *groups: ErrorType | Iterable[ErrorType], model: str = "Error"
) -> dict[int | str, dict[str, Any]]:
    """A route's error responses for its decorator (`responses=`): each status it may answer,
    described by every error_type it may send with it, with the error body `model` (`Error`,
    or `OipError` on the /v2 models)."""
    errors: dict[str, ErrorType] = {}
    for group in groups:
        for error in (group,) if isinstance(group, ErrorType) else group:
            errors[error.name] = error
    by_status: dict[int, list[ErrorType]] = {}
    for error in errors.values():
        for status in error.statuses:
            by_status.setdefault(status, []).append(error)
    ref = {"$ref": f"#/components/schemas/{model}"}
    return {
        status: {
            "description": "; ".join(f"{e.name}: {e.summary}" for e in found),
            "content": {"application/json": {"schema": ref}},
        }
        for status, found in sorted(by_status.items())
    }
