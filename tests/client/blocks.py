"""Small ONNX attention blocks that cannot compute their position tables, and torch references
built from transformers' own modules.

ONNX blocks (onnx.helper, IR 10 so that onnxruntime 1.31 loads them):
- `gqa_block`: com.microsoft.GroupQueryAttention(do_rotary=1) over q/k/v [1, S, heads*H] with a
  past KV cache; cos/sin caches are graph inputs or placeholder initializers.
- `rotary_block`: RotaryEmbedding (standard opset 23, or com.microsoft) on q [1, N, S, H] and
  k [1, KV, S, H] with position_ids, then ONNX Attention-23 (is_causal=1).
- `alibi_block`: ONNX Attention-23 with an `attn_mask` input (and optionally a past KV cache).

References:
- `hf_rotary(config, position_ids)`: cos/sin from the model's own `*RotaryEmbedding` module
  (transformers 5.23), built from the real config.json, and its `apply_rotary_pos_emb`;
- `eager_attention_forward` from modeling_llama for the attention;
- ALiBi: `build_alibi_tensor` from modeling_bloom and BloomAttention's score arithmetic
  (`alibi.baddbmm(q, k^T, beta=1, alpha=1/sqrt(head_dim))`, causal mask, fp32 softmax).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto
from onnx import helper as h
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.llama.modeling_llama import eager_attention_forward

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
IR_VERSION = 10
ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


def load_config(name: str) -> dict[str, Any]:
    """A real config.json from tests/data/configs."""
    data: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return data


def head_dim(config: dict[str, Any]) -> int:
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto],
    opset: int,
    contrib: bool,
) -> onnx.ModelProto:
    graph = h.make_graph(nodes, "block", inputs, outputs, initializer=initializers)
    imports = [h.make_opsetid("", opset)]
    if contrib:
        imports.append(h.make_opsetid("com.microsoft", 1))
    model = h.make_model(graph, opset_imports=imports, ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


def _caches(
    half: int, dtype: str, caches: str
) -> tuple[list[onnx.ValueInfoProto], list[onnx.TensorProto]]:
    """cos/sin as graph inputs [P, half], or as placeholder initializers [1, half] (zeros)."""
    if caches == "input":
        return [h.make_tensor_value_info(n, ELEM[dtype], ["P", half]) for n in ("cos", "sin")], []
    zeros = np.zeros((1, half), dtype=np.dtype(dtype))
    return [], [onnx.numpy_helper.from_array(zeros, n) for n in ("cos", "sin")]


def gqa_block(
    hd: int, heads: int, kv_heads: int, *, caches: str = "input", dtype: str = "float32"
) -> onnx.ModelProto:
    """GroupQueryAttention(do_rotary=1): outputs `out` [1, S, heads*hd], `present_key`."""
    t = ELEM[dtype]
    io, inits = _caches(hd // 2, dtype, caches)
    inputs = [
        h.make_tensor_value_info("query", t, [1, "S", heads * hd]),
        h.make_tensor_value_info("key", t, [1, "S", kv_heads * hd]),
        h.make_tensor_value_info("value", t, [1, "S", kv_heads * hd]),
        h.make_tensor_value_info("past_key", t, [1, kv_heads, "past", hd]),
        h.make_tensor_value_info("past_value", t, [1, kv_heads, "past", hd]),
        h.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
        h.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
        *io,
    ]
    node = h.make_node(
        "GroupQueryAttention",
        [i.name for i in inputs[:7]] + ["cos", "sin"],
        ["out", "present_key", "present_value"],
        name="gqa",
        domain="com.microsoft",
        num_heads=heads,
        kv_num_heads=kv_heads,
        do_rotary=1,
    )
    outputs = [
        h.make_tensor_value_info("out", t, [1, "S", heads * hd]),
        h.make_tensor_value_info("present_key", t, [1, kv_heads, "total", hd]),
    ]
    return _model([node], inputs, outputs, inits, opset=17, contrib=True)


def baked_gqa_block(hd: int, heads: int, kv_heads: int, cos: Any, sin: Any) -> onnx.ModelProto:
    """`gqa_block` holding `cos`/`sin` (P, hd/2) as its cache initializers, as an exporter bakes
    them."""
    model = gqa_block(hd, heads, kv_heads, caches="initializer")
    del model.graph.initializer[:]
    model.graph.initializer.extend(
        [onnx.numpy_helper.from_array(cos, "cos"), onnx.numpy_helper.from_array(sin, "sin")]
    )
    return model


def switch_block(
    hd: int, heads: int, kv_heads: int, *, short_rows: int, long_rows: int, threshold: int
) -> onnx.ModelProto:
    """`gqa_block` whose caches come as onnxruntime-genai's builder emits LongRoPE's: an `If`
    on `Greater(total_sequence_length, threshold)` whose then branch makes the long caches
    [long_rows, hd/2] and else branch the short ones [short_rows, hd/2], each from `Constant`
    nodes (placeholder zeros here; the bound too, `/model/constants/INT64/N` in the builder),
    `with_weight`."""
    base = gqa_block(hd, heads, kv_heads, caches="initializer")
    graph = base.graph
    del graph.initializer[:]
    branches = {}
    for side, rows in (("long", long_rows), ("short", short_rows)):
        zeros = np.zeros((rows, hd // 2), np.float32)
        nodes = [
            h.make_node(
                "Constant",
                [],
                [f"{name}_{side}"],
                name=f"/{side}/{name}/Constant",
                value=onnx.numpy_helper.from_array(zeros, f"{name}_{side}"),
            )
            for name in ("cos", "sin")
        ]
        outputs = [
            h.make_tensor_value_info(f"{name}_{side}", TensorProto.FLOAT, [rows, hd // 2])
            for name in ("cos", "sin")
        ]
        branches[side] = h.make_graph(nodes, f"{side}_rope_caches_graph", [], outputs)
    bound = onnx.numpy_helper.from_array(np.array(threshold, np.int64), "threshold")
    switch = [
        h.make_node("Constant", [], ["threshold"], name="/model/constant_nodes/INT64", value=bound),
        h.make_node("Cast", ["total_sequence_length"], ["length"], to=TensorProto.INT64),
        h.make_node("Greater", ["length", "threshold"], ["is_long"], name="/rope/Greater"),
        h.make_node(
            "If",
            ["is_long"],
            ["cos", "sin"],
            name="/model/rope_caches_subgraph/If",
            then_branch=branches["long"],
            else_branch=branches["short"],
        ),
    ]
    nodes = [*switch, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    return with_weight(base, heads * hd)


def with_weight(model: onnx.ModelProto, width: int) -> onnx.ModelProto:
    """`model` whose output `out` [..., width] is also multiplied by a random weight `w`
    [width] into a new output `scaled`: a tensor that is not a position table."""
    weight = np.random.default_rng(3).standard_normal(width).astype(np.float32)
    model.graph.initializer.append(onnx.numpy_helper.from_array(weight, "w"))
    model.graph.node.append(h.make_node("Mul", ["out", "w"], ["scaled"]))
    model.graph.output.append(
        h.make_tensor_value_info("scaled", TensorProto.FLOAT, [1, "S", width])
    )
    onnx.checker.check_model(model)
    return model


def rotary_block(
    hd: int,
    heads: int,
    kv_heads: int,
    *,
    op: str = "onnx",
    caches: str = "input",
    dtype: str = "float32",
) -> onnx.ModelProto:
    """RotaryEmbedding (op `onnx`: opset 23; `contrib`: com.microsoft) on q and k, then
    Attention-23 (causal): outputs `q_rot`, `k_rot`, `out` [1, heads, S, hd]."""
    t = ELEM[dtype]
    io, inits = _caches(hd // 2, dtype, caches)
    inputs = [
        h.make_tensor_value_info("q", t, [1, heads, "S", hd]),
        h.make_tensor_value_info("k", t, [1, kv_heads, "S", hd]),
        h.make_tensor_value_info("v", t, [1, kv_heads, "S", hd]),
        h.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "S"]),
        *io,
    ]
    nodes = []
    for x in ("q", "k"):
        if op == "onnx":
            inputs_x = [x, "cos", "sin", "position_ids"]
            nodes.append(h.make_node("RotaryEmbedding", inputs_x, [f"{x}_rot"], name=f"rope_{x}"))
        else:
            nodes.append(
                h.make_node(
                    "RotaryEmbedding",
                    [x, "position_ids", "cos", "sin"],
                    [f"{x}_rot"],
                    name=f"rope_{x}",
                    domain="com.microsoft",
                )
            )
    nodes.append(h.make_node("Attention", ["q_rot", "k_rot", "v"], ["out"], is_causal=1))
    outputs = [
        h.make_tensor_value_info("q_rot", t, [1, heads, "S", hd]),
        h.make_tensor_value_info("k_rot", t, [1, kv_heads, "S", hd]),
        h.make_tensor_value_info("out", t, [1, heads, "S", hd]),
    ]
    return _model(nodes, inputs, outputs, inits, opset=23, contrib=op == "contrib")


def alibi_block(heads: int, hd: int, *, past: bool = False) -> onnx.ModelProto:
    """Attention-23 over q [1, heads, S, hd] and k/v [1, heads, T, hd] with an `attn_mask`
    input [1, heads, S, past+T] (and past_key/past_value when `past`): outputs `out`."""
    t = TensorProto.FLOAT
    inputs = [
        h.make_tensor_value_info("q", t, [1, heads, "S", hd]),
        h.make_tensor_value_info("k", t, [1, heads, "T", hd]),
        h.make_tensor_value_info("v", t, [1, heads, "T", hd]),
        h.make_tensor_value_info("attn_mask", t, [1, heads, "S", "total"]),
    ]
    names = ["q", "k", "v", "attn_mask"]
    outputs = ["out"]
    if past:
        inputs += [
            h.make_tensor_value_info("past_key", t, [1, heads, "past", hd]),
            h.make_tensor_value_info("past_value", t, [1, heads, "past", hd]),
        ]
        names += ["past_key", "past_value"]
        outputs += ["present_key", "present_value"]
    node = h.make_node("Attention", names, outputs, name="attention")
    out = [h.make_tensor_value_info("out", t, [1, heads, "S", hd])]
    if past:
        out += [h.make_tensor_value_info(n, t, [1, heads, "total", hd]) for n in outputs[1:]]
    return _model([node], inputs, out, [], opset=23, contrib=False)


def hf_rotary(config: dict[str, Any]) -> tuple[Any, Any]:
    """(rotary module, apply_rotary_pos_emb) of the model's own transformers implementation."""
    model_type = config["model_type"]
    hf_config = CONFIG_MAPPING[model_type](**config)
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    cls = next(
        getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding") and n[0] != "_"
    )
    return cls(config=hf_config), module.apply_rotary_pos_emb


def _module(heads: int, kv_heads: int) -> Any:
    return SimpleNamespace(num_key_value_groups=heads // kv_heads, training=False)


def causal_mask(queries: int, keys: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive [1, 1, Q, K] mask: query i (at position keys - queries + i) sees keys <= it."""
    i = torch.arange(queries)[:, None] + (keys - queries)
    j = torch.arange(keys)[None, :]
    mask = torch.zeros(queries, keys, dtype=dtype)
    mask[j > i] = torch.finfo(dtype).min
    return mask[None, None]


def gqa_reference(
    config: dict[str, Any],
    feeds: dict[str, np.ndarray],
    heads: int,
    kv_heads: int,
) -> dict[str, torch.Tensor]:
    """GroupQueryAttention(do_rotary=1) in torch: transformers' rotary and attention."""
    hd = head_dim(config)
    q = torch.from_numpy(feeds["query"])
    k = torch.from_numpy(feeds["key"])
    v = torch.from_numpy(feeds["value"])
    past_k = torch.from_numpy(feeds["past_key"])
    past_v = torch.from_numpy(feeds["past_value"])
    s, past = q.shape[1], past_k.shape[2]
    qh = q.view(1, s, heads, hd).transpose(1, 2)
    kh = k.view(1, s, kv_heads, hd).transpose(1, 2)
    vh = v.view(1, s, kv_heads, hd).transpose(1, 2)
    rotary, apply_rotary = hf_rotary(config)
    positions = torch.arange(past, past + s)[None]
    cos, sin = rotary(qh, positions)
    q_rot, k_rot = apply_rotary(qh, kh, cos, sin)
    keys = torch.cat([past_k, k_rot], dim=2)
    values = torch.cat([past_v, vh], dim=2)
    out, _ = eager_attention_forward(
        _module(heads, kv_heads), q_rot, keys, values, causal_mask(s, past + s), hd**-0.5
    )
    return {"out": out.reshape(1, s, heads * hd), "present_key": keys}


def rotary_reference(
    config: dict[str, Any],
    feeds: dict[str, np.ndarray],
    heads: int,
    kv_heads: int,
) -> dict[str, torch.Tensor]:
    """RotaryEmbedding on q and k + causal attention, with transformers' modules."""
    hd = head_dim(config)
    q, k, v = (torch.from_numpy(feeds[n]).float() for n in ("q", "k", "v"))
    positions = torch.from_numpy(feeds["position_ids"])
    rotary, apply_rotary = hf_rotary(config)
    cos, sin = rotary(q, positions)
    q_rot, k_rot = apply_rotary(q, k, cos, sin)
    s = q.shape[2]
    out, _ = eager_attention_forward(
        _module(heads, kv_heads), q_rot, k_rot, v, causal_mask(s, s), hd**-0.5
    )
    return {"q_rot": q_rot, "k_rot": k_rot, "out": out.transpose(1, 2)}


def bloom_alibi_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int
) -> torch.Tensor:
    """BloomAttention's arithmetic on q [1, H, S, D], k/v [1, H, T, D] (queries are the last S
    of T positions): ALiBi from `build_alibi_tensor`, causal mask, fp32 softmax."""
    s, t, d = q.shape[2], k.shape[2], q.shape[3]
    alibi = build_alibi_tensor(torch.ones(1, t, dtype=torch.long), heads, torch.float32)
    scores = alibi.baddbmm(
        batch1=q.reshape(heads, s, d),
        batch2=k.reshape(heads, t, d).transpose(-1, -2),
        beta=1.0,
        alpha=1.0 / d**0.5,
    )
    weights = scores.view(1, heads, s, t) + causal_mask(s, t)
    probs = torch.softmax(weights, dim=-1, dtype=torch.float32)
    return torch.bmm(probs.view(heads, s, t), v.reshape(heads, t, d)).view(1, heads, s, d)


def gqa_pairings(
    hd: int, heads: int, kv_heads: int, cos_names: list[str], sin_names: list[str], cache: Any
) -> onnx.ModelProto:
    """A model of one GroupQueryAttention (`gqa_block`) per (cos, sin) pairing, each initializer
    holding `cache` (rows, hd/2): len(cos_names) x len(sin_names) nodes (the hostile pairing
    model of the verification issue)."""
    from onnx import numpy_helper

    model = gqa_block(hd, heads, kv_heads, caches="initializer")
    template = model.graph.node[0]
    del model.graph.node[:], model.graph.initializer[:], model.graph.output[:]
    model.graph.initializer.extend(
        numpy_helper.from_array(cache, name) for name in dict.fromkeys(cos_names + sin_names)
    )
    for i, cos in enumerate(cos_names):
        for j, sin in enumerate(sin_names):
            node = onnx.NodeProto()
            node.CopyFrom(template)
            node.name = f"gqa_{i}_{j}"
            node.input[7], node.input[8] = cos, sin
            node.output[:] = [f"out_{i}_{j}", f"pk_{i}_{j}", f"pv_{i}_{j}"]
            model.graph.node.append(node)
            model.graph.output.append(h.make_empty_tensor_value_info(f"out_{i}_{j}"))
    return model
