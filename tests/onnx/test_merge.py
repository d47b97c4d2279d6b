"""A served subgraph merges into a consumer model with `onnx.compose.merge_models` (equal IR
version and opsets, as the exporter writes them) and the merged model runs."""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import TensorProto, helper
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from posenc.encodings import compute, parse_spec
from posenc.onnx import IR_VERSIONS, export
from tests.onnx.cases import assert_close, run
from tests.tolerances import ATOL


def _rotate_half_consumer(opset: int, head_dim: int) -> onnx.ModelProto:
    """q [B, N, S, H], full-width cos/sin [B, S, H] -> q*cos + rotate_half(q)*sin (Llama)."""
    half = head_dim // 2
    nodes = [
        helper.make_node("Constant", [], ["axis1"], value_ints=[1]),
        helper.make_node("Unsqueeze", ["cos", "axis1"], ["c"]),
        helper.make_node("Unsqueeze", ["sin", "axis1"], ["s"]),
        helper.make_node(
            "Split", ["q"], ["q1", "q2"], axis=-1, **({"num_outputs": 2} if opset >= 18 else {})
        ),
        helper.make_node("Neg", ["q2"], ["neg_q2"]),
        helper.make_node("Concat", ["neg_q2", "q1"], ["rotated"], axis=-1),
        helper.make_node("Mul", ["q", "c"], ["qc"]),
        helper.make_node("Mul", ["rotated", "s"], ["rs"]),
        helper.make_node("Add", ["qc", "rs"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "llama_rotation",
        [
            helper.make_tensor_value_info("q", TensorProto.FLOAT, ["B", "N", "S", head_dim]),
            helper.make_tensor_value_info("cos", TensorProto.FLOAT, ["B", "S", head_dim]),
            helper.make_tensor_value_info("sin", TensorProto.FLOAT, ["B", "S", head_dim]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "N", "S", head_dim])],
    )
    assert half * 2 == head_dim
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSIONS[opset]
    )


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("mode", ["table", "compute"])
def test_cos_sin_subgraph_merges_into_a_llama_rotation(mode: str, opset: int) -> None:
    spec = parse_spec(
        {
            "kind": "rope",
            "head_dim": 32,
            "max_positions": 64,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        }
    )
    served = onnx.load_from_string(
        export(spec, "cos_sin", mode=mode, opset=opset).SerializeToString()
    )
    merged = onnx.compose.merge_models(
        served, _rotate_half_consumer(opset, 32), io_map=[("cos", "cos"), ("sin", "sin")]
    )
    onnx.checker.check_model(merged, full_check=True)
    assert [i.name for i in merged.graph.input] == ["position_ids", "q"]
    pos = torch.tensor([[0, 1, 2, 63], [7, 8, 40, 41]])
    q = torch.randn(2, 4, 4, 32, generator=torch.Generator().manual_seed(5))
    table = compute(spec).tensors
    want, _ = apply_rotary_pos_emb(q, q, table["cos"][pos], table["sin"][pos])
    out = run(merged, {"position_ids": pos, "q": q})["y"]
    assert_close(out, want, 2 * ATOL["float32"])


def test_rotary_subgraph_merges_with_a_projection() -> None:
    """x -> rotary graph -> MatMul with a consumer weight: the rotated q feeds the model."""
    spec = parse_spec({"kind": "rope", "head_dim": 16, "rotary_dim": 8, "max_positions": 32})
    served = export(spec, "rotary", num_heads=2, opset=18)
    weight = helper.make_tensor("w", TensorProto.FLOAT, [32, 4], [0.01 * i for i in range(128)])
    consumer = helper.make_model(
        helper.make_graph(
            [helper.make_node("MatMul", ["h", "w"], ["out"])],
            "projection",
            [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["B", "S", 32])],
            [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["B", "S", 4])],
            [weight],
        ),
        opset_imports=[helper.make_opsetid("", 18)],
        ir_version=IR_VERSIONS[18],
    )
    merged = onnx.compose.merge_models(served, consumer, io_map=[("y", "h")])
    x = torch.randn(1, 3, 32, generator=torch.Generator().manual_seed(6))
    pos = torch.tensor([[4, 5, 6]])
    rotated = run(served, {"x": x, "position_ids": pos})["y"]
    out = run(merged, {"x": x, "position_ids": pos})["out"]
    w = torch.tensor([0.01 * i for i in range(128)]).reshape(32, 4)
    assert_close(out, rotated @ w, 8 * ATOL["float32"])
