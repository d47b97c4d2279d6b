"""The sans-I/O core that `Client` and `AsyncClient` share: request building, caching, response
decoding and error mapping, without sending anything.

Every call is a *flow*: a generator method of `Core` that yields `Call`s (method, path, body,
headers) and receives `Reply`s (status, headers, body), deciding everything else itself: the
request body, the disk cache and its revalidation, the offline fallback, parsing and error
mapping. The clients (`_client.py`) only drive flows: they send each call through httpx (sync or
async), retry connection errors and 503s as `Core.retry_after_error` / `retry_after_reply` decide,
stream bodies with a progress callback, and throw a `TransportError` into the flow when the
retries are spent, so that the flow may fall back to its cache.

Wire format: tables are always requested as safetensors (every tensor, bfloat16 native, the
canonical spec, key and metadata in the header) and parsed with numpy (`_formats.py`).

Integrity: a whole table or ONNX model must carry `Repr-Digest` (RFC 9530; the server sends one
with every whole table and model) and match it (else `DecodeError`: nothing without one is taken
or cached), a table fetched by key must be that key's, and the digest is stored with the cache
entry; every cache read checks the file against it (`DiskCache.load`). A cached file that fails
is fetched again (offline: `CorruptCacheError` naming the file).

Rows (`rows=(start, end)`): positions [start, end) of every tensor with a position axis. The disk
cache holds whole tables only: a cached whole table is sliced here without a request; otherwise
the rows come from the server (`?rows=START:END`) and are not cached (unless the range covered
the whole table, which the server then sends as the whole table).
"""

from __future__ import annotations

import json
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx

from posenc_client._cache import (
    CorruptEntryError,
    DiskCache,
    digest_matches,
    request_id,
    request_summary,
    split_table_ref,
    table_path,
    valid_key,
)
from posenc_client._exceptions import (
    APIError,
    CacheMissError,
    ConnectError,
    CorruptCacheError,
    DecodeError,
    RequestTimeoutError,
    TransportError,
    error_class,
    parse_retry_after,
)
from posenc_client._onnx_model import OnnxModel, onnx_metadata
from posenc_client._options import (
    JSON,
    AlibiOptions,
    OnnxOptions,
    RopeOptions,
    SinusoidalOptions,
    T5BiasOptions,
    family_spec,
    load_config,
    onnx_body,
    rope_spec,
)
from posenc_client._results import (
    MRopePositions,
    Preset,
    ResolvedSpec,
    ResolvedSpecs,
    UnservedPart,
)
from posenc_client._rows import Rows, rows_arg, rows_param, slice_rows
from posenc_client._tables import Tables
from posenc_client._version import __version__

log = logging.getLogger("posenc_client")

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8000"
ASKED_KEPT = 1024
"""Requests in flight whose summaries wait for their cache record (`Core._request_id`)."""
SAFETENSORS = {"format": "safetensors"}

ConfigLike = str | os.PathLike[str] | Mapping[str, Any]
CacheOption = bool | str | os.PathLike[str] | DiskCache | None


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

RETRYABLE = (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError)


def server_url(url: str) -> str:
    """The server's base URL: `host:port` (tritonclient's spelling, no scheme) as
    `http://host:port`; a trailing slash dropped. ValueError, naming `url` and what is wrong,
    for anything that is no http(s) URL of a host (another scheme, whitespace, no host, a port
    out of 0-65535): refused here rather than as "cannot connect" at the first request."""
    url = url.strip()
    full = url if "://" in url else "http://" + url
    scheme = full.partition("://")[0]
    problem = None
    if scheme.lower() not in ("http", "https"):
        problem = f"the scheme {scheme!r} is not http or https"
    elif any(c.isspace() or not c.isprintable() for c in full):
        problem = "it holds whitespace or a control character"
    else:
        try:
            parts = urlsplit(full)
            parts.port  # noqa: B018 - parsing the port is the check (ValueError out of range)
        except ValueError as err:
            problem = str(err)
        else:
            if not parts.hostname:
                problem = "it names no host"
    if problem is not None:
        raise ValueError(
            f"{url!r} is not a server URL ({problem}): give http://HOST[:PORT][/PREFIX], "
            "https://... or HOST:PORT"
        )
    return full.rstrip("/")


def bearer_key(key: str) -> str:
    """An API key as `Authorization: Bearer <key>` carries it: visible ASCII and spaces only
    (RFC 9110 field values; httpx sends ASCII). ValueError otherwise, naming the position and
    code point of the first character that is not, never the key itself."""
    for index, char in enumerate(key):
        if not " " <= char <= "~":
            raise ValueError(
                f"an API key goes into the Authorization header, which takes visible ASCII "
                f"characters and spaces only: character {index + 1} of {len(key)} is "
                f"U+{ord(char):04X}"
            )
    return key


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("", "0", "false", "no", "off")


def env_flag(name: str) -> bool:
    """The boolean environment variable `name`: `TRUE_WORDS` or `FALSE_WORDS` (any case,
    surrounding spaces ignored; unset is false). ValueError naming the variable and the
    spellings for anything else: a typo is not silently false."""
    raw = os.environ.get(name, "")
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(
        f"${name}={raw!r} is not a boolean: {', '.join(TRUE_WORDS)} (true) or "
        f"{', '.join(w for w in FALSE_WORDS if w)}, empty (false), in any case"
    )


def _from_env(name: str, check: Callable[[str], str]) -> str | None:
    """`check` of environment variable `name` (None when unset or empty); its ValueError names
    the variable."""
    value = os.environ.get(name)
    if not value:
        return None
    try:
        return check(value)
    except ValueError as err:
        raise ValueError(f"${name}: {err}") from None


def transport_error(err: httpx.HTTPError, call: Call, base_url: str = "") -> TransportError:
    """The client exception for an httpx transport failure (chained by the caller), naming the
    server's URL."""
    where = f"{call.method} {base_url}{call.path}"
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


def checked_digest(reply: Reply, required: bool = True) -> None:
    """Check a whole table's or model's body against its `Repr-Digest`, which it must carry
    (`DecodeError` when it has none, or when they differ: the bytes changed on the way). Without
    one the client cannot tell the server's bytes from anyone else's, so it neither takes nor
    caches them (a digest computed here would only vouch for whatever arrived). Not `required`
    (row slices), a digest is checked when present."""
    header = reply.headers.get("repr-digest")
    if header is None:
        if not required:  # rows of a table: built per request, sent without a digest
            return
        raise DecodeError(
            f"the {len(reply.content)}-byte answer carries no Repr-Digest: the server sends one "
            "with every whole table and model, so it is refused (and never cached)"
        )
    if not digest_matches(header, reply.content):
        raise DecodeError(
            f"the {len(reply.content)}-byte answer does not match its Repr-Digest {header[:120]!r}"
        )


def stored_digest(reply: Reply) -> str:
    """The digest stored with a checked answer: its `Repr-Digest` (`checked_digest` ensured one)."""
    return str(reply.headers["repr-digest"])


def reply_key(reply: Reply) -> str | None:
    """The content key an answer names: X-Posenc-Key, else its strong ETag's key part (an ETag is
    `"<key>[.<format>...][@<device>]"`)."""
    key = str(reply.headers.get("x-posenc-key", "")).strip()
    if key:
        return key
    etag = str(reply.headers.get("etag", "")).strip().removeprefix("W/").strip('"')
    return etag.partition("@")[0].partition(".")[0] or None


def disk_cache(cache: CacheOption, max_bytes: int | str | None = None) -> DiskCache | None:
    """The `cache=` argument as a `DiskCache`: True the default folder, a folder, a `DiskCache`
    as is, None or False none; `max_bytes` its size cap (default `$POSENC_CACHE_MAX_BYTES`),
    which a `DiskCache` given as is carries itself (ValueError with both)."""
    if cache is None or cache is False:
        return None
    if isinstance(cache, DiskCache):
        if max_bytes is not None:
            raise ValueError("give the size cap to the DiskCache (max_bytes=), not beside it")
        return cache
    return DiskCache(None if cache is True else cache, max_bytes=max_bytes)


class Core:
    """Request building, caching and response decoding shared by `Client` and `AsyncClient`:
    one flow per client method, no I/O."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        retries: int | Retries,
        cache: CacheOption,
        offline: bool | None,
        revalidate: bool,
        headers: Mapping[str, str] | None,
        cache_max_bytes: int | str | None = None,
    ) -> None:
        if offline is None:
            offline = env_flag("POSENC_OFFLINE")
        if base_url:
            self.base_url = server_url(base_url)
        else:
            self.base_url = _from_env("POSENC_URL", server_url) or DEFAULT_URL
        if api_key is not None:
            key: str | None = bearer_key(api_key)
        else:
            key = _from_env("POSENC_API_KEY", bearer_key)
        self.retries = retries if isinstance(retries, Retries) else Retries(total=retries)
        self.cache = disk_cache(cache, cache_max_bytes)
        self._asked: OrderedDict[str, JSON] = OrderedDict()
        self.offline = offline
        self.revalidate = revalidate
        # Tables barely compress and cost more to gzip than to send (docs/dependencies.md).
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
        if not isinstance(err, RETRYABLE) or not call.retry or attempt >= self.retries.total:
            return None
        return self.retries.delay(attempt)

    # tables ----------------------------------------------------------------------------------

    def _parse_table(
        self,
        reply: Reply,
        name: str | None = None,
        expected: str | None = None,
        whole: bool = True,
    ) -> Tables:
        """A table from its answer: digest checked (`checked_digest`, required for a `whole`
        table), and its key the one the answer names and, when given, the one asked for
        (`expected`)."""
        if reply.status != 200:
            raise api_error(reply)
        checked_digest(reply, required=whole)
        tables = Tables.from_safetensors(reply.content, name=name)
        key = reply_key(reply)
        if key is not None and key != tables.key:
            raise DecodeError(f"the answer names key {key} but carries table {tables.key}")
        if expected is not None and tables.key != expected:
            raise DecodeError(f"asked for table {expected} but the answer carries {tables.key}")
        return tables

    def _load(self, ns: str, key: str) -> bytearray | None:
        """The cached file of `key`, checked against its digest; None when absent or corrupt
        (deleted, so that it is fetched again); offline, a corrupt file raises
        `CorruptCacheError` naming it."""
        if self.cache is None:
            return None
        try:
            return self.cache.load(ns, key)
        except CorruptEntryError as err:
            if self.offline:
                raise CorruptCacheError(
                    f"offline, and the cached file {err.path} is corrupt ({err.reason}): "
                    "fetch it again online, or `posenc-client cache verify --remove`",
                    str(err.path),
                ) from None
            log.warning("fetching %s again: the cached file %s", key[:12], err)
            self.cache.discard(ns, key)
            return None

    def _from_cache(self, key: str, name: str | None) -> Tables | None:
        data = self._load("tables", key)
        if data is None:
            return None
        try:
            tables = Tables.from_safetensors(data, name=name)
        except DecodeError:
            log.warning("ignoring a corrupt cache entry for %s", key)
            return None
        return tables if tables.key == key and "rows" not in tables.meta else None

    def _store(self, tables: Tables, reply: Reply) -> None:
        self._cache_write(self._cache_store, "tables", tables.key, reply.content, reply)

    def _cache_store(self, ns: str, key: str, data: Any, reply: Reply) -> None:
        if self.cache is not None:
            self.cache.store(ns, key, data, stored_digest(reply))

    def _request_id(self, route: str, body: Mapping[str, Any]) -> str:
        """The request's id in the cache's index (`request_id`), noting what it asked for, which
        `_remember` stores with its record (`posenc-client cache ls` shows it)."""
        rid = request_id(self.base_url, route, body)
        if self.cache is not None:
            self._asked[rid] = request_summary(self.base_url, route, body)
            self._asked.move_to_end(rid)
            while len(self._asked) > ASKED_KEPT:  # requests answered from the cache or failed
                self._asked.popitem(last=False)
        return rid

    def _remember(self, rid: str, record: Mapping[str, Any]) -> None:
        """Record what request `rid` resolved to, with what it asked for."""
        if self.cache is not None:
            asked = self._asked.pop(rid, None)
            self.cache.remember(rid, {**record, "request": asked} if asked else record)

    def _cache_write(self, fn: Any, *args: Any) -> None:
        """Run a cache write; a failure (a full disk, a read-only folder) is a warning, never
        the caller's error: the answer was received and checked, and is still returned (and
        written where the caller asked)."""
        try:
            fn(*args)
        except OSError as err:
            log.warning("could not write to the cache %s: %s", self.cache, err)

    def _cached_table(
        self, key: str, name: str | None, path: str | None = None
    ) -> Flow[tuple[Tables | None, bool]]:
        """A cached table, revalidated at `path` (a `/v1/tables/{key}.{spec}` URL, which any
        replica answers; the bare key's by default): (tables, known). `known` is False when the
        server answered 404 `unknown_key` (a bare key it never resolved or forgot)."""
        cached = self._from_cache(key, name)
        if cached is None:
            return None, True
        if self.offline or not self.revalidate:
            return cached, True
        try:
            reply = yield Call(
                "GET",
                path or table_path(key),
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
        tables = self._parse_table(reply, name, key)
        self._store(tables, reply)
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
        self,
        reply: Reply,
        name: str | None,
        span: tuple[int, int | None],
        record_id: str | None,
    ) -> Tables:
        """The answer to a `?rows=` request. Rows are not cached; an answer without
        `meta["rows"]` is the whole table (the range covered every position), which is."""
        tables = self._parse_table(reply, name, whole=False)
        got = tables.meta.get("rows")
        if got is None:
            checked_digest(reply)  # the whole table after all: it must carry its digest
            self._store(tables, reply)
            if record_id is not None and self.cache is not None:
                record = {"ns": "tables", "key": tables.key}
                self._cache_write(self._remember, record_id, record)
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
        record_id = self._request_id("POST /v1/tables", body)
        record = self.cache.lookup(record_id) if self.cache is not None else None
        if span is not None:
            if record is not None and record.get("ns") == "tables":
                part = self._cached_rows(str(record["key"]), name, span)
                if part is not None:
                    return part
            if self.offline:
                raise CacheMissError("offline, and no cached table for this spec")
            params = {**SAFETENSORS, "rows": rows_param(*span)}
            reply = yield Call("POST", "/v1/tables", json=body, params=params)
            return self._rows_reply(reply, name, span, record_id)
        if record is not None and record.get("ns") == "tables":
            url = record.get("url")
            cached, known = yield from self._cached_table(
                str(record["key"]), name, url if isinstance(url, str) else None
            )
            if cached is not None and known:
                return cached
        if self.offline:
            raise CacheMissError("offline, and no cached table for this spec")
        reply = yield Call("POST", "/v1/tables", json=body, params=SAFETENSORS)
        tables = self._parse_table(reply, name)
        self._store(tables, reply)
        if self.cache is not None:
            record = {"ns": "tables", "key": tables.key}
            location = reply.headers.get("content-location", "")
            if location.startswith(f"/v1/tables/{tables.key}."):
                record["url"] = location  # answered by any replica, after any restart
            self._cache_write(self._remember, record_id, record)
        return tables

    def table_by_key(
        self,
        key: str,
        name: str | None = None,
        spec: Mapping[str, Any] | None = None,
        rows: Rows | None = None,
        url: str | None = None,
        device: str | None = None,
    ) -> Flow[Tables]:
        """GET the table `key` names (cache first). `key` is a content key or a table URL the
        server handed out (`/v1/tables/{key}.{spec}`, absolute or a path). The request goes to
        that URL, or to the one `url` (a server's `url` for the key) or the canonical `spec`
        give, which any replica answers; only a bare key with neither goes to
        `/v1/tables/{key}`, which a server that never resolved it answers 404: the table is
        then served from the cache when held (content keys never change meaning), else
        recomputed from `spec`. With `rows`, only those positions (sliced from the cached whole
        table when there is one). With `device` ("cpu": the reference bytes, `?device=cpu`,
        whatever the server's device), the server is asked and the disk cache neither read nor
        written (it holds what the server's own device computed)."""
        key, path = split_table_ref(key)
        if path is None and url is not None:
            found_key, path = split_table_ref(url)
            if found_key != key:
                raise ValueError(f"the url {url!r} names another key than {key}")
        if path is None and spec is not None:
            path = table_path(key, spec)
        where = path or table_path(key)
        if device is not None:
            if self.offline:
                raise CacheMissError(f"offline, and table {key} on {device} needs the server")
            params = {**SAFETENSORS, "device": device}
            if rows is not None:
                params["rows"] = rows_param(*rows_arg(rows))
            reply = yield Call("GET", where, params=params)
            if rows is not None:
                return self._rows_reply(reply, name, rows_arg(rows), None)
            return self._parse_table(reply, name, key)
        if rows is not None:
            span = rows_arg(rows)
            part = self._cached_rows(key, name, span)
            if part is not None:
                return part
            if self.offline:
                raise CacheMissError(f"offline, and table {key} is not in the cache")
            params = {**SAFETENSORS, "rows": rows_param(*span)}
            reply = yield Call("GET", where, params=params)
            if reply.status == 404 and spec is not None and path is None:
                tables = yield from self.table(spec, name, span)
                return tables
            return self._rows_reply(reply, name, span, None)
        cached, _ = yield from self._cached_table(key, name, path)
        if cached is not None:
            return cached
        if self.offline:
            raise CacheMissError(f"offline, and table {key} is not in the cache")
        reply = yield Call("GET", where, params=SAFETENSORS)
        if reply.status == 404 and spec is not None and path is None:
            tables = yield from self.table(spec, name)
            return tables
        tables = self._parse_table(reply, name, key)
        self._store(tables, reply)
        return tables

    # the convenience methods: a spec from their keywords, then `table` ------------------------

    def rope(
        self,
        head_dim: int,
        max_positions: int | None,
        options: RopeOptions,
        rows: Rows | None,
    ) -> Flow[Tables]:
        """`table` for the `rope` spec of transformers-style keywords (`rope_spec`)."""
        spec = rope_spec(head_dim=head_dim, max_positions=max_positions, **options)
        return self.table(spec, rows=rows)

    def alibi(self, num_heads: int, options: AlibiOptions, rows: Rows | None) -> Flow[Tables]:
        """`table` for an `alibi` spec."""
        return self.table(family_spec("alibi", num_heads=num_heads, **options), rows=rows)

    def sinusoidal(
        self,
        dim: int,
        max_positions: int | None,
        options: SinusoidalOptions,
        rows: Rows | None,
    ) -> Flow[Tables]:
        """`table` for a `sinusoidal` spec."""
        spec = family_spec("sinusoidal", dim=dim, max_positions=max_positions, **options)
        return self.table(spec, rows=rows)

    def t5_bias(self, query_length: int, options: T5BiasOptions, rows: Rows | None) -> Flow[Tables]:
        """`table` for a `t5_bias` spec."""
        spec = family_spec("t5_bias", query_length=query_length, **options)
        return self.table(spec, rows=rows)

    # discovery -------------------------------------------------------------------------------

    def get_json(self, path: str) -> Flow[Any]:
        if self.offline:
            raise CacheMissError(f"offline: GET {path} needs the server")
        reply = yield Call("GET", path)
        if reply.status != 200:
            raise api_error(reply)
        return reply.json()

    def resolve(self, config: ConfigLike, overrides: Mapping[str, Any]) -> Flow[ResolvedSpecs]:
        """POST /v1/resolve; the answer is remembered so that it also works offline."""
        body = {
            "hf_config": load_config(config, offline=self.offline),
            **{k: v for k, v in overrides.items() if v is not None},
        }
        record_id = self._request_id("POST /v1/resolve", body)
        record = self.cache.lookup(record_id) if self.cache is not None else None
        answer: Any = None
        if self.offline:
            if record is None:
                raise CacheMissError("offline, and this config was never resolved here")
            answer = record
        else:
            try:
                reply = yield Call("POST", "/v1/resolve", json=body)
            except TransportError:
                if record is None:
                    raise
                answer = record
            else:
                if reply.status != 200:
                    raise api_error(reply)
                answer = reply.json()
                if self.cache is not None:
                    self._cache_write(
                        self._remember,
                        record_id,
                        {
                            "ns": "resolve",
                            "specs": answer.get("specs"),
                            "unserved": answer.get("unserved") or [],
                        },
                    )
        specs, unserved = answer.get("specs"), answer.get("unserved") or []
        if not isinstance(specs, list):
            raise DecodeError("the resolve answer has no `specs` list")
        if not isinstance(unserved, list):
            raise DecodeError("the resolve answer's `unserved` is not a list")
        return ResolvedSpecs(
            [ResolvedSpec.from_json(spec) for spec in specs],
            [UnservedPart.from_json(part) for part in unserved],
        )

    def tables_for_model(
        self, config: ConfigLike, overrides: Mapping[str, Any], device: str | None = None
    ) -> Flow[dict[str, Tables]]:
        specs = yield from self.resolve(config, overrides)
        out: dict[str, Tables] = {}
        for item in specs:
            tables = yield from self.table_by_key(
                item.key, item.name, item.spec, url=item.url, device=device
            )
            out[item.name] = tables.with_notes(item.notes, item.name)
        return out

    def presets(self) -> Flow[list[Preset]]:
        data = yield from self.get_json("/v1/presets")
        return [Preset.from_json(preset) for preset in data.get("presets", [])]

    def preset(self, name: str) -> Flow[Preset]:
        data = yield from self.get_json(f"/v1/presets/{name}")
        return Preset.from_json(data)

    def preset_tables(self, name: str) -> Flow[dict[str, Tables]]:
        preset = yield from self.preset(name)
        out: dict[str, Tables] = {}
        for part in preset.parts:
            out[part.name] = yield from self.table_by_key(part.key, part.name, part.spec)
        return out

    def mrope_position_ids(
        self,
        layout: Sequence[Mapping[str, Any]],
        model_type: str | None,
        config: ConfigLike | None,
        options: Mapping[str, Any],
    ) -> Flow[MRopePositions]:
        """POST /v1/mrope/position_ids (needs the server: nothing is cached)."""
        if self.offline:
            raise CacheMissError("offline: POST /v1/mrope/position_ids needs the server")
        body: dict[str, Any] = {"layout": [dict(span) for span in layout]}
        if model_type is not None:
            body["model_type"] = model_type
        if config is not None:
            body["hf_config"] = load_config(config, offline=self.offline)
        body.update({k: v for k, v in options.items() if v is not None})
        reply = yield Call("POST", "/v1/mrope/position_ids", json=body)
        if reply.status != 200:
            raise api_error(reply)
        return MRopePositions.from_json(reply.json())

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
        checked_digest(reply)
        data = bytes(reply.content)
        metadata = onnx_metadata(data)
        key = reply_key(reply) or metadata.get("export_key", "")
        return OnnxModel(key=key, data=data, metadata=metadata)

    def onnx(self, spec: Mapping[str, Any], graph: str, options: OnnxOptions) -> Flow[OnnxModel]:
        """POST /v1/onnx (cache first, revalidated against GET /v1/onnx/{key})."""
        body = onnx_body(spec, graph, options)
        record_id = self._request_id("POST /v1/onnx", body)
        record = self.cache.lookup(record_id) if self.cache is not None else None
        if record is not None and record.get("ns") == "onnx" and self.cache is not None:
            key = str(record["key"])
            data = self._load("onnx", key)
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
                    self._cache_write(self._cache_store, "onnx", fresh.key, fresh.data, reply)
                    return fresh
        if self.offline:
            raise CacheMissError("offline, and no cached ONNX model for this request")
        reply = yield Call("POST", "/v1/onnx", json=dict(body))
        model = self._parse_onnx(reply)
        if self.cache is not None and valid_key(model.key):
            self._cache_write(self._cache_store, "onnx", model.key, model.data, reply)
            self._cache_write(self._remember, record_id, {"ns": "onnx", "key": model.key})
        return model
