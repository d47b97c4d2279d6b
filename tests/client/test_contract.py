"""Client against a real server: every call, the error contract as typed exceptions, the disk
cache (304 revalidation, offline use, a restarted server), retries through injected transports,
API keys, and the async twin.

Tables are compared with the server's own core (`posenc.encodings.compute`): the client's numpy
arrays must be bit-identical to what the server computed, bfloat16 included.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

import posenc_client
from posenc.encodings import compute, parse_spec
from posenc_client import (
    AmbiguousConfigError,
    AsyncClient,
    AuthenticationError,
    CacheMissError,
    Client,
    ConnectError,
    DiskCache,
    InvalidSpecError,
    NotFoundError,
    Retries,
    ServiceUnavailableError,
    Tables,
    TooLargeError,
    UnknownKindError,
    UnsupportedConfigError,
)
from posenc_client.cli import main as cli_main
from tests.api.wire import table_url_parts
from tests.client import blocks
from tests.conftest import ServerHandle, start_server
from tests.tolerances import served_as_reference

LLAMA31 = blocks.CONFIGS / "meta-llama__Llama-3.1-8B.json"
GEMMA3 = blocks.CONFIGS / "google__gemma-3-4b-it.json"


class Recorder(httpx.HTTPTransport):
    """A real transport that records (method, path, status) of every exchange, and each URL."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, str, int]] = []
        self.urls: list[str] = []
        self.redirect: httpx.URL | None = None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.redirect is not None:
            request.url = request.url.copy_with(port=self.redirect.port)
        response = super().handle_request(request)
        self.log.append((request.method, request.url.path, response.status_code))
        self.urls.append(str(request.url))
        return response


def _same_as_core(tables: Tables, device: torch.device) -> None:
    """The client's arrays are bit-identical to the server core's tensors for its spec, computed
    on the server's device (a GPU's tables may differ from the CPU's by an ulp)."""
    expected = compute(parse_spec(tables.spec), device).tensors
    assert set(tables) == set(expected)
    for name, tensor in expected.items():
        got = tables.to_torch()[name]
        assert got.dtype == tensor.dtype, name
        assert torch.equal(got, tensor.cpu()), name


def test_rope_keywords_as_in_transformers(pclient: Client, server: ServerHandle) -> None:
    flat = pclient.rope(
        128,
        64,
        rope_theta=500000.0,
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
        profile="onnx",
    )
    nested = pclient.rope(
        128,
        64,
        rope_theta=500000.0,
        rope_scaling={"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        profile="onnx",
    )  # fmt: skip
    v5 = pclient.rope(
        128,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
        profile="onnx",
    )  # fmt: skip
    assert flat.key == nested.key == v5.key
    assert flat.kind == "rope"
    assert flat.spec["rope_scaling"]["rope_type"] == "llama3"
    assert flat["cos"].shape == (64, 64)
    assert flat.dtypes["cos"] == "float32"
    assert flat.meta["rotary_dim"] == 128
    _same_as_core(flat, server.device)


def test_every_family(pclient: Client, server: ServerHandle) -> None:
    tables = [
        pclient.rope(64, 32, partial_rotary_factor=0.5, dtype="bfloat16"),
        pclient.rope(64, 32, rope_type="dynamic", factor=2.0, max_position_embeddings=16),
        pclient.alibi(12),
        pclient.alibi(12, bias="causal", key_length=8, dtype="bfloat16"),
        pclient.sinusoidal(16, 10),
        pclient.t5_bias(query_length=6, num_buckets=8, max_distance=16),
        pclient.table({"kind": "sinusoidal_2d", "style": "mae", "dim": 16, "grid_height": 2,
                       "grid_width": 3}),
    ]  # fmt: skip
    assert tables[0].dtypes["cos"] == "bfloat16"
    assert tables[0]["cos"].dtype.name == "bfloat16"
    assert tables[3]["bias"].shape == (12, 8, 8)
    assert tables[2]["slopes"][:2].tolist() == [0.5, 0.25]  # 2^-1, 2^-2 (H=12: c=8)
    for t in tables:
        _same_as_core(t, server.device)
        assert pclient.table_by_key(t.key).key == t.key


def test_arrays_are_writable_and_mapping_like(pclient: Client) -> None:
    t = pclient.alibi(8)
    assert list(t) == ["slopes"]
    assert len(t) == 1
    assert "slopes" in t
    t["slopes"][0] = 1.0  # a view of the client's own buffer
    with pytest.raises(KeyError, match="slopes"):
        t["bias"]
    assert "alibi" in repr(t)


def test_resolve_and_tables_for_model(pclient: Client, server: ServerHandle) -> None:
    config = blocks.load_config("google__gemma-3-4b-it")
    by_path = pclient.resolve(GEMMA3, profile="onnx", max_positions=16)
    by_dict = pclient.resolve(config, profile="onnx", max_positions=16)
    assert [s.key for s in by_path] == [s.key for s in by_dict]
    assert [s.name for s in by_path] == ["rope:sliding_attention", "rope:full_attention"]
    found = pclient.tables_for_model(GEMMA3, profile="onnx", max_positions=16)
    assert list(found) == [s.name for s in by_path]
    for spec, (name, tables) in zip(by_path, found.items(), strict=True):
        assert tables.key == spec.key
        assert tables.name == name
        assert tables.notes == spec.notes
        _same_as_core(tables, server.device)
    only = pclient.tables_for_model(GEMMA3, layer_type="sliding_attention", max_positions=16)
    assert list(only) == ["rope:sliding_attention"] or list(only) == ["rope"]


def test_resolve_lists_the_unserved_parts(
    pclient: Client, server: ServerHandle, cache_dir: Path
) -> None:
    """A config served in part: the served tables as before (a list), the parts left out in
    `.unserved` with reason and config key, also from the offline cache."""
    config = {
        "model_type": "swin",
        "use_absolute_embeddings": True,
        "image_size": 32,
        "patch_size": 4,
        "embed_dim": 96,
        "window_size": 7,
    }
    specs = pclient.resolve(config)
    assert isinstance(specs, posenc_client.ResolvedSpecs)
    assert [s.name for s in specs] == ["relative_index"]
    (part,) = specs.unserved
    assert isinstance(part, posenc_client.UnservedPart)
    assert (part.part, part.config_key) == ("learned", "table_key")
    assert "table_key" in part.reason
    with Client(server.url, cache=cache_dir, offline=True) as offline:
        again = offline.resolve(config)
    assert [s.key for s in again] == [s.key for s in specs]
    assert again.unserved == specs.unserved
    assert pclient.resolve({"model_type": "t5"}).unserved == []


def test_config_folder(pclient: Client, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(LLAMA31.read_text())
    (spec,) = pclient.resolve(tmp_path, max_positions=8)
    assert spec.kind == "rope"
    assert spec.spec["max_positions"] == 8


def test_presets_and_kinds(pclient: Client) -> None:
    presets = pclient.presets()
    names = [p.name for p in presets]
    assert len(names) >= 15
    assert "llama-3.1-8b" in names
    preset = pclient.preset("bloom-560m")
    assert preset.model == "bigscience/bloom-560m"
    assert preset.parts[0].spec is not None
    tables = pclient.preset_tables("bloom-560m")
    assert list(tables) == ["alibi"]
    assert tables["alibi"]["slopes"].shape == (16,)
    kinds = {k["kind"]: k for k in pclient.kinds()}
    assert {"rope", "alibi", "sinusoidal", "t5_bias"} <= set(kinds)
    assert pclient.ready()


@pytest.mark.parametrize(
    ("call", "error", "error_type"),
    [
        (lambda c: c.rope(-1, 4), InvalidSpecError, "invalid_spec"),
        (lambda c: c.rope(64, 4, rope_type="nope"), InvalidSpecError, "invalid_spec"),
        (lambda c: c.table({"kind": "nope"}), UnknownKindError, "unknown_kind"),
        (lambda c: c.resolve({"model_type": "bert"}), UnsupportedConfigError, "unsupported_config"),
        (lambda c: c.table({"hf_config": blocks.load_config("google__gemma-3-4b-it")}),
         AmbiguousConfigError, "ambiguous_config"),
        (lambda c: c.rope(8192, 1 << 24), TooLargeError, "too_large"),
        (lambda c: c.table_by_key("0" * 64), NotFoundError, "unknown_key"),
        (lambda c: c.preset("no-such-model"), NotFoundError, "unknown_preset"),
    ],
)  # fmt: skip
def test_errors_are_typed(pclient: Client, call: Any, error: type, error_type: str) -> None:
    with pytest.raises(error) as info:
        call(pclient)
    err = info.value
    assert isinstance(err, posenc_client.APIError)
    assert isinstance(err, posenc_client.PosencError)
    assert err.error_type == error_type
    assert err.message
    assert str(err) == err.message
    assert 400 <= err.status < 500


def test_field_problems(pclient: Client) -> None:
    with pytest.raises(InvalidSpecError) as info:
        pclient.rope(64, 8, rope_theta=-5.0)
    (problem,) = info.value.problems
    assert problem.field == "rope_theta"
    assert problem.value == -5.0


def test_disk_cache_revalidates_with_304(server: ServerHandle, cache_dir: Path) -> None:
    recorder = Recorder()
    with Client(server.url, cache=cache_dir, transport=recorder) as client:
        first = client.rope(64, 16, profile="onnx")
        again = client.rope(64, 16, profile="onnx")
        by_key = client.table_by_key(first.key)
    url = recorder.log[1][1]  # the URL the POST's Content-Location handed out: any replica's
    assert recorder.log == [
        ("POST", "/v1/tables", 200),
        ("GET", url, 304),
        ("GET", f"/v1/tables/{first.key}", 304),
    ]
    assert table_url_parts(url) == (first.key, first.spec)
    assert np.array_equal(again["cos"], first["cos"])
    assert by_key.key == first.key
    cache = DiskCache(cache_dir)
    assert cache.keys() == [first.key]
    assert (cache_dir / "tables" / f"{first.key}.safetensors").is_file()
    recorder.log.clear()
    with Client(server.url, cache=cache_dir, transport=recorder, revalidate=False) as client:
        client.rope(64, 16, profile="onnx")
    assert recorder.log == []  # immutable under its key: trusted without asking


def test_progress_callback(server: ServerHandle) -> None:
    seen: list[tuple[int, int | None]] = []
    with Client(
        server.url, cache=False, progress=lambda got, total: seen.append((got, total))
    ) as c:
        tables = c.rope(128, 4096, profile="onnx")
    assert tables.raw is not None
    size = len(tables.raw)
    assert seen[-1] == (size, size)
    assert all(total == size for _, total in seen)


def test_onnx_models_are_cached(server: ServerHandle, cache_dir: Path) -> None:
    spec = {"kind": "alibi", "num_heads": 4, "bias": "causal", "key_length": 4}
    recorder = Recorder()
    with Client(server.url, cache=cache_dir, transport=recorder) as client:
        first = client.onnx(spec, graph="bias", opset=19)
        again = client.onnx(spec, graph="bias", opset=19)
    assert again.data == first.data
    assert recorder.log == [("POST", "/v1/onnx", 200), ("GET", f"/v1/onnx/{first.key}", 304)]
    assert DiskCache(cache_dir).keys("onnx") == [first.key]
    with Client(server.url, cache=cache_dir, offline=True) as client:
        assert client.onnx(spec, graph="bias", opset=19).key == first.key
        with pytest.raises(CacheMissError):
            client.onnx(spec, graph="bias", opset=20)


def test_offline_and_unreachable(server: ServerHandle, cache_dir: Path) -> None:
    with Client(server.url, cache=cache_dir) as client:
        online = client.tables_for_model(LLAMA31, profile="onnx", max_positions=32)["rope"]
        single = client.alibi(6)
    with Client(server.url, cache=cache_dir, offline=True) as client:
        assert client.tables_for_model(LLAMA31, profile="onnx", max_positions=32)["rope"].key == (
            online.key
        )
        assert client.alibi(6).key == single.key
        assert client.table_by_key(single.key).key == single.key
        with pytest.raises(CacheMissError):
            client.alibi(7)
        with pytest.raises(CacheMissError):
            client.presets()
    down = Flaky(failures=1000)  # the same server URL, every connection refused
    with Client(server.url, cache=cache_dir, retries=0, transport=down) as client:
        assert client.alibi(6).key == single.key  # revalidation failed: the cached copy
        assert client.tables_for_model(LLAMA31, profile="onnx", max_positions=32)["rope"].key == (
            online.key
        )
        with pytest.raises(ConnectError):
            client.alibi(7)
        assert not client.ready()


def test_reference_bytes_pass_the_disk_cache(server: ServerHandle, cache_dir: Path) -> None:
    """`device="cpu"` (what verify and plug ask): every table fetched from the server with
    `?device=cpu`, never read from nor written to the disk cache (which holds the server's own
    device's bytes: bit-equal to the reference on a CPU server, within 2 ulps on a GPU one, as
    the H200 run showed); offline it cannot be had."""
    recorder = Recorder()
    with Client(server.url, cache=cache_dir, transport=recorder) as client:
        cached = client.tables_for_model(LLAMA31, profile="onnx", max_positions=24)["rope"]
        held = DiskCache(cache_dir).keys("tables")
        recorder.log.clear()
        recorder.urls.clear()
        for _ in range(2):
            ref = client.tables_for_model(LLAMA31, device="cpu", profile="onnx", max_positions=24)[
                "rope"
            ]
            assert ref.key == cached.key
            for n in cached:  # bit-equal from a CPU server; a GPU's within its 2 ulps
                got, want = torch.from_numpy(cached[n]), torch.from_numpy(ref[n])
                assert served_as_reference(got, want, server.device), n
        gets = [entry for entry in recorder.log if entry[0] == "GET"]
        assert [status for *_, status in gets] == [200, 200], recorder.log
        tables = [url for url in recorder.urls if "/v1/tables/" in url]
        assert len(tables) == 2
        assert all("device=cpu" in url for url in tables), tables
        assert DiskCache(cache_dir).keys("tables") == held
    with (
        Client(server.url, cache=cache_dir, offline=True) as client,
        pytest.raises(CacheMissError),
    ):
        client.table_by_key(cached.key, device="cpu")


def test_posenc_offline_in_the_environment(
    server: ServerHandle, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`POSENC_OFFLINE=1` makes clients (and the CLI) offline unless told otherwise: cached
    tables only; `offline=False` still reaches the server."""
    with Client(server.url, cache=cache_dir) as client:
        held = client.alibi(5)
    monkeypatch.setenv("POSENC_OFFLINE", "1")
    with Client(server.url, cache=cache_dir) as client:
        assert client.offline
        assert client.alibi(5).key == held.key
        with pytest.raises(CacheMissError):
            client.alibi(9)
    with Client(server.url, cache=cache_dir, offline=False) as client:
        assert client.alibi(9).key != held.key
    code = cli_main(["--url", server.url, "--cache-dir", str(cache_dir), "fetch", "alibi",
                     "num_heads=11"])  # fmt: skip
    assert code == 5  # offline cache miss
    monkeypatch.setenv("POSENC_OFFLINE", "no")
    with Client(server.url, cache=cache_dir) as client:
        assert not client.offline


def test_restarted_server_recomputes(cache_dir: Path) -> None:
    """A new server does not know the old bare keys (404 unknown_key): a key call keeps the
    cached copy (a content key never changes meaning); a spec call revalidates at the URL the
    first server handed out, `/v1/tables/{key}.{spec}`, which the new one answers (304: no
    POST), and knows the key from then on."""
    with start_server() as first, Client(first.url, cache=cache_dir) as client:
        t = client.alibi(5)
    recorder = Recorder()
    with start_server() as second:
        # the restarted server answers at the old URL
        recorder.redirect = httpx.URL(second.url)
        with Client(first.url, cache=cache_dir, transport=recorder) as c:
            assert c.table_by_key(t.key).key == t.key
            assert c.alibi(5).key == t.key
            assert c.table_by_key(t.key).key == t.key
    statuses = [(m, s) for m, _, s in recorder.log]
    assert statuses == [("GET", 404), ("GET", 304), ("GET", 304)]
    assert recorder.log[0][1] == recorder.log[2][1] == f"/v1/tables/{t.key}"
    assert table_url_parts(recorder.log[1][1]) == (t.key, t.spec)


def test_a_replica_that_never_saw_the_specs_answers_by_url(
    server: ServerHandle, tmp_path: Path
) -> None:
    """`resolve` on one server, the tables on another that never saw the specs:
    `tables_for_model` fetches by URL (one GET each: no 404, no POST of a spec), and
    `table_by_key` takes the resolved `url` (absolute), revalidating its disk cache at that URL
    (304); the arrays are the first server's."""
    with Client(server.url, cache=False) as first:
        specs = first.resolve(GEMMA3, max_positions=64)
        want = {s.name: first.table_by_key(s.url) for s in specs}
    recorder = Recorder()
    with (
        start_server() as replica,
        Client(replica.url, cache=tmp_path / "a", transport=recorder) as c,
    ):
        got = c.tables_for_model(GEMMA3, max_positions=64)
        by_url = {s.name: c.table_by_key(f"{replica.url}{s.url}") for s in specs}
    n = len(specs)
    assert [(m, s) for m, _, s in recorder.log] == [("POST", 200)] + [("GET", 200)] * n + [
        ("GET", 304)
    ] * n  # the POST: /v1/resolve
    assert recorder.log[0][1] == "/v1/resolve"
    assert [path for _, path, _ in recorder.log[1:]] == [s.url for s in specs] * 2
    for s in specs:
        for name in want[s.name]:
            assert np.array_equal(got[s.name][name], want[s.name][name])
            assert np.array_equal(by_url[s.name][name], want[s.name][name])


def test_corrupt_cache_entry_is_refetched(pclient: Client, cache_dir: Path) -> None:
    t = pclient.alibi(3)
    path = cache_dir / "tables" / f"{t.key}.safetensors"
    path.write_bytes(b"garbage")
    assert pclient.alibi(3).key == t.key
    assert Tables.from_safetensors(path.read_bytes()).key == t.key


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("POSENC_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert posenc_client.default_cache_dir() == tmp_path / "xdg" / "posenc"
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path / "explicit"))
    cache = Client(cache=True).cache
    assert cache is not None
    assert cache.root == tmp_path / "explicit"
    assert Client(cache=False).cache is None


class Flaky(httpx.BaseTransport):
    """Fails the first `failures` requests (a connection error, or a 503 with Retry-After),
    then hands over to a real transport."""

    def __init__(self, failures: int, mode: str = "connect") -> None:
        self.failures = failures
        self.mode = mode
        self.calls = 0
        self.inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.calls <= self.failures:
            if self.mode == "connect":
                raise httpx.ConnectError("refused", request=request)
            body = {"error": "busy", "error_type": "busy", "detail": None}
            return httpx.Response(503, json=body, headers={"Retry-After": "2"})
        return self.inner.handle_request(request)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The retry waits, recorded instead of slept."""
    waits: list[float] = []
    monkeypatch.setattr("posenc_client._client.time.sleep", waits.append)
    return waits


def test_retries_connection_errors_with_backoff(server: ServerHandle, sleeps: list[float]) -> None:
    flaky = Flaky(2)
    retries = Retries(total=3, backoff=0.5, max_backoff=8.0)
    with Client(server.url, cache=False, transport=flaky, retries=retries) as client:
        assert client.alibi(4)["slopes"].shape == (4,)
    assert flaky.calls == 3
    assert sleeps == [0.5, 1.0]
    with (
        Client(server.url, cache=False, transport=Flaky(9), retries=2) as client,
        pytest.raises(ConnectError) as info,
    ):
        client.alibi(4)
    assert isinstance(info.value.__cause__, httpx.ConnectError)


def test_retries_503_honouring_retry_after(server: ServerHandle, sleeps: list[float]) -> None:
    flaky = Flaky(1, mode="busy")
    with Client(server.url, cache=False, transport=flaky) as client:
        assert client.alibi(4).kind == "alibi"
    assert sleeps == [2.0]
    with (
        Client(server.url, cache=False, transport=Flaky(5, "busy"), retries=1) as client,
        pytest.raises(ServiceUnavailableError) as info,
    ):
        client.alibi(4)
    assert info.value.error_type == "busy"
    assert info.value.retry_after == 2.0


def test_api_key_and_base_url_prefix(tmp_path: Path) -> None:
    with start_server(api_keys=["secret-key-123456"]) as locked:
        with Client(locked.url, cache=False) as anonymous, pytest.raises(AuthenticationError):
            anonymous.alibi(4)
        with Client(locked.url, api_key="secret-key-123456", cache=False) as client:
            assert client.alibi(4).kind == "alibi"
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(404, json={"error": "x", "error_type": "not_found", "detail": None})

    transport = httpx.MockTransport(handler)
    with (
        Client("http://proxy/posenc/", api_key="k", transport=transport, cache=False) as client,
        pytest.raises(NotFoundError),
    ):
        client.alibi(4)
    assert seen[0].url.path == "/posenc/v1/tables"
    assert seen[0].headers["authorization"] == "Bearer k"
    assert seen[0].headers["accept-encoding"] == "identity"
    assert json.loads(seen[0].content) == {"kind": "alibi", "num_heads": 4}


def test_async_client(server: ServerHandle, cache_dir: Path) -> None:
    class AsyncFlaky(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self.calls = 0
            self.inner = httpx.AsyncHTTPTransport()

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            self.calls += 1
            if self.calls == 1:
                raise httpx.ConnectError("refused", request=request)
            return await self.inner.handle_async_request(request)

    async def main() -> None:
        transport = AsyncFlaky()
        retries = Retries(backoff=0.001)
        async with AsyncClient(
            server.url, cache=cache_dir, transport=transport, retries=retries
        ) as client:
            rope = await client.rope(64, 8, profile="onnx")
            again = await client.rope(64, 8, profile="onnx")
            assert again.key == rope.key
            found = await client.tables_for_model(LLAMA31, max_positions=8, profile="onnx")
            assert found["rope"]["cos"].shape == (8, 64)
            assert (await client.alibi(4))["slopes"].shape == (4,)
            assert (await client.preset("bloom-560m")).name == "bloom-560m"
            assert len(await client.presets()) >= 15
            assert await client.ready()
            with pytest.raises(InvalidSpecError):
                await client.rope(-1, 1)
        assert transport.calls >= 6

    asyncio.run(main())
