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
    Switch,
    VariantResult,
    exponents,
)
from posenc.encodings.rope.variants._hf import HfMapping, HfRopeParams


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

    def switch(self) -> Switch:
        return Switch(
            self.max_position_embeddings,
            "max_position_embeddings",
            recomputed=True,
            label="dynamic NTK",
        )

    def canonical_seq_len(self, seq_len: int) -> int:
        # transformers uses L = max(seq_len, max_position_embeddings).
        return max(seq_len, self.max_position_embeddings)


def inv_freq(scaling: DynamicScaling, x: RopeInputs) -> VariantResult:
    """inv_freq = base'^(-2i/d), shape (d/2,); attention scaling 1; facts: the effective base."""
    max_position_embeddings = scaling.max_position_embeddings
    factor = scaling.factor
    seq_len = x.seq_len if x.seq_len is not None else max_position_embeddings
    exponent = x.dim / (x.dim - 2)
    base: float | torch.Tensor
    if seq_len > max_position_embeddings and x.dtype == torch.float32:
        # The forward path: seq_len is an int64 tensor and the arithmetic runs in fp32 tensors.
        length = torch.maximum(
            torch.tensor(seq_len, dtype=torch.int64, device=x.device),
            torch.tensor(max_position_embeddings, dtype=torch.int64, device=x.device),
        )
        base = x.base * ((factor * length / max_position_embeddings) - (factor - 1)) ** exponent
    else:
        length_i = max(seq_len, max_position_embeddings)
        base = x.base * ((factor * length_i / max_position_embeddings) - (factor - 1)) ** exponent
    inv = 1.0 / (base ** exponents(x.dim, x))
    effective = float(base) if isinstance(base, torch.Tensor) else base
    return inv, 1.0, {"effective_rope_theta": effective}


def from_hf(p: HfRopeParams) -> HfMapping:
    """`factor` (required) and the model's max_position_embeddings (transformers
    `_compute_dynamic_ntk_parameters` reads `config.max_position_embeddings`)."""
    length = p.needs_max_position_embeddings("dynamic NTK needs it")
    notes = {
        "length_dependent": (
            "dynamic NTK: the table depends on the sequence length (seq_len, default "
            "max_positions); transformers recomputes it from max(position_ids)+1 past "
            f"max_position_embeddings={length} and resets below it"
        )
    }
    data = {"rope_type": "dynamic", "factor": p.factor(), "max_position_embeddings": length}
    return data, notes
