"""Dynamic NTK-aware scaling (/u/bloc97, /u/emozilla). transformers
`_compute_dynamic_ntk_parameters` and `dynamic_rope_update`.

With L = max(seq_len, max_position_embeddings):
`base' = base * ((factor * L / max_position_embeddings) - (factor - 1)) ** (d / (d - 2))`.
transformers recomputes this in the forward from `max(position_ids) + 1` as a tensor (fp32
arithmetic) once the length exceeds `max_position_embeddings`, and keeps the init-time value
(Python double arithmetic) below it; the reference precision reproduces both paths.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import Field

from posenc.encodings.rope.variants._common import (
    Issue,
    RopeInputs,
    ScalingBase,
    VariantResult,
    exponents,
)


class DynamicScaling(ScalingBase):
    rope_type: Literal["dynamic"] = "dynamic"
    factor: Annotated[float, Field(ge=1.0)]
    max_position_embeddings: Annotated[int, Field(ge=1)]

    def check_dim(self, dim: int) -> list[Issue]:
        if dim <= 2:
            return [
                Issue(
                    ("rotary_dim",), f"dynamic NTK needs rotary dim > 2 (d/(d-2)), got {dim}", dim
                )
            ]
        return []


def inv_freq(scaling: DynamicScaling, x: RopeInputs) -> VariantResult:
    """inv_freq = base'^(-2i/d), shape (d/2,); attention scaling 1; facts: the effective base."""
    mpe = scaling.max_position_embeddings
    factor = scaling.factor
    seq_len = x.seq_len if x.seq_len is not None else mpe
    base: float | torch.Tensor
    if seq_len > mpe and x.dtype == torch.float32:
        # The forward path: seq_len is an int64 tensor and the arithmetic runs in fp32 tensors.
        length = torch.maximum(
            torch.tensor(seq_len, dtype=torch.int64, device=x.device),
            torch.tensor(mpe, dtype=torch.int64, device=x.device),
        )
        base = x.base * ((factor * length / mpe) - (factor - 1)) ** (x.dim / (x.dim - 2))
    else:
        length_i = max(seq_len, mpe)
        base = x.base * ((factor * length_i / mpe) - (factor - 1)) ** (x.dim / (x.dim - 2))
    inv = 1.0 / (base ** exponents(x.dim, x))
    effective = float(base) if isinstance(base, torch.Tensor) else base
    return inv, 1.0, {"effective_rope_theta": effective}
