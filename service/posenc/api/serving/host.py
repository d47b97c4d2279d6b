"""Host copies of tables computed off the CPU, kept on their cache entries.

A table a GPU server computed lives in device memory. Whatever must send its bytes needs them in
host memory: `serve_table` prepares one body per (format, tensors) on the entry
(`TableCache.prepare`, counted in the cache's byte budget while the entry is resident), and the
`/v2` decode-step templates (`api/oip/steps.py`) gather rows from a host copy of each output's
table. The raw body of one tensor (`GET /v1/tables/{key}?format=raw&tensor=<name>`) is exactly
that copy, so both use the same prepared buffer: `body_variant` names it for both.
"""

from __future__ import annotations

from collections.abc import Hashable

from posenc.api.serving.body import try_acquire
from posenc.api.serving.encode import raw_body
from posenc.api.serving.formats import FORMATS, Format
from posenc.api.serving.selection import Selection
from posenc.encodings import Table
from posenc.runtime import Buffer, CacheEntry, TableCache

RAW = FORMATS["raw"]


def body_variant(fmt: Format, selection: Selection) -> Hashable:
    """The name a whole-table body of `fmt` and `selection` is prepared under on its entry."""
    return (fmt.name, selection.names)


def body_charge(entry: CacheEntry, fmt: Format, selection: Selection) -> Hashable:
    """The in-flight charge name of that body while it is built or sent: one charge for every
    send of the one buffer."""
    return ("body", entry.serial, fmt.name, selection.names)


async def host_bytes(cache: TableCache, entry: CacheEntry, name: str) -> memoryview | None:
    """Tensor `name` of `entry` (a table off the CPU) as little-endian bytes in host memory
    that the entry keeps: the prepared raw body of that tensor, built off the event loop above
    `OFFLOAD_BYTES`, counted in the cache's byte budget while the entry is resident and dropped
    with it.

    None when the entry does not keep it: no longer resident, the copy does not fit in the
    cache budget beside the entry, or its build does not fit in the in-flight budget (charged
    as a send of that body is charged, the refusal not counted)."""
    selection = Selection((name,), None, (None,))
    variant = body_variant(RAW, selection)
    tensor = entry.table.tensors[name]
    size = tensor.numel() * tensor.element_size()
    leases = try_acquire(cache, [(body_charge(entry, RAW, selection), size)])
    if leases is None:
        return None

    def build(table: Table) -> Buffer:
        return raw_body(table.tensors, selection)

    try:
        body = await cache.prepare(entry, variant, build)
    finally:
        for lease in leases:
            lease.release()
    if entry.prepared.get(variant) is not body or not isinstance(body, memoryview):
        return None
    return body
