"""RoPE computed inside the graph by both of `torch.onnx.export`'s exporters (torch 2.13):
TorchScript (`dynamo=False`) folds transformers' `inv_freq` into a `Constant` node, dynamo keeps
it as an initializer (`test_torch_export.py` covers dynamo's llama3 in depth). Tiny random Llama
models with the default, linear (factor 4), llama3 (factor 8) and YaRN (factor 4) RoPE: the
exported frequencies verify exact against the served table, the same model with its scaling
dropped (the unscaled frequencies written into the constant, the builder's linear bug) is
diagnosed and repaired by `posenc-client plug`, and the plugged model's logits equal
transformers' forward within 1e-5 at 16 and 300 tokens (prefill) in onnxruntime.

Frequencies computed in `forward` (`1 / theta ** (arange(0, d, 2) / d)`, as some models write
their rotary module) are exported as a Range/Pow/Div chain over constants: found, evaluated,
verified and replaced by a `Constant`. Frequencies that depend on the length are refused,
naming the node.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from posenc_client.cli import main
from posenc_client.onnx import find_frequency_constants
from tests.client.parity import verify_three_ways
from tests.conftest import ServerHandle

LOGITS_ATOL = 1e-5
VOCAB, HEAD_DIM = 320, 32
THETA = 10000.0
ROPES: dict[str, dict[str, Any]] = {
    "default": {"rope_type": "default", "rope_theta": THETA},
    "linear": {"rope_type": "linear", "factor": 4.0, "rope_theta": THETA},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128,
        "rope_theta": THETA,
    },
    "yarn": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 128,
        "beta_fast": 8.0,
        "beta_slow": 1.0,
        "rope_theta": THETA,
    },
}
DROPPED = {
    "linear": "linear scaling is missing",
    "llama3": "llama3 scaling is missing",
    "yarn": "yarn scaling is missing",
}
"""What verify says of each scaled model whose constant holds the unscaled frequencies."""
SOURCES = {"torchscript": "constant", "dynamo": "initializer"}


class _Logits(nn.Module):
    """input_ids, attention_mask -> logits: TorchScript traces a tensor output, and an explicit
    mask keeps transformers 5 off its packed-sequence check (`torch.diff`, no ONNX symbolic)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        return logits


def _export(module: nn.Module, args: tuple[torch.Tensor, ...], names: list[str],
            path: Path, exporter: str, fold: bool = True, batch: bool = False) -> None:  # fmt: skip
    """`torch.onnx.export` with the sequence axis dynamic (and the batch axis with `batch`),
    quietly; `fold=False`: without constant folding (dynamo: `optimize=False`)."""
    dims = {0: "B", 1: "S"} if batch else {1: "S"}
    axes = {name: dims for name in names}
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        if exporter == "dynamo":
            program = torch.onnx.export(
                module, args, dynamo=True, input_names=names, output_names=["y"],
                dynamic_shapes=(dims,) * len(args), optimize=fold,
            )  # fmt: skip
            assert program is not None
            program.save(str(path))
        else:
            torch.onnx.export(
                module, args, str(path), dynamo=False, input_names=names, output_names=["y"],
                dynamic_axes=axes, opset_version=17, do_constant_folding=fold,
            )  # fmt: skip


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(exporter, variant) -> (transformers model, model.onnx, config.json), on first use."""
    root = tmp_path_factory.mktemp("torch-export")
    done: dict[tuple[str, str], tuple[Any, Path, Path]] = {}

    def get(exporter: str, variant: str) -> tuple[Any, Path, Path]:
        if (exporter, variant) not in done:
            folder = root / f"{exporter}-{variant}"
            torch.manual_seed(0)
            config = LlamaConfig(
                vocab_size=VOCAB, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                tie_word_embeddings=False, rope_parameters=ROPES[variant], use_cache=False,
            )  # fmt: skip
            model = LlamaForCausalLM(config).eval()
            model.save_pretrained(folder)
            ids = torch.randint(3, VOCAB, (1, 16))
            path = folder / "model.onnx"
            wrapped = _Logits(model)
            _export(wrapped, (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"],
                    path, exporter)  # fmt: skip
            done[exporter, variant] = model, path, folder / "config.json"
        return done[exporter, variant]

    return get


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _cli(server: ServerHandle, root: Path, *args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(["--url", server.url, "--cache-dir", str(root / "cache"), *args])
    return code, out.getvalue() + err.getvalue()


def _max_logit_error(model: Any, path: Path) -> list[float]:
    """Max abs error of the model's logits against transformers' at 16 and 300 tokens."""
    session, errors = _session(path), []
    for length in (16, 300):
        ids = np.random.default_rng(length).integers(3, VOCAB, (1, length), dtype=np.int64)
        with torch.no_grad():
            expected = model(torch.from_numpy(ids)).logits.numpy()
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        errors.append(float(np.abs(session.run(["y"], feeds)[0] - expected).max()))
    return errors


def _set_frequencies(source: Path, target: Path, values: np.ndarray) -> None:
    """A copy of `source` whose frequency constant holds `values` (an exporter's bug)."""
    model = onnx.load(source)
    (found,) = find_frequency_constants(model)
    tensor = onnx.numpy_helper.from_array(values.astype(np.float32).reshape(found.shape))
    for initializer in model.graph.initializer:
        if initializer.name == found.node:
            initializer.CopyFrom(onnx.numpy_helper.from_array(values.astype(np.float32),
                                                              found.node))  # fmt: skip
    for node in model.graph.node:
        if node.name == found.node:
            node.attribute[0].t.CopyFrom(tensor)
    onnx.save(model, target)


@pytest.mark.parametrize(
    ("exporter", "variant"),
    [("torchscript", v) for v in ROPES] + [("dynamo", "linear")],
)
def test_exported_frequencies_verify_plug_repair(
    server: ServerHandle, exported: Any, tmp_path: Path, exporter: str, variant: str
) -> None:
    model, source, config = exported(exporter, variant)
    (found,) = find_frequency_constants(source)
    assert (found.source, found.width, found.problem) == (SOURCES[exporter], 16, None)

    code, report = _cli(server, tmp_path, "verify", str(source), "--config", str(config))
    assert code == 0, report
    assert f"{found.node}: exact" in report
    assert max(_max_logit_error(model, source)) < LOGITS_ATOL

    unscaled = THETA ** (-np.arange(0, HEAD_DIM, 2, dtype=np.int64) / HEAD_DIM)
    broken = tmp_path / "broken.onnx"
    if variant == "default":  # no scaling to drop: the frequencies through float16
        _set_frequencies(source, broken, unscaled.astype(np.float16))
        expected_code, diagnosis = 8, "float16"
    else:
        _set_frequencies(source, broken, unscaled)
        expected_code, diagnosis = 8, DROPPED[variant]
    code, report = _cli(server, tmp_path, "verify", str(broken), "--config", str(config))
    assert (code, diagnosis in report) == (expected_code, True), report
    for path, expected in ((source, 0), (broken, expected_code)):  # CLI = library = route
        assert verify_three_ways(server, tmp_path, path, config)[0] == expected
    assert max(_max_logit_error(model, broken)) > LOGITS_ATOL

    plugged = tmp_path / "plugged.onnx"
    code, report = _cli(server, tmp_path, "plug", str(broken), "--hf-config", str(config),
                        "-o", str(plugged))  # fmt: skip
    assert code == 0, report
    code, report = _cli(server, tmp_path, "verify", str(plugged), "--config", str(config))
    assert code == 0, report
    assert max(_max_logit_error(model, plugged)) < LOGITS_ATOL


class _ForwardRope(nn.Module):
    """A rotary module computing its frequencies in `forward` (no buffer): q [B, S, d] ->
    q rotated at positions 0..S-1; with `by_length`, the base grows with S (as dynamic NTK);
    with `batched`, the frequencies are expanded to the batch and multiplied by a MatMul, as
    transformers' rotary modules and optimum's patched ones do."""

    def __init__(self, by_length: bool = False, batched: bool = False) -> None:
        super().__init__()
        self.by_length, self.batched = by_length, batched

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        length = q.shape[1]
        base = torch.tensor(THETA)
        if self.by_length:
            base = base * (torch.arange(length).float().max() + 1) / 16
        exponents = torch.arange(0, HEAD_DIM, 2, dtype=torch.int64).float() / HEAD_DIM
        inv_freq = 1.0 / base**exponents
        if self.batched:
            inv = inv_freq[None, :, None].expand(q.shape[0], -1, 1)  # [B, d/2, 1]
            positions = torch.arange(length).float()[None, None, :].expand(q.shape[0], 1, -1)
            freqs = (inv @ positions).transpose(1, 2)  # [B, S, d/2]
        else:
            freqs = torch.arange(length).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        half = q.shape[-1] // 2
        rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        return q * emb.cos() + rotated * emb.sin()


@pytest.mark.parametrize(
    ("exporter", "fold", "batched", "source", "shape"),
    [("torchscript", True, False, "constant", (1, 16)),
     ("torchscript", True, True, "constant", (1, 16, 1)),
     ("dynamo", False, False, "computed", (16,))],
)  # fmt: skip
def test_frequencies_computed_in_forward(
    server: ServerHandle,
    tmp_path: Path,
    exporter: str,
    fold: bool,
    batched: bool,
    source: str,
    shape: tuple[int, ...],
) -> None:
    """Both exporters fold the computation into a constant by default (dynamo: an initializer,
    as `test_exported_frequencies_verify_plug_repair` covers; TorchScript even without
    `do_constant_folding`); dynamo with `optimize=False` keeps the chain. Batched with a dynamic
    batch axis, the (1, d/2, 1) constant is expanded to a shape read from the input (optimum's
    export)."""
    model = tmp_path / "rope.onnx"
    q = torch.randn(2 if batched else 1, 16, HEAD_DIM)
    _export(_ForwardRope(batched=batched), (q,), ["q"], model, exporter, fold, batch=batched)
    (found,) = find_frequency_constants(model)
    assert (found.source, found.width, found.shape, found.problem) == (source, 16, shape, None)
    assert ("Pow" in found.ops) == (source == "computed")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "llama", "hidden_size": 4 * HEAD_DIM, "num_attention_heads": 4,
        "max_position_embeddings": 512, "rope_parameters": ROPES["default"],
    }))  # fmt: skip
    code, report = _cli(server, tmp_path, "verify", str(model), "--config", str(config))
    assert code in (0, 8), report  # the reference evaluator's pow: exact or a few ulp
    assert "mismatch" not in report
    assert verify_three_ways(server, tmp_path, model, config)[0] == code

    plugged = tmp_path / "plugged.onnx"
    code, report = _cli(server, tmp_path, "plug", str(model), "--hf-config", str(config),
                        "-o", str(plugged))  # fmt: skip
    assert code == 0, report
    code, report = _cli(server, tmp_path, "verify", str(plugged), "--config", str(config))
    assert code == 0, report
    assert f"{found.node}: exact" in report

    # the plugged graph rotates as transformers does, with its own frequencies
    rotary = LlamaRotaryEmbedding(LlamaConfig(**json.loads(config.read_text())))
    for length in (16, 300):
        x = torch.randn(1, length, HEAD_DIM, generator=torch.Generator().manual_seed(length))
        cos, sin = rotary(x, torch.arange(length)[None])
        expected, _ = apply_rotary_pos_emb(x[:, None], x[:, None], cos, sin)
        got = _session(plugged).run(["y"], {"q": x.numpy()})[0]
        np.testing.assert_allclose(got, expected[:, 0].numpy(), atol=1e-5 * math.sqrt(length),
                                   rtol=0)  # fmt: skip


def test_length_dependent_frequencies_refused(server: ServerHandle, tmp_path: Path) -> None:
    source = tmp_path / "rope.onnx"
    _export(_ForwardRope(by_length=True), (torch.randn(1, 16, HEAD_DIM),), ["q"], source,
            "dynamo")  # fmt: skip
    (found,) = find_frequency_constants(source)
    assert found.problem is not None
    assert found.product in found.problem
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "llama", "hidden_size": 4 * HEAD_DIM, "num_attention_heads": 4,
        "max_position_embeddings": 512, "rope_parameters": ROPES["default"],
    }))  # fmt: skip
    for command in ("verify", "plug"):
        args = [command, str(source), "--config" if command == "verify" else "--hf-config",
                str(config)]  # fmt: skip
        if command == "plug":
            args += ["-o", str(tmp_path / "x.onnx")]
        code, report = _cli(server, tmp_path, *args)
        # plug refuses (6); verify reports the site not checkable (9), never a pass (issue 28)
        assert code == (6 if command == "plug" else 9), report
        assert found.product in report
        assert "depend on the model's inputs" in report
        if command == "verify":
            assert "not checkable" in report
            three = verify_three_ways(server, tmp_path, source, config)
            assert [(s["name"], s["verdict"]) for s in three[1]["sites"]] == [
                (found.product, "not_checkable")
            ]
