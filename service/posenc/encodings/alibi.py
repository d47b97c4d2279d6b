"""ALiBi: per-head slopes and additive attention biases (Press et al. 2022, arXiv:2108.12409).

Slopes follow the reference rule (`ofirpress/attention_with_linear_biases`, `get_slopes`): for a
power of two n, `m_h = 2^(-B(h+1)/n)` (B = `alibi_bias_max`, 8 in the paper, MPT's generalisation);
otherwise `get(c) + get(2c)[0::2][:n-c]` with c the largest power of two below n. The naive
`2^(-B(h+1)/n)` for every n is a known bug (mlx#3071, Baichuan2#225) and is not reproduced. They
are then multiplied by `slope_scale` (Falcon-RW divides by sqrt(head_dim)) and divided by
`interpolation_factor` (ALiBi position interpolation, Al-Khateeb et al. 2023, arXiv:2310.13017, as
Cerebras BTLM/Jais `alibi_scaling={"type": "linear", "factor": f}` apply it).
`slope_rounding="bfloat16"` rounds the reference slopes to bfloat16 first, as transformers Falcon's
`build_alibi_tensor` does (`slopes[..., None].bfloat16()`): what Falcon computes, up to 2^-9
relative away from the paper's slopes.
`bias_rounding="bfloat16"` makes the `row_constant` bias transformers Falcon's own: its
`build_alibi_tensor` multiplies the bfloat16 slopes by the key positions in bfloat16
(`slopes[..., None].bfloat16() * arange_tensor`: the int64 positions are cast to bfloat16 and the
product is rounded to bfloat16), and `FalconModel.forward` divides that by sqrt(head_dim) in
float32 (`alibi / math.sqrt(hidden_size // num_heads)`, true division on CPU). The bias is then
`bf16(bf16(m) * bf16(j)).float() / fl32(1 / slope_scale)`, not `fl32(m * slope_scale) * j`: up
to 2^-9 relative (0.97 at key 2047 for 64 heads) apart, and what FalconModel adds to the scaled
scores in float32. CUDA's `tensor / python_float` multiplies by the reciprocal instead: the same
bits when sqrt(head_dim) is a power of two (head_dim 64 in every released Falcon ALiBi model).

Precision: every slope is evaluated in float64 (the reference is Python float math) and rounded
once to float32. transformers BLOOM/Falcon (`torch.pow` in fp32) and MPT (`1/torch.pow(2, x)`) are
a few fp32 ulp away from that (rtol 1e-6); we reproduce the double-precision reference rather than
one of the disagreeing fp32 paths. Slopes are always served as float32 whatever `dtype` says:
flash-attn's `alibi_slopes` must be fp32 (flash-attention#845 is the fp16 cast bug), and so do
vLLM, FlexAttention and TRT-LLM. `dtype` is the dtype of `bias` only.

Bias forms (i query row, j key column, query position p_i = query_offset + i, L = key_length):

- `causal`: `m*(j - p_i)`, masked where j > p_i (vLLM's fallback, decoders with a KV cache).
- `symmetric`: `-m*|j - p_i|`, never masked (encoders, the NeoX ALiBi recipe).
- `bottom_right`: `-m*|i + L - Q - j|`, never masked (flash-attn non-causal alignment);
  `query_offset` must stay 0 since the lengths fix the alignment.
- `row_constant`: `m*j`, masked where j > p_i (original code, BLOOM; key positions 0..L-1).
- `mpt`: `m*(j - (L-1))`, right aligned, masked where j > p_i (MPT `build_mpt_alibi_tensor`).

The three decoder forms (`causal`, `row_constant`, `mpt`) mask future keys with `masked_value`:
`"min"` (default: the output dtype's finite minimum, what transformers' causal masks use and what
survives JSON), `"-inf"`, or `"none"` (raw linear values everywhere, for callers that apply their
own mask, e.g. to compare with BLOOM's unmasked `build_alibi_tensor`). The forms agree after softmax
in exact arithmetic, not in fp16/bf16 (field guide section 2). The bias is
`(slopes_fp32 * distance_fp32).to(dtype)`, exactly what a consumer holding the served slopes
computes; distances are exact in fp32 since every position is below 2^24.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, NoReturn, Self

import numpy as np
import torch
from pydantic import Field, model_validator

from posenc.encodings._lengths import MAX_POSITIONS, check_lengths, resolve_lengths
from posenc.encodings._toeplitz import toeplitz
from posenc.encodings.base import DTYPES, SpecBase, TensorInfo, register_family
from posenc.encodings.errors import FieldProblem, SpecError
from posenc.encodings.memory import empty, to_device

MAX_HEADS = 4096
"""Positions (query_offset + query_length, key_length) stay below 2^24: exact in fp32."""

FP16_MAX = 65504.0

BiasForm = Literal["causal", "symmetric", "bottom_right", "row_constant", "mpt"]
MaskedValue = Literal["-inf", "min", "none"]
FloatDtype = Literal["float32", "float16", "bfloat16"]
SlopeRounding = Literal["bfloat16"]
BiasRounding = Literal["bfloat16"]

MASKED_FORMS: frozenset[str] = frozenset({"causal", "row_constant", "mpt"})
"""Decoder forms: keys after the query position are masked with `masked_value`."""


def _bad(field: str, message: str, value: Any) -> NoReturn:
    raise SpecError("invalid alibi spec", [FieldProblem(field, message, value)])


class AlibiSpec(SpecBase):
    """ALiBi slopes (H_local,) and optionally an additive bias (H_local, Q, K).

    H_local = num_heads / tp_size: tensor-parallel rank `tp_rank` gets heads
    [tp_rank*H_local, (tp_rank+1)*H_local) of the global slopes. Without `bias` the table is the
    slopes only and the length fields must stay unset. With a bias form, give `key_length` and/or
    `query_length`: the missing one defaults to `key_length = query_offset + query_length` (the
    queries are the last positions) or `query_length = key_length - query_offset`.
    """

    kind: Literal["alibi"] = "alibi"
    num_heads: Annotated[int, Field(ge=1, le=MAX_HEADS)]
    alibi_bias_max: Annotated[float, Field(gt=0.0, le=1024.0)] = 8.0
    slope_scale: Annotated[float, Field(gt=0.0)] = 1.0
    slope_rounding: SlopeRounding | None = None
    bias_rounding: BiasRounding | None = None
    interpolation_factor: Annotated[float, Field(ge=1.0)] = 1.0
    tp_size: Annotated[int, Field(ge=1, le=MAX_HEADS)] = 1
    tp_rank: Annotated[int, Field(ge=0, lt=MAX_HEADS)] = 0
    bias: BiasForm | None = None
    query_length: Annotated[int | None, Field(ge=1, le=MAX_POSITIONS)] = None
    key_length: Annotated[int | None, Field(ge=1, le=MAX_POSITIONS)] = None
    query_offset: Annotated[int, Field(ge=0, lt=MAX_POSITIONS)] = 0
    masked_value: MaskedValue | None = None
    dtype: FloatDtype = "float32"

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.num_heads % self.tp_size:
            _bad(
                "tp_size",
                f"must divide num_heads={self.num_heads} (each rank gets num_heads/tp_size heads)",
                self.tp_size,
            )
        if self.tp_rank >= self.tp_size:
            _bad("tp_rank", f"must be in [0, tp_size={self.tp_size})", self.tp_rank)
        if self.bias_rounding is not None:
            self._check_falcon_rounding()
        if self.bias is None:
            self._check_slopes_only()
            return self
        q, k = check_lengths(
            "alibi",
            self.query_length,
            self.key_length,
            self.query_offset,
            requirement=f"required with bias={self.bias!r}",
        )
        if self.bias == "bottom_right" and self.query_offset:
            _bad(
                "query_offset",
                "bottom_right aligns the last query with the last key (offset key_length - "
                "query_length); use bias='symmetric' with an explicit query_offset instead",
                self.query_offset,
            )
        if self.masked_value is not None and self.bias not in MASKED_FORMS:
            _bad(
                "masked_value",
                f"bias={self.bias!r} masks nothing; only {sorted(MASKED_FORMS)} take one",
                self.masked_value,
            )
        if self.dtype == "float16":
            peak = max(local_slopes64(self)) * self._max_distance(q, k)
            if self.bias_rounding is not None:
                peak *= 1 + 2**-8  # a bfloat16 product rounds up by at most 2^-9 relative
            if peak > FP16_MAX:
                _bad(
                    "dtype",
                    f"float16 overflows: max |bias| = {peak:.6g} > {FP16_MAX} for these lengths; "
                    "use bfloat16 or float32",
                    self.dtype,
                )
        return self

    def _check_falcon_rounding(self) -> None:
        """`bias_rounding` is Falcon's `build_alibi_tensor`: its slopes (bfloat16, bias max 8, no
        interpolation) and its row-constant key positions."""
        if self.slope_rounding != "bfloat16":
            _bad(
                "bias_rounding",
                "Falcon's build_alibi_tensor rounds the slopes too: set slope_rounding='bfloat16'",
                self.bias_rounding,
            )
        if self.alibi_bias_max != 8.0 or self.interpolation_factor != 1.0:
            _bad(
                "bias_rounding",
                "Falcon's build_alibi_tensor has alibi_bias_max 8 and no interpolation_factor",
                self.bias_rounding,
            )
        if self.bias not in (None, "row_constant"):
            _bad(
                "bias_rounding",
                "Falcon's build_alibi_tensor is the row_constant form (slope * key position): "
                f"bias={self.bias!r} has no such rounding",
                self.bias_rounding,
            )

    def _check_slopes_only(self) -> None:
        for name in ("query_length", "key_length", "masked_value"):
            if getattr(self, name) is not None:
                _bad(name, "only used with a bias form: set bias", getattr(self, name))
        if self.query_offset:
            _bad("query_offset", "only used with a bias form: set bias", self.query_offset)
        if self.dtype != "float32":
            _bad(
                "dtype",
                "slopes are always float32 (flash-attn requires fp32 slopes); dtype is the bias "
                "dtype: set bias",
                self.dtype,
            )

    def _lengths(self) -> tuple[int, int]:
        """(query_length, key_length) with the defaults resolved."""
        return resolve_lengths(self.query_length, self.key_length, self.query_offset)

    def _max_distance(self, q: int, k: int) -> int:
        """Largest |distance| over the entries that are not masked (bounds |bias| / slope)."""
        last = self.query_offset + q - 1
        masked = self.masked_value != "none"
        if self.bias == "symmetric":
            return max(k - 1 - self.query_offset, last)
        if self.bias == "bottom_right":
            return max(q, k) - 1
        if self.bias == "causal":
            return last if masked else max(last, k - 1 - self.query_offset)
        if self.bias == "row_constant":
            return min(k - 1, last) if masked else k - 1
        return k - 1

    def cache_precision(self) -> str:
        """Slopes are float64 reference values rounded once: the `exact` policy, not a copy of
        one transformers fp32 path."""
        return "exact"

    @property
    def local_heads(self) -> int:
        """Heads on this tensor-parallel rank: num_heads / tp_size."""
        return self.num_heads // self.tp_size

    def canonical(self) -> Self:
        if self.bias is None:
            return self
        q, k = self._lengths()
        masked_value = (self.masked_value or "min") if self.bias in MASKED_FORMS else None
        return self.model_copy(
            update={"query_length": q, "key_length": k, "masked_value": masked_value}
        )

    def outputs(self) -> dict[str, TensorInfo]:
        out = {"slopes": TensorInfo((self.local_heads,), "float32")}
        if self.bias is not None:
            q, k = self._lengths()
            out["bias"] = TensorInfo((self.local_heads, q, k), self.dtype, row_axis=1)
        return out


@functools.lru_cache(maxsize=256)
def _reference_slopes(num_heads: int, bias_max: float) -> tuple[float, ...]:
    return tuple(reference_slopes(num_heads, bias_max))


def reference_slopes(num_heads: int, bias_max: float = 8.0) -> list[float]:
    """The reference slopes (H,) in float64: `get_slopes` from
    ofirpress/attention_with_linear_biases (fairseq `TransformerDecoder.get_slopes`) with 8
    generalised to `bias_max` (MPT).

    Powers of two: `2^(-bias_max*(h+1)/n)`; otherwise the first c = 2^floor(log2 n) slopes of n=c
    followed by every other slope of n=2c, truncated to n.
    """

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-bias_max * (h + 1) / n) for h in range(n)]

    c = 1 << (num_heads.bit_length() - 1)
    if c == num_heads:
        return power_of_two(num_heads)
    return power_of_two(c) + power_of_two(2 * c)[0::2][: num_heads - c]


def global_slopes(spec: AlibiSpec) -> list[float]:
    """All H slopes in float64 (rounded to `slope_rounding` first when set) with `slope_scale` and
    `interpolation_factor` applied."""
    scale = spec.slope_scale / spec.interpolation_factor
    slopes = _reference_slopes(spec.num_heads, float(spec.alibi_bias_max))
    if spec.slope_rounding == "bfloat16":
        slopes = _bfloat16(slopes)
    return [m * scale for m in slopes]


def _bfloat16(values: tuple[float, ...]) -> tuple[float, ...]:
    """float64 values rounded to float32, then to bfloat16 (nearest, ties to even), as
    `torch.pow(...)` in float32 followed by `.bfloat16()` rounds them."""
    as32 = torch.tensor(values, dtype=torch.float64).float()
    return tuple(float(v) for v in as32.bfloat16().double().tolist())


def local_slopes64(spec: AlibiSpec) -> list[float]:
    """This rank's slice of `global_slopes`: heads [tp_rank*H_local, (tp_rank+1)*H_local)."""
    n = spec.local_heads
    return global_slopes(spec)[spec.tp_rank * n : (spec.tp_rank + 1) * n]


def alibi_slopes(
    spec: AlibiSpec, device: torch.device | str = "cpu", slopes64: list[float] | None = None
) -> torch.Tensor:
    """This rank's slopes (H_local,) float32: float64 reference values rounded once.

    `slopes64`: `local_slopes64(spec)` when the caller has it already.
    """
    values = local_slopes64(spec) if slopes64 is None else slopes64
    # numpy rounds float64 -> float32 as torch does (to nearest, ties to even), without torch's
    # per-call overhead on a handful of values
    rounded = torch.from_numpy(np.asarray(values, dtype=np.float64).astype(np.float32))
    return to_device(rounded, torch.device(device))


def alibi_bias(spec: AlibiSpec, slopes: torch.Tensor) -> torch.Tensor:
    """The additive bias (H_local, Q, K) in the spec dtype for a canonical spec with a bias form.

    `slopes` (H_local,) float32 on the target device; distances are integers, exact in fp32
    (positions stay below 2^24); each entry is `(slope_fp32 * distance_fp32).to(dtype)`; masked
    entries (decoder forms) are filled after the cast so that `"min"` is the output dtype's own
    minimum.

    Every form depends on the relative position r = j - i alone (`causal`, `symmetric`,
    `bottom_right`, and the mask j > p_i, i.e. r > query_offset) or on j alone (`row_constant`,
    `mpt`), so no (Q, K) grid is multiplied: the Q + K - 1 (resp. K) distinct entries per head are
    computed with exactly those ops and written out in one pass, as a Toeplitz matrix (row i is
    entries Q-1-i .. Q-1-i+K-1 of the per-r vector) or as one row broadcast over the queries.
    """
    q, k = int(spec.query_length or 0), int(spec.key_length or 0)
    off = spec.query_offset
    heads = slopes.shape[0]
    dev = slopes.device
    out_dtype = DTYPES[spec.dtype]
    # the last key is at or before the first query position: nothing to mask
    masked = spec.bias in MASKED_FORMS and spec.masked_value != "none" and k - 1 > off
    fill = float("-inf") if spec.masked_value == "-inf" else torch.finfo(out_dtype).min
    if spec.bias_rounding == "bfloat16":
        keys = torch.arange(k, dtype=torch.int64, device=dev)
        row = _falcon_row(spec, keys).to(out_dtype)[:, None, :]
        return _row_constant(row, q, off, fill if masked else None)
    if spec.bias in ("causal", "symmetric", "bottom_right"):
        r = torch.arange(-(q - 1), k, dtype=torch.int64, device=dev)  # (Q+K-1,): j - i
        if spec.bias == "causal":
            dist = r - off
        elif spec.bias == "symmetric":
            dist = -(r - off).abs()
        else:
            dist = -((k - q) - r).abs()
        per_r = (slopes[:, None] * dist.to(torch.float32)[None, :]).to(out_dtype)
        if masked:
            per_r.masked_fill_((r > off)[None, :], fill)
        return toeplitz(per_r, q, k)
    # key distances j or j - (K-1), exact in fp32 (|value| < 2^24), built as such
    first = 0 if spec.bias == "row_constant" else 1 - k
    out = empty((heads, q, k), out_dtype, dev)
    if q == 1 and not masked and dev.type == "cpu" and out_dtype == torch.float32:
        # the one fp32 row multiplied straight into the output by numpy (IEEE single products,
        # the same bits as torch.mul, without its per-call overhead on a table this small)
        dist_np = np.arange(first, first + k, dtype=np.float32)
        np.multiply(slopes.numpy()[:, None], dist_np[None, :], out=out.numpy().reshape(heads, k))
        return out
    dist = torch.arange(first, first + k, dtype=torch.float32, device=dev)
    if q == 1 and not masked:
        # the one row multiplied straight into the output (fp32 product, rounded on the store
        # as .to(dtype) rounds)
        torch.mul(slopes[:, None], dist[None, :], out=out.view(heads, k))
        return out
    row = (slopes[:, None] * dist[None, :]).to(out_dtype)[:, None, :]
    return _row_constant(row, q, off, fill if masked else None, out)


def alibi_bias_at(
    spec: AlibiSpec, slopes: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor
) -> torch.Tensor:
    """The bias (H_local, Q, K) of canonical `spec` at query positions `queries` (Q,) and key
    positions `keys` (K,), int64, computed there only: `alibi_bias(spec, slopes)[:, queries -
    query_offset][:, :, keys]` without the table (a sampled view of a table of 10M x 10M keys).

    The same ops entry by entry as `alibi_bias`: the distance of each (query position p, key j)
    (j - p, -|j - p|, -|(K - Q) - (j - p)|, j or j - (K - 1) with the table's lengths K, Q),
    `(slope_fp32 * distance_fp32).to(dtype)` (Falcon's bfloat16 row, `_falcon_row`, at the keys),
    and decoder forms' keys after the query position filled with `masked_value` after the cast.
    Positions stay below 2^24, so distances are exact in fp32 as in the table.
    """
    q_len, k_len = int(spec.query_length or 0), int(spec.key_length or 0)
    out_dtype = DTYPES[spec.dtype]
    p = queries.to(slopes.device, torch.int64)
    j = keys.to(slopes.device, torch.int64)
    rel = j[None, :] - p[:, None]  # (Q, K): key - query position
    if spec.bias_rounding == "bfloat16":
        bias = _falcon_row(spec, j).to(out_dtype)[:, None, :].expand(-1, p.numel(), -1)
    else:
        if spec.bias == "causal":
            dist = rel
        elif spec.bias == "symmetric":
            dist = -rel.abs()
        elif spec.bias == "bottom_right":
            dist = -((k_len - q_len) - rel).abs()
        else:
            first = 0 if spec.bias == "row_constant" else 1 - k_len
            dist = (j + first)[None, :].expand(p.numel(), -1)
        bias = (slopes[:, None, None] * dist.to(torch.float32)[None]).to(out_dtype)
    if spec.bias in MASKED_FORMS and spec.masked_value != "none":
        fill = float("-inf") if spec.masked_value == "-inf" else torch.finfo(out_dtype).min
        bias = bias.masked_fill((rel > 0)[None], fill)
    return bias.contiguous()


def _row_constant(
    row: torch.Tensor, q: int, off: int, fill: float | None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """(H, Q, K) with every query row equal to `row` (H, 1, K); with `fill`, the keys after
    each query's position (j > off + i) set to it (into `out` when given)."""
    heads, _, k = row.shape
    if out is None:
        out = empty((heads, q, k), row.dtype, row.device)
    if fill is None:
        out.copy_(row.expand(heads, q, k))
        return out
    j = torch.arange(k, dtype=torch.int64, device=row.device)
    i = torch.arange(off, off + q, dtype=torch.int64, device=row.device)
    fill_value = torch.tensor(fill, dtype=row.dtype, device=row.device)
    return torch.where((j[None, :] > i[:, None])[None], fill_value, row, out=out)


def _falcon_row(spec: AlibiSpec, keys: torch.Tensor) -> torch.Tensor:
    """(H_local, K) float32 at int64 key positions `keys` (K,) (0..K-1 for the table): transformers
    Falcon's `build_alibi_tensor(ones(1, K), H, float32)` divided by sqrt(head_dim) = 1 /
    slope_scale as `FalconModel.forward` divides it: the bfloat16 slopes times the key positions
    cast to bfloat16, the product rounded to bfloat16, then converted to float32 and divided (IEEE
    true division by the float32 divisor, a (1, 1) tensor so that no device turns it into a
    multiply by the reciprocal). Element by element: any keys give the table's entries there."""
    device = keys.device
    n = spec.local_heads
    rounded = _bfloat16(_reference_slopes(spec.num_heads, 8.0))
    local = rounded[spec.tp_rank * n : (spec.tp_rank + 1) * n]
    slopes16 = torch.tensor(local, dtype=torch.float64).to(device=device, dtype=torch.bfloat16)
    keys16 = keys.to(torch.bfloat16)
    product = (slopes16[:, None] * keys16[None, :]).float()
    divisor = torch.full((1, 1), 1.0 / spec.slope_scale, dtype=torch.float32, device=device)
    return product / divisor


@register_family("alibi", AlibiSpec, "ALiBi slopes (reference rule) and additive bias forms")
def compute_alibi(
    spec: AlibiSpec, device: torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """`slopes` (H_local,) float32 and, with a bias form, `bias` (H_local, Q, K) in `dtype`."""
    slopes64 = local_slopes64(spec)
    slopes = alibi_slopes(spec, device, slopes64)
    tensors = {"slopes": slopes}
    if spec.bias is not None:
        tensors["bias"] = alibi_bias(spec, slopes)
    start = spec.tp_rank * spec.local_heads
    facts: dict[str, Any] = {
        "heads": [start, start + spec.local_heads],
        "masked": spec.bias in MASKED_FORMS and spec.masked_value != "none",
        "max_slope": max(slopes64),
    }
    if spec.bias is not None:
        q, k = int(spec.query_length or 0), int(spec.key_length or 0)
        facts["max_abs_bias"] = facts["max_slope"] * spec._max_distance(q, k)
    return tensors, facts
