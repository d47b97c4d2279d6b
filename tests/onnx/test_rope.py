"""RoPE graphs: every scaling variant, every table layout, the length switches of LongRoPE and
dynamic NTK, the out-of-range error, the three rotary implementations, the reference evaluator."""

from __future__ import annotations

from typing import Any

import onnx
import pytest
import torch
from onnx.reference import ReferenceEvaluator

from posenc.encodings import compute, parse_spec
from posenc.encodings.rope import VARIANTS, RopeSpec
from posenc.onnx import UnsupportedExportError, export, metadata, verify
from posenc.onnx.graphs.rope import reference_rotary
from tests.onnx.cases import assert_close, run
from tests.tolerances import ATOL

LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0, 1.1, 1.3, 1.7],
    "long_factor": [2.0, 3.5, 5.0, 9.0],
    "original_max_position_embeddings": 24,
    "factor": 4.0,
}
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 24}

VARIANT_SPECS: dict[str, dict[str, Any]] = {
    "default": {"head_dim": 8, "max_positions": 48},
    "linear": {
        "head_dim": 8,
        "max_positions": 48,
        "rope_scaling": {"rope_type": "linear", "factor": 3.0},
    },
    "dynamic": {"head_dim": 8, "max_positions": 24, "rope_scaling": DYNAMIC},
    "yarn": {
        "head_dim": 16,
        "max_positions": 48,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 12,
            "mscale": 1.0,
            "mscale_all_dim": 0.8,
        },
    },
    "longrope": {"head_dim": 8, "max_positions": 48, "rope_scaling": LONGROPE},
    "llama3": {
        "head_dim": 16,
        "max_positions": 48,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    },
    "proportional": {
        "head_dim": 16,
        "max_positions": 48,
        "rope_scaling": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0},
    },
    "ntk_alpha": {
        "head_dim": 8,
        "max_positions": 48,
        "rope_scaling": {"rope_type": "ntk_alpha", "alpha": 3.0},
    },
}


def rope(**fields: Any) -> RopeSpec:
    spec = parse_spec({"kind": "rope", **fields})
    assert isinstance(spec, RopeSpec)
    return spec


def test_every_variant_has_a_case() -> None:
    assert set(VARIANT_SPECS) == set(VARIANTS)


@pytest.mark.parametrize("mode", ["table", "compute"])
@pytest.mark.parametrize("graph", ["cos_sin", "rotary"])
@pytest.mark.parametrize("variant", sorted(VARIANT_SPECS))
def test_variant_verifies(variant: str, graph: str, mode: str) -> None:
    spec = rope(**VARIANT_SPECS[variant])
    report = verify(export(spec, graph, mode=mode), spec)
    assert report.samples >= 1


@pytest.mark.parametrize("mode", ["table", "compute"])
@pytest.mark.parametrize(
    "layout",
    [
        {"width": "half"},
        {"width": "full"},
        {"width": "full", "interleaved": True},
        {"width": "full", "interleaved": True, "full_layout": "cat"},
        {"packing": "cos_sin"},
        {"packing": "cos_sin", "width": "full"},
        {"packing": "pairs"},
        {"packing": "pairs", "width": "full", "interleaved": True, "full_layout": "cat"},
        # torchtune reads float32 only (fp16 is refused).
        {"profile": "torchtune", "dtype": "float32"},
    ],
    ids=[
        "half",
        "full",
        "full-interleaved",
        "full-mla",
        "cos_sin",
        "cos_sin-full",
        "pairs",
        "pairs-mla",
        "torchtune",
    ],
)
def test_cos_sin_layouts_equal_the_table(layout: dict[str, Any], mode: str) -> None:
    spec = rope(**{"head_dim": 12, "max_positions": 20, "dtype": "float16", **layout})
    table = compute(spec).tensors
    outputs = run(export(spec, "cos_sin", mode=mode), {"position_ids": torch.arange(20)[None]})
    names = set(table) - {"inv_freq"}
    assert set(outputs) == names
    for name in names:
        assert_close(outputs[name], table[name][None], 0.0 if mode == "table" else ATOL["float16"])


def test_table_mode_is_bit_identical_to_the_served_table() -> None:
    spec = rope(**VARIANT_SPECS["llama3"], dtype="bfloat16")
    table = compute(spec).tensors
    pos = torch.tensor([[47, 0, 3], [5, 46, 11]])
    out = run(export(spec, "cos_sin", mode="table"), {"position_ids": pos})
    assert torch.equal(out["cos"], table["cos"][pos])
    assert torch.equal(out["sin"], table["sin"][pos])


@pytest.mark.parametrize("bad", [48, 1000, -1])
def test_table_rejects_positions_outside_the_table(bad: int) -> None:
    spec = rope(head_dim=8, max_positions=48)
    model = export(spec, "cos_sin", mode="table")
    with pytest.raises(Exception, match=r"position_ids must lie in \[0, 48\)") as info:
        run(model, {"position_ids": torch.tensor([[0, bad, 3]])})
    assert "mode 'compute'" in str(info.value)


def test_rotary_table_rejects_positions_outside_the_table() -> None:
    spec = rope(head_dim=8, max_positions=16)
    model = export(spec, "rotary", mode="table", op="contrib", opset=23)
    x = torch.zeros(1, 2, 2, 8)
    with pytest.raises(Exception, match=r"position_ids must lie in \[0, 16\)"):
        run(model, {"x": x, "position_ids": torch.tensor([[15, 16]])})


def test_compute_mode_has_no_length_limit() -> None:
    spec = rope(head_dim=8, max_positions=16)
    far = torch.tensor([[0, 16, 4095, 100000]])
    out = run(export(spec, "cos_sin", mode="compute"), {"position_ids": far})
    table = compute(spec.model_copy(update={"max_positions": 100001})).tensors
    assert_close(out["cos"], table["cos"][far], ATOL["float32"])
    assert_close(out["sin"], table["sin"][far], ATOL["float32"])


def _rows(spec: RopeSpec, seq_len: int, positions: torch.Tensor) -> dict[str, torch.Tensor]:
    """The core's table for a sequence of length seq_len, at `positions`."""
    sized = parse_spec(
        {**spec.model_dump(), "seq_len": seq_len, "max_positions": max(seq_len, spec.max_positions)}
    )
    table = compute(sized).tensors
    return {"cos": table["cos"][positions], "sin": table["sin"][positions]}


@pytest.mark.parametrize("mode", ["table", "compute"])
def test_longrope_switches_on_max_position_plus_one(mode: str) -> None:
    spec = rope(head_dim=8, max_positions=48, rope_scaling=LONGROPE)
    model = export(spec, "cos_sin", mode=mode)
    meta = metadata(model)
    assert '"longrope_switch_point":24' in meta["notes"]
    atol = 0.0 if mode == "table" else ATOL["float32"]
    short = torch.tensor([[0, 5, 23]])  # L = 24: short factors
    long = torch.tensor([[0, 5, 24]])  # L = 25: long factors, for every position
    out_short, out_long = run(model, {"position_ids": short}), run(model, {"position_ids": long})
    for name in ("cos", "sin"):
        assert_close(out_short[name], _rows(spec, 24, short)[name], atol)
        assert_close(out_long[name], _rows(spec, 25, long)[name], atol)
    assert not torch.equal(out_short["cos"][0, 1], out_long["cos"][0, 1])


def test_dynamic_ntk_recomputes_the_base_past_max_position_embeddings() -> None:
    spec = rope(head_dim=8, max_positions=24, rope_scaling=DYNAMIC)
    model = export(spec, "cos_sin", mode="compute")
    for length in (10, 24, 25, 300):
        pos = torch.tensor([[0, 7, length - 1]])
        out = run(model, {"position_ids": pos})
        want = _rows(spec, length, pos)
        # past the switch onnxruntime's fp32 pow may round the new base an ulp differently
        atol = ATOL["float32"] * (1 if length <= 24 else length)
        assert_close(out["cos"], want["cos"], atol)
        assert_close(out["sin"], want["sin"], atol)


def test_dynamic_table_longer_than_max_position_embeddings_is_refused() -> None:
    spec = rope(head_dim=8, max_positions=25, rope_scaling=DYNAMIC)
    with pytest.raises(UnsupportedExportError) as info:
        export(spec, "cos_sin", mode="table")
    assert info.value.problems[0].field == "mode"
    assert "compute" in info.value.problems[0].message


def _x(spec: RopeSpec, heads: int, seq: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    return (torch.rand(2, heads, seq, spec.head_dim, generator=gen) * 2 - 1).to(dtype)


ROTARY_SPECS = {
    "full": {"head_dim": 16, "max_positions": 32},
    "partial": {"head_dim": 16, "rotary_dim": 8, "max_positions": 32},
    "interleaved": {"head_dim": 16, "max_positions": 32, "interleaved": True},
    "partial-interleaved": {
        "head_dim": 16,
        "rotary_dim": 8,
        "interleaved": True,
        "max_positions": 32,
    },
    "longrope": {"head_dim": 8, "max_positions": 48, "rope_scaling": LONGROPE},
}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("heads", [None, 3])
@pytest.mark.parametrize("case", sorted(ROTARY_SPECS))
def test_rotary_implementations_agree(case: str, heads: int | None, dtype: str) -> None:
    spec = rope(**ROTARY_SPECS[case], dtype=dtype)
    x = _x(spec, 3, 5, getattr(torch, dtype))
    pos = torch.tensor([[0, 1, 2, 3, 4], [20, 21, 22, 23, 31]])
    want = reference_rotary(spec, x, pos)
    feed_x = x.transpose(1, 2).reshape(2, 5, -1) if heads else x
    if heads:
        want = want.transpose(1, 2).reshape(2, 5, -1)
    for op in ("decomposed", "onnx", "contrib"):
        if op == "contrib" and not heads and spec.rotary_dim != spec.head_dim:
            continue  # needs num_heads: refusal tested below
        model = export(spec, "rotary", op=op, opset=23, num_heads=heads, mode="compute")
        out = run(model, {"x": feed_x, "position_ids": pos})["y"]
        assert_close(out, want, 2 * ATOL[dtype])


@pytest.mark.parametrize("mode", ["table", "compute"])
@pytest.mark.parametrize("heads", [None, 2])
@pytest.mark.parametrize("case", ["full", "partial-interleaved", "longrope"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_rotary_embedding_23_agrees_with_the_reference_evaluator(
    case: str, heads: int | None, mode: str, dtype: str
) -> None:
    spec = rope(**ROTARY_SPECS[case], dtype=dtype)
    model = export(spec, "rotary", op="onnx", opset=23, mode=mode, num_heads=heads)
    assert any(n.op_type == "RotaryEmbedding" for n in model.graph.node)
    x = _x(spec, 2, 4, getattr(torch, dtype))
    pos = (
        torch.tensor([[0, 1, 2, 3], [30, 31, 40, 47]])
        if case == "longrope"
        else torch.tensor([[0, 1, 2, 3], [28, 29, 30, 31]])
    )
    feed_x = x.transpose(1, 2).reshape(2, 4, -1) if heads else x
    ort_y = run(model, {"x": feed_x, "position_ids": pos})["y"]
    ref = ReferenceEvaluator(model)
    (ref_y,) = ref.run(None, {"x": feed_x.numpy(), "position_ids": pos.numpy()})
    assert_close(ort_y, torch.from_numpy(ref_y), 2 * ATOL[dtype])


@pytest.mark.parametrize(
    ("fields", "options", "field"),
    [
        ({}, {"op": "onnx", "opset": 22}, "opset"),
        ({"dtype": "bfloat16"}, {"op": "onnx", "opset": 23}, "dtype"),
        ({"dtype": "bfloat16"}, {"op": "contrib"}, "dtype"),
        ({"rotary_dim": 8}, {"op": "contrib"}, "num_heads"),
        ({"max_positions": 1 << 24, "head_dim": 256}, {"mode": "table"}, "mode"),
    ],
)
def test_rotary_refusals_name_the_field(
    fields: dict[str, Any], options: dict[str, Any], field: str
) -> None:
    spec = rope(**{"head_dim": 16, "max_positions": 32, **fields})
    with pytest.raises(UnsupportedExportError) as info:
        export(spec, "rotary", **options)
    assert [p.field for p in info.value.problems] == [field]
    assert info.value.error_type == "unsupported_export"


def test_rotary_bfloat16_decomposed_runs_in_onnxruntime() -> None:
    spec = rope(head_dim=16, rotary_dim=8, max_positions=32, dtype="bfloat16")
    x = _x(spec, 2, 3, torch.bfloat16)
    pos = torch.tensor([[0, 1, 2], [29, 30, 31]])
    out = run(export(spec, "rotary", op="decomposed"), {"x": x, "position_ids": pos})["y"]
    assert out.dtype == torch.bfloat16
    assert_close(out, reference_rotary(spec, x, pos), 2 * ATOL["bfloat16"])


def test_models_load_in_onnxruntime_at_their_ir_version() -> None:
    spec = rope(head_dim=8, max_positions=8)
    for opset, ir in ((17, 8), (21, 10), (23, 11)):
        model = export(spec, "cos_sin", opset=opset)
        assert model.ir_version == ir
        onnx.checker.check_model(model, full_check=True)
        run(model, {"position_ids": torch.arange(8)[None]})
