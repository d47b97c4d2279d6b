"""Every example of clients/python/README.md runs against a live server.

The ```python blocks run in order in one namespace; every `$ ` line of the ```console blocks runs
in a shell and must exit 0. The working folder holds the files the examples name: `config.json`
(Llama 3.1), `bloom.json`, `model.onnx` (a GroupQueryAttention block that reads cos/sin inputs),
`attention.onnx` (an ONNX Attention with an attn_mask input) and `model.gguf` (config.json's RoPE
as llama.cpp's converter writes it: tests/client/gguf_files.py); the README's server URL is the
test server's, and huggingface_hub's cache (offline) holds the real configs of tests/data/configs
for the model-id examples (`tests.hub`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from tests.client import blocks, gguf_files
from tests.conftest import ServerHandle
from tests.hub import HubEnv

README = Path(__file__).resolve().parents[2] / "clients" / "python" / "README.md"
README_URL = "http://127.0.0.1:8000"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(README.read_text()) if lang == language]


@pytest.fixture
def workdir(
    server: ServerHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub_env: HubEnv
) -> Path:
    shutil.copy(blocks.CONFIGS / "meta-llama__Llama-3.1-8B.json", tmp_path / "config.json")
    shutil.copy(blocks.CONFIGS / "bigscience__bloom-560m.json", tmp_path / "bloom.json")
    onnx.save(blocks.gqa_block(128, 4, 2), tmp_path / "model.onnx")
    onnx.save(blocks.alibi_block(16, 64), tmp_path / "attention.onnx")
    config = json.loads((tmp_path / "config.json").read_text())
    gguf_files.write(tmp_path / "model.gguf", "llama", *gguf_files.convert_config("llama", config))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POSENC_URL", server.url)
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("POSENC_API_KEY", raising=False)
    return tmp_path


def test_python_examples(server: ServerHandle, workdir: Path) -> None:
    code = _blocks("python")
    assert len(code) >= 10
    namespace: dict[str, object] = {"__name__": "readme"}
    for i, block in enumerate(code):
        source = block.replace(README_URL, server.url)
        exec(compile(source, f"README.md python block {i}", "exec"), namespace)
    assert (workdir / "llama31-rope.safetensors").is_file()
    assert (workdir / "model.patched.onnx").is_file()


def test_console_examples(server: ServerHandle, workdir: Path) -> None:
    commands = [
        line.removeprefix("$ ")
        for body in _blocks("console")
        for line in body.splitlines()
        if line.startswith("$ ")
    ]
    assert len(commands) >= 6
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    for command in commands:
        done = subprocess.run(
            command.replace(README_URL, server.url),
            shell=True,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, f"{command}\n{done.stderr}"
    assert (workdir / "model.patched.onnx").is_file()
    assert (workdir / "slopes.npy").is_file()
