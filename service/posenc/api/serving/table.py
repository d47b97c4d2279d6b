"""`serve_table`: one table representation sent (`POST /v1/tables`, `GET /v1/tables/{key}`,
`GET /v1/presets/{name}/{part}/table`): negotiate the format (`formats.py`), check limits, look
the table up in the cache (computing it at most once), answer 304 (`conditional.py`), encode
(the format's record), digest, take a Range (`ranges.py`) and send (`body.py`).

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
from collections.abc import Callable, Hashable
from typing import Any

import torch
from starlette.requests import Request
from starlette.responses import Response

from posenc.api.error_types import INVALID_DEVICE, TOO_LARGE, TOO_LARGE_FOR_JSON
from posenc.api.errors import ApiError
from posenc.api.serving.bind import bind_tables
from posenc.api.serving.body import BodyResponse, FixedHeaders, acquire
from posenc.api.serving.conditional import device_etag, not_modified
from posenc.api.serving.digest import entry_digest
from posenc.api.serving.encode import Encoding
from posenc.api.serving.formats import DEFAULT, Format, negotiate
from posenc.api.serving.host import body_charge, body_variant
from posenc.api.serving.prepared import Prepared, Signature
from posenc.api.serving.query import TableQuery
from posenc.api.serving.ranges import apply_range
from posenc.api.serving.selection import Selection, parse_rows, select, selected_infos
from posenc.api.state import AppState
from posenc.api.tableurl import table_url
from posenc.encodings import SpecBase, Table, TensorInfo
from posenc.encodings.weights import WeightTableSpec
from posenc.runtime import OFFLOAD_BYTES, Buffer, CacheEntry, Lease, TableCache

CPU = torch.device("cpu")
"""Where `?device=cpu` computes: the reference bytes."""


def _charges(
    cache: TableCache,
    entry: CacheEntry,
    fmt: Format,
    selection: Selection,
    nbytes: int,
) -> list[tuple[Hashable, int]]:
    """What sending this representation of `entry` holds outside the cache budget, as
    (charge name, bytes): the table's tensors for a zero-copy view, a prepared body (shared
    by every send of it while the entry is resident), or a body built for this request alone;
    plus the table itself when the cache does not keep it."""
    entry_id = entry.serial
    resident = cache.peek(entry.key) is entry
    charges: list[tuple[Hashable, int]] = []
    if not resident:
        charges.append((("table", entry_id), entry.table_bytes))
    if _is_view(entry, fmt, selection):
        if resident:  # a view of the cached tensor, whatever the rows
            name = selection.names[0]
            tensor = entry.table.tensors[name]
            charges.append((("tensor", entry_id, name), tensor.numel() * tensor.element_size()))
    elif selection.rows is None and resident:
        charges.append((body_charge(entry, fmt, selection), fmt.charge(nbytes)))
    else:
        charges.append((object(), fmt.charge(nbytes)))
    return charges


def _alone(cache: TableCache, charges: list[tuple[Hashable, int]]) -> list[tuple[Hashable, int]]:
    """`charges`, their last (the body) lowered so that together they take at most what the
    budget leaves beside the request's own charges (`InFlightBudget.room`) when they fit the
    whole budget: such a send runs alone, as a computation does, and the process holds at most
    the request's own charges beyond the budget. It is a table too large for the cache sent
    whole (the table plus its body: up to twice `max_response_bytes`, which the budget holds;
    the request's body beside them did not fit: 503 forever)."""
    budget = cache.budget
    if budget is None:
        return charges
    room = budget.room()
    over = sum(size for _, size in charges) - room
    if over <= 0 or over > budget.max_bytes - room:  # fits; or would not fit even alone
        return charges
    name, size = charges[-1]
    return [*charges[:-1], (name, max(0, size - over))]


def _own_charge(
    cache: TableCache,
    entry: CacheEntry,
    variant: Hashable,
    charges: list[tuple[Hashable, int]],
    leases: list[Lease],
    body: Buffer,
) -> list[Lease]:
    """`leases` with a prepared body's shared charge made the body's own when the entry did not
    keep it (it left the cache meanwhile, or did not fit beside it): the next request builds
    another, so one charge per variant would count one of several buffers alive. Named after
    the buffer, which the send keeps alive (callers that shared its build share its charge)."""
    name, size = charges[-1]
    if not (isinstance(name, tuple) and name[0] == "body") or entry.prepared.get(variant) is body:
        return leases
    own = acquire(cache, [(("built", id(body)), size)])
    leases[-1].release()
    return [*leases[:-1], *own]


def _is_view(entry: CacheEntry, fmt: Format, selection: Selection) -> bool:
    """Whether the body is a zero-copy view of the table (a `zero_copy` format of a CPU
    table), sent without preparing a body."""
    if not fmt.zero_copy:
        return False
    return all(entry.table.tensors[n].device.type == "cpu" for n in selection.names)


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
    if not (fmt is DEFAULT and whole and selection.rows is None):
        parts = [key, fmt.name]
        if not whole:
            parts.extend(selection.names)
        if selection.rows is not None:
            parts.append(f"{selection.rows[0]}-{selection.rows[1]}")
        tag = ".".join(parts)
    return device_etag(tag, device)


def check_size(state: AppState, outputs: dict[str, TensorInfo]) -> None:
    """Refuse a table over `max_response_bytes` (413 `too_large`) before it is computed."""
    size = sum(info.nbytes for info in outputs.values())
    limit = state.settings.max_response_bytes
    if size > limit:
        raise ApiError(
            TOO_LARGE,
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
    key: str, spec: SpecBase, fmt: Format, selection: Selection, entry: CacheEntry
) -> Callable[[Table], Buffer]:
    """A function from the table to the response body for this format and selection."""

    def build(table: Table) -> Buffer:
        meta = _metadata(table, entry, selection)
        return fmt.encode(Encoding(table.tensors, selection, key, spec, meta, entry.device))

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
    """The response body: a zero-copy view where the format allows it, else bytes prepared once
    per whole-table variant (row slices are built per request, off the loop when large)."""
    build = _builder(key, spec, fmt, selection, entry)
    if _is_view(entry, fmt, selection):
        return build(entry.table)
    if selection.rows is None:
        return await state.require_cache().prepare(entry, body_variant(fmt, selection), build)
    if nbytes > OFFLOAD_BYTES:
        return await asyncio.to_thread(build, entry.table)
    return build(entry.table)


async def serve_table(
    request: Request,
    state: AppState,
    spec: SpecBase,
    key: str,
    query: TableQuery,
    *,
    cache_control: str | None,
    shape: Signature | None = None,
    carried: bool = False,
) -> Response:
    """Negotiate, check limits, look up (or compute) and send the table for a canonical spec.

    `shape`: the request's shape (`prepared.signature`), under which a 200 whose body the cache
    keeps is remembered (`keep_prepared`) for the route to answer the next such request from
    (`carried`: the URL carries the spec)."""
    fmt = negotiate(query.format, request.headers.get("accept"))
    outputs = state.index.outputs(key, spec)  # shapes only: nothing allocated before the check
    check_size(state, outputs)
    selection = select(spec.kind, outputs, fmt, query.tensor, parse_rows(query.rows))
    infos = selected_infos(outputs, selection)
    if fmt.text:
        elements = sum(i.numel for i in infos.values())
        limit = state.settings.json_max_elements
        if elements > limit:
            raise ApiError(
                TOO_LARGE_FOR_JSON,
                f"{elements} elements exceed the JSON limit of {limit}: use a binary format "
                "(safetensors, npy, raw) or fewer rows",
                {"elements": elements, "max_elements": limit},
            )
    if query.device not in (None, "cpu"):
        raise ApiError(
            INVALID_DEVICE,
            f"device must be cpu (the reference bytes) or absent, got {query.device[:40]!r}",
            [{"field": "device", "message": "cpu, or absent", "value": query.device[:40]}],
        )
    on = CPU if query.device == "cpu" else None
    cache = state.require_cache()
    resident = cache.peek(cache.key_for(spec, key, on))
    # the device of the bytes: the resident entry's (a CUDA OOM falls back to the CPU), else
    # where the cache computes
    device = resident.device if resident is not None else str(on or cache.device)
    etag = representation_etag(key, fmt, selection, tuple(outputs), device)
    headers = {
        "ETag": etag,
        "Content-Location": table_url(spec, key),
        "X-Posenc-Key": key,
        "X-Posenc-Kind": spec.kind,
    }
    if query.format is None:
        headers["Vary"] = "Accept"
    if cache_control:
        headers["Cache-Control"] = cache_control
    unchanged = not_modified(request, headers)
    if unchanged is not None:
        return unchanged
    spec = bind_tables(cache, state.require_tables(), spec, key)
    entry, outcome = await cache.get(spec, key, on)
    if entry.device != device:
        etag = headers["ETag"] = representation_etag(
            key, fmt, selection, tuple(outputs), entry.device
        )
    nbytes = sum(i.nbytes for i in infos.values())
    # charged before the body is built (or a cached one is held by the send)
    charges = _alone(cache, _charges(cache, entry, fmt, selection, nbytes))
    leases = acquire(cache, charges)
    try:
        body = await _body(state, key, spec, fmt, selection, entry, nbytes)
        leases = _own_charge(cache, entry, (fmt.name, selection.names), charges, leases, body)
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
            headers["X-Posenc-Tensor"] = selection.names[0]
        if fmt.headers is not None:
            headers.update(fmt.headers(infos[selection.names[0]]))
        if fmt.ranges:
            body, status = apply_range(request, etag, body, headers)
    except BaseException:
        for lease in leases:
            lease.release()
        raise
    # the response keeps alive what it sends (a tensor, a prepared body), never the entry: an
    # entry evicted mid-send takes its other tensors and bodies with it, outside no charge
    response = BodyResponse(body, status, headers, fmt.media_type, leases)
    kept = (
        _is_view(entry, fmt, selection) or entry.prepared.get((fmt.name, selection.names)) is body
    )
    if shape is not None and status == 200 and selection.rows is None and kept:
        keep_prepared(state, shape, entry, response, key, spec, carried, charges)
    return response


def keep_prepared(
    state: AppState,
    shape: Signature,
    entry: CacheEntry,
    sent: BodyResponse,
    key: str,
    spec: SpecBase,
    carried: bool,
    charges: list[tuple[Hashable, int]],
) -> None:
    """Remember `sent` (a 200 of a whole representation whose body the cache keeps, taking
    `charges`) as the answer to `shape` while `entry` is resident, with `X-Posenc-Cache: hit`;
    not for a spec naming an uploaded weight table (bound from the store per request)."""
    cache = state.require_cache()
    if isinstance(spec, WeightTableSpec) or cache.peek(entry.key) is not entry:
        return
    raw = [(n, b"hit" if n == b"x-posenc-cache" else v) for n, v in sent.raw_headers]
    prepared = Prepared(key, spec, carried, FixedHeaders(raw), list(sent.views), charges)
    state.prepared.keep(shape, entry, prepared)
