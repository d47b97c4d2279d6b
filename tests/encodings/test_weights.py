"""Weight tables named by content key (`posenc.encodings.weights`): the key formula (pinned), the
checked float32 copy, the byte-bounded LRU store, and `resolve_tables` binding every family whose
spec names a table (`learned`, `relative_index`) by its own field names."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import torch

from posenc.encodings import FAMILIES, SpecError, compute, content_key, parse_spec
from posenc.encodings.weights import (
    BoundTable,
    TableStore,
    UnknownTableError,
    WeightTableSpec,
    as_table,
    resolve_tables,
    table_key,
)


def random_table(rows: int, dim: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed))


GOLDEN = (torch.arange(12, dtype=torch.float32).reshape(4, 3) - 5.5) / 8
GOLDEN_KEY = "9fdf0a6858e18696b20503b016c468b8c451b10c47eacfce61b2a1a8a5b53814"
"""`table_key(GOLDEN)`, recorded when the key lived in learned.py: keys of uploaded tables (and so
every `learned` spec key) must never change."""
GOLDEN_LEARNED_SPEC_KEY = "7face34e6d8a4f287a3b6aacb3badd277fde5f4d061af6d96dea87d062570756"


def test_table_key_formula() -> None:
    table = random_table(5, 3)
    header = b"posenc-table:float32:5x3\n"
    want = hashlib.sha256(header + table.numpy().astype("<f4").tobytes()).hexdigest()
    assert table_key(table) == want
    assert table_key(table.double()) == want
    assert table_key(table[None][0]) == want


def test_keys_are_pinned() -> None:
    assert table_key(GOLDEN) == GOLDEN_KEY
    learned = {"kind": "learned", "method": "linear_1d", "new_length": 7}
    assert content_key(parse_spec({**learned, "table": GOLDEN.tolist()})) == (
        GOLDEN_LEARNED_SPEC_KEY
    )
    by_key = {**learned, "table_key": GOLDEN_KEY, "table_shape": [4, 3]}
    assert content_key(parse_spec(by_key)) == GOLDEN_LEARNED_SPEC_KEY


def test_as_table_checks_and_copies() -> None:
    table = random_table(3, 2)
    out = as_table(table[None].double())  # a checkpoint's (1, N, D), any real dtype
    assert out.dtype == torch.float32
    assert out.shape == (3, 2)
    assert out.is_contiguous()
    assert torch.equal(out, table)
    assert torch.equal(as_table(torch.arange(6).reshape(3, 2)), torch.arange(6.0).reshape(3, 2))
    for bad in (
        torch.zeros(2, 2, 2),
        torch.zeros(0, 4),
        torch.zeros(4),
        torch.zeros(2, 2, dtype=torch.bool),
        torch.tensor([[1.0, float("inf")]]),
        torch.tensor([[1e39, 0.0]], dtype=torch.float64),  # finite, but not as float32
    ):
        with pytest.raises(SpecError) as err:
            as_table(bad, "relative_position_bias_table")
        assert err.value.problems[0].field == "relative_position_bias_table"


def test_bound_tables_compare_by_key() -> None:
    t = random_table(2, 2)
    a, b = BoundTable("a" * 64, t), BoundTable("a" * 64, t.clone())
    assert a == b
    assert hash(a) == hash(b)
    assert a != BoundTable("b" * 64, t)
    assert "aaaaaaaaaaaa" in repr(a)


def test_store_register_lookup_and_eviction() -> None:
    table = random_table(6, 4)
    store = TableStore(max_bytes=2 * 6 * 4 * 4)
    key = store.put(table)
    assert store.put(table.double()) == key  # same values, same key, one copy
    assert (len(store), store.nbytes) == (1, 6 * 4 * 4)
    with pytest.raises(SpecError) as err:
        store.register("f" * 64, table)
    assert err.value.problems[0].field == "table_key"
    keys = [store.put(random_table(6, 4, seed=s)) for s in (1, 2)]
    assert key not in store
    assert all(k in store for k in keys)
    assert store.nbytes == 2 * 6 * 4 * 4
    assert len(store) == 2
    assert store.lookup(keys[0]) is not None
    store.put(random_table(6, 4, seed=3))
    assert keys[0] in store  # recently used
    assert keys[1] not in store
    assert store.lookup(keys[1]) is None
    with pytest.raises(SpecError):
        TableStore(max_bytes=10).put(table)
    with pytest.raises(SpecError) as err:
        TableStore(max_bytes=10).register(key, table, "relative_position_bias_table")
    assert err.value.problems[0].field == "relative_position_bias_table"
    with pytest.raises(SpecError):
        store.put(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(SpecError):
        store.put(torch.zeros(2, 2, 2))
    with pytest.raises(ValueError, match="max_bytes"):
        TableStore(max_bytes=-1)


# --- resolve_tables across the families that name a table ----------------------------------------

SWIN = {"kind": "relative_index", "scheme": "swin", "window_size": [2, 3]}
"""num_relative_distance (2*2 - 1)(2*3 - 1) = 15."""
LINEAR = {"kind": "learned", "method": "linear_1d", "new_length": 9}
CASES: dict[str, tuple[dict[str, Any], tuple[int, int], str, str, str]] = {
    # family -> (spec without its table, table shape, inline, key and shape field names)
    "learned": (LINEAR, (6, 4), "table", "table_key", "table_shape"),
    "relative_index": (
        SWIN,
        (15, 4),
        "relative_position_bias_table",
        "relative_position_bias_table_key",
        "relative_position_bias_table_shape",
    ),
}


def test_every_family_naming_a_table_is_covered() -> None:
    families = {
        kind for kind, family in FAMILIES.items() if issubclass(family.spec_type, WeightTableSpec)
    }
    assert families == set(CASES)
    for kind in families:
        spec_type = FAMILIES[kind].spec_type
        assert issubclass(spec_type, WeightTableSpec)
        names = spec_type.table_fields
        assert {names.inline, names.key, names.shape} <= set(spec_type.model_fields)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_resolve_binds_by_key_and_names_the_family_fields(kind: str) -> None:
    base, shape, inline, key_field, shape_field = CASES[kind]
    table = random_table(*shape, seed=7)
    key = table_key(table)
    store = TableStore()
    spec_inline = parse_spec({**base, inline: table.tolist()})
    assert isinstance(spec_inline, WeightTableSpec)
    assert spec_inline.bound == BoundTable(key, table)  # bound at validation
    assert resolve_tables(spec_inline, store) is spec_inline
    assert key in store  # stored on the way
    by_key = parse_spec({**base, key_field: key, shape_field: list(shape)})
    assert isinstance(by_key, WeightTableSpec)
    assert by_key.bound is None
    assert content_key(by_key) == content_key(spec_inline)
    resolved = resolve_tables(by_key, store)
    assert isinstance(resolved, WeightTableSpec)
    assert resolved.bound == BoundTable(key, table)
    want, got = compute(spec_inline).tensors, compute(resolved).tensors
    assert want.keys() == got.keys()
    assert all(torch.equal(want[n], got[n]) for n in want)

    with pytest.raises(UnknownTableError) as unknown:
        compute(by_key)  # never bound
    assert unknown.value.problems[0].field == key_field
    with pytest.raises(UnknownTableError) as unknown:
        resolve_tables(by_key, TableStore())
    assert unknown.value.error_type == "unknown_table"
    assert unknown.value.problems[0].field == key_field

    other = random_table(shape[0], shape[1] + 1, seed=8)
    other_key = store.put(other)
    wrong = parse_spec({**base, key_field: other_key, shape_field: list(shape)})
    with pytest.raises(SpecError) as err:
        resolve_tables(wrong, store)
    assert err.value.problems[0].field == shape_field
    assert str(list(other.shape)) in err.value.problems[0].message


def test_specs_without_a_table_pass_through() -> None:
    store = TableStore()
    for data in (SWIN, {"kind": "rope", "head_dim": 8, "max_positions": 4}):
        spec = parse_spec(data)
        assert resolve_tables(spec, store) is spec
    assert len(store) == 0
