"""The local disk cache: served files by content key, and which key each request resolved to.

Layout under the root (default `$POSENC_CACHE_DIR`, else `$XDG_CACHE_HOME/posenc`, else
`~/.cache/posenc`):

    tables/<key>.safetensors     a table exactly as the server sent it (metadata included)
    tables/<key>.digest          its digest: the server's `Repr-Digest` (RFC 9530,
                                 `sha-256=:<base64>:`), checked against the body on arrival
    onnx/<key>.onnx              an exported subgraph (and `onnx/<key>.digest`)
    requests/<sha256>.json       what a request (server + route + canonical JSON body; the
                                 server as `server_identity` spells it) resolved to:
                                 {"ns", "key"} for tables and models, {"ns": "resolve",
                                 "specs"} for resolve, so that a spec call can revalidate, or
                                 work offline, without the server

Keys are content addresses (sha256 of the canonical spec and the algorithm version): a file never
changes under its key, so the cache needs no expiry. Entries are revalidated with
`If-None-Match: "<key>"` (a 304 costs a few hundred bytes) and used as they are when the server
cannot be reached. Writes go to a temporary file and are renamed into place, so concurrent
processes never read half a file. Only 64-hex-digit keys are stored (the names come from the
network).

Integrity: every read checks the file against its stored digest (`load`); a file that does not
match (a flipped bit, bytes appended or cut) or has no digest raises `CorruptEntryError` naming
the file, which the client answers by fetching the entry again (offline: an error naming the
file). `verify` checks every entry, `clear` deletes them all (`posenc-client cache verify|clear`).

Size cap (`max_bytes`, default `$POSENC_CACHE_MAX_BYTES`: `4GiB`, `512MiB`, `1.5GB` or bytes;
none when unset): after each write the least recently used entries (a file and its digest) are
deleted until the tables and models together fit, never the entry just written (an entry being
written is a temporary file, which pruning never touches). Last use is the data file's mtime,
set on every read that checks it (`load`), so it does not depend on atime or the mount's
`noatime`. A reader whose entry another process prunes meanwhile sees a miss (the data file is
deleted before its digest, and a missing digest with a missing file is a miss, not corruption).
Request records pointing at a pruned entry are deleted with it. `entries` lists what is cached
(`posenc-client cache ls`), `prune` applies a cap on demand (`posenc-client cache prune`).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import re
import zlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

from posenc_client._formats import TEMP_SUFFIX, Buffer, write_atomic

KEY_RE = re.compile(r"^[0-9a-f]{64}$")
SUFFIXES = {"tables": ".safetensors", "onnx": ".onnx"}
DIGEST_SUFFIX = ".digest"
_SHA256_MEMBER = re.compile(r"(?:^|,)\s*sha-256\s*=\s*:([A-Za-z0-9+/=]+):\s*(?:;[^,]*)?(?=,|$)")


def repr_digest(data: Buffer) -> str:
    """The RFC 9530 `Repr-Digest` value of `data`: `sha-256=:<base64 of its sha256>:`."""
    return f"sha-256=:{base64.b64encode(hashlib.sha256(data).digest()).decode()}:"


def sha256_of(header: str | None) -> bytes | None:
    """The sha-256 member of a `Repr-Digest` field value (a structured-field dictionary; other
    algorithms are ignored), or None when there is none or it is malformed."""
    match = _SHA256_MEMBER.search(header or "")
    if match is None:
        return None
    try:
        digest = base64.b64decode(match.group(1), validate=True)
    except (binascii.Error, ValueError):
        return None
    return digest if len(digest) == 32 else None


def digest_matches(header: str | None, data: Buffer) -> bool:
    """True when `header` holds a sha-256 digest equal to `data`'s."""
    expected = sha256_of(header)
    return expected is not None and hashlib.sha256(data).digest() == expected


class CorruptEntryError(Exception):
    """A cached file that does not match its stored digest (or has none): `.path` names it."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class EntryCheck:
    """The outcome of checking one cached file: `problem` is None when it matches its digest."""

    ns: str
    key: str
    path: Path
    problem: str | None


_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str) -> int:
    """A byte count: an int as is, or `<number>[unit]` as people write it (`4GiB`, `512MiB`,
    `1.5GB`, `1048576`, `100B`; case-insensitive; binary `KiB`..`TiB`, decimal `kB`..`TB`), the
    server's rule (`posenc serve --cache-bytes`). A bare `k`/`m`/`g` is refused (Docker reads
    `512m` as MiB, others as MB), as are a fraction of a byte and a negative size: ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"a byte size is an int or a string such as 4GiB, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a byte size cannot be negative, got {value}")
        return value
    match = _SIZE_RE.match(value)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"a byte size such as 4GiB, 512MiB, 1.5GB or 1048576 is expected, got {value!r}"
        )
    size = Decimal(match.group(1)) * _UNITS[unit]
    if size != size.to_integral_value():
        raise ValueError(f"{value!r} is not a whole number of bytes")
    return int(size)


def default_max_bytes() -> int | None:
    """`$POSENC_CACHE_MAX_BYTES` as a byte count (`parse_size`), or None when unset or empty."""
    text = os.environ.get("POSENC_CACHE_MAX_BYTES", "").strip()
    if not text:
        return None
    try:
        return parse_size(text)
    except ValueError as err:
        raise ValueError(f"POSENC_CACHE_MAX_BYTES: {err}") from None


@dataclass(frozen=True)
class CacheEntry:
    """One cached table or model: `size` counts the file and its digest, `last_used` (seconds
    since the epoch) is the file's mtime, set when it was written or last read."""

    ns: str
    key: str
    path: Path
    size: int
    last_used: float


def default_cache_dir() -> Path:
    """`$POSENC_CACHE_DIR`, else `$XDG_CACHE_HOME/posenc`, else `~/.cache/posenc`."""
    explicit = os.environ.get("POSENC_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "posenc"


DEFAULT_PORTS = {"http": 80, "https": 443}


def server_identity(base_url: str) -> str:
    """The server as the request index names it, whatever the URL's spelling:
    `scheme://host[:port][/path]` with the scheme and host in lower case (an international name
    as IDNA), `http://` added to a bare `host:port` (tritonclient's spelling), the scheme's
    default port (80, 443) dropped, user info, query and fragment dropped, and no trailing
    slash. `http://127.0.0.1:8000`, `127.0.0.1:8000`, `HTTP://127.0.0.1:8000/` are one server.
    Host names are not resolved: `localhost` and `127.0.0.1` are two servers (a name may point
    elsewhere tomorrow, and offline there is nothing to ask), as are two names of one host and
    two path prefixes. A URL httpx cannot parse is kept as written, less a trailing slash."""
    url = base_url.strip()
    if "://" not in url:
        url = "http://" + url
    try:
        parsed = httpx.URL(url)
        scheme = parsed.scheme.lower()
        host = parsed.raw_host.decode("ascii").lower()
        port = parsed.port
    except (httpx.InvalidURL, UnicodeDecodeError, ValueError):
        return url.rstrip("/")
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    if port is not None and port != DEFAULT_PORTS.get(scheme):
        host = f"{host}:{port}"
    path = parsed.raw_path.partition(b"?")[0].decode("ascii").rstrip("/")
    return f"{scheme}://{host}{path}"


def request_id(base_url: str, route: str, body: Mapping[str, Any]) -> str:
    """sha256 of the server (`server_identity`: one server however its URL is spelt), the route
    and the body as canonical JSON (sorted keys).

    Raises ValueError for bodies JSON cannot carry (NaN, infinities, non-JSON types)."""
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"the request cannot be sent as JSON (NaN and infinities included): {err}"
        ) from None
    server = server_identity(base_url)
    return hashlib.sha256(f"{server}\n{route}\n{text}".encode()).hexdigest()


SHOWN_CONFIG_KEYS = ("model_type", "_name_or_path")


def request_summary(base_url: str, route: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """What a request asked for, stored with its record for `posenc-client cache ls`: the
    server (`server_identity`), the route and the body, a config in it shortened to its
    `model_type` and `_name_or_path` (the whole config is in the request's id)."""

    def short(body: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(body)
        config = out.get("hf_config")
        if isinstance(config, Mapping):
            out["hf_config"] = {k: config[k] for k in SHOWN_CONFIG_KEYS if k in config}
        return out

    shown = short(body)
    if isinstance(shown.get("spec"), Mapping):  # POST /v1/onnx: {"spec": <spec object>, ...}
        shown["spec"] = short(shown["spec"])
    return {"server": server_identity(base_url), "route": route, "body": shown}


def valid_key(key: str | None) -> bool:
    """True for a 64-hex-digit content key."""
    return bool(key) and KEY_RE.match(str(key)) is not None


TABLE_URL_RE = re.compile(r"(?:^|/v1/tables/)([0-9a-f]{64})(?:\.([A-Za-z0-9_-]+))?(?:[?#].*)?$")
"""A table reference: a content key, `{key}.{spec}`, or a URL or path ending in
`/v1/tables/{key}[.{spec}]`."""


def table_path(key: str, spec: Mapping[str, Any] | None = None) -> str:
    """The path of table `key`: `/v1/tables/{key}.{spec}` when its spec is known, the form the
    server hands out and any replica answers (the spec as base64url, unpadded, of its deflated
    JSON with sorted keys; the server checks that the spec's content key is `key`), else the
    bare `/v1/tables/{key}`, which only a server that resolved the key answers."""
    if spec is None:
        return f"/v1/tables/{key}"
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"), allow_nan=False)
    token = base64.urlsafe_b64encode(zlib.compress(text.encode(), 9)).rstrip(b"=").decode()
    return f"/v1/tables/{key}.{token}"


def split_table_ref(ref: str) -> tuple[str, str | None]:
    """(content key, path) of a table reference (`TABLE_URL_RE`); the path is None for a bare
    key. Raises ValueError for anything else."""
    found = TABLE_URL_RE.search(ref.strip())
    if found is None:
        raise ValueError(
            f"not a content key (64 hex digits) or a table URL (/v1/tables/KEY.SPEC): {ref!r}"
        )
    key, token = found.group(1), found.group(2)
    return key, (f"/v1/tables/{key}.{token}" if token else None)


class DiskCache:
    """Files by (namespace, content key) and request ids -> keys, under `root`."""

    def __init__(
        self, root: str | os.PathLike[str] | None = None, max_bytes: int | str | None = None
    ) -> None:
        """`root`: the folder (default `default_cache_dir()`); `max_bytes`: the size cap, an
        int or `4GiB` (default `$POSENC_CACHE_MAX_BYTES`; none when that is unset)."""
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.max_bytes = parse_size(max_bytes) if max_bytes is not None else default_max_bytes()

    def __repr__(self) -> str:
        cap = "" if self.max_bytes is None else f", max_bytes={self.max_bytes}"
        return f"DiskCache({str(self.root)!r}{cap})"

    def path(self, ns: str, key: str) -> Path:
        """Where the file of `key` in namespace `ns` (`tables`, `onnx`) lives."""
        if not valid_key(key):
            raise ValueError(f"not a content key: {key!r}")
        return self.root / ns / f"{key}{SUFFIXES[ns]}"

    def digest_path(self, ns: str, key: str) -> Path:
        """Where the stored digest of `key` in namespace `ns` lives."""
        return self.path(ns, key).with_suffix(DIGEST_SUFFIX)

    def load(self, ns: str, key: str, use: bool = True) -> bytearray | None:
        """The stored bytes of `key` (a writable buffer), checked against their stored digest;
        None when not stored. Raises `CorruptEntryError` naming the file when they differ or the
        digest is missing or unreadable. A `use` (not a check: `verify`) is recorded (`touch`)."""
        if not valid_key(key):
            return None
        path = self.path(ns, key)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                data = bytearray(size)
                f.readinto(data)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            stored = self.digest_path(ns, key).read_text(encoding="ascii")
        except FileNotFoundError:
            if not path.exists():  # pruned by another process as it was read: a miss
                return None
            raise CorruptEntryError(path, "no stored digest to check it against") from None
        except UnicodeDecodeError:
            raise CorruptEntryError(path, "no stored digest to check it against") from None
        if sha256_of(stored) is None:
            raise CorruptEntryError(path, "its stored digest is unreadable")
        if not digest_matches(stored, data):
            raise CorruptEntryError(path, f"its {size} bytes do not match the stored digest")
        if use:
            self.touch(ns, key)
        return data

    def touch(self, ns: str, key: str) -> None:
        """Record a use of `key` now (its file's mtime, what LRU pruning orders by); a cache
        that cannot be written is left as it is."""
        with contextlib.suppress(OSError):
            os.utime(self.path(ns, key))

    def has(self, ns: str, key: str) -> bool:
        return valid_key(key) and self.path(ns, key).is_file()

    def store(self, ns: str, key: str, data: Buffer, digest: str | None = None) -> None:
        """Store `data` under `key` with its digest (atomically). `digest` is a `Repr-Digest`
        value the caller has checked against `data` (`checked_digest`); computed when None.
        Invalid keys are ignored."""
        if not valid_key(key):
            return
        if digest is None or sha256_of(digest) is None:
            digest = repr_digest(data)
        # the digest first: a reader that sees the new file also sees its digest
        write_atomic(self.digest_path(ns, key), digest.encode("ascii"))
        write_atomic(self.path(ns, key), data)
        if self.max_bytes is not None:
            self.prune(keep=[(ns, key)])

    def discard(self, ns: str, key: str) -> None:
        """Delete the file of `key` and its digest, if present (the file first: see `load`)."""
        for path in (self.path(ns, key), self.digest_path(ns, key)):
            path.unlink(missing_ok=True)

    def verify(self) -> list[EntryCheck]:
        """Check every stored file against its digest, tables then ONNX models."""
        checks = []
        for ns in SUFFIXES:
            for key in self.keys(ns):
                try:
                    self.load(ns, key, use=False)  # a check is not a use
                    problem = None
                except CorruptEntryError as err:
                    problem = err.reason
                checks.append(EntryCheck(ns, key, self.path(ns, key), problem))
        return checks

    def stale_temp_files(self) -> list[Path]:
        """Temporary files a writer killed mid-write left behind (`write_atomic`'s
        `.<name>.<random>.tmp`), sorted: `cache verify` reports them, `cache clear` deletes
        them."""
        found: list[Path] = []
        for ns in (*SUFFIXES, "requests"):
            folder = self.root / ns
            if folder.is_dir():
                found.extend(
                    p for p in folder.iterdir() if p.name.endswith(TEMP_SUFFIX) and p.is_file()
                )
        return sorted(found)

    def entries(self) -> list[CacheEntry]:
        """Every cached table and model with its size and last use, most recently used first."""
        found = []
        for ns in SUFFIXES:
            for key in self.keys(ns):
                path = self.path(ns, key)
                try:
                    stat = path.stat()
                except FileNotFoundError:  # pruned meanwhile
                    continue
                try:
                    digest = self.digest_path(ns, key).stat().st_size
                except FileNotFoundError:
                    digest = 0
                found.append(CacheEntry(ns, key, path, stat.st_size + digest, stat.st_mtime))
        return sorted(found, key=lambda e: (-e.last_used, e.ns, e.key))

    def prune(
        self, max_bytes: int | str | None = None, keep: Collection[tuple[str, str]] = ()
    ) -> list[CacheEntry]:
        """Delete the least recently used entries until the tables and models take at most
        `max_bytes` (default `self.max_bytes`; nothing is deleted without a cap), never one in
        `keep` (`(ns, key)` pairs: the entry just written) nor a temporary file being written;
        the request records pointing at a deleted entry go with it. Returns what was deleted,
        least recently used first. Safe beside other processes reading, writing and pruning."""
        cap = parse_size(max_bytes) if max_bytes is not None else self.max_bytes
        if cap is None:
            return []
        entries = self.entries()
        total = sum(e.size for e in entries)
        removed: list[CacheEntry] = []
        for entry in reversed(entries):  # least recently used first
            if total <= cap:
                break
            if (entry.ns, entry.key) in keep:
                continue
            try:  # read or written again since it was listed (another process): kept
                if entry.path.stat().st_mtime != entry.last_used:
                    continue
            except FileNotFoundError:  # pruned by another process meanwhile
                total -= entry.size
                continue
            self.discard(entry.ns, entry.key)
            removed.append(entry)
            total -= entry.size
        if removed:
            self._forget({(e.ns, e.key) for e in removed})
        return removed

    def _forget(self, gone: set[tuple[str, str]]) -> None:
        """Delete the request records `{"ns", "key"}` pointing at `gone` entries (resolve
        records, which name keys without holding tables, stay)."""
        for rid, record in self.records():
            if (record.get("ns"), record.get("key")) in gone:
                (self.root / "requests" / f"{rid}.json").unlink(missing_ok=True)

    def records(self) -> Iterable[tuple[str, dict[str, Any]]]:
        """Every request record: (request id, record), in name order."""
        folder = self.root / "requests"
        if not folder.is_dir():
            return []
        out = []
        for path in sorted(folder.glob("*.json")):
            record = self.lookup(path.name.removesuffix(".json"))
            if record is not None:
                out.append((path.name.removesuffix(".json"), record))
        return out

    def lookup(self, rid: str) -> dict[str, Any] | None:
        """The record of what request `rid` resolved to (`{"ns", "key"}` or `{"ns", "specs"}`),
        or None."""
        try:
            record = json.loads((self.root / "requests" / f"{rid}.json").read_text())
        except (OSError, ValueError):  # absent, or a cache folder that cannot be read
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

    def clear(self) -> int:
        """Delete every cached file, digest and request record (the folders stay); returns how
        many files were deleted."""
        count = 0
        for ns in (*SUFFIXES, "requests"):
            folder = self.root / ns
            if folder.is_dir():
                for p in folder.iterdir():
                    if p.is_file():
                        p.unlink()
                        count += 1
        return count
