"""The uploaded weight tables a spec names (`learned`, `relative_index`), bound from the table
store before anything is computed (`/v1/tables`, `/v1/onnx`, the `/v2` models)."""

from __future__ import annotations

from posenc.encodings import FieldProblem, SpecBase, canonical_dict
from posenc.encodings.weights import (
    TableStore,
    UnknownTableError,
    WeightTableSpec,
    resolve_tables,
)
from posenc.runtime import TableCache


def unknown_table(key: str, field: str = "table_key") -> UnknownTableError:
    """The error for a table key the store does not hold (404 `unknown_table`), naming `field`
    (the spec's key field: `table_key`, `relative_position_bias_table_key`)."""
    return UnknownTableError(
        f"no uploaded table has key {key!r} here (never uploaded, or dropped from the table "
        "store): upload it to /v1/uploads again",
        [FieldProblem(field, "no such table in the store", key)],
    )


def stored_tables(store: TableStore, spec: SpecBase) -> SpecBase:
    """`spec` with the weight table it names bound from `store` (an inline table is stored);
    specs naming none pass through. Raises `UnknownTableError` (404) naming the spec's key field
    when the store does not hold the key."""
    try:
        return resolve_tables(spec, store)
    except UnknownTableError:
        if not isinstance(spec, WeightTableSpec):
            raise
        raise unknown_table(str(spec.named_key), spec.table_fields.key) from None


def bind_tables(cache: TableCache, store: TableStore, spec: SpecBase, key: str) -> SpecBase:
    """`spec` (content key `key`) ready for the cache: `stored_tables`, except that a key-only
    spec whose table is resident in `cache` needs no binding (its upload may have left the store
    since)."""
    if not isinstance(spec, WeightTableSpec) or spec.named_table_shape() is None:
        return spec
    if spec.bound is None and cache.peek(cache.key_for(spec, key)) is not None:
        return spec
    return stored_tables(store, spec)


def unbound(spec: SpecBase) -> SpecBase:
    """`spec` without a bound table, to be remembered by key (the store holds the values)."""
    if isinstance(spec, WeightTableSpec) and spec.bound is not None:
        return type(spec).model_validate(canonical_dict(spec))
    return spec
