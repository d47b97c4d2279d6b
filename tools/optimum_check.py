"""`make optimum-check`: what posenc does with models exported by optimum (optimum-onnx).

optimum-onnx 0.1.0 pins transformers<4.58, which clashes with the suite's transformers 5, so it
runs in its own environment (.venv-optimum, from requirements/optimum.txt), outside `make test`:

- `export DIR` (in .venv-optimum): tiny random-weight Llama models (head_dim 32, 2 layers,
  4 heads / 2 KV heads, 512 positions; RoPE default, linear (factor 4), llama3 (factor 8), YaRN
  (factor 4, beta_fast 8 / beta_slow 1)) saved with that transformers, exported by optimum's
  `main_export` (task text-generation-with-past), and transformers' logits at 16 and 300 tokens
  saved beside each (`reference.npz`): the reference is the transformers optimum runs with.
- `check DIR` (in the suite's .venv): a posenc server on loopback, then per model
  `posenc-client verify` on the export (what it finds and its verdict), the same model with the
  scaling dropped (the unscaled frequencies written into the constant) verified and plugged,
  and the logits of the export and of the plugged model in onnxruntime against the reference
  (prefill, empty KV cache). Prints a markdown table (docs/onnx.md records it).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

VOCAB, HEAD_DIM, THETA, LENGTHS = 320, 32, 10000.0, (16, 300)
ROPES: dict[str, dict[str, Any] | None] = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128,
    },
    "yarn": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 128,
        "beta_fast": 8.0,
        "beta_slow": 1.0,
    },
}


def export(root: Path) -> None:
    """Runs in .venv-optimum (transformers 4.57, optimum-onnx)."""
    import optimum.version
    import torch
    import transformers
    from optimum.exporters.onnx import main_export
    from transformers import LlamaConfig, LlamaForCausalLM

    print(f"transformers {transformers.__version__}, optimum {optimum.version.__version__}, "
          f"torch {torch.__version__}")  # fmt: skip
    for name, scaling in ROPES.items():
        folder = root / name
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=VOCAB, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            tie_word_embeddings=False, rope_theta=THETA, rope_scaling=scaling,
        )  # fmt: skip
        model = LlamaForCausalLM(config).eval()
        model.save_pretrained(folder / "hf")
        main_export(
            str(folder / "hf"), output=folder / "onnx", task="text-generation-with-past",
            do_validation=False,
        )  # fmt: skip
        reference = {}
        for length in LENGTHS:
            ids = np.random.default_rng(length).integers(3, VOCAB, (1, length), dtype=np.int64)
            with torch.no_grad():
                reference[f"logits{length}"] = model(torch.from_numpy(ids)).logits.numpy()
            reference[f"ids{length}"] = ids
        np.savez(folder / "reference.npz", **reference)
        print(f"exported {name}")


def _logits(path: Path, ids: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds: dict[str, np.ndarray] = {}
    for value in session.get_inputs():
        if value.name == "input_ids":
            feeds[value.name] = ids
        elif value.name == "attention_mask":
            feeds[value.name] = np.ones_like(ids)
        elif value.name == "position_ids":
            feeds[value.name] = np.arange(ids.shape[1], dtype=np.int64)[None]
        elif value.name.startswith("past_key_values"):
            feeds[value.name] = np.zeros((1, 2, 0, HEAD_DIM), np.float32)
        else:
            raise SystemExit(f"unexpected input {value.name}")
    logits: np.ndarray = session.run(["logits"], feeds)[0]
    return logits


def _errors(path: Path, reference: Any) -> str:
    return " / ".join(
        f"{float(np.abs(_logits(path, reference[f'ids{n}']) - reference[f'logits{n}']).max()):.1e}"
        for n in LENGTHS
    )


def check(root: Path) -> None:
    """Runs in the suite's .venv (posenc, posenc-client, onnxruntime)."""
    import onnx
    from onnx import numpy_helper

    from posenc_client import Client
    from posenc_client.cli import main
    from posenc_client.onnx import find_frequency_constants, find_rope_consumers
    from tests.conftest import start_server

    handle = start_server()

    def cli(*args: str) -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = main(["--url", handle.url, "--cache-dir", str(root / "cache"), *args])
        return code, out.getvalue()

    def verify(path: Path, config: Path) -> str:
        """verify's exit code and verdicts; the route (the explorer's check pane) must answer
        the same outcome and verdict per site (issue 28), else this fails."""
        code, out = cli("verify", str(path), "--config", str(config), "--json")
        report = json.loads(out)
        reports = report["sites"]
        with Client(handle.url, cache=False) as client:
            (spec,) = client.resolve(json.loads(config.read_text()), kind="rope")
        with handle.client() as http:
            answer = http.post(
                "/v1/check/onnx",
                params={"key": spec.key},
                content=onnx.load(path).SerializeToString(),  # any external data inline
            ).json()
        route = [(r["name"], r["verdict"]) for r in answer["caches"]]
        if answer["outcome"] != report["outcome"] or route != [
            (r["name"], r["verdict"]) for r in reports
        ]:
            raise SystemExit(f"{path}: the route answered {answer} where verify said {report}")
        return f"exit {code} (route: the same): " + "; ".join(
            f"{r['verdict']} ({', '.join(r['diagnosis']) or 'max abs 0'})" for r in reports
        )

    rows = []
    for name in ROPES:
        folder = root / name
        source = folder / "onnx" / "model.onnx"
        config = folder / "hf" / "config.json"
        reference = np.load(folder / "reference.npz")
        model = onnx.load(source, load_external_data=False)
        found = find_frequency_constants(model)
        what = f"{len(find_rope_consumers(model))} RoPE consumers; frequencies: " + ", ".join(
            f"{c.node} ({c.source}, {list(c.shape)})" for c in found
        )
        verdict = verify(source, config)
        broken_note = "-"
        plugged_errors = "-"
        if found and ROPES[name] is not None:
            broken = onnx.load(source)
            unscaled = THETA ** (-np.arange(0, HEAD_DIM, 2, dtype=np.int64) / HEAD_DIM)
            values = unscaled.astype(np.float32).reshape(found[0].shape)
            for node in broken.graph.node:
                if node.name == found[0].node:
                    node.attribute[0].t.CopyFrom(numpy_helper.from_array(values))
            for initializer in broken.graph.initializer:
                if initializer.name == found[0].node:
                    initializer.CopyFrom(numpy_helper.from_array(values, initializer.name))
            broken_path = folder / "broken.onnx"
            onnx.save(broken, broken_path)
            broken_note = f"{_errors(broken_path, reference)}; verify {verify(broken_path, config)}"
            plugged = folder / "plugged.onnx"
            code, _ = cli("plug", str(broken_path), "--hf-config", str(config),
                          "-o", str(plugged))  # fmt: skip
            plugged_errors = _errors(plugged, reference) if code == 0 else f"plug exit {code}"
        rows.append((name, what, verdict, _errors(source, reference), broken_note,
                     plugged_errors))  # fmt: skip
    handle.server.should_exit = True
    print("| model | what plug finds | verify on the export | export vs transformers, 16 / 300 "
          "| scaling dropped: logits, verify | plugged, 16 / 300 |")  # fmt: skip
    print("|---|---|---|---:|---|---:|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("export", "check"))
    parser.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    (export if args.step == "export" else check)(args.dir)


if __name__ == "__main__":
    main(sys.argv[1:])
