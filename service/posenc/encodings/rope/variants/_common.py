"""Shared pieces of the RoPE scaling variants.

Each variant module defines its parameter model (keys as in transformers' `rope_parameters`, the
`rope_type` literal naming the variant), `inv_freq(...)`, a pure function returning
`(inv_freq (d/2,), attention_scaling, facts)`, and `from_hf(...)`, the mapping of a config.json
rope parameter dict to its `rope_scaling` (`_hf.py`). A length-dependent variant also says where its
frequencies change (`switch`) and which sequence length stands for its table
(`canonical_seq_len`). The fp32 path reproduces transformers' op order exactly
(`modeling_rope_utils.py`), so the tables are bit-identical on CPU; the same code run in float64
gives the `exact` precision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class Issue:
    """One cross-field problem: its path from the model being validated, why, and the value."""

    loc: Loc
    message: str
    value: Any = None


def field_error(issues: Sequence[Issue], title: str = "rope") -> ValidationError:
    """A pydantic `ValidationError` with one line per issue, located at the offending field.

    Raised from a model validator, pydantic prefixes each `loc` with the model's own path, so the
    resulting `SpecError` names the field (`rope_scaling.beta_fast`) instead of the whole spec.
    """
    return ValidationError.from_exception_data(
        title,
        [
            InitErrorDetails(
                type=PydanticCustomError("value_error", "{message}", {"message": i.message}),
                loc=i.loc,
                input=i.value,
            )
            for i in issues
        ],
    )


@dataclass(frozen=True)
class Switch:
    """Where a length-dependent variant's inverse frequencies change.

    Up to `length` (the value of the `rope_scaling.<field>` key) the variant uses its init-time
    frequencies. Past it, a `recomputed` variant computes new ones for every length (dynamic NTK:
    transformers' `dynamic_frequency_update`); the others switch to one second set for every
    longer length (LongRoPE: `longrope_frequency_update`). `label` names the variant in messages.
    """

    length: int
    field: str
    recomputed: bool
    label: str


class ScalingBase(BaseModel):
    """Base of the `rope_scaling` parameter models: frozen, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=True)

    rope_type: str

    in_transformers: ClassVar[bool] = True
    """Whether transformers' `ROPE_INIT_FUNCTIONS` (or "default") names this rope_type, so that a
    config.json may name it; False for a variant that only a model's own rotary class selects."""

    spans_head_dim: ClassVar[bool] = False
    """True when the table is always head_dim wide: the variant decides itself which pairs rotate
    (its own `partial_rotary_factor`), so the spec's rotary_dim must be head_dim."""

    def switch(self) -> Switch | None:
        """Where the frequencies change with the sequence length; None when they never do."""
        return None

    def canonical_seq_len(self, seq_len: int) -> int | None:
        """The one sequence length that stands for every length giving the same table as
        `seq_len`; None when the table does not depend on it."""
        return None

    def check_dim(self, dim: int) -> list[Issue]:
        """Problems fitting rotary dim `dim`, each located relative to the RoPE spec root."""
        return []

    def check_frequencies(self, x: RopeInputs) -> list[Issue]:
        """Problems of the frequencies this variant computes from `x` (the spec's rotary dim,
        base and compute dtype), each located relative to the RoPE spec root: a configuration
        that transformers accepts but whose frequencies come out non-finite is refused here."""
        return []

    def canonical(self) -> ScalingBase:
        """The canonical spelling: derived defaults resolved, no-op scalings written `default`."""
        return self


@dataclass(frozen=True)
class RopeInputs:
    """What every variant needs: rotary dim d, head_dim, base, sequence length, dtype, device."""

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
    """`arange(0, dim, 2) / denominator`, shape (dim/2,), as transformers writes it (int64 arange,
    cast to the compute dtype, then divide)."""
    den = dim if denominator is None else denominator
    return torch.arange(0, dim, 2, dtype=torch.int64, device=x.device).to(dtype=x.dtype) / den


def default_inv_freq(base: float, x: RopeInputs) -> torch.Tensor:
    """`1 / base ** (2i/d)`, shape (d/2,): transformers `compute_default_rope_parameters`."""
    return 1.0 / (base ** exponents(x.dim, x))
