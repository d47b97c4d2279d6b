"""`verify_rope_caches` and `posenc-client verify`: the caches baked into a GQA block, made
with the errors real exporters make (served tables of another spec, or the exact table altered
as a model would hold it), reported and diagnosed; plug prints the same report and refuses a
model whose caches do not look like the config without `--force`.

The "model" caches come from the server too (another spec) so that every table here is
transformers-exact for its own spec: the builder's linear model is the default-RoPE table (its
caches equal the default ones, issue 19), its YaRN the table with `truncate=false` (the
correction range not rounded), a wrong config the llama3 model verified against the default one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest

from posenc_client import Client, Tables
from posenc_client.cli import main
from posenc_client.onnx import attach_rope_caches, verify_rope_caches
from tests.client import blocks
from tests.client.parity import verify_three_ways
from tests.conftest import ServerHandle

HD, HEADS, KV_HEADS, ROWS = 128, 4, 2, 2048
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 1024}  # fmt: skip
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}


def _table(client: Client, theta: float = 500000.0, **scaling: Any) -> Tables:
    """The reference bytes (`device="cpu"`) of a half-width table: what a model exported on the
    CPU bakes and verify compares with, whatever the server's device."""
    served = client.rope(
        HD, ROWS, rope_theta=theta, profile="ort_gqa", rope_scaling=scaling or None
    )
    return client.table_by_key(served.key, device="cpu")


def _baked(cos: np.ndarray, sin: np.ndarray) -> onnx.ModelProto:
    """A GQA block holding `cos`/`sin` as its cache initializers, as an exporter bakes them."""
    return blocks.baked_gqa_block(HD, HEADS, KV_HEADS, cos, sin)


def _reports(model: onnx.ModelProto, tables: Tables) -> tuple[set[str], str]:
    reports = verify_rope_caches(model, tables)
    assert [r.name for r in reports] == ["cos", "sin"]
    return {r.verdict for r in reports}, " ".join(d for r in reports for d in r.diagnosis)


def test_exact_and_the_builder_errors(shared_client: Client) -> None:
    """A plugged model is exact; the builder's linear model (default caches) and YaRN without
    the rounding are repairs with their cause named; the report gives errors and positions."""
    exact = _table(shared_client, **YARN)
    plugged = attach_rope_caches(blocks.gqa_block(HD, HEADS, KV_HEADS), exact)
    reports = verify_rope_caches(plugged, exact)
    assert {r.verdict for r in reports} == {"exact"}
    assert all(r.first is None and r.max_abs == 0 for r in reports)

    default = _table(shared_client)
    linear = _table(shared_client, rope_type="linear", factor=4.0)
    verdicts, why = _reports(_baked(default["cos"], default["sin"]), linear)
    assert verdicts == {"repair"}
    assert "linear scaling is missing" in why
    report = verify_rope_caches(_baked(default["cos"], default["sin"]), linear)[0]
    assert report.first == (1, 0)  # row 0 is cos 0 = 1 for any frequency; linear scales all
    assert report.max_abs > 0.1
    assert report.max_ulp > 1000

    unrounded = _table(shared_client, **YARN, truncate=False)
    verdicts, why = _reports(_baked(unrounded["cos"], unrounded["sin"]), exact)
    assert verdicts == {"repair"}
    assert "YaRN rounding" in why


def test_rounding_and_shifted_positions(shared_client: Client) -> None:
    """Caches that went through bf16 or float16, and caches shifted by one position."""
    exact = _table(shared_client, **LLAMA3)
    cos, sin = exact["cos"], exact["sin"]
    for dtype, name in ((np.float16, "float16"), (ml_dtypes.bfloat16, "bfloat16")):
        low = _baked(cos.astype(dtype).astype(np.float32), sin.astype(dtype).astype(np.float32))
        verdicts, why = _reports(low, exact)
        assert verdicts == {"repair"}
        assert f"went through {name}" in why
    shifted = _baked(np.roll(cos, -1, axis=0), np.roll(sin, -1, axis=0))
    verdicts, why = _reports(shifted, exact)
    assert verdicts == {"repair"}
    assert "positions off by one: row p holds position p + 1" in why


def test_wrong_configs_are_mismatches(shared_client: Client) -> None:
    """The llama3 model verified against the default config, and another rope_theta."""
    default = _table(shared_client)
    llama3 = _table(shared_client, **LLAMA3)
    verdicts, why = _reports(_baked(llama3["cos"], llama3["sin"]), default)
    assert verdicts == {"mismatch"}
    assert "another scaling variant" in why
    other_theta = _table(shared_client, theta=10000.0)
    verdicts, why = _reports(_baked(other_theta["cos"], other_theta["sin"]), default)
    assert verdicts == {"mismatch"}
    assert "wrong theta: the model's caches fit rope_theta ~ 10000" in why


def _cli(server: ServerHandle, tmp_path: Path, *args: str) -> int:
    return main(["--url", server.url, "--cache-dir", str(tmp_path / "cache"), *args])


def test_cli_verify_and_plug_refusal(
    server: ServerHandle, shared_client: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verify exits 0 (exact), 6 (not this config) or 8 (plug repairs: the builder's missing
    scaling) and changes nothing; plug refuses a mismatch unless --force, printing the report
    either way."""
    llama = str(blocks.CONFIGS / "meta-llama__Llama-3.1-8B.json")
    llama2 = str(blocks.CONFIGS / "meta-llama__Llama-2-7b-hf.json")  # default RoPE, theta 1e4
    # the reference bytes (device="cpu"), what plug writes whatever the server's device
    served = shared_client.tables_for_model(
        llama, device="cpu", profile="ort_gqa", max_positions=ROWS
    )["rope"]
    model = tmp_path / "model.onnx"
    onnx.save(attach_rope_caches(blocks.gqa_block(HD, HEADS, KV_HEADS), served), model)
    before = model.read_bytes()
    args = ("--max-positions", str(ROWS))
    assert _cli(server, tmp_path, "verify", str(model), "--config", llama, *args) == 0
    assert "cos: exact" in capsys.readouterr().out
    assert _cli(server, tmp_path, "verify", str(model), "--config", llama2, *args) == 6
    assert "mismatch" in capsys.readouterr().out
    assert model.read_bytes() == before
    out = tmp_path / "out.onnx"
    code = _cli(server, tmp_path, "plug", str(model), "--hf-config", llama2, "-o", str(out), *args)
    err = capsys.readouterr().err
    assert code == 6
    assert "do not look like this config" in err
    assert "--force" in err
    assert not out.exists()
    code = _cli(server, tmp_path, "plug", str(model), "--hf-config", llama2, "-o", str(out),
                "--force", *args)  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert _cli(server, tmp_path, "verify", str(out), "--config", llama2, *args) == 0
    default = _table(shared_client)  # Llama 3.1's theta without its llama3 scaling
    onnx.save(_baked(default["cos"], default["sin"]), model)
    capsys.readouterr()
    assert _cli(server, tmp_path, "verify", str(model), "--config", llama, *args) == 8
    assert "llama3 scaling is missing" in capsys.readouterr().out
    # the same outcome per site from the library and the route (issue 28)
    code, report = verify_three_ways(server, tmp_path, model, Path(llama))
    assert code == 8
    assert [(s["name"], s["verdict"]) for s in report["sites"]] == [
        ("cos", "repair"),
        ("sin", "repair"),
    ]


def test_placeholder_caches_are_no_mismatch(shared_client: Client) -> None:
    """An exporter's all-zero placeholder caches (the e2e blocks' initializers) are reported as
    such, never as a mismatch that plug would refuse."""
    exact = _table(shared_client)
    model = blocks.gqa_block(HD, HEADS, KV_HEADS, caches="initializer")
    verdicts = {r.name: r.verdict for r in verify_rope_caches(model, exact)}
    assert verdicts == {"cos": "placeholder", "sin": "exact"}  # one row: sin(0) = 0 is exact
