"""Served bias graphs drive real attention: the ALiBi (and T5) bias subgraph merged in front of
ONNX Attention-23 (`attn_mask`) or onnxruntime's com.microsoft.MultiHeadAttention
(`attention_bias`) equals torch's softmax attention with the core's bias."""

from __future__ import annotations

from typing import Any

import onnx
import pytest
import torch
from onnx import TensorProto, helper

from posenc.encodings import SpecBase, compute, parse_spec
from posenc.onnx import IR_VERSIONS, export
from tests.onnx.cases import T5_WEIGHTS, assert_close, run

HEAD = 8
ONNX_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}
ATTN_ATOL = {"float32": 2e-6, "float16": 4e-3}
"""Attention sums K products: a few ulp of the O(1) outputs (tests/tolerances ATOL x ~8)."""


def _consumer(dtype: str, heads: int, *, contrib: bool, scale: float | None) -> onnx.ModelProto:
    """Q, K, V and an additive mask in; attention out."""
    t = ONNX_TYPES[dtype]
    if contrib:
        shapes = {"q": ["B", "Q", heads * HEAD], "k": ["B", "K", heads * HEAD]}
        attrs: dict[str, Any] = {"num_heads": heads}
        if scale is not None:
            attrs["scale"] = scale
        node = helper.make_node(
            "MultiHeadAttention",
            ["q", "k", "v", "", "", "attn_mask"],
            ["out"],
            domain="com.microsoft",
            **attrs,
        )
        out_shape = ["B", "Q", heads * HEAD]
    else:
        shapes = {"q": ["B", heads, "Q", HEAD], "k": ["B", heads, "K", HEAD]}
        node = helper.make_node(
            "Attention",
            ["q", "k", "v", "attn_mask"],
            ["out"],
            **({"scale": scale} if scale else {}),
        )
        out_shape = ["B", heads, "Q", HEAD]
    graph = helper.make_graph(
        [node],
        "consumer",
        [
            helper.make_tensor_value_info("q", t, shapes["q"]),
            helper.make_tensor_value_info("k", t, shapes["k"]),
            helper.make_tensor_value_info("v", t, shapes["k"]),
            helper.make_tensor_value_info("attn_mask", t, [1, heads, "Q", "K"]),
        ],
        [helper.make_tensor_value_info("out", t, out_shape)],
    )
    imports = [helper.make_opsetid("", 23)]
    if contrib:
        imports.append(helper.make_opsetid("com.microsoft", 1))
    return helper.make_model(graph, opset_imports=imports, ir_version=IR_VERSIONS[23])


def _attend(
    spec: SpecBase,
    bias_model: onnx.ModelProto,
    feeds: dict[str, torch.Tensor],
    heads: int,
    *,
    contrib: bool = False,
    scale: float | None = None,
) -> None:
    """Merge bias_model -> attention, run, compare with torch SDPA on the core's bias."""
    dtype = str(spec.dtype)
    consumer = _consumer(dtype, heads, contrib=contrib, scale=scale)
    if contrib:
        # MultiHeadAttention needs the contrib domain in both models to merge
        bias_model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    merged = onnx.compose.merge_models(bias_model, consumer, io_map=[("bias", "attn_mask")])
    onnx.checker.check_model(merged, full_check=True)
    bias = compute(spec).tensors["bias"][None]  # [1, H, Q, K]
    q_len, k_len = bias.shape[-2:]
    gen = torch.Generator().manual_seed(11)
    tdt = getattr(torch, dtype)
    q, k, v = (torch.randn(2, heads, n, HEAD, generator=gen).to(tdt) for n in (q_len, k_len, k_len))
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=bias.float(), scale=scale
    ).to(tdt)
    if contrib:
        inputs = {
            n: x.transpose(1, 2).reshape(2, x.shape[2], -1)
            for n, x in zip("qkv", (q, k, v), strict=True)
        }
        out = run(merged, {**feeds, **inputs})["out"].reshape(2, q_len, heads, HEAD).transpose(1, 2)
    else:
        out = run(merged, {**feeds, "q": q, "k": k, "v": v})["out"]
    assert_close(out, want, ATTN_ATOL[dtype])


ALIBI_FORMS = [
    ("causal", None),
    ("causal", "-inf"),
    ("symmetric", None),
    ("bottom_right", None),
    ("row_constant", None),
    ("mpt", None),
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("inputs", ["positions", "lengths"])
@pytest.mark.parametrize(("form", "masked"), ALIBI_FORMS)
def test_alibi_bias_drives_onnx_attention(
    form: str, masked: str | None, inputs: str, dtype: str
) -> None:
    fields: dict[str, Any] = {"kind": "alibi", "num_heads": 12, "bias": form, "dtype": dtype}
    q_len, k_len = 5, 11
    if form == "bottom_right":
        fields |= {"query_length": q_len, "key_length": k_len}
    else:
        fields |= {"query_length": q_len, "key_length": k_len, "query_offset": k_len - q_len}
    if masked:
        fields["masked_value"] = masked
    spec = parse_spec(fields)
    model = export(spec, "bias", opset=23, inputs=inputs)
    queries = torch.arange(k_len - q_len, k_len)
    feeds = (
        {"query_positions": queries, "key_positions": torch.arange(k_len)}
        if inputs == "positions"
        else {"past_length": torch.tensor(k_len - q_len), "query_length": torch.tensor(q_len)}
    )
    _attend(spec, model, feeds, 12)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_alibi_bias_is_onnxruntime_attention_bias(dtype: str) -> None:
    spec = parse_spec(
        {
            "kind": "alibi",
            "num_heads": 4,
            "bias": "causal",
            "key_length": 9,
            "query_offset": 6,
            "dtype": dtype,
        }
    )
    model = export(spec, "bias", opset=23, inputs="lengths")
    feeds = {"past_length": torch.tensor(6), "query_length": torch.tensor(3)}
    _attend(spec, model, feeds, 4, contrib=True)


def test_t5_bias_drives_onnx_attention_unscaled() -> None:
    spec = parse_spec(
        {
            "kind": "t5_bias",
            "query_length": 6,
            "key_length": 40,
            "query_offset": 34,
            "relative_attention_bias": T5_WEIGHTS,
        }
    )
    model = export(spec, "bias", opset=23, inputs="lengths")
    graph_outputs = [o.name for o in model.graph.output]
    assert graph_outputs == ["buckets", "bias"]
    feeds = {"past_length": torch.tensor(34), "query_length": torch.tensor(6)}
    _attend(spec, model, feeds, 3, scale=1.0)  # T5: no 1/sqrt(d)
