"""`posenc serve`'s command line, generated from `Settings`: a flag per field with its variable
and default in `--help`, byte sizes as people write them, configuration errors as one line and
exit 2, unknown `POSENC_*` variables warned about, and the start-up banner; through the real
`posenc` console script (a subprocess), as a user runs it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from posenc.api import Settings
from posenc.api.server import banner
from posenc.api.settings import env_name, format_bytes, parse_bytes, unknown_environment
from posenc.cli import build_parser, flag_name
from posenc.presets import load_presets
from tests.conftest import start_server_process

EXE = Path(sys.executable).with_name("posenc")

GiB, MiB = 1 << 30, 1 << 20


def _env(**extra: str) -> dict[str, str]:
    """The environment without any POSENC_* variable (so a developer's shell cannot change the
    outcome), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("POSENC_")}
    env["COLUMNS"] = "100"
    return {**env, **extra}


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EXE), *args], capture_output=True, text=True, timeout=120, env=_env(**env)
    )


def test_help_names_every_setting_with_its_variable_and_default() -> None:
    result = _run("serve", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for name, info in Settings.model_fields.items():
        flag = flag_name(name)
        assert re.search(rf"{re.escape(flag)}[ ,\]]", text), f"{name} has no flag"
        # each flag's help ends with its variable and default
        start = text.index(flag + " ")
        segment = text[start : text.index("]", text.index(f"[env {env_name(name)};", start)) + 1]
        assert f"[env {env_name(name)}; default: " in segment, segment
        if info.default_factory is None and info.default not in (None, "", True, False):
            assert str(info.default) in segment, segment
    assert "[env POSENC_CACHE_BYTES; default: 2GiB (2147483648)]" in text
    assert "[env POSENC_API_KEYS; default: none]" in text
    assert "--hot-routes, --no-hot-routes" in text


def test_every_setting_reaches_settings_from_its_flag() -> None:
    """Each generated flag sets its field: a value different from the default, per field type."""
    parser = build_parser()
    values = {
        "host": ("0.0.0.0", "0.0.0.0"),
        "grpc_port": ("8001", 8001),
        "device": ("CPU", "cpu"),
        "log_format": ("json", "json"),
        "log_level": ("debug", "debug"),
        "warm_presets": ("t5-base,gpt2", ["t5-base", "gpt2"]),
        "cors_origins": (
            "https://a.example, https://b.example",
            ["https://a.example", "https://b.example"],
        ),
        "root_path": ("/posenc/", "/posenc"),
        "presets_dir": ("/srv/presets", "/srv/presets"),
    }
    for name, info in Settings.model_fields.items():
        if name == "api_keys":
            args = parser.parse_args(["serve", "--api-keys", "k1,k2"])
            got = Settings(**{k: v for k, v in vars(args).items() if k != "command"})
            assert [k.get_secret_value() for k in got.api_keys] == ["k1", "k2"]
            continue
        if info.annotation is bool:
            flag = flag_name(name) if not info.default else "--no-" + flag_name(name)[2:]
            raw, want = None, not info.default
        elif name in values:
            raw, want = values[name]
        elif name.endswith("_bytes"):
            # a size twice the default, written in MiB when it divides
            want = 2 * int(info.default) if name != "in_flight_bytes" else 4 * GiB
            raw = f"{want // MiB}MiB" if want % MiB == 0 else str(want)
        elif isinstance(info.default, float):
            raw, want = str(info.default + 1.5), info.default + 1.5
        else:
            raw, want = str(int(info.default) + 1), int(info.default) + 1
        argv = ["serve", flag_name(name) if info.annotation is not bool else flag]
        if raw is not None:
            argv.append(raw)
        args = parser.parse_args(argv)
        overrides = {k: v for k, v in vars(args).items() if k != "command"}
        if name == "protect_docs_and_metrics":
            overrides["api_keys"] = "k"
        if name == "max_response_bytes":
            overrides["in_flight_bytes"] = 4 * want
        got = Settings(**overrides)
        assert getattr(got, name) == want, name


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4GiB", 4 * GiB),
        ("512MiB", 512 * MiB),
        ("512 mib", 512 * MiB),
        ("1.5GB", 1_500_000_000),
        ("64KiB", 64 << 10),
        ("2kB", 2000),
        ("1TiB", 1 << 40),
        ("100B", 100),
        ("1048576", 1 << 20),
        (".5MiB", 1 << 19),
        (4096, 4096),
    ],
)
def test_byte_sizes(text: str | int, size: int) -> None:
    assert parse_bytes(text) == size
    assert Settings(cache_bytes=text).cache_bytes == size


@pytest.mark.parametrize(
    "text", ["1.5B", "0.1KiB", "512m", "4g", "4 GiBs", "-1", "lots", "", "1e9"]
)
def test_byte_sizes_refused(text: str) -> None:
    with pytest.raises(ValidationError, match="cache_bytes"):
        Settings(cache_bytes=text)


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (2 * GiB, 256 << 10, 1000, 0, 3 * MiB + 1)] == [
        "2GiB",
        "256KiB",
        "1000",
        "0",
        str(3 * MiB + 1),
    ]


def _unknown_device() -> str:
    """`cuda` on a machine without CUDA; else a CUDA index beyond the last device."""
    return "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--cache-bytes", "lots"], {}, "--cache-bytes (POSENC_CACHE_BYTES)"),
        ([], {"POSENC_CACHE_BYTES": "4 gigs"}, "POSENC_CACHE_BYTES"),
        (["--port", "70000"], {}, "--port (POSENC_PORT)"),
        (["--max-response-bytes", "1GiB"], {}, "in_flight_bytes"),
        (["--warm-presets", "llama-3.1-8bb"], {}, "did you mean 'llama-3.1-8b'?"),
        (["--device", _unknown_device()], {}, "--device (POSENC_DEVICE)"),
        (["--protect-docs-and-metrics"], {}, "needs api_keys"),
        (["--root-path", "posenc"], {}, "--root-path (POSENC_ROOT_PATH)"),
        (["--log-level", "loud"], {}, "--log-level (POSENC_LOG_LEVEL)"),
        ([], {"POSENC_PORT": "tcp://10.0.0.1:8000"}, "enableServiceLinks: false"),
    ],
)
def test_configuration_errors_are_one_line_and_exit_2(
    args: list[str], env: dict[str, str], named: str
) -> None:
    assert "llama-3.1-8b" in load_presets()
    port = [] if "POSENC_PORT" in env else ["--port", "0"]  # the flag would win
    result = _run("serve", *port, *args, **env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("posenc: configuration error: ")
    assert named in lines[0]
    assert "Traceback" not in result.stderr
    assert not any(lines[0].count(f"got {arg!r}") > 1 for arg in args)  # said once


def test_a_secret_in_an_error_is_never_shown() -> None:
    result = _run("serve", "--api-keys", '["sekrit-key", 7]')
    assert result.returncode == 2
    assert "--api-keys (POSENC_API_KEYS)" in result.stderr
    assert "sekrit" not in result.stderr


def test_unknown_environment() -> None:
    env = {
        "POSENC_CACHE_BYTE": "1",  # a typo
        "posenc_warm_preset": "x",  # any case
        "POSENC_ZZZZ": "1",  # nothing close
        "POSENC_URL": "http://x",  # posenc-client's
        "POSENC_PORT": "1",  # a setting
        "OTHER": "1",
        "POSENC_SERVICE_HOST": "10.0.0.1",  # Kubernetes service links
        "POSENC_PORT_8000_TCP": "tcp://10.0.0.1:8000",
    }
    assert unknown_environment(env) == [
        "unknown environment variable POSENC_CACHE_BYTE is ignored; did you mean "
        "POSENC_CACHE_BYTES?",
        "unknown environment variable POSENC_ZZZZ is ignored",
        "unknown environment variable posenc_warm_preset is ignored; did you mean "
        "POSENC_WARM_PRESETS?",
        "environment variables POSENC_PORT_8000_TCP, POSENC_SERVICE_HOST are ignored: Kubernetes "
        "service links of a Service named posenc (they also set POSENC_PORT to tcp://...); set "
        "enableServiceLinks: false on the pod",
    ]


def test_serve_takes_sizes_warns_about_unknown_variables_and_prints_its_banner() -> None:
    """One real `posenc serve`: sizes from a flag and a variable, a misspelled variable warned
    about, and the banner naming every URL and the gRPC port."""
    proc = start_server_process(
        "--cache-bytes",
        "768MiB",
        "--grpc-port",
        "0",
        env={"POSENC_IN_FLIGHT_BYTES": "1.5GB", "POSENC_CACHE_BYTE": "4GiB", "POSENC_URL": "x"},
    )
    try:
        deadline = time.monotonic() + 30
        while "posenc listening" not in "".join(proc.lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        log = "".join(proc.lines)
        assert f"cache budget {768 * MiB} bytes, in-flight budget 1500000000 bytes" in log
        assert (
            "unknown environment variable POSENC_CACHE_BYTE is ignored; "
            "did you mean POSENC_CACHE_BYTES?"
        ) in log
        assert "POSENC_URL" not in log
        base = proc.url
        assert (
            f"posenc listening: explorer {base}/ui | API docs {base}/docs | /v1 {base}/v1 | "
            f"/v2 {base}/v2 | metrics {base}/metrics | gRPC {proc.grpc_url}"
        ) in log
    finally:
        proc.stop()


def test_the_banner_names_what_this_address_serves() -> None:
    """Behind a proxy (`--root-path /posenc`) the proxy strips the prefix: the banner names this
    address's own paths and says where the proxy serves them (it named /posenc/ui on this
    address, a 404 there)."""
    plain = banner(Settings(host="0.0.0.0"), 8016, None)
    assert plain.startswith("posenc listening: explorer http://127.0.0.1:8016/ui | ")
    assert "proxy" not in plain
    proxied = banner(Settings(host="0.0.0.0", root_path="/posenc"), 8016, 8001)
    assert "explorer http://127.0.0.1:8016/ui | API docs http://127.0.0.1:8016/docs" in proxied
    assert "/posenc/" not in proxied
    assert proxied.endswith("| gRPC 127.0.0.1:8001 | behind the proxy under /posenc")
