"""`posenc-client`: every command against the real server, --help everywhere, and the documented
exit codes (0 ok, 2 usage, 3 server refused, 4 no connection, 5 offline miss, 6 incompatible,
7 corrupt cache files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from posenc_client import Client, Tables
from posenc_client.cli import build_parser, main
from tests.client import blocks
from tests.conftest import ServerHandle

LLAMA31 = str(blocks.CONFIGS / "meta-llama__Llama-3.1-8B.json")
BLOOM = str(blocks.CONFIGS / "bigscience__bloom-560m.json")
CLI = Path(sys.executable).with_name("posenc-client")

Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    """`cli(*args) -> (exit code, stdout, stderr)` against the session server."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main(["--url", server.url, "--cache-dir", str(tmp_path / "cache"), *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_help_on_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    commands = ["fetch", "resolve", "presets", "kinds", "onnx", "plug", "verify", "cache"]
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert isinstance(sub.choices, dict)
    assert sorted(sub.choices) == sorted(commands)
    for args in [[], *([c] for c in commands)]:
        with pytest.raises(SystemExit) as info:
            main([*args, "--help"])
        assert info.value.code == 0
        assert "usage: posenc-client" in capsys.readouterr().out
    done = subprocess.run([str(CLI), "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0
    assert "Exit codes" in done.stdout


def test_fetch_by_spec_to_every_format(cli: Cli, tmp_path: Path) -> None:
    spec = ["rope", "head_dim=64", "max_positions=16", "rope_type=llama3", "factor=8",
            "low_freq_factor=1", "high_freq_factor=4", "original_max_position_embeddings=8",
            "profile=onnx"]  # fmt: skip
    out = tmp_path / "rope.safetensors"
    code, _, err = cli("fetch", *spec, "-o", str(out))
    assert code == 0
    assert "wrote" in err
    tables = Tables.from_safetensors(out.read_bytes())
    assert tables.spec["rope_scaling"]["rope_type"] == "llama3"
    assert tables["cos"].shape == (16, 32)
    assert cli("fetch", *spec, "-o", str(tmp_path / "rope.npz"))[0] == 0
    assert cli("fetch", *spec, "--tensor", "sin", "-o", str(tmp_path / "sin.npy"))[0] == 0
    assert np.array_equal(np.load(tmp_path / "sin.npy"), tables["sin"])
    with np.load(tmp_path / "rope.npz") as npz:
        assert np.array_equal(npz["cos"], tables["cos"])
    code, stdout, _ = cli("fetch", *spec)
    assert code == 0
    assert json.loads(stdout)["key"] == tables.key
    code, stdout, _ = cli("fetch", "--key", tables.key)
    assert code == 0
    assert json.loads(stdout)["tensors"]["cos"]["shape"] == [16, 32]


def test_fetch_by_config_and_preset(cli: Cli, tmp_path: Path) -> None:
    code, stdout, _ = cli("fetch", "--hf-config", LLAMA31, "max_positions=8", "profile=ort_gqa")
    summary = json.loads(stdout)
    assert code == 0
    assert summary["tensors"]["cos"]["shape"] == [8, 64]
    assert summary["notes"]["rope_type"] == "llama3"
    code, stdout, _ = cli("fetch", "--preset", "bloom-560m/alibi")
    assert code == 0
    assert json.loads(stdout)["tensors"]["slopes"]["shape"] == [16]
    gemma = str(blocks.CONFIGS / "google__gemma-3-4b-it.json")
    code, _, err = cli("fetch", "--hf-config", gemma, "max_positions=8")
    assert code == 2
    assert "--layer-type" in err
    code, stdout, _ = cli("fetch", "--hf-config", gemma, "max_positions=8",
                          "--layer-type", "full_attention")  # fmt: skip
    assert code == 0
    assert json.loads(stdout)["spec"]["rope_scaling"]["rope_type"] == "linear"


def test_resolve_presets_kinds(cli: Cli) -> None:
    code, stdout, _ = cli("resolve", LLAMA31, "profile=onnx", "max_positions=32")
    (spec,) = json.loads(stdout)
    assert code == 0
    assert spec["spec"]["width"] == "half"
    assert spec["notes"]["rope_type"] == "llama3"
    code, stdout, _ = cli("presets")
    assert code == 0
    assert "llama-3.1-8b" in stdout
    code, stdout, _ = cli("presets", "--json")
    assert code == 0
    assert len(json.loads(stdout)) >= 15
    code, stdout, _ = cli("presets", "phi-3.5-mini")
    assert code == 0
    assert json.loads(stdout)["model"] == "microsoft/Phi-3.5-mini-instruct"
    code, stdout, _ = cli("kinds")
    assert code == 0
    assert "rope" in stdout
    assert "alibi" in stdout


def test_onnx_command(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "bias.onnx"
    code, _, err = cli("onnx", "alibi", "num_heads=4", "bias=causal", "key_length=4",
                       "--graph", "bias", "--opset", "23", "-o", str(out))  # fmt: skip
    assert code == 0, err
    model = onnx.load(out)
    assert {p.key: p.value for p in model.metadata_props}["posenc.graph"] == "alibi/bias"
    code, stdout, _ = cli("onnx", "--hf-config", LLAMA31, "max_positions=16", "--graph", "cos_sin")
    assert code == 0
    assert json.loads(stdout)["metadata"]["graph"] == "rope/cos_sin"
    code, _, err = cli("onnx", "alibi", "num_heads=4", "--graph", "nope")
    assert code == 3
    assert "unsupported_export" in err


def test_plug_rope_and_alibi(cli: Cli, tmp_path: Path) -> None:
    model = tmp_path / "gqa.onnx"
    onnx.save(blocks.gqa_block(128, 4, 2), model)
    patched = tmp_path / "patched.onnx"
    code, _, err = cli("plug", str(model), "--hf-config", LLAMA31, "--max-positions", "64",
                       "-o", str(patched))  # fmt: skip
    assert code == 0, err
    loaded = onnx.load(patched)
    inits = {i.name: i for i in loaded.graph.initializer}
    assert list(inits["cos"].dims) == [64, 64]
    ort.InferenceSession(loaded.SerializeToString(), providers=["CPUExecutionProvider"])
    alibi_model = tmp_path / "attention.onnx"
    onnx.save(blocks.alibi_block(16, 64), alibi_model)
    code, _, err = cli("plug", str(alibi_model), "--hf-config", BLOOM, "-o", str(patched))
    assert code == 0
    assert "row_constant" in err
    names = {i.name for i in onnx.load(patched).graph.input}
    assert "posenc_alibi/query_positions" in names
    assert "attn_mask" not in names


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["fetch", "rope", "head_dim"], 2, "FIELD=VALUE"),
        (["fetch"], 2, "give a KIND"),
        (["fetch", "alibi", "num_heads=4", "-o", "x.txt"], 2, "suffix"),
        (["resolve", "/no/such/config.json"], 2, "cannot read the config"),
        (["fetch", "rope", "head_dim=-1", "max_positions=4"], 3, "invalid_spec"),
        (["fetch", "nope"], 3, "unknown_kind"),
        (["--offline", "fetch", "alibi", "num_heads=3"], 5, "offline"),
        (["plug", "MODEL", "--hf-config", LLAMA31, "-o", "OUT"], 6, "multiple of 16"),
        (["plug", "/no/model.onnx", "--hf-config", LLAMA31, "-o", "OUT"], 2, "cannot read"),
    ],
)
def test_exit_codes(cli: Cli, tmp_path: Path, args: list[str], code: int, message: str) -> None:
    model = tmp_path / "head40.onnx"
    onnx.save(blocks.gqa_block(40, 4, 2), model)  # GQA rotary needs d/2 % 8 == 0
    args = [str(model) if a == "MODEL" else str(tmp_path / "o.onnx") if a == "OUT" else a
            for a in args]  # fmt: skip
    got, _, err = cli(*args)
    assert got == code, err
    assert message in err


def test_connection_error_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    code = main(["--url", url, "--retries", "0", "--no-cache", "presets"])
    assert code == 4
    err = capsys.readouterr().err
    assert "no answer" in err
    assert f"GET {url}/v1/presets: cannot connect" in err  # the URL it tried
    with pytest.raises(SystemExit) as info:
        main(["fetch", "--no-such-flag"])
    assert info.value.code == 2


def test_global_options_anywhere_and_host_port(
    server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The global options after the command as before it, and `--url host:port` (tritonclient's
    spelling, the README's snippet) taken as http://host:port; an option given after the command
    wins over the same one before it."""
    host_port = server.url.removeprefix("http://")
    cache = str(tmp_path / "cache")
    code = main(["presets", "--url", host_port, "--cache-dir", cache, "-q"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "llama-3.1-8b" in out
    code = main(["--url", "http://127.0.0.1:1", "kinds", "--url", host_port, "--retries", "0"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "rope" in out
    with Client(host_port, cache=None) as client:  # the library takes the same spelling
        assert client.base_url == server.url
        assert client.ready()
    args = build_parser().parse_args(["fetch", "--timeout", "7", "--offline"])
    assert (args.timeout, args.offline, args.url) == (7.0, True, None)
    args = build_parser().parse_args(["--timeout", "9", "fetch"])
    assert (args.timeout, args.offline) == (9.0, False)


@pytest.mark.parametrize(
    "args",
    [["resolve", LLAMA31], ["cache", "ls", "--json"], ["kinds"]],
    ids=["resolve", "cache-ls", "kinds"],
)
def test_a_reader_gone_from_stdout_is_no_crash(
    server: ServerHandle, tmp_path: Path, args: list[str]
) -> None:
    """`posenc-client ... | head`: the reader closes the pipe before the answer is written. No
    traceback and no "unexpected error": exit 141 (128 + SIGPIPE) with nothing on stderr
    (was a BrokenPipeError traceback and exit 1)."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    try:
        done = subprocess.run(
            [str(CLI), "--url", server.url, "--cache-dir", str(tmp_path / "c"), *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
            timeout=60,
        )
    finally:
        os.close(write)
    assert done.stderr == "", done.stderr
    assert done.returncode == 141
