"""Learned tables resampled, against the real functions: timm `resample_abs_pos_embed`,
transformers `ViTEmbeddings` / `Dinov2Embeddings.interpolate_pos_encoding` (bit for bit), the
published DINOv2 scale-factor code (transcribed golden), 1-D linear; tables by key (the store
itself is tested in test_weights.py), content keys, validation and properties."""

from __future__ import annotations

import json
import math
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import Dinov2Config, ViTConfig
from transformers.models.dinov2.modeling_dinov2 import Dinov2Embeddings
from transformers.models.vit.modeling_vit import ViTEmbeddings

from posenc.encodings import SpecError, canonical_json, compute, content_key, parse_spec
from posenc.encodings.base import FAMILIES
from posenc.encodings.learned import MAX_INLINE_ENTRIES, LearnedSpec
from posenc.encodings.weights import TableStore, UnknownTableError, resolve_tables, table_key
from tests.encodings.timm_support import timm_layer


def spec(**kw: Any) -> LearnedSpec:
    out = parse_spec({"kind": "learned", **kw})
    assert isinstance(out, LearnedSpec)
    return out


def resampled(table: torch.Tensor, **kw: Any) -> torch.Tensor:
    return compute(spec(table=table.tolist(), **kw)).tensors["embedding"]


def random_table(rows: int, dim: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed))


# --- timm ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def timm_pos_embed() -> Iterator[types.ModuleType]:
    yield from timm_layer("pos_embed")


TIMM_CASES = [
    # (prefix, old grid or None for square, new grid, extra kwargs)
    (1, None, (6, 6), {}),
    (1, None, (3, 5), {}),
    (1, (8, 8), (3, 3), {}),  # downsampling: antialias matters
    (0, (3, 5), (4, 4), {}),
    (2, None, (5, 7), {"antialias": False}),
    (4, (6, 4), (2, 9), {"interpolation": "bilinear"}),
    (1, None, (7, 7), {"align_corners": True}),
    (1, (8, 8), (5, 3), {"interpolation": "bilinear", "align_corners": True}),
]


@pytest.mark.parametrize(("prefix", "old", "new", "extra"), TIMM_CASES)
def test_timm_bit_exact(
    timm_pos_embed: types.ModuleType,
    prefix: int,
    old: tuple[int, int] | None,
    new: tuple[int, int],
    extra: dict[str, Any],
) -> None:
    grid = old or (4, 4)
    table = random_table(prefix + grid[0] * grid[1], 12, seed=prefix)
    ref = timm_pos_embed.resample_abs_pos_embed(
        table[None],
        new_size=list(new),
        old_size=list(old) if old else None,
        num_prefix_tokens=prefix,
        **extra,
    )[0]
    kw: dict[str, Any] = {"method": "timm", "num_prefix_tokens": prefix, "new_grid": list(new)}
    if old:
        kw["grid"] = list(old)
    ours = resampled(table, **kw, **extra)
    assert torch.equal(ours, ref)


def test_timm_same_grid_is_the_table(timm_pos_embed: types.ModuleType) -> None:
    table = random_table(17, 8)
    ours = resampled(table, method="timm", new_grid=[4, 4])
    assert torch.equal(ours, table)
    assert torch.equal(ours, timm_pos_embed.resample_abs_pos_embed(table[None], [4, 4])[0])


# --- transformers ViT and DINOv2 (5.23: size=, bicubic, no antialias) ---------------------------


def vit_embeddings(side: int, dim: int, seed: int) -> ViTEmbeddings:
    config = ViTConfig(image_size=side * 2, patch_size=2, hidden_size=dim)
    module = ViTEmbeddings(config)
    with torch.no_grad():
        module.position_embeddings.copy_(random_table(side * side + 1, dim, seed)[None])
    return module


@pytest.mark.parametrize(("side", "new"), [(4, (6, 6)), (4, (3, 7)), (8, (3, 3)), (5, (5, 9))])
def test_vit_bit_exact(side: int, new: tuple[int, int]) -> None:
    module = vit_embeddings(side, 16, seed=side)
    emb = torch.zeros(1, 1 + new[0] * new[1], 16)
    with torch.no_grad():
        ref = module.interpolate_pos_encoding(emb, height=new[0] * 2, width=new[1] * 2)[0]
    table = module.position_embeddings.detach()[0]
    assert torch.equal(resampled(table, method="hf_vit", new_grid=list(new)), ref)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_vit_base_to_384_bit_exact(dtype: str) -> None:
    # vit-base's (197, 768) table to 24 x 24: a 1.7 MiB output, in a mapping of its own
    # (`memory.empty`) that the bicubic kernel writes through its channels-last view
    module = vit_embeddings(14, 768, seed=3)
    emb = torch.zeros(1, 1 + 24 * 24, 768)
    with torch.no_grad():
        ref = module.interpolate_pos_encoding(emb, height=48, width=48)[0]
    table = module.position_embeddings.detach()[0]
    ours = resampled(table, method="hf_vit", new_grid=[24, 24], dtype=dtype)
    assert ours.is_contiguous()
    assert torch.equal(ours, ref.to(getattr(torch, dtype)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    "extra",
    [{}, {"antialias": False}, {"interpolation": "bilinear"}, {"align_corners": True}],
)
def test_timm_on_cuda_equals_the_same_calls_on_cuda(
    timm_pos_embed: types.ModuleType, extra: dict[str, Any]
) -> None:
    table = random_table(1 + 16 * 16, 64, seed=5)
    ref = timm_pos_embed.resample_abs_pos_embed(
        table[None].cuda(), new_size=[24, 20], num_prefix_tokens=1, **extra
    )[0]
    s = spec(table=table.tolist(), method="timm", new_grid=[24, 20], **extra)
    assert torch.equal(compute(s, "cuda").tensors["embedding"], ref)


@pytest.mark.parametrize(("side", "new"), [(4, (6, 6)), (6, (4, 9)), (8, (3, 3))])
def test_dinov2_transformers_is_hf_vit(side: int, new: tuple[int, int]) -> None:
    config = Dinov2Config(image_size=side * 2, patch_size=2, hidden_size=16)
    module = Dinov2Embeddings(config)
    with torch.no_grad():
        module.position_embeddings.copy_(random_table(side * side + 1, 16, seed=7)[None])
    emb = torch.zeros(1, 1 + new[0] * new[1], 16)
    with torch.no_grad():
        ref = module.interpolate_pos_encoding(emb, height=new[0] * 2, width=new[1] * 2)[0]
    table = module.position_embeddings.detach()[0]
    assert torch.equal(resampled(table, method="hf_vit", new_grid=list(new)), ref)


def test_vit_same_grid_is_the_table() -> None:
    module = vit_embeddings(4, 8, seed=1)
    table = module.position_embeddings.detach()[0]
    with torch.no_grad():
        ref = module.interpolate_pos_encoding(torch.zeros(1, 17, 8), height=8, width=8)[0]
    assert torch.equal(resampled(table, method="hf_vit", new_grid=[4, 4]), ref)


def test_timm_and_vit_differ_by_antialias_when_downsampling() -> None:
    table = random_table(1 + 16 * 16, 8, seed=3)
    timm = resampled(table, method="timm", new_grid=[5, 5])
    vit = resampled(table, method="hf_vit", new_grid=[5, 5])
    no_aa = resampled(table, method="timm", new_grid=[5, 5], antialias=False)
    assert torch.equal(vit, no_aa)
    assert float((timm - vit).abs().max()) > 0.1


# --- DINOv2 legacy: the published scale-factor path (golden, transcribed) -----------------------


def dinov2_published(pos_embed: torch.Tensor, w0: int, h0: int) -> torch.Tensor:
    """facebookresearch/dinov2 `DinoVisionTransformer.interpolate_pos_encoding` with w, h already
    divided by the patch size (its `w0`, `h0`; `w` is the height axis, as its callers pass it)."""
    n = pos_embed.shape[1] - 1
    if n == w0 * h0 and w0 == h0:
        return pos_embed
    pos_embed = pos_embed.float()
    class_pos_embed = pos_embed[:, 0]
    patch_pos_embed = pos_embed[:, 1:]
    dim = pos_embed.shape[-1]
    w, h = w0 + 0.1, h0 + 0.1
    patch_pos_embed = F.interpolate(
        patch_pos_embed.reshape(1, int(math.sqrt(n)), int(math.sqrt(n)), dim).permute(0, 3, 1, 2),
        scale_factor=(float(w / math.sqrt(n)), float(h / math.sqrt(n))),
        mode="bicubic",
    )
    assert int(w) == patch_pos_embed.shape[-2]
    assert int(h) == patch_pos_embed.shape[-1]
    patch_pos_embed = patch_pos_embed.permute(0, 2, 3, 1).view(1, -1, dim)
    return torch.cat((class_pos_embed.unsqueeze(0), patch_pos_embed), dim=1)


@pytest.mark.parametrize(
    ("side", "new"), [(4, (6, 6)), (16, (37, 37)), (8, (3, 5)), (37, (16, 16))]
)
def test_dinov2_legacy_equals_the_published_code(side: int, new: tuple[int, int]) -> None:
    table = random_table(1 + side * side, 8, seed=side)
    ref = dinov2_published(table[None], *new)[0]
    ours = resampled(table, method="dinov2_legacy", new_grid=list(new))
    assert torch.equal(ours, ref)
    size_path = resampled(table, method="hf_vit", new_grid=list(new))
    assert not torch.equal(ours, size_path)  # the +0.1 shifts the sampling grid


# --- 1-D linear ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("prefix", "old", "new"), [(0, 512, 1024), (2, 514, 300), (0, 7, 7)])
@pytest.mark.parametrize("align", [False, True])
def test_linear_1d(prefix: int, old: int, new: int, align: bool) -> None:
    table = random_table(prefix + old, 6, seed=old)
    ours = resampled(
        table, method="linear_1d", num_prefix_tokens=prefix, new_length=new, align_corners=align
    )
    body = F.interpolate(table[prefix:].t()[None], size=new, mode="linear", align_corners=align)
    assert torch.equal(ours, torch.cat((table[:prefix], body[0].t())))
    assert ours.shape == (prefix + new, 6)


def test_linear_1d_align_corners_keeps_the_ends() -> None:
    table = random_table(10, 4)
    out = resampled(table, method="linear_1d", new_length=37, align_corners=True)
    assert torch.allclose(out[0], table[0], atol=1e-6)
    assert torch.allclose(out[-1], table[-1], atol=1e-6)


# --- keys and resolution (the key formula and the store: test_weights.py) ----------------------


def test_inline_and_uploaded_share_one_key_and_table() -> None:
    table = random_table(1 + 9, 4)
    inline = spec(method="timm", table=table.tolist(), new_grid=[5, 5])
    store = TableStore()
    key = store.put(table[None])  # a checkpoint's (1, N, D) is accepted
    by_key = spec(method="timm", table_key=key, table_shape=[10, 4], new_grid=[5, 5])
    assert content_key(inline) == content_key(by_key)
    assert canonical_json(inline) == canonical_json(by_key)
    assert '"table":' not in canonical_json(inline)
    resolved = resolve_tables(by_key, store)
    assert torch.equal(compute(resolved).tensors["embedding"], compute(inline).tensors["embedding"])
    assert compute(resolved).meta["table_key"] == key


def test_unresolved_and_unknown_keys() -> None:
    key = "0" * 64
    s = spec(method="linear_1d", table_key=key, table_shape=[4, 2], new_length=8)
    with pytest.raises(UnknownTableError) as err:
        compute(s)
    assert err.value.error_type == "unknown_table"
    assert err.value.problems[0].field == "table_key"
    with pytest.raises(UnknownTableError):
        resolve_tables(s, TableStore())


def test_resolving_an_inline_spec_stores_its_table() -> None:
    table = random_table(8, 2)
    store = TableStore()
    inline = spec(method="linear_1d", table=table.tolist(), new_length=16)
    assert resolve_tables(inline, store) is inline
    key = table_key(table)
    assert key in store
    canonical_only = parse_spec(json.loads(canonical_json(inline)))
    assert torch.equal(
        compute(resolve_tables(canonical_only, store)).tensors["embedding"],
        compute(inline).tensors["embedding"],
    )


def test_stored_shape_mismatch_names_table_shape() -> None:
    table = random_table(6, 4)
    store = TableStore()
    key = store.put(table)
    wrong_shape = spec(method="linear_1d", table_key=key, table_shape=[4, 6], new_length=3)
    with pytest.raises(SpecError) as err:
        resolve_tables(wrong_shape, store)
    assert err.value.problems[0].field == "table_shape"


# --- validation -----------------------------------------------------------------------------------

T17 = [[0.0, 1.0]] * 17
T18 = [[0.0, 1.0]] * 18
TIMM = {"method": "timm", "new_grid": [2, 2]}
KEY = {"table_key": "a" * 64}


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (TIMM, "table"),
        (TIMM | KEY | {"table": T17}, "table"),
        (TIMM | KEY, "table_shape"),
        (TIMM | {"table_key": "XYZ", "table_shape": [17, 2]}, "table_key"),
        ({"method": "timm", "table": T17}, "new_grid"),
        (TIMM | {"table": T18}, "grid"),
        (TIMM | {"table": T17, "grid": [3, 5]}, "grid"),
        ({"method": "hf_vit", "table": T18, "grid": [1, 17], "new_grid": [2, 2]}, "grid"),
        (
            {"method": "hf_vit", "table": T18, "num_prefix_tokens": 2, "new_grid": [4, 4]},
            "num_prefix_tokens",
        ),
        ({"method": "hf_vit", "table": T17, "new_grid": [2, 2], "antialias": False}, "antialias"),
        (TIMM | {"table": T17, "new_length": 3}, "new_length"),
        ({"method": "linear_1d", "table": T17}, "new_length"),
        (
            {"method": "linear_1d", "table": T17, "new_length": 4, "num_prefix_tokens": 17},
            "num_prefix_tokens",
        ),
        (
            {"method": "dinov2_legacy", "table": T17, "new_grid": [2, 2], "interpolate_offset": 1},
            "interpolate_offset",
        ),
        (TIMM | {"table": [[0.0, 1.0], [2.0]]}, "table"),
        (TIMM | {"table": [[1e39, 0.0]] * 2}, "table"),
        (TIMM | {"table": T17, "new_grid": [0, 2]}, "new_grid"),
        (TIMM | {"table": T17, "table_shape": [16, 2]}, "table_shape"),
        ({"method": "bilinear", "table": T17, "new_grid": [2, 2]}, "method"),
    ],
)
def test_bad_specs_name_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        spec(**kw)
    assert any(p.field.split(".")[0] == field for p in err.value.problems)


def test_oversized_inline_table_is_refused_without_echoing_it() -> None:
    rows = MAX_INLINE_ENTRIES // 1024 + 1
    with pytest.raises(SpecError) as err:
        spec(method="linear_1d", table=[[0.0] * 1024] * rows, new_length=4)
    problem = err.value.problems[0]
    assert problem.field == "table"
    assert problem.value == [rows, 1024]


def test_registered_outputs_and_dtype() -> None:
    assert FAMILIES["learned"].spec_type is LearnedSpec
    s = spec(method="timm", table=T17, new_grid=[3, 2], dtype="bfloat16")
    out = compute(s).tensors["embedding"]
    info = s.canonical().outputs()["embedding"]
    assert tuple(out.shape) == info.shape == (7, 2)
    assert out.dtype == torch.bfloat16
    c = s.canonical()
    assert (c.num_prefix_tokens, c.grid, c.antialias, c.interpolation) == (
        1,
        [4, 4],
        True,
        "bicubic",
    )


@settings(max_examples=30, deadline=None)
@given(
    method=st.sampled_from(["timm", "hf_vit", "dinov2_legacy", "linear_1d"]),
    side=st.integers(2, 9),
    new_h=st.integers(1, 12),
    new_w=st.integers(1, 12),
    value=st.floats(-3, 3),
)
def test_constant_tables_stay_constant(
    method: str, side: int, new_h: int, new_w: int, value: float
) -> None:
    """Interpolation weights sum to one: a constant table resamples to the same constant, and the
    prefix rows come through untouched."""
    rows = side * side
    table = torch.full((1 + rows, 3), value)
    table[0] = torch.tensor([7.0, -7.0, 0.5])
    kw: dict[str, Any] = {"method": method}
    if method == "linear_1d":
        kw |= {"num_prefix_tokens": 1, "new_length": new_h * new_w}
    else:
        kw["new_grid"] = [new_h, new_w]
    out = resampled(table, **kw)
    assert out.shape == (1 + new_h * new_w, 3)
    assert torch.equal(out[0], table[0])
    assert torch.allclose(out[1:], torch.full_like(out[1:], value), atol=1e-5)
