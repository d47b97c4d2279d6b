"""`posenc_client.onnx`: every consumer constraint refused with a clear error before anything is
written, and `merge_subgraph` aligning IR versions and opsets of real served subgraphs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as h

from posenc_client import Client, IncompatibleModelError, OnnxModel, Tables
from posenc_client._onnx_model import onnx_metadata
from posenc_client.onnx import (
    attach_alibi_bias,
    attach_rope_caches,
    find_alibi_consumers,
    find_rope_consumers,
    merge_subgraph,
)
from tests.client import blocks


def _rope(client: Client, head_dim: int = 64, **fields: Any) -> Tables:
    fields.setdefault("profile", "onnx")
    return client.rope(head_dim, 32, **fields)


def test_consumers_are_found(pclient: Client) -> None:
    gqa = find_rope_consumers(blocks.gqa_block(64, 4, 2))
    assert [(c.op, c.cos, c.sin, c.head_size, c.rotary_dim) for c in gqa] == [
        ("com.microsoft.GroupQueryAttention", "cos", "sin", 64, 64)
    ]
    std = find_rope_consumers(blocks.rotary_block(64, 4, 2, caches="initializer"))
    assert [(c.node, c.op, c.rotary_dim, c.rows, c.dtype) for c in std] == [
        ("rope_q", "RotaryEmbedding", 64, 1, "float32"),
        ("rope_k", "RotaryEmbedding", 64, 1, "float32"),
    ]
    contrib = find_rope_consumers(blocks.rotary_block(64, 4, 2, op="contrib"))
    assert {c.op for c in contrib} == {"com.microsoft.RotaryEmbedding"}
    (attention,) = find_alibi_consumers(blocks.alibi_block(8, 16))
    assert (attention.op, attention.slot, attention.num_heads) == ("Attention", "attn_mask", 8)


@pytest.mark.parametrize(
    ("block", "fields", "message"),
    [
        (lambda: blocks.rotary_block(64, 4, 2), {"profile": "hf"}, "half-width"),
        (lambda: blocks.rotary_block(64, 4, 2), {"profile": "vllm"}, "separate cos and sin"),
        (lambda: blocks.rotary_block(128, 4, 2), {}, "rotates 128 dims"),
        (lambda: blocks.rotary_block(64, 4, 2, dtype="float16"), {}, "dtype='float16'"),
        (lambda: blocks.rotary_block(64, 4, 2), {"interleaved": True}, "interleaved pairs"),
        (lambda: blocks.gqa_block(40, 4, 2), {"head_dim": 40, "profile": "onnx"},
         "multiple of 8"),
    ],
)  # fmt: skip
def test_rope_constraints(
    pclient: Client, block: Callable[[], onnx.ModelProto], fields: dict[str, Any], message: str
) -> None:
    head_dim = int(fields.pop("head_dim", 64))
    tables = _rope(pclient, head_dim, **fields)
    with pytest.raises(IncompatibleModelError, match=message):
        attach_rope_caches(block(), tables)


def test_pairing_override_and_rows(pclient: Client) -> None:
    interleaved = _rope(pclient, interleaved=True)
    model = attach_rope_caches(blocks.rotary_block(64, 4, 2), interleaved, check_pairing=False)
    assert {i.name for i in model.graph.initializer} == {"cos", "sin"}
    declared = blocks.rotary_block(64, 4, 2, caches="initializer")
    for init in declared.graph.initializer:
        init.CopyFrom(onnx.numpy_helper.from_array(np.zeros((64, 32), np.float32), init.name))
    with pytest.raises(IncompatibleModelError, match="declares 64 cache rows"):
        attach_rope_caches(declared, _rope(pclient))


def test_refuses_computed_caches_and_unknown_nodes(pclient: Client) -> None:
    model = blocks.rotary_block(64, 4, 2)
    graph = model.graph
    graph.input[4].name = "cos_src"
    graph.node.insert(0, h.make_node("Identity", ["cos_src"], ["cos"], name="make_cos"))
    tables = _rope(pclient)
    with pytest.raises(IncompatibleModelError, match="computed by node 'make_cos'"):
        attach_rope_caches(model, tables)
    with pytest.raises(IncompatibleModelError, match="no RoPE consumer named"):
        attach_rope_caches(blocks.rotary_block(64, 4, 2), tables, nodes=["x"])
    with pytest.raises(IncompatibleModelError, match="no RoPE consumer"):
        attach_rope_caches(blocks.alibi_block(4, 16), tables)
    with pytest.raises(IncompatibleModelError, match="takes a rope table"):
        attach_rope_caches(blocks.rotary_block(64, 4, 2), pclient.alibi(4))


def test_only_named_nodes_and_metadata(pclient: Client) -> None:
    tables = _rope(pclient)
    model = blocks.rotary_block(64, 4, 2)
    model.graph.node[1].input[1] = "cos_k"
    model.graph.node[1].input[2] = "sin_k"
    model.graph.input.extend(
        [h.make_tensor_value_info(n, TensorProto.FLOAT, ["P", 32]) for n in ("cos_k", "sin_k")]
    )
    patched = attach_rope_caches(model, tables, nodes=["rope_k"])
    assert {i.name for i in patched.graph.initializer} == {"cos_k", "sin_k"}
    assert {"cos", "sin"} <= {i.name for i in patched.graph.input}
    meta = {p.key: p.value for p in patched.metadata_props}
    assert meta["posenc.tables"] == f'{{"cos_k": "{tables.key}", "sin_k": "{tables.key}"}}'


def _bias_graph(
    client: Client, heads: int = 8, dtype: str = "float32", **options: Any
) -> OnnxModel:
    spec = {"kind": "alibi", "num_heads": heads, "bias": "causal", "key_length": 4, "dtype": dtype}
    return client.onnx(spec, graph="bias", **options)


def test_served_onnx_model(pclient: Client, cache_dir: object) -> None:
    graph = _bias_graph(pclient, opset=23)
    proto = graph.load()
    meta = {p.key.removeprefix("posenc."): p.value for p in proto.metadata_props}
    assert onnx_metadata(graph.data) == meta
    assert graph.graph == "alibi/bias"
    assert graph.spec["num_heads"] == 8
    assert graph.key == meta["export_key"]
    assert pclient.onnx(graph.spec, graph="bias", opset=23).key == graph.key


def test_alibi_constraints(pclient: Client) -> None:
    with pytest.raises(IncompatibleModelError, match="has 4 heads; the bias has 8"):
        attach_alibi_bias(blocks.alibi_block(4, 16), _bias_graph(pclient, 8, opset=23))
    fp16 = _bias_graph(pclient, 4, "float16", opset=23)
    with pytest.raises(IncompatibleModelError, match="dtype='float32'"):
        attach_alibi_bias(blocks.alibi_block(4, 16), fp16)
    model = blocks.alibi_block(4, 16)
    model.graph.input[3].name = "mask_src"
    model.graph.node.insert(0, h.make_node("Identity", ["mask_src"], ["attn_mask"], name="m"))
    with pytest.raises(IncompatibleModelError, match="comes from 'm'"):
        attach_alibi_bias(model, _bias_graph(pclient, 4, opset=23))
    with pytest.raises(IncompatibleModelError, match="expected the alibi/bias subgraph"):
        attach_alibi_bias(blocks.alibi_block(4, 16), pclient.onnx(
            {"kind": "sinusoidal", "dim": 8, "max_positions": 4}, graph="embedding"))  # fmt: skip


def test_alibi_fills_an_empty_slot_and_links_inputs(pclient: Client) -> None:
    model = blocks.alibi_block(4, 16)
    model.graph.node[0].input[3] = ""
    del model.graph.input[3]
    positions = h.make_tensor_value_info("positions", TensorProto.INT64, ["S"])
    model.graph.input.append(positions)
    patched = attach_alibi_bias(
        model,
        _bias_graph(pclient, 4, opset=23),
        inputs={"query_positions": "positions", "key_positions": "positions"},
    )
    assert patched.graph.node[-1].input[3] == "posenc_alibi/bias"
    assert [i.name for i in patched.graph.input] == ["q", "k", "v", "positions"]
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 4, 5, 16), np.float32) for _ in range(3))
    session = ort.InferenceSession(patched.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"q": q, "k": k, "v": v, "positions": np.arange(5)})
    assert out.shape == (1, 4, 5, 16)
    assert np.isfinite(out).all()
    # the first query sees only the first key (causal bias masks the rest)
    np.testing.assert_allclose(out[0, :, 0], v[0, :, 0], rtol=1e-6)


def test_merge_subgraph_aligns_opsets_and_ir(pclient: Client) -> None:
    """A served opset-17 (IR 8) subgraph merges into an opset-23 (IR 10) model: the subgraph is
    converted, the IR versions equalised, the model's identity and metadata kept."""
    sub = _bias_graph(pclient, 4, opset=17)
    assert sub.load().ir_version == 8
    model = blocks.alibi_block(4, 16)
    model.producer_name = "my-exporter"
    onnx.helper.set_model_props(model, {"origin": "test"})
    merged = merge_subgraph(model, sub, {"bias": "attn_mask"}, prefix="a/")
    assert merged.ir_version == 10
    assert {(o.domain, o.version) for o in merged.opset_import} == {("", 23)}
    assert merged.producer_name == "my-exporter"
    meta = {p.key: p.value for p in merged.metadata_props}
    assert meta["origin"] == "test"
    assert meta["a/posenc.graph"] == "alibi/bias"
    assert [o.name for o in merged.graph.output] == ["out"]
    assert {"a/query_positions", "a/key_positions"} <= {i.name for i in merged.graph.input}
    onnx.checker.check_model(merged, full_check=True)
    with pytest.raises(IncompatibleModelError, match="model input 'nope'"):
        merge_subgraph(model, sub, [("bias", "nope")])
