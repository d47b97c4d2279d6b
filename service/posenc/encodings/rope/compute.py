"""RoPE table computation: inverse frequencies from the variant, angles, cos/sin, layout, cast.

Reference precision is transformers' fp32 algorithm (`LlamaRotaryEmbedding.forward`):
`freqs = position_ids[..., None].float() * inv_freq`, `cos = freqs.cos() * attention_scaling`,
cast last; cos/sin are evaluated once per frequency pair and laid out afterwards (the full-width
`cat(c, c)` repeats identical values). When the output dtype is the compute dtype (the float32
reference tables), `tables` writes cos/sin straight into the output tensors and copies the
duplicate half, with no intermediate tables: the same ops on the same operands, so the same bits,
with a third of the memory traffic of cat-then-cast (fresh pages dominate large tables). Exact
precision runs the same algorithm in float64 and
rounds once to the output dtype (for bf16/fp16 through a round-to-odd fp32 step, since torch
converts float64 to bf16/fp16 through a round-to-nearest fp32, rounding twice).
"""

from __future__ import annotations

from typing import Any

import torch

from posenc.encodings import fused
from posenc.encodings.base import DTYPES, register_family
from posenc.encodings.memory import empty, empty_like, to_device
from posenc.encodings.rope.spec import RopeSpec
from posenc.encodings.rope.variants import VARIANTS, RopeInputs
from posenc.encodings.rounding import cast


def rope_inv_freq(
    spec: RopeSpec, device: torch.device
) -> tuple[torch.Tensor, float, dict[str, Any]]:
    """(inv_freq (d/2,), attention_scaling, facts) for a canonical spec, in its compute dtype, on
    `device`.

    The frequencies are always computed on the CPU, as transformers computes them when it builds
    a rotary module, and then moved: CUDA's `pow` and `exp` differ from the CPU's by an ulp or two
    on some elements, and an angle is position x frequency, so such an ulp grows with the position
    (4.5e-4 on cos at 131072 positions on an H100, docs/gpu.md). From the same frequencies the
    device's products are bit-identical and its cos/sin within an ulp.
    """
    compute_dtype = torch.float64 if spec.precision == "exact" else torch.float32
    inputs = RopeInputs(
        dim=spec.resolved_rotary_dim(),
        head_dim=spec.head_dim,
        base=spec.rope_theta,
        seq_len=spec.seq_len,
        dtype=compute_dtype,
        device=torch.device("cpu"),
    )
    variant = VARIANTS[spec.rope_scaling.rope_type]
    inv, scaling, facts = variant.inv_freq(spec.rope_scaling, inputs)
    return to_device(inv, device), scaling, facts


def half_cos_sin(
    spec: RopeSpec, inv: torch.Tensor, scaling: float, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-width cos/sin (N, d/2) for int64 `positions` (N,), in the compute dtype, uncast;
    with `trig: "polar"` the parts of `torch.polar(1, angles) * scaling` (transformers'
    complex freqs_cis: a complex times a real scale multiplies each part by it)."""
    angles = positions.to(inv.dtype)[:, None] * inv[None, :]
    if spec.trig == "polar":
        unit = torch.polar(torch.ones_like(angles), angles)
        return unit.real * scaling, unit.imag * scaling
    return torch.cos(angles) * scaling, torch.sin(angles) * scaling


def layout(spec: RopeSpec, cos: torch.Tensor, sin: torch.Tensor) -> dict[str, torch.Tensor]:
    """Arrange half-width (N, d/2) cos/sin per width/packing/full-width arrangement
    (`repeats_interleaved`) and cast to the spec dtype: (N, d) full width, (N, d/2) half,
    `cos_sin` (N, d) (N, 2d at full width), `pairs` (N, d/2, 2) (N, d, 2 at full width)."""
    dtype = DTYPES[str(spec.dtype)]
    if spec.width == "full":
        if spec.repeats_interleaved():
            cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        else:
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    if spec.packing == "cos_sin":
        return {"cos_sin": cast(torch.cat((cos, sin), dim=-1), dtype)}
    if spec.packing == "pairs":
        return {"pairs": cast(torch.stack((cos, sin), dim=-1), dtype)}
    return {"cos": cast(cos, dtype), "sin": cast(sin, dtype)}


def tables(
    spec: RopeSpec, inv: torch.Tensor, scaling: float, positions: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The laid-out cos/sin tensors for int64 `positions` (N,): `layout(spec, *half_cos_sin(...))`
    bit for bit, computed without intermediates when no cast is needed.

    `cos(angles)` is written into its place in the output (a column block, every other column or
    the pair axis), multiplied by `scaling` in place (the same fp32 multiply as `cos * scaling`;
    skipped when it is 1, where it is exact), then copied to the duplicate columns of full-width
    tables. Other dtypes and exact precision go through `half_cos_sin` and `layout` (one rounding).
    """
    dtype = DTYPES[str(spec.dtype)]
    if (
        dtype != inv.dtype
        or spec.trig is not None
        or (spec.packing != "separate" and spec.width == "full")
    ):
        return layout(spec, *half_cos_sin(spec, inv, scaling, positions))
    angles = positions.to(inv.dtype)[:, None] * inv[None, :]
    n, half = angles.shape
    dev = angles.device
    outputs: dict[str, torch.Tensor]
    if spec.packing == "cos_sin":
        packed = empty((n, 2 * half), dtype, dev)
        outputs, places = {"cos_sin": packed}, (packed[:, :half], packed[:, half:])
        copies: tuple[torch.Tensor, ...] = ()
    elif spec.packing == "pairs":
        pairs = empty((n, half, 2), dtype, dev)
        outputs, places, copies = {"pairs": pairs}, (pairs[..., 0], pairs[..., 1]), ()
    elif spec.width == "half":
        cos, sin = empty_like(angles), empty_like(angles)
        outputs, places, copies = {"cos": cos, "sin": sin}, (cos, sin), ()
    else:
        cos = empty((n, 2 * half), dtype, dev)
        sin = empty_like(cos)
        first, second = (
            (slice(0, None, 2), slice(1, None, 2))
            if spec.repeats_interleaved()
            else (slice(0, half), slice(half, None))
        )
        outputs = {"cos": cos, "sin": sin}
        places = (cos[:, first], sin[:, first])
        copies = (cos[:, second], sin[:, second])
    for fn, place in zip((torch.cos, torch.sin), places, strict=True):
        fn(angles, out=place)
        if scaling != 1.0:
            place.mul_(scaling)
    for place, copy in zip(places, copies, strict=False):
        copy.copy_(place)
    return outputs


def fused_tables(
    spec: RopeSpec, inv: torch.Tensor, scaling: float
) -> dict[str, torch.Tensor] | None:
    """`tables(spec, inv, scaling, arange(max_positions))` from one fused kernel launch
    (`posenc.encodings.fused`): bit for bit the same tensors, or None where the fused path does not
    apply (not CUDA, no triton, disabled, polar trig, exact precision with `fused.FLOAT64`
    off), for `tables` to run."""
    if spec.trig is not None or inv.dtype not in fused.COMPUTE_DTYPES:
        return None
    if spec.precision == "exact" and not fused.FLOAT64:
        return None
    if not fused.usable(inv.device):
        return None
    plan = rope_plan_for(spec, inv.numel())
    if plan is None:
        return None
    return fused.run(plan, inv, out_scale=scaling)


def rope_plan_for(spec: RopeSpec, half: int) -> fused.TrigPlan | None:
    """The fused kernel's column plan for `spec`'s table of `half` frequencies (None: it does
    not map)."""
    return fused.rope_plan(
        half=half,
        rows=spec.max_positions,
        width=str(spec.width),
        packing=str(spec.packing),
        repeats_interleaved=spec.repeats_interleaved(),
        dtype=str(spec.dtype),
    )


@register_family("rope", RopeSpec, "RoPE cos/sin caches for every transformers scaling variant")
def compute_rope(
    spec: RopeSpec, device: torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """cos/sin (P, w) or packed caches plus inv_freq (d/2,); facts: attention scaling and more."""
    inv, scaling, facts = rope_inv_freq(spec, device)
    tensors = fused_tables(spec, inv, scaling)
    if tensors is None:
        positions = torch.arange(spec.max_positions, dtype=torch.int64, device=device)
        tensors = tables(spec, inv, scaling, positions)
    tensors["inv_freq"] = inv
    meta = {
        "attention_scaling": scaling,
        "rotary_dim": spec.resolved_rotary_dim(),
        **facts,
    }
    return tensors, meta
