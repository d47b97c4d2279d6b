"""`posenc-client` on the user's own mistakes, against the real server: a bad option value, key,
output path, server URL, API key or environment value, and a table named two ways at once, is
exit 2 with one line naming the problem, never exit 1 ("a bug") with a traceback, never exit 4
("no answer from the server") and never ignored. The probe that found these ran the console
script; `test_console_script_reports_without_traceback` does too, the rest call `main(argv)`
(the same code, in-process)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from posenc_client import Tables
from posenc_client.cli import main
from tests.client import blocks
from tests.conftest import ServerHandle

CLI = Path(sys.executable).with_name("posenc-client")
BLOOM = str(blocks.CONFIGS / "bigscience__bloom-560m.json")
LLAMA31 = str(blocks.CONFIGS / "meta-llama__Llama-3.1-8B.json")
ROPE = ["rope", "head_dim=8", "max_positions=16"]

Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    """`cli(*args) -> (exit code, stdout, stderr)` against the session server; an argparse
    refusal (SystemExit) is its exit code too."""

    def run(*args: str) -> tuple[int, str, str]:
        argv = ["-q", "--url", server.url, "--cache-dir", str(tmp_path / "cache"), *args]
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 2
        out, err = capsys.readouterr()
        return code, out, err

    return run


def assert_usage(result: tuple[int, str, str], *names: str) -> None:
    """Exit 2, no traceback, no "unexpected error", and the last stderr line names each of
    `names`."""
    code, _, err = result
    assert code == 2, err
    assert "Traceback" not in err, err
    assert "unexpected error" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("posenc-client"), err
    for name in names:
        assert name in last, err


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "-inf", "abc"])
def test_timeout_is_checked_when_parsed(cli: Cli, value: str) -> None:
    """`--timeout` is a positive, finite number of seconds (was: -1 and nan a ValueError
    traceback from the socket, inf an OverflowError, exit 1)."""
    assert_usage(cli(f"--timeout={value}", "kinds"), "--timeout", repr(value))
    assert_usage(cli("kinds", f"--timeout={value}"), "--timeout", repr(value))


def test_retries_is_checked_when_parsed(cli: Cli) -> None:
    assert_usage(cli("--retries", "-1", "kinds"), "--retries", "-1")
    code, out, err = cli("--retries", "0", "--timeout", "30", "kinds")
    assert code == 0, err
    assert "rope" in out


@pytest.mark.parametrize("key", ["xyz", "4af8fb5a399f", "4AF8" + "0" * 60])
def test_fetch_key_is_checked_when_parsed(cli: Cli, key: str) -> None:
    """A --key that is no content key or table URL (was: a ValueError traceback, exit 1)."""
    assert_usage(cli("fetch", "--key", key, "-o", "x.safetensors"), "--key", repr(key))


def test_the_printed_key_fetches_the_table(cli: Cli, tmp_path: Path) -> None:
    """The key `fetch -o` prints is one `fetch --key` takes: the whole key (it printed 12 hex
    digits, which --key refused with a traceback). A shortened key is refused saying that the
    whole key is needed and where it is printed: the server resolves no prefixes."""
    out = tmp_path / "g1.safetensors"
    code, _, err = cli("fetch", *ROPE, "-o", str(out))
    assert code == 0, err
    key = Tables.from_safetensors(out.read_bytes()).key
    assert f"wrote {out} (rope {key})" in err
    again = tmp_path / "again.safetensors"
    code, _, err = cli("fetch", "--key", key, "-o", str(again))
    assert code == 0, err
    assert again.read_bytes() == out.read_bytes()
    assert_usage(cli("fetch", "--key", key[:12]), "--key", "64", "wrote")


def test_unwritable_output_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    """-o is the user's path: a folder under a regular file, a missing folder that cannot be
    made, a folder in the output's place: one line, exit 2, as an unsupported suffix (was: a
    FileExistsError / FileNotFoundError / IsADirectoryError traceback, exit 1)."""
    existing = tmp_path / "existing.safetensors"
    assert cli("fetch", *ROPE, "-o", str(existing))[0] == 0
    under_file = existing / "x.safetensors"
    assert_usage(cli("fetch", *ROPE, "-o", str(under_file)), "cannot write", str(under_file))
    folder = tmp_path / "folder.safetensors"
    folder.mkdir()
    assert_usage(cli("fetch", *ROPE, "-o", str(folder)), "cannot write", str(folder))
    onnx_out = existing / "bias.onnx"
    bias = ["alibi", "num_heads=4", "bias=causal", "key_length=4", "--graph", "bias"]
    assert_usage(cli("onnx", *bias, "-o", str(onnx_out)), "cannot write", str(onnx_out))
    if Path("/proc/self").is_dir():  # Linux: no file can be created in /proc
        assert_usage(cli("fetch", *ROPE, "-o", "/proc/x.safetensors"), "/proc/x.safetensors")
        assert_usage(cli("onnx", *bias, "-o", "/proc/x.onnx"), "/proc/x.onnx")


@pytest.mark.parametrize(
    "url",
    ["ht!tp://bad url", "http://a b:8000", "ftp://127.0.0.1:8000", "http://", "127.0.0.1:99999"],
)
def test_a_bad_server_url_is_a_usage_error(
    cli: Cli, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--url (and $POSENC_URL) that is no http(s) URL of a host: exit 2 naming it (was: exit 4,
    "no answer from the server", after trying to connect)."""
    assert_usage(cli("kinds", "--url", url), repr(url.strip()))
    monkeypatch.setenv("POSENC_URL", url)
    code, _, err = cli("kinds", "--url", "")  # empty: $POSENC_URL
    assert_usage((code, "", err), "POSENC_URL", repr(url.strip()))


@pytest.mark.parametrize("key", ["a\nb", "caf\u00e9", "tab\there"])
def test_an_api_key_a_header_cannot_carry_is_a_usage_error(
    cli: Cli, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--api-key (and $POSENC_API_KEY) goes into a header: visible ASCII only (was: exit 4
    "no answer" for a newline, exit 1 with a UnicodeEncodeError traceback for non-ASCII). The
    key itself is never printed."""
    code, _, err = cli("kinds", "--api-key", key)
    assert_usage((code, "", err), "--api-key")
    assert key not in err
    monkeypatch.setenv("POSENC_API_KEY", key)
    code, _, err = cli("kinds")
    assert_usage((code, "", err), "POSENC_API_KEY")
    assert key not in err


@pytest.mark.parametrize("value", ["maybe", "2", "offline", "y e s"])
def test_posenc_offline_takes_only_boolean_spellings(
    cli: Cli, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$POSENC_OFFLINE=maybe was read as false, silently; now exit 2 naming the variable and
    the spellings it takes."""
    monkeypatch.setenv("POSENC_OFFLINE", value)
    assert_usage(cli("fetch", "alibi", "num_heads=3"), "POSENC_OFFLINE", repr(value), "yes")


@pytest.mark.parametrize(
    ("value", "offline"),
    [("1", True), ("TRUE", True), (" yes ", True), ("on", True), ("0", False), ("false", False),
     ("No", False), ("off", False), ("", False)],
)  # fmt: skip
def test_posenc_offline_spellings(
    cli: Cli, value: str, offline: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spellings the README documents: offline, a table never fetched is a cache miss
    (exit 5); online it is fetched."""
    monkeypatch.setenv("POSENC_OFFLINE", value)
    code, _, err = cli("fetch", "alibi", "num_heads=3")
    assert code == (5 if offline else 0), err


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--preset", "llama-3.2-1b", "alibi", "max_positions=16"], ["--preset", "'alibi'"]),
        (["--preset", "llama-3.2-1b", "foo", "max_positions=16"], ["--preset", "'foo'"]),
        (["--spec", '{"kind": "alibi", "num_heads": 4}', "rope"], ["--spec", "'rope'"]),
        (["--key", "0" * 64, "alibi"], ["--key", "'alibi'"]),
        (["--spec", '{"kind": "alibi", "num_heads": 4}', "--key", "0" * 64], ["--spec", "--key"]),
        (["--preset", "bloom-560m", "--hf-config", BLOOM], ["--preset", "--hf-config"]),
        (["--key", "0" * 64, "max_positions=4"], ["--key", "max_positions"]),
        ([*ROPE, "--layer-type", "full_attention"], ["--layer-type"]),
        (["--spec", '{"kind": "alibi", "num_heads": 4}', "--layer-type", "x"], ["--layer-type"]),
    ],
)
def test_fetch_refuses_a_table_named_two_ways(cli: Cli, args: list[str], names: list[str]) -> None:
    """KIND beside --preset, --spec or --key, two of those at once, FIELD=VALUE beside --key and
    --layer-type where nothing has layer types: exit 2 naming both (was: one of them silently
    ignored, exit 0 and another table written)."""
    assert_usage(cli("fetch", *args), *names)


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["fetch", *ROPE, "rope_type=linear", "factor=NaN"], ["'factor=NaN'", "NaN"]),
        (["fetch", "rope", "head_dim=1e999", "max_positions=16"], ["'head_dim=1e999'"]),
        (["fetch", "--spec", '{"kind": "alibi", "num_heads": Infinity}'], ["the spec", "Infinity"]),
        (["onnx", "alibi", "num_heads=-Infinity", "--graph", "bias"], ["-Infinity"]),
        (["resolve", "NAN_CONFIG"], ["NAN_CONFIG", "NaN"]),
        (["fetch", "--hf-config", "NAN_CONFIG"], ["NAN_CONFIG", "NaN"]),
        (["fetch", "alibi", "num_heads=4", "--tensor", "slopes"], ["--tensor", "-o"]),
    ],
)
def test_values_no_request_can_carry(
    cli: Cli, tmp_path: Path, args: list[str], names: list[str]
) -> None:
    """NaN and infinities (Python's json reads `NaN`, `Infinity`, `1e999`; JSON has none) in
    FIELD=VALUE, --spec or a config.json: exit 2 naming them (was: "the request cannot be sent
    as JSON" from the client, a traceback and exit 1); --tensor without -o (was: ignored)."""
    config = tmp_path / "nan-config.json"
    text = (blocks.CONFIGS / "meta-llama__Llama-3.1-8B.json").read_text()
    data = json.loads(text)
    data["rope_theta"] = math.nan
    config.write_text(json.dumps(data))  # Python's json writes NaN
    args = [str(config) if a == "NAN_CONFIG" else a for a in args]
    names = [str(config) if n == "NAN_CONFIG" else n for n in names]
    assert_usage(cli(*args), *names)


def test_onnx_refuses_a_table_named_two_ways(cli: Cli) -> None:
    spec = '{"kind": "alibi", "num_heads": 4, "bias": "causal", "key_length": 4}'
    graph = ["--graph", "bias"]
    assert_usage(cli("onnx", "--spec", spec, "rope", *graph), "--spec", "'rope'")
    assert_usage(cli("onnx", "--spec", spec, "--hf-config", BLOOM, *graph), "--spec", "--hf-config")
    assert_usage(cli("onnx", "--spec", spec, "--layer-type", "x", *graph), "--layer-type")
    code, _, err = cli("onnx", "--spec", spec, *graph)
    assert code == 0, err


def test_fetch_kind_with_hf_config_keeps_that_family(cli: Cli) -> None:
    """With --hf-config, KIND keeps that family of the config's tables, as `onnx` and `resolve
    kind=` do (it was ignored: the config's only table came back whatever KIND said)."""
    code, out, err = cli("fetch", "--hf-config", BLOOM, "alibi")
    assert code == 0, err
    assert '"kind": "alibi"' in out
    code, _, err = cli("fetch", "--hf-config", LLAMA31, "alibi", "max_positions=8")
    assert code == 3, err
    assert "no 'alibi' table" in err


def test_console_script_reports_without_traceback(server: ServerHandle, tmp_path: Path) -> None:
    """The probe's own commands through the installed console script: one line on stderr,
    exit 2."""
    env_args = ["--url", server.url, "--cache-dir", str(tmp_path / "cache"), "-q"]
    existing = tmp_path / "existing.safetensors"
    existing.write_bytes(b"")
    for args in (
        ["--timeout", "-1", "kinds"],
        ["fetch", "--key", "xyz", "-o", str(tmp_path / "x.safetensors")],
        ["fetch", *ROPE, "-o", str(existing / "x.safetensors")],
        ["fetch", "--preset", "llama-3.2-1b", "alibi", "max_positions=16",
         "-o", str(tmp_path / "h2.safetensors")],
    ):  # fmt: skip
        done = subprocess.run(
            [str(CLI), *env_args, *args], capture_output=True, text=True, check=False, timeout=120
        )
        assert done.returncode == 2, (args, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        assert not (tmp_path / "h2.safetensors").exists()


def test_client_refuses_what_it_cannot_send(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library under the CLI: `Client` refuses at construction (ValueError naming the value
    or the variable, never the key) what its first request would have failed on, or what would
    have been silently misread."""
    from posenc_client import AsyncClient, Client

    for cls in (Client, AsyncClient):
        for url in ("ftp://127.0.0.1:8000", "http://a b", "http://", "127.0.0.1:99999"):
            with pytest.raises(ValueError, match="is not a server URL"):
                cls(url, cache=False)
        with pytest.raises(ValueError, match="character 2 of 3 is U\\+000A") as info:
            cls("127.0.0.1:8000", api_key="a\nb", cache=False)
        assert "a\nb" not in str(info.value)
        monkeypatch.setenv("POSENC_OFFLINE", "maybe")
        with pytest.raises(ValueError, match=r"\$POSENC_OFFLINE='maybe' is not a boolean"):
            cls("127.0.0.1:8000", cache=False)
        monkeypatch.delenv("POSENC_OFFLINE")
    monkeypatch.setenv("POSENC_OFFLINE", "maybe")
    with Client("127.0.0.1:8000", cache=False, offline=False) as client:  # given: not read
        assert not client.offline
    monkeypatch.setenv("POSENC_OFFLINE", " On ")
    monkeypatch.setenv("POSENC_URL", "HTTPS://example.org:8443/posenc/")
    monkeypatch.setenv("POSENC_API_KEY", "s3cret key~")
    with Client(cache=False) as client:
        assert client.offline
        assert client.base_url == "HTTPS://example.org:8443/posenc"
