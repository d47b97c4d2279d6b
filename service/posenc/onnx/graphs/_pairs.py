"""Query/key position inputs shared by the pairwise graphs (alibi/bias, t5_bias/bias).

Two input styles:
- `positions`: `query_positions` int64 [Q] and `key_positions` int64 [K], any values;
- `lengths`: `past_length` and `query_length`, int64 scalars (the KV-cache view): queries at
  past_length + i for i < query_length, keys at 0 .. past_length + query_length - 1.
"""

from __future__ import annotations

import onnx_ir as ir
import torch

from posenc.onnx._graph import Graph


def query_key_positions(g: Graph, style: str) -> tuple[ir.Value, ir.Value]:
    """Declare the inputs of `style`; return query positions [Q] and key positions [K]."""
    op = g.op
    if style == "positions":
        q = g.input("query_positions", "int64", ["Q"], "int64 query positions [Q]")
        k = g.input("key_positions", "int64", ["K"], "int64 key positions [K]")
        return q, k
    past = g.input("past_length", "int64", [], "int64 scalar: keys already cached (offset)")
    count = g.input("query_length", "int64", [], "int64 scalar: new queries this step")
    total: ir.Value = op.Add(past, count)  # int64 []: K = past + current
    queries: ir.Value = op.Range(past, total, 1)  # int64 [Q]
    keys: ir.Value = op.Range(0, total, 1)  # int64 [K]
    return queries, keys


def relative(g: Graph, queries: ir.Value, keys: ir.Value) -> ir.Value:
    """rel[i, j] = key_position[j] - query_position[i], int64 [Q, K]."""
    op = g.op
    rel: ir.Value = op.Sub(op.Unsqueeze(keys, [0]), op.Unsqueeze(queries, [1]))  # [Q, K]
    return rel


def feeds(style: str, queries: torch.Tensor, keys: torch.Tensor) -> dict[str, torch.Tensor]:
    """Inputs for `style` giving these positions (lengths: queries must be the last keys)."""
    if style == "positions":
        return {"query_positions": queries, "key_positions": keys}
    past = int(keys.numel() - queries.numel())
    return {
        "past_length": torch.tensor(past, dtype=torch.int64),
        "query_length": torch.tensor(queries.numel(), dtype=torch.int64),
    }
