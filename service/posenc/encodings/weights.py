"""Checkpoint weight tables that specs name by content key: uploaded once, bound before computing.

Some families compute from checkpoint weights that no config carries (a `WeightTableSpec`):

- `learned`: the absolute position table E (N, D) (timm `pos_embed`, transformers
  `embeddings.position_embeddings`), fields `table` / `table_key` / `table_shape`;
- `relative_index`: the bias table E (num_relative_distance, H) (`relative_position_bias_table`
  of timm's and transformers' Swin/BEiT attention), fields `relative_position_bias_table` /
  `relative_position_bias_table_key` / `relative_position_bias_table_shape`.

A spec gives its table inline (nested JSON lists, bound at validation) or by the content key of a
table uploaded earlier (`POST /v1/uploads`) together with its shape [rows, cols], so that
`outputs()` needs no lookup. The canonical form always names the table by key and shape, never by
its values: an inline table and the same table uploaded share one spec key, and canonical JSON
stays small. The key of a (rows, cols) table E is

    sha256(b"posenc-table:float32:{rows}x{cols}\\n" + E.astype("<f4").tobytes())   (64 hex digits)

over the row-major little-endian float32 values (`table_key`); any client can compute it. Tables
are held as (rows, cols) float32 CPU tensors, the precision every family computes in.

Tables referenced by key live in a `TableStore`, a small thread-safe, byte-bounded, content-
addressed LRU that the runtime creates and owns (nothing here is global, nothing reads the
environment): an upload calls `store.put(tensor)` (or `store.register(key, tensor)`, which checks
the key), and before computing, `resolve_tables(spec, store)` binds the table to the spec (and puts
an inline table into the store, so that a client may later send the canonical, key-only spec). A
bound table (`BoundTable`: key and tensor) travels with the spec object as private state,
excluded from the canonical form; it is fully determined by the key. Computing a key-only spec
that was never bound raises `UnknownTableError` (error_type `unknown_table`) naming the family's
key field.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, NoReturn, Self

import torch
from pydantic import Field, PrivateAttr

from posenc.encodings.base import SpecBase
from posenc.encodings.errors import FieldProblem, SpecError

MAX_TABLE_ENTRIES = 1 << 26
"""Cap on rows * cols of any table (256 MiB as float32)."""
MAX_ROWS = 1 << 20
MAX_DIM = 1 << 16
DEFAULT_STORE_BYTES = 1 << 28

KEY_PATTERN = r"^[0-9a-f]{64}$"

TableKeyField = Annotated[str | None, Field(pattern=KEY_PATTERN)]
"""A spec's optional content key field (64 lowercase hex digits)."""
TableShapeField = (
    Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=2, max_length=2)] | None
)
"""A spec's optional [rows, cols] field for the table it names by key."""


@dataclass
class UnknownTableError(SpecError):
    """A table key names no table in the store (never uploaded, or evicted): upload it again."""

    error_type = "unknown_table"


def _bad(field: str, message: str, value: Any, what: str = "table") -> NoReturn:
    raise SpecError(f"invalid {what}", [FieldProblem(field, message, value)])


def table_key(table: torch.Tensor) -> str:
    """The content key of a (rows, cols) table: sha256 over a shape header and its row-major
    little-endian float32 bytes (module docstring), 64 hex digits."""
    t = table.detach().to(device="cpu", dtype=torch.float32).contiguous()
    n, d = t.shape
    digest = hashlib.sha256(f"posenc-table:float32:{n}x{d}\n".encode())
    digest.update(t.numpy().astype("<f4", copy=False).tobytes())
    return digest.hexdigest()


def as_table(table: torch.Tensor, field: str = "table", what: str = "table") -> torch.Tensor:
    """A checked (rows, cols) float32 CPU contiguous copy of `table` ((rows, cols) or a
    checkpoint's (1, rows, cols)); raises `SpecError` ("invalid {what}") naming `field` for a bad
    shape, size or non-finite values."""
    t = table.detach()
    if t.dim() == 3 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 2 or t.shape[0] < 1 or t.shape[1] < 1:
        _bad(field, "must be a 2-D (N, D) table (or (1, N, D))", list(table.shape), what)
    n, d = t.shape
    if n > MAX_ROWS or d > MAX_DIM or n * d > MAX_TABLE_ENTRIES:
        _bad(
            field,
            f"at most {MAX_ROWS} rows, {MAX_DIM} columns and {MAX_TABLE_ENTRIES} entries",
            [n, d],
            what,
        )
    if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
        _bad(field, "must hold real numbers", str(t.dtype), what)
    out = t.to(device="cpu", dtype=torch.float32).contiguous().clone()
    if not bool(torch.isfinite(out).all()):
        _bad(field, "must hold finite float32 values (no NaN or infinity)", None, what)
    return out


class BoundTable:
    """A table bound to a spec: its content key and the (rows, cols) float32 CPU tensor.

    Compared and hashed by key (the key determines the tensor), so specs stay comparable. The
    tensor is shared (by the store and every spec bound to it): never modify it in place.
    """

    __slots__ = ("key", "tensor")

    def __init__(self, key: str, tensor: torch.Tensor) -> None:
        self.key = key
        self.tensor = tensor

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BoundTable) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"BoundTable({self.key[:12]}..., shape={list(self.tensor.shape)})"


class TableStore:
    """Content-addressed, byte-bounded LRU store of weight tables: key -> (rows, cols) float32 CPU.

    Created and owned by the runtime (one per server), shared by request handlers and the
    compute threads, hence the lock. `put` returns the key; storing a table that is already there
    only refreshes it; a table larger than the whole budget is refused (`SpecError`, 'table').
    """

    def __init__(self, max_bytes: int = DEFAULT_STORE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._tables: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, table: torch.Tensor) -> str:
        """Store `table` ((rows, cols) or (1, rows, cols), any real dtype, converted to float32)
        and return its content key; evicts least-recently-used tables to stay within
        `max_bytes`."""
        t = as_table(table)
        key = table_key(t)
        self._insert(key, t)
        return key

    def register(self, key: str, table: torch.Tensor, field: str = "table") -> str:
        """Store `table` under `key`, checking that `key` is its content key (`SpecError` naming
        'table_key' otherwise); a table over the whole budget is refused naming `field`."""
        t = as_table(table, field)
        actual = table_key(t)
        if actual != key:
            _bad("table_key", f"is not the content key of this table ({actual})", key)
        self._insert(key, t, field)
        return key

    def keep(self, bound: BoundTable, field: str = "table") -> None:
        """Store a table already bound to a spec: checked (`as_table`) and keyed (`table_key`)
        when it was bound, so neither is done again; over the whole budget it is refused naming
        `field`."""
        self._insert(bound.key, bound.tensor, field)

    def lookup(self, key: str) -> torch.Tensor | None:
        """The table stored under `key` (marked recently used), or None."""
        with self._lock:
            t = self._tables.get(key)
            if t is not None:
                self._tables.move_to_end(key)
            return t

    def _insert(self, key: str, t: torch.Tensor, field: str = "table") -> None:
        size = t.numel() * t.element_size()
        if size > self.max_bytes:
            _bad(field, f"{size} bytes exceed the table store's {self.max_bytes}", size)
        with self._lock:
            if key in self._tables:
                self._tables.move_to_end(key)
                return
            self._tables[key] = t
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, old = self._tables.popitem(last=False)
                self._bytes -= old.numel() * old.element_size()

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._tables

    def __len__(self) -> int:
        with self._lock:
            return len(self._tables)

    @property
    def nbytes(self) -> int:
        """Bytes held by the stored tensors."""
        with self._lock:
            return self._bytes


@dataclass(frozen=True)
class TableFields:
    """The names a family gives the three spec fields of its weight table: the inline values
    (nested lists), the content key and the [rows, cols] shape sent with the key."""

    inline: str
    key: str
    shape: str


class WeightTableSpec(SpecBase):
    """Base of the specs that name one weight table (module docstring), inline or by key.

    A family sets `table_fields`, implements `named_table_shape()`, calls `_bind_inline` from its
    validator once an inline table's shape is checked, and spells the table fields in
    `canonical()` with `_canonical_table()`. `resolve_tables` binds a key-only spec; `bound`
    is the bound table, `require_bound()` what compute reads.
    """

    table_fields: ClassVar[TableFields]

    _bound: BoundTable | None = PrivateAttr(default=None)

    def named_table_shape(self) -> tuple[int, int] | None:
        """(rows, cols) of the table the spec names (inline or by key), None when it names none."""
        raise NotImplementedError

    @property
    def bound(self) -> BoundTable | None:
        """The table bound to this spec (inline at validation, or by `resolve_tables`), or None."""
        return self._bound

    @property
    def named_key(self) -> str | None:
        """The content key of the named table: the bound table's, else the key field's."""
        if self._bound is not None:
            return self._bound.key
        key: str | None = getattr(self, self.table_fields.key)
        return key

    def _bind_inline(self, values: list[list[float]]) -> None:
        """Bind an inline table (float32, finite, named by its content key)."""
        if self._bound is None:
            tensor = as_table(
                torch.tensor(values, dtype=torch.float32),
                self.table_fields.inline,
                f"{self.kind} spec",
            )
            self._bound = BoundTable(table_key(tensor), tensor)

    def _canonical_table(self) -> dict[str, Any]:
        """The canonical table fields: the key and [rows, cols], the inline values dropped."""
        names = self.table_fields
        shape = self.named_table_shape()
        return {
            names.inline: None,
            names.key: self.named_key if shape is not None else None,
            names.shape: None if shape is None else list(shape),
        }

    def require_bound(self) -> BoundTable:
        """The bound table; `UnknownTableError` naming the key field when none is bound."""
        if self._bound is None:
            field = self.table_fields.key
            raise UnknownTableError(
                f"{field} not resolved",
                [
                    FieldProblem(
                        field,
                        "no table bound to this spec: upload it, then resolve the spec against "
                        "the table store (resolve_tables)",
                        getattr(self, field),
                    )
                ],
            )
        return self._bound

    def with_table(self, bound: BoundTable) -> Self:
        """A copy of this spec with `bound` attached (its key and shape must be the named ones)."""
        names = self.table_fields
        named = self.named_table_shape()
        key = getattr(self, names.key)
        if key is not None and bound.key != key:
            _bad(names.key, f"the bound table has key {bound.key}", key, f"{self.kind} spec")
        shape = list(bound.tensor.shape)
        if named is None or shape != list(named):
            _bad(
                names.shape,
                f"the stored table has shape {shape}",
                None if named is None else list(named),
                f"{self.kind} spec",
            )
        copy = self.model_copy()
        copy._bound = bound
        return copy


def resolve_tables(spec: SpecBase, store: TableStore) -> SpecBase:
    """Bind the weight table a spec names, from `store`; other specs pass through unchanged.

    An inline table is put into the store (a later key-only spec then finds it); a key is looked
    up, raising `UnknownTableError` naming the family's key field when the store does not hold it
    and `SpecError` naming its shape field when the stored shape differs from the spec's.
    """
    if not isinstance(spec, WeightTableSpec) or spec.named_table_shape() is None:
        return spec
    names = spec.table_fields
    if spec.bound is not None:
        if spec.bound.key not in store:
            store.keep(spec.bound, names.inline)
        return spec
    key = str(spec.named_key)
    tensor = store.lookup(key)
    if tensor is None:
        raise UnknownTableError(
            f"unknown {names.key}",
            [FieldProblem(names.key, "no such table in the store: upload it first", key)],
        )
    return spec.with_table(BoundTable(key, tensor))
