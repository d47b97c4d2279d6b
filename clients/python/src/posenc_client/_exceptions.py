"""Exceptions raised by posenc-client. Server errors mirror the server's `error_type`s.

    PosencError ................................ root of everything this package raises
    ├── TransportError ......................... no usable HTTP answer (after the retries)
    │   ├── ConnectError ....................... cannot connect (refused, DNS, TLS)
    │   └── RequestTimeoutError ................ connected, but no answer in time
    ├── DecodeError ............................ an answer that is not a valid table/model/JSON
    ├── CacheMissError ......................... offline, and the disk cache lacks the table
    │   └── CorruptCacheError .................. offline, and the cached file fails its digest
    ├── IncompatibleModelError ................. posenc_client.onnx: the model cannot take it
    ├── ModelIdError ........................... a model id (ORG/NAME[@REV]) whose config.json
    │   │                                        cannot be had: no huggingface_hub, no such
    │   │                                        repository, revision or file, gated: .model_id
    │   ├── ModelNotCachedError ................ offline, and the Hub cache lacks it (also a
    │   │                                        CacheMissError)
    │   └── HubUnreachableError ................ online, the Hub cannot be reached and the
    │                                            cache lacks it
    └── APIError ............................... the server answered {"error", "error_type",
        │                                        "detail"}: .status .error_type .message .detail
        ├── BadRequestError .................... 400 invalid_json unknown_format unknown_tensor
        │   │                                        tensor_required unsupported_dtype
        │   │                                        invalid_table invalid_max_points
        │   │                                        invalid_pool invalid_minus
        │   │                                        invalid_device
        │   │                                        invalid_table_url key_mismatch (a
        │   │                                        table URL; 414 when its spec is too long)
        │   ├── InvalidRowsError ............... 400 invalid_rows rows_unsupported (also a
        │   │                                        ValueError; raised before any request for
        │   │                                        a malformed `rows=` argument)
        │   └── AmbiguousConfigError ........... 400 ambiguous_config (pick a layer_type)
        ├── AuthenticationError ................ 401 unauthorized, 403 forbidden
        ├── NotFoundError ...................... 404 not_found unknown_key unknown_preset
        │                                            unknown_preset_part unknown_table
        │                                            unknown_model model_not_cached
        ├── TooLargeError ...................... 413 too_large too_large_for_json
        │                                            body_too_large
        ├── InvalidSpecError ................... 422 invalid_spec invalid_request
        │   │                                        invalid_model_id: .problems
        │   ├── UnknownKindError ............... 422 unknown_kind
        │   ├── UnsupportedConfigError ......... 422 unsupported_config
        │   └── UnsupportedExportError ......... 422 unsupported_export
        ├── ServiceUnavailableError ............ 503 busy overloaded too_many_connections
        │                                            unavailable starting not_ready:
        │                                            .retry_after (seconds, from Retry-After)
        └── InternalServerError ................ 500 internal_error (a server bug)
            └── ExportError .................... 500 export (a graph failed verification)

405 method_not_allowed, 406 not_acceptable, 408 request_timeout (the request's headers or body
came too slowly), 415 unsupported_media_type, 416 range_not_satisfiable, 431
headers_too_large, 501 hub_not_installed and 502 hub_unreachable (a server resolving a
`model_id`) are `APIError` itself. An `error_type` this version does not know maps by
status (400, 401/403, 404, 413, 422, 503, 5xx), else to `APIError`. `str(err)` is the server's
message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class PosencError(Exception):
    """Root of every exception posenc-client raises."""


class TransportError(PosencError):
    """The request got no usable HTTP answer after every retry (the `__cause__` is httpx's)."""


class ConnectError(TransportError):
    """The server could not be reached: connection refused, DNS or TLS failure."""


class RequestTimeoutError(TransportError):
    """Connected, but the server did not answer (or finish answering) within the timeout."""


class DecodeError(PosencError):
    """The server's answer could not be decoded (bad safetensors, JSON or ONNX bytes, a key that
    does not match its content)."""


class CacheMissError(PosencError):
    """The client is offline and its disk cache does not hold the requested table."""


class CorruptCacheError(CacheMissError):
    """Offline, and the cached file does not match its stored digest (a flipped bit, bytes
    appended or cut): `.path` names the file. Online the client fetches the entry again."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


class ModelIdError(PosencError):
    """A Hugging Face model id (`ORG/NAME[@REVISION]`) whose config.json cannot be had:
    huggingface_hub is not installed (`pip install 'posenc-client[hub]'`), no such repository,
    revision or config.json, or a gated repository without access. `model_id` names it (None
    when huggingface_hub is missing)."""

    def __init__(self, message: str, *, model_id: str | None) -> None:
        super().__init__(message)
        self.model_id = model_id


class ModelNotCachedError(ModelIdError, CacheMissError):
    """Offline (`POSENC_OFFLINE`, `offline=True` or `HF_HUB_OFFLINE=1`), and the Hugging Face
    cache does not hold the model's config.json; the message names the id and the cache."""


class HubUnreachableError(ModelIdError):
    """Online, but the Hugging Face Hub cannot be reached and its cache does not hold the model's
    config.json."""


class IncompatibleModelError(PosencError, ValueError):
    """`posenc_client.onnx`: the model cannot take these tables or this subgraph (shape, dtype,
    pairing or a consumer's constraint); the message names the node and the fix."""


@dataclass(frozen=True)
class FieldProblem:
    """One invalid field named by the server: dotted path, message and the offending value."""

    field: str
    message: str
    value: Any = None


class APIError(PosencError):
    """The server answered with an error body `{"error", "error_type", "detail"}`.

    Attributes:
        status: the HTTP status.
        error_type: the server's machine-readable type (`invalid_spec`, `busy`, ...).
        message: the server's human-readable message (also `str(err)`).
        detail: the server's `detail` (a list of field problems for validation errors).
        headers: the response headers.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int,
        error_type: str,
        detail: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_type = error_type
        self.detail = detail
        self.headers = headers or {}

    @property
    def problems(self) -> list[FieldProblem]:
        """`detail` as `FieldProblem`s when it is a list of `{field, message, value}`."""
        if not isinstance(self.detail, list):
            return []
        return [
            FieldProblem(str(p.get("field", "")), str(p.get("message", "")), p.get("value"))
            for p in self.detail
            if isinstance(p, dict)
        ]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.error_type!r}, {self.message!r})"


class BadRequestError(APIError):
    """400: the request is malformed (JSON, format, tensor, rows)."""


class InvalidRowsError(BadRequestError, ValueError):
    """400 `invalid_rows` / `rows_unsupported`: a `rows=` range the table cannot give.

    Raised by the server (a range past the table's positions, or a table without a position
    axis) and by the client itself, before any request, for an argument that is not
    `(start, end)` with integers `0 <= start < end` (then `headers` is empty). Also a
    `ValueError`, as for any bad argument."""


class AmbiguousConfigError(BadRequestError):
    """400 `ambiguous_config`: the config needs several tables; pass `layer_type=` or use
    `tables_for_model`."""


class AuthenticationError(APIError):
    """401/403: a missing or unknown API key (`Authorization: Bearer <key>`)."""


class NotFoundError(APIError):
    """404: an unknown route, content key, preset or preset part."""


class TooLargeError(APIError):
    """413: the table (or the request body) is over the server's limit; `detail` names both."""


class InvalidSpecError(APIError):
    """422: the spec or a parameter is invalid; `problems` names each field."""


class UnknownKindError(InvalidSpecError):
    """422 `unknown_kind`: no family of that name (see `Client.kinds()`)."""


class UnsupportedConfigError(InvalidSpecError):
    """422 `unsupported_config`: the config.json cannot be mapped to a table."""


class UnsupportedExportError(InvalidSpecError):
    """422 `unsupported_export`: no ONNX graph for this spec, graph, opset, mode or op."""


class ServiceUnavailableError(APIError):
    """503: busy (too many computations), overloaded (the in-flight byte budget), too many
    connections, starting or draining; retried before it is raised.

    `retry_after` is the server's Retry-After in seconds (None when absent)."""

    @property
    def retry_after(self) -> float | None:
        return parse_retry_after(self.headers.get("retry-after"))


class InternalServerError(APIError):
    """5xx: a server bug (the server logs it)."""


class ExportError(InternalServerError):
    """500 `export`: an ONNX graph failed the server's verification and was not served."""


_BY_ERROR_TYPE: dict[str, type[APIError]] = {
    "invalid_json": BadRequestError,
    "bad_request": BadRequestError,
    "unknown_format": BadRequestError,
    "unknown_tensor": BadRequestError,
    "tensor_required": BadRequestError,
    "unsupported_dtype": BadRequestError,
    "invalid_rows": InvalidRowsError,
    "rows_unsupported": InvalidRowsError,
    "invalid_table": BadRequestError,
    "invalid_model": BadRequestError,
    "no_rope_caches": BadRequestError,
    "site_limit": BadRequestError,
    "invalid_max_points": BadRequestError,
    "invalid_pool": BadRequestError,
    "invalid_minus": BadRequestError,
    "invalid_device": BadRequestError,
    "invalid_table_url": BadRequestError,
    "key_mismatch": BadRequestError,
    "ambiguous_config": AmbiguousConfigError,
    "unauthorized": AuthenticationError,
    "forbidden": AuthenticationError,
    "not_found": NotFoundError,
    "unknown_key": NotFoundError,
    "unknown_preset": NotFoundError,
    "unknown_preset_part": NotFoundError,
    "unknown_table": NotFoundError,
    "unknown_model": NotFoundError,
    "model_not_cached": NotFoundError,
    "invalid_model_id": InvalidSpecError,
    "hub_not_installed": APIError,
    "hub_unreachable": APIError,
    "too_large": TooLargeError,
    "too_large_for_json": TooLargeError,
    "body_too_large": TooLargeError,
    "too_many_tensors": TooLargeError,
    "too_many_entries": TooLargeError,
    "invalid_spec": InvalidSpecError,
    "invalid_request": InvalidSpecError,
    "unknown_kind": UnknownKindError,
    "unsupported_config": UnsupportedConfigError,
    "unsupported_export": UnsupportedExportError,
    "busy": ServiceUnavailableError,
    "overloaded": ServiceUnavailableError,
    "too_many_connections": ServiceUnavailableError,
    "unavailable": ServiceUnavailableError,
    "starting": ServiceUnavailableError,
    "not_ready": ServiceUnavailableError,
    "internal_error": InternalServerError,
    "export": ExportError,
    "method_not_allowed": APIError,
    "not_acceptable": APIError,
    "request_timeout": APIError,
    "headers_too_large": APIError,
    "unsupported_media_type": APIError,
    "range_not_satisfiable": APIError,
    "http_error": APIError,
}
"""The server's error_types (posenc.api.errors and the routes) and their classes."""

_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: AuthenticationError,
    404: NotFoundError,
    413: TooLargeError,
    422: InvalidSpecError,
    503: ServiceUnavailableError,
}


def error_class(status: int, error_type: str) -> type[APIError]:
    """The exception class for a server error: by `error_type`, else by status."""
    found = _BY_ERROR_TYPE.get(error_type) or _BY_STATUS.get(status)
    if found is not None:
        return found
    return InternalServerError if status >= 500 else APIError


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds: a number, or an HTTP date (seconds from now); None if absent."""
    if not value:
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    import datetime

    now = datetime.datetime.now(when.tzinfo or datetime.UTC)
    return max(0.0, (when - now).total_seconds())
