"""Normalized scalar positions against the tutorial expressions (bit for bit), masking per sample,
T = 1, validation, canonical forms and properties."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.encodings import SpecError, canonical_json, compute, content_key, parse_spec
from posenc.encodings.base import FAMILIES
from posenc.encodings.normalized import NormalizedSpec


def spec(**kw: Any) -> NormalizedSpec:
    out = parse_spec({"kind": "normalized", **kw})
    assert isinstance(out, NormalizedSpec)
    return out


def table(**kw: Any) -> torch.Tensor:
    return compute(spec(**kw)).tensors["embedding"]


def tutorial(mode: str, t: int, t_max: float = 1.0) -> torch.Tensor:
    """The one-liners tutorials write, in fp32."""
    pos = torch.arange(t).float()
    if mode == "raw":
        return pos
    if mode == "by_last":
        return pos / (t - 1) if t > 1 else torch.zeros(1)
    if mode == "by_length":
        return pos / t
    return pos / t_max


@pytest.mark.parametrize("mode", ["raw", "by_last", "by_length", "by_max"])
@pytest.mark.parametrize("t", [1, 2, 3, 7, 100, 1000, 12345])
def test_equals_the_tutorial_expression_bit_for_bit(mode: str, t: int) -> None:
    extra = {"t_max": 777.0} if mode == "by_max" else {}
    ours = table(mode=mode, max_positions=t, **extra)
    assert ours.shape == (t,)
    assert torch.equal(ours, tutorial(mode, t, 777.0))


def test_by_last_is_not_linspace_but_division() -> None:
    # linspace accumulates a rounded step; the division is correctly rounded.
    t = 1000
    ours = table(mode="by_last", max_positions=t)
    assert torch.equal(ours, torch.arange(t).float() / (t - 1))
    assert ours[0] == 0.0
    assert ours[-1] == 1.0


def test_single_position_is_zero() -> None:
    assert torch.equal(table(mode="by_last", max_positions=1), torch.zeros(1))
    out = table(mode="by_last", lengths=[1, 3], max_positions=3)
    assert torch.equal(out[0], torch.zeros(3))
    assert torch.equal(out[1], torch.tensor([0.0, 0.5, 1.0]))


@pytest.mark.parametrize("mode", ["raw", "by_last", "by_length", "by_max"])
def test_batch_masks_past_each_length(mode: str) -> None:
    lengths = [5, 1, 8, 0, 3]
    extra = {"t_max": 10.0} if mode == "by_max" else {}
    out = table(mode=mode, lengths=lengths, max_positions=8, pad_value=-1.0, **extra)
    assert out.shape == (5, 8)
    for b, n in enumerate(lengths):
        if n:
            assert torch.equal(out[b, :n], tutorial(mode, n, 10.0))
        assert torch.all(out[b, n:] == -1.0)


def test_max_positions_defaults_to_the_longest() -> None:
    a = spec(mode="by_length", lengths=[2, 6])
    b = spec(mode="by_length", lengths=[2, 6], max_positions=6, pad_value=0.0)
    assert a.outputs()["embedding"].shape == (2, 6)
    assert canonical_json(a) == canonical_json(b)
    assert content_key(a) == content_key(b)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_dtypes_cast_last(dtype: str) -> None:
    out = table(mode="by_last", max_positions=300, dtype=dtype)
    if dtype == "float64":
        assert torch.equal(out, torch.arange(300, dtype=torch.float64) / 299)
    else:
        ref = (torch.arange(300).float() / 299).to(getattr(torch, dtype))
        assert torch.equal(out, ref)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"mode": "raw"}, "max_positions"),
        ({"mode": "raw", "lengths": [4], "max_positions": 3}, "lengths"),
        ({"mode": "raw", "lengths": [0, 0]}, "lengths"),
        ({"mode": "by_max", "max_positions": 3}, "t_max"),
        ({"mode": "by_last", "max_positions": 3, "t_max": 4.0}, "t_max"),
        ({"mode": "by_max", "max_positions": 3, "t_max": 0.0}, "t_max"),
        ({"mode": "raw", "max_positions": 3, "pad_value": 1.0}, "pad_value"),
        ({"mode": "halfway", "max_positions": 3}, "mode"),
        ({"mode": "raw", "max_positions": 0}, "max_positions"),
        ({"mode": "raw", "lengths": [-1], "max_positions": 3}, "lengths.0"),
        ({"mode": "raw", "max_positions": 3, "dtype": "int64"}, "dtype"),
    ],
)
def test_bad_specs_name_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        spec(**kw)
    assert field in {p.field for p in err.value.problems}


def test_registered_and_outputs_match() -> None:
    assert FAMILIES["normalized"].spec_type is NormalizedSpec
    s = spec(mode="by_max", lengths=[3, 4], t_max=9, dtype="bfloat16")
    t = compute(s)
    info = s.canonical().outputs()["embedding"]
    assert tuple(t.tensors["embedding"].shape) == info.shape
    assert t.tensors["embedding"].dtype == torch.bfloat16


@settings(max_examples=60, deadline=None)
@given(
    mode=st.sampled_from(["by_last", "by_length"]),
    lengths=st.lists(st.integers(0, 64), min_size=1, max_size=6),
    extra=st.integers(0, 5),
)
def test_unit_interval_monotone_and_masked(mode: str, lengths: list[int], extra: int) -> None:
    width = max(max(lengths), 1) + extra
    out = table(mode=mode, lengths=lengths, max_positions=width, pad_value=-2.0)
    for b, n in enumerate(lengths):
        valid = out[b, :n]
        assert torch.all(valid >= 0)
        assert torch.all(valid <= 1)
        assert torch.all(valid[1:] > valid[:-1])
        if n > 1 and mode == "by_last":
            assert valid[-1] == 1.0
        assert torch.all(out[b, n:] == -2.0)
