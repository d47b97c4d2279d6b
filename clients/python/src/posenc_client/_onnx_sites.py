"""Exact tables into the RoPE sites a model stores as tables rather than a consumer's cache
inputs (`posenc_check.sites`): `gathered` (a table the consumer's caches are gathered from by
position: posenc's own `rope/rotary` graph in mode `table`) and `folded` (full-width cos/sin
constants a static-shape `torch.onnx.export` multiplies into q and k). `verify` reports a
departing site of either kind as a `repair`; `attach_site_tables` is that repair.

Each stored tensor is rewritten in place, same name, shape and dtype: a gathered table gets the
exact half-width (P, d/2) rows of the table the site asks for (`sites.table_request`: its dtype
and rows), a folded constant (1, ..., 1, S, d) the full-width `cat(c, c)` of the first S rows
(the pairing its `rotate_half` reads). An initializer is replaced (one stored in external data
becomes inline); a `Constant` node gets the new `value`. Nothing else in the graph changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import onnx
from onnx import numpy_helper

from posenc_check.graph import Array
from posenc_check.sites import BakedCaches, TableRequest, find_sites, table_request
from posenc_client._exceptions import IncompatibleModelError
from posenc_client._formats import dtype_name
from posenc_client._onnx_patch import ModelLike, load_model, record_metadata
from posenc_client._tables import Tables

TABLE_SITES = ("gathered", "folded")
"""The site kinds `attach_site_tables` writes."""


def table_sites(model: ModelLike, nodes: Iterable[str] | None = None) -> list[BakedCaches]:
    """The model's `gathered` and `folded` sites (`posenc_check.sites.find_sites`), in its
    order; `nodes`: only the sites whose consumers are named."""
    proto = load_model(model)
    return [
        site
        for site in find_sites(proto, nodes)
        if isinstance(site, BakedCaches) and site.kind in TABLE_SITES
    ]


def site_arrays(site: BakedCaches, tables: Tables) -> tuple[Array, Array]:
    """The cos and sin arrays to store at `site`, in its tensors' shapes, from the exact table its
    `TableRequest` fetched (half-width (P', d/2), the site's dtype, P' at least its rows);
    `IncompatibleModelError` when the table does not fit the site."""
    dims = [int(d) for d in site.cos_tensor.dims]
    rows, width = dims[-2], dims[-1]
    half = width if site.layout == "half" else width // 2
    cos, sin = tables["cos"], tables["sin"]
    if cos.ndim != 2 or cos.shape[0] < rows or cos.shape[1] != half:
        raise IncompatibleModelError(
            f"the site {site.cos!r} holds {dims} ({site.kind}, {site.layout}); the table's "
            f"caches are {list(cos.shape)}: fetch at least {rows} rows of width {half}"
        )
    wanted = dtype_name(cos.dtype)
    stored = table_request(site).dtype
    if stored is not None and wanted != stored:
        raise IncompatibleModelError(
            f"the site {site.cos!r} stores {stored}; the table is {wanted}: fetch with "
            f"dtype={stored!r}"
        )
    out = []
    for values in (cos[:rows], sin[:rows]):
        if site.layout == "full":
            values = np.concatenate([values, values], axis=-1)
        elif site.layout == "interleaved":
            values = np.repeat(values, 2, axis=-1)
        out.append(np.ascontiguousarray(values).reshape(dims))
    return out[0], out[1]


def _store(graph: onnx.GraphProto, name: str, array: Array) -> None:
    """Put `array` in place of the initializer or `Constant` output `name`."""
    tensor = numpy_helper.from_array(array, name)
    for index, initializer in enumerate(graph.initializer):
        if initializer.name == name:
            graph.initializer[index].CopyFrom(tensor)
            return
    for node in graph.node:
        if node.op_type == "Constant" and name in node.output:
            for item in node.attribute:
                if item.name == "value":
                    item.t.CopyFrom(tensor)
                    return
    raise IncompatibleModelError(f"{name!r} is neither an initializer nor a Constant's value")


def attach_site_tables(
    model: ModelLike,
    tables_for: Callable[[TableRequest], Tables],
    *,
    nodes: Iterable[str] | None = None,
) -> onnx.ModelProto:
    """A copy of `model` whose `gathered` and `folded` RoPE sites hold the exact tables:
    `tables_for` gives the table for each site's `TableRequest` (what `posenc-client plug`
    fetches for the model's config: half-width caches of the site's dtype and rows). Records
    `{name: key}` per rewritten tensor in metadata property `posenc.tables`.
    `IncompatibleModelError` when the model has no such site or a table does not fit one."""
    proto = load_model(model)
    sites = table_sites(proto, nodes)
    if not sites:
        raise IncompatibleModelError(
            "the model has no RoPE table site (a table gathered by position, or folded cos/sin "
            "constants)"
        )
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    keys: dict[str, str] = {}
    for site in sites:
        tables = tables_for(table_request(site))
        arrays = site_arrays(site, tables)
        for stored, array in zip((site.cos_tensor, site.sin_tensor), arrays, strict=True):
            _store(out.graph, stored.name, array)
            keys[stored.name] = tables.key
    record_metadata(out, "posenc.tables", keys)
    return out
