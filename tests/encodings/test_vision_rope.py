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
    styles = {"qwen2_vl", "minimax_m3", "gemma4", "pixtral", "llama4", "dinov3"}
    assert styles == set(ROTARY_CLASSES.values())


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
                "rope_theta": float(getattr(config, "rope_theta", None)
                                    or config.rope_parameters["rope_theta"])}  # fmt: skip
    rope = cls(config)
    head_dim = int(rope.inv_freq.numel() * (2 if style == "pixtral" else 4))
    if style == "gemma4":
        theta = float(config.rope_parameters["rope_theta"])
        return {"style": style, "head_dim": head_dim, "grid_height": 5, "grid_width": 7,
                "rope_theta": theta}  # fmt: skip
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
    if other == "half" and style == "gemma4":  # one copy of each axis block
        quarter = width // 4
        assert torch.equal(alt, torch.cat([cos[:, :quarter], cos[:, 2 * quarter : 3 * quarter]], 1))
    elif other == "half":
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


class _Capture:
    """Wraps a modeling module's apply function; records the tables its attention passes."""

    def __init__(self, module: Any, name: str) -> None:
        self.module, self.name = module, name
        self.original = getattr(module, name)
        self.calls: list[tuple[Any, ...]] = []

    def __enter__(self) -> _Capture:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((*args, *kwargs.values()))
            return self.original(*args, **kwargs)

        setattr(self.module, self.name, wrapper)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(self.module, self.name, self.original)


def test_qwen2_5_vl_tower_forward_applies_the_served_table() -> None:
    """A one-block Qwen2.5-VL tower, two images: the cos/sin its attention receives are the
    served tables of both grids, each in window order, concatenated."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as m
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig

    config = Qwen2_5_VLVisionConfig(depth=1, hidden_size=64, num_heads=4, intermediate_size=64,
                                    out_hidden_size=64, fullatt_block_indexes=[])  # fmt: skip
    config._attn_implementation = "eager"
    tower = m.Qwen2_5_VisionTransformerPretrainedModel(config).eval()
    grids = [(1, 8, 12), (2, 4, 4)]
    n = sum(t * h * w for t, h, w in grids)
    pixels = torch.randn(n, 3 * 2 * 14 * 14)
    with _Capture(m, "apply_rotary_pos_emb_vision") as cap, torch.no_grad():
        tower(pixels, grid_thw=torch.tensor(grids))
    cos, sin = cap.calls[0][2], cap.calls[0][3]
    # window_index numbers merge units across images: each image's rows stay in its own block
    parts = [
        _ours(
            style="qwen2_vl",
            head_dim=16,
            frames=t,
            grid_height=h,
            grid_width=w,
            window_size=112,
            patch_size=14,
        )
        for t, h, w in grids
    ]
    assert torch.equal(cos, torch.cat([p["cos"] for p in parts]))
    assert torch.equal(sin, torch.cat([p["sin"] for p in parts]))


def test_pixtral_tower_forward_applies_each_images_table() -> None:
    from transformers.models.pixtral import modeling_pixtral as m
    from transformers.models.pixtral.configuration_pixtral import PixtralVisionConfig

    config = PixtralVisionConfig(hidden_size=64, num_attention_heads=2, head_dim=32,
                                 intermediate_size=64, num_hidden_layers=1, image_size=64,
                                 patch_size=16)  # fmt: skip
    config._attn_implementation = "eager"
    tower = m.PixtralVisionModel(config).eval()
    pixels = torch.randn(2, 3, 64, 64)
    with _Capture(m, "apply_rotary_pos_emb") as cap, torch.no_grad():
        tower(pixels, image_sizes=torch.tensor([[48, 64], [64, 32]]))
    cos = cap.calls[0][2]
    parts = [_ours(style="pixtral", head_dim=32, grid_height=h, grid_width=w)["cos"]
             for h, w in ((3, 4), (4, 2))]  # fmt: skip
    assert torch.equal(cos, torch.cat(parts))


def test_llama4_tower_forward_applies_the_served_table() -> None:
    from transformers.models.llama4 import modeling_llama4 as m
    from transformers.models.llama4.configuration_llama4 import Llama4VisionConfig

    # intermediate_size 128: the pixel shuffle (ratio 0.5) feeds 4 * hidden_size to the adapter
    config = Llama4VisionConfig(hidden_size=32, num_attention_heads=2, intermediate_size=128,
                                num_hidden_layers=1, image_size=56, patch_size=14,
                                vision_output_dim=32, projector_input_dim=32,
                                projector_output_dim=32, pixel_shuffle_ratio=0.5)  # fmt: skip
    config._attn_implementation = "eager"
    tower = m.Llama4VisionModel(config).eval()
    with _Capture(m, "vision_apply_rotary_emb") as cap, torch.no_grad():
        tower(torch.randn(1, 3, 56, 56))
    freqs = cap.calls[0][2]
    ours = _ours(style="llama4", head_dim=16, grid_height=4, grid_width=4)
    assert torch.equal(freqs.real.reshape(17, 8), ours["cos"])
    assert torch.equal(freqs.imag.reshape(17, 8), ours["sin"])


def test_dinov3_tower_forward_rotates_patches_only() -> None:
    from transformers.models.dinov3_vit import modeling_dinov3_vit as m
    from transformers.models.dinov3_vit.configuration_dinov3_vit import DINOv3ViTConfig

    config = DINOv3ViTConfig(hidden_size=64, num_attention_heads=2, intermediate_size=64,
                             num_hidden_layers=1, image_size=48, patch_size=16)  # fmt: skip
    config._attn_implementation = "eager"
    tower = m.DINOv3ViTModel(config).eval()
    with _Capture(m, "apply_rotary_pos_emb") as cap, torch.no_grad():
        tower(torch.randn(1, 3, 48, 80))
    q, _, cos, sin = cap.calls[0][:4]
    ours = _ours(style="dinov3", head_dim=32, grid_height=3, grid_width=5)
    assert torch.equal(cos, ours["cos"])
    assert torch.equal(sin, ours["sin"])
    assert q.shape[-2] == 1 + config.num_register_tokens + 15  # prefix tokens first, unrotated


def test_eomt_dinov3_forward_rotates_patches_only_queries_included(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """EoMT-DINOv3's attention gets the served table in every layer; in the last num_blocks
    layers its query tokens join the unrotated prefix (tokens before the H*W patches). Its
    training loss (EomtDinov3Loss, which needs scipy, not in our lock) is never called without
    labels: its scipy check is skipped to build the model."""
    from transformers.models.eomt_dinov3 import modeling_eomt_dinov3 as m
    from transformers.models.eomt_dinov3.configuration_eomt_dinov3 import EomtDinov3Config

    config = EomtDinov3Config(hidden_size=64, num_attention_heads=2, intermediate_size=64,
                              num_hidden_layers=2, num_blocks=1, num_queries=3, image_size=48,
                              patch_size=16, num_labels=2)  # fmt: skip
    config._attn_implementation = "eager"
    monkeypatch.setattr(m, "requires_backends", lambda *_: None)
    model = m.EomtDinov3ForUniversalSegmentation(config).eval()
    with _Capture(m, "apply_rotary_pos_emb") as cap, torch.no_grad():
        model(torch.randn(1, 3, 48, 48))
    ours = _ours(style="dinov3", head_dim=32, grid_height=3, grid_width=3)
    assert len(cap.calls) == 2
    prefix = 1 + config.num_register_tokens
    for (q, _, cos, sin), extra in zip([c[:4] for c in cap.calls], (0, 3), strict=True):
        assert torch.equal(cos, ours["cos"])
        assert torch.equal(sin, ours["sin"])
        assert q.shape[-2] == extra + prefix + 9


def test_eomt_dinov3_other_rope_types_are_refused() -> None:
    from posenc.encodings import ConfigError, resolve_hf_config

    rope = {"rope_type": "linear", "factor": 2.0, "rope_theta": 100.0}
    config = {"model_type": "eomt_dinov3", "hidden_size": 64, "num_attention_heads": 2,
              "image_size": 48, "patch_size": 16, "rope_parameters": rope}  # fmt: skip
    with pytest.raises(ConfigError) as err:
        resolve_hf_config(config)
    (problem,) = err.value.problems
    assert problem.field == "rope_parameters.rope_type"


def test_gemma4_encoder_forward_applies_the_served_table() -> None:
    """A one-layer Gemma 4 vision encoder on processor-style (x, y) positions with two padding
    rows: the real patches' cos/sin are the served table."""
    from transformers.models.gemma4 import modeling_gemma4 as m
    from transformers.models.gemma4.configuration_gemma4 import Gemma4VisionConfig

    config = Gemma4VisionConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=2,
                                head_dim=32, intermediate_size=64, num_hidden_layers=1)  # fmt: skip
    config._attn_implementation = "eager"
    encoder = m.Gemma4VisionEncoder(config).eval()
    positions = ref.gemma4_positions(3, 5)
    padded = torch.cat([positions, torch.full((1, 2, 2), -1)], dim=1)
    mask = torch.cat([torch.ones(1, 15), torch.zeros(1, 2)], dim=1).bool()
    with _Capture(m, "apply_multidimensional_rope") as cap, torch.no_grad():
        encoder(torch.randn(1, 17, 64), attention_mask=mask, pixel_position_ids=padded)
    cos, sin = cap.calls[0][1][0, :15], cap.calls[0][2][0, :15]
    ours = _ours(style="gemma4", head_dim=32, grid_height=3, grid_width=5)
    assert torch.equal(cos, ours["cos"])
    assert torch.equal(sin, ours["sin"])
