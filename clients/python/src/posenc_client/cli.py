"""`posenc-client`: fetch tables and subgraphs from a posenc server and plug them into models.

Commands (each has --help):

    fetch   [KIND] [FIELD=VALUE ...] | --spec JSON|@FILE | --hf-config config.json | --key KEY
            | --preset NAME[/PART] [--layer-type PART]
            -> .safetensors / .npz / .npy (-o), or a JSON summary on stdout
    resolve config.json|ORG/NAME[@REV] [FIELD=VALUE ...]   the tables a model needs, as JSON
    presets [NAME]                                 curated released models
    kinds                                          families and their required fields
    onnx    [KIND] [FIELD=VALUE ...] | --spec JSON|@FILE | --hf-config config.json  --graph G
            [--opset N] -o out.onnx
    plug    model.onnx --hf-config config.json -o patched.onnx [--force]
    plug    model.gguf --hf-config config.json -o fixed.gguf   (llama.cpp: docs/gguf.md)
    verify  model.onnx --hf-config config.json      how far the baked caches are from exact
    verify  model.gguf --hf-config config.json      llama.cpp's RoPE from the file vs exact
    cache   verify [--remove] | clear              check the disk cache against the stored
                                                   digests (RFC 9530), or empty it
    cache   ls [--json] | prune [--max-bytes SIZE] list it (most recently used first), or delete
                                                   the least recently used down to a cap

FIELD=VALUE pairs are spec fields, the values read as JSON when they parse (`factor=8`,
`interleaved=false`, `short_factor=[1,2]`) and as strings otherwise (`rope_type=llama3`);
`a.b=1` sets a nested field (NaN and infinities, `factor=NaN`, `1e999`, are exit 2: JSON has
none, in FIELD=VALUE, --spec or a config.json). For `rope`, flat scaling keys go into
`rope_scaling`, as with `Client.rope`. With --hf-config they are overrides (`profile=onnx
max_positions=4096`).

One thing names the table (`fetch`, `onnx`): KIND with FIELD=VALUE pairs, --spec, --key,
--preset or --hf-config (beside which a KIND keeps that family of the config's tables). Two of
them, a KIND beside --spec, --key or --preset, FIELD=VALUE beside --key (one table, no
overrides) and --layer-type without --hf-config or --preset are exit 2, never one ignored.
`fetch -o` prints the whole content key (`wrote FILE (KIND KEY)`), which --key takes; the
server resolves no shortened keys.

Wherever a config.json is taken (--hf-config, resolve), a folder holding it or a Hugging Face
model id `ORG/NAME[@REVISION]` is taken too: the id's config.json comes from the Hugging Face
cache (HF_HOME, HF_HUB_CACHE), downloaded when online (huggingface_hub: `pip install
'posenc-client[hub]'`); offline (--offline, POSENC_OFFLINE or HF_HUB_OFFLINE=1) from the cache
only. An existing file or folder of that name wins, as in transformers' from_pretrained.

--spec takes a spec object, the one spec language of the server (docs/service.md): fields
(`{"kind": "rope", ...}`), `{"hf_config": {...}, "layer_type"?: ..., ...overrides}` or
`{"preset": NAME, "part"?: PART, ...overrides}`, as JSON text or `@file.json`; FIELD=VALUE
pairs are laid over it.

Exit codes (stable, for scripts):
    0  success
    1  unexpected error (a bug: please report it)
    2  usage: bad arguments (a --timeout that is not a positive, finite number of seconds, a
       --key that is not a whole content key, a --url that is no http(s) URL of a host, an
       --api-key a header cannot carry; the same in POSENC_URL, POSENC_API_KEY, or a
       POSENC_OFFLINE that is not a boolean), a table named two ways (KIND beside --spec,
       --key or --preset; two of those), --tensor without -o, NaN or an infinity in
       FIELD=VALUE, --spec or a config.json, unreadable input files, an output that cannot be
       written (its folder cannot be made, it is a folder, no permission) or has an
       unsupported suffix; a model id whose config.json cannot be had (no huggingface_hub, no
       such repository, revision or config.json, a gated repository)
    3  the server refused the request (4xx/5xx; its error_type and message are printed) or
       answered something that cannot be decoded
    4  no answer: connection refused, DNS, TLS or timeout, after the retries; or the Hugging
       Face Hub, for a model id its cache lacks
    5  offline (--offline) and the cache lacks what was asked (the Hugging Face cache a
       model id's config.json too)
    6  the model cannot take the tables (plug: shape, dtype, pairing, consumer constraints;
       its baked caches do not look like the config's, without --force); verify: they do not;
       a GGUF file that is not the config's model, or a config llama.cpp cannot compute
    7  cache verify found files that do not match their digests (each one is printed)
    8  verify: the model's caches (a GGUF file's keys or divisor tensors) differ from the
       config's in a way plug repairs (or are an all-zero placeholder)
    9  verify: some RoPE site could not be checked (its cos/sin are graph inputs, computed
       from the model's inputs, or in a pattern posenc does not know), or none was: each is
       reported "not checkable" with the reason; --allow-unchecked accepts unchecked sites
       beside checked ones (a model with no site checked still exits 9)
  141  stdout's reader went away (`posenc-client ... | head`): nothing more is written, no
       traceback (128 + SIGPIPE, as a shell reports it)

Environment: POSENC_URL, POSENC_API_KEY, POSENC_CACHE_DIR (else $XDG_CACHE_HOME/posenc),
POSENC_CACHE_MAX_BYTES (the cache's size cap), POSENC_OFFLINE (1, true, yes or on; 0, false,
no, off or empty; any case); for model ids huggingface_hub's
HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE, HF_TOKEN.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from posenc_client._cache import DiskCache, default_max_bytes, parse_size, split_table_ref
from posenc_client._client import Client
from posenc_client._core import bearer_key, server_url
from posenc_client._exceptions import (
    APIError,
    CacheMissError,
    DecodeError,
    HubUnreachableError,
    IncompatibleModelError,
    ModelIdError,
    TransportError,
)
from posenc_client._options import JSON, family_spec, load_config, rope_spec
from posenc_client._tables import Tables
from posenc_client._version import __version__

if TYPE_CHECKING:
    from posenc_client._progress import DownloadProgress

CONFIG_HELP = (
    "the model's config.json, a folder holding it, or a Hugging Face model id "
    "ORG/NAME[@REVISION] (needs posenc-client[hub]; an existing file or folder of that name wins)"
)

EXIT_OK = 0
EXIT_BUG = 1
EXIT_USAGE = 2
EXIT_SERVER = 3
EXIT_CONNECTION = 4
EXIT_OFFLINE = 5
EXIT_INCOMPATIBLE = 6
EXIT_CORRUPT = 7
EXIT_DIFFERS = 8
EXIT_UNCHECKED = 9
EXIT_CLOSED_PIPE = 141
"""stdout's reader went away (`posenc-client ... | head`): 128 + SIGPIPE, as a shell reports a
writer SIGPIPE ended."""

SPEC_HELP = (
    'a spec object: {"kind": ...} fields, {"hf_config": {...}, ...overrides} or '
    '{"preset": NAME, "part"?: PART, ...overrides}; JSON text or @file.json'
)


SHORT_KEY = re.compile(r"[0-9a-fA-F]{1,63}")
"""A content key cut short (`fetch -o` printed 12 hex digits before it printed the whole key)."""


class UsageError(Exception):
    """Bad arguments or input files: exit code 2."""


def _finite(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise ValueError(f"{token} is past the largest float")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON number")


def json_value(text: str) -> Any:
    """JSON text as Python, refusing NaN and infinities (`NaN`, `Infinity`, `1e999`: Python's
    json reads them, but JSON has none and no request can carry one) with a ValueError that is
    not a `json.JSONDecodeError`."""
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite)


def parse_fields(pairs: Sequence[str]) -> JSON:
    """`FIELD=VALUE` pairs -> a dict (JSON values where they parse, dotted names nest); a
    non-finite number (`factor=NaN`) is a usage error, not a string."""
    out: JSON = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"expected FIELD=VALUE, got {pair!r}")
        try:
            value: Any = json_value(text)
        except json.JSONDecodeError:
            value = text
        except ValueError as err:
            raise UsageError(f"{pair!r}: {err}: a request carries finite numbers only") from err
        target = out
        *parents, leaf = name.strip().split(".")
        for part in parents:
            child = target.setdefault(part, {})
            if not isinstance(child, dict):
                raise UsageError(f"{name!r}: {part!r} is already set to a value")
            target = child
        target[leaf] = value
    return out


def _kind_and_fields(args: argparse.Namespace) -> tuple[str | None, JSON]:
    """The optional KIND positional and the FIELD=VALUE pairs (argparse gives the first pair to
    KIND when no kind is named)."""
    kind: str | None = args.kind
    pairs = list(args.fields)
    if kind is not None and "=" in kind:
        pairs.insert(0, kind)
        kind = None
    return kind, parse_fields(pairs)


def _spec(kind: str, fields: JSON) -> JSON:
    return rope_spec(**fields) if kind == "rope" else family_spec(kind, **fields)


def _spec_object(text: str, fields: JSON) -> JSON:
    """--spec (JSON text, or @path of a JSON file) with the FIELD=VALUE pairs laid over it."""
    try:
        if text.startswith("@"):
            with open(text[1:], encoding="utf-8") as f:
                data = json_value(f.read())
        else:
            data = json_value(text)
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot read the spec {text!r}: {err}") from err
    if not isinstance(data, dict):
        raise UsageError(f"--spec must be a JSON object, got {type(data).__name__}")
    return {**data, **fields}


def _config(client: Client, path: str) -> JSON:
    """A config.json file or folder, or a model id `ORG/NAME[@REVISION]` (offline with the
    client); `ModelIdError` passes through to its exit code."""
    try:
        config = load_config(path, offline=client.offline)
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot read the config {path!r}: {err}") from err
    try:
        json.dumps(config, allow_nan=False)  # what the request will carry
    except ValueError as err:
        raise UsageError(
            f"cannot send the config {path!r}: it holds NaN or an infinity, which JSON has "
            f"none of ({err})"
        ) from err
    return config


def _summary(tables: Tables) -> JSON:
    return {
        "name": tables.name,
        "kind": tables.kind,
        "key": tables.key,
        "tensors": {
            n: {"shape": list(a.shape), "dtype": tables.dtypes[n]} for n, a in tables.items()
        },
        "spec": tables.spec,
        "notes": tables.notes,
    }


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=False))


def _one(found: dict[str, Tables], what: str) -> Tables:
    if len(found) != 1:
        raise UsageError(
            f"{what} needs {len(found)} tables ({', '.join(found)}): pick one with --layer-type"
        )
    return next(iter(found.values()))


def _preset_table(client: Client, preset: str, layer_type: str | None, fields: JSON) -> Tables:
    """`--preset NAME[/PART]` (`--layer-type PART` names the part too: Gemma 3's parts are its
    layer types) with FIELD=VALUE overrides: the server's preset spec object
    `{"preset", "part"?, ...overrides}` through `POST /v1/tables`, so that one part is fetched
    (and remembered for offline use) rather than every part of the preset."""
    name, _, part = preset.partition("/")
    if part and layer_type and part != layer_type:
        raise UsageError(f"--preset {preset!r} names part {part!r} but --layer-type {layer_type!r}")
    spec: JSON = {"preset": name, **fields}
    if part or layer_type:
        spec["part"] = part or layer_type
    try:
        return client.table(spec)
    except APIError as err:
        if err.error_type != "ambiguous_config":
            raise
        raise UsageError(
            f"preset {name!r}: {err.message} (--layer-type PART or --preset {name}/PART)"
        ) from err


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _named_by(
    args: argparse.Namespace, kind: str | None, fields: JSON, sources: Sequence[str]
) -> str | None:
    """Which one of the options `sources` (dests: spec, key, preset, hf_config) names the table,
    or None: KIND with FIELD=VALUE pairs. Each of these was ignored without a word, so each is a
    usage error: two sources at once; a KIND beside --spec, --key or --preset, which name the
    table, its kind included (with --hf-config KIND keeps that family of the config's tables);
    FIELD=VALUE beside --key, which names one table; --layer-type beside anything but
    --hf-config or --preset, the things with layer types."""
    given = [dest for dest in sources if getattr(args, dest, None)]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(map(_flag, given))} each name the table: give one")
    source = given[0] if given else None
    if source is not None and source != "hf_config" and kind is not None:
        raise UsageError(
            f"{_flag(source)} names the table, its kind included, so {kind!r} beside it "
            "would be ignored: drop it (FIELD=VALUE pairs are overrides)"
        )
    if source == "key" and fields:
        raise UsageError(
            f"--key names one table and takes no FIELD=VALUE overrides ({', '.join(fields)}): "
            "drop them, or fetch by spec"
        )
    if args.layer_type and source not in ("hf_config", "preset"):
        where = " or ".join(_flag(dest) for dest in ("hf_config", "preset") if dest in sources)
        raise UsageError(
            f"--layer-type {args.layer_type!r} picks the part of {where} for that layer type; "
            "there is none here (a --spec object takes layer_type=PART)"
        )
    return source


def _write_problem(path: str, err: OSError | ValueError) -> UsageError:
    """The one line for an output the user named that cannot be written (exit 2); an OSError
    is said in words, without the temporary file beside the output (`write_atomic`) that the
    error may name."""
    if isinstance(err, ValueError):
        reason = str(err)
    elif isinstance(err, FileExistsError) and err.filename:  # makedirs: a file on the way
        reason = f"{err.filename} is a file, not a folder"
    elif isinstance(err, NotADirectoryError):
        reason = "a part of its folder is a file, not a folder"
    elif isinstance(err, IsADirectoryError):
        reason = "it is a folder"
    else:
        reason = err.strerror or type(err).__name__
    return UsageError(f"cannot write {path!r}: {reason}")


def cmd_fetch(client: Client, args: argparse.Namespace) -> int:
    kind, fields = _kind_and_fields(args)
    source = _named_by(args, kind, fields, ("spec", "key", "preset", "hf_config"))
    if args.tensor and not args.output:
        raise UsageError(f"--tensor {args.tensor!r} picks the tensor to write: give -o FILE")
    if source == "spec":
        tables = client.table(_spec_object(args.spec, fields))
    elif source == "key":
        tables = client.table_by_key(args.key)
    elif source == "preset":
        tables = _preset_table(client, args.preset, args.layer_type, fields)
    elif source == "hf_config":
        overrides = {**fields, "layer_type": args.layer_type, "kind": kind}
        tables = _one(
            client.tables_for_model(_config(client, args.hf_config), **overrides), "the config"
        )
    elif kind:
        tables = client.table(_spec(kind, fields))
    else:
        raise UsageError(
            "give a KIND with FIELD=VALUE pairs, --spec, --hf-config, --key or --preset"
        )
    if args.output:
        try:
            tables.save(args.output, tensor=args.tensor)
        except OSError as err:
            raise _write_problem(args.output, err) from err
        except ValueError as err:
            raise UsageError(str(err)) from err
        # the whole key, which `fetch --key` takes (the server resolves no prefixes)
        print(f"wrote {args.output} ({tables.kind} {tables.key})", file=sys.stderr)
    else:
        _print_json(_summary(tables))
    return EXIT_OK


def cmd_resolve(client: Client, args: argparse.Namespace) -> int:
    specs = client.resolve(_config(client, args.config), **parse_fields(args.fields))
    _print_json([s.__dict__ for s in specs])
    for part in specs.unserved:
        print(f"not served: {part.part} ({part.config_key}): {part.reason}", file=sys.stderr)
    return EXIT_OK


def cmd_presets(client: Client, args: argparse.Namespace) -> int:
    if args.name:
        preset = client.preset(args.name)
        _print_json(
            {
                "name": preset.name,
                "title": preset.title,
                "model": preset.model,
                "source": preset.source,
                "notes": list(preset.notes),
                "parts": [p.__dict__ for p in preset.parts],
            }
        )
        return EXIT_OK
    presets = client.presets()
    if args.json:
        _print_json([{"name": p.name, "title": p.title, "model": p.model} for p in presets])
        return EXIT_OK
    width = max((len(p.name) for p in presets), default=0)
    for p in presets:
        parts = ", ".join(part.name for part in p.parts)
        print(f"{p.name:<{width}}  {p.title}  [{parts}]")
    return EXIT_OK


def cmd_kinds(client: Client, args: argparse.Namespace) -> int:
    for kind in client.kinds():
        required = ", ".join(kind.get("required", []))
        print(f"{kind['kind']:<14} {kind.get('summary', '')}  (required: {required or '-'})")
    return EXIT_OK


def cmd_onnx(client: Client, args: argparse.Namespace) -> int:
    kind, fields = _kind_and_fields(args)
    source = _named_by(args, kind, fields, ("spec", "hf_config"))
    if source == "spec":
        spec = _spec_object(args.spec, fields)
    elif source == "hf_config":
        overrides = {**fields, "layer_type": args.layer_type, "kind": kind}
        specs = client.resolve(_config(client, args.hf_config), **overrides)
        if len(specs) != 1:
            names = ", ".join(s.name for s in specs)
            raise UsageError(
                f"the config needs {len(specs)} tables ({names}): pick one with "
                "KIND or --layer-type"
            )
        spec = specs[0].spec
    elif kind:
        spec = _spec(kind, fields)
    else:
        raise UsageError("give a KIND with FIELD=VALUE pairs, --spec or --hf-config")
    model = client.onnx(
        spec,
        graph=args.graph,
        opset=args.opset,
        mode=args.mode,
        op=args.op,
        num_heads=args.num_heads,
        inputs=args.inputs,
    )
    if args.output:
        try:
            model.save(args.output)
        except OSError as err:
            raise _write_problem(args.output, err) from err
        print(f"wrote {args.output} ({model.graph} {model.key[:12]})", file=sys.stderr)
    else:
        _print_json({"key": model.key, "bytes": len(model.data), "metadata": model.metadata})
    return EXIT_OK


def cmd_cache(client: Client, args: argparse.Namespace) -> int:
    cache = client.cache
    if cache is None:
        raise UsageError("cache commands need the disk cache (drop --no-cache)")
    if args.action == "ls":
        return _cache_ls(cache, args.json)
    if args.action == "prune":
        return _cache_prune(cache, args.max_bytes)
    if args.action == "clear":
        removed = cache.clear()
        print(f"removed {removed} files from {cache.root}", file=sys.stderr)
        return EXIT_OK
    checks = cache.verify()
    bad = [c for c in checks if c.problem is not None]
    for check in bad:
        print(f"corrupt: {check.path}: {check.problem}")
        if args.remove:
            cache.discard(check.ns, check.key)
    stale = cache.stale_temp_files()
    for path in stale:
        print(f"stale: {path}: a temporary file an interrupted write left")
        if args.remove:
            path.unlink(missing_ok=True)
    verb = "removed" if args.remove else "found"
    print(
        f"{len(checks) - len(bad)} of {len(checks)} cached files match their digests"
        + (f"; {verb} {len(bad)} corrupt" if bad else "")
        + (f"; {verb} {len(stale)} stale temporary files" if stale else ""),
        file=sys.stderr,
    )
    return EXIT_CORRUPT if bad and not args.remove else EXIT_OK


def _size(size: float) -> str:
    """A byte count for people: `512 B`, `3.2 MiB`."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _asked(record: JSON) -> str:
    """One line for what a request record asked for (records written before `cache ls` existed
    name only their id)."""
    request = record.get("request")
    if not isinstance(request, dict):
        return "(an older record: what it asked is not stored)"
    body = json.dumps(request.get("body"), sort_keys=True, separators=(",", ":"))
    text = f"{request.get('route')} {body} @ {request.get('server')}"
    return text if len(text) <= 160 else text[:157] + "..."


def _cache_ls(cache: DiskCache, as_json: bool) -> int:
    """`cache ls`: every cached table and model, most recently used first, with the requests
    whose records point at it."""
    pointing: dict[tuple[str, str], list[JSON]] = {}
    for rid, record in cache.records():
        if record.get("ns") == "resolve":
            keys = [
                ("tables", s.get("key")) for s in record.get("specs") or [] if isinstance(s, dict)
            ]
        else:
            keys = [(str(record.get("ns")), record.get("key"))]
        for ns, key in keys:
            pointing.setdefault((ns, str(key)), []).append(
                {"id": rid, "resolves": record.get("ns") == "resolve", **record}
            )
    entries = cache.entries()
    total = sum(e.size for e in entries)
    if as_json:
        _print_json(
            {
                "root": str(cache.root),
                "max_bytes": cache.max_bytes,
                "total_bytes": total,
                "entries": [
                    {
                        "key": e.key,
                        "ns": e.ns,
                        "kind": _entry_kind(pointing.get((e.ns, e.key), []), e.ns),
                        "bytes": e.size,
                        "last_used": _iso(e.last_used),
                        "path": str(e.path),
                        "requests": [
                            {"id": r["id"], "resolve": r["resolves"], **(r.get("request") or {})}
                            for r in pointing.get((e.ns, e.key), [])
                        ],
                    }
                    for e in entries
                ],
            }
        )
        return EXIT_OK
    for e in entries:
        requests = pointing.get((e.ns, e.key), [])
        kind = _entry_kind(requests, e.ns)
        print(f"{e.key[:16]}  {e.ns:<6} {kind:<12} {_size(e.size):>10}  {_iso(e.last_used)}")
        for r in requests:
            via = "resolve " if r["resolves"] else ""
            print(f"    {via}{r['id'][:12]}  {_asked(r)}")
    cap = "no cap" if cache.max_bytes is None else f"cap {_size(cache.max_bytes)}"
    print(f"{len(entries)} entries, {_size(total)} ({cap}) in {cache.root}", file=sys.stderr)
    return EXIT_OK


def _entry_kind(requests: list[JSON], ns: str) -> str:
    """An entry's family as its requests name it (`rope`, `preset`, `hf_config`), else its
    namespace's thing."""
    for r in requests:
        body = (r.get("request") or {}).get("body") or {}
        if r["resolves"]:
            return "hf_config"
        for field in ("kind", "preset", "hf_config"):
            if field in body:
                return str(body[field]) if field == "kind" else field
    return "table" if ns == "tables" else "onnx model"


def _iso(seconds: float) -> str:
    import datetime

    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _cache_prune(cache: DiskCache, max_bytes: int | None) -> int:
    """`cache prune [--max-bytes SIZE]`: delete least recently used entries down to the cap."""
    cap = max_bytes if max_bytes is not None else cache.max_bytes
    if cap is None:
        raise UsageError(
            "cache prune needs a cap: --max-bytes SIZE, --cache-max-bytes or "
            "$POSENC_CACHE_MAX_BYTES"
        )
    removed = cache.prune(cap)
    for e in removed:
        print(f"removed {e.key[:16]}  {e.ns:<6} {_size(e.size):>10}  {_iso(e.last_used)}")
    left = sum(e.size for e in cache.entries())
    print(
        f"removed {len(removed)} entries ({_size(sum(e.size for e in removed))}); "
        f"{_size(left)} left, cap {_size(cap)}",
        file=sys.stderr,
    )
    return EXIT_OK


def _model_dtype(dtypes: set[str | None], override: str | None) -> str | None:
    if override:
        return override
    known = {d for d in dtypes if d}
    if len(known) > 1:
        raise IncompatibleModelError(f"the model's attention nodes mix dtypes {sorted(known)}")
    return known.pop() if known else None


def _rope_tables(
    client: Client, config: JSON, overrides: JSON, switch: Any
) -> tuple[Tables, Tables | None]:
    """The table to plug, and with a length switch (LongRoPE's If) the one past it: each for its
    side of the switch and with its branch's rows. The reference bytes (`device="cpu"`), as
    ONNX exports bake: a model plugged from a GPU server verifies exact."""
    if switch is None:
        return _one(client.tables_for_model(config, device="cpu", **overrides), "the config"), None
    sides = []
    for value, seq_len in ((switch.short, switch.threshold), (switch.long, switch.threshold + 1)):
        rows = int(value.tensor.dims[0]) if value.tensor.dims else None
        fields = {"max_positions": rows, **overrides, "seq_len": seq_len}
        if fields["max_positions"] is None:
            del fields["max_positions"]
        sides.append(_one(client.tables_for_model(config, device="cpu", **fields), "the config"))
    return sides[0], sides[1]


def _rope_plan(
    client: Client, plug: Any, model: Any, args: argparse.Namespace
) -> tuple[list[Any], Tables, Tables | None]:
    """The RoPE consumers to fill or verify, the table for the model's config (its dtype and
    rows read from the model) and, with a LongRoPE length switch, the table past it."""
    from posenc_check.rope import length_switch

    config = _config(client, args.hf_config)
    fields = parse_fields(args.fields)
    rope = plug.find_rope_consumers(model)
    nodes = [c for c in rope if args.node is None or c.node in args.node]
    rows = [c.rows for c in nodes if c.rows is not None]
    gqa = any(c.op.endswith("GroupQueryAttention") for c in nodes)
    switches = [length_switch(model.graph, c.cos) for c in nodes]
    switch = next((s for s in switches if isinstance(s, plug.LengthSwitch)), None)
    overrides = {
        "kind": "rope",
        "layer_type": args.layer_type,
        "profile": "ort_gqa" if gqa else "onnx",
        "dtype": _model_dtype({c.dtype for c in nodes}, args.dtype),
        "max_positions": args.max_positions or (max(rows) if rows else None),
        **fields,
    }
    tables, long_tables = _rope_tables(client, config, overrides, switch)
    return nodes, tables, long_tables


def _load(plug: Any, path: str) -> Any:
    try:
        return plug.load_model(path)
    except Exception as err:
        raise UsageError(f"cannot read the model {path!r}: {err}") from err


def _plug_module() -> Any:
    try:
        from posenc_client import onnx as plug
    except ImportError as err:
        raise UsageError(f"needs onnx: pip install 'posenc-client[onnx]' ({err})") from err
    return plug


def _report(reports: list[Any], stream: TextIO) -> None:
    for report in reports:
        print(f"  {report.line()}", file=stream)


def _frequency_table(client: Client, args: argparse.Namespace) -> Tables:
    """The rope table (with inv_freq) for a model computing RoPE from frequency constants."""
    overrides = {
        "kind": "rope",
        "layer_type": args.layer_type,
        "max_positions": args.max_positions or 16,  # only inv_freq is used
        **parse_fields(args.fields),
    }
    return _one(
        client.tables_for_model(_config(client, args.hf_config), device="cpu", **overrides),
        "the config",
    )


def _request_fields(request: Any, args: argparse.Namespace, gqa: bool, fields: JSON) -> JSON:
    """The overrides that fetch the table a `TableRequest` asks for, for the model's config:
    half-width caches of the site's dtype and rows (and `seq_len` on a side of a length switch),
    or the frequencies. --dtype, --max-positions and FIELD=VALUE win."""
    if request.what == "inv_freq":
        return {
            "kind": "rope",
            "layer_type": args.layer_type,
            "max_positions": args.max_positions or 16,  # only inv_freq is used
            **fields,
        }
    found = {
        "kind": "rope",
        "layer_type": args.layer_type,
        "profile": "ort_gqa" if gqa else "onnx",
        "dtype": args.dtype or request.dtype,
        "max_positions": args.max_positions or request.rows,
        **fields,
    }
    if request.seq_len is not None:
        found["seq_len"] = request.seq_len
    return found


def _site_tables(
    client: Client, plug: Any, model: Any, args: argparse.Namespace
) -> tuple[Callable[[Any], Tables], dict[Any, Tables]]:
    """`tables_for` of `verify_model` and `attach_site_tables` for the model's config (each
    `TableRequest` fetched once, `_request_fields`), and the tables it fetched."""
    config = _config(client, args.hf_config)
    fields = parse_fields(args.fields)
    gqa = any(c.op.endswith("GroupQueryAttention") for c in plug.find_rope_consumers(model))
    fetched: dict[Any, Tables] = {}

    def tables_for(request: Any) -> Tables:
        if request not in fetched:
            found = client.tables_for_model(
                config, device="cpu", **_request_fields(request, args, gqa, fields)
            )
            fetched[request] = _one(found, "the config")
        return fetched[request]

    return tables_for, fetched


def _report_before_plug(what: str, reports: list[Any], force: bool) -> None:
    """Plug's report of the model's `what` (caches, frequencies, tables) against the config's on
    stderr; a `mismatch` refused unless `force`."""
    if reports:
        print(f"the model's {what} against the config's:", file=sys.stderr)
        _report(reports, sys.stderr)
    mismatched = [r.name for r in reports if r.verdict == "mismatch"]
    if mismatched and not force:
        raise IncompatibleModelError(
            f"the model's {what} {mismatched} do not look like this config's (see above): "
            "check --hf-config, or pass --force to replace them anyway"
        )


def _plug_table_sites(
    client: Client, plug: Any, model: Any, args: argparse.Namespace, sites: list[Any]
) -> tuple[Any, str]:
    """Plug's repair of the model's `gathered` and `folded` sites (`attach_site_tables`): their
    report first, a `mismatch` refused without --force."""
    tables_for, fetched = _site_tables(client, plug, model, args)
    nodes = sorted({node for site in sites for node in site.nodes})
    names = {name for site in sites for name in (site.cos, site.sin)}
    reports = [
        r
        for r in plug.verify_model(model, tables_for, data_dir=Path(args.model).parent, nodes=nodes)
        if r.name in names  # these sites' reports, not those of their consumers' other sites
    ]
    _report_before_plug("tables", reports, args.force)
    patched = plug.attach_site_tables(model, tables_for, nodes=nodes)
    keys = ", ".join(sorted(t.key[:12] for t in fetched.values()))
    kinds = " and ".join(sorted({site.kind for site in sites}))
    plural = "s" if len(sites) != 1 else ""
    return patched, f"RoPE tables {keys} into {len(sites)} {kinds} site{plural}"


VERIFY_EXITS = {
    "exact": EXIT_OK,
    "repair": EXIT_DIFFERS,
    "mismatch": EXIT_INCOMPATIBLE,
    "not_checkable": EXIT_UNCHECKED,
}


def _gguf_module() -> Any:
    try:
        from posenc_client import gguf as gguf_check
    except ImportError as err:
        raise UsageError(f"needs gguf: pip install 'posenc-client[gguf]' ({err})") from err
    return gguf_check


def _gguf_plan(client: Client, args: argparse.Namespace) -> tuple[Any, Any, JSON, list[Any]]:
    """The GGUF checker, the file, the config and posenc's exact tables to compare with."""
    check = _gguf_module()
    try:
        model = check.read_gguf(args.model)
    except IncompatibleModelError:
        raise
    except Exception as err:
        raise UsageError(f"cannot read the GGUF file {args.model!r}: {err}") from err
    config = _config(client, args.hf_config)
    fields = parse_fields(args.fields)
    resolved = client.resolve(config, kind="rope", **fields)
    sides = check.rope_sides(
        model,
        config,
        resolved,
        client.table,
        rows=args.max_positions,
        layer_type=args.layer_type,
    )
    return check, model, config, sides


def _gguf_json(path: str, result: str, code: int, reports: list[Any]) -> JSON:
    return {
        "model": path,
        "format": "gguf",
        "outcome": result,
        "exit_code": code,
        "tables": [{**report.__dict__, "line": report.line()} for report in reports],
    }


def cmd_verify_gguf(client: Client, args: argparse.Namespace) -> int:
    check, model, config, sides = _gguf_plan(client, args)
    reports = check.verify_gguf(model, config, sides)
    result = check.outcome(reports)
    code = VERIFY_EXITS[result]
    if args.json:
        _print_json(_gguf_json(args.model, result, code, reports))
    else:
        against = ", ".join(f"{s.table.key[:12]} ({s.name})" for s in sides)
        print(f"{args.model} ({model.arch}) against {against}:")
        _report(reports, sys.stdout)
        print(f"outcome: {result}")
    return code


def cmd_plug_gguf(client: Client, args: argparse.Namespace) -> int:
    check, model, config, sides = _gguf_plan(client, args)
    before = check.verify_gguf(model, config, sides)
    print("the file's RoPE against the config's:", file=sys.stderr)
    _report(before, sys.stderr)
    try:
        changed, after = check.plug_gguf(model, config, sides, args.output)
    except OSError as err:
        raise _write_problem(args.output, err) from err
    result = check.outcome(after)
    if result != "exact":
        _report(after, sys.stderr)
        raise IncompatibleModelError(
            f"the written file is still not exact ({result}): llama.cpp cannot compute this "
            "config's RoPE from a GGUF file"
        )
    what = ", ".join(changed) if changed else "nothing (the file was exact)"
    print(f"plugged {what}; wrote {args.output}", file=sys.stderr)
    return EXIT_OK


def _is_gguf(path: str) -> bool:
    if path.lower().endswith(".gguf"):
        return True
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"GGUF"
    except OSError:
        return False


def cmd_verify(client: Client, args: argparse.Namespace) -> int:
    if _is_gguf(args.model):
        return cmd_verify_gguf(client, args)
    plug = _plug_module()
    model = _load(plug, args.model)
    tables_for, fetched = _site_tables(client, plug, model, args)
    reports = plug.verify_model(
        model, tables_for, data_dir=Path(args.model).parent, nodes=args.node
    )
    if not reports:
        raise IncompatibleModelError(
            "the model has no RoPE site to verify: no RoPE consumer (RotaryEmbedding, "
            "GroupQueryAttention do_rotary=1), no folded cos/sin constant and no RoPE frequency "
            "constant"
        )
    result = plug.outcome(reports, allow_unchecked=args.allow_unchecked)
    code = VERIFY_EXITS[result]
    if args.json:
        keys = sorted({t.key for t in fetched.values()})
        sites = [{**report.__dict__, "line": report.line()} for report in reports]
        _print_json({"model": args.model, "outcome": result, "exit_code": code,
                     "exact_keys": keys, "sites": sites})  # fmt: skip
    else:
        against = ", ".join(
            f"{t.key[:12]} ({t.spec.get('rope_scaling')})" for t in fetched.values()
        )
        print(f"{args.model} against {against or 'no table'}:")
        _report(reports, sys.stdout)
        unchecked = sum(r.verdict == "not_checkable" for r in reports)
        print(f"outcome: {result} ({len(reports) - unchecked} checked, {unchecked} not checkable)")
    return code


def cmd_plug(client: Client, args: argparse.Namespace) -> int:
    if _is_gguf(args.model):
        return cmd_plug_gguf(client, args)
    plug = _plug_module()
    model = _load(plug, args.model)
    rope = plug.find_rope_consumers(model)
    alibi = plug.find_alibi_consumers(model)
    fields = parse_fields(args.fields)
    sites = plug.table_sites(model, args.node)
    tabled = {node for site in sites for node in site.nodes}
    selected = [c.node for c in rope if not args.node or c.node in args.node]
    others = [node for node in selected if node not in tabled]
    if sites and others:
        raise IncompatibleModelError(
            "the model holds RoPE tables gathered by position or folded in, and caches that "
            f"other consumers read ({others}): plug each kind on its own with --node"
        )
    if sites:
        patched, what = _plug_table_sites(client, plug, model, args, sites)
    elif rope:
        nodes, tables, long_tables = _rope_plan(client, plug, model, args)
        reports = plug.verify_rope_caches(
            model,
            tables,
            long_tables=long_tables,
            data_dir=Path(args.model).parent,
            nodes=[c.node for c in nodes],
        )
        _report_before_plug("caches", reports, args.force)
        patched = plug.attach_rope_caches(
            model,
            tables,
            nodes=args.node,
            cast=args.cast,
            check_pairing=not args.no_check_pairing,
            long_tables=long_tables,
        )
        what = (
            f"RoPE caches {tables.key[:12]} ({list(tables['cos'].shape)}) into {len(nodes)} nodes"
        )
        if long_tables is not None:
            what += f", past the switch {long_tables.key[:12]} ({list(long_tables['cos'].shape)})"
    elif alibi:
        specs = client.resolve(_config(client, args.hf_config), kind="alibi")
        if len(specs) != 1:
            raise IncompatibleModelError(
                "the model has attention nodes but the config has no ALiBi"
            )
        base = specs[0]
        form = args.alibi_form or str(base.notes.get("bias_form", "causal"))
        dtype = _model_dtype({c.dtype for c in alibi}, args.dtype) or "float32"
        spec = {**base.spec, "bias": form, "query_length": 1, "key_length": 1, "dtype": dtype}
        spec.update(fields)
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
        graph = client.onnx(spec, graph="bias", opset=min(max(opset, 17), 23), inputs=args.inputs)
        patched = plug.attach_alibi_bias(model, graph, nodes=args.node)
        what = f"the ALiBi bias subgraph ({form}, {dtype}) into {len(alibi)} attention nodes"
    elif constants := plug.find_frequency_constants(model):
        tables = _frequency_table(client, args)
        reports = plug.verify_inv_freq(
            model, tables, data_dir=Path(args.model).parent, nodes=args.node
        )
        _report_before_plug("frequencies", reports, args.force)
        patched = plug.attach_inv_freq(model, tables, nodes=args.node)
        what = f"RoPE frequencies {tables.key[:12]} into {len(constants)} constants"
    else:
        raise IncompatibleModelError(
            "the model has no RoPE consumer, no RoPE frequency constant and no attention node "
            "taking a bias"
        )
    try:
        files = plug.save_model(
            patched, args.output, data_dir=Path(args.model).parent, link=args.link_data
        )
    except (OSError, ValueError) as err:
        raise _write_problem(args.output, err) from err
    extra = f" ({'; '.join(files)})" if files else ""
    print(f"plugged {what}; wrote {args.output}{extra}", file=sys.stderr)
    return EXIT_OK


def _size_arg(text: str) -> int:
    """argparse type of a byte size (`parse_size`)."""
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _seconds_arg(text: str) -> float:
    """argparse type of --timeout: a positive, finite number of seconds (a socket refuses
    anything else, at the first request)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(
            f"a positive, finite number of seconds is expected, got {text!r}"
        )
    return seconds


def _count_arg(text: str) -> int:
    """argparse type of --retries: a whole number, 0 or more."""
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise argparse.ArgumentTypeError(f"a whole number, 0 or more, is expected, got {text!r}")
    return count


def _checked_arg(check: Callable[[str], str]) -> Callable[[str], str]:
    """argparse type from a client check (`server_url`, `bearer_key`): its ValueError is the
    argument's error; an empty value stays empty (the environment's, or the default)."""

    def parse(text: str) -> str:
        if not text:
            return text
        try:
            check(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return text

    return parse


def _key_arg(text: str) -> str:
    """argparse type of `fetch --key`: a whole content key or a table URL (`split_table_ref`).
    A shortened key (the 12 hex digits older releases printed) is refused saying where the
    whole one is printed: the server resolves no prefixes."""
    if SHORT_KEY.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(
            f"{text!r} is {len(text.strip())} hex digits of a content key; --key needs all 64 "
            "(the server resolves no prefixes): `fetch ... -o FILE` prints the whole key "
            "(wrote FILE (KIND KEY)), as do the JSON summary of `fetch` without -o and "
            "`cache ls --json`"
        )
    try:
        split_table_ref(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _fields_arg(p: argparse.ArgumentParser, help_text: str) -> None:
    p.add_argument("fields", nargs="*", metavar="FIELD=VALUE", help=help_text)


def _model_args(p: argparse.ArgumentParser, model_help: str) -> None:
    """The arguments plug and verify share: the model, its config and the table overrides."""
    p.add_argument("model", help=model_help)
    _fields_arg(p, "spec overrides (seq_len=4096, precision=exact, ...)")
    p.add_argument("--hf-config", "--config", metavar="PATH|ID", required=True, help=CONFIG_HELP)
    p.add_argument("--layer-type", help="the table of this layer type")
    p.add_argument(
        "--max-positions",
        type=int,
        help="cache rows (default: the model's declared "
        "rows, else the config's max_position_embeddings)",
    )
    p.add_argument("--dtype", help="table dtype (default: the model's activation dtype)")
    p.add_argument("--node", action="append", help="only this node (repeatable)")


def _global_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """The options every command takes, before or after its name: with their defaults on the
    main parser; on each command's parser without (`SUPPRESS`), so that one given after the
    command wins and one not given there leaves the main parser's value."""

    def add(*names: str, **kwargs: Any) -> None:
        if not defaults:
            kwargs["default"] = argparse.SUPPRESS
        parser.add_argument(*names, **kwargs)

    add("--url", type=_checked_arg(server_url), default=None, help="server URL or host:port "
        "(default $POSENC_URL or http://127.0.0.1:8000)")  # fmt: skip
    add(
        "--api-key",
        type=_checked_arg(bearer_key),
        default=None,
        help="bearer key (default $POSENC_API_KEY)",
    )
    add("--timeout", type=_seconds_arg, default=60.0, help="seconds, more than 0 (default 60)")
    add(
        "--retries",
        type=_count_arg,
        default=3,
        help="retries on connection errors and 503, 0 or more (default 3)",
    )
    add(
        "--cache-dir",
        default=None,
        help="disk cache folder (default $POSENC_CACHE_DIR, else $XDG_CACHE_HOME/posenc)",
    )
    add(
        "--cache-max-bytes",
        type=_size_arg,
        default=None,
        metavar="SIZE",
        help="disk cache size cap, least recently used entries pruned after each write "
        "(4GiB, 512MiB, 1.5GB or bytes; default $POSENC_CACHE_MAX_BYTES, else none)",
    )
    add("--no-cache", action="store_true", default=False, help="do not use the disk cache")
    add(
        "--offline",
        action="store_true",
        default=False,
        help="cached tables only, no network (default $POSENC_OFFLINE: 1, true, yes or on)",
    )
    add(
        "-q",
        "--quiet",
        action="store_true",
        default=False,
        help="no progress display (shown on a terminal: a spinner while the server computes, "
        "then size, rate and ETA)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posenc-client",
        description="Fetch exact position tables and ONNX subgraphs from a posenc server, and "
        "plug them into ONNX models.",
        epilog="Exit codes: 0 ok, 1 bug, 2 usage, 3 server refused/bad answer, 4 no connection, "
        "5 offline cache miss, 6 model incompatible, 7 corrupt cache files (cache verify), "
        "8 verify: caches differ (plug repairs them), 9 verify: some or all RoPE sites not "
        "checkable.",
    )
    parser.add_argument("--version", action="version", version=f"posenc-client {__version__}")
    _global_options(parser, defaults=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    fields_help = "spec fields (JSON values; a.b=1 nests); overrides with --hf-config"
    p = sub.add_parser(
        "fetch",
        help="fetch a table",
        description="Fetch a table by spec, "
        "config.json, key or preset; write it by the output's suffix.",
    )
    p.add_argument(
        "kind",
        nargs="?",
        help="family: rope, alibi, sinusoidal, t5_bias, ... (with --hf-config: keep only this "
        "family)",
    )
    _fields_arg(p, fields_help)
    p.add_argument("--spec", metavar="JSON|@FILE", help=SPEC_HELP)
    p.add_argument("--hf-config", metavar="PATH|ID", help=CONFIG_HELP)
    p.add_argument("--layer-type", help="the table of this layer type (sliding_attention, ...)")
    p.add_argument(
        "--key",
        type=_key_arg,
        help="a content key (all 64 hex digits, as `fetch -o` prints it) or a table URL",
    )
    p.add_argument(
        "--preset",
        metavar="NAME[/PART]",
        help="a preset (see `presets`); --layer-type names its part too, FIELD=VALUE overrides",
    )
    p.add_argument(
        "-o",
        "--output",
        help="file.safetensors, file.npz or file.npy (default: print a JSON summary)",
    )
    p.add_argument("--tensor", help="write only this tensor (required for .npy with several)")
    p.set_defaults(run=cmd_fetch)

    p = sub.add_parser(
        "resolve",
        help="the tables a model needs",
        description="Map a config.json to its specs, keys and runtime notes.",
    )
    p.add_argument("config", metavar="PATH|ID", help=CONFIG_HELP)
    _fields_arg(p, "overrides (profile=onnx, max_positions=4096, kind=rope, layer_type=...)")
    p.set_defaults(run=cmd_resolve)

    p = sub.add_parser(
        "presets", help="curated released models", description="List the presets, or show one."
    )
    p.add_argument("name", nargs="?", help="show this preset's parts and specs")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(run=cmd_presets)

    p = sub.add_parser(
        "kinds",
        help="the families and their required fields",
        description="List the encoding families the server knows.",
    )
    p.set_defaults(run=cmd_kinds)

    p = sub.add_parser(
        "onnx",
        help="fetch a verified ONNX subgraph",
        description="Export a table as an ONNX subgraph (verified by the server).",
    )
    p.add_argument("kind", nargs="?", help="family (or with --hf-config: keep only this family)")
    _fields_arg(p, fields_help)
    p.add_argument("--spec", metavar="JSON|@FILE", help=SPEC_HELP)
    p.add_argument("--hf-config", metavar="PATH|ID", help=CONFIG_HELP)
    p.add_argument("--layer-type", help="the table of this layer type")
    p.add_argument("--graph", required=True, help="cos_sin, rotary, bias, embedding")
    p.add_argument("--opset", type=int, help="17..23 (default: the server's, 17)")
    p.add_argument("--mode", help="table or compute")
    p.add_argument("--op", help="rotary: decomposed, onnx or contrib")
    p.add_argument("--num-heads", type=int, help="rotary with 3-D input [B, S, heads*head_dim]")
    p.add_argument("--inputs", help="alibi/t5 bias: positions or lengths")
    p.add_argument("-o", "--output", help="file.onnx (default: print the metadata)")
    p.set_defaults(run=cmd_onnx)

    p = sub.add_parser(
        "plug",
        help="plug a model's tables into model.onnx (or repair model.gguf's RoPE)",
        description="Fill the cos/sin caches of RotaryEmbedding / GroupQueryAttention nodes "
        "(also LongRoPE's If), replace in-graph RoPE frequency constants, or insert the ALiBi "
        "bias subgraph before Attention nodes, with tables served for the "
        "model's config.json; the dtype and cache rows are read from the model. A GGUF file "
        "(llama.cpp) gets the keys and frequency divisors that make llama.cpp compute the "
        "exact table (docs/gguf.md), every other key and tensor copied unchanged.",
    )
    _model_args(p, "the ONNX model to patch (external data is kept, never read), or model.gguf")
    p.add_argument("-o", "--output", required=True, help="where to write the patched model")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace baked caches even when they do not look like the config's",
    )
    p.add_argument(
        "--link-data",
        action="store_true",
        help="hard-link the external data files beside an output in another folder instead "
        "of copying them (onnxruntime loads it; onnx.load refuses hard-linked data)",
    )
    p.add_argument("--cast", action="store_true", help="cast caches to the activation dtype")
    p.add_argument("--no-check-pairing", action="store_true", help="allow a pairing mismatch")
    p.add_argument("--alibi-form", help="bias form (default: the config's, e.g. row_constant)")
    p.add_argument(
        "--inputs",
        default="positions",
        help="ALiBi subgraph inputs: positions "
        "(query_positions, key_positions) or lengths (past_length, query_length)",
    )
    p.set_defaults(run=cmd_plug)

    p = sub.add_parser(
        "cache",
        help="list, prune, verify or clear the disk cache",
        description="verify: check every cached table and model against the digest stored with "
        "it (the server's Repr-Digest), printing each file that fails (exit 7 when one does, "
        "unless --remove deletes them: they are fetched again when next used). clear: delete "
        "every cached file. ls: every cached table and model (key, kind, size, last use, the "
        "requests that point at it), most recently used first. prune: delete the least "
        "recently used entries until the cache fits --max-bytes (else the cap).",
    )
    p.add_argument("action", choices=("verify", "clear", "ls", "prune"))
    p.add_argument("--remove", action="store_true", help="verify: delete the corrupt files")
    p.add_argument("--json", action="store_true", help="ls: print the entries as JSON")
    p.add_argument(
        "--max-bytes",
        type=_size_arg,
        metavar="SIZE",
        help="prune: the cap (4GiB, 512MiB, 1.5GB or bytes; default --cache-max-bytes)",
    )
    p.set_defaults(run=cmd_cache)

    p = sub.add_parser(
        "verify",
        help="how far a model's RoPE tables are from exact",
        description="Compare every RoPE site of model.onnx (baked cos/sin caches, tables "
        "gathered by position, folded cos/sin constants, LongRoPE's If branches, in-graph "
        "frequency constants) with the tables served for config.json, changing nothing: max "
        "abs and ulp error, first differing row and column, and the likely cause; a site whose "
        "values the model does not hold is 'not checkable', with the reason. Exit 0: at least "
        "one site checked and every site exact; 8: differs, plug repairs it; 6: does not look "
        "like this config; 9: some or all sites not checkable. A GGUF file (llama.cpp): the "
        "table llama.cpp computes from it against the exact one within ggml's float32 bound "
        "(docs/gguf.md), 0 exact, 8 a key or divisor tensor plug repairs, 6 not this model.",
    )
    _model_args(p, "the ONNX model to check, or model.gguf")
    p.add_argument(
        "--json",
        action="store_true",
        help="print {model, outcome, exit_code, exact_keys, sites: [report...]} as JSON",
    )
    p.add_argument(
        "--allow-unchecked",
        action="store_true",
        help="exit 0 when every checked site is exact though others could not be checked (at "
        "least one must be checked)",
    )
    p.set_defaults(run=cmd_verify)
    for command in sub.choices.values():
        _global_options(command, defaults=False)
    return parser


def _progress(quiet: bool) -> DownloadProgress | None:
    """The progress display (tqdm: a spinner until the server's first byte, then size, rate and
    ETA) on a terminal's stderr; none with --quiet or when stderr is not a terminal."""
    if quiet or not sys.stderr.isatty():
        return None
    from posenc_client._progress import DownloadProgress

    return DownloadProgress(sys.stderr)


def _fail(code: int, message: str) -> int:
    print(f"posenc-client: {message}", file=sys.stderr)
    return code


def _closed_pipe() -> int:
    """No traceback when stdout's reader has gone: stdout pointed at /dev/null, so that the
    interpreter's last flush at exit does not fail again, and `EXIT_CLOSED_PIPE`."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout with no descriptor (io.StringIO: tests)
        pass
    return EXIT_CLOSED_PIPE


def _client(
    args: argparse.Namespace, progress: DownloadProgress | None, cache: bool | str
) -> Client:
    """The client of the command line's options; what it refuses from the environment
    (`$POSENC_URL`, `$POSENC_API_KEY`, `$POSENC_OFFLINE`: `ValueError`s naming the variable) is
    a usage error, as a bad option is."""
    try:
        return Client(
            args.url,
            api_key=args.api_key,
            timeout=args.timeout,
            retries=args.retries,
            cache=cache,
            offline=args.offline or None,  # absent: $POSENC_OFFLINE
            progress=progress,
            transport=progress.transport() if progress is not None else None,
            cache_max_bytes=None if args.no_cache else args.cache_max_bytes,
        )
    except ValueError as err:
        raise UsageError(str(err)) from err


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (the console script exits with it)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Callable[[Client, argparse.Namespace], int] = args.run
    progress = _progress(args.quiet)
    cache: bool | str = False if args.no_cache else (args.cache_dir or True)
    try:
        default_max_bytes()
    except ValueError as err:
        return _fail(EXIT_USAGE, str(err))
    try:
        client = _client(args, progress, cache)
        with client:
            code = run(client, args)
            sys.stdout.flush()  # here, where a reader gone is a BrokenPipeError we answer
            return code
    except BrokenPipeError:
        return _closed_pipe()
    except UsageError as err:
        return _fail(EXIT_USAGE, str(err))
    except APIError as err:
        return _fail(EXIT_SERVER, f"server error {err.status} {err.error_type}: {err.message}")
    except DecodeError as err:
        return _fail(EXIT_SERVER, f"bad answer from the server: {err}")
    except TransportError as err:
        return _fail(EXIT_CONNECTION, f"no answer from the server: {err}")
    except CacheMissError as err:  # ModelNotCachedError too
        return _fail(EXIT_OFFLINE, str(err))
    except HubUnreachableError as err:
        return _fail(EXIT_CONNECTION, str(err))
    except ModelIdError as err:
        return _fail(EXIT_USAGE, str(err))
    except IncompatibleModelError as err:
        return _fail(EXIT_INCOMPATIBLE, str(err))
    except KeyboardInterrupt:
        return _fail(130, "interrupted")
    except Exception as err:  # the documented exit code 1: a bug, with its traceback
        import traceback

        traceback.print_exc()
        return _fail(EXIT_BUG, f"unexpected error: {type(err).__name__}: {err}")
    finally:
        if progress is not None:
            progress.close()


if __name__ == "__main__":
    sys.exit(main())
