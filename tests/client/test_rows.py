"""`rows=(start, end)`: partial tables against a real server, the disk cache (whole tables only,
sliced locally without a request), client-side validation, the async twin, and the position axes
every served table declares in its metadata (`meta["row_axes"]`, `TensorInfo.row_axis`), which
the client slices by."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from posenc.encodings import parse_spec
from posenc.encodings.base import FAMILIES
from posenc_client import (
    AsyncClient,
    BadRequestError,
    CacheMissError,
    Client,
    DiskCache,
    InvalidRowsError,
    Tables,
)
from posenc_client._rows import slice_rows
from tests.conftest import ServerHandle
from tests.onnx.cases import BASE

T5_WEIGHTS = [[0.5, -1.0, 2.0], [0.25, 2.0, -0.5], [1.5, 0.0, 1.0], [-0.75, 1.0, 0.125]]
ALIBI_BIAS = {"kind": "alibi", "num_heads": 4, "bias": "causal", "key_length": 12}

# (spec, rows, the tensors sliced and their axis); the rest must come whole
CASES: list[tuple[dict[str, Any], tuple[int, int], dict[str, int]]] = [
    ({"kind": "rope", "head_dim": 64, "max_positions": 40}, (5, 17), {"cos": 0, "sin": 0}),
    (
        {"kind": "rope", "head_dim": 32, "max_positions": 24, "dtype": "bfloat16",
         "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                          "original_max_position_embeddings": 8}},
        (0, 7),
        {"cos": 0, "sin": 0},
    ),
    (ALIBI_BIAS, (3, 9), {"bias": 1}),
    (
        {"kind": "t5_bias", "query_length": 10, "key_length": 6, "num_buckets": 4,
         "relative_attention_bias": T5_WEIGHTS},
        (4, 10),
        {"buckets": 0, "bias": 1},
    ),
    ({"kind": "sinusoidal", "dim": 16, "max_positions": 20}, (19, 20), {"embedding": 0}),
]  # fmt: skip


class Recorder(httpx.HTTPTransport):
    """A real transport that records (method, path, rows query parameter, status)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, str, str | None, int]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        rows = request.url.params.get("rows")
        self.log.append((request.method, request.url.path, rows, response.status_code))
        return response


class Refuse(httpx.BaseTransport):
    """Fails the test on any request."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"unexpected request {request.method} {request.url}")


def _bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bytes (bfloat16 included)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _rows_of(whole: Tables, axes: dict[str, int], start: int, end: int, name: str) -> np.ndarray:
    array = whole[name]
    if name not in axes:
        return array
    return array[(slice(None),) * axes[name] + (slice(start, end),)]


@pytest.mark.parametrize(("spec", "rows", "axes"), CASES)
def test_rows_are_the_slice_of_the_whole_table(
    server: ServerHandle, tmp_path: Path, spec: dict[str, Any], rows: tuple[int, int],
    axes: dict[str, int], etag_for: Callable[[str], str],
) -> None:  # fmt: skip
    start, end = rows
    recorder = Recorder()
    with Client(server.url, cache=tmp_path / "c", transport=recorder, retries=0) as client:
        fetched = client.table(spec, rows=rows)  # nothing cached: the server slices
        assert DiskCache(tmp_path / "c").keys() == []  # rows are never cached
        whole = client.table(spec)
        sliced = client.table(spec, rows=rows)  # the whole table is cached: sliced here
    assert recorder.log == [
        ("POST", "/v1/tables", f"{start}:{end}", 200),
        ("POST", "/v1/tables", None, 200),  # the rows were not cached as the whole table
    ]
    assert set(fetched) == set(whole) == set(sliced)
    for got in (fetched, sliced):
        assert got.key == whole.key
        assert got.spec == whole.spec
        assert got.meta["rows"] == [start, end]
        assert got.etag == etag_for(f"{whole.key}.safetensors.{start}-{end}")
        for name in whole:
            want = _rows_of(whole, axes, start, end, name)
            assert _bits(got[name], want), name
            assert np.array_equal(got[name], want), name
    assert "rows" not in whole.meta
    for name, axis in axes.items():
        assert fetched[name].shape[axis] == end - start < whole[name].shape[axis]
    assert DiskCache(tmp_path / "c").keys() == [whole.key]


def test_cached_whole_table_is_sliced_without_a_request(
    server: ServerHandle, cache_dir: Path
) -> None:
    recorder = Recorder()
    with Client(server.url, cache=cache_dir, transport=recorder) as client:
        whole = client.rope(64, 16, profile="onnx")
        head = client.rope(64, 16, profile="onnx", rows=(0, 4))
        tail = client.table_by_key(whole.key, rows=slice(12, None))
        middle = client.table_by_key(whole.key, rows=[5, 7])
        bias = client.alibi(4, bias="causal", key_length=12)
        queries = client.alibi(4, bias="causal", key_length=12, rows=(2, 5))
    assert recorder.log == [
        ("POST", "/v1/tables", None, 200),
        ("POST", "/v1/tables", None, 200),
    ]
    assert np.array_equal(head["cos"], whole["cos"][:4])
    assert np.array_equal(tail["sin"], whole["sin"][12:])
    assert tail.meta["rows"] == [12, 16]
    assert np.array_equal(middle["sin"], whole["sin"][5:7])
    assert np.array_equal(queries["bias"], bias["bias"][:, 2:5])
    assert queries["bias"].flags.c_contiguous
    assert np.array_equal(queries["slopes"], bias["slopes"])
    assert not np.shares_memory(head["cos"], whole["cos"])  # copies: the whole table is freed
    with Client(server.url, cache=cache_dir, transport=Refuse(), offline=True) as client:
        assert np.array_equal(client.table_by_key(whole.key, rows=(3, 9))["cos"], whole["cos"][3:9])
        with pytest.raises(CacheMissError):
            client.rope(64, 17, rows=(0, 4))


def test_rows_fetched_by_key_are_not_cached(
    server: ServerHandle, cache_dir: Path, etag_for: Callable[[str], str]
) -> None:
    with Client(server.url, cache=False) as plain:
        key = plain.rope(32, 10).key
    recorder = Recorder()
    with Client(server.url, cache=cache_dir, transport=recorder) as client:
        part = client.table_by_key(key, rows=(2, 6))
        assert DiskCache(cache_dir).keys() == []
        again = client.table_by_key(key, rows=(2, 6))
        everything = client.table_by_key(key, rows=(0, 10))  # every row: the whole table
        last = client.table_by_key(key, rows=(9, 10))
    assert recorder.log == [
        ("GET", f"/v1/tables/{key}", "2:6", 200),
        ("GET", f"/v1/tables/{key}", "2:6", 200),
        ("GET", f"/v1/tables/{key}", "0:10", 200),
    ]
    assert np.array_equal(part["cos"], again["cos"])
    assert "rows" not in everything.meta
    assert everything["cos"].shape == (10, 32)
    assert everything.etag == etag_for(key)
    assert DiskCache(cache_dir).keys() == [key]  # stored once it came whole
    assert np.array_equal(last["cos"], everything["cos"][9:])


@pytest.mark.parametrize(
    "rows",
    [(5, 3), (4, 4), (-1, 4), (1.5, 3), (True, 3), (0, "4"), (None, 4), "0:4", (1, 2, 3),
     4, range(0, 4), slice(0, 4, 2), slice(-2, None), slice(3, 1)],
)  # fmt: skip
def test_malformed_rows_fail_before_any_request(server: ServerHandle, rows: Any) -> None:
    with Client(server.url, cache=False, transport=Refuse()) as client:
        with pytest.raises(InvalidRowsError) as info:
            client.rope(64, 8, rows=rows)
        with pytest.raises(ValueError, match="rows"):
            client.table_by_key("ab" * 32, rows=rows)
    err = info.value
    assert isinstance(err, BadRequestError)
    assert err.error_type == "invalid_rows"
    assert err.problems[0].field == "rows"


def test_rows_the_table_cannot_give(server: ServerHandle, cache_dir: Path) -> None:
    """The server's errors, and the same errors from a cached whole table without a request."""
    from_server: list[tuple[type, str]] = []
    with Client(server.url, cache=cache_dir, retries=0) as client:
        for call in (
            lambda: client.rope(32, 12, rows=(0, 13)),
            lambda: client.rope(32, 12, rows=(12, None)),
            lambda: client.alibi(4, rows=(0, 2)),  # slopes only: no position axis
        ):
            with pytest.raises(InvalidRowsError) as info:
                call()
            assert info.value.headers  # an answer of the server
            from_server.append((type(info.value), info.value.error_type))
        client.rope(32, 12)
        client.alibi(4)
    assert [t for _, t in from_server] == ["invalid_rows", "invalid_rows", "rows_unsupported"]
    with Client(server.url, cache=cache_dir, transport=Refuse()) as client:
        local: list[tuple[type, str]] = []
        for call in (
            lambda: client.rope(32, 12, rows=(0, 13)),
            lambda: client.rope(32, 12, rows=(12, None)),
            lambda: client.alibi(4, rows=(0, 2)),
        ):
            with pytest.raises(InvalidRowsError) as info:
                call()
            assert not info.value.headers
            local.append((type(info.value), info.value.error_type))
    assert local == from_server


def test_async_client_rows(server: ServerHandle, cache_dir: Path) -> None:
    async def main() -> None:
        async with AsyncClient(server.url, cache=cache_dir, retries=0) as client:
            part = await client.alibi(4, bias="causal", key_length=12, rows=(3, 9))
            whole = await client.table(ALIBI_BIAS)
            by_key = await client.table_by_key(whole.key, rows=(3, 9))
            with pytest.raises(InvalidRowsError):
                await client.table(ALIBI_BIAS, rows=(9, 3))
            with pytest.raises(InvalidRowsError):
                await client.table(ALIBI_BIAS, rows=(0, 13))
        assert part["bias"].shape == (4, 6, 12)
        assert part.meta["rows"] == [3, 9]
        for got in (part, by_key):
            assert np.array_equal(got["bias"], whole["bias"][:, 3:9])
            assert np.array_equal(got["slopes"], whole["slopes"])
        assert DiskCache(cache_dir).keys() == [whole.key]

    asyncio.run(main())


def _row_axis_specs() -> list[dict[str, Any]]:
    """Specs of every family, with each optional tensor and layout."""
    specs = [spec for (kind, _), spec in BASE.items() if kind in FAMILIES]
    specs += [
        {"kind": "rope", "head_dim": 8, "max_positions": 12, "profile": "vllm"},
        {"kind": "rope", "head_dim": 8, "max_positions": 12, "profile": "trtllm"},
        {"kind": "xpos", "head_dim": 8, "max_positions": 12, "packing": "factored"},
        {"kind": "alibi", "num_heads": 4},
        {"kind": "t5_bias", "query_length": 5},
        {"kind": "normalized", "mode": "by_length", "max_positions": 12},
        {"kind": "relative_index", "scheme": "shaw", "max_relative_position": 3,
         "query_length": 5, "key_length": 4},
        {"kind": "sinusoidal_2d", "style": "mae", "dim": 8, "grid_height": 4, "grid_width": 3},
    ]  # fmt: skip
    return specs


def test_served_tables_declare_their_row_axes(server: ServerHandle) -> None:
    """Every family's served table carries each tensor's position axis in its metadata, as the
    spec declares it, and the client slices that table as the server does."""
    seen: set[str] = set()
    with Client(server.url, retries=0) as client:
        for data in _row_axis_specs():
            spec = parse_spec(data).canonical()
            declared = {name: info.row_axis for name, info in spec.outputs().items()}
            whole = client.table(data)
            assert whole.meta["row_axes"] == declared, spec.kind
            seen.add(spec.kind)
            if any(axis is not None for axis in declared.values()):
                local = slice_rows(whole, 1, 3)
                served = client.table(data, rows=(1, 3))
                assert local is not None, spec.kind
                assert set(local) == set(served), spec.kind
                for name in served:
                    assert _bits(local[name], served[name]), (spec.kind, name)
    assert seen == set(FAMILIES)


def test_unknown_layouts_are_left_to_the_server() -> None:
    arrays = {"x": np.arange(6, dtype=np.float32).reshape(3, 2)}
    key = "ab" * 32
    axes = {"row_axes": {"x": 0}}
    assert slice_rows(Tables(key, "rope", {}, {}, arrays), 0, 1) is None  # an older server
    assert slice_rows(Tables(key, "rope", {}, axes, {"new_tensor": arrays["x"]}), 0, 1) is None
    assert slice_rows(Tables(key, "rope", {}, {"row_axes": {"x": 2}}, arrays), 0, 1) is None
    meta = {"device": "cuda:0", "row_axes": {"cos": 0}}
    rope = Tables(key, "rope", {}, meta, {"cos": arrays["x"]})
    part = slice_rows(rope, 1, 3)
    assert part is not None
    assert part["cos"].tolist() == [[2.0, 3.0], [4.0, 5.0]]
    assert part.etag == f'"{key}.safetensors.1-3@cuda:0"'
    assert slice_rows(rope, 0, 3) is rope
