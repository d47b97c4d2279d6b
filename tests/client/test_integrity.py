"""Integrity end to end (issue 23, item 4): the server's `Repr-Digest` (RFC 9530) on every whole
table and ONNX model, the client checking it on arrival, storing it with each cache entry and
checking every read against it, online (the entry is fetched again) and offline (an error naming
the file), and `posenc-client cache verify|clear`.

Corruption is made the way it happens: bytes of the cached file changed on disk (a flipped bit
inside the tensor data, junk appended), or bytes changed on the way (a transport that flips one).
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import httpx
import pytest

from posenc_client import Client, CorruptCacheError, DecodeError, DiskCache
from posenc_client.cli import EXIT_CORRUPT, EXIT_OFFLINE, EXIT_OK, main
from tests.conftest import ServerHandle

SPEC = {"kind": "rope", "head_dim": 64, "max_positions": 256, "profile": "onnx"}
ONNX_SPEC = {"kind": "alibi", "num_heads": 4, "bias": "causal", "key_length": 4}


def sha256_field(body: bytes) -> str:
    return f"sha-256=:{base64.b64encode(hashlib.sha256(body).digest()).decode()}:"


class Recorder(httpx.HTTPTransport):
    """A real transport recording (method, path, status); `flip` flips one bit of the next
    200 body (bytes changed on the way)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, str, int]] = []
        self.flip = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.log.append((request.method, request.url.path, response.status_code))
        if self.flip and response.status_code == 200:
            self.flip = False
            body = bytearray(response.read())
            body[len(body) // 2] ^= 0x10
            return httpx.Response(200, headers=response.headers, content=bytes(body))
        return response


def flip_bit_in_data(path: Path) -> None:
    """Flip one bit in the last tensor's data (past the safetensors header: still parses)."""
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))


def append_junk(path: Path) -> None:
    with path.open("ab") as f:
        f.write(b"\x00junk!\xff\x01")


def test_server_sends_repr_digest_of_each_representation(client: httpx.Client) -> None:
    posted = client.post("/v1/tables", json=SPEC)
    assert posted.status_code == 200
    assert posted.headers["repr-digest"] == sha256_field(posted.content)
    key = posted.headers["x-posenc-key"]
    for query in ({}, {"format": "npz"}, {"format": "raw", "tensor": "cos"}, {"format": "json"}):
        got = client.get(f"/v1/tables/{key}", params=query)
        assert got.status_code == 200
        assert got.headers["repr-digest"] == sha256_field(got.content), query
    whole = client.get(f"/v1/tables/{key}", params={"format": "raw", "tensor": "cos"})
    ranged = client.get(
        f"/v1/tables/{key}",
        params={"format": "raw", "tensor": "cos"},
        headers={"Range": "bytes=0-99"},
    )
    assert ranged.status_code == 206
    # Repr-Digest names the whole representation, whatever part of it the body carries
    assert ranged.headers["repr-digest"] == whole.headers["repr-digest"]
    rows = client.get(f"/v1/tables/{key}", params={"rows": "0:8"})
    assert rows.status_code == 200
    assert "repr-digest" not in rows.headers
    model = client.post("/v1/onnx", json={"spec": ONNX_SPEC, "graph": "bias", "opset": 19})
    assert model.status_code == 200
    assert model.headers["repr-digest"] == sha256_field(model.content)
    again = client.get(f"/v1/onnx/{model.headers['x-posenc-key']}")
    assert again.headers["repr-digest"] == model.headers["repr-digest"]


def test_digest_is_kept_on_the_cache_entry(server: ServerHandle, client: httpx.Client) -> None:
    spec = {**SPEC, "max_positions": 96}
    key = client.post("/v1/tables", json=spec).headers["x-posenc-key"]
    client.get(f"/v1/tables/{key}", params={"format": "npz"})
    cache = server.state.require_cache()
    spec_of_key = server.state.index.get(key)
    assert spec_of_key is not None
    entry = cache.peek(cache.key_for(spec_of_key, key))
    assert entry is not None
    assert set(entry.digests) >= {
        ("safetensors", ("cos", "sin", "inv_freq")),
        ("npz", ("cos", "sin", "inv_freq")),
    }
    first = entry.digests[("npz", ("cos", "sin", "inv_freq"))]
    client.get(f"/v1/tables/{key}", params={"format": "npz"})
    assert (
        entry.digests[("npz", ("cos", "sin", "inv_freq"))] is first
    )  # computed once, not per request


@pytest.mark.parametrize("damage", [flip_bit_in_data, append_junk], ids=["flipped", "appended"])
def test_corrupt_table_is_fetched_again_online(
    server: ServerHandle, cache_dir: Path, damage: object
) -> None:
    recorder = Recorder()
    with Client(server.url, cache=cache_dir, retries=0, transport=recorder) as client:
        good = client.table(SPEC)
    path = DiskCache(cache_dir).path("tables", good.key)
    assert path.with_suffix(".digest").read_text() == sha256_field(path.read_bytes())
    pristine = path.read_bytes()
    damage(path)  # type: ignore[operator]
    recorder.log.clear()
    with Client(server.url, cache=cache_dir, retries=0, transport=recorder) as client:
        again = client.table(SPEC)
        by_key = client.table_by_key(good.key)
    # no 304 for the damaged copy: it was fetched again, and the good copy then revalidated
    assert recorder.log == [
        ("POST", "/v1/tables", 200),
        ("GET", f"/v1/tables/{good.key}", 304),
    ]
    assert path.read_bytes() == pristine
    for tables in (again, by_key):
        for name in good:
            assert (tables[name] == good[name]).all()


@pytest.mark.parametrize("damage", [flip_bit_in_data, append_junk], ids=["flipped", "appended"])
def test_corrupt_table_offline_names_the_file(
    server: ServerHandle, cache_dir: Path, damage: object
) -> None:
    with Client(server.url, cache=cache_dir, retries=0) as client:
        good = client.table(SPEC)
    path = DiskCache(cache_dir).path("tables", good.key)
    damage(path)  # type: ignore[operator]
    with Client(server.url, cache=cache_dir, offline=True) as client:
        for call in (lambda: client.table(SPEC), lambda: client.table_by_key(good.key)):
            with pytest.raises(CorruptCacheError) as info:
                call()
            assert info.value.path == str(path)
            assert str(path) in str(info.value)
        with pytest.raises(CorruptCacheError):
            client.table_by_key(good.key, rows=(0, 4))
    code = main(["--url", server.url, "--cache-dir", str(cache_dir), "--offline",
                 "fetch", "--key", good.key])  # fmt: skip
    assert code == EXIT_OFFLINE


def test_missing_digest_counts_as_corrupt(server: ServerHandle, cache_dir: Path) -> None:
    with Client(server.url, cache=cache_dir, retries=0) as client:
        good = client.table(SPEC)
    DiskCache(cache_dir).digest_path("tables", good.key).unlink()
    with (
        Client(server.url, cache=cache_dir, offline=True) as client,
        pytest.raises(CorruptCacheError, match="no stored digest"),
    ):
        client.table(SPEC)
    with Client(server.url, cache=cache_dir, retries=0) as client:
        assert client.table(SPEC).key == good.key
    assert DiskCache(cache_dir).verify()[0].problem is None


def test_corrupt_onnx_model_online_and_offline(server: ServerHandle, cache_dir: Path) -> None:
    recorder = Recorder()
    with Client(server.url, cache=cache_dir, retries=0, transport=recorder) as client:
        first = client.onnx(ONNX_SPEC, graph="bias", opset=19)
    path = DiskCache(cache_dir).path("onnx", first.key)
    append_junk(path)
    with Client(server.url, cache=cache_dir, offline=True) as client:
        with pytest.raises(CorruptCacheError) as info:
            client.onnx(ONNX_SPEC, graph="bias", opset=19)
        assert info.value.path == str(path)
    recorder.log.clear()
    with Client(server.url, cache=cache_dir, retries=0, transport=recorder) as client:
        again = client.onnx(ONNX_SPEC, graph="bias", opset=19)
    assert again.data == first.data
    assert recorder.log == [("POST", "/v1/onnx", 200)]
    assert path.read_bytes() == first.data


def test_body_changed_on_the_way_is_refused(server: ServerHandle, cache_dir: Path) -> None:
    recorder = Recorder()
    recorder.flip = True
    with Client(server.url, cache=cache_dir, retries=0, transport=recorder) as client:
        with pytest.raises(DecodeError, match="Repr-Digest"):
            client.table({**SPEC, "max_positions": 40})
        assert DiskCache(cache_dir).keys() == []  # nothing stored
        recorder.flip = True
        with pytest.raises(DecodeError, match="Repr-Digest"):
            client.onnx(ONNX_SPEC, graph="bias", opset=18)
        assert client.table({**SPEC, "max_positions": 40}).key


def test_cli_cache_verify_and_clear(
    server: ServerHandle, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def cli(*args: str) -> tuple[int, str, str]:
        code = main(["--url", server.url, "--cache-dir", str(cache_dir), *args])
        out, err = capsys.readouterr()
        return code, out, err

    with Client(server.url, cache=cache_dir, retries=0) as client:
        good = client.table(SPEC)
        other = client.alibi(6)
        client.onnx(ONNX_SPEC, graph="bias", opset=19)
    assert cli("cache", "verify") == (EXIT_OK, "", "3 of 3 cached files match their digests\n")
    path = DiskCache(cache_dir).path("tables", good.key)
    flip_bit_in_data(path)
    code, out, err = cli("cache", "verify")
    assert code == EXIT_CORRUPT
    assert out.startswith(f"corrupt: {path}: ")
    assert out.count("\n") == 1
    assert "2 of 3" in err
    code, out, err = cli("cache", "verify", "--remove")
    assert code == EXIT_OK
    assert "removed 1 corrupt" in err
    assert not path.exists()
    assert DiskCache(cache_dir).keys() == [other.key]
    assert cli("cache", "verify")[0] == EXIT_OK
    code, _, err = cli("cache", "clear")
    assert code == EXIT_OK
    assert "removed" in err
    assert DiskCache(cache_dir).verify() == []
    assert cli("--no-cache", "cache", "verify")[0] == 2


class Tamper(httpx.HTTPTransport):
    """A real transport that changes the server's answers the way a man in the middle, a broken
    proxy or a misrouted request would (issue 32, findings 9 and 10)."""

    def __init__(self, mode: str, swap: tuple[str, str] = ("", "")) -> None:
        super().__init__()
        self.mode = mode
        self.swap = swap

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.mode == "swap" and request.url.path == f"/v1/tables/{self.swap[0]}":
            request = httpx.Request(
                request.method,
                request.url.copy_with(path=f"/v1/tables/{self.swap[1]}"),
                headers=request.headers,
            )
        response = super().handle_request(request)
        if response.status_code != 200 or self.mode == "swap":
            return response
        body = response.read()
        headers = {k: v for k, v in response.headers.items() if k != "repr-digest"}
        if self.mode == "gzip":
            import gzip

            body = gzip.compress(body)
            headers["content-encoding"] = "gzip"
            headers["content-length"] = str(len(body))
        return httpx.Response(200, headers=headers, content=body)


def test_an_answer_without_repr_digest_is_refused_and_never_cached(
    server: ServerHandle, cache_dir: Path
) -> None:
    """A whole table or model without `Repr-Digest` is refused (`DecodeError`) and nothing is
    cached: a digest the client computed itself would vouch for whatever arrived, and a later
    304 from the genuine server would confirm it."""
    spec = {**SPEC, "max_positions": 41}
    with Client(server.url, cache=cache_dir, retries=0, transport=Tamper("strip")) as client:
        with pytest.raises(DecodeError, match="no Repr-Digest"):
            client.table(spec)
        with pytest.raises(DecodeError, match="no Repr-Digest"):
            client.onnx(ONNX_SPEC, graph="bias", opset=17)
    assert DiskCache(cache_dir).keys() == []
    with Client(server.url, cache=cache_dir, retries=0) as client:
        assert client.table(spec).key


def test_table_by_key_refuses_another_keys_table(server: ServerHandle, cache_dir: Path) -> None:
    with Client(server.url, cache=cache_dir, retries=0) as client:
        wanted = client.table({**SPEC, "max_positions": 42}, rows=(0, 1)).key
        other = client.table({**SPEC, "max_positions": 43}).key
    DiskCache(cache_dir).clear()
    tamper = Tamper("swap", (wanted, other))
    with (
        Client(server.url, cache=cache_dir, retries=0, transport=tamper) as client,
        pytest.raises(DecodeError, match=f"asked for table {wanted}"),
    ):
        client.table_by_key(wanted)
    assert DiskCache(cache_dir).keys() == []


def test_an_encoding_the_client_did_not_ask_for_is_refused_unread(
    server: ServerHandle, cache_dir: Path
) -> None:
    """The client asks for identity; a gzip answer is refused before its body is decompressed
    (4 MiB of gzip can be 4 GiB)."""
    with (
        Client(server.url, cache=cache_dir, retries=0, transport=Tamper("gzip")) as client,
        pytest.raises(DecodeError, match="content encoding 'gzip'"),
    ):
        client.table({**SPEC, "max_positions": 44})
    assert DiskCache(cache_dir).keys() == []


def test_cache_writes_never_follow_a_planted_symlink(
    server: ServerHandle, cache_dir: Path, tmp_path: Path
) -> None:
    """Temporary files get random names, created exclusively: a symlink planted at the name an
    older client used (`<file>.<pid>.tmp`) is neither followed nor replaced."""
    import os

    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    spec = {**SPEC, "max_positions": 45}
    with Client(server.url, cache=False, retries=0) as client:
        key = client.table(spec).key
    target = DiskCache(cache_dir).path("tables", key)
    target.parent.mkdir(parents=True)
    planted = Path(f"{target}.{os.getpid()}.tmp")
    planted.symlink_to(victim)
    with Client(server.url, cache=cache_dir, retries=0) as client:
        assert client.table(spec).key == key
    assert victim.read_bytes() == b"untouched"
    assert planted.is_symlink()
    assert DiskCache(cache_dir).verify()[0].problem is None


def test_cache_verify_reports_stale_temporary_files(
    server: ServerHandle, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Client(server.url, cache=cache_dir, retries=0) as client:
        good = client.table({**SPEC, "max_positions": 46})
    stale = DiskCache(cache_dir).path("tables", good.key).parent / ".x.safetensors.abc123.tmp"
    stale.write_bytes(b"half a table")  # what a writer killed mid-write leaves
    code = main(["--url", server.url, "--cache-dir", str(cache_dir), "cache", "verify"])
    out, err = capsys.readouterr()
    assert code == EXIT_OK
    assert f"stale: {stale}" in out
    assert "found 1 stale temporary files" in err
    main(["--url", server.url, "--cache-dir", str(cache_dir), "cache", "verify", "--remove"])
    assert not stale.exists()


def test_a_cache_that_cannot_be_written_is_a_warning(
    server: ServerHandle, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cache folder that cannot be written (here: a file where the folder should be; a full
    disk fails the same way) costs the cache, not the answer."""
    blocked = tmp_path / "cache"
    blocked.write_bytes(b"not a folder")
    with Client(server.url, cache=blocked, retries=0) as client:
        tables = client.table({**SPEC, "max_positions": 47})
    assert tables.key
    assert any("could not write to the cache" in r.getMessage() for r in caplog.records)
