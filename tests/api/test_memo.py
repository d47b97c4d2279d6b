"""`JsonMemo` (api/memo.py): derived values per distinct JSON request, bounded, never failures;
and its use by `POST /v1/tables` (one canonicalisation per distinct body)."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest

from posenc.api.memo import JsonMemo
from posenc.api.routes import tables
from posenc.encodings.weights import WeightTableSpec


def test_values_are_built_once_per_distinct_json() -> None:
    memo: JsonMemo[object] = JsonMemo(size=2)
    calls: list[int] = []

    def build(n: int) -> object:
        calls.append(n)
        return object()

    a = memo.get({"x": 1, "y": [2]}, lambda: build(1))
    assert memo.get({"y": [2], "x": 1}, lambda: build(2)) is a  # key order does not matter
    memo.get({"x": 2}, lambda: build(3))
    memo.get({"x": 3}, lambda: build(4))
    memo.get({"x": 1, "y": [2]}, lambda: build(5))  # evicted: built again
    assert calls == [1, 3, 4, 5]
    assert len(memo) == 2

    def fail() -> object:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        memo.get({"z": 1}, fail)
    assert memo.get({"z": 1}, lambda: build(6)) is not None
    assert calls[-1] == 6


def test_large_or_unserialisable_values_are_never_kept() -> None:
    memo: JsonMemo[int] = JsonMemo(size=8, max_bytes=64)
    big = {"table": list(range(100))}
    assert memo.get(big, lambda: 1) == 1
    assert memo.get(big, lambda: 2) == 2  # built again: too large to remember
    assert memo.get({"x": object()}, lambda: 3) == 3
    assert len(memo) == 0


def test_posted_specs_are_canonicalised_once(client: httpx.Client) -> None:
    spec = {"kind": "rope", "head_dim": 16, "max_positions": 23, "rope_theta": 3131.0}
    first = client.post("/v1/tables", json=spec)
    size = len(tables.SPECS)
    again = client.post("/v1/tables", json=dict(reversed(spec.items())))
    assert again.headers["x-posenc-key"] == first.headers["x-posenc-key"]
    assert again.content == first.content
    assert len(tables.SPECS) == size
    inline = {
        "kind": "learned",
        "method": "linear_1d",
        "new_length": 77,
        "table": np.ones((3000, 2)).tolist(),
    }
    r = client.post("/v1/tables", json=inline)
    assert r.status_code == 200, r.status_code
    assert len(tables.SPECS) == size  # a table inline is too large to remember


def test_key_only_specs_are_remembered_unbound(client: httpx.Client) -> None:
    """A spec naming its weight table by key is remembered as parsed (no values): every request
    binds the table from the server's store, so a dropped upload is a 404, never stale values."""
    weights = np.arange(14, dtype=np.float32).reshape(7, 2) / 4  # shaw k=3: 7 rows, 2 heads
    buf = io.BytesIO()
    np.save(buf, weights)
    key = client.post("/v1/uploads", content=buf.getvalue()).json()["table_key"]
    spec = {
        "kind": "relative_index",
        "scheme": "shaw",
        "max_relative_position": 3,
        "key_length": 5,
        "relative_position_bias_table_key": key,
        "relative_position_bias_table_shape": [7, 2],
    }
    first = client.post("/v1/tables", json=spec)
    assert first.status_code == 200, first.text
    remembered, content_key = tables.SPECS.get(spec, lambda: pytest.fail("not remembered"))
    assert content_key == first.headers["x-posenc-key"]
    assert isinstance(remembered, WeightTableSpec)
    assert remembered.bound is None
    again = client.post("/v1/tables", json=spec)
    assert again.headers["x-posenc-cache"] == "hit"
    assert again.content == first.content
