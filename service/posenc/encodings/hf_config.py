"""Mapping transformers config.json contents to specs (being written)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posenc.encodings.base import SpecBase


@dataclass(frozen=True)
class NamedSpec:
    name: str
    spec: SpecBase


def from_hf_config(config: dict[str, Any], **overrides: Any) -> list[SpecBase]:
    raise NotImplementedError
