"""Curated presets: released models and the explicit specs of the tables they need.

One JSON file per model in this package (`<name>.json`: name, title, model, source, notes and
`specs`, a mapping from part name to spec dict). The values are the published ones from each
model's config.json (rope_theta, head_dim, scaling); models with several tables name each part
(Gemma 3 per layer type, T5 encoder and decoder, Phi-3.5 short and long factors). Presets depend
only on `posenc.encodings`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Any

from posenc.encodings import SpecBase, SpecError, content_key, parse_spec


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
def load_presets() -> MappingProxyType[str, Preset]:
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


__all__ = ["Preset", "PresetPart", "load_presets"]
