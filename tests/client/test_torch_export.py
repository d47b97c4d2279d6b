"""RoPE computed inside the graph: `torch.onnx.export` (dynamo) of a tiny random Llama 3
(llama3 scaling) keeps transformers' `inv_freq` as an initializer and computes cos/sin in the
graph. `posenc-client plug` finds the constant, verifies it (exact: transformers' own values)
and replaces it; a model whose exporter dropped the scaling (the constant set to the unscaled
frequencies) is diagnosed and repaired; another config is refused. Logits in onnxruntime
against transformers' forward within 1e-4 at 16 and 300 tokens. The model is exported once.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from transformers import LlamaConfig, LlamaForCausalLM

from posenc_client.cli import main
from posenc_client.onnx import find_frequency_constants
from tests.client.parity import verify_three_ways
from tests.conftest import ServerHandle

LOGITS_ATOL = 1e-4
VOCAB = 320
ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 128,
    "rope_theta": 10000.0,
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    """(transformers model, model.onnx, config.json)."""
    root = tmp_path_factory.mktemp("dynamo")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=False, rope_scaling=ROPE, use_cache=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(root)
    ids = torch.randint(3, VOCAB, (1, 16))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        program = torch.onnx.export(
            model, (ids,), dynamo=True, input_names=["input_ids"], output_names=["logits"],
            dynamic_shapes={"input_ids": {1: "S"}},
        )  # fmt: skip
    assert program is not None
    program.save(str(root / "model.onnx"))
    return model, root / "model.onnx", root / "config.json"


def _logits(path: Path, ids: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    logits: np.ndarray = session.run(["logits"], {"input_ids": ids})[0]
    return logits


def _cli(server: ServerHandle, root: Path, *args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(["--url", server.url, "--cache-dir", str(root / "cache"), *args])
    return code, out.getvalue() + err.getvalue()


def _check_logits(model: Any, path: Path) -> None:
    for length in (16, 300):
        ids = np.random.default_rng(length).integers(3, VOCAB, (1, length), dtype=np.int64)
        with torch.no_grad():
            expected = model(torch.from_numpy(ids)).logits.numpy()
        np.testing.assert_allclose(_logits(path, ids), expected, atol=LOGITS_ATOL, rtol=0)


def test_in_graph_frequencies_plug_verify_repair(
    server: ServerHandle, exported: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    model, source, config = exported
    found = find_frequency_constants(source)
    assert [(c.node, c.width) for c in found] == [("model.rotary_emb.inv_freq", 16)]

    code, report = _cli(server, tmp_path, "verify", str(source), "--config", str(config))
    assert code == 0, report
    assert "model.rotary_emb.inv_freq: exact" in report

    # an exporter that dropped the llama3 scaling: unscaled frequencies in the constant
    broken = onnx.load(source)
    inv = next(t for t in broken.graph.initializer if t.name == "model.rotary_emb.inv_freq")
    unscaled = (10000.0 ** (-np.arange(0, 32, 2, dtype=np.int64) / 32)).astype(np.float32)
    inv.CopyFrom(numpy_helper.from_array(unscaled, inv.name))
    broken_path = tmp_path / "broken.onnx"
    onnx.save(broken, broken_path)
    code, report = _cli(server, tmp_path, "verify", str(broken_path), "--config", str(config))
    assert code == 8, report
    assert "llama3 scaling is missing" in report
    # the route (the explorer's check pane) and the library give the same outcome per site
    # (issue 28: the route answered 422 no_rope_caches for this model)
    for path, expected in ((source, 0), (broken_path, 8)):
        code, three = verify_three_ways(server, tmp_path, path, config)
        assert code == expected, three
        assert [s["kind"] for s in three["sites"]] == ["frequencies"]
    plugged = tmp_path / "plugged.onnx"
    code, report = _cli(server, tmp_path, "plug", str(broken_path), "--hf-config", str(config),
                        "-o", str(plugged))  # fmt: skip
    assert code == 0, report
    _check_logits(model, plugged)

    # the default-RoPE config into the llama3 model (issue 19): refused, unless --force
    default = json.loads(config.read_text())
    default["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    other = tmp_path / "default.json"
    other.write_text(json.dumps(default))
    args = ("plug", str(source), "--hf-config", str(other), "-o", str(tmp_path / "x.onnx"))
    code, report = _cli(server, tmp_path, *args)
    assert code == 6, report
    assert "another scaling variant" in report
    assert "do not look like this config" in report
    code, report = _cli(server, tmp_path, *args, "--force")
    assert code == 0, report
