"""ALiBi slopes and bias forms against transformers (BLOOM, Falcon, MPT), an independent float64
reference of each form (field guide section 2), and property tests."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.bloom.modeling_bloom import build_alibi_tensor as bloom_alibi
from transformers.models.falcon.modeling_falcon import build_alibi_tensor as falcon_alibi
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

from posenc.encodings import SpecError, canonical_json, compute, content_key, parse_spec
from posenc.encodings.alibi import AlibiSpec, alibi_slopes, reference_slopes

HEADS = [*range(1, 65), 71, 112]
SLOPE_RTOL = 1e-6  # transformers' fp32 torch.pow is up to 7 fp32 ulp off the float64 reference
BLOOM_SLOPE_ULPS = 7
"""The most fp32 ulps posenc's slopes (the float64 rule rounded once) are from BLOOM's fp32
`torch.pow` slopes over `HEADS`: the README's claim, asserted as such (56 of the 66 differ)."""
MPT_SLOPE_ULPS = 1
"""The same for MPT's `build_mpt_alibi_tensor` slopes, every `alibi_bias_max` tested."""


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """The most fp32 units in the last place between same-signed float32 tensors `a` and `b`."""
    assert a.dtype == b.dtype == torch.float32
    return int((a.view(torch.int32).long() - b.view(torch.int32).long()).abs().max())


def spec(**kw: Any) -> AlibiSpec:
    out = parse_spec({"kind": "alibi", **kw})
    assert isinstance(out, AlibiSpec)
    return out


def table(**kw: Any) -> dict[str, torch.Tensor]:
    return compute(spec(**kw)).tensors


def ofirpress_get_slopes(n: int) -> list[float]:
    """`get_slopes` as in ofirpress/attention_with_linear_biases (fairseq transformer.py)."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    c = 2 ** math.floor(math.log2(n))
    return power_of_2(c) + ofirpress_get_slopes(2 * c)[0::2][: n - c]


def naive_slopes(n: int) -> list[float]:
    return [2 ** (-8 * (h + 1) / n) for h in range(n)]


def reference_bias(
    slopes: torch.Tensor, form: str, q: int, k: int, offset: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(bias float64 (H, Q, K), future mask (Q, K)) straight from the field guide's formulas."""
    m = slopes.double()[:, None, None]
    i = torch.arange(q, dtype=torch.float64)[:, None] + offset
    j = torch.arange(k, dtype=torch.float64)[None, :]
    rel = {
        "causal": j - i,
        "symmetric": -(i - j).abs(),
        "bottom_right": -((i - offset) + k - q - j).abs(),
        "row_constant": j.expand(q, k),
        "mpt": (j - (k - 1)).expand(q, k),
    }[form]
    return m * rel, j > i


# --- slopes --------------------------------------------------------------------------------------


def test_twelve_heads_use_the_reference_rule_not_the_naive_formula() -> None:
    expected = [2.0**-e for e in (1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5)]
    slopes = table(num_heads=12)["slopes"]
    assert torch.equal(slopes, torch.tensor(expected, dtype=torch.float32))
    assert not torch.allclose(slopes, torch.tensor(naive_slopes(12)), rtol=1e-3)


@pytest.mark.parametrize("heads", [1, 2, 3, 5, 6, 7, 12, 20, 24, 40, 71, 112, 4096])
def test_slopes_are_the_float64_reference_rounded_once(heads: int) -> None:
    ours = alibi_slopes(spec(num_heads=heads))
    assert ours.dtype == torch.float32
    assert torch.equal(ours, torch.tensor(ofirpress_get_slopes(heads), dtype=torch.float64).float())


@pytest.mark.parametrize("heads", HEADS)
def test_slopes_match_bloom(heads: int) -> None:
    # BLOOM's alibi at key position 1 (all-ones mask) is the slope itself.
    bloom = bloom_alibi(torch.ones(1, 2, dtype=torch.long), heads, torch.float32)[:, 0, 1]
    assert ulps(alibi_slopes(spec(num_heads=heads)), bloom) <= BLOOM_SLOPE_ULPS


def test_bloom_slope_claim_is_exact() -> None:
    """The README's numbers, not a bound that could hide a change: over `HEADS`, 56 of the 66
    head counts' slopes differ from BLOOM's fp32 slopes, by at most `BLOOM_SLOPE_ULPS` ulp."""
    bloom = [
        bloom_alibi(torch.ones(1, 2, dtype=torch.long), h, torch.float32)[:, 0, 1] for h in HEADS
    ]
    distances = [
        ulps(alibi_slopes(spec(num_heads=h)), b) for h, b in zip(HEADS, bloom, strict=True)
    ]
    assert (sum(d > 0 for d in distances), len(HEADS)) == (56, 66)
    assert max(distances) == BLOOM_SLOPE_ULPS


@pytest.mark.parametrize("heads", HEADS)
def test_falcon_rounds_our_slopes_to_bfloat16(heads: int) -> None:
    # transformers' Falcon multiplies `slopes.bfloat16()` by the positions: its alibi carries
    # bf16 slopes even for fp32 models. Those are exactly ours rounded to bf16.
    falcon = falcon_alibi(torch.ones(1, 2, dtype=torch.long), heads, torch.float32)[:, 0, 1]
    assert torch.equal(alibi_slopes(spec(num_heads=heads)).bfloat16().float(), falcon)


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("bias_max", [8, 16, 4.5])
def test_slopes_match_mpt(heads: int, bias_max: float) -> None:
    mpt = -build_mpt_alibi_tensor(heads, 2, alibi_bias_max=bias_max)[:, 0, 0]
    ours = alibi_slopes(spec(num_heads=heads, alibi_bias_max=bias_max))
    assert ulps(ours, mpt) <= MPT_SLOPE_ULPS


def test_slope_scale_and_interpolation_factor_apply_in_float64() -> None:
    scale, factor = 1 / math.sqrt(128), 4.0
    ours = table(num_heads=20, slope_scale=scale, interpolation_factor=factor)["slopes"]
    expected = [m * scale / factor for m in reference_slopes(20)]
    assert torch.equal(ours, torch.tensor(expected, dtype=torch.float64).float())


@pytest.mark.parametrize(("heads", "tp"), [(12, 2), (12, 3), (12, 4), (40, 8), (71, 71), (112, 7)])
def test_tensor_parallel_slices_concatenate_to_the_global_slopes(heads: int, tp: int) -> None:
    whole = table(num_heads=heads, bias="causal", key_length=5)
    parts = [
        table(num_heads=heads, tp_size=tp, tp_rank=r, bias="causal", key_length=5)
        for r in range(tp)
    ]
    assert torch.equal(torch.cat([p["slopes"] for p in parts]), whole["slopes"])
    assert torch.equal(torch.cat([p["bias"] for p in parts]), whole["bias"])


# --- bias forms ----------------------------------------------------------------------------------


@pytest.mark.parametrize("heads", [1, 12, 20, 71])
def test_row_constant_matches_bloom_with_mask_derived_positions(heads: int) -> None:
    length, pad = 9, 3
    ones = bloom_alibi(torch.ones(1, length, dtype=torch.long), heads, torch.float32)
    ours = table(num_heads=heads, bias="row_constant", key_length=length, masked_value="none")
    torch.testing.assert_close(
        ours["bias"], ones.expand(heads, length, length), rtol=SLOPE_RTOL, atol=0
    )
    # Left padding: BLOOM's key positions are cumsum(mask) - 1 over the real tokens.
    mask = torch.tensor([[0] * pad + [1] * (length - pad)])
    padded = bloom_alibi(mask, heads, torch.float32)[:, 0, pad:]
    real = table(num_heads=heads, bias="row_constant", key_length=length - pad, masked_value="none")
    torch.testing.assert_close(real["bias"][:, 0], padded, rtol=SLOPE_RTOL, atol=0)


def test_row_constant_decode_step_matches_bloom() -> None:
    heads, past = 12, 10
    bloom = bloom_alibi(torch.ones(1, past + 1, dtype=torch.long), heads, torch.float16)
    ours = table(
        num_heads=heads, bias="row_constant", query_length=1, query_offset=past, dtype="float16"
    )["bias"]
    assert ours.shape == (heads, 1, past + 1)
    torch.testing.assert_close(ours, bloom, rtol=2**-10, atol=0)


@pytest.mark.parametrize("heads", [3, 8, 24, 40])
@pytest.mark.parametrize("bias_max", [8, 16])
def test_mpt_form_matches_build_mpt_alibi_tensor(heads: int, bias_max: float) -> None:
    length = 11
    mpt = build_mpt_alibi_tensor(heads, length, alibi_bias_max=bias_max)
    ours = table(
        num_heads=heads,
        alibi_bias_max=bias_max,
        bias="mpt",
        key_length=length,
        masked_value="none",
    )["bias"]
    torch.testing.assert_close(ours, mpt.expand(heads, length, length), rtol=SLOPE_RTOL, atol=0)


FORMS = ["causal", "symmetric", "bottom_right", "row_constant", "mpt"]
SHAPES = [(6, 6, 0), (1, 9, 8), (3, 9, 6), (4, 10, 2), (7, 3, 0), (3, 9, 0)]


@pytest.mark.parametrize(
    ("form", "q", "k", "offset"),
    [(f, *s) for f in FORMS for s in SHAPES if not (f == "bottom_right" and s[2])],
)
@pytest.mark.parametrize("heads", [5, 12])
def test_forms_match_the_field_guide_reference(
    form: str, q: int, k: int, offset: int, heads: int
) -> None:
    """The bias layout (distances, offsets, masks) against the field guide's forms, transcribed
    in `reference_bias`; self-consistency for the slopes, which are posenc's own (fed in from
    `out["slopes"]`; the slopes themselves are checked against BLOOM, MPT and Falcon above)."""
    kw: dict[str, Any] = (
        {"masked_value": "-inf"} if form in ("causal", "row_constant", "mpt") else {}
    )
    out = table(num_heads=heads, bias=form, query_length=q, key_length=k, query_offset=offset, **kw)
    ref, future = reference_bias(out["slopes"], form, q, k, offset)
    if "masked_value" in kw:
        ref = ref.masked_fill(future, float("-inf"))
    assert out["bias"].dtype == torch.float32
    assert torch.equal(out["bias"], ref.float())


def test_decode_row_equals_the_last_prefill_row() -> None:
    # vllm#945: the decode step (query at position past) must see distances 0..past exactly.
    past = 17
    prefill = table(num_heads=8, bias="causal", key_length=past + 1)["bias"]
    decode = table(num_heads=8, bias="causal", query_length=1, query_offset=past)["bias"]
    assert torch.equal(decode[:, 0], prefill[:, -1])
    assert torch.equal(decode[:, 0, -1], torch.zeros(8))


def test_bottom_right_is_symmetric_shifted_by_the_length_difference() -> None:
    q, k = 3, 10
    br = table(num_heads=6, bias="bottom_right", query_length=q, key_length=k)["bias"]
    sym = table(num_heads=6, bias="symmetric", query_length=q, key_length=k, query_offset=k - q)
    assert torch.equal(br, sym["bias"])


def test_decoder_forms_agree_after_softmax_in_float32() -> None:
    probs = [
        torch.softmax(table(num_heads=12, bias=form, key_length=33)["bias"], dim=-1)
        for form in ("causal", "row_constant", "mpt")
    ]
    torch.testing.assert_close(probs[0], probs[1], rtol=0, atol=1e-6)
    torch.testing.assert_close(probs[0], probs[2], rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_masked_values(dtype: str) -> None:
    kw = {"num_heads": 4, "bias": "causal", "key_length": 5, "dtype": dtype}
    tdt = getattr(torch, dtype)
    future = torch.ones(5, 5, dtype=torch.bool).triu(1).expand(4, 5, 5)
    default = table(**kw)["bias"]
    assert default.dtype == tdt
    assert (default[future] == torch.finfo(tdt).min).all()
    assert (table(**kw, masked_value="-inf")["bias"][future] == float("-inf")).all()
    raw = table(**kw, masked_value="none")["bias"]
    assert (raw[future] > 0).all()
    assert torch.equal(raw[~future], default[~future])


def test_low_precision_bias_is_the_fp32_bias_cast_last() -> None:
    kw = {"num_heads": 12, "bias": "symmetric", "key_length": 300}
    fp32 = table(**kw)["bias"]
    for dtype in ("float16", "bfloat16"):
        assert torch.equal(table(**kw, dtype=dtype)["bias"], fp32.to(getattr(torch, dtype)))


def test_slopes_stay_float32_with_a_low_precision_bias() -> None:
    out = table(num_heads=8, bias="symmetric", key_length=4, dtype="bfloat16")
    assert out["slopes"].dtype == torch.float32
    assert out["bias"].dtype == torch.bfloat16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("form", FORMS)
def test_cuda_tables_equal_cpu_tables(form: str) -> None:
    # float64 slopes rounded once and one IEEE fp32 multiply: no device-dependent op.
    s = spec(num_heads=40, bias=form, query_length=33, key_length=300, dtype="bfloat16")
    cpu, gpu = compute(s, "cpu").tensors, compute(s, "cuda").tensors
    for name in cpu:
        assert torch.equal(gpu[name].cpu(), cpu[name])


# --- spec: canonical form, outputs, validation ---------------------------------------------------


def test_canonical_fills_lengths_and_mask_value() -> None:
    a = spec(num_heads=8, bias="causal", query_length=1, query_offset=4)
    b = spec(num_heads=8, bias="causal", key_length=5, query_offset=4, masked_value="min")
    assert canonical_json(a) == canonical_json(b)
    assert content_key(a) == content_key(b)
    c = a.canonical()
    assert (c.query_length, c.key_length, c.masked_value) == (1, 5, "min")
    assert spec(num_heads=8, bias="symmetric", key_length=5).canonical().masked_value is None
    assert content_key(spec(num_heads=8)) != content_key(spec(num_heads=8, alibi_bias_max=16))


@pytest.mark.parametrize(
    "kw",
    [
        {"num_heads": 7},
        {"num_heads": 12, "tp_size": 4, "tp_rank": 3},
        {"num_heads": 12, "bias": "causal", "query_length": 3, "key_length": 8, "query_offset": 5},
        {"num_heads": 5, "bias": "bottom_right", "query_length": 2, "key_length": 6},
        {"num_heads": 4, "bias": "mpt", "key_length": 7, "dtype": "bfloat16"},
    ],
)
def test_outputs_predict_the_computed_tensors(kw: dict[str, Any]) -> None:
    s = spec(**kw)
    result = compute(s)
    info = s.outputs()
    assert set(info) == set(result.tensors)
    for name, t in result.tensors.items():
        assert info[name].shape == tuple(t.shape)
        assert info[name].dtype == str(t.dtype).removeprefix("torch.")
    assert s.output_bytes() == result.nbytes


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"num_heads": 0}, "num_heads"),
        ({"num_heads": 4097}, "num_heads"),
        ({"num_heads": 8, "alibi_bias_max": 0}, "alibi_bias_max"),
        ({"num_heads": 8, "slope_scale": -1.0}, "slope_scale"),
        ({"num_heads": 8, "slope_scale": float("nan")}, "slope_scale"),
        ({"num_heads": 8, "interpolation_factor": 0.5}, "interpolation_factor"),
        ({"num_heads": 12, "tp_size": 5}, "tp_size"),
        ({"num_heads": 12, "tp_size": 4, "tp_rank": 4}, "tp_rank"),
        ({"num_heads": 8, "bias": "sideways", "key_length": 4}, "bias"),
        ({"num_heads": 8, "bias": "causal"}, "key_length"),
        ({"num_heads": 8, "bias": "causal", "key_length": 4, "query_offset": 4}, "query_length"),
        ({"num_heads": 8, "bias": "causal", "key_length": 0}, "key_length"),
        (
            {"num_heads": 8, "bias": "causal", "query_length": 1, "query_offset": 1 << 24},
            "query_offset",
        ),
        (
            {"num_heads": 8, "bias": "bottom_right", "key_length": 4, "query_offset": 1},
            "query_offset",
        ),
        (
            {"num_heads": 8, "bias": "symmetric", "key_length": 4, "masked_value": "min"},
            "masked_value",
        ),
        (
            {"num_heads": 8, "bias": "causal", "key_length": 4, "masked_value": "zero"},
            "masked_value",
        ),
        ({"num_heads": 8, "key_length": 4}, "key_length"),
        ({"num_heads": 8, "query_offset": 3}, "query_offset"),
        ({"num_heads": 8, "dtype": "float16"}, "dtype"),
        ({"num_heads": 8, "bias": "causal", "key_length": 4, "dtype": "float64"}, "dtype"),
        ({"num_heads": 8, "bias": "symmetric", "key_length": 200_000, "dtype": "float16"}, "dtype"),
        ({"num_heads": 8, "rope_theta": 1.0}, "rope_theta"),
    ],
)
def test_bad_specs_name_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"kind": "alibi", **kw})
    assert field in [p.field for p in err.value.problems], err.value


def test_float16_overflow_check_uses_the_largest_unmasked_distance() -> None:
    # m0 = 0.5 for 8 heads: 131008 * 0.5 = 65504 is the largest finite fp16 value.
    ok = table(num_heads=8, bias="causal", key_length=131009, query_length=1, dtype="float16")
    assert torch.isfinite(ok["bias"][..., :131009]).all()
    with pytest.raises(SpecError):
        spec(num_heads=8, bias="mpt", key_length=131010, query_length=1, dtype="float16")


# --- properties ----------------------------------------------------------------------------------


@given(
    heads=st.integers(1, 4096),
    bias_max=st.floats(0.5, 32.0),
    scale=st.floats(1e-3, 4.0),
    factor=st.floats(1.0, 64.0),
)
@settings(max_examples=60, deadline=None)
def test_slopes_positive_and_decreasing_within_each_power_of_two_group(
    heads: int, bias_max: float, scale: float, factor: float
) -> None:
    s = table(
        num_heads=heads, alibi_bias_max=bias_max, slope_scale=scale, interpolation_factor=factor
    )
    slopes = s["slopes"]
    c = 1 << (heads.bit_length() - 1)
    assert slopes.shape == (heads,)
    assert (slopes > 0).all()
    assert (slopes <= scale / factor * 2 ** (-bias_max / (2 * c)) * (1 + 1e-6)).all()
    for group in (slopes[:c], slopes[c:]):
        assert (group[1:] <= group[:-1]).all()


@given(
    heads=st.integers(1, 40),
    form=st.sampled_from(FORMS),
    q=st.integers(1, 24),
    k=st.integers(1, 40),
    offset=st.integers(0, 30),
    dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
    masked_value=st.sampled_from(["-inf", "min", "none"]),
)
@settings(max_examples=150, deadline=None)
def test_bias_is_bounded_by_slope_times_distance(
    heads: int, form: str, q: int, k: int, offset: int, dtype: str, masked_value: str
) -> None:
    decoder = form in ("causal", "row_constant", "mpt")
    kw: dict[str, Any] = {"masked_value": masked_value} if decoder else {}
    offset = 0 if form == "bottom_right" else offset
    out = compute(
        spec(
            num_heads=heads,
            bias=form,
            query_length=q,
            key_length=k,
            query_offset=offset,
            dtype=dtype,
            **kw,
        )
    )
    bias, slopes = out.tensors["bias"], out.tensors["slopes"]
    ref, future = reference_bias(slopes, form, q, k, offset)
    live = (
        ~future.expand_as(bias)
        if decoder and masked_value != "none"
        else torch.ones_like(bias, dtype=torch.bool)
    )
    assert torch.isfinite(bias[live]).all()
    bound = out.meta["max_abs_bias"]
    tol = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}[dtype]
    assert bias[live].double().abs().max() <= bound * (1 + tol)
    torch.testing.assert_close(bias[live].double(), ref[live], rtol=tol, atol=0)
    if not live.all():
        fill = float("-inf") if masked_value == "-inf" else torch.finfo(getattr(torch, dtype)).min
        assert (bias[~live] == fill).all()


@pytest.mark.parametrize("form", ["row_constant", "mpt"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize(("heads", "k"), [(1, 1), (12, 777), (32, 4096), (112, 4096)])
def test_single_rows_are_the_fp32_products_bit_for_bit(
    form: str, dtype: str, heads: int, k: int
) -> None:
    # (H, 1, K) rows: float32 ones are multiplied by numpy into the output, others by torch.mul;
    # both must give torch's fp32 product of the served slopes and the key distances, rounded once
    out = table(
        num_heads=heads, bias=form, query_length=1, key_length=k, query_offset=k - 1, dtype=dtype
    )
    first = 0 if form == "row_constant" else 1 - k
    dist = torch.arange(first, first + k, dtype=torch.float32)
    expected = (out["slopes"][:, None] * dist[None, :]).to(getattr(torch, dtype))
    assert torch.equal(out["bias"], expected[:, None, :])


@pytest.mark.parametrize("heads", [1, 8, 12, 32, 71])
def test_bfloat16_slope_rounding_equals_falcon_build_alibi_tensor(heads: int) -> None:
    """`slope_rounding="bfloat16"`: the slopes transformers Falcon multiplies the key positions by
    (`build_alibi_tensor`, key position 1 gives the slope itself), bit for bit."""
    spec = AlibiSpec(num_heads=heads, slope_rounding="bfloat16")
    falcon = falcon_alibi(torch.ones(1, 2, dtype=torch.long), heads, torch.float32)
    assert torch.equal(compute(spec).tensors["slopes"], falcon[:, 0, 1])
