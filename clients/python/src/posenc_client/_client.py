"""`Client` and `AsyncClient` over one sans-I/O core.

Every call is a *flow*: a generator in `_Core` that yields `Call`s (method, path, body, headers)
and receives `Reply`s (status, headers, body), deciding everything else itself: the request body,
the disk cache and its revalidation, the offline fallback, parsing and error mapping. The two
clients only drive flows: they send each call through httpx (sync or async), retry connection
errors and 503s with exponential backoff (a server's Retry-After wins), stream bodies with a
progress callback, and throw a `TransportError` into the flow when the retries are spent, so that
the flow may fall back to its cache.

Wire format: tables are always requested as safetensors (every tensor, bfloat16 native, the
canonical spec, key and metadata in the header) and parsed with numpy (`_formats.py`).

Rows (`rows=(start, end)`): positions [start, end) of every tensor with a position axis. The disk
cache holds whole tables only: a cached whole table is sliced here without a request; otherwise
the rows come from the server (`?rows=START:END`) and are not cached (unless the range covered
the whole table, which the server then sends as the whole table).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from posenc_client._cache import DiskCache, request_id, valid_key
from posenc_client._exceptions import (
    APIError,
    CacheMissError,
    ConnectError,
    DecodeError,
    RequestTimeoutError,
    TransportError,
    error_class,
    parse_retry_after,
)
from posenc_client._models import (
    JSON,
    OnnxModel,
    Preset,
    ResolvedSpec,
    Rows,
    Tables,
    family_spec,
    load_config,
    onnx_metadata,
    rope_spec,
    rows_arg,
    rows_param,
    slice_rows,
)
from posenc_client._version import __version__

log = logging.getLogger("posenc_client")

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8000"
SAFETENSORS = {"format": "safetensors"}
Progress = Callable[[int, int | None], None]
"""`progress(received_bytes, total_bytes_or_None)`, called as a response body arrives."""

ConfigLike = str | os.PathLike[str] | Mapping[str, Any]


@dataclass(frozen=True)
class Retries:
    """Retry policy for connection errors, timeouts and 503 answers (every posenc request is
    idempotent: tables are pure functions of their spec).

    Attempt n (0-based) waits `min(backoff * 2**n, max_backoff)` seconds, or the server's
    Retry-After (capped at `max_retry_after`) when a 503 carries one. `total` retries follow the
    first attempt; `Retries(total=0)` disables retrying.
    """

    total: int = 3
    backoff: float = 0.25
    max_backoff: float = 8.0
    max_retry_after: float = 60.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number `attempt + 1`."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        return float(min(self.backoff * 2**attempt, self.max_backoff))


@dataclass(frozen=True)
class Call:
    """One HTTP request a flow wants sent (relative to the base URL)."""

    method: str
    path: str
    json: Any = None
    params: dict[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    retry: bool = True


@dataclass(frozen=True)
class Reply:
    """One HTTP answer, body fully read (a writable buffer, so parsed arrays are writable)."""

    status: int
    headers: httpx.Headers
    content: bytearray

    def json(self) -> Any:
        try:
            return json.loads(self.content)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DecodeError(f"the server's answer is not JSON: {err}") from None


Flow = Generator[Call, Reply, T]

_RETRYABLE = (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError)


def transport_error(err: httpx.HTTPError, call: Call) -> TransportError:
    """The client exception for an httpx transport failure (chained by the caller)."""
    where = f"{call.method} {call.path}"
    if isinstance(err, httpx.TimeoutException):
        return RequestTimeoutError(f"{where}: timed out ({type(err).__name__}: {err})")
    if isinstance(err, httpx.ConnectError):
        return ConnectError(f"{where}: cannot connect ({err})")
    return TransportError(f"{where}: {type(err).__name__}: {err}")


def api_error(reply: Reply) -> APIError:
    """The typed exception for an error answer, carrying the server's message and detail."""
    error_type, message, detail = "http_error", "", None
    try:
        body = json.loads(reply.content)
    except (UnicodeDecodeError, json.JSONDecodeError):
        body = None
    if isinstance(body, dict) and "error" in body:
        message = str(body.get("error", ""))
        error_type = str(body.get("error_type") or error_type)
        detail = body.get("detail")
    else:
        text = bytes(reply.content[:200]).decode("utf-8", "replace").strip()
        message = f"HTTP {reply.status}" + (f": {text}" if text else "")
    cls = error_class(reply.status, error_type)
    return cls(
        message or f"HTTP {reply.status}",
        status=reply.status,
        error_type=error_type,
        detail=detail,
        headers=dict(reply.headers),
    )


def _reply_key(reply: Reply) -> str | None:
    """The content key an answer names: X-Posenc-Key, else its strong ETag's key part (an ETag is
    `"<key>[.<format>...][@<device>]"`)."""
    key = str(reply.headers.get("x-posenc-key", "")).strip()
    if key:
        return key
    etag = str(reply.headers.get("etag", "")).strip().removeprefix("W/").strip('"')
    return etag.partition("@")[0].partition(".")[0] or None


def _cache_option(cache: bool | str | os.PathLike[str] | DiskCache | None) -> DiskCache | None:
    if cache is None or cache is False:
        return None
    if cache is True:
        return DiskCache()
    if isinstance(cache, DiskCache):
        return cache
    return DiskCache(cache)


class _Core:
    """Request building, caching and response parsing shared by `Client` and `AsyncClient`."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        retries: int | Retries,
        cache: bool | str | os.PathLike[str] | DiskCache | None,
        offline: bool,
        revalidate: bool,
        headers: Mapping[str, str] | None,
    ) -> None:
        self.base_url = (base_url or os.environ.get("POSENC_URL") or DEFAULT_URL).rstrip("/")
        key = api_key if api_key is not None else os.environ.get("POSENC_API_KEY")
        self.retries = retries if isinstance(retries, Retries) else Retries(total=retries)
        self.cache = _cache_option(cache)
        self.offline = offline
        self.revalidate = revalidate
        # Tables barely compress (~9% for fp32 trig values) and cost ~40 ms/MiB to gzip.
        self.headers = {
            "User-Agent": f"posenc-client/{__version__}",
            "Accept-Encoding": "identity",
        }
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
        self.headers.update(headers or {})

    # retries ---------------------------------------------------------------------------------

    def retry_after_reply(self, call: Call, reply: Reply, attempt: int) -> float | None:
        """Seconds to wait before retrying this answer, or None to hand it to the flow."""
        if reply.status != 503 or not call.retry or attempt >= self.retries.total:
            return None
        retry_after = parse_retry_after(reply.headers.get("retry-after"))
        return self.retries.delay(attempt, retry_after)

    def retry_after_error(self, call: Call, err: httpx.HTTPError, attempt: int) -> float | None:
        """Seconds to wait before retrying after this transport error, or None to give up."""
        if not isinstance(err, _RETRYABLE) or not call.retry or attempt >= self.retries.total:
            return None
        return self.retries.delay(attempt)

    # tables ----------------------------------------------------------------------------------

    def _parse_table(self, reply: Reply, name: str | None = None) -> Tables:
        if reply.status != 200:
            raise api_error(reply)
        tables = Tables.from_safetensors(reply.content, name=name)
        key = _reply_key(reply)
        if key is not None and key != tables.key:
            raise DecodeError(f"the answer names key {key} but carries table {tables.key}")
        return tables

    def _from_cache(self, key: str, name: str | None) -> Tables | None:
        data = self.cache.load("tables", key) if self.cache is not None else None
        if data is None:
            return None
        try:
            tables = Tables.from_safetensors(data, name=name)
        except DecodeError:
            log.warning("ignoring a corrupt cache entry for %s", key)
            return None
        return tables if tables.key == key and "rows" not in tables.meta else None

    def _store(self, tables: Tables, data: bytearray) -> None:
        if self.cache is not None:
            self.cache.store("tables", tables.key, data)

    def _cached_table(self, key: str, name: str | None) -> Flow[tuple[Tables | None, bool]]:
        """A cached table, revalidated: (tables, known). `known` is False when the server
        answered 404 `unknown_key` (it forgot the key: restarted or upgraded)."""
        cached = self._from_cache(key, name)
        if cached is None:
            return None, True
        if self.offline or not self.revalidate:
            return cached, True
        try:
            reply = yield Call(
                "GET",
                f"/v1/tables/{key}",
                params=SAFETENSORS,
                headers={"If-None-Match": cached.etag},
            )
        except TransportError as err:
            log.info("using the cached table %s: %s", key[:12], err)
            return cached, True
        if reply.status == 304:
            return cached, True
        if reply.status == 404 and api_error(reply).error_type == "unknown_key":
            return cached, False
        if reply.status >= 500:  # busy or failing after the retries: the copy is still exact
            log.info("using the cached table %s: the server answered %d", key[:12], reply.status)
            return cached, True
        tables = self._parse_table(reply, name)
        self._store(tables, reply.content)
        return tables, True

    def _cached_rows(
        self, key: str, name: str | None, span: tuple[int, int | None]
    ) -> Tables | None:
        """Rows of the cached whole table `key`, sliced without a request (content keys never
        change meaning, so there is nothing to revalidate), or None: not cached, or a kind
        this client cannot slice itself (offline: `CacheMissError`)."""
        whole = self._from_cache(key, name)
        if whole is None:
            return None
        part = slice_rows(whole, *span)
        if part is None and self.offline:
            raise CacheMissError(
                f"offline, and this client cannot slice rows of a {whole.kind} table itself"
            )
        return part

    def _rows_reply(
        self, reply: Reply, name: str | None, span: tuple[int, int | None], rid: str | None
    ) -> Tables:
        """The answer to a `?rows=` request. Rows are not cached; an answer without
        `meta["rows"]` is the whole table (the range covered every position), which is."""
        tables = self._parse_table(reply, name)
        got = tables.meta.get("rows")
        if got is None:
            self._store(tables, reply.content)
            if rid is not None and self.cache is not None:
                self.cache.remember(rid, {"ns": "tables", "key": tables.key})
            return slice_rows(tables, *span) or tables
        start, end = span
        if not (
            isinstance(got, list)
            and len(got) == 2
            and got[0] == start
            and (end is None or got[1] == end)
        ):
            raise DecodeError(f"asked for rows {rows_param(*span)}, the server sent rows {got}")
        return tables

    def table(
        self, spec: Mapping[str, Any], name: str | None = None, rows: Rows | None = None
    ) -> Flow[Tables]:
        """POST /v1/tables, or the cached table this request resolved to before; with `rows`,
        only those positions (sliced from the cached whole table when there is one)."""
        span = None if rows is None else rows_arg(rows)
        body = dict(spec)
        rid = request_id(self.base_url, "POST /v1/tables", body)
        record = self.cache.lookup(rid) if self.cache is not None else None
        if span is not None:
            if record is not None and record.get("ns") == "tables":
                part = self._cached_rows(str(record["key"]), name, span)
                if part is not None:
                    return part
            if self.offline:
                raise CacheMissError("offline, and no cached table for this spec")
            params = {**SAFETENSORS, "rows": rows_param(*span)}
            reply = yield Call("POST", "/v1/tables", json=body, params=params)
            return self._rows_reply(reply, name, span, rid)
        if record is not None and record.get("ns") == "tables":
            cached, known = yield from self._cached_table(str(record["key"]), name)
            if cached is not None and known:
                return cached
        if self.offline:
            raise CacheMissError("offline, and no cached table for this spec")
        reply = yield Call("POST", "/v1/tables", json=body, params=SAFETENSORS)
        tables = self._parse_table(reply, name)
        self._store(tables, reply.content)
        if self.cache is not None:
            self.cache.remember(rid, {"ns": "tables", "key": tables.key})
        return tables

    def table_by_key(
        self,
        key: str,
        name: str | None = None,
        spec: Mapping[str, Any] | None = None,
        rows: Rows | None = None,
    ) -> Flow[Tables]:
        """GET /v1/tables/{key} (cache first). A key the server does not know is served from the
        cache when held (content keys never change meaning), else recomputed from `spec`. With
        `rows`, only those positions (sliced from the cached whole table when there is one)."""
        if not valid_key(key):
            raise ValueError(f"not a content key (64 hex digits): {key!r}")
        if rows is not None:
            span = rows_arg(rows)
            part = self._cached_rows(key, name, span)
            if part is not None:
                return part
            if self.offline:
                raise CacheMissError(f"offline, and table {key} is not in the cache")
            params = {**SAFETENSORS, "rows": rows_param(*span)}
            reply = yield Call("GET", f"/v1/tables/{key}", params=params)
            if reply.status == 404 and spec is not None:
                tables = yield from self.table(spec, name, span)
                return tables
            return self._rows_reply(reply, name, span, None)
        cached, _ = yield from self._cached_table(key, name)
        if cached is not None:
            return cached
        if self.offline:
            raise CacheMissError(f"offline, and table {key} is not in the cache")
        reply = yield Call("GET", f"/v1/tables/{key}", params=SAFETENSORS)
        if reply.status == 404 and spec is not None:
            tables = yield from self.table(spec, name)
            return tables
        tables = self._parse_table(reply, name)
        self._store(tables, reply.content)
        return tables

    # discovery -------------------------------------------------------------------------------

    def get_json(self, path: str) -> Flow[Any]:
        if self.offline:
            raise CacheMissError(f"offline: GET {path} needs the server")
        reply = yield Call("GET", path)
        if reply.status != 200:
            raise api_error(reply)
        return reply.json()

    def resolve(self, config: ConfigLike, overrides: Mapping[str, Any]) -> Flow[list[ResolvedSpec]]:
        """POST /v1/resolve; the answer is remembered so that it also works offline."""
        body = {
            "hf_config": load_config(config),
            **{k: v for k, v in overrides.items() if v is not None},
        }
        rid = request_id(self.base_url, "POST /v1/resolve", body)
        record = self.cache.lookup(rid) if self.cache is not None else None
        specs: Any = None
        if self.offline:
            if record is None:
                raise CacheMissError("offline, and this config was never resolved here")
            specs = record.get("specs")
        else:
            try:
                reply = yield Call("POST", "/v1/resolve", json=body)
            except TransportError:
                if record is None:
                    raise
                specs = record.get("specs")
            else:
                if reply.status != 200:
                    raise api_error(reply)
                specs = reply.json().get("specs")
                if self.cache is not None:
                    self.cache.remember(rid, {"ns": "resolve", "specs": specs})
        if not isinstance(specs, list):
            raise DecodeError("the resolve answer has no `specs` list")
        return [ResolvedSpec.from_json(s) for s in specs]

    def tables_for_model(
        self, config: ConfigLike, overrides: Mapping[str, Any]
    ) -> Flow[dict[str, Tables]]:
        specs = yield from self.resolve(config, overrides)
        out: dict[str, Tables] = {}
        for item in specs:
            tables = yield from self.table_by_key(item.key, item.name, item.spec)
            out[item.name] = tables.with_notes(item.notes, item.name)
        return out

    def presets(self) -> Flow[list[Preset]]:
        data = yield from self.get_json("/v1/presets")
        return [Preset.from_json(p) for p in data.get("presets", [])]

    def preset(self, name: str) -> Flow[Preset]:
        data = yield from self.get_json(f"/v1/presets/{name}")
        return Preset.from_json(data)

    def preset_tables(self, name: str) -> Flow[dict[str, Tables]]:
        preset = yield from self.preset(name)
        out: dict[str, Tables] = {}
        for part in preset.parts:
            out[part.name] = yield from self.table_by_key(part.key, part.name, part.spec)
        return out

    def kinds(self) -> Flow[list[JSON]]:
        data = yield from self.get_json("/v1/kinds")
        return list(data.get("kinds", []))

    def ready(self) -> Flow[bool]:
        try:
            reply = yield Call("GET", "/v2/health/ready", retry=False)
        except TransportError:
            return False
        return reply.status == 200

    # onnx ------------------------------------------------------------------------------------

    def _parse_onnx(self, reply: Reply) -> OnnxModel:
        if reply.status != 200:
            raise api_error(reply)
        data = bytes(reply.content)
        metadata = onnx_metadata(data)
        key = _reply_key(reply) or metadata.get("export_key", "")
        return OnnxModel(key=key, data=data, metadata=metadata)

    def onnx(self, body: Mapping[str, Any]) -> Flow[OnnxModel]:
        """POST /v1/onnx (cache first, revalidated against GET /v1/onnx/{key})."""
        rid = request_id(self.base_url, "POST /v1/onnx", body)
        record = self.cache.lookup(rid) if self.cache is not None else None
        if record is not None and record.get("ns") == "onnx" and self.cache is not None:
            key = str(record["key"])
            data = self.cache.load("onnx", key)
            if data is not None:
                model = OnnxModel(key=key, data=bytes(data), metadata=onnx_metadata(bytes(data)))
                if self.offline or not self.revalidate:
                    return model
                try:
                    reply = yield Call(
                        "GET", f"/v1/onnx/{key}", headers={"If-None-Match": f'"{key}"'}
                    )
                except TransportError:
                    return model
                if reply.status == 304:
                    return model
                if reply.status == 200:
                    fresh = self._parse_onnx(reply)
                    self.cache.store("onnx", fresh.key, fresh.data)
                    return fresh
        if self.offline:
            raise CacheMissError("offline, and no cached ONNX model for this request")
        reply = yield Call("POST", "/v1/onnx", json=dict(body))
        model = self._parse_onnx(reply)
        if self.cache is not None and valid_key(model.key):
            self.cache.store("onnx", model.key, model.data)
            self.cache.remember(rid, {"ns": "onnx", "key": model.key})
        return model


def onnx_body(
    spec: Mapping[str, Any],
    graph: str,
    opset: int | None,
    mode: str | None,
    op: str | None,
    num_heads: int | None,
    inputs: str | None,
) -> JSON:
    """The POST /v1/onnx body: the spec and the export options that are set."""
    options = {"opset": opset, "mode": mode, "op": op, "num_heads": num_heads, "inputs": inputs}
    return {"spec": dict(spec), "graph": graph, **{k: v for k, v in options.items() if v}}


class _Reader:
    """Accumulates a streamed body into one bytearray, reporting progress."""

    def __init__(self, response: httpx.Response, progress: Progress | None) -> None:
        length = response.headers.get("content-length")
        self.total = int(length) if length and length.isdigit() else None
        self.buffer = bytearray()
        self.progress = progress
        self.status = response.status_code
        self.headers = response.headers

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        if self.progress is not None:
            self.progress(len(self.buffer), self.total)

    def reply(self) -> Reply:
        return Reply(self.status, self.headers, self.buffer)


class Client:
    """A synchronous posenc client.

    Args:
        base_url: the server (default `$POSENC_URL`, else http://127.0.0.1:8000); a path prefix
            is kept (`https://host/posenc` -> `https://host/posenc/v1/...`).
        api_key: sent as `Authorization: Bearer <key>` (default `$POSENC_API_KEY`).
        timeout: seconds, or an `httpx.Timeout`.
        retries: retries after the first attempt on connection errors, timeouts and 503
            (an int, or a `Retries` policy with the backoff).
        transport: an httpx transport to send through (`httpx.MockTransport`, a proxy, ...).
        cache: the disk cache: True (default folder, see `DiskCache`), a folder, a `DiskCache`,
            or False for none.
        offline: never touch the network: cached tables only (`CacheMissError` otherwise).
        revalidate: revalidate cached tables with If-None-Match (default); False trusts them
            without asking (they are immutable under their key).
        headers: extra request headers.
        progress: `progress(received, total)` called as response bodies arrive.

    Use as a context manager, or call `close()`.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 60.0,
        retries: int | Retries = 3,
        transport: httpx.BaseTransport | None = None,
        cache: bool | str | os.PathLike[str] | DiskCache = True,
        offline: bool = False,
        revalidate: bool = True,
        headers: Mapping[str, str] | None = None,
        progress: Progress | None = None,
    ) -> None:
        self._core = _Core(base_url, api_key, retries, cache, offline, revalidate, headers)
        self.progress = progress
        self._http = httpx.Client(
            base_url=self._core.base_url,
            headers=self._core.headers,
            timeout=timeout,
            transport=transport,
            follow_redirects=True,
        )

    @property
    def base_url(self) -> str:
        return self._core.base_url

    @property
    def cache(self) -> DiskCache | None:
        """The disk cache, or None."""
        return self._core.cache

    def __repr__(self) -> str:
        return f"Client({self.base_url!r}, cache={self.cache!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _send(self, call: Call) -> Reply:
        attempt = 0
        while True:
            request = self._http.build_request(
                call.method, call.path, json=call.json, params=call.params, headers=call.headers
            )
            try:
                response = self._http.send(request, stream=True)
                try:
                    reader = _Reader(response, self.progress)
                    for chunk in response.iter_bytes():
                        reader.feed(chunk)
                finally:
                    response.close()
            except httpx.HTTPError as err:
                wait = self._core.retry_after_error(call, err, attempt)
                if wait is None:
                    raise transport_error(err, call) from err
                log.debug("retrying %s %s in %.2fs: %r", call.method, call.path, wait, err)
            else:
                reply = reader.reply()
                wait = self._core.retry_after_reply(call, reply, attempt)
                if wait is None:
                    return reply
                log.debug("retrying %s %s in %.2fs: 503", call.method, call.path, wait)
            time.sleep(wait)
            attempt += 1

    def _run(self, flow: Flow[T]) -> T:
        try:
            call = next(flow)
            while True:
                try:
                    reply = self._send(call)
                except TransportError as err:
                    call = flow.throw(err)
                else:
                    call = flow.send(reply)
        except StopIteration as stop:
            result: T = stop.value
            return result

    def table(self, spec: Mapping[str, Any], *, rows: Rows | None = None) -> Tables:
        """The table for a spec dict (`kind` selects the family; see `kinds()`), or for
        `{"hf_config": {...}, ...overrides}` when the config needs exactly one table.

        `rows=(start, end)` (or `slice(start, end)`; `end=None`: to the last position) returns
        only positions [start, end) of every tensor with a position axis (axis 0 of RoPE and
        sinusoidal tables, the query axis 1 of an (H, Q, K) bias; `inv_freq` and `slopes` come
        whole), with `meta["rows"] == [start, end]`. A cached whole table is sliced without a
        request; otherwise the server sends just those rows (`?rows=START:END`), which are not
        cached. A range covering every position gives the whole table. Raises
        `InvalidRowsError` (a `ValueError`) for a malformed range, before any request, and for
        one past the table's positions or a table without a position axis.
        """
        return self._run(self._core.table(spec, rows=rows))

    def table_by_key(self, key: str, *, rows: Rows | None = None) -> Tables:
        """The table with this content key (one the server resolved, or a preset's); `rows`
        as in `table`."""
        return self._run(self._core.table_by_key(key, rows=rows))

    def rope(
        self,
        head_dim: int,
        max_positions: int | None = None,
        *,
        rope_theta: float | None = None,
        partial_rotary_factor: float | None = None,
        rotary_dim: int | None = None,
        rope_scaling: Mapping[str, Any] | None = None,
        rope_parameters: Mapping[str, Any] | None = None,
        rope_type: str | None = None,
        factor: float | None = None,
        original_max_position_embeddings: int | None = None,
        max_position_embeddings: int | None = None,
        profile: str | None = None,
        dtype: str | None = None,
        rows: Rows | None = None,
        **fields: Any,
    ) -> Tables:
        """RoPE cos/sin caches (and inv_freq), keywords named as in transformers' configs.

        Scaling keys may be given flat (`rope_type="llama3", factor=8.0, low_freq_factor=1.0`)
        or as `rope_scaling={...}` / `rope_parameters={...}`; `profile` picks a consumer's
        layout (`hf`, `onnx`, `ort_gqa`, `vllm`, `flash_attn`, ...); other spec fields
        (`width`, `interleaved`, `packing`, `seq_len`, `precision`) pass through `fields`.
        `rows=(start, end)`: positions [start, end) only (see `table`).
        """
        spec = rope_spec(
            head_dim=head_dim,
            max_positions=max_positions,
            rope_theta=rope_theta,
            partial_rotary_factor=partial_rotary_factor,
            rotary_dim=rotary_dim,
            rope_scaling=rope_scaling,
            rope_parameters=rope_parameters,
            rope_type=rope_type,
            factor=factor,
            original_max_position_embeddings=original_max_position_embeddings,
            max_position_embeddings=max_position_embeddings,
            profile=profile,
            dtype=dtype,
            **fields,
        )
        return self.table(spec, rows=rows)

    def alibi(
        self,
        num_heads: int,
        *,
        bias: str | None = None,
        query_length: int | None = None,
        key_length: int | None = None,
        alibi_bias_max: float | None = None,
        dtype: str | None = None,
        rows: Rows | None = None,
        **fields: Any,
    ) -> Tables:
        """ALiBi slopes (H,), plus the additive bias (H, Q, K) when `bias` names a form;
        `rows=(start, end)` picks queries [start, end) of the bias (see `table`)."""
        spec = family_spec(
            "alibi",
            num_heads=num_heads,
            bias=bias,
            query_length=query_length,
            key_length=key_length,
            alibi_bias_max=alibi_bias_max,
            dtype=dtype,
            **fields,
        )
        return self.table(spec, rows=rows)

    def sinusoidal(
        self,
        dim: int,
        max_positions: int | None = None,
        *,
        convention: str | None = None,
        dtype: str | None = None,
        rows: Rows | None = None,
        **fields: Any,
    ) -> Tables:
        """A sinusoidal position table `embedding` (P, dim); `rows` as in `table`."""
        spec = family_spec(
            "sinusoidal",
            dim=dim,
            max_positions=max_positions,
            convention=convention,
            dtype=dtype,
            **fields,
        )
        return self.table(spec, rows=rows)

    def t5_bias(
        self,
        *,
        query_length: int,
        key_length: int | None = None,
        num_buckets: int | None = None,
        max_distance: int | None = None,
        bidirectional: bool | None = None,
        rows: Rows | None = None,
        **fields: Any,
    ) -> Tables:
        """T5 relative position `buckets` (Q, K), plus `bias` (H, Q, K) when weights are
        given; `rows=(start, end)` picks queries [start, end) (see `table`)."""
        spec = family_spec(
            "t5_bias",
            query_length=query_length,
            key_length=key_length,
            num_buckets=num_buckets,
            max_distance=max_distance,
            bidirectional=bidirectional,
            **fields,
        )
        return self.table(spec, rows=rows)

    def resolve(self, config: ConfigLike, **overrides: Any) -> list[ResolvedSpec]:
        """The tables a model needs, from its config.json (path, folder or dict): specs, keys
        and notes. `overrides` (`profile`, `max_positions`, `dtype`, `kind`, `layer_type`, ...)
        apply to every spec that has the field."""
        return self._run(self._core.resolve(config, overrides))

    def tables_for_model(self, config: ConfigLike, **overrides: Any) -> dict[str, Tables]:
        """Every table a model needs, by name (`rope`, `rope:sliding_attention`, `alibi`, ...),
        each carrying the resolve notes. Same `overrides` as `resolve`."""
        return self._run(self._core.tables_for_model(config, overrides))

    def presets(self) -> list[Preset]:
        """The curated released models (names, parts and keys)."""
        return self._run(self._core.presets())

    def preset(self, name: str) -> Preset:
        """One preset with its parts' canonical specs."""
        return self._run(self._core.preset(name))

    def preset_tables(self, name: str) -> dict[str, Tables]:
        """The tables of a preset, by part name."""
        return self._run(self._core.preset_tables(name))

    def kinds(self) -> list[JSON]:
        """The families: kind, summary, required fields, valid values and JSON schema."""
        return self._run(self._core.kinds())

    def onnx(
        self,
        spec: Mapping[str, Any],
        *,
        graph: str,
        opset: int | None = None,
        mode: str | None = None,
        op: str | None = None,
        num_heads: int | None = None,
        inputs: str | None = None,
    ) -> OnnxModel:
        """The verified ONNX subgraph `graph` (`cos_sin`, `rotary`, `bias`, `embedding`) for a
        spec, at `opset` (17..23), `mode` (`table`/`compute`), `op` (`decomposed`/`onnx`/
        `contrib`), `inputs` (`positions`/`lengths`)."""
        body = onnx_body(spec, graph, opset, mode, op, num_heads, inputs)
        return self._run(self._core.onnx(body))

    def ready(self) -> bool:
        """True when the server answers /v2/health/ready with 200."""
        return self._run(self._core.ready())


class AsyncClient:
    """The asyncio twin of `Client`: the same arguments (`transport` is an
    `httpx.AsyncBaseTransport`), the same methods as coroutines."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 60.0,
        retries: int | Retries = 3,
        transport: httpx.AsyncBaseTransport | None = None,
        cache: bool | str | os.PathLike[str] | DiskCache = True,
        offline: bool = False,
        revalidate: bool = True,
        headers: Mapping[str, str] | None = None,
        progress: Progress | None = None,
    ) -> None:
        self._core = _Core(base_url, api_key, retries, cache, offline, revalidate, headers)
        self.progress = progress
        self._http = httpx.AsyncClient(
            base_url=self._core.base_url,
            headers=self._core.headers,
            timeout=timeout,
            transport=transport,
            follow_redirects=True,
        )

    @property
    def base_url(self) -> str:
        return self._core.base_url

    @property
    def cache(self) -> DiskCache | None:
        return self._core.cache

    def __repr__(self) -> str:
        return f"AsyncClient({self.base_url!r}, cache={self.cache!r})"

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def _send(self, call: Call) -> Reply:
        attempt = 0
        while True:
            request = self._http.build_request(
                call.method, call.path, json=call.json, params=call.params, headers=call.headers
            )
            try:
                response = await self._http.send(request, stream=True)
                try:
                    reader = _Reader(response, self.progress)
                    async for chunk in response.aiter_bytes():
                        reader.feed(chunk)
                finally:
                    await response.aclose()
            except httpx.HTTPError as err:
                wait = self._core.retry_after_error(call, err, attempt)
                if wait is None:
                    raise transport_error(err, call) from err
                log.debug("retrying %s %s in %.2fs: %r", call.method, call.path, wait, err)
            else:
                reply = reader.reply()
                wait = self._core.retry_after_reply(call, reply, attempt)
                if wait is None:
                    return reply
                log.debug("retrying %s %s in %.2fs: 503", call.method, call.path, wait)
            await asyncio.sleep(wait)
            attempt += 1

    async def _run(self, flow: Flow[T]) -> T:
        try:
            call = next(flow)
            while True:
                try:
                    reply = await self._send(call)
                except TransportError as err:
                    call = flow.throw(err)
                else:
                    call = flow.send(reply)
        except StopIteration as stop:
            result: T = stop.value
            return result

    async def table(self, spec: Mapping[str, Any], *, rows: Rows | None = None) -> Tables:
        """See `Client.table`."""
        return await self._run(self._core.table(spec, rows=rows))

    async def table_by_key(self, key: str, *, rows: Rows | None = None) -> Tables:
        """See `Client.table_by_key`."""
        return await self._run(self._core.table_by_key(key, rows=rows))

    async def rope(
        self,
        head_dim: int,
        max_positions: int | None = None,
        *,
        rope_theta: float | None = None,
        partial_rotary_factor: float | None = None,
        rotary_dim: int | None = None,
        rope_scaling: Mapping[str, Any] | None = None,
        rope_parameters: Mapping[str, Any] | None = None,
        rope_type: str | None = None,
        factor: float | None = None,
        original_max_position_embeddings: int | None = None,
        max_position_embeddings: int | None = None,
        profile: str | None = None,
        dtype: str | None = None,
        rows: Rows | None = None,
        **fields: Any,
    ) -> Tables:
        """See `Client.rope`."""
        spec = rope_spec(
            head_dim=head_dim,
            max_positions=max_positions,
            rope_theta=rope_theta,
            partial_rotary_factor=partial_rotary_factor,
            rotary_dim=rotary_dim,
            rope_scaling=rope_scaling,
            rope_parameters=rope_parameters,
            rope_type=rope_type,
            factor=factor,
            original_max_position_embeddings=original_max_position_embeddings,
            max_position_embeddings=max_position_embeddings,
            profile=profile,
            dtype=dtype,
            **fields,
        )
        return await self.table(spec, rows=rows)

    async def alibi(
        self,
        num_heads: int,
        *,
        bias: str | None = None,
        query_length: int | None = None,
        key_length: int | None = None,
        alibi_bias_max: float | None = None,
        dtype: str | None = None,
        rows: Rows | None = None,
        **fields: Any,
    ) -> Tables:
        """See `Client.alibi`."""
        spec = family_spec(
            "alibi",
            num_heads=num_heads,
            bias=bias,
            query_length=query_length,
            key_length=key_length,
            alibi_bias_max=alibi_bias_max,
            dtype=dtype,
            **fields,
        )
        return await self.table(spec, rows=rows)

    async def sinusoidal(
        self,
        dim: int,
        max_positions: int | None = None,
        *,
        convention: str | None = None,
        dtype: str | None = None,
        rows: Rows | None = None,
        **fields: Any,
    ) -> Tables:
        """See `Client.sinusoidal`."""
        spec = family_spec(
            "sinusoidal",
            dim=dim,
            max_positions=max_positions,
            convention=convention,
            dtype=dtype,
            **fields,
        )
        return await self.table(spec, rows=rows)

    async def t5_bias(
        self,
        *,
        query_length: int,
        key_length: int | None = None,
        num_buckets: int | None = None,
        max_distance: int | None = None,
        bidirectional: bool | None = None,
        rows: Rows | None = None,
        **fields: Any,
    ) -> Tables:
        """See `Client.t5_bias`."""
        spec = family_spec(
            "t5_bias",
            query_length=query_length,
            key_length=key_length,
            num_buckets=num_buckets,
            max_distance=max_distance,
            bidirectional=bidirectional,
            **fields,
        )
        return await self.table(spec, rows=rows)

    async def resolve(self, config: ConfigLike, **overrides: Any) -> list[ResolvedSpec]:
        """See `Client.resolve`."""
        return await self._run(self._core.resolve(config, overrides))

    async def tables_for_model(self, config: ConfigLike, **overrides: Any) -> dict[str, Tables]:
        """See `Client.tables_for_model`."""
        return await self._run(self._core.tables_for_model(config, overrides))

    async def presets(self) -> list[Preset]:
        """See `Client.presets`."""
        return await self._run(self._core.presets())

    async def preset(self, name: str) -> Preset:
        """See `Client.preset`."""
        return await self._run(self._core.preset(name))

    async def preset_tables(self, name: str) -> dict[str, Tables]:
        """See `Client.preset_tables`."""
        return await self._run(self._core.preset_tables(name))

    async def kinds(self) -> list[JSON]:
        """See `Client.kinds`."""
        return await self._run(self._core.kinds())

    async def onnx(
        self,
        spec: Mapping[str, Any],
        *,
        graph: str,
        opset: int | None = None,
        mode: str | None = None,
        op: str | None = None,
        num_heads: int | None = None,
        inputs: str | None = None,
    ) -> OnnxModel:
        """See `Client.onnx`."""
        body = onnx_body(spec, graph, opset, mode, op, num_heads, inputs)
        return await self._run(self._core.onnx(body))

    async def ready(self) -> bool:
        """See `Client.ready`."""
        return await self._run(self._core.ready())
