"""`posenc-client fetch --preset NAME --layer-type TYPE`: the preset's part for that layer type
(Gemma 3's parts are its layer types), with FIELD=VALUE overrides, equal to transformers' own
Gemma 3 rotary for that layer type, through the console script against the real server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Gemma3TextConfig
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

from posenc_client import Tables
from tests.conftest import ServerHandle
from tests.tolerances import served_as_reference

CLI = Path(sys.executable).with_name("posenc-client")
ROWS = 600  # a few hundred positions: every pair of both tables turns


def gemma3_27b() -> Gemma3TextConfig:
    """google/gemma-3-27b-it's text_config as published on the Hub (legacy keys: rope_theta,
    rope_local_base_freq, rope_scaling), which transformers maps to per-layer-type
    rope_parameters itself."""
    return Gemma3TextConfig(
        head_dim=128,
        hidden_size=5376,
        intermediate_size=21504,
        num_attention_heads=32,
        num_key_value_heads=16,
        num_hidden_layers=62,
        query_pre_attn_scalar=168,
        sliding_window=1024,
        max_position_embeddings=131072,
        rope_theta=1000000.0,
        rope_local_base_freq=10000.0,
        rope_scaling={"factor": 8.0, "rope_type": "linear"},
    )


def run_cli(server: ServerHandle, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(CLI), "--url", server.url, "--cache-dir", str(tmp_path / "cache"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("layer_type", ["sliding_attention", "full_attention"])
def test_preset_layer_type_matches_transformers(
    server: ServerHandle, tmp_path: Path, layer_type: str
) -> None:
    out = tmp_path / f"{layer_type}.safetensors"
    done = run_cli(server, tmp_path, "fetch", "--preset", "gemma-3-27b", "--layer-type",
                   layer_type, f"max_positions={ROWS}", "-o", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    tables = Tables.from_safetensors(out.read_bytes())
    config = gemma3_27b()
    assert layer_type in config.layer_types
    module = Gemma3RotaryEmbedding(config)
    x = torch.zeros(1, dtype=torch.float32)
    cos, sin = module(x, torch.arange(ROWS)[None, :], layer_type=layer_type)
    assert tables["cos"].dtype == np.float32
    assert tables["cos"].shape == (ROWS, 128)
    # bit-equal from a CPU server; within the 2-ulp bound of docs/gpu.md from a GPU server
    assert served_as_reference(torch.from_numpy(tables["cos"].copy()), cos[0], server.device)
    assert served_as_reference(torch.from_numpy(tables["sin"].copy()), sin[0], server.device)
    # the same part named in the preset argument: the same table
    done = run_cli(server, tmp_path, "fetch", "--preset", f"gemma-3-27b/{layer_type}",
                   f"max_positions={ROWS}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f'"key": "{tables.key}"' in done.stdout


def test_preset_layer_type_errors(server: ServerHandle, tmp_path: Path) -> None:
    done = run_cli(server, tmp_path, "fetch", "--preset", "gemma-3-27b")
    assert done.returncode == 2
    assert "sliding_attention, full_attention" in done.stderr
    assert "--layer-type PART" in done.stderr
    done = run_cli(server, tmp_path, "fetch", "--preset", "gemma-3-27b", "--layer-type",
                   "global_attention")  # fmt: skip
    assert done.returncode == 3
    assert "unknown_preset_part" in done.stderr
    assert "full_attention" in done.stderr
    done = run_cli(server, tmp_path, "fetch", "--preset", "gemma-3-27b/full_attention",
                   "--layer-type", "sliding_attention")  # fmt: skip
    assert done.returncode == 2
    assert "names part 'full_attention' but --layer-type 'sliding_attention'" in done.stderr
