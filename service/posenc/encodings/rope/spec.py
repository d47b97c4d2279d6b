"""The RoPE spec: head and rotary dims, base, rows, the scaling variant and the output layout.

Key names follow transformers' config keys (`rope_theta`, `partial_rotary_factor`,
`rope_scaling.rope_type`, `factor`, `original_max_position_embeddings`, ...). Layout, pairing,
width, dtype and precision are explicit fields; a `profile` fills those left unset with the
defaults of one consumer (`profiles.PROFILES`, one record per consumer, from the consumer table
in the field guide), and the consumer's checks refuse what it cannot read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

import torch
from pydantic import Field, field_validator, model_validator

from posenc.encodings.base import SpecBase, TensorInfo
from posenc.encodings.rope.profiles import (
    DEFAULT_PROFILE,
    PROFILES,
    FloatDtype,
    Layout,
    Packing,
    Profile,
    Width,
)
from posenc.encodings.rope.scaling import DefaultScaling, RopeScaling
from posenc.encodings.rope.variants import VARIANTS
from posenc.encodings.rope.variants._common import Issue, RopeInputs, field_error

MAX_HEAD_DIM = 8192
MAX_POSITIONS = 1 << 24
_SPANS_HEAD_DIM = "RoPE always spans head_dim: put partial_rotary_factor in rope_scaling"

FullLayout = Literal["cat", "repeat_interleave"]
Precision = Literal["reference", "exact"]


class RopeSpec(SpecBase):
    """Rotary position embedding cos/sin caches (Su et al. 2021, RoFormer, arXiv:2104.09864;
    transformers `modeling_rope_utils.py` and each model's `*RotaryEmbedding`).

    Rows are positions 0..max_positions-1. With rotary dim d (`rotary_dim`, or
    `int(head_dim * partial_rotary_factor)`): `cos`/`sin` are (P, d) at full width (`cat(c, c)`,
    or `repeat_interleave(c, 2)` when `interleaved`; `full_layout` names the arrangement where a
    model's rotary module emits the other one: transformers' MLA models with interleaved pairs
    emit `cat(c, c)` for `apply_rotary_pos_emb_interleave`), (P, d/2) at half width; `cos_sin`
    packing is (P, d) = cat(cos_half, sin_half), or at full width (P, 2d) = cat(cos, sin) of the
    full-width tables (torchtune's Qwen2/Phi-3 `build_rope_cache`); `pairs` packing is (P, d/2, 2) =
    stack(cos, sin), or at full width (P, d, 2) = stack of the full-width cos/sin
    (TensorRT-LLM's MLA table, `create_sinusoidal_positions_yarn(duplicate_data=True)`:
    `cat(c, c)`). `inv_freq`
    is (d/2,) in the compute dtype. Proportional RoPE (Gemma 4) always spans head_dim.
    `seq_len` (default max_positions) selects the dynamic-NTK base and the LongRoPE factor set.
    `trig: "polar"` takes cos/sin as the real and imaginary parts of `torch.polar(1, angle)`, as
    transformers builds complex `freqs_cis` (DeepSeek-V2, Llama 4): up to 2 ulp from
    `torch.cos`/`torch.sin` of the same angles, so only that path reproduces those models bit
    for bit (reference precision only).
    """

    kind: Literal["rope"] = "rope"
    head_dim: Annotated[int, Field(ge=2, le=MAX_HEAD_DIM)]
    rotary_dim: Annotated[int | None, Field(ge=2, le=MAX_HEAD_DIM)] = None
    partial_rotary_factor: Annotated[float | None, Field(gt=0.0, le=1.0)] = None
    # > 1: frequencies base^(-2i/d) must decrease, and YaRN divides by ln(base).
    rope_theta: Annotated[float, Field(gt=1.0)] = 10000.0
    max_positions: Annotated[int, Field(ge=1, le=MAX_POSITIONS)]
    seq_len: Annotated[int | None, Field(ge=1, le=MAX_POSITIONS)] = None
    rope_scaling: RopeScaling = Field(default_factory=DefaultScaling)
    interleaved: bool | None = None
    width: Width | None = None
    full_layout: FullLayout | None = None
    packing: Packing | None = None
    dtype: FloatDtype | None = None
    precision: Precision = "reference"
    trig: Literal["polar"] | None = None
    profile: Profile | None = None

    @field_validator("rope_scaling", mode="before")
    @classmethod
    def _scaling_by_type(cls, value: Any) -> Any:
        # Validate against the model `rope_type` names, so that errors read
        # `rope_scaling.<field>` (a discriminated union puts its tag into the path).
        if not isinstance(value, Mapping):
            return value
        rope_type = value.get("rope_type", "default")
        variant = VARIANTS.get(rope_type) if isinstance(rope_type, str) else None
        if variant is None:
            raise field_error(
                [Issue(("rope_type",), f"must be one of {sorted(VARIANTS)}", rope_type)]
            )
        return variant.params.model_validate(dict(value))

    @model_validator(mode="after")
    def _check(self) -> Self:
        issues: list[Issue] = []
        if self.rotary_dim is not None and self.partial_rotary_factor is not None:
            issues += [
                Issue((name,), "give rotary_dim or partial_rotary_factor, not both", value)
                for name, value in (
                    ("rotary_dim", self.rotary_dim),
                    ("partial_rotary_factor", self.partial_rotary_factor),
                )
            ]
        if self.rope_scaling.spans_head_dim:
            message = f"{self.rope_scaling.rope_type} {_SPANS_HEAD_DIM}"
            if self.rotary_dim not in (None, self.head_dim):
                issues.append(Issue(("rotary_dim",), message, self.rotary_dim))
            if self.partial_rotary_factor not in (None, 1.0):
                issues.append(
                    Issue(("partial_rotary_factor",), message, self.partial_rotary_factor)
                )
        if self.trig == "polar" and self.precision != "reference":
            issues.append(
                Issue(
                    ("trig",),
                    "polar reproduces transformers' fp32 complex path: precision must be "
                    "'reference'",
                    self.trig,
                )
            )
        if issues:
            raise field_error(issues)

        d = self.resolved_rotary_dim()
        dim_loc, dim_value = self._dim_field()
        if d < 2 or d % 2:
            issues.append(
                Issue(dim_loc, f"the rotary dim must be even and >= 2, got {d}", dim_value)
            )
        elif d > self.head_dim:
            issues.append(
                Issue(dim_loc, f"rotary dim {d} exceeds head_dim {self.head_dim}", dim_value)
            )
        else:
            for issue in self.rope_scaling.check_dim(d):
                at_dim = issue.loc == ("rotary_dim",)
                issues.append(Issue(dim_loc, issue.message, dim_value) if at_dim else issue)
            if not issues:
                issues += self.rope_scaling.check_frequencies(self._inputs(d))
        if self.profile is not None:
            issues += PROFILES[self.profile].issues(d, self._layout(), self.rope_scaling.rope_type)
        if issues:
            raise field_error(issues)
        return self

    def _inputs(self, dim: int) -> RopeInputs:
        """The variant inputs `compute` builds for this spec (CPU, the precision's dtype)."""
        return RopeInputs(
            dim=dim,
            head_dim=self.head_dim,
            base=self.rope_theta,
            seq_len=self.seq_len,
            dtype=torch.float64 if self.precision == "exact" else torch.float32,
            device=torch.device("cpu"),
        )

    def _dim_field(self) -> tuple[tuple[str], int | float]:
        """The field the rotary dim came from, to name it in errors."""
        if not self.rope_scaling.spans_head_dim:
            if self.rotary_dim is not None:
                return ("rotary_dim",), self.rotary_dim
            if self.partial_rotary_factor is not None:
                return ("partial_rotary_factor",), self.partial_rotary_factor
        return ("head_dim",), self.head_dim

    def _layout(self) -> Layout:
        """(interleaved, width, packing, dtype): explicit fields, else the profile's, else `hf`'s.
        A packed layout implies half width unless `width` says otherwise (`pairs` at full width is
        TensorRT-LLM's duplicated MLA table, `cos_sin` torchtune's Qwen2/Phi-3 cache)."""
        defaults = PROFILES[self.profile] if self.profile is not None else DEFAULT_PROFILE
        packing: Packing = self.packing or defaults.packing
        width: Width = self.width or ("half" if packing != "separate" else defaults.width)
        interleaved = defaults.interleaved if self.interleaved is None else self.interleaved
        dtype: FloatDtype = self.dtype or defaults.dtype
        return Layout(interleaved, width, packing, dtype)

    def resolved_rotary_dim(self) -> int:
        """d: the number of rotated channels (the table width at full width)."""
        if self.rope_scaling.spans_head_dim:
            return self.head_dim
        if self.rotary_dim is not None:
            return self.rotary_dim
        if self.partial_rotary_factor is not None:
            return int(self.head_dim * self.partial_rotary_factor)
        return self.head_dim

    def canonical(self) -> Self:
        """Every default resolved, the profile expanded, `partial_rotary_factor` turned into
        `rotary_dim`, `seq_len` reduced to the value that selects the table (or dropped), no-op
        scalings written as `default`: equal tables have equal canonical forms."""
        interleaved, width, packing, dtype = self._layout()
        scaling = self.rope_scaling.canonical()
        # full_layout only shapes a full-width table (separate or pairs), and only where it
        # differs from the one `interleaved` implies: other layouts and the implied one drop it.
        implied = "repeat_interleave" if interleaved else "cat"
        full_layout = self.full_layout if width == "full" and self.full_layout != implied else None
        return self.model_copy(
            update={
                "rotary_dim": self.resolved_rotary_dim(),
                "partial_rotary_factor": None,
                "seq_len": scaling.canonical_seq_len(self.seq_len or self.max_positions),
                "rope_scaling": scaling,
                "interleaved": interleaved,
                "width": width,
                "full_layout": full_layout,
                "packing": packing,
                "dtype": dtype,
                "profile": None,
            }
        )

    def repeats_interleaved(self) -> bool:
        """Whether a full-width table is `repeat_interleave(c, 2)` (else `cat(c, c)`): the
        `full_layout` when given, else the pairing (`interleaved`, the profile's default)."""
        if self.full_layout is not None:
            return self.full_layout == "repeat_interleave"
        interleaved, _, _, _ = self._layout()
        return interleaved

    def outputs(self) -> dict[str, TensorInfo]:
        c = self.canonical()
        d = c.resolved_rotary_dim()
        p = c.max_positions
        dt = str(c.dtype)
        inv_dt = "float64" if c.precision == "exact" else "float32"
        out: dict[str, TensorInfo]
        if c.packing == "cos_sin":
            w = 2 * d if c.width == "full" else d
            out = {"cos_sin": TensorInfo((p, w), dt, row_axis=0)}
        elif c.packing == "pairs":
            w = d if c.width == "full" else d // 2
            out = {"pairs": TensorInfo((p, w, 2), dt, row_axis=0)}
        else:
            w = d if c.width == "full" else d // 2
            out = {
                "cos": TensorInfo((p, w), dt, row_axis=0),
                "sin": TensorInfo((p, w), dt, row_axis=0),
            }
        out["inv_freq"] = TensorInfo((d // 2,), inv_dt)
        return out
