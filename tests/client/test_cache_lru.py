"""The disk cache's size cap, LRU pruning and listing, with real files and the real server:
`--cache-max-bytes` / `POSENC_CACHE_MAX_BYTES` / `Client(cache_max_bytes=)`, `posenc-client cache
ls [--json]` and `cache prune [--max-bytes]`, through the CLI's entry point (in process, and as
concurrent console-script processes sharing one cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from posenc_client import Client
from posenc_client._cache import DiskCache, parse_size
from posenc_client.cli import main
from tests.conftest import ServerHandle

CLI = Path(sys.executable).with_name("posenc-client")
KiB = 1 << 10


def rope(rows: int) -> list[str]:
    """A RoPE table of `rows` positions: 2 * rows * 64 float32 (cos, sin) plus inv_freq."""
    return ["rope", "head_dim=64", f"max_positions={rows}", "rope_theta=10000"]


class Cli:
    def __init__(self, server: ServerHandle, cache: Path, capsys: pytest.CaptureFixture[str]):
        self.base = ["--url", server.url, "--cache-dir", str(cache), "-q"]
        self.capsys = capsys

    def __call__(self, *args: str) -> tuple[int, str, str]:
        code = main([*self.base, *args])
        out, err = self.capsys.readouterr()
        return code, out, err

    def key(self, *args: str) -> str:
        code, out, err = self(*args)
        assert code == 0, err
        return str(json.loads(out)["key"])

    def ls(self) -> dict[str, dict[str, object]]:
        code, out, err = self("cache", "ls", "--json")
        assert code == 0, err
        return {e["key"]: e for e in json.loads(out)["entries"]}


def on_disk(cache: Path) -> int:
    """Bytes of the tables and models (files and digests) under `cache`."""
    return sum(p.stat().st_size for ns in ("tables", "onnx") for p in (cache / ns).glob("*"))


def age(cache: Path, key: str, seconds_ago: float) -> None:
    """Set an entry's last use in the past (its file's mtime), as an earlier use would have."""
    path = cache / "tables" / f"{key}.safetensors"
    stamp = path.stat().st_mtime - seconds_ago
    os.utime(path, (stamp, stamp))


@pytest.fixture
def cli(server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(server, tmp_path / "cache", capsys)


def test_ls_lists_entries_with_their_requests(cli: Cli, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    a = cli.key("fetch", *rope(64))
    b = cli.key("fetch", "--preset", "gemma-3-27b", "--layer-type", "full_attention",
                "max_positions=32")  # fmt: skip
    entries = cli.ls()
    assert set(entries) == {a, b}
    for key, entry in entries.items():
        files = [cache / "tables" / f"{key}{suffix}" for suffix in (".safetensors", ".digest")]
        assert entry["bytes"] == sum(f.stat().st_size for f in files)
        assert entry["ns"] == "tables"
    (request,) = entries[a]["requests"]  # type: ignore[misc]
    assert request["route"] == "POST /v1/tables"
    assert request["body"]["max_positions"] == 64
    assert entries[a]["kind"] == "rope"
    assert entries[b]["requests"][0]["body"]["preset"] == "gemma-3-27b"  # type: ignore[index]
    code, out, err = cli("cache", "ls")
    assert code == 0
    assert a[:16] in out
    assert "gemma-3-27b" in out
    assert "2 entries" in err
    assert "no cap" in err


def test_cap_prunes_least_recently_used_after_each_write(cli: Cli, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    a = cli.key("fetch", *rope(256))
    b = cli.key("fetch", *rope(257))
    one = cli.ls()[a]["bytes"]
    assert isinstance(one, int)
    age(cache, a, 100)
    age(cache, b, 50)
    stamps = {key: entry["last_used"] for key, entry in cli.ls().items()}
    assert cli("cache", "verify")[0] == 0
    assert {key: entry["last_used"] for key, entry in cli.ls().items()} == stamps  # not a use
    assert cli.key("fetch", *rope(256)) == a  # a read: A is now the most recently used
    cap = str(2 * one + one // 2)  # room for two of these tables, not three
    c = cli.key("--cache-max-bytes", cap, "fetch", *rope(258))
    assert set(cli.ls()) == {a, c}  # B, the least recently used, went
    assert on_disk(cache) <= int(cap)
    records = [json.loads(p.read_text()) for p in (cache / "requests").glob("*.json")]
    assert {r["key"] for r in records} == {a, c}  # B's record went with it
    assert cli.key("--offline", "fetch", *rope(256)) == a
    code, _, err = cli("--offline", "fetch", *rope(257))
    assert code == 5, err  # pruned: a miss offline, fetched again online
    assert cli.key("--cache-max-bytes", cap, "fetch", *rope(257)) == b
    assert set(cli.ls()) == {a, b}  # C went: A was read (offline, above) after C was written


def test_the_entry_just_written_stays(cli: Cli, tmp_path: Path) -> None:
    """A cap smaller than one table: every write prunes all the others, never itself."""
    cache = tmp_path / "cache"
    cli.key("fetch", *rope(100))
    a = cli.key("--cache-max-bytes", "1KiB", "fetch", *rope(128))
    assert set(cli.ls()) == {a}
    assert on_disk(cache) > KiB
    code, _, err = cli("cache", "verify")
    assert code == 0, err


def test_prune_command(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    keys = [cli.key("fetch", *rope(rows)) for rows in (300, 301, 302)]
    for n, key in enumerate(keys):
        age(cache, key, 300 - 100 * n)  # keys[0] least recently used
    code, _, err = cli("cache", "prune")
    assert code == 2
    assert "needs a cap" in err
    sizes = {key: entry["bytes"] for key, entry in cli.ls().items()}
    room = sum(int(sizes[key]) for key in keys[1:])  # type: ignore[call-overload]
    code, out, err = cli("cache", "prune", "--max-bytes", str(room))
    assert code == 0, err
    assert keys[0][:16] in out
    assert set(cli.ls()) == set(keys[1:])
    monkeypatch.setenv("POSENC_CACHE_MAX_BYTES", "1B")
    code, _, err = cli("cache", "prune")
    assert code == 0, err
    assert set(cli.ls()) == set()  # nothing was just written: everything over the cap goes
    monkeypatch.setenv("POSENC_CACHE_MAX_BYTES", "4g")
    code, _, err = cli("cache", "ls")
    assert code == 2
    assert "POSENC_CACHE_MAX_BYTES" in err
    monkeypatch.delenv("POSENC_CACHE_MAX_BYTES")
    with pytest.raises(SystemExit) as info:
        main(["--cache-max-bytes", "lots", "cache", "ls"])
    assert info.value.code == 2


def test_client_option_and_environment(
    server: ServerHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POSENC_CACHE_MAX_BYTES", "64KiB")
    with Client(server.url, cache=tmp_path / "env") as client:
        assert client.cache is not None
        assert client.cache.max_bytes == 64 * KiB
    with Client(server.url, cache=tmp_path / "opt", cache_max_bytes="100KiB") as client:
        assert client.cache is not None
        assert client.cache.max_bytes == 100 * KiB
        for rows in (128, 129, 130):  # 66 KiB each
            client.rope(64, rows)
        assert len(client.cache.keys()) == 1
        assert on_disk(tmp_path / "opt") <= 100 * KiB
    with pytest.raises(ValueError, match="DiskCache"):
        Client(server.url, cache=DiskCache(tmp_path), cache_max_bytes=1)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4GiB", 4 << 30),
        ("512MiB", 512 << 20),
        ("1.5GB", 1_500_000_000),
        ("1048576", 1 << 20),
        ("100B", 100),
        ("2kb", 2000),
        (" 3 MiB ", 3 << 20),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["4g", "512m", "1.5B", "-1", "lots", "", "1e9"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"byte size|whole number|negative"):
        parse_size(text)


def test_concurrent_processes_share_a_capped_cache(server: ServerHandle, tmp_path: Path) -> None:
    """Four console-script processes fetch and re-read tables into one capped cache at once:
    every fetch succeeds with the right table, nothing is left corrupt or half-written, and the
    cache ends within its cap."""
    cache = tmp_path / "cache"
    cap = 200 * KiB  # three of the 66 KiB tables
    fetch = (f"{CLI} --url {server.url} --cache-dir {cache} --cache-max-bytes {cap} -q fetch "
             "rope head_dim=64 max_positions={rows} rope_theta=10000 | grep '\"key\"'")  # fmt: skip
    procs = []
    for worker in range(4):
        rows = [128 + (worker * 3 + n) % 8 for n in range(6)]  # overlapping tables
        cmd = " && ".join(fetch.format(rows=r) for r in rows)
        procs.append((rows, subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True)))  # fmt: skip
    with Client(server.url, cache=False) as client:
        expected = {rows: client.rope(64, rows, rope_theta=10000).key for rows in range(128, 136)}
    for rows, proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
        got = [line.split('"key": "')[1].rstrip('",') for line in out.strip().splitlines()]
        assert got == [expected[r] for r in rows]
    assert on_disk(cache) <= cap
    done = subprocess.run([str(CLI), "--cache-dir", str(cache), "cache", "verify"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stale" not in done.stdout


SIZES = ["4GiB", "512MiB", "1.5GB", "1048576", "100B", "2kb", " 3 MiB ", "0", "1TiB", ".5KiB"]
NOT_SIZES = ["4g", "512m", "1.5B", "-1", "lots", "", "1e9", "3 MiBs", "0.3B"]


@pytest.mark.parametrize("text", SIZES + NOT_SIZES)
def test_client_and_server_read_sizes_alike(text: str) -> None:
    """The client's `--cache-max-bytes` and the server's size settings take the same spellings
    (two copies: the client package never imports the server's): each string is the same
    number of bytes to both, or refused by both."""
    from posenc.api.settings import parse_bytes

    def read(parse: Callable[[str], object]) -> object:
        try:
            return parse(text)
        except ValueError:
            return "refused"

    assert read(parse_size) == read(parse_bytes)
    assert (read(parse_size) == "refused") == (text in NOT_SIZES)
