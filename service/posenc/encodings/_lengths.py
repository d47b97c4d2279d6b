"""Query/key extents shared by the families that build (Q, K) tables (alibi, t5_bias,
relative_index): one rule for the missing length and one set of checks.

Queries are the last positions of the keys, as in a KV-cache decode: query i sits at key position
`query_offset + i`. Give `key_length` and/or `query_length`; the missing one defaults to
`key_length = query_offset + query_length` or `query_length = key_length - query_offset`.
"""

from __future__ import annotations

from posenc.encodings.errors import FieldProblem, SpecError

MAX_POSITIONS = 1 << 24
"""Largest position a (Q, K) table may reach: distances stay exact in fp32."""


def resolve_lengths(
    query_length: int | None, key_length: int | None, query_offset: int
) -> tuple[int, int]:
    """(Q, K) with the missing length filled in; (−offset, 0) when both are unset."""
    if query_length is not None and key_length is not None:
        return query_length, key_length
    if query_length is not None:
        return query_length, query_offset + query_length
    k = int(key_length or 0)
    return k - query_offset, k


def check_lengths(
    kind: str,
    query_length: int | None,
    key_length: int | None,
    query_offset: int,
    requirement: str = "required",
) -> tuple[int, int]:
    """Resolve (Q, K) and raise `SpecError` naming the field when the extents are unusable."""

    def bad(field: str, message: str, value: object) -> SpecError:
        return SpecError(f"invalid {kind} spec", [FieldProblem(field, message, value)])

    if query_length is None and key_length is None:
        raise bad("key_length", f"{requirement} (or give query_length)", None)
    q, k = resolve_lengths(query_length, key_length, query_offset)
    if q < 1:
        raise bad(
            "query_length", f"key_length={k} - query_offset={query_offset} leaves no query rows", q
        )
    if query_offset + q > MAX_POSITIONS:
        raise bad(
            "query_offset",
            f"query_offset + query_length must be <= {MAX_POSITIONS}",
            query_offset,
        )
    return q, k
