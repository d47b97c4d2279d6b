"""DeepSeek-V4 through the server against transformers 5.24's modeling_deepseek_v4.py (issue 30
item 4): one table per attention layer type, each bit-equal to `DeepseekV4RotaryEmbedding` for
the layer's rope key ("main" / "compress", `DeepseekV4Attention.rope_layer_type`), and q/k after
the model's own `apply_rotary_pos_emb` equal to what the notes' rules give (interleaved pairs on
the trailing rotary channels of each head); the compressors' positions (i * compress_rate +
first_window_position) read from the same table. Configs: the class default (released shape)
and a shrunk one with sliding layers and YaRN, each in its v5 form (`to_dict`) and its v4 form
(flat `rope_scaling`, `rope_theta` / `compress_rope_theta`, legacy `qk_rope_head_dim`)."""

from __future__ import annotations

import json
import warnings
from typing import Any

import httpx
import pytest
import torch

from tests.conftest import ServerHandle
from tests.encodings.hf_config import released_sweep as released
from tests.encodings.hf_config import rope_sweep as sweep

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as v4

SHRUNK: dict[str, Any] = {
    "num_hidden_layers": 5,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "head_dim": 128,
    "partial_rotary_factor": 0.25,
    "layer_types": [
        "sliding_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "sliding_attention",
        "compressed_sparse_attention",
    ],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    "compress_rope_theta": 40000.0,
    "rope_scaling": {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 64},
}


def _v5(kwargs: dict[str, Any]) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data: dict[str, Any] = json.loads(json.dumps(DeepseekV4Config(**kwargs).to_dict()))
    return data


def _v4(data: dict[str, Any]) -> dict[str, Any]:
    """A v4 config.json of the same model: flat YaRN `rope_scaling` (when compress has it), the
    bases as `rope_theta` / `compress_rope_theta`, the width as the legacy `qk_rope_head_dim`."""
    old = {k: v for k, v in data.items() if k not in ("rope_parameters", "partial_rotary_factor")}
    compress = data["rope_parameters"]["compress"]
    old["rope_theta"] = data["rope_parameters"]["main"]["rope_theta"]
    old["compress_rope_theta"] = compress["rope_theta"]
    old["qk_rope_head_dim"] = int(data["head_dim"] * compress["partial_rotary_factor"])
    if compress["rope_type"] != "default":
        old["rope_scaling"] = {
            k: v
            for k, v in compress.items()
            if k not in ("rope_theta", "partial_rotary_factor", "attention_factor")
        }
    return old


CASES = {
    "default/v5": _v5({}),
    "shrunk_yarn/v5": _v5(SHRUNK),
}
CASES["default/v4"] = _v4(CASES["default/v5"])
CASES["shrunk_yarn/v4"] = _v4(CASES["shrunk_yarn/v5"])


def _reference_config(data: dict[str, Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return DeepseekV4Config.from_dict(dict(data))


def _rotate_by_notes(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The notes' rule, written out: the trailing 2 * cos.shape[-1] channels of each head, pairs
    (2i, 2i+1) rotated by the half-width table's angle i; the leading channels pass through."""
    rot = 2 * cos.shape[-1]
    nope, rope = x[..., :-rot], x[..., -rot:].float()
    even, odd = rope[..., 0::2], rope[..., 1::2]
    c, s = cos[None, None], sin[None, None]
    out = torch.stack((even * c + (-odd) * s, odd * c + even * s), dim=-1).flatten(-2)
    return torch.cat([nope, out.to(x.dtype)], dim=-1)


@pytest.mark.parametrize("case", sorted(CASES))
def test_deepseek_v4_tables_and_qk_are_the_models(
    server: ServerHandle, client: httpx.Client, case: str
) -> None:
    data = CASES[case]
    config = _reference_config(data)
    tables = released.served(client, data, data, server.device)
    assert isinstance(tables, list), tables.line()
    rotary = v4.DeepseekV4RotaryEmbedding(config)
    positions = torch.arange(sweep.SEQ)[None]
    x = torch.zeros(1, 1, config.head_dim)
    served_types: list[str] = []
    for table in tables:
        notes = table.notes
        assert notes["rotary_channels"] == "trailing"
        assert notes["pairing"] == "interleaved"
        assert notes["model_head_dim"] == config.head_dim
        assert table.rotary_dim == table.head_dim == config.qk_rope_head_dim
        assert notes["compress_rates"] == config.compress_rates
        assert table.layer_types is not None
        for layer_type in table.layer_types:
            served_types.append(layer_type)
            index = config.layer_types.index(layer_type)
            # the layer's rope key as the model's attention picks it (built on the meta device)
            with torch.device("meta"):
                rope_key = v4.DeepseekV4Attention(config, index).rope_layer_type
            assert notes["attention_rope_keys"][layer_type] == rope_key
            assert notes["rope_keys"][layer_type].endswith("." + rope_key)
            cos, sin = rotary(x, positions, layer_type=rope_key)
            assert torch.equal(table.cos, cos[0]), (case, layer_type, index)
            assert torch.equal(table.sin, sin[0]), (case, layer_type, index)
            # q/k: the model's apply with its tables == the notes' rule with the served ones
            seed = torch.Generator().manual_seed(index)
            q = torch.randn(1, 2, sweep.SEQ, config.head_dim, generator=seed)
            want = v4.apply_rotary_pos_emb(q, cos, sin)
            assert torch.equal(_rotate_by_notes(q, table.cos, table.sin), want)
            # the output de-rotation: (cos, -sin) of the same table
            back = v4.apply_rotary_pos_emb(want, cos, -sin)
            assert torch.equal(_rotate_by_notes(want, table.cos, -table.sin), back)
            if rope_key == "compress":
                # compressed entry i at i * compress_rate + first_window_position: rows of
                # the served table are the compressor's own cos/sin at those positions
                rate = notes["compress_rates"][layer_type]
                for first in (0, rate, 3 * rate):
                    if first >= sweep.SEQ:
                        continue
                    at = torch.arange((sweep.SEQ - 1 - first) // rate + 1) * rate + first
                    c, s = rotary(x, at[None], layer_type="compress")
                    assert torch.equal(table.cos[at], c[0])
                    assert torch.equal(table.sin[at], s[0])
    assert sorted(served_types) == sorted(set(config.layer_types))
