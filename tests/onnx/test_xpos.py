"""xPos graphs: the tables (bit-identical in table mode, every layout), the rotation against
torchscale's own `apply_rotary_pos_emb` (torchscale 0.3.0's
module, vendored byte for byte in `tests/vendored`; bit for bit in float32), RotaryEmbedding-23 and
com.microsoft.RotaryEmbedding fed the pre-multiplied caches, the onnx reference evaluator, the
centre cancelling in q.k, and the range check."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from onnx.reference import ReferenceEvaluator

from posenc.encodings import compute, parse_spec
from posenc.encodings.xpos import XposSpec
from posenc.onnx import export, verify
from tests.onnx.cases import assert_close, run
from tests.tolerances import ATOL
from tests.vendored.torchscale.xpos_relative_position import apply_rotary_pos_emb


def xpos(**fields: Any) -> XposSpec:
    spec = parse_spec({"kind": "xpos", **fields})
    assert isinstance(spec, XposSpec)
    return spec


@pytest.mark.parametrize(
    "layout",
    [
        {},
        {"width": "half"},
        {"interleaved": False},
        {"packing": "factored"},
        {"packing": "factored", "width": "half", "position_offset": 9},
        {"centre": "none", "scale_base": 64.0, "max_positions": 300},
    ],
    ids=["full", "half", "rotate-half", "factored", "factored-half-offset", "uncentred"],
)
@pytest.mark.parametrize("mode", ["table", "compute"])
def test_cos_sin_equal_the_tables(layout: dict[str, Any], mode: str) -> None:
    spec = xpos(**{"head_dim": 12, "max_positions": 40, **layout})
    table = compute(spec).tensors
    first = spec.position_offset
    pos = torch.arange(first, first + spec.max_positions)[None]
    outputs = run(export(spec, "cos_sin", mode=mode), {"position_ids": pos})
    assert set(outputs) == set(table)
    peak = max(float(t.abs().max()) for t in table.values())
    for name, want in table.items():
        assert_close(
            outputs[name], want[None], 0.0 if mode == "table" else 2 * ATOL["float32"] * peak
        )


@pytest.mark.parametrize("role", ["query", "key"])
def test_decomposed_rotation_is_torchscale_bit_for_bit(role: str) -> None:
    spec = xpos(head_dim=16, max_positions=24, position_offset=8)
    factored = compute(xpos(**{**spec.model_dump(), "packing": "factored", "width": "half"}))
    cos, sin = factored.tensors["cos"], factored.tensors["sin"]  # (P, d/2)
    scale = factored.tensors["scale_q" if role == "query" else "scale_k"]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 24, 16, generator=gen)
    want = apply_rotary_pos_emb(x.reshape(6, 24, 16), sin, cos, scale).reshape(2, 3, 24, 16)
    pos = torch.arange(8, 32).expand(2, 24)
    y = run(export(spec, "rotary", role=role), {"x": x, "position_ids": pos})["y"]
    assert torch.equal(y, want)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("role", ["query", "key"])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("mode", ["table", "compute"])
def test_rotary_embedding_ops_apply_xpos_through_premultiplied_caches(
    mode: str, interleaved: bool, role: str, dtype: str
) -> None:
    spec = xpos(head_dim=8, max_positions=32, interleaved=interleaved, dtype=dtype)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 5, 8, generator=gen).to(getattr(torch, dtype))
    pos = torch.tensor([[0, 3, 9, 30, 31], [7, 1, 2, 4, 20]])
    decomposed = run(export(spec, "rotary", mode=mode, role=role), {"x": x, "position_ids": pos})
    atol = 4 * ATOL[dtype] * float(x.float().abs().max())
    model = export(spec, "rotary", mode=mode, role=role, op="onnx", opset=23)
    verify(model, spec)
    y = run(model, {"x": x, "position_ids": pos})["y"]
    assert_close(y, decomposed["y"], atol)
    contrib = export(spec, "rotary", mode=mode, role=role, op="contrib", num_heads=3)
    x3 = x.transpose(1, 2).reshape(2, 5, 24)
    y3 = run(contrib, {"x": x3, "position_ids": pos})["y"]
    assert_close(y3, decomposed["y"].transpose(1, 2).reshape(2, 5, 24), atol)
    if dtype == "float32" and mode == "table":
        feeds = {"x": x.numpy(), "position_ids": pos.numpy()}
        evaluated = torch.from_numpy(ReferenceEvaluator(model).run(None, feeds)[0])
        assert_close(evaluated, y, atol)


@pytest.mark.parametrize("mode", ["table", "compute"])
def test_the_centre_cancels_in_query_key_scores(mode: str) -> None:
    # torchscale's centre (ceil(T/2)) and none give the same scores; only magnitudes differ.
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 2, 12, 16, generator=gen), torch.randn(1, 2, 12, 16, generator=gen)
    pos = torch.arange(12)[None]
    scores = []
    for centre in ("torchscale", "none", 5):
        spec = xpos(head_dim=16, max_positions=12, centre=centre, scale_base=8.0)
        rq = run(export(spec, "rotary", mode=mode, role="query"), {"x": q, "position_ids": pos})
        rk = run(export(spec, "rotary", mode=mode, role="key"), {"x": k, "position_ids": pos})
        scores.append(rq["y"] @ rk["y"].transpose(-1, -2))
    peak = float(scores[0].abs().max())
    for other in scores[1:]:
        assert_close(other, scores[0], 16 * ATOL["float32"] * peak)
    # and the decay is relative: scale 1 on the diagonal means plain RoPE there
    rope = parse_spec({"kind": "rope", "head_dim": 16, "max_positions": 12, "interleaved": True})
    rq = run(export(rope, "rotary"), {"x": q, "position_ids": pos})["y"]
    rk = run(export(rope, "rotary"), {"x": k, "position_ids": pos})["y"]
    plain = rq @ rk.transpose(-1, -2)
    diagonal = torch.diagonal(scores[0], dim1=-2, dim2=-1)
    assert_close(diagonal, torch.diagonal(plain, dim1=-2, dim2=-1), 16 * ATOL["float32"] * peak)


def test_table_rejects_positions_outside_its_rows() -> None:
    spec = xpos(head_dim=8, max_positions=10, position_offset=4)
    model = export(spec, "rotary", role="key")
    x = torch.zeros(1, 1, 2, 8)
    run(model, {"x": x, "position_ids": torch.tensor([[4, 13]])})
    with pytest.raises(Exception, match=r"position_ids must lie in \[4, 14\)"):
        run(model, {"x": x, "position_ids": torch.tensor([[3, 5]])})
    with pytest.raises(Exception, match=r"position_ids must lie in \[4, 14\)"):
        run(export(spec, "cos_sin"), {"position_ids": torch.tensor([[14]])})


def test_compute_mode_has_no_length_limit() -> None:
    spec = xpos(head_dim=8, max_positions=16, centre=100, scale_base=4096.0)
    pos = torch.arange(180, 200)[None]
    outputs = run(export(spec, "cos_sin", mode="compute"), {"position_ids": pos})
    longer = compute(xpos(head_dim=8, max_positions=200, centre=100, scale_base=4096.0)).tensors
    for name, table in longer.items():
        assert_close(outputs[name], table[180:][None], 2 * ATOL["float32"] * 1.1)
