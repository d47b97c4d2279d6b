"""Normalized scalar positions: the numeric encodings tutorials start from, per sample.

One scalar per position p = 0, 1, ..., with T the sample's valid length (`lengths[b]`, or P =
`max_positions` when no lengths are given):

| mode        | value            | range (valid rows) | tutorial spelling                          |
|-------------|------------------|--------------------|--------------------------------------------|
| `raw`       | p                | [0, T-1]           | `torch.arange(T).float()`                  |
| `by_last`   | p / (T - 1)      | [0, 1]             | `torch.arange(T).float() / (T - 1)`        |
| `by_length` | p / T            | [0, 1)             | `torch.arange(T).float() / T`              |
| `by_max`    | p / t_max        | [0, (T-1)/t_max]   | `torch.arange(T).float() / T_max`          |

T = 1 under `by_last` (0/0 in the formula) is defined as 0: the single position is the start of
the sequence, and the denominator is taken as max(T - 1, 1). Every other value is exactly the
tutorial expression evaluated in fp32: positions are exact below 2^24, and an IEEE division is
correctly rounded, so `p / (T - 1)` is bit-identical to the tutorial line (`torch.linspace(0, 1,
T)` is not: it accumulates a rounded step and differs by an ulp in places). `by_max` divides by
`t_max` as a Python float, as `tensor / T_max` does. With dtype float64 the same expressions run
in float64; float16/bfloat16 are the fp32 values cast last.

Output `embedding`: (B, P) with per-sample `lengths` (B = len(lengths), P = `max_positions`,
default max(lengths)); positions p >= lengths[b] hold `pad_value` (default 0.0). Without lengths
the output is (P,) and every row is valid (T = P). Append a unit axis (`[..., None]`) to use the
value as a one-channel feature.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NoReturn, Self

import torch
from pydantic import Field, model_validator

from posenc.encodings.base import DTYPES, SpecBase, TensorInfo, register_family
from posenc.encodings.errors import FieldProblem, SpecError

MAX_POSITIONS = 1 << 24
"""Positions stay below 2^24: exact in fp32."""
MAX_BATCH = 1 << 16
MAX_ENTRIES = 1 << 28
"""Cap on B * P (the service's byte limit usually binds first)."""

Mode = Literal["raw", "by_last", "by_length", "by_max"]
Dtype = Literal["float32", "float64", "float16", "bfloat16"]


def _bad(field: str, message: str, value: Any) -> NoReturn:
    raise SpecError("invalid normalized spec", [FieldProblem(field, message, value)])


class NormalizedSpec(SpecBase):
    """Normalized scalar positions `embedding` (B, P) per sample, or (P,); module docstring."""

    kind: Literal["normalized"] = "normalized"
    mode: Mode
    max_positions: Annotated[int | None, Field(ge=1, le=MAX_POSITIONS)] = None
    lengths: Annotated[
        list[Annotated[int, Field(ge=0, le=MAX_POSITIONS)]] | None,
        Field(min_length=1, max_length=MAX_BATCH),
    ] = None
    t_max: Annotated[float | None, Field(gt=0.0)] = None
    pad_value: float | None = None
    dtype: Dtype = "float32"

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.max_positions is None and self.lengths is None:
            _bad("max_positions", "required (or give per-sample lengths)", None)
        if self.lengths is not None:
            longest = max(self.lengths)
            if longest < 1 and self.max_positions is None:
                _bad("lengths", "all lengths are 0: give max_positions for the padded width", 0)
            if self.max_positions is not None and longest > self.max_positions:
                _bad(
                    "lengths",
                    f"every length must be <= max_positions={self.max_positions}",
                    longest,
                )
            if len(self.lengths) * self.rows() > MAX_ENTRIES:
                _bad(
                    "lengths",
                    f"batch * max_positions must be <= {MAX_ENTRIES}",
                    len(self.lengths) * self.rows(),
                )
        elif self.pad_value is not None:
            _bad("pad_value", "only used with lengths (nothing is padded without them)", None)
        if (self.mode == "by_max") != (self.t_max is not None):
            why = "required with mode='by_max'" if self.mode == "by_max" else "only with by_max"
            _bad("t_max", why, self.t_max)
        return self

    def rows(self) -> int:
        """P: positions per sample."""
        if self.max_positions is not None:
            return self.max_positions
        return max(self.lengths or [0])

    def canonical(self) -> Self:
        pad = None if self.lengths is None else float(self.pad_value or 0.0)
        t_max = None if self.t_max is None else float(self.t_max)
        return self.model_copy(
            update={"max_positions": self.rows(), "pad_value": pad, "t_max": t_max}
        )

    def outputs(self) -> dict[str, TensorInfo]:
        if self.lengths is None:
            return {"embedding": TensorInfo((self.rows(),), self.dtype, row_axis=0)}
        return {"embedding": TensorInfo((len(self.lengths), self.rows()), self.dtype, row_axis=1)}


@register_family(
    "normalized", NormalizedSpec, "Scalar positions p, p/(T-1), p/T, p/T_max per sample, masked"
)
def compute_normalized(
    spec: NormalizedSpec, device: torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """`embedding` (B, P) or (P,) for a canonical spec (module docstring); fp32 (fp64 for a
    float64 dtype) arithmetic, cast last."""
    p = spec.rows()
    work = torch.float64 if spec.dtype == "float64" else torch.float32
    pos = torch.arange(p, dtype=torch.int64, device=device).to(work)
    lengths = [p] if spec.lengths is None else spec.lengths
    length = torch.tensor(lengths, dtype=torch.int64, device=device)[:, None]
    if spec.mode == "raw":
        values = pos.expand(len(lengths), p)
    elif spec.mode == "by_max":
        values = (pos / float(spec.t_max or 1.0)).expand(len(lengths), p)
    else:
        # T = 1 under by_last: 0 / max(0, 1) = 0. Integer denominators are exact in fp32.
        denom = length - 1 if spec.mode == "by_last" else length
        values = pos[None, :] / denom.clamp(min=1).to(work)
    if spec.lengths is not None:
        valid = pos[None, :] < length.to(work)
        values = torch.where(valid, values, torch.full_like(values, float(spec.pad_value or 0.0)))
        out = values.to(DTYPES[spec.dtype])
    else:
        out = values[0].to(DTYPES[spec.dtype])
    facts: dict[str, Any] = {"masked": spec.lengths is not None}
    return {"embedding": out.contiguous()}, facts
