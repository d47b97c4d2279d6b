"""Entries of ALiBi and T5 tables computed at sampled positions only (`alibi_bias_at`,
`t5_buckets_at`): what the explorer draws, through /v2, for a table too large to build. Each is
compared bit for bit with the whole table computed in-process and gathered at those positions,
over every bias form, dtype, masked value, query offset and Falcon's bfloat16 rounding, with
strided, unordered and repeated positions."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch

from posenc.encodings import compute, parse_spec
from posenc.encodings.alibi import AlibiSpec, alibi_bias_at, alibi_slopes
from posenc.encodings.t5_bias import T5BiasSpec, t5_buckets_at
from posenc.runtime.rows import gather_block, lookup_bias

Q, K = 301, 517


def positions(first: int, count: int) -> list[torch.Tensor]:
    """Strided (as the explorer samples), unordered and repeated positions in [first, first +
    count)."""
    strided = torch.arange(first, first + count, 7)
    shuffled = strided[torch.randperm(strided.numel(), generator=torch.Generator().manual_seed(0))]
    repeated = torch.tensor([first, first + count - 1, first, first + count // 2])
    return [strided, shuffled, repeated]


ALIBI_CASES = [
    {"bias": form, "query_offset": offset, "dtype": dtype}
    | ({"masked_value": masked} if form in ("causal", "row_constant", "mpt") else {})
    for form, offset, dtype, masked in itertools.product(
        ["causal", "symmetric", "row_constant", "mpt", "bottom_right"],
        [0, 200],
        ["float32", "float16", "bfloat16"],
        ["min", "-inf", "none"],
    )
    if not (form == "bottom_right" and offset)
    and not (masked != "min" and form in ("symmetric", "bottom_right"))  # they mask nothing
]
FALCON = {
    "bias": "row_constant",
    "slope_scale": 1.0 / math.sqrt(64),
    "slope_rounding": "bfloat16",
    "bias_rounding": "bfloat16",
}


@pytest.mark.parametrize(
    "fields", [*ALIBI_CASES, FALCON, {**FALCON, "query_offset": 100, "dtype": "bfloat16"}]
)
def test_alibi_bias_at_sampled_positions_is_the_table_there(fields: dict[str, Any]) -> None:
    spec = parse_spec(
        {"kind": "alibi", "num_heads": 12, "query_length": Q, "key_length": K, **fields}
    ).canonical()
    assert isinstance(spec, AlibiSpec)
    whole = compute(spec, torch.device("cpu")).tensors["bias"]
    slopes = alibi_slopes(spec, torch.device("cpu"))
    offset = int(spec.query_offset)
    for queries, keys in zip(positions(offset, Q), positions(0, K), strict=True):
        got = alibi_bias_at(spec, slopes, queries, keys)
        want = gather_block(whole, queries, keys, 1, offset)
        assert got.dtype == want.dtype
        assert torch.equal(got, want), fields


@pytest.mark.parametrize(
    ("bidirectional", "offset", "num_buckets", "max_distance"),
    [(True, 0, 32, 128), (False, 0, 32, 128), (False, 300, 32, 128), (True, 50, 18, 128)],
)
def test_t5_buckets_and_bias_at_sampled_positions_are_the_table_there(
    bidirectional: bool, offset: int, num_buckets: int, max_distance: int
) -> None:
    weights = torch.randn(num_buckets, 6, generator=torch.Generator().manual_seed(1))
    spec = parse_spec(
        {
            "kind": "t5_bias",
            "query_length": Q,
            "key_length": K,
            "query_offset": offset,
            "bidirectional": bidirectional,
            "num_buckets": num_buckets,
            "max_distance": max_distance,
            "relative_attention_bias": weights.tolist(),
            "dtype": "bfloat16",
        }
    ).canonical()
    assert isinstance(spec, T5BiasSpec)
    whole = compute(spec, torch.device("cpu")).tensors
    for queries, keys in zip(positions(offset, Q), positions(0, K), strict=True):
        buckets = t5_buckets_at(spec, queries, keys)
        assert torch.equal(buckets, gather_block(whole["buckets"], queries, keys, 0, offset))
        bias = lookup_bias(weights, buckets, torch.bfloat16)
        assert torch.equal(bias, gather_block(whole["bias"], queries, keys, 1, offset))
