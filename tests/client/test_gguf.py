"""`posenc-client verify/plug model.gguf --hf-config config.json` (posenc_client.gguf): GGUF
files laid out as llama.cpp's converter lays them out (tests/client/gguf_files.py), correct or
with the errors conversions make (scaling dropped, wrong base, swapped LongRoPE factors, not
the model at all), through the real CLI against the session's real server; and the float32
bound of ggml's arithmetic, held both ways (ggml's float32 table stays inside it at every
position, a 1e-5 relative departure of one frequency does not)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from posenc_client import Client
from posenc_client.cli import main
from posenc_client.gguf import (
    RopeParams,
    ggml_bound,
    ggml_rope_table,
    llama_params,
    read_gguf,
)
from tests.client import gguf_files as gf
from tests.conftest import ServerHandle

ALL = sorted(gf.CONFIGS)


def _files(tmp_path: Path, name: str, edit: Any = None) -> tuple[Path, Path]:
    """The converted file of `name` (after `edit(keys, tensors)`) and its config.json."""
    arch, config, keys, tensors = gf.convert(name)
    if edit is not None:
        edit(arch, keys, tensors)
    model = gf.write(tmp_path / f"{name}.gguf", arch, keys, tensors)
    cfg = tmp_path / f"{name}.json"
    cfg.write_text(json.dumps(config))
    return model, cfg


def _cli(
    server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    code = main(["--url", server.url, "--cache-dir", str(tmp_path / "cache"), *args])
    out, err = capsys.readouterr()
    return code, out, err


def _verify(
    server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str], model: Path,
    cfg: Path,
) -> tuple[int, dict[str, Any]]:  # fmt: skip
    code, out, err = _cli(server, tmp_path, capsys, "verify", str(model), "--hf-config",
                          str(cfg), "--json")  # fmt: skip
    assert out, err
    return code, json.loads(out)


def _plug_then_verify(
    server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str], model: Path,
    cfg: Path,
) -> str:  # fmt: skip
    """Plug `model`, check the written file verifies exact; returns plug's stderr."""
    fixed = tmp_path / "fixed.gguf"
    code, _, err = _cli(server, tmp_path, capsys, "plug", str(model), "--hf-config", str(cfg),
                        "-o", str(fixed))  # fmt: skip
    assert code == 0, err
    code, report = _verify(server, tmp_path, capsys, fixed, cfg)
    assert code == 0, report
    assert report["outcome"] == "exact", report
    return err


@pytest.mark.parametrize("name", ALL)
def test_converter_layout_is_exact(
    server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """Each architecture's file as the converter writes it computes posenc's exact table in
    llama.cpp (every row of the context, within ggml's float32 bound): exit 0; plug changes no
    key or tensor that llama.cpp reads differently."""
    model, cfg = _files(tmp_path, name)
    code, report = _verify(server, tmp_path, capsys, model, cfg)
    assert code == 0, report
    assert report["outcome"] == "exact", report
    assert all(t["verdict"] == "exact" and t["max_ratio"] <= 1 for t in report["tables"])
    assert all(t["rows"] >= 1024 for t in report["tables"])
    err = _plug_then_verify(server, tmp_path, capsys, model, cfg)
    assert "plugged nothing" in err, err


def _drop(*names: str) -> Any:
    def edit(arch: str, keys: gf.Keys, tensors: dict[str, np.ndarray]) -> None:
        for name in names:
            keys.pop(f"{arch}.{name}", None)
            tensors.pop(name, None)

    return edit


DROPPED = [
    ("llama3", _drop("rope_freqs.weight"), "rope_freqs.weight"),
    ("qwen2_yarn", _drop("rope.scaling.type", "rope.scaling.factor",
                         "rope.scaling.original_context_length"), "rope.scaling"),
    ("qwen3_yarn", _drop("rope.scaling.original_context_length"),
     "rope.scaling.original_context_length"),
    ("deepseek2_yarn", _drop("rope.scaling.yarn_log_multiplier"), "yarn_log_multiplier"),
    ("gemma3_linear", _drop("rope.scaling.type", "rope.scaling.factor"), "rope.scaling"),
    ("phi3_longrope", _drop("rope_factors_long.weight", "rope_factors_short.weight"),
     "rope_factors_"),
    ("phi3_longrope", _drop("rope.scaling.attn_factor"), "rope.scaling.attn_factor"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "edit", "named"), DROPPED, ids=[d[0] + "-" + d[2] for d in DROPPED]
)
def test_scaling_dropped_is_repaired(
    server: ServerHandle,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    edit: Any,
    named: str,
) -> None:
    """A conversion that dropped the scaling (its keys or divisor tensors): exit 8, the
    diagnosis names the missing key or tensor; plug writes it and the file verifies exact."""
    model, cfg = _files(tmp_path, name, edit)
    code, report = _verify(server, tmp_path, capsys, model, cfg)
    assert code == 8, report
    assert report["outcome"] == "repair", report
    diagnosis = " ".join(d for t in report["tables"] for d in t["diagnosis"])
    assert named in diagnosis, diagnosis
    assert any(t["first"] is not None for t in report["tables"])
    err = _plug_then_verify(server, tmp_path, capsys, model, cfg)
    assert named in err, err


def _set(key: str, value: Any) -> Any:
    def edit(arch: str, keys: gf.Keys, tensors: dict[str, np.ndarray]) -> None:
        _, kind = keys.get(f"{arch}.{key}", (None, gf.F))
        keys[f"{arch}.{key}"] = (value, kind)

    return edit


@pytest.mark.parametrize(
    ("name", "edit", "named"),
    [
        ("llama_default", _set("rope.freq_base", 500000.0), "rope.freq_base"),
        ("qwen2_yarn", _set("rope.freq_base", 10000.0), "rope.freq_base"),
        ("deepseek2_yarn", _set("rope.scaling.factor", 4.0), "rope.scaling.factor"),
    ],
)
def test_wrong_key_is_repaired(
    server: ServerHandle,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    edit: Any,
    named: str,
) -> None:
    """A wrong base (Gemma 3's local one too) or factor: exit 8 naming the key; plug fixes it."""
    model, cfg = _files(tmp_path, name, edit)
    code, report = _verify(server, tmp_path, capsys, model, cfg)
    assert code == 8, report
    diagnosis = " ".join(d for t in report["tables"] for d in t["diagnosis"])
    assert named in diagnosis, diagnosis
    _plug_then_verify(server, tmp_path, capsys, model, cfg)


def _swap(arch: str, keys: gf.Keys, tensors: dict[str, np.ndarray]) -> None:
    long_, short = tensors["rope_factors_long.weight"], tensors["rope_factors_short.weight"]
    tensors["rope_factors_long.weight"], tensors["rope_factors_short.weight"] = short, long_


def test_converter_llama3_context_quirk(
    server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llama.cpp's converter computes Llama 3's divisors with the top-level
    original_max_position_embeddings (default 8192), not rope_scaling's: for a config whose
    original length is 512 its rope_freqs are wrong; verify names the tensor, plug writes the
    exact divisors."""
    model, cfg = _files(tmp_path, "llama3_orig512")
    code, report = _verify(server, tmp_path, capsys, model, cfg)
    assert code == 8, report
    assert "rope_freqs.weight" in " ".join(report["tables"][0]["diagnosis"])
    _plug_then_verify(server, tmp_path, capsys, model, cfg)


def _half(arch: str, keys: gf.Keys, tensors: dict[str, np.ndarray]) -> None:
    tensors["rope_freqs.weight"] = tensors["rope_freqs.weight"].astype(np.float16)


def test_half_precision_divisors(
    server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Llama 3's divisors stored as float16 (ggml's RoPE asserts float32 divisors): exit 8
    naming the tensor and its type; plug writes them in float32."""
    model, cfg = _files(tmp_path, "llama3", _half)
    code, report = _verify(server, tmp_path, capsys, model, cfg)
    assert code == 8, report
    assert "rope_freqs.weight is F16" in " ".join(report["tables"][0]["diagnosis"])
    _plug_then_verify(server, tmp_path, capsys, model, cfg)


def test_swapped_longrope_factors(
    server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """LongRoPE's long and short factors swapped: both sides out of bound, each diagnosis names
    its tensor; plug writes the right ones."""
    model, cfg = _files(tmp_path, "phi3_longrope", _swap)
    code, report = _verify(server, tmp_path, capsys, model, cfg)
    assert code == 8, report
    by_name = {t["name"]: t for t in report["tables"]}
    assert by_name["rope (short)"]["verdict"] == by_name["rope (long)"]["verdict"] == "repair"
    assert "rope_factors_short.weight" in " ".join(by_name["rope (short)"]["diagnosis"])
    assert "rope_factors_long.weight" in " ".join(by_name["rope (long)"]["diagnosis"])
    _plug_then_verify(server, tmp_path, capsys, model, cfg)


@pytest.mark.parametrize(
    ("name", "edit", "config_name", "named"),
    [
        ("llama3", _set("block_count", 3), "llama3", "block_count"),
        ("llama3", None, "qwen2_yarn", "general.architecture"),
        ("qwen2_yarn", _set("embedding_length", 512), "qwen2_yarn", "embedding_length"),
    ],
)
def test_not_that_model(
    server: ServerHandle,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    edit: Any,
    config_name: str,
    named: str,
) -> None:
    """A file of another model (layer count, width, architecture): exit 6 naming the key, for
    verify and plug alike (plug writes nothing)."""
    model, _ = _files(tmp_path, name, edit)
    cfg = tmp_path / "other.json"
    cfg.write_text(json.dumps(gf.CONFIGS[config_name][1]))
    code, _, err = _cli(server, tmp_path, capsys, "verify", str(model), "--hf-config", str(cfg))
    assert code == 6, err
    assert named in err, err
    out = tmp_path / "out.gguf"
    code, _, err = _cli(server, tmp_path, capsys, "plug", str(model), "--hf-config", str(cfg),
                        "-o", str(out))  # fmt: skip
    assert code == 6, err
    assert named in err, err
    assert not out.exists()


UNREPRESENTABLE = [
    ("qwen2_yarn", ("rope_scaling", "truncate"), False, "truncate"),
    ("qwen2_yarn", ("rope_scaling", "beta_fast"), 16.0, "beta_fast"),
    ("gemma3_linear", ("rope_local_base_freq",), 20000.0, "base 10000"),
]


@pytest.mark.parametrize(("name", "path", "value", "named"), UNREPRESENTABLE)
def test_unrepresentable_config_is_refused(
    server: ServerHandle,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    path: tuple[str, ...],
    value: Any,
    named: str,
) -> None:
    """A config llama.cpp cannot compute from any file: YaRN without truncation (ggml always
    rounds the correction range), YaRN betas other than 32, 1 (these loaders read no beta
    keys), a Gemma 3 local base other than 10000 (fixed in its loader, the key ignored): exit
    6 naming the reason, for verify and plug alike (plug writes nothing). The Gemma 3 file with
    a wrong `freq_base_swa` key is exact: llama.cpp does not read it."""
    model, _ = _files(tmp_path, name)
    config = json.loads(json.dumps(gf.CONFIGS[name][1]))
    target = config
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    cfg = tmp_path / "changed.json"
    cfg.write_text(json.dumps(config))
    code, _, err = _cli(server, tmp_path, capsys, "verify", str(model), "--hf-config", str(cfg))
    assert code == 6, err
    assert named in err, err
    out = tmp_path / "out.gguf"
    code, _, err = _cli(
        server, tmp_path, capsys, "plug", str(model), "--hf-config", str(cfg), "-o", str(out)
    )
    assert code == 6, err
    assert not out.exists()


def test_gemma3_local_base_key_is_ignored(
    server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llama.cpp's Gemma 3 loader fixes the local base at 10000: a `freq_base_swa` key of 1e6
    changes nothing, the file verifies exact."""
    model, cfg = _files(tmp_path, "gemma3_linear", _set("rope.freq_base_swa", 1000000.0))
    code, report = _verify(server, tmp_path, capsys, model, cfg)
    assert code == 0, report


# --- the bound ---------------------------------------------------------------------------------


def _exact(params: RopeParams, inv_freq: np.ndarray, amp: float, rows: int) -> tuple[Any, Any]:
    angle = np.arange(rows, dtype=np.float64)[:, None] * inv_freq[None, :]
    return amp * np.cos(angle), amp * np.sin(angle)


def _yarn_inv_freq(p: RopeParams) -> np.ndarray:
    """YaRN's frequencies in float64 from the same parameters (transformers'
    `_compute_yarn_parameters` with truncation: its ramp over the rounded correction range)."""
    half = p.n_rot // 2
    base = np.float64(p.freq_base)
    pos = base ** (2 * np.arange(half, dtype=np.float64) / p.n_rot)
    extrap, interp = 1 / pos, p.freq_scale / pos

    def dim(rot: float) -> float:
        return p.n_rot * math.log(p.n_ctx_orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(dim(p.beta_fast)), 0)
    high = min(math.ceil(dim(p.beta_slow)), p.n_rot - 1)
    ramp = np.clip((np.arange(half) - low) / max(high - low, 0.001), 0, 1)
    ext = 1 - ramp
    return interp * (1 - ext) + extrap * ext


BOUND_CASES = [
    RopeParams(128, 500000.0, 1.0, 0.0, 1.0, 32.0, 1.0, 8192),
    RopeParams(96, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0, 4096),
    RopeParams(64, 1000000.0, 0.125, 0.0, 1.0, 32.0, 1.0, 4096),
    RopeParams(128, 1000000.0, 0.25, 1.0, 1.0 / (1 + 0.1 * math.log(4)), 32.0, 1.0, 32768),
    RopeParams(64, 10000.0, 0.025, 1.0, 1.0 / (1 + 0.1 * math.log(40)), 32.0, 1.0, 4096),
]


@pytest.mark.parametrize(
    "params",
    BOUND_CASES,
    ids=lambda p: f"d{p.n_rot}-b{p.freq_base:g}-s{p.freq_scale:g}-e{p.ext_factor:g}",
)
def test_bound_holds_for_ggml_arithmetic(params: RopeParams) -> None:
    """ggml's float32 table (op for op) against the float64 table of the same parameters, out
    to 131072 positions: inside `ggml_bound` everywhere, and using a fair share of it (the
    bound is not loose by orders of magnitude)."""
    rows = 131072
    half = params.n_rot // 2
    if params.ext_factor:
        inv_freq = _yarn_inv_freq(params)
        amp = params.amplitude
    else:
        inv_freq = params.freq_scale * np.float64(params.freq_base) ** (
            -2 * np.arange(half, dtype=np.float64) / params.n_rot
        )
        amp = params.amplitude
    cos, sin = ggml_rope_table(params, rows)
    ecos, esin = _exact(params, inv_freq, amp, rows)
    err = np.maximum(np.abs(cos - ecos), np.abs(sin - esin))
    bound = ggml_bound(params, inv_freq, amp, rows)
    ratio = float((err / bound).max())
    assert ratio <= 1.0, ratio
    assert ratio >= 0.02, ratio


def test_bound_catches_one_frequency_off_by_1e5() -> None:
    """A Llama 3 divisor 1e-5 relative off (one pair): out of the bound within the first
    thousand positions, the other pairs inside it."""
    p = RopeParams(128, 500000.0, 1.0, 0.0, 1.0, 32.0, 1.0, 8192,
                   freq_factors=np.ones(64, np.float32))  # fmt: skip
    inv_freq = np.float64(500000.0) ** (-2 * np.arange(64, dtype=np.float64) / 128)
    bad = p.freq_factors.copy()  # type: ignore[union-attr]
    bad[20] *= np.float32(1 + 1e-5)
    wrong = RopeParams(**{**p.__dict__, "freq_factors": bad})
    rows = 1000
    cos, sin = ggml_rope_table(wrong, rows)
    ecos, esin = _exact(p, inv_freq, 1.0, rows)
    out = np.maximum(np.abs(cos - ecos), np.abs(sin - esin)) > ggml_bound(p, inv_freq, 1.0, rows)
    assert set(np.argwhere(out)[:, 1].tolist()) == {20}


def test_params_read_as_llama_cpp(tmp_path: Path) -> None:
    """The loader's defaults: no freq_base key is 10000, no dimension_count the head size, an
    absent scaling type with no factor no scaling; DeepSeek-V2's log multiplier /0.1 into the kq
    multiplier; Gemma 3's local layers at 10000 without scaling."""
    model = read_gguf(gf.write(tmp_path / "bare.gguf", "llama", {
        "llama.embedding_length": (256, gf.U32), "llama.attention.head_count": (4, gf.U32),
        "llama.context_length": (2048, gf.U32)}, {}))  # fmt: skip
    p = llama_params(model)
    assert (p.freq_base, p.n_rot, p.freq_scale, p.ext_factor, p.amplitude) == (
        10000.0, 64, 1.0, 0.0, 1.0)  # fmt: skip
    arch, _, keys, tensors = gf.convert("deepseek2_yarn")
    ds = llama_params(read_gguf(gf.write(tmp_path / "ds.gguf", arch, keys, tensors)))
    mscale = 1 + 0.1 * 0.707 * math.log(40)
    assert ds.kq_multiplier == pytest.approx(mscale**2, rel=1e-6)
    assert ds.amplitude == pytest.approx(1.0, rel=1e-6)
    arch, _, keys, tensors = gf.convert("gemma3_linear")
    gm = read_gguf(gf.write(tmp_path / "g.gguf", arch, keys, tensors))
    assert llama_params(gm, sliding=True).freq_base == 10000.0
    assert llama_params(gm, sliding=True).freq_scale == 1.0
    assert llama_params(gm).freq_scale == pytest.approx(0.125)


def test_client_table_is_what_verify_compares(shared_client: Client, tmp_path: Path) -> None:
    """The exact table verify fetches is the server's float64-rounded-once table: its cos
    equals cos(p * inv_freq) rounded once."""
    arch, config, keys, tensors = gf.convert("llama3")
    model = read_gguf(gf.write(tmp_path / "l.gguf", arch, keys, tensors))
    from posenc_client.gguf import rope_sides

    sides = rope_sides(model, config, shared_client.resolve(config, kind="rope"),
                       shared_client.table, rows=512)  # fmt: skip
    (side,) = sides
    inv_freq = np.asarray(side.table["inv_freq"], np.float64)
    angle = np.arange(512, dtype=np.float64)[:, None] * inv_freq[None, :]
    np.testing.assert_array_equal(side.table["cos"], np.cos(angle).astype(np.float32))
