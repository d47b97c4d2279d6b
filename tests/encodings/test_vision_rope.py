"""`vision_rope` family against the installed transformers: every vision rotary module of the
package is mapped (and its tower's cos/sin and q.k reproduced bit for bit) or refused with a
reason; the spec's validation names the field."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from posenc.encodings import FAMILIES, SpecError, compute, content_key, parse_spec
from posenc.encodings.hf_config.vision_rope import REFUSED_CLASSES, ROTARY_CLASSES
from posenc.encodings.vision_rope import VisionRopeSpec
from tests.encodings import vision_reference as ref

CLASSES = ref.rotary_classes()
MAPPED = sorted(name for name in CLASSES if name in ROTARY_CLASSES)


def _ours(**fields: Any) -> dict[str, torch.Tensor]:
    return compute(parse_spec({"kind": "vision_rope", **fields})).tensors


def test_every_vision_rotary_class_is_mapped_or_refused() -> None:
    assert len(CLASSES) >= 20
    assert not set(ROTARY_CLASSES) & set(REFUSED_CLASSES)
    assert set(CLASSES) == set(ROTARY_CLASSES) | set(REFUSED_CLASSES)
    assert {"qwen2_vl", "minimax_m3", "pixtral", "llama4", "dinov3"} == set(ROTARY_CLASSES.values())


def _fields(name: str, config: Any, frames: int) -> dict[str, Any]:
    """The spec fields of the tower built from `config`, for a small grid."""
    style = ROTARY_CLASSES[name]
    cls, module = ref.load(name, CLASSES[name])
    if style == "llama4":
        side = config.image_size // config.patch_size
        head_dim = config.hidden_size // config.num_attention_heads
        return {"style": style, "head_dim": head_dim, "grid_height": side, "grid_width": side,
                "rope_theta": float(config.rope_parameters["rope_theta"])}  # fmt: skip
    if style == "dinov3":
        head_dim = config.hidden_size // config.num_attention_heads
        return {"style": style, "head_dim": head_dim, "grid_height": 3, "grid_width": 5,
                "rope_theta": float(config.rope_theta)}  # fmt: skip
    rope = cls(config)
    head_dim = int(rope.inv_freq.numel() * (2 if style == "pixtral" else 4))
    if style == "minimax_m3":
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
    fields: dict[str, Any] = {
        "style": style,
        "head_dim": head_dim,
        "rope_theta": float(config.rope_parameters["rope_theta"]),
    }
    if style == "pixtral":
        return {**fields, "grid_height": 5, "grid_width": 7}
    merge = config.spatial_merge_size
    fields |= {"spatial_merge_size": merge, "frames": frames}
    fields |= {"grid_height": 6 * merge, "grid_width": 9 * merge}
    if ref.uses_window(module):
        fields |= {"window_size": config.window_size, "patch_size": config.patch_size}
    return fields


@pytest.mark.parametrize("name", MAPPED)
def test_tower_tables_and_scores_are_bit_exact(name: str) -> None:
    config = ref.config_class(ref.load(name, CLASSES[name])[0])()
    fields = _fields(name, config, frames=2)
    spec = parse_spec({"kind": "vision_rope", **fields}).canonical()
    assert isinstance(spec, VisionRopeSpec)
    cos, sin = ref.tower_tables(name, CLASSES[name], config, spec)
    ours = _ours(**fields)
    assert ours["cos"].shape == cos.shape
    assert torch.equal(ours["cos"], cos)
    assert torch.equal(ours["sin"], sin)
    n, width = cos.shape
    head_dim = spec.head_dim
    assert width == (spec.rotary_width() if spec.width == "full" else spec.rotary_width() // 2)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(n, 2, head_dim, generator=gen)
    k = torch.randn(n, 2, head_dim, generator=gen)
    style = spec.style
    theirs = ref.applied(name, CLASSES[name], style, q, k, cos, sin)
    mine = ref.applied(name, CLASSES[name], style, q, k, ours["cos"], ours["sin"])
    assert torch.equal(ref.scores(*theirs), ref.scores(*mine))
    # the other width is the same values: half is the first copy, full the tower's packing
    other = "full" if spec.width == "half" else "half"
    alt = _ours(**fields, width=other)["cos"]
    if other == "half":
        assert torch.equal(alt, cos[:, : width // 2])
    else:
        assert torch.equal(alt, cos.repeat_interleave(2, dim=-1))


def test_pixtral_and_dinov3_cast_last_as_the_tower_does() -> None:
    from transformers.models.pixtral.configuration_pixtral import PixtralVisionConfig
    from transformers.models.pixtral.modeling_pixtral import PixtralVisionRotaryEmbedding

    config = PixtralVisionConfig(hidden_size=64, num_attention_heads=2, head_dim=32)
    hp, wp = torch.meshgrid(torch.arange(9), torch.arange(4), indexing="ij")
    x = torch.zeros(1, dtype=torch.bfloat16)
    cos, sin = PixtralVisionRotaryEmbedding(config)(
        x, torch.stack([hp.flatten(), wp.flatten()], -1)
    )
    ours = _ours(style="pixtral", head_dim=32, grid_height=9, grid_width=4, dtype="bfloat16")
    assert ours["cos"].dtype == torch.bfloat16
    assert torch.equal(ours["cos"], cos)
    assert torch.equal(ours["sin"], sin)


def test_qwen_window_order_is_a_permutation_of_merge_units() -> None:
    plain = _ours(style="qwen2_vl", head_dim=16, grid_height=20, grid_width=12)["cos"]
    windowed = _ours(
        style="qwen2_vl", head_dim=16, grid_height=20, grid_width=12, window_size=112,
        patch_size=14,
    )["cos"]  # fmt: skip
    assert not torch.equal(plain, windowed)
    units = {tuple(u.flatten().tolist()) for u in plain.reshape(-1, 4, 16)}
    assert units == {tuple(u.flatten().tolist()) for u in windowed.reshape(-1, 4, 16)}


def test_llama4_class_token_row_is_the_identity() -> None:
    t = _ours(style="llama4", head_dim=16, grid_height=3, grid_width=3)
    assert t["cos"].shape == (10, 8)
    assert torch.equal(t["cos"][-1], torch.ones(8))
    assert torch.equal(t["sin"][-1], torch.zeros(8))


def test_property_cos2_plus_sin2_is_one() -> None:
    for style, extra in (
        ("qwen2_vl", {}),
        ("minimax_m3", {"frames": 3}),
        ("pixtral", {}),
        ("llama4", {}),
        ("dinov3", {}),
    ):
        t = _ours(style=style, head_dim=24 if style != "llama4" else 16, grid_height=4,
                  grid_width=4, **extra)  # fmt: skip
        torch.testing.assert_close(t["cos"] ** 2 + t["sin"] ** 2, torch.ones_like(t["cos"]))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"style": "pixtral", "head_dim": 30, "grid_height": 2, "grid_width": 2}, "head_dim"),
        ({"style": "qwen2_vl", "head_dim": 16, "grid_height": 3, "grid_width": 4}, "grid_height"),
        (
            {
                "style": "qwen2_vl",
                "head_dim": 16,
                "grid_height": 4,
                "grid_width": 4,
                "window_size": 112,
            },
            "patch_size",
        ),
        (
            {
                "style": "qwen2_vl",
                "head_dim": 16,
                "grid_height": 4,
                "grid_width": 4,
                "window_size": 20,
                "patch_size": 14,
            },
            "window_size",
        ),
        (
            {
                "style": "pixtral",
                "head_dim": 16,
                "grid_height": 4,
                "grid_width": 4,
                "spatial_merge_size": 2,
            },
            "spatial_merge_size",
        ),
        ({"style": "llama4", "head_dim": 16, "grid_height": 4, "grid_width": 5}, "grid_width"),
        (
            {
                "style": "minimax_m3",
                "head_dim": 16,
                "grid_height": 4,
                "grid_width": 4,
                "window_size": 112,
                "patch_size": 14,
            },
            "window_size",
        ),
        ({"style": "minimax_m3", "head_dim": 4, "grid_height": 2, "grid_width": 2}, "head_dim"),
        ({"style": "dinov3", "head_dim": 16, "grid_height": 0, "grid_width": 5}, "grid_height"),
        (
            {"style": "dinov3", "head_dim": 16, "grid_height": 4, "grid_width": 1 << 13},
            "grid_width",
        ),
    ],
)
def test_bad_specs_name_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"kind": "vision_rope", **fields})
    assert field in [p.field for p in err.value.problems]


def test_defaults_share_the_content_key() -> None:
    short = {"kind": "vision_rope", "style": "qwen2_vl", "head_dim": 16, "grid_height": 4,
             "grid_width": 4}  # fmt: skip
    spelled = {**short, "rope_theta": 10000.0, "spatial_merge_size": 2, "frames": 1,
               "width": "full", "dtype": "float32"}  # fmt: skip
    assert content_key(parse_spec(short)) == content_key(parse_spec(spelled))
    assert FAMILIES["vision_rope"].spec_type is VisionRopeSpec
    assert FAMILIES["vision_rope"].compute.__doc__


def test_refused_towers_are_named_by_model_type() -> None:
    from transformers import AutoConfig

    from posenc.encodings import ConfigError, resolve_hf_config
    from posenc.encodings.hf_config.vision_rope import UNSERVED

    assert set(UNSERVED.values()) <= set(REFUSED_CLASSES)
    # every refused tower of a multimodal model is listed; the two left are text rotaries
    text_rotaries = set(REFUSED_CLASSES) - set(UNSERVED.values())
    assert text_rotaries == {
        "DeepseekOcr2VisionRotaryEmbedding",
        "Granite4VisionTextRotaryEmbedding",
    }
    for model_type, name in UNSERVED.items():
        assert CLASSES[name] == model_type
        config = AutoConfig.for_model(model_type).to_dict()
        with pytest.raises(ConfigError) as err:
            resolve_hf_config(config, kind="vision_rope")
        (problem,) = err.value.problems
        assert problem.field == "model_type"
        assert name in problem.message
