"""T5 relative position buckets and bias against transformers' `T5Attention`
(`_relative_position_bucket` bit for bit, `compute_bias` with real weights), plus properties."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import T5Config
from transformers.models.t5.modeling_t5 import T5Attention

from posenc.encodings import SpecError, canonical_json, compute, content_key, parse_spec
from posenc.encodings.t5_bias import T5BiasSpec

reference_bucket = T5Attention._relative_position_bucket


def spec(**kw: Any) -> T5BiasSpec:
    out = parse_spec({"kind": "t5_bias", **kw})
    assert isinstance(out, T5BiasSpec)
    return out


def reference_buckets(
    q: int, k: int, offset: int, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """transformers' buckets for queries at offset..offset+q-1 (`compute_bias` with
    `past_seen_tokens=offset`)."""
    rel = torch.arange(k)[None, :] - (torch.arange(q)[:, None] + offset)
    return reference_bucket(
        rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )


def attention(bidirectional: bool, weights: torch.Tensor, max_distance: int) -> T5Attention:
    num_buckets, heads = weights.shape
    config = T5Config(
        d_model=8,
        d_kv=4,
        num_heads=heads,
        relative_attention_num_buckets=num_buckets,
        relative_attention_max_distance=max_distance,
        is_decoder=not bidirectional,
    )
    module = T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
    with torch.no_grad():
        module.relative_attention_bias.weight.copy_(weights)
    return module


# --- buckets -------------------------------------------------------------------------------------

GRID = [
    (32, 128, True),
    (32, 128, False),
    (64, 256, True),
    (16, 32, False),
    (33, 100, True),
    (18, 128, True),  # float64 math would move n = 8, 16, 64 down one bucket
    (9, 128, False),  # same at n = 8
    (39, 16, True),  # and at n = 12
    (128, 1000, False),
]


@pytest.mark.parametrize(("num_buckets", "max_distance", "bidirectional"), GRID)
@pytest.mark.parametrize(
    ("q", "k", "offset"), [(40, 40, 0), (1, 300, 299), (5, 300, 295), (7, 1031, 0), (3, 20, 50)]
)
def test_buckets_equal_transformers_bit_for_bit(
    num_buckets: int, max_distance: int, bidirectional: bool, q: int, k: int, offset: int
) -> None:
    out = compute(
        spec(
            num_buckets=num_buckets,
            max_distance=max_distance,
            bidirectional=bidirectional,
            query_length=q,
            key_length=k,
            query_offset=offset,
        )
    ).tensors["buckets"]
    ref = reference_buckets(q, k, offset, bidirectional, num_buckets, max_distance)
    assert out.dtype == torch.int64
    assert torch.equal(out, ref)


@pytest.mark.parametrize(
    ("num_buckets", "max_distance", "bidirectional", "n"),
    [(18, 128, True, 16), (9, 128, False, 8), (39, 16, True, 12)],
)
def test_fp32_log_and_truncation_matter(
    num_buckets: int, max_distance: int, bidirectional: bool, n: int
) -> None:
    # The fp32 product lands on an integer where float64 math falls just below it.
    nb = num_buckets // 2 if bidirectional else num_buckets
    max_exact = nb // 2
    float64 = max_exact + int(
        math.log(n / max_exact) / math.log(max_distance / max_exact) * (nb - max_exact)
    )
    out = compute(
        spec(
            num_buckets=num_buckets,
            max_distance=max_distance,
            bidirectional=bidirectional,
            query_length=1,
            query_offset=n,
        )
    ).tensors["buckets"]
    assert int(out[0, 0]) == int(
        reference_buckets(1, 1, n, bidirectional, num_buckets, max_distance)[0, 0]
    )
    assert int(out[0, 0]) == float64 + 1


# --- bias with real T5Attention weights ----------------------------------------------------------


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("q", "k", "offset"), [(12, 12, 0), (1, 200, 199), (4, 9, 5), (6, 150, 0)])
def test_bias_equals_t5_compute_bias(bidirectional: bool, q: int, k: int, offset: int) -> None:
    weights = torch.randn(32, 3, generator=torch.Generator().manual_seed(0))
    module = attention(bidirectional, weights, max_distance=128)
    assert module.scaling == 1.0  # T5 adds the bias to unscaled scores
    with torch.no_grad():
        ref = module.compute_bias(q, k, past_seen_tokens=offset)[0]
    out = compute(
        spec(
            bidirectional=bidirectional,
            query_length=q,
            key_length=k,
            query_offset=offset,
            relative_attention_bias=weights.tolist(),
        )
    )
    assert out.tensors["bias"].shape == (3, q, k)
    assert torch.equal(out.tensors["bias"], ref)
    assert out.tensors["bias"].is_contiguous()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_bias_is_the_fp32_bias_cast_last(dtype: str) -> None:
    weights = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = attention(False, weights, 128).compute_bias(1, 64, past_seen_tokens=63)[0]
    out = compute(
        spec(
            bidirectional=False,
            key_length=64,
            query_offset=63,
            relative_attention_bias=weights.tolist(),
            dtype=dtype,
        )
    ).tensors["bias"]
    assert torch.equal(out, ref.to(getattr(torch, dtype)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tables_equal_cpu_tables() -> None:
    # Buckets come from a CPU lookup table on every device; the bias is a gather.
    weights = torch.randn(32, 6, generator=torch.Generator().manual_seed(2)).tolist()
    s = spec(query_length=64, key_length=4096, query_offset=4032, relative_attention_bias=weights)
    cpu, gpu = compute(s, "cpu").tensors, compute(s, "cuda").tensors
    for name in cpu:
        assert torch.equal(gpu[name].cpu(), cpu[name])


# --- spec: canonical form, outputs, validation ---------------------------------------------------


def test_canonical_fills_lengths_and_keeps_the_weights() -> None:
    w = [[0.5 * b, -0.25] for b in range(32)]
    a = spec(query_length=1, query_offset=9, relative_attention_bias=w)
    b = spec(key_length=10, query_offset=9, relative_attention_bias=w)
    assert canonical_json(a) == canonical_json(b)
    c = a.canonical()
    assert (c.query_length, c.key_length) == (1, 10)
    assert c.relative_attention_bias == w
    w2 = [row[:] for row in w]
    w2[31][1] = 1.0
    assert content_key(a) != content_key(
        spec(key_length=10, query_offset=9, relative_attention_bias=w2)
    )
    assert content_key(spec(key_length=10)) != content_key(spec(key_length=10, bidirectional=False))


@pytest.mark.parametrize(
    "kw",
    [
        {"key_length": 7},
        {"query_length": 2, "key_length": 30, "query_offset": 5},
        {"key_length": 5, "relative_attention_bias": [[1.0, 2.0, 3.0]] * 32, "dtype": "bfloat16"},
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


def test_max_exact_at_or_beyond_max_distance_names_both_fields() -> None:
    with pytest.raises(SpecError) as err:
        spec(num_buckets=64, max_distance=16, key_length=4)  # max_exact = 64 / 2 / 2 = 16
    assert {p.field for p in err.value.problems} == {"max_distance", "num_buckets"}
    spec(num_buckets=64, max_distance=17, key_length=4)
    with pytest.raises(SpecError):
        spec(num_buckets=64, max_distance=32, bidirectional=False, key_length=4)  # max_exact 32


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({}, "key_length"),
        ({"key_length": 0}, "key_length"),
        ({"key_length": 4, "num_buckets": 3}, "num_buckets"),
        ({"key_length": 4, "num_buckets": 1, "bidirectional": False}, "num_buckets"),
        ({"key_length": 4, "max_distance": 0}, "max_distance"),
        ({"key_length": 4, "query_offset": 4}, "query_length"),
        ({"key_length": 4, "query_offset": -1}, "query_offset"),
        ({"query_length": 1, "query_offset": 1 << 24}, "query_offset"),
        ({"key_length": 4, "dtype": "float16"}, "dtype"),
        ({"key_length": 4, "relative_attention_bias": [[1.0]] * 31}, "relative_attention_bias"),
        ({"key_length": 4, "relative_attention_bias": [[]] * 32}, "relative_attention_bias"),
        (
            {"key_length": 4, "relative_attention_bias": [[1.0, 2.0]] * 31 + [[1.0]]},
            "relative_attention_bias",
        ),
        (
            {"key_length": 4, "relative_attention_bias": [[float("nan")]] * 32},
            "relative_attention_bias.0.0",
        ),
        (
            {"key_length": 4, "num_buckets": 256, "relative_attention_bias": [[0.0] * 4097] * 256},
            "relative_attention_bias",
        ),
        (
            {
                "key_length": 4,
                "num_buckets": 1024,
                "max_distance": 1000,
                "relative_attention_bias": [[0.0] * 1025] * 1024,
            },
            "relative_attention_bias",
        ),
        ({"key_length": 4, "relative_attention_num_buckets": 32}, "relative_attention_num_buckets"),
    ],
)
def test_bad_specs_name_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"kind": "t5_bias", **kw})
    assert field in [p.field for p in err.value.problems], err.value


# --- properties ----------------------------------------------------------------------------------

configs = (
    st.integers(2, 200)
    .flatmap(
        lambda nb: st.tuples(
            st.just(nb),
            st.booleans(),
            st.integers(1, 600),
        )
    )
    .filter(lambda c: 1 <= ((c[0] // 2 if c[1] else c[0]) // 2) < c[2])
)


@given(config=configs, q=st.integers(1, 30), k=st.integers(1, 700), offset=st.integers(0, 700))
@settings(max_examples=120, deadline=None)
def test_buckets_in_range_monotone_and_equal_to_transformers(
    config: tuple[int, bool, int], q: int, k: int, offset: int
) -> None:
    num_buckets, bidirectional, max_distance = config
    out = compute(
        spec(
            num_buckets=num_buckets,
            max_distance=max_distance,
            bidirectional=bidirectional,
            query_length=q,
            key_length=k,
            query_offset=offset,
        )
    ).tensors["buckets"]
    assert torch.equal(
        out, reference_buckets(q, k, offset, bidirectional, num_buckets, max_distance)
    )
    assert int(out.min()) >= 0
    assert int(out.max()) < num_buckets
    # One bucket per relative position j - p; along it, monotone in |distance| per direction.
    rel = torch.arange(k)[None, :] - (torch.arange(q)[:, None] + offset)
    order = torch.argsort(rel.flatten())
    rel_sorted, b_sorted = rel.flatten()[order], out.flatten()[order]
    back, ahead = rel_sorted <= 0, rel_sorted > 0
    assert (b_sorted[back].diff() <= 0).all()  # rel ascending = |distance| descending
    if bidirectional:
        half = num_buckets // 2
        assert (b_sorted[ahead].diff() >= 0).all()
        assert (b_sorted[ahead] >= half).all()
        assert (b_sorted[back] < half).all()
    else:
        assert (b_sorted[ahead] == 0).all()
