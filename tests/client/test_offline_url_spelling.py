"""The offline index (requests/<sha256>.json) names the server whatever the URL's spelling
(`server_identity`): a table fetched online through one spelling is found offline, or with the
server stopped, through another; `localhost` and `127.0.0.1` stay two servers (names are not
resolved). Through the CLI's entry point against real servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posenc_client._cache import server_identity
from posenc_client.cli import main
from tests.client import blocks
from tests.conftest import ServerHandle, start_server

LLAMA31 = str(blocks.CONFIGS / "meta-llama__Llama-3.1-8B.json")
SPEC = ["rope", "head_dim=64", "max_positions=32", "rope_theta=5e5"]


def spellings(url: str) -> list[str]:
    """Every spelling of one server URL `http://127.0.0.1:PORT` the index must take as one."""
    host_port = url.removeprefix("http://")
    return [url, f"{url}/", host_port, f"HTTP://{host_port}/", f"http://user@{host_port}"]


def fetch_key(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str | None, str]:
    code = main([*args, "-q"])
    out, err = capsys.readouterr()
    return code, (json.loads(out)["key"] if code == 0 else None), err


def test_offline_with_another_spelling(
    server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = ["--cache-dir", str(tmp_path / "cache")]
    first, *others = spellings(server.url)
    code, key, err = fetch_key(capsys, "--url", first, *cache, "fetch", *SPEC)
    assert code == 0, err
    code, _, _ = fetch_key(capsys, "--url", first, *cache, "fetch", "--hf-config", LLAMA31,
                           "max_positions=16")  # fmt: skip
    assert code == 0
    for url in others:
        code, got, err = fetch_key(capsys, "--offline", "--url", url, *cache, "fetch", *SPEC)
        assert (code, got) == (0, key), (url, err)
        code, _, err = fetch_key(capsys, "--offline", "--url", url, *cache, "fetch",
                                 "--hf-config", LLAMA31, "max_positions=16")  # fmt: skip
        assert code == 0, (url, err)
    port = server.url.rpartition(":")[2]
    code, _, err = fetch_key(capsys, "--offline", "--url", f"http://localhost:{port}", *cache,
                             "fetch", *SPEC)  # fmt: skip
    assert code == 5, err  # another host name: another server for the index


def test_server_stopped_with_another_spelling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = ["--cache-dir", str(tmp_path / "cache"), "--retries", "0"]
    with start_server() as own:
        url = own.url
        code, key, err = fetch_key(capsys, "--url", f"{url}/", *cache, "fetch", *SPEC)
        assert code == 0, err
    host_port = url.removeprefix("http://")
    code, got, err = fetch_key(capsys, "--url", host_port, *cache, "fetch", *SPEC)
    assert (code, got) == (0, key), err  # the server is gone: the cached table, found by spec
    code, _, err = fetch_key(capsys, "--url", host_port, *cache, "fetch", "alibi", "num_heads=4")
    assert code == 4, err  # never fetched: no answer


@pytest.mark.parametrize(
    ("url", "identity"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("HTTP://127.0.0.1:8000/", "http://127.0.0.1:8000"),
        ("http://Example.COM:80/", "http://example.com"),
        ("https://example.com:443/posenc/", "https://example.com/posenc"),
        ("https://example.com:8443/posenc", "https://example.com:8443/posenc"),
        ("http://[::1]:8000/", "http://[::1]:8000"),
        ("http://localhost:8000", "http://localhost:8000"),
        ("http://key:secret@host:8000/?x=1#f", "http://host:8000"),
    ],
)
def test_server_identity(url: str, identity: str) -> None:
    assert server_identity(url) == identity
