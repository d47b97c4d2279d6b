"""`sinusoidal_2d` family: transformers DETR / Deformable DETR / Grounding DINO and ViTMAE
(bit-exact), timm `build_sincos2d_pos_embed` (bit-exact when timm is installed), GroundingDINO's
per-axis-temperature forward transcribed in torch float32 and the MAE repository's builder (both
bit-exact), goldens from the published DINO, MAE and timm code in float64 numpy, validation,
canonical forms and properties.

Tolerances as in test_sinusoidal.py: float64-computed tables within `ATOL["float32"]`,
float32-computed ones within `ATOL["float32"] * max(1, max|angle|)`.
"""

from __future__ import annotations

import math
import random
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.encodings import SpecError, canonical_dict, compute, content_key, parse_spec
from posenc.encodings.base import FAMILIES
from posenc.encodings.sinusoidal_2d import Sinusoidal2DSpec
from tests.encodings.timm_support import timm_layer
from tests.tolerances import ATOL


def table(**fields: Any) -> torch.Tensor:
    return compute(parse_spec({"kind": "sinusoidal_2d", **fields})).tensors["embedding"]


def angle_tol(max_angle: float) -> float:
    return ATOL["float32"] * max(1.0, max_angle)


def assert_close(ours: torch.Tensor, golden: np.ndarray, tol: float) -> None:
    assert tuple(ours.shape) == golden.shape
    err = np.abs(ours.double().numpy() - golden).max()
    assert err <= tol, f"max |error| {err:.3g} > {tol:.3g}"


def pixel_mask(height: int, width: int, valid_height: int, valid_width: int) -> torch.Tensor:
    mask = torch.zeros(1, height, width, dtype=torch.long)
    mask[0, :valid_height, :valid_width] = 1
    return mask


# --- independent float64 goldens, written from the published code --------------------------


def golden_dino_hw(
    not_mask: np.ndarray, feats: int, temperature_h: float, temperature_w: float, normalize: bool
) -> np.ndarray:
    """IDEA-Research DINO / GroundingDINO `position_encoding.PositionEmbeddingSineHW` (2F, H, W)."""
    y_embed = not_mask.cumsum(0)
    x_embed = not_mask.cumsum(1)
    if normalize:
        y_embed = y_embed / (y_embed[-1:, :] + 1e-6) * 2 * math.pi
        x_embed = x_embed / (x_embed[:, -1:] + 1e-6) * 2 * math.pi
    i = np.arange(feats, dtype=np.float64)
    pos_x = x_embed[:, :, None] / temperature_w ** (2 * (i // 2) / feats)
    pos_y = y_embed[:, :, None] / temperature_h ** (2 * (i // 2) / feats)
    pos_x = np.stack((np.sin(pos_x[:, :, 0::2]), np.cos(pos_x[:, :, 1::2])), axis=3)
    pos_y = np.stack((np.sin(pos_y[:, :, 0::2]), np.cos(pos_y[:, :, 1::2])), axis=3)
    h, w = not_mask.shape
    pos = np.concatenate((pos_y.reshape(h, w, feats), pos_x.reshape(h, w, feats)), axis=2)
    return pos.transpose(2, 0, 1)


def golden_mae(embed_dim: int, grid_size: int, cls_token: bool) -> np.ndarray:
    """facebookresearch/mae `util/pos_embed.py` get_2d_sincos_pos_embed (square grids), as of
    commit be47fef7 (omega `np.float`, float64: the code of the released checkpoints, and what
    transformers' ViTMAE copies), compared line by line with that file. The repository's later
    a9f5c701 computes omega in float32 numpy (`np.float` was removed from numpy): up to 6.7e-7
    from this table, which posenc does not follow."""

    def one_d(dim: int, pos: np.ndarray) -> np.ndarray:
        omega = np.arange(dim // 2, dtype=np.float64)
        omega /= dim / 2.0
        omega = 1.0 / 10000**omega
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    grid_h = np.arange(grid_size, dtype=np.float32)
    grid_w = np.arange(grid_size, dtype=np.float32)
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0)  # here w goes first
    grid = grid.reshape([2, 1, grid_size, grid_size])
    emb = np.concatenate([one_d(embed_dim // 2, grid[0]), one_d(embed_dim // 2, grid[1])], axis=1)
    if cls_token:
        emb = np.concatenate([np.zeros([1, embed_dim]), emb], axis=0)
    return emb


def golden_timm(
    feat_shape: list[int], dim: int, reverse_coord: bool, interleave_sin_cos: bool
) -> np.ndarray:
    """timm `layers/pos_embed_sincos.py` build_sincos2d_pos_embed (temperature 1e4)."""
    pos_dim = dim // 4
    bands = 1.0 / (10000.0 ** (np.arange(pos_dim, dtype=np.float64) / pos_dim))
    if reverse_coord:
        feat_shape = feat_shape[::-1]
    axes = [np.arange(s, dtype=np.float64) for s in feat_shape]
    grid = np.stack(np.meshgrid(*axes, indexing="ij")).reshape(2, -1).T
    pos2 = grid[:, :, None] * bands[None, None, :]
    stack_axis = 2 if interleave_sin_cos else 1
    return np.stack([np.sin(pos2), np.cos(pos2)], axis=stack_axis).reshape(len(grid), -1)


# --- DETR family: bit-exact against transformers --------------------------------------------


GRIDS = [(7, 9, 5, 6), (8, 8, 8, 8), (5, 13, 0, 4), (16, 20, 11, 20)]


@pytest.mark.parametrize(("height", "width", "valid_height", "valid_width"), GRIDS)
@pytest.mark.parametrize("normalize", [False, True])
def test_detr_bit_exact(
    height: int, width: int, valid_height: int, valid_width: int, normalize: bool
) -> None:
    from transformers.models.detr.modeling_detr import DetrSinePositionEmbedding

    module = DetrSinePositionEmbedding(64, normalize=normalize)
    mask = pixel_mask(height, width, valid_height, valid_width)
    ref = module((1, 3, height, width), "cpu", torch.float32, mask=mask)[0]
    ours = table(
        style="detr",
        num_pos_feats=64,
        height=height,
        width=width,
        valid_height=valid_height,
        valid_width=valid_width,
        normalize=normalize,
    )
    assert torch.equal(ours, ref)
    # no mask: transformers' arange path equals the full valid block
    ref_full = module((1, 3, height, width), "cpu", torch.float32)[0]
    full = table(style="detr", num_pos_feats=64, height=height, width=width, normalize=normalize)
    assert torch.equal(full, ref_full)


def test_detr_float64_matches_transformers_float64() -> None:
    from transformers.models.detr.modeling_detr import DetrSinePositionEmbedding

    module = DetrSinePositionEmbedding(32, normalize=True)
    ref = module((1, 3, 9, 11), "cpu", torch.float64, mask=pixel_mask(9, 11, 6, 7))[0]
    spec = {"style": "detr", "num_pos_feats": 32, "height": 9, "width": 11, "normalize": True}
    ours = table(**spec, valid_height=6, valid_width=7, compute_dtype="float64")
    assert torch.equal(ours, ref.float())


@pytest.mark.parametrize(("height", "width", "valid_height", "valid_width"), GRIDS)
def test_deformable_detr_bit_exact(
    height: int, width: int, valid_height: int, valid_width: int
) -> None:
    from transformers.models.deformable_detr.modeling_deformable_detr import (
        DeformableDetrSinePositionEmbedding,
    )

    module = DeformableDetrSinePositionEmbedding(64, normalize=True)
    mask = pixel_mask(height, width, valid_height, valid_width)
    ref = module((1, 3, height, width), "cpu", torch.float32, mask=mask)[0]
    ours = table(
        style="detr",
        num_pos_feats=64,
        height=height,
        width=width,
        valid_height=valid_height,
        valid_width=valid_width,
        normalize=True,
        offset=-0.5,
    )
    assert torch.equal(ours, ref)


def test_grounding_dino_temperature_20_bit_exact() -> None:
    from transformers.models.grounding_dino.modeling_grounding_dino import (
        GroundingDinoSinePositionEmbedding,
    )

    config = types.SimpleNamespace(d_model=256, positional_embedding_temperature=20)
    module = GroundingDinoSinePositionEmbedding(config)
    ref = module(torch.zeros(1, 3, 9, 12), pixel_mask(9, 12, 6, 10))[0]
    spec = {"style": "detr", "num_pos_feats": 128, "height": 9, "width": 12, "normalize": True}
    assert torch.equal(table(**spec, valid_height=6, valid_width=10, temperature=20), ref)


def torch32_dino_hw(
    not_mask: torch.Tensor, feats: int, temperature_h: float, temperature_w: float, normalize: bool
) -> torch.Tensor:
    """IDEA-Research GroundingDINO `groundingdino/models/GroundingDINO/backbone/
    position_encoding.py` `PositionEmbeddingSineHW.forward` (scale 2 pi), transcribed (no
    installable package: it builds CUDA extensions), in torch float32: (B, 2F, H, W)."""
    y_embed = not_mask.cumsum(1, dtype=torch.float32)
    x_embed = not_mask.cumsum(2, dtype=torch.float32)
    if normalize:
        eps = 1e-6
        y_embed = y_embed / (y_embed[:, -1:, :] + eps) * (2 * math.pi)
        x_embed = x_embed / (x_embed[:, :, -1:] + eps) * (2 * math.pi)
    dim_tx = torch.arange(feats, dtype=torch.float32)
    dim_tx = temperature_w ** (2 * (torch.div(dim_tx, 2, rounding_mode="floor")) / feats)
    pos_x = x_embed[:, :, :, None] / dim_tx
    dim_ty = torch.arange(feats, dtype=torch.float32)
    dim_ty = temperature_h ** (2 * (torch.div(dim_ty, 2, rounding_mode="floor")) / feats)
    pos_y = y_embed[:, :, :, None] / dim_ty
    pos_x = torch.stack((pos_x[:, :, :, 0::2].sin(), pos_x[:, :, :, 1::2].cos()), dim=4).flatten(3)
    pos_y = torch.stack((pos_y[:, :, :, 0::2].sin(), pos_y[:, :, :, 1::2].cos()), dim=4).flatten(3)
    return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)


@pytest.mark.parametrize("normalize", [True, False])
def test_dino_per_axis_temperature_is_its_code_bit_for_bit(normalize: bool) -> None:
    """DINO's per-axis temperatures (`temperatureH` 20, `temperatureW` 40), which transformers
    has no module for: posenc's fp32 table is GroundingDINO's fp32 forward, bit for bit."""
    spec = {"style": "detr", "num_pos_feats": 64, "height": 10, "width": 14}
    spec |= {"valid_height": 7, "valid_width": 12, "temperature_h": 20, "temperature_w": 40}
    if normalize:
        spec["normalize"] = True
    ref = torch32_dino_hw(pixel_mask(10, 14, 7, 12).bool(), 64, 20, 40, normalize)[0]
    assert torch.equal(table(**spec), ref)


def test_dino_per_axis_temperature_golden() -> None:
    not_mask = pixel_mask(10, 14, 7, 12)[0].double().numpy()
    golden = golden_dino_hw(not_mask, 64, 20.0, 40.0, normalize=True)
    spec = {"style": "detr", "num_pos_feats": 64, "height": 10, "width": 14, "normalize": True}
    spec |= {"valid_height": 7, "valid_width": 12, "temperature_h": 20, "temperature_w": 40}
    assert_close(table(**spec), golden, angle_tol(2 * math.pi))
    assert_close(table(**spec, compute_dtype="float64"), golden, ATOL["float32"])
    golden = golden_dino_hw(not_mask, 64, 20.0, 40.0, normalize=False)
    del spec["normalize"]
    assert_close(table(**spec), golden, angle_tol(14))


# --- MAE: bit-exact against transformers ViTMAE, golden against the MAE repository ----------


def test_vitmae_encoder_and_decoder_position_embeddings_bit_exact() -> None:
    from transformers import ViTMAEConfig
    from transformers.models.vit_mae.modeling_vit_mae import ViTMAEDecoder, ViTMAEEmbeddings

    config = ViTMAEConfig(
        hidden_size=64,
        num_attention_heads=2,
        intermediate_size=32,
        image_size=32,
        patch_size=4,
        decoder_hidden_size=32,
        decoder_num_hidden_layers=1,
        decoder_num_attention_heads=2,
        decoder_intermediate_size=16,
    )
    embeddings = ViTMAEEmbeddings(config)
    embeddings.initialize_weights()
    ours = table(style="mae", dim=64, grid_height=8, grid_width=8, cls_token=True)
    assert torch.equal(ours, embeddings.position_embeddings[0].detach())
    decoder = ViTMAEDecoder(config, num_patches=64)
    decoder.initialize_weights(64)
    ours = table(style="mae", dim=32, grid_height=8, grid_width=8, cls_token=True)
    assert torch.equal(ours, decoder.decoder_pos_embed[0].detach())


def test_vitmae_builder_non_square_bit_exact() -> None:
    from transformers.models.vit_mae.modeling_vit_mae import (
        build_2d_sinusoidal_position_embedding,
    )

    ref = build_2d_sinusoidal_position_embedding(5, 7, embed_dim=32)
    ref = torch.cat([ref[:, 16:], ref[:, :16]], dim=1)  # ViTMAE's half rotation (MAE order)
    assert torch.equal(table(style="mae", dim=32, grid_height=5, grid_width=7), ref)


@pytest.mark.parametrize(("dim", "grid", "cls_token"), [(768, 14, True), (64, 5, False)])
def test_mae_repository_bit_for_bit(dim: int, grid: int, cls_token: bool) -> None:
    """The MAE repository builds its table in float64 numpy and loads it with
    `torch.from_numpy(pos_embed).float()`: posenc's table is that, bit for bit."""
    golden = golden_mae(dim, grid, cls_token)
    ours = table(style="mae", dim=dim, grid_height=grid, grid_width=grid, cls_token=cls_token)
    assert torch.equal(ours, torch.from_numpy(golden).float())


# --- timm: bit-exact against the library when it imports, golden always ---------------------


@pytest.fixture(scope="module")
def timm_sincos() -> Iterator[types.ModuleType]:
    yield from timm_layer("pos_embed_sincos")


@pytest.mark.parametrize(("height", "width", "dim"), [(14, 14, 768), (5, 9, 64), (1, 3, 8)])
@pytest.mark.parametrize("reverse_coord", [False, True])
@pytest.mark.parametrize("interleave", [False, True])
def test_timm_bit_exact(
    timm_sincos: types.ModuleType,
    height: int,
    width: int,
    dim: int,
    reverse_coord: bool,
    interleave: bool,
) -> None:
    ref = timm_sincos.build_sincos2d_pos_embed(
        [height, width], dim=dim, reverse_coord=reverse_coord, interleave_sin_cos=interleave
    )
    ours = table(
        style="timm",
        dim=dim,
        grid_height=height,
        grid_width=width,
        reverse_coord=reverse_coord,
        interleave_sin_cos=interleave,
    )
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("reverse_coord", [False, True])
@pytest.mark.parametrize("interleave", [False, True])
def test_timm_golden(reverse_coord: bool, interleave: bool) -> None:
    golden = golden_timm([6, 11], 64, reverse_coord, interleave)
    spec = {"style": "timm", "dim": 64, "grid_height": 6, "grid_width": 11}
    spec |= {"reverse_coord": reverse_coord, "interleave_sin_cos": interleave}
    assert_close(table(**spec), golden, angle_tol(10))
    assert_close(table(**spec, compute_dtype="float64"), golden, ATOL["float32"])


def test_output_dtype_is_cast_last() -> None:
    spec = {"style": "timm", "dim": 32, "grid_height": 4, "grid_width": 5}
    fp32 = table(**spec)
    for dtype in ("float16", "bfloat16"):
        ours = table(**spec, dtype=dtype)
        assert ours.dtype == getattr(torch, dtype)
        assert torch.equal(ours, fp32.to(ours.dtype))


# --- validation -----------------------------------------------------------------------------

DETR = {"style": "detr", "num_pos_feats": 8, "height": 4, "width": 5}
MAE = {"style": "mae", "dim": 16, "grid_height": 4, "grid_width": 4}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({**DETR, "num_pos_feats": 7}, "num_pos_feats"),
        ({**DETR, "valid_height": 5}, "valid_height"),
        ({**DETR, "valid_width": 6}, "valid_width"),
        ({**DETR, "valid_width": -1}, "valid_width"),
        ({**DETR, "height": 0}, "height"),
        ({**DETR, "width": -3}, "width"),
        ({**DETR, "temperature": float("nan")}, "temperature"),
        ({**DETR, "temperature": 0}, "temperature"),
        ({**DETR, "temperature": 20, "temperature_h": 20}, "temperature"),
        ({**DETR, "normalize": True, "scale": float("inf")}, "scale"),
        ({**DETR, "normalize": True, "eps": 0.0}, "eps"),
        ({**DETR, "scale": 1.0}, "scale"),
        ({**DETR, "offset": -0.5}, "offset"),
        ({**DETR, "dim": 16}, "dim"),
        ({"style": "detr", "num_pos_feats": 8, "height": 4}, "width"),
        ({**MAE, "dim": 18}, "dim"),
        ({**MAE, "dim": 0}, "dim"),
        ({**MAE, "grid_width": 0}, "grid_width"),
        ({**MAE, "reverse_coord": True}, "reverse_coord"),
        ({**MAE, "height": 4}, "height"),
        ({**MAE, "style": "timm", "dim": 30}, "dim"),
        ({**MAE, "style": "timm", "cls_token": True}, "cls_token"),
        ({**MAE, "style": "swin"}, "style"),
        ({**MAE, "dtype": "float64"}, "dtype"),
    ],
)
def test_invalid_specs_name_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"kind": "sinusoidal_2d", **fields})
    assert field in [p.field for p in info.value.problems], info.value


def test_outputs_do_not_allocate() -> None:
    spec = parse_spec(
        {
            "kind": "sinusoidal_2d",
            "style": "mae",
            "dim": 65536,
            "grid_height": 16384,
            "grid_width": 16384,
            "cls_token": True,
        }
    )
    assert spec.outputs()["embedding"].shape == (16384 * 16384 + 1, 65536)
    spec = parse_spec({"kind": "sinusoidal_2d", **DETR, "num_pos_feats": 65536})
    assert spec.outputs()["embedding"].shape == (131072, 4, 5)


def test_family_is_registered() -> None:
    assert FAMILIES["sinusoidal_2d"].spec_type is Sinusoidal2DSpec


# --- canonical forms ------------------------------------------------------------------------


def key(**fields: Any) -> str:
    return content_key(parse_spec({"kind": "sinusoidal_2d", **fields}))


def test_canonical_spellings() -> None:
    assert key(**DETR, temperature=20) == key(**DETR, temperature_h=20, temperature_w=20)
    assert key(**DETR) == key(**DETR, valid_height=4, valid_width=5, normalize=False)
    assert key(**DETR, valid_height=0, valid_width=3) == key(**DETR, valid_height=2, valid_width=0)
    assert key(**DETR, normalize=True) == key(**DETR, normalize=True, scale=2 * math.pi, eps=1e-6)
    assert key(**MAE) == key(**MAE, cls_token=False, temperature=10000, compute_dtype="float64")
    assert key(**MAE) != key(**MAE, compute_dtype="float32")
    assert key(**{**MAE, "style": "timm"}) == key(
        **{**MAE, "style": "timm"}, reverse_coord=False, interleave_sin_cos=False
    )


# --- properties -----------------------------------------------------------------------------


@st.composite
def specs_2d(draw: st.DrawFn) -> dict[str, Any]:
    style = draw(st.sampled_from(["detr", "mae", "timm"]))
    fields: dict[str, Any] = {"kind": "sinusoidal_2d", "style": style}
    if draw(st.booleans()):
        fields["compute_dtype"] = draw(st.sampled_from(["float32", "float64"]))
    if style == "detr":
        height, width = draw(st.integers(1, 12)), draw(st.integers(1, 12))
        fields |= {"num_pos_feats": 2 * draw(st.integers(1, 16)), "height": height, "width": width}
        if draw(st.booleans()):
            fields["valid_height"] = draw(st.integers(0, height))
            fields["valid_width"] = draw(st.integers(0, width))
        if draw(st.booleans()):
            fields["temperature_h"] = draw(st.floats(1.5, 1e5))
            fields["temperature_w"] = draw(st.floats(1.5, 1e5))
        if draw(st.booleans()):
            fields["normalize"] = True
            fields["scale"] = draw(st.floats(-20.0, 20.0))
            fields["offset"] = draw(st.sampled_from([0.0, -0.5]))
        return fields
    fields |= {
        "dim": 4 * draw(st.integers(1, 16)),
        "grid_height": draw(st.integers(1, 10)),
        "grid_width": draw(st.integers(1, 10)),
        "temperature": draw(st.floats(1.5, 1e5)),
    }
    if style == "mae":
        fields["cls_token"] = draw(st.booleans())
    else:
        fields["reverse_coord"] = draw(st.booleans())
        fields["interleave_sin_cos"] = draw(st.booleans())
    return fields


def unit_pairs(spec: Sinusoidal2DSpec, emb: torch.Tensor) -> torch.Tensor:
    """sin^2 + cos^2 of every (sin, cos) channel pair, as (N, pairs)."""
    c = spec.canonical()
    if c.style == "detr":
        flat = emb.flatten(1).T  # (H*W, 2F): per axis [s0, c0, s1, c1, ...]
        return flat[:, 0::2] ** 2 + flat[:, 1::2] ** 2
    if c.style == "mae" and c.cls_token:
        assert (emb[0] == 0).all()
        emb = emb[1:]
    q = int(c.dim or 0) // 4
    if c.style == "timm" and not c.interleave_sin_cos:
        return emb[:, : 2 * q] ** 2 + emb[:, 2 * q :] ** 2  # [sin y, sin x | cos y, cos x]
    blocks = emb.reshape(len(emb), 2, 2, q)  # [sin a, cos a, sin b, cos b]
    return blocks[:, :, 0] ** 2 + blocks[:, :, 1] ** 2


@settings(max_examples=100, deadline=None)
@given(specs_2d())
def test_tables_are_bounded_unit_pairs(fields: dict[str, Any]) -> None:
    spec = parse_spec(fields)
    assert isinstance(spec, Sinusoidal2DSpec)
    emb = compute(spec).tensors["embedding"]
    info = spec.outputs()["embedding"]
    assert tuple(emb.shape) == info.shape
    assert torch.isfinite(emb).all()
    assert emb.abs().max() <= 1.0
    norms = unit_pairs(spec, emb.double())
    assert ((norms - 1).abs() <= 4 * ATOL["float32"]).all()


@settings(max_examples=60, deadline=None)
@given(specs_2d(), st.randoms())
def test_canonical_key_is_stable(fields: dict[str, Any], rnd: random.Random) -> None:
    spec = parse_spec(fields)
    items = list(fields.items())
    rnd.shuffle(items)
    assert content_key(parse_spec(dict(items))) == content_key(spec)
    explicit = parse_spec(canonical_dict(spec))
    assert content_key(explicit) == content_key(spec)
    assert torch.equal(compute(explicit).tensors["embedding"], compute(spec).tensors["embedding"])
