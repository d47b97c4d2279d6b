"""CoPE graphs against the torch reference `posenc.encodings.cope` (RAM's `ContextPosSelfAttn` and
the paper's listing): both variants, every mask, several shapes, float32 and float16; the
inclusive reverse CumSum, the clamp, the causal mask, pos_emb as initializer or input, the ONNX
reference evaluator, and a merge in front of a consumer's softmax."""

from __future__ import annotations

import math
from typing import Any

import onnx
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from posenc.encodings.cope import cope_attention, cope_logits, cope_positions
from posenc.onnx import IR_VERSIONS, CopeSpec, ExportError, export, parse_export_spec, verify
from posenc.onnx.graphs.cope import reference_mask, tolerance
from tests.onnx.cases import assert_close, run
from tests.tolerances import ATOL

SHAPES = {
    "square": (2, 2, 9, 9, 16),
    "decode": (1, 4, 3, 17, 8),
    "one query": (3, 1, 1, 12, 32),
    "cross": (1, 2, 6, 4, 64),
}
"""(B, N, S, T, d): S = T; a decode step with queries the last keys; one query; S > T (mask
none only: a causal mask would leave rows without keys)."""


def cope(**fields: Any) -> CopeSpec:
    spec = parse_export_spec({"kind": "cope", **fields})
    assert isinstance(spec, CopeSpec)
    return spec


def _inputs(
    spec: CopeSpec, shape: tuple[int, ...], seed: int = 0
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Feeds for the logits graph (pos_emb as input when the spec has none) and pos_emb."""
    b, n, s, t, d = shape
    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, spec.dtype)
    feeds = {
        "q": torch.randn(b, n, s, d, generator=gen).to(dtype),
        "k": torch.randn(b, n, t, d, generator=gen).to(dtype),
    }
    if spec.pos_emb is None:
        emb = torch.randn(d, spec.npos_max + 2, generator=gen).to(dtype)
        feeds["pos_emb"] = emb
    else:
        emb = torch.tensor(spec.pos_emb)
    if spec.mask == "input":
        mask = torch.rand(b, n, s, t, generator=gen) < 0.6
        mask[..., -1] = True
        feeds["attention_mask"] = mask
    return feeds, emb


CASES = [
    (shape, variant, mask, dtype)
    for shape in sorted(SHAPES)
    for variant in ("repo", "paper")
    for mask in ("causal", "none", "input")
    for dtype in ("float32", "float16")
    if not (shape == "cross" and mask == "causal")
]


@pytest.mark.parametrize(("shape", "variant", "mask", "dtype"), CASES)
def test_logits_equal_the_reference(shape: str, variant: str, mask: str, dtype: str) -> None:
    d = SHAPES[shape][-1]
    spec = cope(head_dim=d, npos_max=5, variant=variant, mask=mask, dtype=dtype)
    model = export(spec, "logits", opset=23)
    feeds, emb = _inputs(spec, SHAPES[shape])
    out = run(model, feeds)["logits"]
    q, k, e = feeds["q"].float(), feeds["k"].float(), emb.float()[:, : spec.npos_max]
    want = cope_logits(q, k, e, spec.npos_max, spec.variant, reference_mask(spec, feeds))
    atol = tolerance(spec, q, k, e, dtype=dtype)
    assert_close(out, want.to(out.dtype), atol)
    if dtype == "float32":
        # The bound is not vacuous: the graph is within a few ulp of the magnitudes.
        finite = torch.isfinite(want)
        err = float((out - want)[finite].abs().max())
        assert err <= 64 * ATOL["float32"] * (1 + float(want[finite].abs().max()))


@pytest.mark.parametrize("variant", ["repo", "paper"])
def test_attention_is_softmax_of_the_logits_graph(variant: str) -> None:
    spec = cope(head_dim=8, npos_max=6, variant=variant)
    feeds, emb = _inputs(spec, SHAPES["decode"])
    v = torch.randn(1, 4, 17, 5, generator=torch.Generator().manual_seed(3))
    logits = run(export(spec, "logits"), feeds)["logits"]
    y = run(export(spec, "attention"), {**feeds, "v": v})["y"]
    # Given the logits, only Softmax and MatMul remain: a few ulp of max |v|.
    assert_close(y, torch.softmax(logits, dim=-1) @ v, 4 * ATOL["float32"] * float(v.abs().max()))
    want = cope_attention(
        feeds["q"], feeds["k"], v, emb, spec.npos_max, variant, reference_mask(spec, feeds)
    )
    assert_close(y, want, 64 * ATOL["float32"] * float(v.abs().max()))


def test_saturated_gates_reach_the_clamp() -> None:
    d, t, npos = 16, 24, 7
    spec = cope(head_dim=d, npos_max=npos, mask="none")
    unit = torch.nn.functional.normalize(
        torch.randn(d, generator=torch.Generator().manual_seed(1)), dim=0
    )
    q = k = (unit * 4 * d**0.25).expand(1, 1, t, d).contiguous()  # q.k / sqrt(d) = 16
    emb = torch.randn(d, npos)
    gates = torch.sigmoid(q @ k.transpose(-1, -2) / math.sqrt(d))
    positions = cope_positions(gates, npos)
    assert float(positions.max()) == npos - 1  # clamped ...
    assert float(positions[..., -3:].min()) < 3  # ... and counted down to the last key
    out = run(export(spec, "logits"), {"q": q, "k": k, "pos_emb": emb})["logits"]
    want = cope_logits(q, k, emb, npos, "repo")
    assert_close(out, want, tolerance(spec, q, k, emb, dtype="float32"))


def test_cumsum_is_the_inclusive_reverse_sum() -> None:
    spec = cope(head_dim=16, npos_max=12)
    model = export(spec, "logits")
    (node,) = [n for n in model.graph.node if n.op_type == "CumSum"]
    attrs = {a.name: a.i for a in node.attribute}
    assert attrs == {"exclusive": 0, "reverse": 1}
    for name in ("exclusive", "reverse"):
        tampered = onnx.ModelProto()
        tampered.CopyFrom(model)
        (cumsum,) = [n for n in tampered.graph.node if n.op_type == "CumSum"]
        for a in cumsum.attribute:
            if a.name == name:
                a.i = 1 - a.i
        with pytest.raises(ExportError, match="beyond tolerance"):
            verify(tampered, spec)


@pytest.mark.parametrize("variant", ["repo", "paper"])
def test_the_onnx_reference_evaluator_agrees(variant: str) -> None:
    # onnx's ReferenceEvaluator implements the operator specifications (CumSum reverse and
    # exclusive, GatherElements, Where) independently of onnxruntime.
    spec = cope(head_dim=8, npos_max=4, variant=variant, mask="causal")
    model = export(spec, "logits", opset=23)
    feeds, emb = _inputs(spec, SHAPES["decode"])
    evaluated = ReferenceEvaluator(model).run(None, {k: v.numpy() for k, v in feeds.items()})[0]
    want = cope_logits(feeds["q"], feeds["k"], emb[:, :4], 4, variant, reference_mask(spec, feeds))
    got = torch.from_numpy(evaluated)
    atol = tolerance(spec, feeds["q"], feeds["k"], emb[:, :4], dtype="float32")
    assert_close(got, want, atol)
    assert_close(got, run(model, feeds)["logits"], atol)  # Sigmoid is numpy's here


def test_causal_mask_is_the_lower_triangle_aligned_to_the_last_keys() -> None:
    causal = cope(head_dim=8, npos_max=6, mask="causal")
    explicit = cope(head_dim=8, npos_max=6, mask="input")
    feeds, _ = _inputs(causal, (2, 3, 4, 10, 8))
    tril = torch.ones(4, 10, dtype=torch.bool).tril(6)[None, None]  # key j <= 6 + i
    a = run(export(causal, "logits"), feeds)["logits"]
    b = run(export(explicit, "logits"), {**feeds, "attention_mask": tril})["logits"]
    assert torch.equal(a, b)
    assert torch.equal(torch.isinf(a[0, 0]), ~tril[0, 0])


def test_pos_emb_initializer_equals_pos_emb_input() -> None:
    emb = torch.randn(8, 6, generator=torch.Generator().manual_seed(4))
    inline = cope(head_dim=8, npos_max=5, pos_emb=emb.tolist(), variant="paper")
    as_input = cope(head_dim=8, npos_max=5, variant="paper")
    feeds, _ = _inputs(as_input, SHAPES["decode"])
    model = export(inline, "logits")
    assert [i.name for i in model.graph.input] == ["q", "k"]
    assert list(next(i for i in model.graph.initializer if i.name == "pos_emb").dims) == [8, 5]
    a = run(model, {"q": feeds["q"], "k": feeds["k"]})["logits"]
    b = run(export(as_input, "logits"), {**feeds, "pos_emb": emb})["logits"]
    assert torch.equal(a, b)


def test_float16_graph_is_closer_to_exact_than_a_float16_reference() -> None:
    # The graph computes in float32 and rounds once; the reference run in float16 accumulates
    # the positions in float16 too.
    spec = cope(head_dim=64, npos_max=40, mask="causal", dtype="float16")
    feeds, emb = _inputs(spec, (1, 2, 48, 48, 64))
    q, k = feeds["q"], feeds["k"]
    mask = reference_mask(spec, feeds)
    out = run(export(spec, "logits"), feeds)["logits"].double()
    exact = cope_logits(q.double(), k.double(), emb.double()[:, :40], 40, "repo", mask)
    half = cope_logits(q, k, emb[:, :40], 40, "repo", mask).double()
    finite = torch.isfinite(exact)
    graph_error = float((out - exact)[finite].abs().max())
    half_error = float((half - exact)[finite].abs().max())
    assert graph_error <= half_error
    assert graph_error <= ATOL["float16"] * (1 + float(exact[finite].abs().max()))


def test_logits_merge_in_front_of_a_consumer_softmax() -> None:
    spec = cope(head_dim=16, npos_max=9)
    served = export(spec, "logits", opset=23)
    t = TensorProto.FLOAT
    consumer = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("Softmax", ["scores"], ["weights"], axis=-1),
                helper.make_node("MatMul", ["weights", "v"], ["out"]),
            ],
            "attend",
            [
                helper.make_tensor_value_info("scores", t, ["B", "N", "S", "T"]),
                helper.make_tensor_value_info("v", t, ["B", "N", "T", 8]),
            ],
            [helper.make_tensor_value_info("out", t, ["B", "N", "S", 8])],
        ),
        opset_imports=[helper.make_opsetid("", 23)],
        ir_version=IR_VERSIONS[23],
    )
    merged = onnx.compose.merge_models(served, consumer, io_map=[("logits", "scores")])
    feeds, emb = _inputs(spec, SHAPES["square"])
    v = torch.randn(2, 2, 9, 8, generator=torch.Generator().manual_seed(5))
    out = run(merged, {**feeds, "v": v})["out"]
    want = cope_attention(
        feeds["q"], feeds["k"], v, emb[:, :9], 9, "repo", reference_mask(spec, feeds)
    )
    assert_close(out, want, 64 * ATOL["float32"] * float(v.abs().max()))


def test_float64_cumsum_is_torch_cumsum_bit_for_bit() -> None:
    # Why the graph sums in float64: torch's CPU cumsum accumulates float32 in double, so Cast ->
    # CumSum(double) -> Cast equals it exactly, while a float32 CumSum drifts by ~1e-4 at T = 300.
    t = TensorProto
    axis = helper.make_tensor("axis", t.INT64, [], [-1])

    def model(nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
        graph = helper.make_graph(
            nodes,
            "cumsum",
            [helper.make_tensor_value_info("g", t.FLOAT, None)],
            [helper.make_tensor_value_info("p", t.FLOAT, None)],
            [axis],
        )
        return helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSIONS[17]
        )

    wide = model(
        [
            helper.make_node("Cast", ["g"], ["g64"], to=t.DOUBLE),
            helper.make_node("CumSum", ["g64", "axis"], ["p64"], reverse=1),
            helper.make_node("Cast", ["p64"], ["p"], to=t.FLOAT),
        ]
    )
    narrow = model([helper.make_node("CumSum", ["g", "axis"], ["p"], reverse=1)])
    gates = torch.sigmoid(
        4 * torch.randn(2, 3, 50, 300, generator=torch.Generator().manual_seed(6))
    )
    want = gates.flip(-1).cumsum(-1).flip(-1)
    assert torch.equal(run(wide, {"g": gates})["p"], want)
    assert not torch.equal(run(narrow, {"g": gates})["p"], want)
