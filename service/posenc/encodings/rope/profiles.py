"""The RoPE consumer profiles: one record per consumer of a cos/sin table.

A profile names a consumer (its entry point and the source that fixes what it reads), the layout
defaults it fills into a `rope` spec's unset fields (pairing, width, packing, dtype) and the
checks that refuse a table that consumer cannot read. The spec's `profile` Literal, the
`profiles` list of `GET /v1/kinds` and the explorer's options all derive from `PROFILES`; the
consumer table of the field guide (section 1) is the source of the layouts. A new consumer is
one `ConsumerProfile` here plus its tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NamedTuple, TypeAlias

from posenc.encodings.rope.variants._common import Issue

Width = Literal["half", "full"]
Packing = Literal["separate", "cos_sin", "pairs"]
FloatDtype = Literal["float32", "float16", "bfloat16"]


class Layout(NamedTuple):
    """A spec's resolved layout: its explicit fields, else its profile's defaults."""

    interleaved: bool
    width: Width
    packing: Packing
    dtype: FloatDtype


Check = Callable[["ConsumerProfile", int, Layout], "Issue | None"]
"""A profile's refusal rule: (the profile, the rotary dim d, the resolved layout) -> the issue,
named at the spec field to change, or None when the consumer reads that table."""


VLLM_LONGROPE = (
    "profile 'vllm' on longrope: vLLM's Phi3LongRoPEScaledRotaryEmbedding "
    "(vllm/model_executor/layers/rotary_embedding/phi3_long_rope_scaled_rope.py) reads "
    "long_short_cos_sin_cache = cat(short cache, original_max_position_embeddings rows; long "
    "cache, max_position_embeddings rows) at row pos + original_max_position_embeddings for "
    "every position when max_model_len > original_max_position_embeddings, at row pos "
    "otherwise, which no single table is: ask without a profile for packing 'cos_sin' once with "
    "seq_len <= original_max_position_embeddings (short factors) and once past it (long) and "
    "concatenate the rows"
)
"""Why profile `vllm` refuses LongRoPE: vLLM 0.33's LongRoPE class reads a buffer of two tables
(tests/api/test_consumers.py::test_vllm_profile_refuses_longrope)."""


@dataclass(frozen=True)
class ConsumerProfile:
    """One consumer of RoPE tables.

    `name` is the spec's `profile` value; `label` names the consumer for people (the explorer's
    option); `consumer` is the entry point that reads the table and `source` the file or page that
    fixes its layout. `interleaved`, `width`, `packing` and `dtype` are the defaults the profile
    fills in; `dtypes` (with `dtype_rule`, the consumer's rule and its source) the only dtypes it
    reads, None for any; `checks` run in order on the resolved layout; `refuses` maps a rope_type
    the consumer cannot take from one table to its reason.
    """

    name: str
    label: str
    consumer: str
    source: str
    interleaved: bool
    width: Width
    packing: Packing
    dtype: FloatDtype = "float32"
    dtypes: frozenset[str] | None = None
    dtype_rule: str = ""
    checks: tuple[Check, ...] = ()
    refuses: Mapping[str, str] = field(default_factory=dict)

    def issues(self, rotary_dim: int, layout: Layout, rope_type: str) -> list[Issue]:
        """What this consumer cannot read in a table of rotary dim `rotary_dim`, `layout` and
        `rope_type`."""
        found = [check(self, rotary_dim, layout) for check in self.checks]
        if rope_type in self.refuses:
            found.append(Issue(("profile",), self.refuses[rope_type], self.name))
        return [issue for issue in found if issue is not None]

    def describe(self) -> dict[str, str]:
        """`{"name", "label", "consumer", "source"}`: the profile as `GET /v1/kinds` lists it."""
        return {
            "name": self.name,
            "label": self.label,
            "consumer": self.consumer,
            "source": self.source,
        }


def half_width_cos_sin(profile: ConsumerProfile, rotary_dim: int, layout: Layout) -> Issue | None:
    """vLLM and FlashInfer read `cos_sin_cache` as cat(cos_half, sin_half), (P, d)."""
    if layout.packing != "cos_sin" or layout.width == "half":
        return None
    return Issue(
        ("width",),
        f"profile {profile.name!r} reads cos_sin_cache as cat(cos_half, sin_half), (P, d): "
        "width must be 'half' (full width is torchtune's Qwen2/Phi-3 cache)",
        layout.width,
    )


def reads_dtypes(profile: ConsumerProfile, rotary_dim: int, layout: Layout) -> Issue | None:
    """A dtype the consumer does not read (`dtypes`), named at `dtype` with its rule."""
    if profile.dtypes is None or layout.dtype in profile.dtypes:
        return None
    return Issue(("dtype",), f"profile {profile.name!r}: {profile.dtype_rule}", layout.dtype)


def gqa_rotary_dim(profile: ConsumerProfile, rotary_dim: int, layout: Layout) -> Issue | None:
    """onnxruntime's GroupQueryAttention rotates in blocks: d/2 a multiple of 8."""
    if not (rotary_dim // 2) % 8:
        return None
    return Issue(
        ("profile",),
        f"ort_gqa (GroupQueryAttention do_rotary) needs rotary_dim/2 to be a multiple of 8, got "
        f"rotary dim {rotary_dim}",
        profile.name,
    )


_FLOAT32 = frozenset({"float32"})

PROFILES: dict[str, ConsumerProfile] = {
    p.name: p
    for p in (
        # transformers forward: full-width cat(c, c), cast to the activation dtype.
        ConsumerProfile(
            "hf",
            "transformers (default)",
            "the model's *RotaryEmbedding.forward -> apply_rotary_pos_emb",
            "transformers/models/llama/modeling_llama.py",
            interleaved=False,
            width="full",
            packing="separate",
        ),
        # ONNX RotaryEmbedding-23: (P, d/2) caches, same dtype as X, pairing is an attribute.
        ConsumerProfile(
            "onnx",
            "ONNX RotaryEmbedding",
            "ONNX RotaryEmbedding (opset 23) cos_cache, sin_cache",
            "https://onnx.ai/onnx/operators/onnx__RotaryEmbedding.html",
            interleaved=False,
            width="half",
            packing="separate",
        ),
        # onnxruntime GroupQueryAttention(do_rotary=1): (max_seq, d/2), d/2 a multiple of 8.
        ConsumerProfile(
            "ort_gqa",
            "onnxruntime GQA",
            "onnxruntime com.microsoft.GroupQueryAttention (do_rotary=1) cos_cache, sin_cache",
            "onnxruntime docs/ContribOperators.md#com.microsoft.GroupQueryAttention",
            interleaved=False,
            width="half",
            packing="separate",
            checks=(gqa_rotary_dim,),
        ),
        # vLLM cos_sin_cache: (P, d) = cat(cos_half, sin_half), model dtype.
        ConsumerProfile(
            "vllm",
            "vLLM",
            "vLLM RotaryEmbedding.cos_sin_cache",
            "vllm/model_executor/layers/rotary_embedding/base.py",
            interleaved=False,
            width="half",
            packing="cos_sin",
            checks=(half_width_cos_sin,),
            refuses={"longrope": VLLM_LONGROPE},
        ),
        # FlashInfer: the same packing, fp32.
        ConsumerProfile(
            "flashinfer",
            "FlashInfer",
            "flashinfer.rope.apply_rope_with_cos_sin_cache (cos_sin_cache)",
            "flashinfer/rope.py",
            interleaved=False,
            width="half",
            packing="cos_sin",
            dtypes=_FLOAT32,
            dtype_rule="FlashInfer's apply_rope_with_cos_sin_cache raises 'cos_sin_cache should "
            "be float32' (flashinfer/rope.py) for any other dtype",
            checks=(half_width_cos_sin, reads_dtypes),
        ),
        # TensorRT-LLM rotary_cos_sin: (P, d/2, 2) float2 (cos, sin), fp32.
        ConsumerProfile(
            "trtllm",
            "TensorRT-LLM",
            "TensorRT-LLM attention plugin rotary_cos_sin "
            "(RopeEmbeddingUtils.create_sinusoidal_positions_for_attention_plugin)",
            "tensorrt_llm/functional.py",
            interleaved=False,
            width="half",
            packing="pairs",
            dtypes=_FLOAT32,
            dtype_rule="TensorRT-LLM's attention plugin reads rotary_cos_sin as float2 (float32 "
            "cos, sin pairs; RopeEmbeddingUtils.create_sinusoidal_positions_for_attention_plugin, "
            "tensorrt_llm/functional.py)",
            checks=(reads_dtypes,),
        ),
        # flash-attn apply_rotary_emb: (S, d/2), dtype must equal x.
        ConsumerProfile(
            "flash_attn",
            "flash-attn",
            "flash_attn.layers.rotary.apply_rotary_emb (cos, sin)",
            "flash_attn/layers/rotary.py",
            interleaved=False,
            width="half",
            packing="separate",
        ),
        # torchtune RotaryPositionalEmbeddings cache: (P, d/2, 2), fp32, interleaved pairs.
        ConsumerProfile(
            "torchtune",
            "torchtune",
            "torchtune.modules.RotaryPositionalEmbeddings (its cache)",
            "torchtune/modules/position_embeddings.py",
            interleaved=True,
            width="half",
            packing="pairs",
            dtypes=_FLOAT32,
            dtype_rule="torchtune's RotaryPositionalEmbeddings builds its cache in float32 "
            "(theta.float()) and rotates in float32 (x.float()), "
            "torchtune/modules/position_embeddings.py",
            checks=(reads_dtypes,),
        ),
    )
}
"""Every consumer profile by name, in the order people see them (the default first)."""

DEFAULT_PROFILE = PROFILES["hf"]

CONSUMER_DTYPES: dict[str, tuple[frozenset[str], str]] = {
    p.name: (p.dtypes, p.dtype_rule) for p in PROFILES.values() if p.dtypes is not None
}
"""Profiles whose consumer reads one dtype only: (dtypes it reads, its rule with the source);
another `dtype` with that profile is refused, as `ort_gqa` refuses an odd rotary width."""

if TYPE_CHECKING:
    Profile: TypeAlias = str
else:
    # The spec's `profile` values, derived from the records (pydantic validates the Literal and
    # writes its `enum` into the JSON schema `GET /v1/kinds` serves).
    Profile = Literal[tuple(PROFILES)]
