"""LongRoPE (Ding et al. 2024, arXiv:2402.13753; Phi-3/3.5). transformers
`_compute_longrope_parameters` and `longrope_frequency_update`.

`inv = 1 / (ext * base ** (2i/d))`, shape (d/2,), with ext = long_factor when seq_len > original
length, else short_factor. A = attention_factor, else sqrt(1 + ln(factor)/ln(orig)) (1 when
factor <= 1), with factor defaulting to max_position_embeddings/orig. The switch at orig+1
invalidates keys cached under the short table (transformers#33129): the switch point is reported
as a fact.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Self

import torch
from pydantic import BeforeValidator, Field, model_validator

from posenc.encodings.rope.variants._common import (
    Issue,
    RopeInputs,
    ScalingBase,
    Switch,
    VariantResult,
    exponents,
    field_error,
)
from posenc.encodings.rope.variants._hf import HfMapping, HfRopeParams

PositiveFloat = Annotated[float, Field(gt=0.0)]


def _as_tuple(value: object) -> object:
    """JSON arrays arrive as lists; specs are strict (no coercion) but keep factors as tuples."""
    return tuple(value) if isinstance(value, list) else value


Factors = Annotated[tuple[PositiveFloat, ...], BeforeValidator(_as_tuple)]


class LongRopeScaling(ScalingBase):
    rope_type: Literal["longrope"] = "longrope"
    short_factor: Factors
    long_factor: Factors
    # >= 2: the default A divides by ln(original_max_position_embeddings)
    original_max_position_embeddings: Annotated[int, Field(ge=2)]
    factor: Annotated[float | None, Field(gt=0.0)] = None
    max_position_embeddings: Annotated[int | None, Field(ge=1)] = None
    attention_factor: Annotated[float | None, Field(gt=0.0)] = None

    @model_validator(mode="after")
    def _factor(self) -> Self:
        if self.factor is None and self.max_position_embeddings is None:
            raise field_error(
                [Issue(("factor",), "longrope needs factor or max_position_embeddings", None)]
            )
        if len(self.short_factor) != len(self.long_factor):
            raise field_error(
                [
                    Issue(
                        ("long_factor",),
                        f"long_factor has {len(self.long_factor)} entries, short_factor "
                        f"{len(self.short_factor)}: both must have rotary_dim/2",
                        len(self.long_factor),
                    )
                ]
            )
        return self

    def check_dim(self, dim: int) -> list[Issue]:
        if len(self.short_factor) != dim // 2:
            return [
                Issue(
                    ("rope_scaling", name),
                    f"needs rotary_dim/2 = {dim // 2} entries, got {len(self.short_factor)}",
                    len(self.short_factor),
                )
                for name in ("short_factor", "long_factor")
            ]
        return []

    def resolved_factor(self) -> float:
        if self.factor is not None:
            return self.factor
        assert self.max_position_embeddings is not None
        return self.max_position_embeddings / self.original_max_position_embeddings

    def canonical(self) -> LongRopeScaling:
        return self.model_copy(
            update={"factor": self.resolved_factor(), "max_position_embeddings": None}
        )

    def switch(self) -> Switch:
        return Switch(
            self.original_max_position_embeddings,
            "original_max_position_embeddings",
            recomputed=False,
            label="LongRoPE",
        )

    def canonical_seq_len(self, seq_len: int) -> int:
        # Only the side of the switch matters: the original length (short factors) or one more
        # (long factors).
        original = self.original_max_position_embeddings
        return original + 1 if uses_long_factors(self, seq_len) else original


def attention_scaling(s: LongRopeScaling) -> float:
    """A: attention_factor, else sqrt(1 + ln(factor) / ln(orig)), 1 when factor <= 1."""
    if s.attention_factor is not None:
        return s.attention_factor
    factor = s.resolved_factor()
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(s.original_max_position_embeddings))


def uses_long_factors(s: LongRopeScaling, seq_len: int | None) -> bool:
    """transformers: long factors when `seq_len > original_max_position_embeddings`."""
    return bool(seq_len and seq_len > s.original_max_position_embeddings)


def inv_freq(scaling: LongRopeScaling, x: RopeInputs) -> VariantResult:
    """LongRoPE inverse frequencies for `seq_len`, shape (d/2,); facts: the factors, the switch."""
    use_long = uses_long_factors(scaling, x.seq_len)
    factors = scaling.long_factor if use_long else scaling.short_factor
    # transformers builds the factors as an fp32 tensor; exact keeps them as given (float64).
    ext = torch.tensor(factors, dtype=x.dtype, device=x.device)
    inv = 1.0 / (ext * x.base ** exponents(x.dim, x))
    facts = {
        "longrope_factors": "long" if use_long else "short",
        "longrope_switch_point": scaling.original_max_position_embeddings,
    }
    return inv, attention_scaling(scaling), facts


def from_hf(p: HfRopeParams) -> HfMapping:
    """The original length, both factor lists, `factor` (else max_position_embeddings, from which
    the spec derives it), `attention_factor`; notes: A and the switch point."""
    original = p.original_length()
    for name in ("short_factor", "long_factor"):
        if not isinstance(p.params.get(name), list):
            p.fail(name, "required: a list of rotary_dim/2 numbers", p.params.get(name))
    data: dict[str, Any] = {
        "rope_type": "longrope",
        "short_factor": list(p.params["short_factor"]),
        "long_factor": list(p.params["long_factor"]),
        "original_max_position_embeddings": original,
    }
    factor = p.optional("factor")
    if factor is not None:
        data["factor"] = factor
    elif p.max_position_embeddings is not None:
        data["max_position_embeddings"] = p.max_position_embeddings
    else:
        p.fail("factor", "longrope needs factor or max_position_embeddings", None)
    attention = p.optional("attention_factor")
    if attention is not None:
        data["attention_factor"] = attention
    scaling = p.validated(LongRopeScaling, data)
    notes = {
        "attention_scaling": attention_scaling(scaling),
        "longrope_switch_point": original,
        "longrope": (
            f"short_factor for seq_len <= {original}, long_factor above (seq_len defaults to "
            "max_positions); keys cached under the short table are invalid after the switch "
            "(transformers#33129)"
        ),
    }
    return data, notes
