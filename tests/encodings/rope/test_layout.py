"""Layouts, profiles, output dtypes and spec rejection for the RoPE family.

The half-width values cos(theta)*A are the same for every layout; only the packing differs
(field guide section 1): full width `cat(c, c)` (half split) or `repeat_interleave(c, 2)`
(interleaved), `cos_sin` = cat(cos_half, sin_half) (P, d), `pairs` = stack (P, d/2, 2).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from posenc.encodings import SpecError, TensorInfo, compute, parse_spec
from posenc.encodings.rope import PROFILES
from tests.encodings.rope.hf_models import ours

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
BASE: dict[str, Any] = {"head_dim": 128, "max_positions": 300, "rope_scaling": YARN}


@pytest.fixture(scope="module")
def half() -> dict[str, torch.Tensor]:
    return ours(width="half", **BASE).tensors


def test_full_width_half_split_is_cat(half: dict[str, torch.Tensor]) -> None:
    full = ours(width="full", interleaved=False, **BASE).tensors
    assert torch.equal(full["cos"], torch.cat((half["cos"], half["cos"]), dim=-1))
    assert torch.equal(full["sin"], torch.cat((half["sin"], half["sin"]), dim=-1))


def test_full_width_interleaved_is_repeat_interleave(half: dict[str, torch.Tensor]) -> None:
    full = ours(width="full", interleaved=True, **BASE).tensors
    assert torch.equal(full["cos"], half["cos"].repeat_interleave(2, dim=-1))
    assert torch.equal(full["sin"], half["sin"].repeat_interleave(2, dim=-1))


def test_half_width_ignores_pairing(half: dict[str, torch.Tensor]) -> None:
    other = ours(width="half", interleaved=True, **BASE).tensors
    assert torch.equal(other["cos"], half["cos"])
    assert torch.equal(other["sin"], half["sin"])


def test_cos_sin_packing_is_cat(half: dict[str, torch.Tensor]) -> None:
    packed = ours(packing="cos_sin", **BASE).tensors
    assert set(packed) == {"cos_sin", "inv_freq"}
    assert torch.equal(packed["cos_sin"], torch.cat((half["cos"], half["sin"]), dim=-1))


def test_full_layout_names_the_full_width_arrangement(half: dict[str, torch.Tensor]) -> None:
    """`full_layout` overrides the arrangement the pairing implies (transformers' MLA modules
    emit cat(c, c) for interleaved pairs); it is dropped where it changes nothing, so equal tables
    keep one key."""
    cat = ours(width="full", interleaved=True, full_layout="cat", **BASE)
    assert torch.equal(cat.tensors["cos"], torch.cat((half["cos"], half["cos"]), dim=-1))
    assert torch.equal(cat.tensors["sin"], torch.cat((half["sin"], half["sin"]), dim=-1))
    assert cat.meta["spec"]["interleaved"] is True
    assert cat.meta["spec"]["full_layout"] == "cat"
    rep = ours(width="full", interleaved=False, full_layout="repeat_interleave", **BASE)
    assert torch.equal(rep.tensors["cos"], half["cos"].repeat_interleave(2, dim=-1))
    implied = ours(width="full", interleaved=True, full_layout="repeat_interleave", **BASE)
    assert implied.meta["key"] == ours(width="full", interleaved=True, **BASE).meta["key"]
    halfw = ours(width="half", interleaved=True, full_layout="cat", **BASE)
    assert halfw.meta["key"] == ours(width="half", interleaved=True, **BASE).meta["key"]


def test_pairs_at_full_width_is_the_duplicated_mla_table(half: dict[str, torch.Tensor]) -> None:
    """(P, d, 2) = stack(cat(c, c), cat(s, s)): TensorRT-LLM's MLA table (duplicate_data)."""
    packed = ours(packing="pairs", width="full", **BASE).tensors["pairs"]
    cos, sin = half["cos"], half["sin"]
    want = torch.stack((torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)), dim=-1)
    assert torch.equal(packed, want)
    spec = parse_spec({"kind": "rope", "packing": "pairs", "width": "full", **BASE})
    assert spec.outputs()["pairs"].shape == tuple(want.shape)


def test_cos_sin_at_full_width_is_torchtune_qwen2(half: dict[str, torch.Tensor]) -> None:
    """(P, 2d) = cat(cat(c, c), cat(s, s)): torchtune's Qwen2/Phi-3 `build_rope_cache`
    (`freqs = cat([idx_theta, idx_theta]); cat([freqs.cos(), freqs.sin()])`)."""
    packed = ours(packing="cos_sin", width="full", **BASE).tensors["cos_sin"]
    cos, sin = half["cos"], half["sin"]
    want = torch.cat((cos, cos, sin, sin), dim=-1)
    assert torch.equal(packed, want)
    spec = parse_spec({"kind": "rope", "packing": "cos_sin", "width": "full", **BASE})
    assert spec.outputs()["cos_sin"].shape == tuple(want.shape)


def test_pairs_packing_is_stack(half: dict[str, torch.Tensor]) -> None:
    packed = ours(packing="pairs", **BASE).tensors
    assert set(packed) == {"pairs", "inv_freq"}
    assert torch.equal(packed["pairs"], torch.stack((half["cos"], half["sin"]), dim=-1))


# The consumer table of the field guide, section 1: tensor names, shape as a function of
# (P, d) and the values' layout, for every export profile.
EXPECTED_PROFILES: dict[str, dict[str, Any]] = {
    "hf": {"tensors": ("cos", "sin"), "shape": "P,d", "layout": "cat", "interleaved": False},
    "onnx": {"tensors": ("cos", "sin"), "shape": "P,d/2", "layout": "half", "interleaved": False},
    "ort_gqa": {
        "tensors": ("cos", "sin"),
        "shape": "P,d/2",
        "layout": "half",
        "interleaved": False,
    },
    "vllm": {"tensors": ("cos_sin",), "shape": "P,d", "layout": "cos_sin", "interleaved": False},
    "flashinfer": {
        "tensors": ("cos_sin",),
        "shape": "P,d",
        "layout": "cos_sin",
        "interleaved": False,
    },
    "trtllm": {"tensors": ("pairs",), "shape": "P,d/2,2", "layout": "pairs", "interleaved": False},
    "flash_attn": {
        "tensors": ("cos", "sin"),
        "shape": "P,d/2",
        "layout": "half",
        "interleaved": False,
    },
    "torchtune": {
        "tensors": ("pairs",),
        "shape": "P,d/2,2",
        "layout": "pairs",
        "interleaved": True,
    },
}


def test_expected_profiles_cover_the_registry() -> None:
    assert set(EXPECTED_PROFILES) == set(PROFILES)


def _expected_layout(layout: str, cos: torch.Tensor, sin: torch.Tensor) -> list[torch.Tensor]:
    if layout == "cat":
        return [torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)]
    if layout == "half":
        return [cos, sin]
    if layout == "cos_sin":
        return [torch.cat((cos, sin), dim=-1)]
    assert layout == "pairs"
    return [torch.stack((cos, sin), dim=-1)]


@pytest.mark.parametrize("profile", sorted(EXPECTED_PROFILES))
def test_profile_layout(profile: str, half: dict[str, torch.Tensor]) -> None:
    want = EXPECTED_PROFILES[profile]
    d = BASE["head_dim"]
    sizes = {"P": BASE["max_positions"], "d": d, "d/2": d // 2, "2": 2}
    shape = tuple(sizes[part] for part in want["shape"].split(","))
    spec = parse_spec({"kind": "rope", "profile": profile, **BASE})
    table = compute(spec)
    assert table.meta["spec"]["interleaved"] is want["interleaved"]
    assert "profile" not in table.meta["spec"]  # expanded into explicit fields
    names = tuple(n for n in table.tensors if n != "inv_freq")
    assert names == want["tensors"]
    expected = _expected_layout(want["layout"], half["cos"], half["sin"])
    for name, value in zip(names, expected, strict=True):
        assert table.tensors[name].shape == shape
        assert table.tensors[name].dtype == torch.float32
        assert torch.equal(table.tensors[name], value)
    # outputs() announces exactly what compute() returns, without computing.
    announced = spec.outputs()
    assert announced == {
        name: TensorInfo(tuple(t.shape), str(t.dtype).removeprefix("torch."))
        for name, t in table.tensors.items()
    }


def test_profile_fields_can_be_overridden() -> None:
    table = ours(profile="vllm", dtype="bfloat16", **BASE)
    assert table.tensors["cos_sin"].dtype == torch.bfloat16
    assert table.meta["spec"]["packing"] == "cos_sin"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "layout",
    [
        {"width": "full"},
        {"width": "full", "interleaved": True},
        {"width": "half"},
        {"packing": "cos_sin"},
        {"packing": "pairs"},
    ],
    ids=["full", "full-interleaved", "half", "cos_sin", "pairs"],
)
def test_low_precision_is_the_fp32_table_cast_last(
    dtype: torch.dtype, layout: dict[str, Any]
) -> None:
    name = str(dtype).removeprefix("torch.")
    low = ours(dtype=name, **layout, **BASE).tensors
    ref = ours(dtype="float32", **layout, **BASE).tensors
    for key, value in low.items():
        if key == "inv_freq":  # the frequencies stay in the compute dtype
            assert torch.equal(value, ref[key])
            continue
        assert value.dtype == dtype
        assert torch.equal(value, ref[key].to(dtype))


LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0, 1.0],
    "long_factor": [2.0, 2.0],
    "original_max_position_embeddings": 16,
    "factor": 4.0,
}

REJECTED: list[tuple[str, dict[str, Any], set[str]]] = [
    ("odd rotary_dim", {"head_dim": 64, "rotary_dim": 33}, {"rotary_dim"}),
    ("odd head_dim", {"head_dim": 63}, {"head_dim"}),
    ("odd partial", {"head_dim": 60, "partial_rotary_factor": 0.25}, {"partial_rotary_factor"}),
    ("rotary_dim > head_dim", {"head_dim": 64, "rotary_dim": 128}, {"rotary_dim"}),
    (
        "rotary_dim and partial_rotary_factor",
        {"head_dim": 64, "rotary_dim": 32, "partial_rotary_factor": 0.5},
        {"rotary_dim", "partial_rotary_factor"},
    ),
    (
        "longrope factor length != d/2",
        {"head_dim": 8, "rope_scaling": LONGROPE},
        {"rope_scaling.short_factor", "rope_scaling.long_factor"},
    ),
    (
        "longrope short/long lengths differ",
        {"head_dim": 4, "rope_scaling": {**LONGROPE, "long_factor": [2.0]}},
        {"rope_scaling.long_factor"},
    ),
    (
        "longrope without factor",
        {"head_dim": 4, "rope_scaling": {k: v for k, v in LONGROPE.items() if k != "factor"}},
        {"rope_scaling.factor"},
    ),
    (
        "yarn beta_fast < beta_slow",
        {"head_dim": 64, "rope_scaling": {**YARN, "beta_fast": 1.0, "beta_slow": 32.0}},
        {"rope_scaling.beta_fast"},
    ),
    (
        "llama3 high < low",
        {
            "head_dim": 64,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 4.0,
                "high_freq_factor": 2.0,
                "original_max_position_embeddings": 8192,
            },
        },
        {"rope_scaling.high_freq_factor"},
    ),
    (
        "flashinfer in bfloat16",
        {"head_dim": 64, "profile": "flashinfer", "dtype": "bfloat16"},
        {"dtype"},
    ),
    ("trtllm in float16", {"head_dim": 64, "profile": "trtllm", "dtype": "float16"}, {"dtype"}),
    (
        "torchtune in float16",
        {"head_dim": 64, "profile": "torchtune", "dtype": "float16"},
        {"dtype"},
    ),
    (
        "llama3 without its original length (as YaRN's) and band factors (as transformers')",
        {"head_dim": 64, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
        {
            "rope_scaling.original_max_position_embeddings",
            "rope_scaling.low_freq_factor",
            "rope_scaling.high_freq_factor",
        },
    ),
    ("vllm profile at full width", {"head_dim": 64, "profile": "vllm", "width": "full"}, {"width"}),
    ("ort_gqa with d/2 = 12", {"head_dim": 24, "profile": "ort_gqa"}, {"profile"}),
    ("NaN rope_theta", {"head_dim": 64, "rope_theta": float("nan")}, {"rope_theta"}),
    ("inf rope_theta", {"head_dim": 64, "rope_theta": float("inf")}, {"rope_theta"}),
    ("rope_theta <= 1", {"head_dim": 64, "rope_theta": 1.0}, {"rope_theta"}),
    (
        "inf factor",
        {"head_dim": 64, "rope_scaling": {"rope_type": "linear", "factor": float("inf")}},
        {"rope_scaling.factor"},
    ),
    (
        "NaN longrope entry",
        {"head_dim": 4, "rope_scaling": {**LONGROPE, "short_factor": [1.0, float("nan")]}},
        {"rope_scaling.short_factor.1"},
    ),
    ("unknown field", {"head_dim": 64, "rope_base": 10000.0}, {"rope_base"}),
    (
        "unknown scaling field",
        {"head_dim": 64, "rope_scaling": {"rope_type": "linear", "factor": 2.0, "alpha": 1.0}},
        {"rope_scaling.alpha"},
    ),
    (
        "unknown rope_type",
        {"head_dim": 64, "rope_scaling": {"rope_type": "su", "factor": 2.0}},
        {"rope_scaling.rope_type"},
    ),
    (
        "dynamic at d = 2",
        {
            "head_dim": 2,
            "rope_scaling": {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 8},
        },
        {"head_dim"},
    ),
    (
        "proportional with rotary_dim",
        {"head_dim": 64, "rotary_dim": 32, "rope_scaling": {"rope_type": "proportional"}},
        {"rotary_dim"},
    ),
    ("bad dtype", {"head_dim": 64, "dtype": "int8"}, {"dtype"}),
    ("bad profile", {"head_dim": 64, "profile": "tgi"}, {"profile"}),
    ("zero positions", {"head_dim": 64, "max_positions": 0}, {"max_positions"}),
]


@pytest.mark.parametrize(
    ("fields", "names"), [r[1:] for r in REJECTED], ids=[r[0] for r in REJECTED]
)
def test_bad_specs_raise_spec_error_naming_the_field(
    fields: dict[str, Any], names: set[str]
) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"kind": "rope", "max_positions": 8, **fields})
    assert {p.field for p in info.value.problems} == names
    assert all(p.message for p in info.value.problems)
