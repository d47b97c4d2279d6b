"""Curated presets: released models and the explicit specs of the tables they need; and user
presets, a directory of transformers config.json files (`posenc serve --presets-dir`).

One JSON file per model in this package (`<name>.json`: name, title, model, source, notes and
`specs`, a mapping from part name to spec dict). The values are the published ones from each
model's config.json (rope_theta, head_dim, scaling); models with several tables name each part
(Gemma 3 per layer type, T5 encoder and decoder, Phi-3.5 short and long factors). Presets depend
only on `posenc.encodings`.

User presets (`read_user_presets`): `<name>.json` or `<name>/config.json` in a directory, each a
model's config.json, resolved as `POST /v1/resolve` resolves it (`resolve_hf_parts`): one part per
table, named by its layer type or role (`full_attention`, `decoder`) or its family (`rope`). A
name clashing with a built-in preset, a name that is not `[A-Za-z0-9][A-Za-z0-9._-]*`, a file
that is not a JSON object or a config that maps to no table is a `PresetError` naming the file.
`register_user_presets` adds them to the process's presets, which `load_presets` returns beside
the built-in ones: a name keeps one meaning for the life of the process (registering a name
again with other tables is a `PresetError`), so what was resolved from a name (the servers'
memos) stays true.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from posenc.encodings import SpecBase, SpecError, content_key, parse_spec
from posenc.encodings.hf_config import resolve_hf_parts


class PresetError(ValueError):
    """A user preset that cannot be served: the message names the file and the reason."""


@dataclass(frozen=True)
class PresetPart:
    """One table of a preset: its part name, canonical spec and content key."""

    name: str
    spec: SpecBase
    key: str


@dataclass(frozen=True)
class Preset:
    """A released model and the tables it needs, in file order."""

    name: str
    title: str
    model: str
    source: str
    notes: tuple[str, ...]
    parts: tuple[PresetPart, ...]

    def part(self, name: str) -> PresetPart | None:
        """The part called `name`, or None."""
        return next((p for p in self.parts if p.name == name), None)


def _parse(doc: dict[str, Any], filename: str) -> Preset:
    parts = []
    for part_name, raw in doc["specs"].items():
        try:
            spec = parse_spec(raw).canonical()
        except SpecError as err:
            raise ValueError(f"preset {filename} part {part_name!r}: {err}") from err
        parts.append(PresetPart(part_name, spec, content_key(spec)))
    return Preset(
        name=doc["name"],
        title=doc["title"],
        model=doc["model"],
        source=doc["source"],
        notes=tuple(doc.get("notes", ())),
        parts=tuple(parts),
    )


@functools.cache
def builtin_presets() -> MappingProxyType[str, Preset]:
    """Every preset shipped with posenc, by name (sorted), read once per process (presets are
    frozen). Raises ValueError on a bad file."""
    found: dict[str, Preset] = {}
    for entry in sorted(resources.files(__package__).iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".json"):
            continue
        preset = _parse(json.loads(entry.read_text(encoding="utf-8")), entry.name)
        if preset.name != entry.name.removesuffix(".json"):
            raise ValueError(f"preset file {entry.name} declares name {preset.name!r}")
        found[preset.name] = preset
    return MappingProxyType(found)


_USER: dict[str, Preset] = {}
"""The user presets registered in this process (`register_user_presets`), by name."""

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""A preset's name: what a URL path segment and a file name both take as it is."""


def load_presets() -> MappingProxyType[str, Preset]:
    """Every preset: the built-in ones, then the user presets registered in this process."""
    if not _USER:
        return builtin_presets()
    return MappingProxyType({**builtin_presets(), **dict(sorted(_USER.items()))})


def _user_preset(name: str, path: Path) -> Preset:
    """The preset `name` from the config.json at `path`."""
    where = str(path)
    if NAME.fullmatch(name) is None:
        raise PresetError(f"{where}: {name!r} is not a preset name ([A-Za-z0-9][A-Za-z0-9._-]*)")
    if name in builtin_presets():
        raise PresetError(f"{where}: {name!r} is the name of a built-in preset; rename the file")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PresetError(f"{where}: not a readable JSON file ({err})") from err
    if not isinstance(config, dict):
        raise PresetError(f"{where}: a config.json is a JSON object, not {type(config).__name__}")
    try:
        resolution = resolve_hf_parts(config)
    except SpecError as err:
        raise PresetError(f"{where}: {' '.join(str(err).split())}") from err
    parts = []
    for named in resolution.specs:
        spec = named.spec.canonical()
        parts.append(
            PresetPart(named.name.partition(":")[2] or named.name, spec, content_key(spec))
        )
    names = [p.name for p in parts]
    if len(set(names)) != len(names):
        raise PresetError(f"{where}: its tables do not have distinct names ({names})")
    notes = tuple(
        f"{u.part} gets no table: {u.reason} ({u.config_key})" for u in resolution.unserved
    )
    return Preset(
        name=name,
        title=name,
        model=str(config.get("_name_or_path") or config.get("model_type") or name),
        source=where,
        notes=("a user preset: a config.json resolved as POST /v1/resolve resolves it", *notes),
        parts=tuple(parts),
    )


def read_user_presets(directory: Path) -> dict[str, Preset]:
    """The presets of `directory`: `<name>.json` and `<name>/config.json`, by name (sorted).
    Raises `PresetError` (one line naming the file) for the first one that cannot be served."""
    if not directory.is_dir():
        raise PresetError(f"{directory}: not a directory")
    found: dict[str, Preset] = {}
    for entry in sorted(directory.iterdir()):
        if entry.is_dir():
            path, name = entry / "config.json", entry.name
            if not path.is_file():
                continue
        elif entry.suffix == ".json":
            path, name = entry, entry.stem
        else:
            continue
        if name in found:
            raise PresetError(f"{path}: the preset {name!r} is given twice in {directory}")
        found[name] = _user_preset(name, path)
    return found


def _tables(preset: Preset) -> list[tuple[str, str]]:
    return [(p.name, p.key) for p in preset.parts]


def register_user_presets(presets: dict[str, Preset]) -> None:
    """Make `presets` known to `load_presets` for the life of the process; `PresetError` when a
    name is registered already with other tables."""
    for name, preset in presets.items():
        known = _USER.get(name)
        if known is not None and _tables(known) != _tables(preset):
            raise PresetError(
                f"{preset.source}: a preset {name!r} with other tables is registered already "
                f"(from {known.source})"
            )
    _USER.update(presets)


__all__ = [
    "Preset",
    "PresetError",
    "PresetPart",
    "builtin_presets",
    "load_presets",
    "read_user_presets",
    "register_user_presets",
]
