"""xPos against torchscale's published `XPOS` (torchscale 0.3.0's
`torchscale/component/xpos_relative_position.py`, vendored byte for byte in `tests/vendored` and
held to the wheel's sha256: the package itself cannot join the lock), bit for bit on CPU, plus
layouts, the exact mode, validation and the centre/shift invariances."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.encodings import SpecError, canonical_json, compute, content_key, parse_spec
from posenc.encodings.base import FAMILIES
from posenc.encodings.xpos import XposSpec, xpos_rows
from tests.tolerances import ATOL
from tests.vendored.torchscale.xpos_relative_position import XPOS, rotate_every_two

# --- helpers ------------------------------------------------------------------------------------


def spec(**kw: Any) -> XposSpec:
    out = parse_spec({"kind": "xpos", **kw})
    assert isinstance(out, XposSpec)
    return out


def tables(**kw: Any) -> dict[str, torch.Tensor]:
    return compute(spec(**kw)).tensors


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """What a cache-based RoPE kernel computes with interleaved pairs: x*cos + rot(x)*sin."""
    return (x * cos) + (rotate_every_two(x) * sin)


@pytest.mark.parametrize("head_dim", [8, 64, 128])
@pytest.mark.parametrize(("length", "offset"), [(1, 0), (7, 0), (64, 0), (1, 63), (5, 20)])
def test_bit_exact_with_torchscale(head_dim: int, length: int, offset: int) -> None:
    torch.manual_seed(head_dim + length + offset)
    x = torch.randn(3, length, head_dim)
    xpos = XPOS(head_dim)
    t = tables(head_dim=head_dim, max_positions=length, position_offset=offset)
    assert torch.equal(rotate(x, t["cos_q"], t["sin_q"]), xpos(x, offset=offset))
    assert torch.equal(rotate(x, t["cos_k"], t["sin_k"]), xpos(x, offset=offset, downscale=True))


def test_decoding_step_matches_torchscale_attention_call() -> None:
    # torchscale MultiheadAttention with a KV cache of S keys: keys xpos(k, offset=0,
    # downscale=True) over S, the query xpos(q, offset=S-1) over one row.
    s, d = 33, 16
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, d), torch.randn(2, s, d)
    xpos = XPOS(d)
    keys = tables(head_dim=d, max_positions=s)
    step = tables(head_dim=d, max_positions=1, position_offset=s - 1)
    assert torch.equal(rotate(k, keys["cos_k"], keys["sin_k"]), xpos(k, downscale=True))
    assert torch.equal(rotate(q, step["cos_q"], step["sin_q"]), xpos(q, offset=s - 1))
    assert spec(head_dim=d, max_positions=1, position_offset=s - 1).resolved_centre() == 17


def test_factored_multiplies_to_premultiplied() -> None:
    base = {"head_dim": 32, "max_positions": 50, "position_offset": 3}
    pre = tables(**base)
    fac = tables(**base, packing="factored")
    assert torch.equal(fac["cos"] * fac["scale_q"], pre["cos_q"])
    assert torch.equal(fac["sin"] * fac["scale_q"], pre["sin_q"])
    assert torch.equal(fac["cos"] * fac["scale_k"], pre["cos_k"])
    assert torch.equal(fac["sin"] * fac["scale_k"], pre["sin_k"])


def test_layouts() -> None:
    base = {"head_dim": 16, "max_positions": 10}
    half = tables(**base, width="half")
    full = tables(**base)
    halves = tables(**base, interleaved=False)
    for name in ("cos_q", "sin_q", "cos_k", "sin_k"):
        assert half[name].shape == (10, 8)
        assert torch.equal(full[name], half[name].repeat_interleave(2, dim=-1))
        assert torch.equal(halves[name], torch.cat((half[name], half[name]), dim=-1))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_exact_mode_is_close_and_outputs_match(dtype: str) -> None:
    s = spec(head_dim=64, max_positions=200, dtype=dtype, precision="exact")
    exact = compute(s)
    ref = compute(spec(head_dim=64, max_positions=200, dtype=dtype))
    for name, info in s.canonical().outputs().items():
        t = exact.tensors[name]
        assert tuple(t.shape) == info.shape
        assert str(t.dtype).removeprefix("torch.") == info.dtype
        scale = float(ref.tensors[name].float().abs().max())
        close = torch.allclose(
            t.float(), ref.tensors[name].float(), rtol=0, atol=scale * ATOL[dtype] * 50
        )
        assert close, name


def test_centre_conventions_and_canonical_key() -> None:
    assert spec(head_dim=8, max_positions=7).resolved_centre() == 4
    assert spec(head_dim=8, max_positions=7, centre="floor_half").resolved_centre() == 3
    assert spec(head_dim=8, max_positions=7, centre="none").resolved_centre() == 0
    a = spec(head_dim=8, max_positions=7)
    b = spec(head_dim=8, max_positions=7, centre=4, scale_base=512)
    assert content_key(a) == content_key(b)
    assert '"centre":4' in canonical_json(a)
    meta = compute(a).meta
    assert meta["centre"] == 4


def test_centre_zero_is_the_papers_formula() -> None:
    t = tables(head_dim=4, max_positions=3, centre="none", packing="factored", width="half")
    zeta = (torch.tensor([0.0, 2.0]) + 1.6) / 5.6
    want = zeta[None, :].double() ** (torch.arange(3.0)[:, None].double() / 512)
    assert torch.allclose(t["scale_q"].double(), want, rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"head_dim": 7, "max_positions": 4}, "head_dim"),
        ({"head_dim": 8, "max_positions": 0}, "max_positions"),
        ({"head_dim": 8, "max_positions": 80000}, "max_positions"),
        ({"head_dim": 8, "max_positions": 40000, "centre": "none"}, "max_positions"),
        ({"head_dim": 8, "max_positions": 9000, "dtype": "float16"}, "max_positions"),
        ({"head_dim": 8, "max_positions": 4, "scale_base": 0}, "scale_base"),
        ({"head_dim": 8, "max_positions": 4, "gamma": -1}, "gamma"),
        ({"head_dim": 8, "max_positions": 4, "centre": "middle"}, "centre"),
        ({"head_dim": 8, "max_positions": 4, "packing": "pairs"}, "packing"),
        ({"head_dim": 8, "max_positions": 4, "width": "quarter"}, "width"),
    ],
)
def test_bad_specs_name_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        spec(**kw)
    assert any(p.field.split(".")[0] == field for p in err.value.problems)


def test_range_guard_matches_the_dtype() -> None:
    # |ln zeta_0| = ln 3.5: centred, fp32 holds about 70k rows and fp16 about 7.9k.
    for rows, dtype in ((70000, "float32"), (7900, "float16"), (70000, "bfloat16")):
        s = spec(head_dim=8, max_positions=rows, dtype=dtype)
        t = compute(s).tensors
        assert all(bool(torch.isfinite(v).all()) for v in t.values())
        assert all(bool((v.abs() > 0).any(dim=0).all()) for v in t.values())


def test_registered() -> None:
    assert FAMILIES["xpos"].spec_type is XposSpec


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 40),
    shift=st.integers(0, 300),
    centre=st.integers(-200, 400),
    seed=st.integers(0, 2**16),
)
def test_scores_depend_on_relative_position_only(
    n: int, shift: int, centre: int, seed: int
) -> None:
    """q_n . k_m after xPos is the same for any centre and any common shift of n and m."""
    d = 16
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, n, d, generator=gen, dtype=torch.float64)
    k = torch.randn(1, n, d, generator=gen, dtype=torch.float64)

    def scores(**kw: Any) -> torch.Tensor:
        t = tables(head_dim=d, max_positions=n, precision="exact", **kw)
        rq = rotate(q, t["cos_q"].double(), t["sin_q"].double())
        rk = rotate(k, t["cos_k"].double(), t["sin_k"].double())
        return rq @ rk.transpose(-1, -2)

    ref = scores()
    other = scores(position_offset=shift, centre=centre)
    assert torch.allclose(ref, other, rtol=1e-4, atol=1e-4)


# --- rows for given positions (the /v2 model's computed path) -----------------------------------

ROW_LAYOUTS = [
    pytest.param({}, id="premultiplied-full"),
    pytest.param({"packing": "factored", "width": "half"}, id="factored-half"),
    pytest.param({"interleaved": False, "dtype": "bfloat16"}, id="rotate-half-bf16"),
    pytest.param(
        {"packing": "factored", "precision": "exact", "dtype": "float16"}, id="exact-fp16"
    ),
    pytest.param({"precision": "exact", "width": "half", "centre": "floor_half"}, id="exact-half"),
    pytest.param({"centre": "none", "scale_base": 4096.0}, id="centre-none"),
]


@pytest.mark.parametrize("layout", ROW_LAYOUTS)
@pytest.mark.parametrize("head_dim", [4, 40, 128])
def test_rows_equal_the_rows_of_a_table_with_the_same_centre(
    layout: dict[str, Any], head_dim: int
) -> None:
    s = spec(head_dim=head_dim, max_positions=48, position_offset=100, **layout)
    c = s.resolved_centre()
    whole = tables(**{**layout, "head_dim": head_dim, "max_positions": 400, "centre": c})
    own = compute(s).tensors
    # inside the table, below position_offset and past its end; unsorted, repeated, single
    for positions in ([100, 147, 120, 120], [0, 3, 99, 148, 399, 250], [7], list(range(90, 160))):
        pos = torch.tensor(positions)
        rows = xpos_rows(s, pos)
        assert list(rows) == list(own)
        for name, t in rows.items():
            assert t.shape == (len(positions), own[name].shape[1])
            assert t.dtype == own[name].dtype
            assert torch.equal(t, whole[name][pos]), (positions, name)
    # the table itself is the rows of its own positions
    for name, t in xpos_rows(s, torch.arange(100, 148)).items():
        assert torch.equal(t, own[name])


def test_rows_use_the_specs_centre() -> None:
    s = spec(head_dim=16, max_positions=10, packing="factored")
    moved = spec(head_dim=16, max_positions=10, packing="factored", centre=s.resolved_centre() + 1)
    pos = torch.tensor([2, 30])
    assert torch.equal(xpos_rows(s, pos)["cos"], xpos_rows(moved, pos)["cos"])
    assert not torch.equal(xpos_rows(s, pos)["scale_q"], xpos_rows(moved, pos)["scale_q"])
    assert torch.equal(
        xpos_rows(s, torch.tensor([s.resolved_centre()]))["scale_q"], torch.ones(1, 16)
    )


@settings(max_examples=30, deadline=None)
@given(
    half=st.integers(2, 80),
    offset=st.integers(0, 3000),
    rows=st.integers(1, 300),
    centre=st.sampled_from(["torchscale", "floor_half", "none"]),
    exact=st.booleans(),
    data=st.data(),
)
def test_rows_match_table_rows_property(
    half: int, offset: int, rows: int, centre: str, exact: bool, data: st.DataObject
) -> None:
    kw: dict[str, Any] = {"head_dim": 2 * half, "precision": "exact" if exact else "reference"}
    s = spec(max_positions=rows, position_offset=offset, centre=centre, scale_base=8192.0, **kw)
    lo, hi = max(0, offset - 64), offset + rows + 64
    whole = tables(max_positions=hi - lo, position_offset=lo, centre=s.resolved_centre(),
                   scale_base=8192.0, **kw)  # fmt: skip
    pos = torch.tensor(data.draw(st.lists(st.integers(lo, hi - 1), min_size=1, max_size=40)))
    for name, t in xpos_rows(s, pos).items():
        assert torch.equal(t, whole[name][pos - lo]), name
