"""Shared by the query x key models (`alibi`, `t5_bias`): positions, the table, the block.

A spec with `query_length`/`key_length` describes a table: query row i is position
`query_offset + i`, key column j is position j. When every asked position falls inside it the
block is gathered from the cached table. Otherwise (or without lengths) the bounding block of the
asked positions is computed (queries `min(q)..max(q)`, keys `0..max(k)`) with the same spec, and
gathered; it is not cached. A block over the response limit (scattered positions span a block far
larger than the entries asked) is not computed: each model computes the asked pairs only.
"""

from __future__ import annotations

from typing import Any

import torch

from posenc.api.oip.codec import InferRequest, bad_request
from posenc.api.oip.models.base import INDEX_TYPES, TensorDecl, get_input, positions_in_range
from posenc.runtime.rows import row_index

MAX_POSITIONS = 1 << 24
LENGTH_FIELDS = ("query_length", "key_length", "query_offset")

QUERY_POSITIONS = TensorDecl(
    "query_positions", "INT64", (-1,), "query positions [Q]", INDEX_TYPES, optional=True
)
KEY_POSITIONS = TensorDecl(
    "key_positions", "INT64", (-1,), "key positions [K]", INDEX_TYPES, optional=True
)


def pair_positions(request: InferRequest) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(query positions [Q], key positions [K]) as int64, or None when neither is given."""
    q = get_input(request, QUERY_POSITIONS, ranks=(1,))
    k = get_input(request, KEY_POSITIONS, ranks=(1,))
    if q is None and k is None:
        return None
    if q is None or k is None:
        raise bad_request("give both query_positions and key_positions")
    for t, name in ((q, "query_positions"), (k, "key_positions")):
        if t.numel() == 0:
            raise bad_request(f"input {name!r} must not be empty")
        positions_in_range(t, name, MAX_POSITIONS)
    return q.to(torch.int64), k.to(torch.int64)


def has_table(spec: dict[str, Any]) -> bool:
    return spec.get("query_length") is not None or spec.get("key_length") is not None


def inside(table: Any, q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether every (query, key) position lies in the canonical table spec `table`."""
    off = int(table.query_offset)
    rows = row_index(q, off, int(table.query_length))
    cols = row_index(k, 0, int(table.key_length))
    return rows is not None and cols is not None


def block_dict(
    spec: dict[str, Any], q: torch.Tensor, k: torch.Tensor, key_length: int | None = None
) -> dict[str, Any]:
    """`spec` re-aimed at the bounding block of the positions: queries min(q)..max(q), keys
    0..max(k) (or 0..key_length-1 when the form depends on the table's key length)."""
    qmin, qmax = int(q.min()), int(q.max())
    out = {key: value for key, value in spec.items() if key not in LENGTH_FIELDS}
    out["query_offset"] = qmin
    out["query_length"] = qmax - qmin + 1
    out["key_length"] = int(k.max()) + 1 if key_length is None else key_length
    return out
