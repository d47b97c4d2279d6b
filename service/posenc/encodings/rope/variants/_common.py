"""Shared pieces of the RoPE scaling variants.

Each variant module defines its parameter model (keys as in transformers' `rope_parameters`) and
`inv_freq(...)`, a pure function returning `(inv_freq (d/2,), attention_scaling, facts)`. The fp32
path reproduces transformers' op order exactly (`modeling_rope_utils.py`), so the tables are
bit-identical on CPU; the same code run in float64 gives the `exact` precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from pydantic import BaseModel, ConfigDict


class ScalingBase(BaseModel):
    """Base of the `rope_scaling` parameter models: frozen, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    rope_type: str

    def check_dim(self, dim: int) -> None:
        """Raise ValueError if the parameters do not fit rotary dim `dim`."""

    def canonical(self) -> ScalingBase:
        return self


@dataclass(frozen=True)
class RopeInputs:
    """What every variant needs: rotary dim d, head_dim, base, the sequence length, dtype, device."""

    dim: int
    head_dim: int
    base: float
    seq_len: int | None
    dtype: torch.dtype
    device: torch.device


VariantResult = tuple[torch.Tensor, float, dict[str, Any]]


class InvFreqFn(Protocol):
    def __call__(self, scaling: Any, x: RopeInputs) -> VariantResult: ...


def exponents(dim: int, x: RopeInputs, denominator: int | None = None) -> torch.Tensor:
    """`arange(0, dim, 2) / denominator` as transformers writes it (int64 arange, cast, divide)."""
    den = dim if denominator is None else denominator
    return torch.arange(0, dim, 2, dtype=torch.int64, device=x.device).to(dtype=x.dtype) / den


def default_inv_freq(base: float, x: RopeInputs) -> torch.Tensor:
    """`1 / base ** (2i/d)`, shape (d/2,): transformers `compute_default_rope_parameters`."""
    return 1.0 / (base ** exponents(x.dim, x))
