"""Shared serving helpers of the routes: sending a table, ETags, binding uploaded weight tables.

Route modules never import each other; what several of them need lives here:

- `serve_table`: negotiate the format, check limits, look the table up in the cache (computing it
  at most once) and send it (`POST /v1/tables`, `GET /v1/tables/{key}`,
  `GET /v1/presets/{name}/{part}/table`), with `TABLE_PARAMETERS` and `TABLE_RESPONSES` for
  their OpenAPI and `table_params` reading the query;
- `etag_matches`, `representation_etag`, `IMMUTABLE`: the validators and caching of immutable
  resources (tables, ONNX models);
- `bind_tables`, `stored_tables`, `unbound`, `unknown_table`: the uploaded weight tables a spec
  names (`learned`, `relative_index`), bound from the table store before anything is computed
  (`/v1/tables`, `/v1/onnx`, the `/v2` models);
- `describe_spec`: a canonical spec as the catalog shows it (presets, `/v1/resolve`), its `url`
  the form any replica answers (`posenc.api.tableurl`: `/v1/tables/{key}.{spec}`);
- `serve_preview`: a strided sample of one tensor as JSON (`GET /v1/tables/{key}/preview`, what
  the explorer at `/ui` plots), at most `max_points` elements whatever the table's size.
- `repr_digest`, `entry_digest`: the RFC 9530 `Repr-Digest` of a representation, computed once
  per cached body and kept on its cache entry (tables, ONNX models).

Order of work per table request, cheapest first: parse and canonicalise the spec (the route),
compute its size from `spec.outputs()` (413 over the limit: nothing allocated), validate format,
tensor and rows, answer 304 to a matching `If-None-Match` (GET), bind an uploaded weight table
(`bind_tables`), then look the table up in the cache and send bytes prepared once per
(table, format, tensors) or a zero-copy view.

Memory: before a body is built or sent, its bytes are charged to the cache's in-flight budget
(`runtime.budget`; 503 `overloaded` when they do not fit) and the charge is held until the last
byte is handed over (`BodyResponse`). Sends of one cached buffer share one charge (they share its
memory); a body built per request (row slices, a table too large to keep) has its own; a table too
large for the cache is charged while its bodies are sent, since they keep it alive.

Each representation has its own strong ETag (`representation_etag`): `"<key>"` for the default,
the whole table as safetensors, and `"<key>.<format>[.<tensor>][.<start>-<end>]"` otherwise, so a
304 (or an `If-Range`) only ever validates the bytes the request would get. A table built on a
GPU adds `@<device>` (`"<key>@cuda:0"`): its values may differ from the CPU reference by an ulp
and its safetensors metadata names the device, so replicas on different devices never share a
strong ETag for different bytes. `Vary: Accept` is sent whenever the format was negotiated (no
`format=`).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import Callable, Hashable
from typing import Any

import orjson
import torch
from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from posenc.api.errors import ApiError
from posenc.api.formats import (
    DEFAULT_FORMAT,
    FORMATS,
    Format,
    Selection,
    build_json,
    build_npy,
    build_npz,
    build_safetensors,
    content_range,
    cpu_tensors,
    negotiate,
    parse_rows,
    raw_view,
    select,
    selected_infos,
    selected_tensors,
)
from posenc.api.state import AppState
from posenc.api.tableurl import table_url
from posenc.encodings import (
    FieldProblem,
    SpecBase,
    Table,
    TensorInfo,
    canonical_dict,
    canonical_json,
    content_key,
)
from posenc.encodings.weights import (
    TableStore,
    UnknownTableError,
    WeightTableSpec,
    resolve_tables,
)
from posenc.runtime import OFFLOAD_BYTES, Buffer, CacheEntry, Lease, TableCache
from posenc.runtime.rows import block_pool, preview_steps
from posenc.verified import VERIFIED_AGAINST_TEXT

IMMUTABLE = "public, max-age=31536000, immutable"
"""`Cache-Control` of content-addressed resources (`/v1/tables/{key}[.{spec}]`,
`/v1/onnx/{key}`)."""

TABLE_PARAMETERS: list[dict[str, Any]] = [
    {
        "name": "format",
        "in": "query",
        "required": False,
        "schema": {"type": "string", "enum": ["safetensors", "npz", "npy", "raw", "json"]},
        "description": "overrides Accept; safetensors by default",
    },
    {
        "name": "tensor",
        "in": "query",
        "required": False,
        "schema": {"type": "string"},
        "description": "send only this tensor (required for npy and raw)",
    },
    {
        "name": "rows",
        "in": "query",
        "required": False,
        "schema": {"type": "string", "pattern": "^[0-9]*:[0-9]*$"},
        "description": "START:END: positions [START, END) only",
        "example": "0:2048",
    },
]
"""The table query parameters. Hot routes read them from the request directly (FastAPI's
per-parameter validation costs more than the rest of a cache hit); this documents them."""


def table_params(request: Request) -> tuple[str | None, str | None, str | None]:
    """(format, tensor, rows) from the query string."""
    query = request.query_params
    return query.get("format"), query.get("tensor"), query.get("rows")


TABLE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The table. Headers: ETag, Content-Location, X-Posenc-Key, "
        "X-Posenc-Device (raw also X-Posenc-Dtype, X-Posenc-Shape).",
        "content": {
            "application/vnd.safetensors": {},
            "application/x-npz": {},
            "application/x-npy": {},
            "application/octet-stream": {},
            "application/json": {},
        },
    },
    400: {"description": "Bad request (malformed JSON, unknown format/tensor, bad rows)"},
    413: {"description": "Table or body over the limit (detail names size and maximum)"},
    422: {"description": "Invalid spec: detail lists [{field, message, value}]"},
    503: {
        "description": "Too many computations in flight (`busy`), or the in-flight byte budget "
        "is spent (`overloaded`); Retry-After"
    },
}

SEND_CHUNK = 1 << 20
"""Bytes handed to the server per `http.response.body` message of a table body."""

JSON_BYTES_PER_ELEMENT = 24
"""What a `format=json` body is charged per element (orjson writes a float32 in at most ~16
characters plus a separator; integers in fewer)."""


class BodyResponse(Response):
    """A table body sent as views of its buffer, `SEND_CHUNK` bytes at a time, holding its
    in-flight `leases` until the send ends, however it ends (completed, client gone, cancelled).

    Each view is handed to uvicorn, which waits for the transport to drain before the next one:
    a slow client is paced by flow control instead of having the rest of a large body copied
    into the transport's buffer, and nothing is copied from the cached buffer.
    """

    def __init__(
        self,
        body: Buffer,
        status_code: int,
        headers: dict[str, str],
        media_type: str,
        leases: list[Lease],
        keep: object = None,
    ) -> None:
        super().__init__(None, status_code, headers, media_type)
        view = memoryview(body)
        self.view = view if view.format == "B" and view.ndim == 1 else view.cast("B")
        self.leases = leases
        self.keep = keep  # what the charges name (the entry) stays alive while they are held
        self.headers["content-length"] = str(self.view.nbytes)

    def release(self) -> None:
        """Give the in-flight charges back (idempotent)."""
        for lease in getattr(self, "leases", ()):
            lease.release()

    def __del__(self) -> None:
        # a response dropped unsent (the request cancelled before it was called) must not keep
        # its charges for the life of the process
        self.release()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            view, size = self.view, self.view.nbytes
            start = 0
            while True:
                end = min(start + SEND_CHUNK, size)
                await send(
                    {"type": "http.response.body", "body": view[start:end], "more_body": end < size}
                )
                if end >= size:
                    break
                start = end
        finally:
            self.release()


def _charges(
    cache: TableCache,
    entry: CacheEntry,
    fmt: Format,
    selection: Selection,
    nbytes: int,
) -> list[tuple[Hashable, int]]:
    """What sending this representation of `entry` holds outside the cache budget, as
    (charge name, bytes): the table's tensors for a zero-copy raw view, a prepared body (shared
    by every send of it while the entry is resident), or a body built for this request alone;
    plus the table itself when the cache does not keep it."""
    entry_id = id(entry)
    resident = cache.peek(entry.key) is entry
    charges: list[tuple[Hashable, int]] = []
    if not resident:
        charges.append((("table", entry_id), entry.table_bytes))
    size = nbytes
    if fmt.name == "json":
        size = max(nbytes, JSON_BYTES_PER_ELEMENT * (nbytes // 2))
    if fmt.name == "raw" and entry.table.tensors[selection.names[0]].device.type == "cpu":
        name = selection.names[0]
        if resident:  # a view of the cached tensor, whatever the rows
            tensor = entry.table.tensors[name]
            charges.append((("tensor", entry_id, name), tensor.numel() * tensor.element_size()))
    elif selection.rows is None and resident:
        charges.append((("body", entry_id, fmt.name, selection.names), size))
    else:
        charges.append((object(), size))
    return charges


def _acquire(cache: TableCache, charges: list[tuple[Hashable, int]]) -> list[Lease]:
    """Leases for every charge, or none (`Overloaded` raised, those taken given back)."""
    budget = cache.budget
    leases: list[Lease] = []
    if budget is None:
        return leases
    try:
        for name, size in charges:
            leases.append(budget.acquire(name, size))
    except BaseException:
        for lease in leases:
            lease.release()
        raise
    return leases


def etag_matches(header: str | None, etag: str) -> bool:
    """True when an `If-None-Match` header lists `etag` (quoted; compared weakly, as RFC 9110
    says for If-None-Match) or `*`."""
    if not header:
        return False
    for tag in header.split(","):
        tag = tag.strip()
        if tag == "*" or tag.removeprefix("W/") == etag:
            return True
    return False


def representation_etag(
    key: str, fmt: Format, selection: Selection, names: tuple[str, ...], device: str = "cpu"
) -> str:
    """The strong ETag of one representation of table `key` (`names`: all its tensors) built on
    `device`.

    `"<key>"` for the whole table as safetensors (the default: what clients revalidate);
    otherwise `"<key>.<format>[.<tensor>][.<start>-<end>]"`, naming the tensor only when it is
    not the whole table and the rows only when they are not all of them (`select` normalises
    both), so equal bytes have one tag and different bytes never share one. Off the CPU (the
    reference device) the device follows: `"<key>@cuda:0"`.
    """
    whole = selection.names == names
    tag = key
    if not (fmt.name == DEFAULT_FORMAT and whole and selection.rows is None):
        parts = [key, fmt.name]
        if not whole:
            parts.extend(selection.names)
        if selection.rows is not None:
            parts.append(f"{selection.rows[0]}-{selection.rows[1]}")
        tag = ".".join(parts)
    if device != "cpu":
        tag = f"{tag}@{device}"
    return f'"{tag}"'


def repr_digest(body: Buffer) -> str:
    """The RFC 9530 `Repr-Digest` field value of `body`: `sha-256=:<base64 of the sha256>:`
    (a structured-field dictionary holding one byte sequence)."""
    digest = hashlib.sha256(body).digest()
    return f"sha-256=:{base64.b64encode(digest).decode()}:"


async def entry_digest(entry: CacheEntry, variant: Hashable, body: Buffer) -> str:
    """`repr_digest(body)` for the whole representation `variant` of `entry`, computed once and
    kept on the entry (in a worker thread above `OFFLOAD_BYTES`: hashlib releases the GIL)."""
    known = entry.digests.get(variant)
    if known is not None:
        return known
    size = body.nbytes if isinstance(body, memoryview) else len(body)
    value = (
        await asyncio.to_thread(repr_digest, body) if size > OFFLOAD_BYTES else repr_digest(body)
    )
    entry.digests[variant] = value
    return value


def check_size(state: AppState, outputs: dict[str, TensorInfo]) -> None:
    """Refuse a table over `max_response_bytes` (413 `too_large`) before it is computed."""
    size = sum(info.nbytes for info in outputs.values())
    limit = state.settings.max_response_bytes
    if size > limit:
        raise ApiError(
            413,
            "too_large",
            f"the table is {size} bytes, over the limit of {limit} bytes; ask for fewer "
            "positions or a smaller dtype",
            {"size_bytes": size, "max_bytes": limit},
        )


def _metadata(table: Table, entry: CacheEntry, selection: Selection) -> dict[str, Any]:
    meta = dict(table.meta)
    if entry.fallback:
        meta["fallback"] = entry.fallback
    if selection.rows is not None:
        meta["rows"] = list(selection.rows)
    return meta


def _builder(
    kind: str, key: str, spec: SpecBase, fmt: Format, selection: Selection, entry: CacheEntry
) -> Callable[[Table], Buffer]:
    """A function from the table to the response body for this format and selection."""

    def build(table: Table) -> Buffer:
        meta = _metadata(table, entry, selection)
        if fmt.name == "safetensors":  # copies GPU tensors straight into the body
            header = {
                "format": "pt",
                "key": key,
                "kind": kind,
                "spec": canonical_json(spec),
                "algorithm_version": str(meta.get("algorithm_version", "")),
                "device": entry.device,
                "meta": orjson.dumps(meta).decode(),
                "verified_against": VERIFIED_AGAINST_TEXT,
            }
            return build_safetensors(selected_tensors(table.tensors, selection), header)
        tensors = cpu_tensors(table.tensors, selection)
        if fmt.name == "npz":
            return build_npz(tensors)
        if fmt.name == "npy":
            return build_npy(next(iter(tensors.values())))
        if fmt.name == "raw":
            # reached off the CPU only (`_body` sends CPU tables as views): the host copy made
            # by `cpu_tensors` is the body, kept as a view, not copied again into bytes
            return raw_view(next(iter(tensors.values())))
        head = {"key": key, "kind": kind, "spec": meta.get("spec"), "meta": meta}
        return build_json(tensors, head)

    return build


async def _body(
    state: AppState,
    key: str,
    spec: SpecBase,
    fmt: Format,
    selection: Selection,
    entry: CacheEntry,
    nbytes: int,
) -> Buffer:
    """The response body: a zero-copy view for raw on the CPU, else bytes prepared once per
    whole-table variant (row slices are built per request, off the loop when large)."""
    if fmt.name == "raw":
        name = selection.names[0]
        tensor = entry.table.tensors[name]
        if tensor.device.type == "cpu":
            return raw_view(cpu_tensors({name: tensor}, selection)[name])
    build = _builder(spec.kind, key, spec, fmt, selection, entry)
    if selection.rows is None:
        return await state.require_cache().prepare(entry, (fmt.name, selection.names), build)
    if nbytes > OFFLOAD_BYTES:
        return await asyncio.to_thread(build, entry.table)
    return build(entry.table)


async def serve_table(
    request: Request,
    state: AppState,
    spec: SpecBase,
    key: str,
    format: str | None,
    tensor: str | None,
    rows: str | None,
    *,
    cache_control: str | None,
) -> Response:
    """Negotiate, check limits, look up (or compute) and send the table for a canonical spec."""
    fmt = negotiate(format, request.headers.get("accept"))
    outputs = state.index.outputs(key, spec)  # shapes only: nothing allocated before the check
    check_size(state, outputs)
    selection = select(spec.kind, outputs, fmt, tensor, parse_rows(rows))
    infos = selected_infos(outputs, selection)
    if fmt.name == "json":
        elements = sum(i.numel for i in infos.values())
        limit = state.settings.json_max_elements
        if elements > limit:
            raise ApiError(
                413,
                "too_large_for_json",
                f"{elements} elements exceed the JSON limit of {limit}: use a binary format "
                "(safetensors, npy, raw) or fewer rows",
                {"elements": elements, "max_elements": limit},
            )
    cache = state.require_cache()
    resident = cache.peek(cache.key_for(spec, key))
    # the device of the bytes: the resident entry's (a CUDA OOM falls back to the CPU), else
    # where the cache computes
    device = resident.device if resident is not None else str(cache.device)
    etag = representation_etag(key, fmt, selection, tuple(outputs), device)
    headers = {
        "ETag": etag,
        "Content-Location": table_url(spec, key),
        "X-Posenc-Key": key,
        "X-Posenc-Kind": spec.kind,
    }
    if format is None:
        headers["Vary"] = "Accept"
    if cache_control:
        headers["Cache-Control"] = cache_control
    if request.method == "GET" and etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    spec = bind_tables(cache, state.require_tables(), spec, key)
    entry, outcome = await cache.get(spec, key)
    if entry.device != device:
        etag = headers["ETag"] = representation_etag(
            key, fmt, selection, tuple(outputs), entry.device
        )
    nbytes = sum(i.nbytes for i in infos.values())
    # charged before the body is built (or a cached one is held by the send)
    leases = _acquire(cache, _charges(cache, entry, fmt, selection, nbytes))
    try:
        body = await _body(state, key, spec, fmt, selection, entry, nbytes)
        headers["X-Posenc-Device"] = entry.device
        headers["X-Posenc-Cache"] = outcome
        if entry.fallback:
            headers["X-Posenc-Fallback"] = entry.fallback
        headers["Content-Disposition"] = f'inline; filename="{key}.{fmt.suffix}"'
        if selection.rows is None:
            # row slices are built per request (and never cached by clients): no digest for them
            headers["Repr-Digest"] = await entry_digest(entry, (fmt.name, selection.names), body)
        status = 200
        if fmt.single:
            name = selection.names[0]
            headers["X-Posenc-Tensor"] = name
        if fmt.name == "raw":
            info = infos[selection.names[0]]
            headers["X-Posenc-Dtype"] = info.dtype
            headers["X-Posenc-Shape"] = ",".join(str(d) for d in info.shape)
            headers["Accept-Ranges"] = "bytes"
            body, status = _apply_range(request, etag, body, headers)
    except BaseException:
        for lease in leases:
            lease.release()
        raise
    return BodyResponse(body, status, headers, fmt.media_type, leases, entry)


def _apply_range(
    request: Request, etag: str, body: Buffer, headers: dict[str, str]
) -> tuple[Buffer, int]:
    """A single `bytes=` Range on a raw body: 206 with a zero-copy slice, 416 when unsatisfiable;
    ignored when absent, malformed, multi-range, or `If-Range` is not this representation's ETag
    (compared strongly)."""
    if_range = request.headers.get("if-range")
    if if_range is not None and if_range.strip() != etag:
        return body, 200
    size = len(body) if isinstance(body, bytes) else body.nbytes
    span = content_range(request.headers.get("range"), size)
    if span is None:
        return body, 200
    if span is False:
        raise ApiError(
            416,
            "range_not_satisfiable",
            f"the range is outside the {size}-byte body",
            {"size_bytes": size},
            {"Content-Range": f"bytes */{size}"},
        )
    assert span is not True
    first, last = span
    headers["Content-Range"] = f"bytes {first}-{last}/{size}"
    return memoryview(body)[first : last + 1], 206


def unknown_table(key: str, field: str = "table_key") -> UnknownTableError:
    """The error for a table key the store does not hold (404 `unknown_table`), naming `field`
    (the spec's key field: `table_key`, `relative_position_bias_table_key`)."""
    return UnknownTableError(
        f"no uploaded table has key {key!r} here (never uploaded, or dropped from the table "
        "store): upload it to /v1/uploads again",
        [FieldProblem(field, "no such table in the store", key)],
    )


def stored_tables(store: TableStore, spec: SpecBase) -> SpecBase:
    """`spec` with the weight table it names bound from `store` (an inline table is stored);
    specs naming none pass through. Raises `UnknownTableError` (404) naming the spec's key field
    when the store does not hold the key."""
    try:
        return resolve_tables(spec, store)
    except UnknownTableError:
        if not isinstance(spec, WeightTableSpec):
            raise
        raise unknown_table(str(spec.named_key), spec.table_fields.key) from None


def bind_tables(cache: TableCache, store: TableStore, spec: SpecBase, key: str) -> SpecBase:
    """`spec` (content key `key`) ready for the cache: `stored_tables`, except that a key-only
    spec whose table is resident in `cache` needs no binding (its upload may have left the store
    since)."""
    if not isinstance(spec, WeightTableSpec) or spec.named_table_shape() is None:
        return spec
    if spec.bound is None and cache.peek(cache.key_for(spec, key)) is not None:
        return spec
    return stored_tables(store, spec)


def unbound(spec: SpecBase) -> SpecBase:
    """`spec` without a bound table, to be remembered by key (the store holds the values)."""
    if isinstance(spec, WeightTableSpec) and spec.bound is not None:
        return type(spec).model_validate(canonical_dict(spec))
    return spec


def describe_spec(spec: SpecBase, key: str | None = None) -> dict[str, Any]:
    """A canonical spec as the catalog shows it: kind, key, table URL, spec, outputs, bytes."""
    key = key or content_key(spec)
    return {
        "kind": spec.kind,
        "key": key,
        "url": table_url(spec, key),
        "spec": canonical_dict(spec),
        "outputs": {
            name: {"shape": list(info.shape), "dtype": info.dtype}
            for name, info in spec.outputs().items()
        },
        "bytes": spec.output_bytes(),
    }


PREVIEW_POINTS = 65536
"""`max_points` of a preview when the request names none (capped by `json_max_elements`)."""

PREVIEW_PARAMETERS: list[dict[str, Any]] = [
    {
        "name": "tensor",
        "in": "query",
        "required": False,
        "schema": {"type": "string"},
        "description": "the tensor to preview (required when the table has several)",
    },
    TABLE_PARAMETERS[2],
    {
        "name": "max_points",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1},
        "description": f"at most this many elements (default {PREVIEW_POINTS}, at most the "
        "server's json_max_elements)",
    },
    {
        "name": "pool",
        "in": "query",
        "required": False,
        "schema": {"type": "string", "enum": ["none", "block"], "default": "none"},
        "description": "block: add `pooled` {min, max, mean}, each of the sample's shape, over "
        "the block of elements each sampled element stands for (runtime.rows.block_pool)",
    },
]


def parse_max_points(text: str | None, limit: int) -> int:
    """The `max_points` query parameter: an integer in [1, `limit`], 400 `invalid_max_points`
    otherwise; `min(PREVIEW_POINTS, limit)` when absent."""
    value: int | None
    if text is None:
        value = min(PREVIEW_POINTS, limit)
    else:
        # ASCII digits only, as every number in a query (int() would take "١٢" or " +12_0")
        value = int(text) if text.isascii() and text.isdigit() else None
    if value is None or not 1 <= value <= limit:
        raise ApiError(
            400,
            "invalid_max_points",
            f"max_points must be an integer from 1 to {limit}, got {text!r}",
            [{"field": "max_points", "message": f"need 1 <= max_points <= {limit}", "value": text}],
        )
    return value


async def serve_preview(
    request: Request,
    state: AppState,
    spec: SpecBase,
    key: str,
    tensor: str | None,
    rows: str | None,
    max_points_text: str | None,
    pool_text: str | None = None,
) -> Response:
    """`{"key", "kind", "tensor", "dtype", "shape", "row_axis", "axes", "data"}`: one tensor of
    the table, rows `rows` (its position axis) sampled with `preview_steps` to at most
    `max_points` elements, as JSON (bfloat16 as float). With `pool=block`, also `"pooled":
    {"min", "max", "mean"}` over each sampled element's block (`block_pool`; what the explorer's
    heatmaps draw, so a column faster than the stride is not aliased).

    `shape` is the whole tensor's; `axes[i]` = `{"start", "step", "count"}` says which indices of
    axis i the sample holds (`start + k*step`, k < count); `data` is the sample, flat, row-major.
    Everything is checked from shapes before the table is computed: the table's size (413, as
    for the table itself), `max_points`, the tensor and the rows (400). The sample is taken from
    the cached table (computed once, like any table request) and is immutable like it.
    """
    outputs = state.index.outputs(key, spec)
    check_size(state, outputs)
    max_points = parse_max_points(max_points_text, state.settings.json_max_elements)
    if pool_text not in (None, "none", "block"):
        raise ApiError(
            400,
            "invalid_pool",
            f"pool must be none or block, got {pool_text!r}",
            [{"field": "pool", "message": "one of none, block", "value": pool_text}],
        )
    pooled = pool_text == "block"
    names = list(outputs)
    if tensor is None:
        if len(names) != 1:
            raise ApiError(
                400,
                "tensor_required",
                f"a preview shows one tensor: add tensor=NAME, one of {names}",
                [{"field": "tensor", "message": f"required, one of {names}", "value": None}],
            )
        tensor = names[0]
    selection = select(spec.kind, outputs, FORMATS["json"], tensor, parse_rows(rows))
    info = selected_infos(outputs, selection)[tensor]
    steps = preview_steps(info.shape, max_points)
    whole = outputs[tensor]
    first, last = selection.rows or (0, 0)
    cache = state.require_cache()
    resident = cache.peek(cache.key_for(spec, key))
    device = resident.device if resident is not None else str(cache.device)
    span = f".{first}-{last}" if selection.rows is not None else ""
    tag = f"{key}.preview.{tensor}{span}.{max_points}{'.pooled' if pooled else ''}"

    def etag(device: str) -> str:  # as representation_etag: off the CPU the device follows
        return f'"{tag}"' if device == "cpu" else f'"{tag}@{device}"'

    headers = {
        "ETag": etag(device),
        "Cache-Control": IMMUTABLE,
        "X-Posenc-Key": key,
        "X-Posenc-Kind": spec.kind,
    }
    if etag_matches(request.headers.get("if-none-match"), headers["ETag"]):
        return Response(status_code=304, headers=headers)
    spec = bind_tables(cache, state.require_tables(), spec, key)
    entry, outcome = await cache.get(spec, key)
    headers["ETag"] = etag(entry.device)  # a CUDA out-of-memory may have fallen back
    t = entry.table.tensors[tensor]
    if selection.rows is not None and info.row_axis is not None:
        t = t.narrow(info.row_axis, first, last - first)
    sample = t[tuple(slice(None, None, step) for step in steps)].to("cpu")
    if sample.dtype == torch.bfloat16:
        sample = sample.float()
    axes = [
        {
            "start": first if axis == info.row_axis and selection.rows is not None else 0,
            "step": step,
            "count": sample.shape[axis],
        }
        for axis, step in enumerate(steps)
    ]
    body: dict[str, Any] = {
        "key": key,
        "kind": spec.kind,
        "tensor": tensor,
        "dtype": whole.dtype,
        "shape": list(whole.shape),
        "row_axis": whole.row_axis,
        "axes": axes,
        "data": sample.contiguous().reshape(-1).numpy(),
    }
    if pooled:
        blocks = block_pool(t.to("cpu"), steps)
        body["pooled"] = {name: v.reshape(-1).numpy() for name, v in blocks.items()}
    headers["X-Posenc-Cache"] = outcome
    headers["X-Posenc-Device"] = entry.device
    return Response(
        orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
        media_type="application/json",
        headers=headers,
    )
