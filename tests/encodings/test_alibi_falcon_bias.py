"""`bias_rounding="bfloat16"`: the ALiBi bias transformers' Falcon adds to its attention scores
(issue 31), bit for bit against `modeling_falcon.build_alibi_tensor` and against the mask
`FalconModel.forward` hands its attention layers, at 32 and 2048 positions."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from transformers import FalconConfig, FalconModel
from transformers.models.falcon.modeling_falcon import build_alibi_tensor

from posenc.encodings import SpecError, compute, parse_spec
from posenc.encodings.alibi import AlibiSpec


def falcon_spec(heads: int, head_dim: int, **kw: Any) -> AlibiSpec:
    out = parse_spec(
        {
            "kind": "alibi",
            "num_heads": heads,
            "slope_scale": 1.0 / math.sqrt(head_dim),
            "slope_rounding": "bfloat16",
            "bias_rounding": "bfloat16",
            **kw,
        }
    )
    assert isinstance(out, AlibiSpec)
    return out


def falcons_row(heads: int, head_dim: int, keys: int, dtype: torch.dtype) -> torch.Tensor:
    """(H, K): FalconModel.forward's `alibi / math.sqrt(hidden_size // num_heads)` for one
    sequence without padding."""
    mask = torch.ones(1, keys, dtype=torch.long)
    return build_alibi_tensor(mask, heads, dtype)[:, 0, :] / math.sqrt(head_dim)


@pytest.mark.parametrize("keys", [32, 2048])
@pytest.mark.parametrize("heads", [1, 12, 32, 64, 71])
@pytest.mark.parametrize("head_dim", [64, 16, 96, 128])
def test_row_constant_bias_is_build_alibi_tensor_over_sqrt_head_dim(
    keys: int, heads: int, head_dim: int
) -> None:
    spec = falcon_spec(
        heads, head_dim, bias="row_constant", query_length=1, key_length=keys, masked_value="none"
    )
    ours = compute(spec).tensors["bias"][:, 0, :]
    assert torch.equal(ours, falcons_row(heads, head_dim, keys, torch.float32))


def test_without_bias_rounding_the_bias_is_off_by_what_issue_31_measured() -> None:
    # The float32 product of the served slopes and the key positions is not Falcon's: the
    # difference bias_rounding removes (0.97 at key 2047 for 64 heads of head_dim 64).
    unrounded = falcon_spec(
        64, 64, bias="row_constant", query_length=1, key_length=2048, masked_value="none"
    )
    unrounded = unrounded.model_copy(update={"bias_rounding": None})
    ours = compute(unrounded).tensors["bias"][:, 0, :]
    gap = (ours - falcons_row(64, 64, 2048, torch.float32)).abs().max().item()
    assert gap > 0.1, gap


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("heads", [12, 32, 71])
def test_half_precision_bias_is_falcons_for_head_dim_64(dtype: str, heads: int) -> None:
    # A bfloat16/float16 Falcon divides the bfloat16 product by 8 in its own dtype: sqrt(64) is a
    # power of two, so the float32 bias cast once gives the same bits.
    spec = falcon_spec(
        heads,
        64,
        bias="row_constant",
        query_length=1,
        key_length=2048,
        dtype=dtype,
        masked_value="none",
    )
    ours = compute(spec).tensors["bias"][:, 0, :]
    assert torch.equal(ours, falcons_row(heads, 64, 2048, getattr(torch, dtype)))


def _falcon_model(heads: int, head_dim: int, attention: str) -> FalconModel:
    """A one-layer ALiBi FalconModel (the 7B/40B-style architecture flags off) in eval mode,
    with `attention` ("sdpa" or "eager") as its attention implementation."""
    config = FalconConfig(
        vocab_size=32,
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        num_hidden_layers=1,
        alibi=True,
        new_decoder_architecture=False,
        multi_query=False,
        parallel_attn=True,
        bias=False,
    )
    config._attn_implementation = attention
    return FalconModel(config).eval()


@pytest.mark.parametrize("keys", [32, 2048])
def test_falcon_model_adds_exactly_this_masked_bias(keys: int) -> None:
    """The float32 mask FalconModel.forward passes to its (sdpa) attention, alibi included and
    future keys at finfo(float32).min, equals the served masked row_constant table."""
    heads, head_dim = 4, 16
    model = _falcon_model(heads, head_dim, "sdpa")
    seen: dict[str, torch.Tensor] = {}

    def grab(_: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        seen["mask"] = kwargs["attention_mask"].clone()

    model.h[0].self_attention.register_forward_pre_hook(grab, with_kwargs=True)
    with torch.no_grad():
        model(torch.zeros(1, keys, dtype=torch.long))
    ours = compute(falcon_spec(heads, head_dim, bias="row_constant", key_length=keys))
    assert torch.equal(seen["mask"][0], ours.tensors["bias"])


def test_every_head_dim_divides_as_falcon_does() -> None:
    # The divisor is float32(1 / slope_scale) with slope_scale = 1/sqrt(head_dim) in float64:
    # equal to Falcon's float32(math.sqrt(head_dim)) for every head_dim up to 1024.
    for head_dim in range(1, 1025):
        spec = falcon_spec(
            12, head_dim, bias="row_constant", query_length=1, key_length=64, masked_value="none"
        )
        ours = compute(spec).tensors["bias"][:, 0, :]
        assert torch.equal(ours, falcons_row(12, head_dim, 64, torch.float32)), head_dim


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"slope_rounding": None}, "slope_rounding"),
        ({"alibi_bias_max": 16}, "alibi_bias_max 8"),
        ({"interpolation_factor": 2.0}, "interpolation_factor"),
        ({"bias": "causal", "key_length": 8}, "row_constant"),
    ],
)
def test_bias_rounding_is_only_falcons(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        falcon_spec(12, 64, **fields)
    (problem,) = err.value.problems
    assert problem.field == "bias_rounding"
    assert message in problem.message


def test_tensor_parallel_slices_of_the_falcon_bias() -> None:
    whole = compute(falcon_spec(12, 64, bias="row_constant", key_length=40)).tensors["bias"]
    parts = [
        compute(
            falcon_spec(12, 64, bias="row_constant", key_length=40, tp_size=3, tp_rank=r)
        ).tensors["bias"]
        for r in range(3)
    ]
    assert torch.equal(torch.cat(parts), whole)


def test_eager_falcon_adds_the_bias_twice_as_the_resolve_notes_say() -> None:
    """The `eager_attention` note of a resolved Falcon config: transformers' eager
    FalconAttention adds the alibi on top of the mask that already holds it, so its output is the
    sdpa model's with the (unmasked) bias doubled."""
    heads, head_dim, length = 4, 16, 6
    outputs = {}
    for impl, double in (("eager", False), ("sdpa", True), ("sdpa", False)):
        torch.manual_seed(0)
        model = _falcon_model(heads, head_dim, impl)
        if double:

            def twice(_: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> Any:
                mask = kwargs["attention_mask"]
                kept = mask > torch.finfo(mask.dtype).min
                kwargs["attention_mask"] = torch.where(kept, mask * 2, mask)
                return args, kwargs

            model.h[0].self_attention.register_forward_pre_hook(twice, with_kwargs=True)
        with torch.no_grad():
            outputs[impl, double] = model(torch.arange(length)[None]).last_hidden_state
    torch.testing.assert_close(outputs["eager", False], outputs["sdpa", True])
    assert not torch.allclose(outputs["eager", False], outputs["sdpa", False], atol=1e-3)
