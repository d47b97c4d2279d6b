"""The end-to-end proof: ONNX attention blocks that cannot compute their position tables run in
onnxruntime with tables fetched from a real posenc server, and equal transformers.

RoPE: for real configs (Llama 3.1 with llama3 scaling; Phi-3.5-mini LongRoPE on both sides of
its switch at 4096; Qwen2.5 with YaRN), the client fetches half-width caches
(`tables_for_model(config, profile=...)`), `attach_rope_caches` puts them in place of the cache
inputs or initializers of GroupQueryAttention(do_rotary=1), RotaryEmbedding-23 and
com.microsoft.RotaryEmbedding, and the outputs equal a torch reference built from the model's own
transformers `*RotaryEmbedding`, `apply_rotary_pos_emb` and `eager_attention_forward`.

ALiBi: the client fetches the served `alibi/bias` subgraph for BLOOM's config (`/v1/onnx`),
`attach_alibi_bias` feeds it to an ONNX Attention-23 `attn_mask`, and the output equals
BloomAttention's arithmetic with transformers' `build_alibi_tensor`, for a prompt and for a
decoding step with a KV cache.

Tolerance: onnxruntime and torch reduce the attention matmuls in different orders; fp32 results
of O(1) agree to ~1e-6 (rotations alone: to a couple of ulp), asserted at 1e-5 / 1e-6.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

from posenc_client import Client, IncompatibleModelError, Tables
from posenc_client.onnx import attach_alibi_bias, attach_rope_caches, find_rope_consumers
from tests.client import blocks

ROTATION_ATOL = 1e-6
ATTENTION_ATOL = 1e-5

CASES = {
    "llama3.1-llama3": ("meta-llama__Llama-3.1-8B", (8180, 6), 8192, None),
    "phi3.5-longrope-short": ("microsoft__Phi-3.5-mini-instruct", (4088, 8), 4200, 4096),
    "phi3.5-longrope-long": ("microsoft__Phi-3.5-mini-instruct", (4093, 8), 4200, None),
    "qwen2.5-yarn": ("Qwen__Qwen2.5-7B-Instruct__yarn", (2040, 8), 2048, None),
}
"""name -> (config, (first position, count), table rows, seq_len). The Phi-3.5 short case ends
at position 4095 (seq_len 4096: short factors), the long case at 4100 (long factors): transformers
picks the factors from max(position_ids) + 1, the served spec from seq_len."""

HEADS, KV_HEADS = 4, 2


def _session(model: Any) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _tables(client: Client, name: str, profile: str) -> tuple[dict[str, Any], Tables]:
    config_name, _, rows, seq_len = CASES[name]
    config = blocks.load_config(config_name)
    found = client.tables_for_model(
        blocks.CONFIGS / f"{config_name}.json",
        profile=profile,
        max_positions=rows,
        seq_len=seq_len,
    )
    assert list(found) == ["rope"]
    return config, found["rope"]


def _close(actual: np.ndarray, expected: torch.Tensor, atol: float) -> None:
    torch.testing.assert_close(torch.from_numpy(actual), expected.float(), atol=atol, rtol=0)


@pytest.mark.parametrize("caches", ["input", "initializer"])
@pytest.mark.parametrize("name", list(CASES))
def test_gqa_rotary_equals_transformers(shared_client: Client, name: str, caches: str) -> None:
    config, tables = _tables(shared_client, name, "ort_gqa")
    hd = blocks.head_dim(config)
    assert tables["cos"].shape == (CASES[name][2], hd // 2)
    assert tables.notes["rope_type"] == tables.spec["rope_scaling"]["rope_type"]
    model = attach_rope_caches(blocks.gqa_block(hd, HEADS, KV_HEADS, caches=caches), tables)
    assert {i.name for i in model.graph.input}.isdisjoint({"cos", "sin"})
    past, new = CASES[name][1]
    rng = np.random.default_rng(7)
    feeds: dict[str, np.ndarray] = {
        "query": rng.standard_normal((1, new, HEADS * hd), np.float32),
        "key": rng.standard_normal((1, new, KV_HEADS * hd), np.float32),
        "value": rng.standard_normal((1, new, KV_HEADS * hd), np.float32),
        "past_key": rng.standard_normal((1, KV_HEADS, past, hd), np.float32),
        "past_value": rng.standard_normal((1, KV_HEADS, past, hd), np.float32),
        "seqlens_k": np.array([past + new - 1], np.int32),
        "total_sequence_length": np.array(past + new, np.int32),
    }
    out, present_key = _session(model).run(["out", "present_key"], feeds)
    expected = blocks.gqa_reference(config, feeds, HEADS, KV_HEADS)
    _close(present_key, expected["present_key"], ROTATION_ATOL)
    _close(out, expected["out"], ATTENTION_ATOL)


@pytest.mark.parametrize("caches", ["input", "initializer"])
@pytest.mark.parametrize("op", ["onnx", "contrib"])
@pytest.mark.parametrize("name", list(CASES))
def test_rotary_embedding_equals_transformers(
    shared_client: Client, name: str, op: str, caches: str
) -> None:
    config, tables = _tables(shared_client, name, "onnx")
    hd = blocks.head_dim(config)
    model = attach_rope_caches(
        blocks.rotary_block(hd, HEADS, KV_HEADS, op=op, caches=caches), tables
    )
    first, count = CASES[name][1]
    rng = np.random.default_rng(11)
    feeds: dict[str, np.ndarray] = {
        "q": rng.standard_normal((1, HEADS, count, hd), np.float32),
        "k": rng.standard_normal((1, KV_HEADS, count, hd), np.float32),
        "v": rng.standard_normal((1, KV_HEADS, count, hd), np.float32),
        "position_ids": np.arange(first, first + count, dtype=np.int64)[None],
    }
    q_rot, k_rot, out = _session(model).run(["q_rot", "k_rot", "out"], feeds)
    expected = blocks.rotary_reference(config, feeds, HEADS, KV_HEADS)
    _close(q_rot, expected["q_rot"], ROTATION_ATOL)
    _close(k_rot, expected["k_rot"], ROTATION_ATOL)
    _close(out, expected["out"], ATTENTION_ATOL)


def test_longrope_tables_differ_across_the_switch(shared_client: Client) -> None:
    """The two Phi-3.5 tables are different tables (different keys and values)."""
    _, short = _tables(shared_client, "phi3.5-longrope-short", "onnx")
    _, long = _tables(shared_client, "phi3.5-longrope-long", "onnx")
    assert short.key != long.key
    assert short.notes["longrope_switch_point"] == 4096
    assert not np.array_equal(short["cos"][100], long["cos"][100])


def test_fp16_caches_by_dtype_or_cast(shared_client: Client) -> None:
    """A float16 block needs float16 caches: fetched in float16, or cast from float32 on
    request; the two are identical (the server also computes in fp32 and casts last)."""
    config = blocks.load_config("meta-llama__Llama-3.1-8B")
    path = blocks.CONFIGS / "meta-llama__Llama-3.1-8B.json"
    hd = blocks.head_dim(config)
    block = blocks.rotary_block(hd, HEADS, KV_HEADS, dtype="float16")
    fp32 = shared_client.tables_for_model(path, profile="onnx", max_positions=64)["rope"]
    with pytest.raises(IncompatibleModelError, match="float16"):
        attach_rope_caches(block, fp32)
    fp16 = shared_client.tables_for_model(path, profile="onnx", max_positions=64, dtype="float16")
    served = attach_rope_caches(block, fp16["rope"])
    cast = attach_rope_caches(block, fp32, cast=True)
    init = {i.name: i for i in served.graph.initializer}
    for i in cast.graph.initializer:
        assert i.raw_data == init[i.name].raw_data
    assert find_rope_consumers(served)[0].dtype == "float16"
    rng = np.random.default_rng(3)
    feeds: dict[str, np.ndarray] = {
        "q": rng.standard_normal((1, HEADS, 8, hd)).astype(np.float16),
        "k": rng.standard_normal((1, KV_HEADS, 8, hd)).astype(np.float16),
        "v": rng.standard_normal((1, KV_HEADS, 8, hd)).astype(np.float16),
        "position_ids": np.arange(40, 48, dtype=np.int64)[None],
    }
    (q_rot,) = _session(served).run(["q_rot"], feeds)
    expected = blocks.rotary_reference(config, feeds, HEADS, KV_HEADS)["q_rot"]
    torch.testing.assert_close(torch.from_numpy(q_rot).float(), expected, atol=4e-3, rtol=2e-3)


BLOOM = "bigscience__bloom-560m"


def _alibi_graph(client: Client, inputs: str) -> tuple[Any, int, int]:
    (alibi,) = client.resolve(blocks.CONFIGS / f"{BLOOM}.json")
    assert alibi.kind == "alibi"
    form = alibi.notes["bias_form"]
    assert form == "row_constant"
    spec = {**alibi.spec, "bias": form, "query_length": 1, "key_length": 1}
    graph = client.onnx(spec, graph="bias", opset=23, inputs=inputs)
    assert graph.graph == "alibi/bias"
    config = blocks.load_config(BLOOM)
    heads = int(config["n_head"])
    return graph, heads, int(config["hidden_size"]) // heads


def test_alibi_prompt_equals_bloom(shared_client: Client) -> None:
    graph, heads, hd = _alibi_graph(shared_client, "positions")
    model = attach_alibi_bias(blocks.alibi_block(heads, hd), graph)
    names = {i.name for i in model.graph.input}
    assert "attn_mask" not in names
    assert {"posenc_alibi/query_positions", "posenc_alibi/key_positions"} <= names
    s = 12
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, heads, s, hd), np.float32) for _ in range(3))
    positions = np.arange(s, dtype=np.int64)
    feeds = {
        "q": q,
        "k": k,
        "v": v,
        "posenc_alibi/query_positions": positions,
        "posenc_alibi/key_positions": positions,
    }
    (out,) = _session(model).run(["out"], feeds)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    expected = blocks.bloom_alibi_reference(tq, tk, tv, heads)
    _close(out, expected, ATTENTION_ATOL)


def test_alibi_decode_step_equals_bloom(shared_client: Client) -> None:
    """A KV-cache step: 3 new queries after 29 cached keys; the `lengths` subgraph builds the
    [1, H, 3, 32] bias from past_length and query_length."""
    graph, heads, hd = _alibi_graph(shared_client, "lengths")
    model = attach_alibi_bias(blocks.alibi_block(heads, hd, past=True), graph)
    past, s = 29, 3
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((1, heads, s, hd), np.float32) for _ in range(3))
    past_k, past_v = (rng.standard_normal((1, heads, past, hd), np.float32) for _ in range(2))
    feeds = {
        "q": q,
        "k": k,
        "v": v,
        "past_key": past_k,
        "past_value": past_v,
        "posenc_alibi/past_length": np.array(past, np.int64),
        "posenc_alibi/query_length": np.array(s, np.int64),
    }
    (out,) = _session(model).run(["out"], feeds)
    keys = torch.from_numpy(np.concatenate([past_k, k], axis=2))
    values = torch.from_numpy(np.concatenate([past_v, v], axis=2))
    expected = blocks.bloom_alibi_reference(torch.from_numpy(q), keys, values, heads)
    _close(out, expected, ATTENTION_ATOL)
