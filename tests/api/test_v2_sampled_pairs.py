"""ALiBi and T5 tables too large to compute whole, sampled through `/v2` (what the explorer's
heatmap asks for such a table): on a server whose cache and response limit are small, the
entries at strided query x key positions inside the table are computed at those pairs only, and
equal the whole table computed in-process, gathered there."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.http as http

from tests.api.v2client import as_torch, assert_equal, make_input, spec_param, table, url
from tests.conftest import ServerHandle, start_server

Q, K = 600, 700
ALIBI = {"kind": "alibi", "num_heads": 12, "query_length": Q, "key_length": K}
T5 = {
    "kind": "t5_bias",
    "query_length": Q,
    "key_length": K,
    "bidirectional": False,
    "relative_attention_bias": np.random.default_rng(3).normal(size=(32, 6)).tolist(),
    "dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def small() -> Iterator[ServerHandle]:
    """Tables of 4 to 20 MB: over this server's 1 MiB response limit and 2 MiB cache."""
    with start_server(max_response_bytes=1 << 20, cache_bytes=2 << 20) as srv:
        yield srv


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ({**ALIBI, "bias": "causal"}, ["bias"]),
        ({**ALIBI, "bias": "mpt", "query_offset": 100, "query_length": 500}, ["bias"]),
        ({**ALIBI, "bias": "bottom_right", "query_length": 300}, ["bias"]),
        ({**ALIBI, "bias": "symmetric", "dtype": "bfloat16"}, ["bias"]),
        (T5, ["buckets", "bias"]),
    ],
)
def test_sampled_pairs_of_a_table_too_large_equal_the_table(
    small: ServerHandle, spec: dict[str, Any], names: list[str]
) -> None:
    whole = table(small, spec)
    offset = int(spec.get("query_offset", 0))
    rows = whole[names[0]].shape[-2]
    queries = np.arange(offset, offset + rows, 9, dtype=np.int64)
    keys = np.arange(0, K, 7, dtype=np.int64)
    triton = http.InferenceServerClient(url(small))
    result = triton.infer(
        spec["kind"],
        [make_input("query_positions", queries), make_input("key_positions", keys)],
        outputs=[http.InferRequestedOutput(n) for n in names],
        parameters=spec_param(spec),
    )
    assert result.get_response()["parameters"]["posenc_source"] == "computed"  # not the cache
    q = torch.from_numpy(queries) - offset
    k = torch.from_numpy(keys)
    for name in names:
        want = whole[name].index_select(-2, q).index_select(-1, k)
        assert_equal(as_torch(result, name), want)
