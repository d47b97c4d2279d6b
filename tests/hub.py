"""A local Hugging Face cache of real config.json files, and a stand-in for the Hub on loopback:
model ids tested without the network.

`build_cache` writes huggingface_hub's documented cache layout (its "Understand caching" guide,
`huggingface_hub/file_download.py`): `models--ORG--NAME/blobs/<git blob sha1>`,
`snapshots/<commit>/config.json` (a relative symlink to the blob) and `refs/<branch or tag>`
holding the commit, for every `tests/data/configs/ORG__NAME.json` (downloaded from the Hub, see
tests/data/configs); a `ORG__NAME__TAG.json` beside it becomes a second commit under the tag
`TAG`. `huggingface_hub.scan_cache_dir` reads the result (tests/client/test_model_ids.py).

`FakeHub` answers the Hub's `HEAD /{repo}/resolve/{revision}/config.json` with the status and
`X-Error-Code` the Hub sends for a missing repository, a gated one, a missing revision or file
(`huggingface_hub.utils._http.hf_raise_for_status` reads them): the library's own error mapping,
against which posenc's is tested. `hub_environment` (the `hub_env` fixture of tests/client and
tests/ui) points huggingface_hub at both (its module constants, read when it was imported, and
the environment, for subprocesses), offline unless asked.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

CONFIGS = Path(__file__).resolve().parent / "data" / "configs"
NAME = re.compile(r"(?P<org>[^_]+(?:_[^_]+)*?)__(?P<name>[^_].*?)(?:__(?P<tag>[a-z0-9]+))?")


def model_files() -> dict[str, dict[str, Path]]:
    """Model id -> {revision ("main" or a tag): its config.json in tests/data/configs}."""
    out: dict[str, dict[str, Path]] = {}
    for path in sorted(CONFIGS.glob("*.json")):
        found = NAME.fullmatch(path.stem)
        if found is None or found["org"] == "synthetic":
            continue
        model_id = f"{found['org']}/{found['name']}"
        out.setdefault(model_id, {})[found["tag"] or "main"] = path
    return out


def _sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


@dataclass
class HubCache:
    """The cache folder and, per model id and revision, the commit written."""

    root: Path
    commits: dict[str, dict[str, str]] = field(default_factory=dict)


def build_cache(root: Path) -> HubCache:
    """Every model of `model_files()` in huggingface_hub's cache layout under `root`."""
    cache = HubCache(root)
    for model_id, revisions in model_files().items():
        org, name = model_id.split("/")
        repo = root / f"models--{org}--{name}"
        for revision, path in revisions.items():
            data = path.read_bytes()
            blob = _sha1(b"blob %d\0" % len(data) + data)  # the git blob id: the Hub's ETag
            commit = _sha1(f"{model_id}@{revision}".encode())
            (repo / "blobs").mkdir(parents=True, exist_ok=True)
            (repo / "blobs" / blob).write_bytes(data)
            snapshot = repo / "snapshots" / commit
            snapshot.mkdir(parents=True)
            (snapshot / "config.json").symlink_to(Path("../../blobs") / blob)
            (repo / "refs").mkdir(exist_ok=True)
            (repo / "refs" / revision).write_text(commit)
            cache.commits.setdefault(model_id, {})[revision] = commit
    return cache


ERRORS = {
    "missing/repository": (401, "RepoNotFound"),
    "gated/repository": (403, "GatedRepo"),
    "meta-llama/Llama-3.1-8B@no-such-branch": (404, "RevisionNotFound"),
    "no/config-json": (404, "EntryNotFound"),
}
"""Repository (or repository@revision) -> the Hub's answer for it (status, X-Error-Code)."""


class _Handler(BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:
        found = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/config\.json", self.path)
        repo, revision = (found[1], found[2]) if found else ("", "")
        status, code = ERRORS.get(f"{repo}@{revision}") or ERRORS.get(repo) or (404, "RepoNotFound")
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD  # noqa: N815 (http.server's name)

    def log_message(self, format: str, *args: object) -> None:
        pass


class FakeHub:
    """The Hub's error answers on 127.0.0.1 (`url`), in a thread."""

    def __init__(self) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@dataclass
class HubEnv:
    """What `hub_env` set up: the cache, the stand-in Hub and `online(endpoint)`."""

    cache: HubCache
    fake: FakeHub
    monkeypatch: pytest.MonkeyPatch

    def online(self, endpoint: str) -> None:
        """huggingface_hub online, its Hub at `endpoint` (a loopback URL: the network is never
        reached)."""
        from huggingface_hub import constants

        mp = self.monkeypatch
        mp.setattr(constants, "HF_HUB_OFFLINE", False)
        mp.setattr(constants, "ENDPOINT", endpoint)
        template = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
        mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        mp.setenv("HF_HUB_OFFLINE", "0")
        mp.setenv("HF_ENDPOINT", endpoint)


def closed_port_url() -> str:
    """A loopback URL nothing listens on (connections refused)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def hub_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubEnv]:
    """huggingface_hub offline on a fresh local cache of the real configs (constants for this
    process, environment variables for subprocesses), its endpoint a closed loopback port."""
    from huggingface_hub import constants

    cache = build_cache(tmp_path / "hf-hub")
    endpoint = closed_port_url()
    mp = monkeypatch
    mp.setattr(constants, "HF_HUB_CACHE", str(cache.root))
    mp.setattr(constants, "HF_HUB_OFFLINE", True)
    mp.setattr(constants, "ENDPOINT", endpoint)
    mp.setattr(
        constants,
        "HUGGINGFACE_CO_URL_TEMPLATE",
        endpoint + "/{repo_id}/resolve/{revision}/{filename}",
    )
    mp.setenv("HF_HUB_CACHE", str(cache.root))
    mp.setenv("HF_HOME", str(tmp_path / "hf-home"))
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("HF_ENDPOINT", endpoint)
    mp.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    mp.delenv("HF_TOKEN", raising=False)
    mp.delenv("POSENC_OFFLINE", raising=False)
    fake = FakeHub()
    try:
        yield HubEnv(cache, fake, monkeypatch)
    finally:
        fake.close()
