"""The local disk cache: served files by content key, and which key each request resolved to.

Layout under the root (default `$POSENC_CACHE_DIR`, else `$XDG_CACHE_HOME/posenc`, else
`~/.cache/posenc`):

    tables/<key>.safetensors     a table exactly as the server sent it (metadata included)
    onnx/<key>.onnx              an exported subgraph
    requests/<sha256>.json       what a request (server URL + route + canonical JSON body)
                                 resolved to: {"ns", "key"} for tables and models, {"ns":
                                 "resolve", "specs"} for resolve, so that a spec call can
                                 revalidate, or work offline, without the server

Keys are content addresses (sha256 of the canonical spec and the algorithm version): a file never
changes under its key, so the cache needs no expiry. Entries are revalidated with
`If-None-Match: "<key>"` (a 304 costs a few hundred bytes) and used as they are when the server
cannot be reached. Writes go to a temporary file and are renamed into place, so concurrent
processes never read half a file. Only 64-hex-digit keys are stored (the names come from the
network).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from posenc_client._formats import Buffer, write_atomic

KEY_RE = re.compile(r"^[0-9a-f]{64}$")
SUFFIXES = {"tables": ".safetensors", "onnx": ".onnx"}


def default_cache_dir() -> Path:
    """`$POSENC_CACHE_DIR`, else `$XDG_CACHE_HOME/posenc`, else `~/.cache/posenc`."""
    explicit = os.environ.get("POSENC_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "posenc"


def request_id(base_url: str, route: str, body: Mapping[str, Any]) -> str:
    """sha256 of the server URL, the route and the body as canonical JSON (sorted keys).

    Raises ValueError for bodies JSON cannot carry (NaN, infinities, non-JSON types)."""
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"the request cannot be sent as JSON (NaN and infinities included): {err}"
        ) from None
    return hashlib.sha256(f"{base_url.rstrip('/')}\n{route}\n{text}".encode()).hexdigest()


def valid_key(key: str | None) -> bool:
    """True for a 64-hex-digit content key."""
    return bool(key) and KEY_RE.match(str(key)) is not None


class DiskCache:
    """Files by (namespace, content key) and request ids -> keys, under `root`."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()

    def __repr__(self) -> str:
        return f"DiskCache({str(self.root)!r})"

    def path(self, ns: str, key: str) -> Path:
        """Where the file of `key` in namespace `ns` (`tables`, `onnx`) lives."""
        if not valid_key(key):
            raise ValueError(f"not a content key: {key!r}")
        return self.root / ns / f"{key}{SUFFIXES[ns]}"

    def load(self, ns: str, key: str) -> bytearray | None:
        """The stored bytes of `key` (a writable buffer), or None."""
        if not valid_key(key):
            return None
        try:
            with open(self.path(ns, key), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                data = bytearray(size)
                f.readinto(data)
                return data
        except FileNotFoundError:
            return None

    def has(self, ns: str, key: str) -> bool:
        return valid_key(key) and self.path(ns, key).is_file()

    def store(self, ns: str, key: str, data: Buffer) -> None:
        """Store `data` under `key` (atomically); invalid keys are ignored."""
        if valid_key(key):
            write_atomic(self.path(ns, key), data)

    def lookup(self, rid: str) -> dict[str, Any] | None:
        """The record of what request `rid` resolved to (`{"ns", "key"}` or `{"ns", "specs"}`),
        or None."""
        try:
            record = json.loads((self.root / "requests" / f"{rid}.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
        if not isinstance(record, dict) or record.get("ns") not in (*SUFFIXES, "resolve"):
            return None
        if "key" in record and not valid_key(record["key"]):
            return None
        return record

    def remember(self, rid: str, record: Mapping[str, Any]) -> None:
        """Record what request `rid` resolved to."""
        payload = json.dumps(dict(record), separators=(",", ":")).encode()
        write_atomic(self.root / "requests" / f"{rid}.json", payload)

    def keys(self, ns: str = "tables") -> list[str]:
        """Every key stored in `ns`, sorted."""
        folder = self.root / ns
        if not folder.is_dir():
            return []
        suffix = SUFFIXES[ns]
        return sorted(
            p.name.removesuffix(suffix)
            for p in folder.iterdir()
            if p.name.endswith(suffix) and valid_key(p.name.removesuffix(suffix))
        )

    def clear(self) -> None:
        """Delete every cached file and request record (the folders stay)."""
        for ns in (*SUFFIXES, "requests"):
            folder = self.root / ns
            if folder.is_dir():
                for p in folder.iterdir():
                    if p.is_file():
                        p.unlink()
