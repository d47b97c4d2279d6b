"""Specs and helpers shared by the ONNX tests: one small spec per graph, run helpers."""

from __future__ import annotations

from typing import Any

import onnx
import torch

from posenc.encodings import SpecBase
from posenc.onnx import ort_run, ort_session, parse_export_spec

DTYPES = ("float32", "float16", "bfloat16")

# heads for T5 weights carried in the spec: (num_buckets=32, H=3), fixed values
T5_WEIGHTS = (torch.arange(32 * 3, dtype=torch.float32).reshape(32, 3) / 17.0 - 2.5).tolist()
# Shaw bias table carried in the spec: (2k + 1 = 7, H=2)
SHAW_WEIGHTS = (torch.arange(7 * 2, dtype=torch.float32).reshape(7, 2) / 3.0 - 2.0).tolist()
# a learned ViT-style table: 1 class token + a 4x4 grid, D = 6
LEARNED_TABLE = (torch.sin(torch.arange(17 * 6, dtype=torch.float32)).reshape(17, 6)).tolist()

BASE: dict[tuple[str, str], dict[str, Any]] = {
    # YaRN: attention scaling != 1 is folded into cos/sin.
    ("rope", "cos_sin"): {
        "kind": "rope",
        "head_dim": 16,
        "max_positions": 40,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 10,
        },
    },
    ("rope", "rotary"): {
        "kind": "rope",
        "head_dim": 16,
        "max_positions": 40,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 10,
        },
    },
    ("alibi", "bias"): {
        "kind": "alibi",
        "num_heads": 6,
        "bias": "causal",
        "query_length": 5,
        "key_length": 9,
        "query_offset": 4,
    },
    ("sinusoidal", "embedding"): {
        "kind": "sinusoidal",
        "convention": "fairseq",
        "dim": 17,
        "max_positions": 30,
    },
    ("sinusoidal_2d", "embedding"): {
        "kind": "sinusoidal_2d",
        "style": "detr",
        "num_pos_feats": 8,
        "height": 5,
        "width": 6,
        "valid_height": 4,
        "valid_width": 5,
        "normalize": True,
    },
    ("t5_bias", "bias"): {
        "kind": "t5_bias",
        "query_length": 6,
        "key_length": 150,
        "query_offset": 3,
        "relative_attention_bias": T5_WEIGHTS,
    },
    ("cope", "logits"): {"kind": "cope", "head_dim": 16, "npos_max": 12},
    # paper variant, a mask input and pos_emb carried in the spec
    ("cope", "attention"): {
        "kind": "cope",
        "head_dim": 8,
        "npos_max": 6,
        "variant": "paper",
        "mask": "input",
        "pos_emb": (torch.cos(torch.arange(8 * 7, dtype=torch.float32)).reshape(8, 7)).tolist(),
    },
    ("xpos", "cos_sin"): {
        "kind": "xpos",
        "head_dim": 16,
        "max_positions": 40,
        "position_offset": 3,
    },
    ("xpos", "rotary"): {"kind": "xpos", "head_dim": 16, "max_positions": 40},
    ("relative_index", "bias"): {
        "kind": "relative_index",
        "scheme": "shaw",
        "max_relative_position": 3,
        "query_length": 5,
        "key_length": 9,
        "query_offset": 4,
        "relative_position_bias_table": SHAW_WEIGHTS,
    },
    ("normalized", "embedding"): {
        "kind": "normalized",
        "mode": "by_last",
        "lengths": [5, 1, 0, 3],
        "max_positions": 6,
        "pad_value": -1.0,
    },
    # Qwen2.5-VL window order over a 2-frame 8x12 grid
    ("vision_rope", "cos_sin"): {
        "kind": "vision_rope",
        "style": "qwen2_vl",
        "head_dim": 16,
        "grid_height": 8,
        "grid_width": 12,
        "frames": 2,
        "window_size": 56,
        "patch_size": 14,
    },
    ("learned", "embedding"): {
        "kind": "learned",
        "method": "timm",
        "table": LEARNED_TABLE,
        "new_grid": [3, 5],
    },
}


def spec_for(kind: str, graph: str, dtype: str = "float32", **update: Any) -> SpecBase:
    """The base spec of (kind, graph) in `dtype`, with fields replaced."""
    return parse_export_spec({**BASE[(kind, graph)], "dtype": dtype, **update})


def run(model: onnx.ModelProto, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One onnxruntime CPU run (bfloat16 in and out supported)."""
    return ort_run(ort_session(model), feeds)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float) -> None:
    """Same shape and dtype; equal non-finite entries; |a - e| <= atol elsewhere."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    if not actual.dtype.is_floating_point:
        assert torch.equal(actual, expected)
        return
    a, e = actual.double(), expected.double()
    finite = torch.isfinite(e)
    assert torch.equal(torch.isfinite(a), finite)
    assert torch.equal(a[~finite], e[~finite])
    err = float((a - e).abs()[finite].max()) if bool(finite.any()) else 0.0
    assert err <= atol, f"max |error| {err} > {atol}"
