"""The RoPE spec: head and rotary dims, base, rows, the scaling variant and the output layout.

Key names follow transformers' config keys (`rope_theta`, `partial_rotary_factor`,
`rope_scaling.rope_type`, `factor`, `original_max_position_embeddings`, ...). Layout, pairing,
width, dtype and precision are explicit fields; a `profile` fills those left unset with the
defaults of one consumer (see `PROFILES`, from the consumer table in the field guide).
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from posenc.encodings.base import SpecBase, TensorInfo
from posenc.encodings.rope.scaling import RopeScaling, DefaultScaling

MAX_HEAD_DIM = 8192
MAX_POSITIONS = 1 << 24

Width = Literal["half", "full"]
Packing = Literal["separate", "cos_sin", "pairs"]
FloatDtype = Literal["float32", "float16", "bfloat16"]
Precision = Literal["reference", "exact"]
Profile = Literal[
    "hf", "onnx", "ort_gqa", "vllm", "flashinfer", "trtllm", "flash_attn", "torchtune"
]

PROFILES: dict[str, dict[str, object]] = {
    # transformers forward: full-width cat(c, c), cast to the activation dtype.
    "hf": {"interleaved": False, "width": "full", "packing": "separate", "dtype": "float32"},
    # ONNX RotaryEmbedding-23: (P, d/2) caches, same dtype as X, pairing is an attribute.
    "onnx": {"interleaved": False, "width": "half", "packing": "separate", "dtype": "float32"},
    # onnxruntime GroupQueryAttention(do_rotary=1): (max_seq, d/2), d/2 a multiple of 8.
    "ort_gqa": {"interleaved": False, "width": "half", "packing": "separate", "dtype": "float32"},
    # vLLM cos_sin_cache: (P, d) = cat(cos_half, sin_half), model dtype.
    "vllm": {"interleaved": False, "width": "half", "packing": "cos_sin", "dtype": "float32"},
    # FlashInfer: the same packing, fp32.
    "flashinfer": {"interleaved": False, "width": "half", "packing": "cos_sin", "dtype": "float32"},
    # TensorRT-LLM rotary_cos_sin: (P, d/2, 2) float2 (cos, sin), fp32.
    "trtllm": {"interleaved": False, "width": "half", "packing": "pairs", "dtype": "float32"},
    # flash-attn apply_rotary_emb: (S, d/2), dtype must equal x.
    "flash_attn": {"interleaved": False, "width": "half", "packing": "separate", "dtype": "float32"},
    # torchtune RotaryPositionalEmbeddings cache: (P, d/2, 2), fp32, interleaved pairs.
    "torchtune": {"interleaved": True, "width": "half", "packing": "pairs", "dtype": "float32"},
}

LENGTH_DEPENDENT = ("dynamic", "longrope")


class RopeSpec(SpecBase):
    """Rotary position embedding cos/sin caches (Su et al. 2021, RoFormer; transformers
    `modeling_rope_utils.py`).

    Rows are positions 0..max_positions-1. With rotary dim d (`rotary_dim`, or
    `int(head_dim * partial_rotary_factor)`): `cos`/`sin` are (P, d) at full width, (P, d/2) at half
    width; `cos_sin` packing is (P, d) = cat(cos_half, sin_half); `pairs` packing is (P, d/2, 2).
    `inv_freq` is (d/2,). Proportional RoPE (Gemma 4) always spans head_dim.
    """

    kind: Literal["rope"] = "rope"
    head_dim: Annotated[int, Field(ge=2, le=MAX_HEAD_DIM)]
    rotary_dim: Annotated[int | None, Field(ge=2, le=MAX_HEAD_DIM)] = None
    partial_rotary_factor: Annotated[float | None, Field(gt=0.0, le=1.0)] = None
    rope_theta: Annotated[float, Field(gt=0.0)] = 10000.0
    max_positions: Annotated[int, Field(ge=1, le=MAX_POSITIONS)]
    seq_len: Annotated[int | None, Field(ge=1, le=MAX_POSITIONS)] = None
    rope_scaling: RopeScaling = Field(default_factory=DefaultScaling)
    interleaved: bool | None = None
    width: Width | None = None
    packing: Packing | None = None
    dtype: FloatDtype | None = None
    precision: Precision = "reference"
    profile: Profile | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.rotary_dim is not None and self.partial_rotary_factor is not None:
            raise ValueError("give rotary_dim or partial_rotary_factor, not both")
        scaling = self.rope_scaling
        if scaling.rope_type == "proportional":
            if self.rotary_dim not in (None, self.head_dim) or self.partial_rotary_factor not in (
                None,
                1.0,
            ):
                raise ValueError(
                    "proportional RoPE always spans head_dim: put partial_rotary_factor inside "
                    "rope_scaling"
                )
            if self.head_dim % 2:
                raise ValueError(f"head_dim must be even for proportional RoPE, got {self.head_dim}")
        d = self.resolved_rotary_dim()
        if d < 2 or d % 2:
            raise ValueError(
                f"rotary dim must be even and >= 2, got {d} "
                f"(head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, "
                f"partial_rotary_factor={self.partial_rotary_factor})"
            )
        if d > self.head_dim:
            raise ValueError(f"rotary_dim {d} exceeds head_dim {self.head_dim}")
        scaling.check_dim(d)
        width = self.width or (PROFILES[self.profile]["width"] if self.profile else "full")
        packing = self.packing or (PROFILES[self.profile]["packing"] if self.profile else "separate")
        if packing != "separate" and width != "half":
            raise ValueError(f"packing {packing!r} is built from half-width caches: set width 'half'")
        if self.profile == "ort_gqa" and (d // 2) % 8:
            raise ValueError(
                f"profile ort_gqa needs rotary_dim/2 to be a multiple of 8 "
                f"(GroupQueryAttention), got {d // 2}"
            )
        return self

    def resolved_rotary_dim(self) -> int:
        """d: the number of rotated channels (the table width at full width)."""
        if self.rope_scaling.rope_type == "proportional":
            return self.head_dim
        if self.rotary_dim is not None:
            return self.rotary_dim
        if self.partial_rotary_factor is not None:
            return int(self.head_dim * self.partial_rotary_factor)
        return self.head_dim

    def canonical(self) -> Self:
        prof = PROFILES[self.profile] if self.profile else PROFILES["hf"]
        d = self.resolved_rotary_dim()
        uses_len = self.rope_scaling.rope_type in LENGTH_DEPENDENT
        packing = self.packing or prof["packing"]
        return self.model_copy(
            update={
                "rotary_dim": d,
                "partial_rotary_factor": None,
                "seq_len": (self.seq_len or self.max_positions) if uses_len else None,
                "rope_scaling": self.rope_scaling.canonical(),
                "interleaved": prof["interleaved"] if self.interleaved is None else self.interleaved,
                "width": "half" if packing != "separate" else (self.width or prof["width"]),
                "packing": packing,
                "dtype": self.dtype or prof["dtype"],
                "profile": None,
            }
        )

    def outputs(self) -> dict[str, TensorInfo]:
        c = self.canonical()
        d = c.resolved_rotary_dim()
        p = c.max_positions
        dt = str(c.dtype)
        inv_dt = "float64" if c.precision == "exact" else "float32"
        out: dict[str, TensorInfo]
        if c.packing == "cos_sin":
            out = {"cos_sin": TensorInfo((p, d), dt)}
        elif c.packing == "pairs":
            out = {"pairs": TensorInfo((p, d // 2, 2), dt)}
        else:
            w = d if c.width == "full" else d // 2
            out = {"cos": TensorInfo((p, w), dt), "sin": TensorInfo((p, w), dt)}
        out["inv_freq"] = TensorInfo((d // 2,), inv_dt)
        return out
