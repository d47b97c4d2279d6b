"""`make gguf-check`: llama.cpp itself as the oracle for `posenc-client verify/plug` on GGUF.

llama-cpp-python is distributed as a source package whose build compiles llama.cpp, so it lives in
its own environment (.venv-gguf, from requirements/gguf.txt), outside `make test`. Three steps:

- `convert DIR SRC` (in the suite's .venv; SRC is the llama-cpp-python source package's
  `vendor/llama.cpp`): tiny random-weight transformers models (the suite's transformers, the
  reference) for llama (default RoPE), llama (llama3 scaling), qwen2 (YaRN), phi3 (LongRoPE) and
  gemma3 (linear scaling on the global layers, base 10000 on the local ones), each saved with a
  small SentencePiece vocabulary and converted by llama.cpp's own `convert_hf_to_gguf.py` (f32
  weights; its vendored `gguf-py` must be the `gguf` release the suite's client reads and writes
  with). Transformers' logits for a prompt longer than the original context are saved beside
  each (`reference.npz`). Then a posenc server on loopback, and per model: `posenc-client verify`
  on the converted file, a deliberately broken copy (scaling dropped, wrong base or swapped
  LongRoPE factors) verified and `posenc-client plug`ged.
- `run DIR` (in .venv-gguf): llama.cpp's logits (llama-cpp-python, every position of one batch,
  the context exactly the prompt) for the converted, broken and plugged files (`llama_cpp.npz`).
- `report DIR` (in the suite's .venv): their largest absolute difference from transformers',
  within the original context and past it, as the markdown table docs/gguf.md records.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

VOCAB, HEAD_DIM, ORIGINAL, LENGTH = 320, 32, 64, 192
"""Vocabulary (the converter pads the tokenizer's 256 pieces to it), head width, the original
context of the scaled models, and the prompt: three times the original context."""
SMALL = {"vocab_size": VOCAB, "hidden_size": 128, "intermediate_size": 192,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": HEAD_DIM, "tie_word_embeddings": False, "bos_token_id": 1,
         "eos_token_id": 2, "pad_token_id": 0, "initializer_range": 0.2}  # fmt: skip
"""initializer_range 0.2 (transformers' default is 0.02): attention scores of order one, so that
attention depends on position and a wrong RoPE shows in the logits."""


def _longrope_factors() -> dict[str, list[float]]:
    """Per-pair LongRoPE divisors, increasing from high to low frequency as Phi-3's are."""
    pairs = np.arange(HEAD_DIM // 2) / (HEAD_DIM // 2 - 1)
    return {"short_factor": [float(1.0 + 0.1 * x) for x in pairs],
            "long_factor": [float(1.0 + 7.0 * x**2) for x in pairs]}  # fmt: skip


MODELS: dict[str, tuple[str, dict[str, Any], str]] = {
    # name: (transformers config class, its fields, what the broken copy does)
    "llama_default": ("LlamaConfig", {"max_position_embeddings": 4 * ORIGINAL,
                                      "rope_parameters": {"rope_type": "default",
                                                          "rope_theta": 10000.0}},
                      "wrong base"),
    "llama3": ("LlamaConfig", {"max_position_embeddings": 8 * ORIGINAL,
                               "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
                                                   "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": ORIGINAL}},
               "scaling dropped"),
    "qwen2_yarn": ("Qwen2Config", {"max_position_embeddings": 4 * ORIGINAL,
                                   "rope_parameters": {"rope_type": "yarn",
                                                       "rope_theta": 1000000.0, "factor": 4.0,
                                                       "original_max_position_embeddings":
                                                           ORIGINAL}},
                   "scaling dropped"),
    "phi3_longrope": ("Phi3Config", {"max_position_embeddings": 4 * ORIGINAL,
                                     "original_max_position_embeddings": ORIGINAL,
                                     "rope_parameters": {"rope_type": "longrope",
                                                         "rope_theta": 10000.0,
                                                         **_longrope_factors()}},
                      "swapped factors"),
    "gemma3_linear": ("Gemma3TextConfig", {"max_position_embeddings": 8 * ORIGINAL,
                                           "num_hidden_layers": 6, "sliding_window": 512,
                                           "query_pre_attn_scalar": HEAD_DIM,
                                           "rope_parameters": {
                                               "full_attention": {"rope_type": "linear",
                                                                  "rope_theta": 1000000.0,
                                                                  "factor": 8.0},
                                               "sliding_attention": {"rope_type": "default",
                                                                     "rope_theta": 10000.0}}},
                      "scaling dropped"),
}  # fmt: skip
"""Gemma 3: six layers so that the last one is global (llama.cpp fixes the pattern at five local,
one global; transformers' default layer_types agree); the sliding window is wider than the
prompt, so both mask nothing and only RoPE differs between the layer types."""


def _ids() -> np.ndarray:
    return np.random.default_rng(LENGTH).integers(3, 256, (1, LENGTH), dtype=np.int64)


def _tokenizer(root: Path) -> Path:
    """A 256-piece SentencePiece model (the converter reads `tokenizer.model` for all five
    architectures; the prompt is given as token ids, so its pieces never matter)."""
    import sentencepiece as spm

    path = root / "tokenizer.model"
    if not path.exists():
        words = [f"w{i:x}z{i * 7 % 97:x}" for i in range(4000)]
        text = root / "corpus.txt"
        text.write_text("\n".join(" ".join(words[j : j + 12]) for j in range(0, 4000, 12)))
        spm.SentencePieceTrainer.train(
            input=str(text), model_prefix=str(root / "tokenizer"), vocab_size=256,
            model_type="bpe", character_coverage=1.0, byte_fallback=False, bos_id=1, eos_id=2,
            unk_id=3, pad_id=0, minloglevel=2,
        )  # fmt: skip
    return path


def _rewrite(src: Path, dst: Path, *, keys: dict[str, Any], drop: set[str],
             tensors: dict[str, np.ndarray]) -> None:  # fmt: skip
    """`src` with the metadata keys in `drop` (keys or tensors) removed, `keys` set (float32)
    and `tensors` replaced (float32), every other key and tensor copied byte for byte: the
    broken copies."""
    import gguf

    reader = gguf.GGUFReader(src, "r")
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch, endianess=reader.endianess)
    for name, field in reader.fields.items():
        if name == "general.architecture" or name.startswith("GGUF.") or name in drop:
            continue
        if name in keys:
            writer.add_key_value(name, keys[name], gguf.GGUFValueType.FLOAT32)
            continue
        main = field.types[0]
        sub = field.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), main, sub_type=sub)
    kept = [t for t in reader.tensors if t.name not in drop]
    for tensor in kept:
        data = tensors.get(tensor.name, tensor.data)
        writer.add_tensor_info(tensor.name, data.shape, data.dtype, data.nbytes,
                               tensor.tensor_type)  # fmt: skip
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in kept:
        writer.write_tensor_data(tensors.get(tensor.name, tensor.data),
                                 tensor_endianess=reader.endianess)  # fmt: skip
    writer.close()


def _break(name: str, arch: str, src: Path, dst: Path) -> None:
    import gguf

    reader = gguf.GGUFReader(src, "r")
    present = {t.name: np.array(t.data) for t in reader.tensors}
    fields = reader.fields
    if MODELS[name][2] == "wrong base":
        base = float(fields[f"{arch}.rope.freq_base"].contents())
        _rewrite(src, dst, keys={f"{arch}.rope.freq_base": base * 4}, drop=set(), tensors={})
    elif MODELS[name][2] == "swapped factors":
        _rewrite(src, dst, keys={}, drop=set(), tensors={
            "rope_factors_long.weight": present["rope_factors_short.weight"],
            "rope_factors_short.weight": present["rope_factors_long.weight"]})  # fmt: skip
    else:  # scaling dropped: the scaling keys and the divisor tensors
        scaling = {n for n in fields if n.startswith(f"{arch}.rope.scaling.")}
        _rewrite(src, dst, keys={}, drop=scaling | {"rope_freqs.weight"}, tensors={})


def convert(root: Path, source: Path) -> None:
    """Runs in the suite's .venv: the reference models, llama.cpp's converter, verify and plug."""
    import gguf
    import torch
    import transformers

    from posenc_client.cli import main as cli_main
    from tests.conftest import start_server

    vendored = (source / "gguf-py" / "pyproject.toml").read_text()
    vendored_version = next(
        line.split('"')[1] for line in vendored.splitlines() if line.startswith("version")
    )
    installed = gguf.__version__ if hasattr(gguf, "__version__") else _dist_version("gguf")
    if vendored_version != installed:
        raise SystemExit(f"the converter's gguf-py is {vendored_version}, the suite's gguf "
                         f"{installed}: relock requirements/gguf.txt or the suite")  # fmt: skip
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"gguf {installed} (the converter's vendored gguf-py: {vendored_version})")  # fmt: skip
    tokenizer = _tokenizer(root)
    ids = _ids()
    handle = start_server()

    def cli(*args: str) -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = cli_main(["--url", handle.url, "--cache-dir", str(root / "cache"), *args])
        return code, out.getvalue()

    def verify(path: Path, config: Path) -> dict[str, Any]:
        code, out = cli("verify", str(path), "--hf-config", str(config), "--json")
        report: dict[str, Any] = json.loads(out)
        report["exit"] = code
        return report

    summary: dict[str, Any] = {}
    for name, (class_name, fields, breakage) in MODELS.items():
        folder = root / name
        hf = folder / "hf"
        torch.manual_seed(0)
        config = getattr(transformers, class_name)(**{**SMALL, **fields})
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        model.save_pretrained(hf)
        shutil.copy(tokenizer, hf / "tokenizer.model")
        with torch.no_grad():
            logits = model(torch.from_numpy(ids)).logits[0].numpy()
        np.savez(folder / "reference.npz", ids=ids, logits=logits)
        converted = folder / "converted.gguf"
        subprocess.run(
            [sys.executable, str(source / "convert_hf_to_gguf.py"), str(hf), "--outtype", "f32",
             "--outfile", str(converted)],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        arch = str(gguf.GGUFReader(converted, "r").fields["general.architecture"].contents())
        broken = folder / "broken.gguf"
        _break(name, arch, converted, broken)
        plugged = folder / "plugged.gguf"
        plug_code, plug_out = cli("plug", str(broken), "--hf-config", str(hf / "config.json"),
                                  "-o", str(plugged))  # fmt: skip
        summary[name] = {
            "arch": arch,
            "breakage": breakage,
            "converted": verify(converted, hf / "config.json"),
            "broken": verify(broken, hf / "config.json"),
            "plug": {"exit": plug_code, "out": plug_out.strip()},
            "plugged": verify(plugged, hf / "config.json") if plug_code == 0 else None,
        }
        print(f"converted {name} ({arch})")
    handle.server.should_exit = True
    (root / "summary.json").write_text(json.dumps(summary, indent=1))


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def run(root: Path) -> None:
    """Runs in .venv-gguf: llama.cpp's logits for each file (llama-cpp-python)."""
    import llama_cpp

    print(f"llama-cpp-python {llama_cpp.__version__}")
    for name in MODELS:
        folder = root / name
        ids = np.load(folder / "reference.npz")["ids"][0]
        out: dict[str, np.ndarray] = {}
        for which in ("converted", "broken", "plugged"):
            path = folder / f"{which}.gguf"
            if not path.exists():
                continue
            llm = llama_cpp.Llama(
                model_path=str(path), n_ctx=LENGTH, n_batch=LENGTH, n_ubatch=LENGTH,
                n_threads=1, n_threads_batch=1, logits_all=True, verbose=False,
                type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
            )  # fmt: skip
            llm.eval([int(i) for i in ids])
            out[which] = np.array(llm.scores[:LENGTH], dtype=np.float32)
            llm.close()
        np.savez(folder / "llama_cpp.npz", **out)
        print(f"ran {name}")


def _diff(a: np.ndarray, b: np.ndarray) -> str:
    inside = float(np.abs(a[:ORIGINAL] - b[:ORIGINAL]).max())
    past = float(np.abs(a[ORIGINAL:] - b[ORIGINAL:]).max())
    return f"{inside:.1e} / {past:.1e}"


def _verdict(report: dict[str, Any] | None) -> str:
    if report is None:
        return "-"
    diagnosis = [d for t in report["tables"] for d in t.get("diagnosis") or []]
    text = f"exit {report['exit']} {report['outcome']}"
    return text + (": " + "; ".join(diagnosis) if diagnosis else "")


def report(root: Path) -> None:
    """Runs in the suite's .venv: the table."""
    summary = json.loads((root / "summary.json").read_text())
    columns = [
        "model (GGUF arch), largest logit",
        "verify, converted",
        f"llama.cpp vs transformers, converted: positions < {ORIGINAL} / {ORIGINAL}..{LENGTH - 1}",
        "broken copy",
        "verify, broken",
        "llama.cpp, broken",
        "verify, plugged",
        "llama.cpp, plugged",
    ]
    print("| " + " | ".join(columns) + " |")
    print("|---|---|---:|---|---|---:|---|---:|")
    for name, entry in summary.items():
        reference = np.load(root / name / "reference.npz")["logits"]
        ours = np.load(root / name / "llama_cpp.npz")
        cells = {k: _diff(ours[k], reference) if k in ours else "-"
                 for k in ("converted", "broken", "plugged")}  # fmt: skip
        print("| " + " | ".join([
            f"{name} ({entry['arch']}), {float(np.abs(reference).max()):.2f}",
            _verdict(entry["converted"]), cells["converted"],
            entry["breakage"], _verdict(entry["broken"]), cells["broken"],
            _verdict(entry["plugged"]), cells["plugged"],
        ]) + " |")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("step", choices=("convert", "run", "report"))
    parser.add_argument("dir", type=Path)
    parser.add_argument("source", type=Path, nargs="?", help="convert: vendor/llama.cpp")
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    if args.step == "convert":
        if args.source is None:
            parser.error("convert needs the llama.cpp source folder")
        convert(args.dir, args.source)
    elif args.step == "run":
        run(args.dir)
    else:
        report(args.dir)


if __name__ == "__main__":
    main(sys.argv[1:])
