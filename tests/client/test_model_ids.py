"""Hugging Face model ids (`ORG/NAME[@REVISION]`) in `Client.resolve`, `tables_for_model`,
`AsyncClient` and every `posenc-client` command taking `--hf-config`, against the real server and
a local Hugging Face cache of the real configs in tests/data/configs (`tests.hub`): the id
resolves to what its config.json file resolves to; offline (HF_HUB_OFFLINE, POSENC_OFFLINE) the
cache only; the Hub's errors (a loopback stand-in answering as the Hub does) as `ModelIdError`s
and the CLI's exit codes. Nothing reaches the network."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

from posenc_client import (
    APIError,
    AsyncClient,
    CacheMissError,
    Client,
    ModelIdError,
    ModelNotCachedError,
)
from posenc_client._hub import parse_model_id
from posenc_client.cli import main
from tests.client import blocks
from tests.conftest import ServerHandle
from tests.hub import ERRORS, HubEnv, closed_port_url, model_files

CLI = Path(sys.executable).with_name("posenc-client")
LLAMA = "meta-llama/Llama-3.1-8B"
MODELS = model_files()


def _specs(client: Client, config: str | Path) -> list[tuple[str, str]]:
    return [(s.name, s.key) for s in client.resolve(config)]


def test_the_cache_is_huggingface_hubs_layout(hub_env: HubEnv) -> None:
    """huggingface_hub's own scanner reads the cache the tests build: every model, revision and
    file."""
    from huggingface_hub import scan_cache_dir

    info = scan_cache_dir(hub_env.cache.root)
    assert not info.warnings
    found = {repo.repo_id: {rev.commit_hash for rev in repo.revisions} for repo in info.repos}
    assert found == {m: set(revs.values()) for m, revs in hub_env.cache.commits.items()}
    for repo in info.repos:
        for rev in repo.revisions:
            assert [f.file_name for f in rev.files] == ["config.json"]


@pytest.mark.parametrize("model_id", sorted(MODELS))
def test_every_model_id_resolves_as_its_file(
    hub_env: HubEnv, pclient: Client, model_id: str
) -> None:
    """Each real model's id gives the specs (names and content keys) its config.json gives."""
    path = MODELS[model_id]["main"]
    try:
        expected: object = _specs(pclient, path)
    except APIError as err:  # a config the server refuses is refused alike by id
        expected = (type(err), str(err))
    try:
        found: object = _specs(pclient, model_id)
    except APIError as err:
        found = (type(err), str(err))
    assert found == expected


def test_revisions_and_tables_for_model(hub_env: HubEnv, pclient: Client) -> None:
    """`@TAG` and `@COMMIT` pick their snapshot; `tables_for_model` takes ids too."""
    commits = hub_env.cache.commits[LLAMA]
    v5 = _specs(pclient, MODELS[LLAMA]["v5"])
    assert _specs(pclient, f"{LLAMA}@v5") == v5
    assert _specs(pclient, f"{LLAMA}@{commits['v5']}") == v5
    assert _specs(pclient, f"{LLAMA}@main") == _specs(pclient, MODELS[LLAMA]["main"])
    by_id = pclient.tables_for_model(LLAMA, max_positions=64)
    by_file = pclient.tables_for_model(MODELS[LLAMA]["main"], max_positions=64)
    assert {n: t.key for n, t in by_id.items()} == {n: t.key for n, t in by_file.items()}
    assert by_id["rope"]["cos"].shape == (64, 128)  # transformers: (P, head_dim)


def test_async_client(hub_env: HubEnv, server: ServerHandle, tmp_path: Path) -> None:
    async def run() -> tuple[list[str], list[str]]:
        async with AsyncClient(server.url, cache=tmp_path / "cache", retries=0) as client:
            specs = await client.resolve("google/gemma-3-4b-it")
            tables = await client.tables_for_model("meta-llama/Llama-3.2-1B", max_positions=32)
            return [s.key for s in specs], [t.key for t in tables.values()]

    with Client(server.url, cache=tmp_path / "sync", retries=0) as client:
        expected = (
            [s.key for s in client.resolve(MODELS["google/gemma-3-4b-it"]["main"])],
            [
                s.key
                for s in client.resolve(MODELS["meta-llama/Llama-3.2-1B"]["main"], max_positions=32)
            ],
        )
    assert asyncio.run(run()) == expected


def test_not_cached_offline(hub_env: HubEnv, pclient: Client) -> None:
    """HF_HUB_OFFLINE: a model (or revision) the cache lacks is a `ModelNotCachedError` (a
    `CacheMissError`) naming the id and the cache."""
    for model_id in ("acme/not-cached", f"{LLAMA}@no-such-tag"):
        with pytest.raises(ModelNotCachedError) as info:
            pclient.resolve(model_id)
        assert isinstance(info.value, CacheMissError)
        assert info.value.model_id == model_id
        message = str(info.value)
        assert model_id in message
        assert str(hub_env.cache.root) in message
        assert "HF_HUB_OFFLINE" in message


def test_posenc_offline_reads_the_cache_only(
    hub_env: HubEnv, server: ServerHandle, tmp_path: Path
) -> None:
    """An offline client (POSENC_OFFLINE) never asks the Hub, even with huggingface_hub online
    (a stand-in that would refuse every repository): the cached config resolves from the disk
    caches, an uncached one is a `ModelNotCachedError`."""
    hub_env.online(hub_env.fake.url)
    cache = tmp_path / "cache"
    with Client(server.url, cache=cache, retries=0, offline=False) as online:
        expected = _specs(online, MODELS[LLAMA]["main"])
    hub_env.monkeypatch.setenv("POSENC_OFFLINE", "1")
    with Client(server.url, cache=cache, retries=0) as offline:
        assert offline.offline
        assert _specs(offline, LLAMA) == expected
        with pytest.raises(ModelNotCachedError, match="the client is offline"):
            offline.resolve("missing/repository")


def test_online_hub_errors(hub_env: HubEnv, pclient: Client) -> None:
    """Online, the Hub's answers (missing, gated, unknown revision, no config.json) are one-line
    `ModelIdError`s naming the id; a cached revision answers while the Hub refuses connections
    (an uncached one: `test_cli_exit_codes`)."""
    hub_env.online(hub_env.fake.url)
    reasons = {
        "missing/repository": "no such repository",
        "gated/repository": "gated",
        f"{LLAMA}@no-such-branch": "no revision 'no-such-branch'",
        "no/config-json": "no config.json",
    }
    assert set(reasons) == set(ERRORS)
    for model_id, reason in reasons.items():
        with pytest.raises(ModelIdError) as info:
            pclient.resolve(model_id)
        assert type(info.value) is ModelIdError
        assert reason in str(info.value)
        assert model_id in str(info.value)
        assert "\n" not in str(info.value)
    hub_env.online(closed_port_url())  # refused: the cache, at once (`_hub.hub_refuses`)
    assert _specs(pclient, LLAMA) == _specs(pclient, MODELS[LLAMA]["main"])


def test_a_local_folder_wins(
    hub_env: HubEnv, pclient: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder named like the id, holding a config.json, is read instead of the Hub's (as
    transformers' from_pretrained prefers an existing local directory)."""
    folder = tmp_path / "work" / LLAMA
    folder.mkdir(parents=True)
    bloom = MODELS["bigscience/bloom-560m"]["main"]
    (folder / "config.json").write_bytes(bloom.read_bytes())
    monkeypatch.chdir(tmp_path / "work")
    assert _specs(pclient, LLAMA) == _specs(pclient, bloom)


def test_without_huggingface_hub(
    hub_env: HubEnv, pclient: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ModelIdError, match=r"pip install 'posenc-client\[hub\]'"):
        pclient.resolve(LLAMA)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("meta-llama/Llama-3.1-8B", ("meta-llama/Llama-3.1-8B", None)),
        ("Qwen/Qwen2.5-7B@main", ("Qwen/Qwen2.5-7B", "main")),
        ("org/name@refs/pr/1", ("org/name", "refs/pr/1")),
        ("org/name@" + "a" * 40, ("org/name", "a" * 40)),
        ("config.json", None),
        ("./org/name", None),
        ("/abs/path", None),
        ("a/b/c", None),
        ("org/na--me", None),
        ("org/na..me", None),
        ("org/name@", None),
        ("org/name@rev with space", None),
    ],
)
def test_model_id_syntax(text: str, parsed: tuple[str, str | None] | None) -> None:
    """The client's and the server's parsers (posenc.api.hub) agree."""
    from posenc.api.errors import ApiError
    from posenc.api.hub import parse_model_id as server_parse

    found = parse_model_id(text)
    assert (None if found is None else (found.repo_id, found.revision)) == parsed
    if parsed is None:
        with pytest.raises(ApiError):
            server_parse(text)
    else:
        assert server_parse(text) == parsed


# the CLI, through its entry point ------------------------------------------------------------


def _cli(server: ServerHandle, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [str(CLI), "--url", server.url, "--cache-dir", str(tmp_path / "cache"), *args],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ),
        timeout=120,
    )
    return done.returncode, done.stdout, done.stderr


def test_cli_resolve_and_fetch(hub_env: HubEnv, server: ServerHandle, tmp_path: Path) -> None:
    code, out, err = _cli(server, tmp_path, "resolve", f"{LLAMA}@v5")
    assert code == 0, err
    by_file = main_json(server, tmp_path, "resolve", str(MODELS[LLAMA]["v5"]))
    assert json.loads(out) == by_file
    code, out, err = _cli(
        server, tmp_path, "fetch", "--hf-config", LLAMA, "max_positions=16", "-o",
        str(tmp_path / "rope.safetensors"),
    )  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "rope.safetensors").stat().st_size > 0
    code, out, err = _cli(server, tmp_path, "onnx", "--hf-config", LLAMA, "--graph", "cos_sin",
                          "max_positions=16", "-o", str(tmp_path / "c.onnx"))  # fmt: skip
    assert code == 0, err


def main_json(server: ServerHandle, tmp_path: Path, *args: str) -> object:
    code, out, err = _cli(server, tmp_path, *args)
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("command", ["fetch", "onnx", "plug", "verify"])
def test_every_hf_config_command_takes_ids(
    hub_env: HubEnv, server: ServerHandle, tmp_path: Path, command: str
) -> None:
    """Every command with --hf-config reads an id (an uncached one: exit 5 naming the id), and
    its --help says so."""
    model = tmp_path / "gqa.onnx"
    onnx.save(blocks.gqa_block(128, 4, 2), model)
    extra = {
        "fetch": [],
        "onnx": ["--graph", "cos_sin"],
        "plug": [str(model), "-o", str(tmp_path / "out.onnx")],
        "verify": [str(model)],
    }
    code, _, err = _cli(server, tmp_path, command, *extra[command], "--hf-config", "acme/none")
    assert code == 5, err
    assert "model acme/none: no config.json in the Hugging Face cache" in err
    done = subprocess.run([str(CLI), command, "--help"], capture_output=True, text=True)
    assert "ORG/NAME[@REVISION]" in " ".join(done.stdout.split())


def test_cli_plug_and_verify(hub_env: HubEnv, server: ServerHandle, tmp_path: Path) -> None:
    """plug by id writes the caches plug by file writes; verify by id finds them exact."""
    model = tmp_path / "gqa.onnx"
    onnx.save(blocks.gqa_block(128, 4, 2), model)
    caches = []
    out = tmp_path / "patched.onnx"
    for config in (LLAMA, str(MODELS[LLAMA]["main"])):
        code, _, err = _cli(server, tmp_path, "plug", str(model), "--hf-config", config,
                            "--max-positions", "64", "-o", str(out))  # fmt: skip
        assert code == 0, err
        inits = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(out).graph.initializer}
        caches.append((inits["cos"], inits["sin"]))
    assert all(np.array_equal(a, b) for a, b in zip(caches[0], caches[1], strict=True))
    code, _, err = _cli(server, tmp_path, "verify", str(out), "--hf-config", LLAMA)
    assert code == 0, err


def test_cli_exit_codes(hub_env: HubEnv, server: ServerHandle, tmp_path: Path) -> None:
    """Offline and uncached: 5; online, the Hub refusing the id: 2 (like an unreadable config
    file); the Hub unreachable: 4 (`HubUnreachableError`, at once where the connection is
    refused, naming the refusal); each a one-line message naming the id."""
    code, _, err = _cli(server, tmp_path, "resolve", "acme/not-cached")
    assert (code, err.count("\n")) == (5, 1)
    assert "acme/not-cached" in err
    hub_env.online(hub_env.fake.url)
    code, _, err = _cli(server, tmp_path, "resolve", "gated/repository")
    assert (code, err.count("\n")) == (2, 1)
    assert "model gated/repository: is gated" in err
    hub_env.online(closed_port_url())
    code, _, err = _cli(server, tmp_path, "resolve", "acme/not-cached")
    assert code == 4
    assert err.splitlines()[-1].startswith(
        "posenc-client: model acme/not-cached: the Hub cannot be reached and the cache "
    )
    assert err.splitlines()[-1].endswith(" refused)")
    code, _, err = _cli(server, tmp_path, "--offline", "resolve", "acme/not-cached")
    assert code == 5
    assert "the client is offline" in err


def test_cli_in_process_offline_flag(hub_env: HubEnv, server: ServerHandle, tmp_path: Path) -> None:
    """`--offline` with a never-resolved id: the HF cache has it, the resolve record does not
    (exit 5, the posenc cache's message)."""
    code = main(["--url", server.url, "--cache-dir", str(tmp_path / "c"), "--offline",
                 "resolve", LLAMA])  # fmt: skip
    assert code == 5
