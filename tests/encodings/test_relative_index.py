"""Relative position indices against timm (`gen_relative_position_index` in layers and in
models/beit.py), transformers (Swin, BEiT, SpeechT5 modules) and tensor2tensor's published Shaw
code, the bias gather against the modules (the table inline and by content key), validation and
properties."""

from __future__ import annotations

import ast
import json
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import BeitConfig
from transformers.models.beit.modeling_beit import BeitRelativePositionBias
from transformers.models.speecht5.modeling_speecht5 import SpeechT5RelativePositionalEncoding
from transformers.models.swin.modeling_swin import SwinRelativePositionBias

from posenc.encodings import SpecError, canonical_json, compute, content_key, parse_spec
from posenc.encodings.base import FAMILIES
from posenc.encodings.relative_index import MAX_HEADS, MAX_WEIGHTS, RelativeIndexSpec
from posenc.encodings.weights import TableStore, UnknownTableError, resolve_tables, table_key
from tests.encodings.timm_support import timm_layer

WINDOWS = [(7, 7), (12, 12), (24, 24), (12, 7), (3, 5), (1, 4), (2, 1), (1, 1)]


def spec(**kw: Any) -> RelativeIndexSpec:
    out = parse_spec({"kind": "relative_index", **kw})
    assert isinstance(out, RelativeIndexSpec)
    return out


def tensors(**kw: Any) -> dict[str, torch.Tensor]:
    return compute(spec(**kw)).tensors


def by_key(table: torch.Tensor, **kw: Any) -> dict[str, torch.Tensor]:
    """`tensors` of the key-only spec of `table`, bound from a store it was uploaded to."""
    store = TableStore()
    key = store.put(table)
    named = spec(
        relative_position_bias_table_key=key,
        relative_position_bias_table_shape=list(table.shape),
        **kw,
    )
    return compute(resolve_tables(named, store)).tensors


# --- timm, imported without its package init (which needs torchvision) --------------------------


@pytest.fixture(scope="module")
def timm_rel() -> Iterator[types.ModuleType]:
    yield from timm_layer("pos_embed_rel")


@pytest.fixture(scope="module")
def timm_beit_index(timm_rel: types.ModuleType) -> Callable[..., torch.Tensor]:
    """timm `models/beit.py` `gen_relative_position_index`, compiled from the installed file: the
    module itself imports timm.data (PIL) and cannot be imported here, so the function's own source
    is run with the names it uses."""
    root = Path(str(timm_rel.__file__)).parent.parent
    tree = ast.parse((root / "models" / "beit.py").read_text())
    node = next(
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name == "gen_relative_position_index"
    )
    namespace: dict[str, Any] = {"torch": torch, "Tuple": tuple, "ndgrid": timm_rel.ndgrid}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "beit.py", "exec"), namespace)
    fn: Callable[..., torch.Tensor] = namespace["gen_relative_position_index"]
    return fn


@pytest.mark.parametrize("window", WINDOWS)
def test_swin_equals_timm_and_transformers(
    timm_rel: types.ModuleType, window: tuple[int, int]
) -> None:
    ours = tensors(scheme="swin", window_size=list(window))["index"]
    assert torch.equal(ours, timm_rel.gen_relative_position_index(window))
    hf = SwinRelativePositionBias(num_heads=2, window_size=window).relative_position_index
    assert torch.equal(ours.view(-1), hf)
    assert ours.dtype == torch.int64


@pytest.mark.parametrize("window", WINDOWS)
def test_beit_equals_timm_both_functions_and_transformers(
    timm_rel: types.ModuleType,
    timm_beit_index: Callable[..., torch.Tensor],
    window: tuple[int, int],
) -> None:
    ours = tensors(scheme="beit", window_size=list(window))["index"]
    assert torch.equal(ours, timm_rel.gen_relative_position_index(window, class_token=True))
    assert torch.equal(ours, timm_beit_index(window))
    hf = BeitRelativePositionBias.generate_relative_position_index(window)
    assert torch.equal(ours, hf)
    nrd = spec(scheme="beit", window_size=list(window)).num_relative_distance()
    assert nrd == (2 * window[0] - 1) * (2 * window[1] - 1) + 3
    assert int(ours.max()) == nrd - 1


@pytest.mark.parametrize("window", [(7, 7), (3, 5)])
def test_swin_bias_equals_the_module(window: tuple[int, int]) -> None:
    torch.manual_seed(0)
    module = SwinRelativePositionBias(num_heads=3, window_size=window)
    with torch.no_grad():
        module.relative_position_bias_table.normal_()
    table = module.relative_position_bias_table.detach()
    out = tensors(
        scheme="swin", window_size=list(window), relative_position_bias_table=table.tolist()
    )
    assert torch.equal(out["bias"], module()[0].detach())
    assert torch.equal(by_key(table, scheme="swin", window_size=list(window))["bias"], out["bias"])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_swin_bias_is_cast_last(dtype: str) -> None:
    torch.manual_seed(2)
    module = SwinRelativePositionBias(num_heads=4, window_size=(12, 12))  # 4 x 144 x 144: 324 KiB
    with torch.no_grad():
        module.relative_position_bias_table.normal_()
    table = module.relative_position_bias_table.detach().tolist()
    out = tensors(scheme="swin", window_size=12, relative_position_bias_table=table, dtype=dtype)
    assert torch.equal(out["bias"], module()[0].detach().to(getattr(torch, dtype)))


@pytest.mark.parametrize("side", [2, 5, 7])
def test_beit_bias_equals_the_module(side: int) -> None:
    torch.manual_seed(1)
    config = BeitConfig(image_size=side * 4, patch_size=4, num_attention_heads=2)
    module = BeitRelativePositionBias(config)
    with torch.no_grad():
        module.relative_position_bias_table.normal_()
    table = module.relative_position_bias_table.detach()
    out = tensors(scheme="beit", window_size=side, relative_position_bias_table=table.tolist())
    # transformers resamples the table bilinearly to the same size first: an exact identity
    assert torch.equal(out["bias"], module((side, side))[0].detach())
    assert torch.equal(by_key(table, scheme="beit", window_size=side)["bias"], out["bias"])


def test_transformers_beit_forward_resamples_non_square_windows() -> None:
    """`BeitRelativePositionBias.forward` reshapes the table as (2Ww-1, 2Wh-1) and resizes it to
    (2Wh-1, 2Ww-1) before the gather: for a non-square window the bias is not `table[index]`
    (timm's BEiT, and this service, gather directly). Recorded so a change upstream shows up."""
    torch.manual_seed(2)
    module = BeitRelativePositionBias(
        BeitConfig(image_size=(12, 20), patch_size=4, num_attention_heads=2)
    )
    with torch.no_grad():
        module.relative_position_bias_table.normal_()
    table = module.relative_position_bias_table.detach()
    out = tensors(scheme="beit", window_size=[3, 5], relative_position_bias_table=table.tolist())
    gathered = table[out["index"]].permute(2, 0, 1)
    assert torch.equal(out["bias"], gathered)
    assert float((module((3, 5))[0].detach() - gathered).abs().max()) > 0.1


def shaw_t2t(length_q: int, length_k: int, max_relative_position: int) -> torch.Tensor:
    """tensor2tensor `common_attention._generate_relative_positions_matrix(..., cache=False)`,
    transcribed from the published TensorFlow code to torch."""
    if length_q == length_k:
        range_vec_q = range_vec_k = torch.arange(length_q)
    else:
        range_vec_k = torch.arange(length_k)
        range_vec_q = range_vec_k[-length_q:]
    distance_mat = range_vec_k[None, :] - range_vec_q[:, None]
    clipped = torch.clamp(distance_mat, -max_relative_position, max_relative_position)
    return clipped + max_relative_position


@pytest.mark.parametrize(("q", "k", "clip"), [(6, 6, 2), (9, 9, 16), (3, 10, 4), (1, 20, 3)])
def test_shaw_equals_tensor2tensor(q: int, k: int, clip: int) -> None:
    ours = tensors(
        scheme="shaw", query_length=q, key_length=k, query_offset=k - q, max_relative_position=clip
    )["index"]
    assert torch.equal(ours, shaw_t2t(q, k, clip))


@pytest.mark.parametrize(("length", "clip"), [(5, 2), (40, 16), (3, 1), (9, 100)])
def test_speecht5_equals_the_module(length: int, clip: int) -> None:
    module = SpeechT5RelativePositionalEncoding(dim=1, max_length=clip)  # type: ignore[no-untyped-call]
    with torch.no_grad():
        module.pe_k.weight.copy_(torch.arange(2 * clip, dtype=torch.float32)[:, None])
    hf = module(torch.zeros(1, length, 1))[..., 0].to(torch.int64)
    ours = tensors(scheme="speecht5", key_length=length, max_relative_position=clip)["index"]
    assert torch.equal(ours, hf)
    bias_table = module.pe_k.weight.detach().tolist()
    bias = tensors(
        scheme="speecht5",
        key_length=length,
        max_relative_position=clip,
        relative_position_bias_table=bias_table,
    )["bias"]
    assert torch.equal(bias[0], module(torch.zeros(1, length, 1))[..., 0].detach())


def test_lengths_default_like_t5_and_share_a_key() -> None:
    a = spec(scheme="shaw", max_relative_position=3, query_length=4, query_offset=6)
    b = spec(scheme="shaw", max_relative_position=3, key_length=10, query_offset=6)
    c = spec(scheme="shaw", max_relative_position=3, query_length=4, key_length=10, query_offset=6)
    assert content_key(a) == content_key(b) == content_key(c)
    assert a.outputs()["index"].shape == (4, 10)
    assert content_key(spec(scheme="swin", window_size=7)) == content_key(
        spec(scheme="swin", window_size=[7, 7])
    )
    assert '"window_size":[7,7]' in canonical_json(spec(scheme="swin", window_size=7))


def test_bias_dtype_and_outputs() -> None:
    s = spec(
        scheme="shaw",
        max_relative_position=1,
        key_length=5,
        relative_position_bias_table=[[1.0, -1.0], [2.0, -2.0], [3.0, -3.0]],
        dtype="bfloat16",
    )
    out = compute(s)
    for name, info in s.canonical().outputs().items():
        assert tuple(out.tensors[name].shape) == info.shape
        assert str(out.tensors[name].dtype).removeprefix("torch.") == info.dtype
    assert out.meta["num_relative_distance"] == 3
    assert torch.equal(out.tensors["bias"][1], -out.tensors["bias"][0])


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"scheme": "swin"}, "window_size"),
        ({"scheme": "swin", "window_size": [2, 2, 2]}, "window_size"),
        ({"scheme": "swin", "window_size": 0}, "window_size"),
        ({"scheme": "beit", "window_size": [100, 100]}, "window_size"),
        ({"scheme": "swin", "window_size": 3, "key_length": 4}, "key_length"),
        ({"scheme": "swin", "window_size": 3, "query_offset": 4}, "query_offset"),
        ({"scheme": "shaw", "key_length": 4}, "max_relative_position"),
        (
            {"scheme": "speecht5", "key_length": 4, "max_relative_position": 0},
            "max_relative_position",
        ),
        ({"scheme": "shaw", "max_relative_position": 2}, "key_length"),
        ({"scheme": "shaw", "max_relative_position": 2, "window_size": 3}, "window_size"),
        (
            {"scheme": "shaw", "max_relative_position": 2, "key_length": 3, "query_offset": 3},
            "query_length",
        ),
        ({"scheme": "swin", "window_size": 2, "dtype": "float16"}, "dtype"),
        (
            {"scheme": "swin", "window_size": 2, "relative_position_bias_table": [[0.0]] * 8},
            "relative_position_bias_table",
        ),
        (
            {
                "scheme": "shaw",
                "max_relative_position": 1,
                "key_length": 2,
                "relative_position_bias_table": [[0.0], [0.0, 1.0], [0.0]],
            },
            "relative_position_bias_table",
        ),
        ({"scheme": "window", "window_size": 2}, "scheme"),
        (
            {"scheme": "swin", "window_size": 1, "relative_position_bias_table": [[1e39]]},
            "relative_position_bias_table",
        ),
    ],
)
def test_bad_specs_name_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        spec(**kw)
    assert any(p.field.split(".")[0] == field for p in err.value.problems)


KEY = "ab" * 32
SWIN2 = {"scheme": "swin", "window_size": 2}
"""num_relative_distance (2*2 - 1)^2 = 9."""


@pytest.mark.parametrize(
    ("kw", "field", "says"),
    [
        (
            SWIN2
            | {
                "relative_position_bias_table": [[0.0]] * 9,
                "relative_position_bias_table_key": KEY,
                "relative_position_bias_table_shape": [9, 1],
            },
            "relative_position_bias_table",
            "at most one of",
        ),
        (
            SWIN2 | {"relative_position_bias_table_key": KEY},
            "relative_position_bias_table_shape",
            "num_relative_distance=9",
        ),
        (
            SWIN2
            | {
                "relative_position_bias_table_key": KEY,
                "relative_position_bias_table_shape": [8, 2],
            },
            "relative_position_bias_table_shape",
            "num_relative_distance=9",
        ),
        (
            {"scheme": "beit", "window_size": 2}
            | {
                "relative_position_bias_table_key": KEY,
                "relative_position_bias_table_shape": [9, 2],
            },
            "relative_position_bias_table_shape",
            "num_relative_distance=12",
        ),
        (
            SWIN2
            | {
                "relative_position_bias_table_key": KEY,
                "relative_position_bias_table_shape": [9, MAX_HEADS + 1],
            },
            "relative_position_bias_table_shape",
            f"1..{MAX_HEADS}",
        ),
        (
            {"scheme": "shaw", "max_relative_position": 100_000, "key_length": 4}
            | {
                "relative_position_bias_table_key": KEY,
                "relative_position_bias_table_shape": [200_001, 8],
            },
            "relative_position_bias_table_shape",
            f"at most {MAX_WEIGHTS} entries",
        ),
        (
            SWIN2
            | {
                "relative_position_bias_table_key": KEY,
                "relative_position_bias_table_shape": [9, 0],
            },
            "relative_position_bias_table_shape",
            "greater than or equal to 1",
        ),
        (
            SWIN2
            | {
                "relative_position_bias_table_key": "AB" * 32,
                "relative_position_bias_table_shape": [9, 2],
            },
            "relative_position_bias_table_key",
            "[0-9a-f]{64}",
        ),
        (
            SWIN2 | {"relative_position_bias_table_shape": [9, 2]},
            "relative_position_bias_table_shape",
            "only with relative_position_bias_table_key",
        ),
        (
            SWIN2
            | {
                "relative_position_bias_table": [[0.0, 1.0]] * 9,
                "relative_position_bias_table_shape": [9, 3],
            },
            "relative_position_bias_table_shape",
            "[9, 2]",
        ),
        (
            SWIN2 | {"dtype": "bfloat16"},
            "dtype",
            "relative_position_bias_table_key",
        ),
    ],
)
def test_bad_table_fields_name_the_field_and_range(
    kw: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(SpecError) as err:
        spec(**kw)
    (problem,) = err.value.problems
    assert problem.field.split(".")[0] == field
    assert says in problem.message


def table_of(s: RelativeIndexSpec, heads: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(s.num_relative_distance(), heads, generator=gen)


@pytest.mark.parametrize(
    "fields",
    [
        {"scheme": "swin", "window_size": [3, 4]},
        {"scheme": "beit", "window_size": 5},
        {"scheme": "shaw", "max_relative_position": 3, "key_length": 9, "query_offset": 2},
        {"scheme": "speecht5", "max_relative_position": 4, "query_length": 6},
    ],
    ids=lambda f: str(f["scheme"]),
)
def test_inline_and_key_only_share_the_key_and_the_bias(fields: dict[str, Any]) -> None:
    table = table_of(spec(**fields), heads=5)
    key = table_key(table)
    inline = spec(**fields, relative_position_bias_table=table.tolist(), dtype="float16")
    named = spec(
        **fields,
        relative_position_bias_table_key=key,
        relative_position_bias_table_shape=list(table.shape),
        dtype="float16",
    )
    assert content_key(inline) == content_key(named)
    assert canonical_json(inline) == canonical_json(named)
    canon = json.loads(canonical_json(inline))
    # the canonical form names the table by key and shape: not one float in it
    assert "relative_position_bias_table" not in canon
    assert canon["relative_position_bias_table_key"] == key
    assert canon["relative_position_bias_table_shape"] == list(table.shape)
    assert not [v for v in canon.values() if isinstance(v, float)]
    # outputs need no lookup: H from the shape
    assert named.canonical().outputs() == inline.canonical().outputs()
    assert named.outputs()["bias"].shape[0] == 5
    store = TableStore()
    with pytest.raises(UnknownTableError):
        resolve_tables(named, store)
    assert store.put(table) == key
    got = compute(resolve_tables(named, store))
    want = compute(inline)
    assert got.meta["key"] == want.meta["key"] == content_key(named)
    for name in ("index", "bias"):
        assert torch.equal(got.tensors[name], want.tensors[name])
    # the gather of the float32 table, cast last, as timm's and transformers' forward
    index = want.tensors["index"]
    gathered = table[index.view(-1)].view(*index.shape, -1).permute(2, 0, 1).to(torch.float16)
    assert torch.equal(want.tensors["bias"], gathered)


def test_a_key_only_spec_computed_unbound_is_unknown_table() -> None:
    named = spec(
        scheme="swin",
        window_size=2,
        relative_position_bias_table_key=KEY,
        relative_position_bias_table_shape=[9, 2],
    )
    with pytest.raises(UnknownTableError) as err:
        compute(named)
    assert err.value.error_type == "unknown_table"
    assert err.value.problems[0].field == "relative_position_bias_table_key"
    with pytest.raises(UnknownTableError) as err:
        resolve_tables(named, TableStore())
    assert err.value.problems[0].field == "relative_position_bias_table_key"


def test_the_index_alone_names_no_table() -> None:
    s = spec(scheme="beit", window_size=3)
    assert s.named_table_shape() is None
    assert s.num_heads is None
    assert set(s.outputs()) == {"index"}
    assert "relative_position_bias_table" not in canonical_json(s)
    assert resolve_tables(s, TableStore()) is s


def test_registered() -> None:
    assert FAMILIES["relative_index"].spec_type is RelativeIndexSpec
    assert FAMILIES["relative_index"].compute.__doc__


@settings(max_examples=50, deadline=None)
@given(wh=st.integers(1, 9), ww=st.integers(1, 9), beit=st.booleans())
def test_window_index_properties(wh: int, ww: int, beit: bool) -> None:
    s = spec(scheme="beit" if beit else "swin", window_size=[wh, ww])
    index = compute(s).tensors["index"]
    nrd = s.num_relative_distance()
    assert int(index.min()) == 0
    assert int(index.max()) == nrd - 1
    body = index[1:, 1:] if beit else index
    d = (2 * wh - 1) * (2 * ww - 1)
    # reversing a pair mirrors the offset through the centre of the table
    assert torch.equal(body + body.t(), torch.full_like(body, d - 1))
    assert torch.all(body.diagonal() == (d - 1) // 2)
    assert len(torch.unique(body)) == d


@settings(max_examples=50, deadline=None)
@given(
    q=st.integers(1, 12),
    extra=st.integers(0, 12),
    offset=st.integers(0, 20),
    clip=st.integers(0, 10),
)
def test_shaw_depends_on_the_clipped_distance_only(
    q: int, extra: int, offset: int, clip: int
) -> None:
    k = q + extra
    index = tensors(
        scheme="shaw", query_length=q, key_length=k, query_offset=offset, max_relative_position=clip
    )["index"]
    for i in range(q):
        for j in range(k):
            rel = j - (i + offset)
            assert int(index[i, j]) == max(-clip, min(clip, rel)) + clip


@pytest.mark.parametrize(("side", "stride"), [(14, 1), (14, 2), (7, 2), (5, 3), (4, 1), (1, 1)])
def test_levit_index_is_levits_attention_bias_idxs(side: int, stride: int) -> None:
    """scheme levit equals transformers' LevitAttention (stride 1) and LevitAttentionSubsample
    attention_bias_idxs, and num_relative_distance is the width of their attention_biases."""
    from transformers.models.levit.modeling_levit import LevitAttention, LevitAttentionSubsample

    fields: dict[str, Any] = {"kind": "relative_index", "scheme": "levit", "window_size": side}
    if stride != 1:
        fields["stride"] = stride
    spec = parse_spec(fields)
    out = (side - 1) // stride + 1
    module = (
        LevitAttention(16, 4, 2, 2, side)
        if stride == 1
        else LevitAttentionSubsample(16, 32, 4, 2, 2, stride, side, out)
    )
    assert torch.equal(compute(spec).tensors["index"], module.attention_bias_idxs)
    assert isinstance(spec, RelativeIndexSpec)
    assert spec.num_relative_distance() == module.attention_biases.shape[1]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"scheme": "swin", "window_size": 7, "stride": 2}, "stride"),
        ({"scheme": "shaw", "max_relative_position": 4, "key_length": 8, "stride": 2}, "stride"),
        ({"scheme": "levit", "window_size": [4, 5]}, "window_size"),
        ({"scheme": "levit", "window_size": 65}, "window_size"),
    ],
)
def test_levit_fields_are_validated(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"kind": "relative_index", **fields})
    assert field in [p.field for p in info.value.problems], info.value


def test_levit_stride_one_is_the_default() -> None:
    base = {"kind": "relative_index", "scheme": "levit", "window_size": 7}
    assert content_key(parse_spec({**base, "stride": 1})) == content_key(parse_spec(base))


@pytest.mark.parametrize(
    ("window", "pretrained"), [(7, [0, 0]), (16, [12, 12]), (8, [6, 6]), (1, None)]
)
def test_swinv2_index_coords_and_bias_are_swinv2s(
    window: int, pretrained: list[int] | None
) -> None:
    """scheme swinv2: `index` and `coords` equal Swinv2SelfAttention's relative_position_index
    and relative_coords_table, and the bias gathered from its MLP's output over `coords` is the
    (pre-sigmoid) relative_position_bias its forward builds."""
    from transformers import Swinv2Config
    from transformers.models.swinv2.modeling_swinv2 import Swinv2SelfAttention

    attention = Swinv2SelfAttention(Swinv2Config(), 32, 4, window, pretrained or [0, 0])
    fields: dict[str, Any] = {"kind": "relative_index", "scheme": "swinv2", "window_size": window}
    if pretrained is not None:
        fields["pretrained_window_size"] = pretrained
    tables = compute(parse_spec(fields)).tensors
    assert torch.equal(tables["index"], attention.relative_position_index)
    assert torch.equal(tables["coords"], attention.relative_coords_table.reshape(-1, 2))
    with torch.no_grad():
        mlp = attention.continuous_position_bias_mlp(tables["coords"])  # (R, H)
        theirs = attention.continuous_position_bias_mlp(attention.relative_coords_table)
        theirs = theirs.view(-1, 4)[attention.relative_position_index.view(-1)]
    bias = compute(parse_spec({**fields, "relative_position_bias_table": mlp.tolist()}))
    n = window * window
    assert torch.equal(bias.tensors["bias"], theirs.view(n, n, -1).permute(2, 0, 1))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        (
            {"scheme": "swin", "window_size": 7, "pretrained_window_size": [6, 6]},
            "pretrained_window_size",
        ),
        (
            {"scheme": "swinv2", "window_size": 7, "pretrained_window_size": [1, 1]},
            "pretrained_window_size",
        ),
        (
            {"scheme": "swinv2", "window_size": 7, "pretrained_window_size": [0, 6]},
            "pretrained_window_size",
        ),
        ({"scheme": "swinv2", "window_size": [7, 1]}, "window_size"),
    ],
)
def test_swinv2_fields_are_validated(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"kind": "relative_index", **fields})
    assert field in [p.field for p in info.value.problems], info.value
