"""Tables too large to compute whole, sampled through `/v2` (what the explorer's heatmap asks for
such a table): on a server whose cache and response limit are small, ALiBi's and T5's entries at
strided query x key positions inside the table are computed at those pairs only, and sinusoidal
rows at strided position ids (every convention, descending tables too) are computed as explicit
positions; each equals the whole table computed in-process, gathered there. A PatchTST
(standardized) table's rows cannot be computed alone: refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from posenc.encodings.sinusoidal import CONVENTIONS
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


SINUSOIDAL = [
    *({"convention": c, "dim": 64} for c in sorted(CONVENTIONS)),
    {"convention": "fairseq", "dim": 64, "position_offset": 2},
    {"dim": 48, "position_step": -1, "position_offset": 20000},
    {"convention": "whisper", "dim": 384, "dtype": "bfloat16"},
]


@pytest.mark.parametrize("fields", SINUSOIDAL, ids=lambda f: "-".join(map(str, f.values())))
def test_sampled_rows_of_a_sinusoidal_table_too_large_equal_the_table(
    small: ServerHandle, fields: dict[str, object]
) -> None:
    spec = {"kind": "sinusoidal", "max_positions": 20000, **fields}
    whole = table(small, spec)["embedding"]  # 3.8 to 31 MB: over the cache and the limit
    step = -1 if fields.get("position_step") == -1 else 1
    first = int(table_offset(spec))
    rows = np.arange(0, 20000, 147, dtype=np.int64)
    result = http.InferenceServerClient(url(small)).infer(
        "sinusoidal",
        [make_input("position_ids", first + step * rows)],
        parameters=spec_param(spec),
    )
    assert result.get_response()["parameters"]["posenc_source"] == "computed"
    assert_equal(as_torch(result, "embedding"), whole[torch.from_numpy(rows)])


def table_offset(spec: dict[str, object]) -> int:
    """The position of row 0 as the server canonicalises it (a convention's default offset)."""
    from posenc.encodings import parse_spec

    return int(getattr(parse_spec(spec).canonical(), "position_offset", 0) or 0)


def test_descending_table_rows_are_gathered_by_position(server: ServerHandle) -> None:
    """A descending table (row r holds position offset - r) answers position p with row offset -
    p from the cache, and a position outside it with the row computed for p (once it was gathered
    as row p - offset: position 10 of a table of 9..0 got position 8's row)."""
    spec = {"kind": "sinusoidal", "dim": 8, "max_positions": 10, "position_offset": 9,
            "position_step": -1}  # fmt: skip
    whole = table(server, spec)["embedding"]
    longer = table(server, {**spec, "max_positions": 20, "position_offset": 19})["embedding"]
    triton = http.InferenceServerClient(url(server))
    inside = triton.infer("sinusoidal", [make_input("position_ids", np.array([9, 5, 0]))],
                          parameters=spec_param(spec))  # fmt: skip
    assert_equal(as_torch(inside, "embedding"), whole[[0, 4, 9]])
    outside = triton.infer("sinusoidal", [make_input("position_ids", np.array([9, 10, 19]))],
                           parameters=spec_param(spec))  # fmt: skip
    assert_equal(as_torch(outside, "embedding"), longer[[10, 9, 0]])


def test_standardized_rows_outside_the_table_are_refused(server: ServerHandle) -> None:
    spec = {"kind": "sinusoidal", "dim": 8, "max_positions": 10, "standardize": "patchtst"}
    whole = table(server, spec)["embedding"]
    triton = http.InferenceServerClient(url(server))
    inside = triton.infer("sinusoidal", [make_input("position_ids", np.array([9, 5]))],
                          parameters=spec_param(spec))  # fmt: skip
    assert_equal(as_torch(inside, "embedding"), whole[[9, 5]])
    with pytest.raises(InferenceServerException, match="whole table's mean"):
        triton.infer("sinusoidal", [make_input("position_ids", np.array([9, 10]))],
                     parameters=spec_param(spec))  # fmt: skip
