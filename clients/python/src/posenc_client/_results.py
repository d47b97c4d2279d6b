"""What the client returns besides tables: `ResolvedSpec`, `ResolvedSpecs`, `UnservedPart`
(`resolve`), `MRopePositions` (`mrope_position_ids`), `Preset` and `PresetPart` (`presets`), each
read from the server's JSON (`from_json`, a `DecodeError` for an unexpected answer)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from posenc_client._exceptions import DecodeError
from posenc_client._formats import Array
from posenc_client._options import JSON


@dataclass(frozen=True)
class ResolvedSpec:
    """One table a model needs (`Client.resolve`): its name in the model, canonical spec, key,
    output shapes and dtypes, size in bytes and the notes a runtime must know."""

    name: str
    kind: str
    key: str
    url: str
    spec: JSON
    outputs: dict[str, JSON]
    bytes: int
    notes: JSON

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ResolvedSpec:
        try:
            return cls(
                name=str(data.get("name") or data["kind"]),
                kind=str(data["kind"]),
                key=str(data["key"]),
                url=str(data.get("url", f"/v1/tables/{data['key']}")),
                spec=dict(data["spec"]),
                outputs=dict(data.get("outputs", {})),
                bytes=int(data.get("bytes", 0)),
                notes=dict(data.get("notes") or {}),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise DecodeError(f"unexpected spec description from the server: {err!r}") from None


@dataclass(frozen=True, eq=False)
class MRopePositions:
    """M-RoPE position ids of one token layout (`Client.mrope_position_ids`): `position_ids`
    (3, N) int64 (temporal, height, width: feed them to the `/v2` `rope` model with the resolved
    notes' `mrope_section`), `mrope_position_deltas` (max id + 1 - N: decoding positions are
    cache length + delta), the server's `rule` and the vision parameters it used."""

    model_type: str
    rule: str
    position_ids: Array
    mrope_position_deltas: int
    parameters: JSON

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MRopePositions:
        try:
            ids = np.asarray(data["position_ids"], dtype=np.int64)
            if ids.ndim != 2 or ids.shape[0] != 3:
                raise ValueError(f"position_ids of shape {ids.shape}, expected (3, N)")
            return cls(
                model_type=str(data["model_type"]),
                rule=str(data["rule"]),
                position_ids=ids,
                mrope_position_deltas=int(data["mrope_position_deltas"]),
                parameters={
                    k: data[k]
                    for k in (
                        "spatial_merge_size",
                        "tokens_per_second",
                        "temporal_merge_size",
                        "position_id_per_seconds",
                    )
                    if k in data
                },
            )
        except (KeyError, TypeError, ValueError) as err:
            raise DecodeError(f"unexpected position ids from the server: {err!r}") from None


@dataclass(frozen=True)
class UnservedPart:
    """A part of the model the server serves no table for (`Client.resolve(...).unserved`):
    `part` (a table name such as "learned", or a sub-model such as "vision_config"), `reason`
    and `config_key` (the config.json key it comes from, or the request field that would serve
    it, such as `table_key`)."""

    part: str
    reason: str
    config_key: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UnservedPart:
        try:
            return cls(str(data["part"]), str(data["reason"]), str(data["config_key"]))
        except (KeyError, TypeError) as err:
            raise DecodeError(f"unexpected unserved part from the server: {err!r}") from None


class ResolvedSpecs(list[ResolvedSpec]):
    """What `Client.resolve` returns: the tables served (a list of `ResolvedSpec`, as before)
    and `unserved`, the parts of the model that get no table, each with its reason (empty when
    the server serves the whole config, or predates partial resolves)."""

    def __init__(self, specs: Sequence[ResolvedSpec], unserved: Sequence[UnservedPart] = ()):
        super().__init__(specs)
        self.unserved: list[UnservedPart] = list(unserved)


@dataclass(frozen=True)
class PresetPart:
    """One table of a preset (`rope`, `full_attention`, `encoder`, ...)."""

    name: str
    kind: str
    key: str
    spec: JSON | None = None


@dataclass(frozen=True)
class Preset:
    """A curated released model: its name, title, model id, source and parts (tables)."""

    name: str
    title: str
    model: str
    parts: tuple[PresetPart, ...]
    source: str | None = None
    notes: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Preset:
        try:
            parts = tuple(
                PresetPart(str(p["name"]), str(p["kind"]), str(p["key"]), p.get("spec"))
                for p in data.get("parts", [])
            )
            return cls(
                name=str(data["name"]),
                title=str(data.get("title", data["name"])),
                model=str(data.get("model", "")),
                parts=parts,
                source=data.get("source"),
                notes=tuple(str(n) for n in data.get("notes", ())),
            )
        except (KeyError, TypeError) as err:
            raise DecodeError(f"unexpected preset description from the server: {err!r}") from None
