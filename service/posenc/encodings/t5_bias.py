"""T5 relative position buckets and the learned bias they index (Raffel et al. 2020,
arXiv:1910.10683; transformers `models/t5/modeling_t5.py`, `T5Attention._relative_position_bucket`
and `T5Attention.compute_bias`, adapted from Mesh TensorFlow `transformer_layers.py`).

`rel = j - p_i` with key j and query position p_i = query_offset + i (`past_seen_tokens` in
`compute_bias`, the KV-cache length when decoding). Bidirectional (encoder): nb' = nb // 2, bucket
base nb' for rel > 0, n = |rel|; causal (decoder): base 0, nb' = nb, n = max(-rel, 0).
max_exact = nb' // 2; n < max_exact -> n; otherwise `min(max_exact + int(log(n / max_exact) /
log(max_distance / max_exact) * (nb' - max_exact)), nb' - 1)` with transformers' op order: fp32
`torch.log`, the divisor `math.log` in double applied to the fp32 tensor, truncation by
`.to(torch.long)`. Bit-exactness matters: the product lands on integers (n = 16, 32, 64 with the
defaults), and e.g. with num_buckets=18, max_distance=128 float64 math puts n = 8, 16, 64 one
bucket below transformers.

Buckets depend on rel only, so they are evaluated once per distinct rel (Q + K - 1 values) on the
CPU with exactly those ops and laid out on the target device as the (Q, K) Toeplitz table they
form: integer buckets are then identical on every device, equal to transformers on CPU. T5 adds
the bias to unscaled scores (no 1/sqrt(d) anywhere in T5 attention).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, NoReturn, Self

import torch
from pydantic import Field, model_validator

from posenc.encodings._lengths import MAX_POSITIONS, check_lengths, resolve_lengths
from posenc.encodings._toeplitz import toeplitz
from posenc.encodings.base import DTYPES, SpecBase, TensorInfo, register_family
from posenc.encodings.errors import FieldProblem, SpecError
from posenc.encodings.memory import to_device

MAX_BUCKETS = 1 << 16
MAX_HEADS = 4096
MAX_WEIGHTS = 1 << 20
"""Cap on num_buckets * H entries of `relative_attention_bias` (it travels in the spec)."""

FloatDtype = Literal["float32", "float16", "bfloat16"]


def _bad(field: str, message: str, value: Any) -> NoReturn:
    raise SpecError("invalid t5_bias spec", [FieldProblem(field, message, value)])


class T5BiasSpec(SpecBase):
    """T5 relative-position buckets (Q, K) int64 and, with weights, the bias (H, Q, K).

    Field names follow transformers' T5Config (`relative_attention_num_buckets` ->
    `num_buckets`, `relative_attention_max_distance` -> `max_distance`; `bidirectional` is
    `not is_decoder`). `relative_attention_bias` is the (num_buckets, H) embedding weight
    `T5Attention.relative_attention_bias.weight`, nested lists of floats; it defines the table and
    is part of the canonical form. Give `key_length` and/or `query_length`: the missing one
    defaults to `key_length = query_offset + query_length` or `query_length = key_length -
    query_offset`.
    """

    kind: Literal["t5_bias"] = "t5_bias"
    num_buckets: Annotated[int, Field(ge=2, le=MAX_BUCKETS)] = 32
    max_distance: Annotated[int, Field(ge=1, le=MAX_POSITIONS)] = 128
    bidirectional: bool = True
    query_length: Annotated[int | None, Field(ge=1, le=MAX_POSITIONS)] = None
    key_length: Annotated[int | None, Field(ge=1, le=MAX_POSITIONS)] = None
    query_offset: Annotated[int, Field(ge=0, lt=MAX_POSITIONS)] = 0
    relative_attention_bias: list[list[float]] | None = None
    dtype: FloatDtype = "float32"

    @model_validator(mode="after")
    def _check(self) -> Self:
        _, max_exact = self.bucket_split()
        if max_exact < 1:
            need = 4 if self.bidirectional else 2
            _bad(
                "num_buckets",
                f"must be >= {need} with bidirectional={self.bidirectional} (max_exact would be 0)",
                self.num_buckets,
            )
        if max_exact >= self.max_distance:
            why = (
                f"max_exact={max_exact} (num_buckets={self.num_buckets} halved"
                f"{' twice' if self.bidirectional else ''}, bidirectional={self.bidirectional}) "
                f">= max_distance={self.max_distance}: the logarithmic buckets need "
                "log(max_distance / max_exact) > 0"
            )
            raise SpecError(
                "invalid t5_bias spec",
                [
                    FieldProblem(
                        "max_distance", f"must exceed max_exact; {why}", self.max_distance
                    ),
                    FieldProblem(
                        "num_buckets", f"too many for max_distance; {why}", self.num_buckets
                    ),
                ],
            )
        check_lengths("t5_bias", self.query_length, self.key_length, self.query_offset)
        weights = self.relative_attention_bias
        if weights is None:
            if self.dtype != "float32":
                _bad(
                    "dtype",
                    "dtype is the bias dtype (buckets are int64): give relative_attention_bias",
                    self.dtype,
                )
            return self
        if len(weights) != self.num_buckets:
            _bad(
                "relative_attention_bias",
                f"must have num_buckets={self.num_buckets} rows (shape (num_buckets, num_heads))",
                f"{len(weights)} rows",
            )
        heads = len(weights[0])
        if not 1 <= heads <= MAX_HEADS:
            _bad("relative_attention_bias", f"rows must hold 1..{MAX_HEADS} heads", heads)
        for b, row in enumerate(weights):
            if len(row) != heads:
                _bad(
                    "relative_attention_bias",
                    f"row {b} has {len(row)} entries, row 0 has {heads}: rows must be equal",
                    len(row),
                )
        if self.num_buckets * heads > MAX_WEIGHTS:
            _bad(
                "relative_attention_bias",
                f"at most {MAX_WEIGHTS} entries (num_buckets * num_heads)",
                self.num_buckets * heads,
            )
        return self

    def bucket_split(self) -> tuple[int, int]:
        """(buckets per direction nb', max_exact) as `_relative_position_bucket` derives them."""
        nb = self.num_buckets // 2 if self.bidirectional else self.num_buckets
        return nb, nb // 2

    def _lengths(self) -> tuple[int, int]:
        """(query_length, key_length) with the defaults resolved."""
        return resolve_lengths(self.query_length, self.key_length, self.query_offset)

    @property
    def num_heads(self) -> int | None:
        """H, the width of `relative_attention_bias`, or None without weights."""
        w = self.relative_attention_bias
        return None if w is None else len(w[0])

    def canonical(self) -> Self:
        q, k = self._lengths()
        return self.model_copy(update={"query_length": q, "key_length": k})

    def outputs(self) -> dict[str, TensorInfo]:
        q, k = self._lengths()
        out = {"buckets": TensorInfo((q, k), "int64", row_axis=0)}
        if self.num_heads is not None:
            out["bias"] = TensorInfo((self.num_heads, q, k), self.dtype, row_axis=1)
        return out


def relative_position_bucket(
    relative_position: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """Buckets (same shape, int64) of int64 relative positions `j - i`, with the ops and op order of
    transformers `T5Attention._relative_position_bucket` (fp32 log, double divisor, truncation).

    The log argument is clamped to >= 1 where the exact branch is taken anyway, so no -inf is ever
    converted to an integer (undefined behaviour that transformers relies on being discarded).
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).to(torch.long) * num_buckets
        n = torch.abs(relative_position)
    else:
        n = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = n < max_exact
    large = max_exact + (
        torch.log(n.clamp(min=max_exact).float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, n, large)


def t5_buckets(spec: T5BiasSpec, device: torch.device | str = "cpu") -> torch.Tensor:
    """Buckets (Q, K) int64 for a canonical spec: a CPU lookup over the Q + K - 1 distinct
    relative positions, laid out on `device` as the Toeplitz table they form."""
    return toeplitz(
        to_device(_bucket_lut(spec), torch.device(device)),
        int(spec.query_length or 0),
        int(spec.key_length or 0),
    )


def t5_buckets_at(spec: T5BiasSpec, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Buckets (Q, K) int64 on the CPU of `spec` at query positions `queries` (Q,) and key
    positions `keys` (K,), int64, computed there only (a sampled view of a table too large to
    build): `relative_position_bucket` of `key - query position` entry by entry, the ops the
    table's lookup applies to each distinct relative position, so each entry equals the table's
    `t5_buckets(spec)[query - query_offset, key]`. The bias there is `lookup_bias` of these."""
    rel = keys.to("cpu", torch.int64)[None, :] - queries.to("cpu", torch.int64)[:, None]
    return relative_position_bucket(rel, spec.bidirectional, spec.num_buckets, spec.max_distance)


def _bucket_lut(spec: T5BiasSpec) -> torch.Tensor:
    """Buckets (Q + K - 1,) int64 on the CPU of the relative positions -(offset + Q - 1) ..
    K - 1 - offset, in that order (the diagonals of the bucket table)."""
    q, k = int(spec.query_length or 0), int(spec.key_length or 0)
    lo = -(spec.query_offset + q - 1)
    rel = torch.arange(lo, k - spec.query_offset, dtype=torch.int64)
    return relative_position_bucket(rel, spec.bidirectional, spec.num_buckets, spec.max_distance)


@register_family("t5_bias", T5BiasSpec, "T5 relative position buckets and their learned bias")
def compute_t5_bias(
    spec: T5BiasSpec, device: torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """`buckets` (Q, K) int64 and, with weights E (num_buckets, H), `bias[h, i, j] =
    E[buckets[i, j], h]` (H, Q, K): weights parsed as float32, gathered, cast to `dtype`.

    Both depend on the relative position only: the Q + K - 1 distinct buckets (and their bias
    values per head, gathered and cast) are laid out as Toeplitz tables in one pass each."""
    q, k = int(spec.query_length or 0), int(spec.key_length or 0)
    lut = to_device(_bucket_lut(spec), device)
    tensors = {"buckets": toeplitz(lut, q, k)}
    if spec.relative_attention_bias is not None:
        table = to_device(torch.tensor(spec.relative_attention_bias, dtype=torch.float32), device)
        tensors["bias"] = toeplitz(table.t()[:, lut].to(DTYPES[spec.dtype]), q, k)
    nb, max_exact = spec.bucket_split()
    facts: dict[str, Any] = {"max_exact": max_exact, "buckets_per_direction": nb}
    return tensors, facts
