"""Static-shape exports (issue 28): `torch.onnx.export` (dynamo) of a tiny random Llama 3 (llama3
scaling) with fixed input shapes constant-folds transformers' rotary module into two full-width
tables (1, 1, S, d) that the graph multiplies into q and k (`q * cos + rotate_half(q) * sin`):
no RoPE consumer, no frequency constant. verify finds them as one `folded` site and compares
them with the exact table (was exit 6, "no RoPE consumer and no RoPE frequency constant").

The exporter folds with its own cos (onnxscript's optimizer, numpy): its constants depart from
transformers' own cos/sin by 1 ulp in some values, which verify reports as a harmless repair
(exit 8), its max abs error equal to the constants' distance from transformers' rotary module.
The same model with its scaling dropped (the constants of the default RoPE of the same theta)
is diagnosed, and a config of another scaling is a mismatch. CLI, library and route agree
(`tests.client.parity`). `plug` repairs what verify calls a repair: the folded constants
rewritten with the exact tables, verify exits 0 and onnxruntime's logits are transformers'.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from tests.client.parity import cli, verify_three_ways
from tests.conftest import ServerHandle

LENGTH, HEAD_DIM = 16, 32
ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128, "rope_theta": 10000.0}  # fmt: skip


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    """(transformers model, model.onnx exported with fixed shapes [1, 16], config.json)."""
    root = tmp_path_factory.mktemp("static")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=320, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=False, rope_scaling=ROPE, use_cache=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(root)
    ids = torch.randint(3, 320, (1, LENGTH))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        program = torch.onnx.export(
            model, (ids,), dynamo=True, input_names=["input_ids"], output_names=["logits"]
        )
    assert program is not None
    program.save(str(root / "model.onnx"))
    return model, root / "model.onnx", root / "config.json"


def _rotary(config: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """transformers' own cos/sin (S, d) for `config` at positions 0..S-1."""
    rotary = LlamaRotaryEmbedding(LlamaConfig(**config))
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), torch.arange(LENGTH)[None])
    return cos[0].numpy(), sin[0].numpy()


def _folded(path: Path) -> dict[str, onnx.TensorProto]:
    """The model's (.., S, d) float initializers: the folded cos/sin."""
    model = onnx.load(path)
    return {
        t.name: t
        for t in model.graph.initializer
        if list(t.dims)[-2:] == [LENGTH, HEAD_DIM] and all(d == 1 for d in t.dims[:-2])
    }


def test_folded_tables_are_found_and_verified(
    server: ServerHandle, exported: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    _, source, config_path = exported
    config = json.loads(config_path.read_text())
    code, report = verify_three_ways(server, tmp_path, source, config_path)
    sites = report["sites"]
    assert [(s["kind"], s["shape"], s["rows"]) for s in sites] == [
        ("folded", [LENGTH, HEAD_DIM // 2], LENGTH)
    ] * 2
    assert len(sites[0]["nodes"]) == 2 * config["num_hidden_layers"]  # q and k of each layer
    # the exporter's constants against transformers' own: what verify measured
    folded = _folded(source)
    assert set(folded) == {sites[0]["name"], sites[1]["name"]}
    cos, sin = _rotary(config)
    for site, theirs in zip(sites, (cos, sin), strict=True):
        values = numpy_helper.to_array(folded[site["name"]]).reshape(LENGTH, HEAD_DIM)
        distance = float(np.abs(values - theirs).max())
        assert site["max_abs"] == pytest.approx(distance, rel=0, abs=1e-12)
        if distance == 0:
            assert site["verdict"] == "exact"
        else:  # folded with numpy's cos: a few ulp from torch's
            assert site["verdict"] == "repair"
            assert "ulp: another op order or libm" in " ".join(site["diagnosis"])
    assert code == (0 if all(s["verdict"] == "exact" for s in sites) else 8)

    # the scaling dropped: the folded tables of the default RoPE of the same theta
    default = {**config, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    default.pop("rope_scaling", None)
    unscaled = onnx.load(source)
    values = dict(zip((sites[0]["name"], sites[1]["name"]), _rotary(default), strict=True))
    for initializer in unscaled.graph.initializer:
        if initializer.name in values:
            array = values[initializer.name].reshape(list(initializer.dims))
            initializer.CopyFrom(numpy_helper.from_array(array, initializer.name))
    broken = tmp_path / "unscaled.onnx"
    onnx.save(unscaled, broken)
    code, report = verify_three_ways(server, tmp_path, broken, config_path)
    assert code == 8, report
    assert "llama3 scaling is missing" in " ".join(report["sites"][0]["diagnosis"])

    # the llama3 model against the default config: not this config
    default_path = tmp_path / "default.json"
    default_path.write_text(json.dumps(default))
    code, report = verify_three_ways(server, tmp_path, source, default_path)
    assert code == 6, report
    assert {s["verdict"] for s in report["sites"]} == {"mismatch"}


def _logits(path: Path, ids: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], {"input_ids": ids})
    return np.asarray(logits)


def test_plug_repairs_folded_tables(
    server: ServerHandle, exported: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    """verify's repair (exit 8) is what plug does: the scaling-dropped model's folded constants
    rewritten with the exact llama3 tables, then verify exits 0 and the model's logits are
    transformers' (the broken model's are not)."""
    model, source, config_path = exported
    config = json.loads(config_path.read_text())
    default = {**config, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    default.pop("rope_scaling", None)
    broken = onnx.load(source)
    sites = {t.name for t in _folded(source).values()}
    cos, sin = _rotary(default)
    for initializer in broken.graph.initializer:
        if initializer.name in sites:
            values = numpy_helper.to_array(initializer)
            is_sin = bool(np.any(values.reshape(LENGTH, HEAD_DIM)[0] != 1.0))  # cos(0) = 1
            array = (sin if is_sin else cos).reshape(list(initializer.dims))
            initializer.CopyFrom(numpy_helper.from_array(array, initializer.name))
    assert len(sites) == 2
    broken_path = tmp_path / "unscaled.onnx"
    onnx.save(broken, broken_path)
    code, _ = verify_three_ways(server, tmp_path, broken_path, config_path)
    assert code == 8

    fixed = tmp_path / "fixed.onnx"
    code, output = cli(server, tmp_path, "plug", str(broken_path), "--config", str(config_path),
                       "-o", str(fixed))  # fmt: skip
    assert code == 0, output
    assert "into 1 folded site;" in output
    code, report = verify_three_ways(server, tmp_path, fixed, config_path)
    assert code == 0, report
    assert {s["verdict"] for s in report["sites"]} == {"exact"}

    ids = np.arange(3, 3 + LENGTH, dtype=np.int64)[None]
    with torch.no_grad():
        want = model(torch.from_numpy(ids)).logits.numpy()
    good = float(np.abs(_logits(fixed, ids) - want).max())
    bad = float(np.abs(_logits(broken_path, ids) - want).max())
    assert good < 1e-4
    assert bad > max(1e-3, 10 * good)  # 3e-3 here: the repair is what brought them back
