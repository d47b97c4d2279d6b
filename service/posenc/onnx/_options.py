"""Export options: which graph, opset, mode and implementation; their canonical form and key.

The options and the spec's canonical form together identify a model: `export_key` hashes both
with the posenc version and `EXPORT_FORMAT_VERSION`, so equal requests share one cached model and
any change to the exporters changes every key.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from posenc import __version__
from posenc.encodings import SpecBase, canonical_json

EXPORT_FORMAT_VERSION = "1"
"""Bump when any exporter changes the graphs it writes: every export key changes with it."""

MIN_OPSET = 17
MAX_OPSET = 23
DEFAULT_OPSET = 17
OPSETS = tuple(range(MIN_OPSET, MAX_OPSET + 1))

IR_VERSIONS: dict[int, int] = {17: 8, 18: 8, 19: 9, 20: 9, 21: 10, 22: 10, 23: 11}
"""The lowest IR version each opset needs (onnx `helper.VERSION_TABLE`). onnx 1.23's `make_model`
writes IR 14, which onnxruntime 1.31 rejects (it loads up to 13); the lowest version also merges
with the most consumer models (`onnx.compose.merge_models` needs equal IR versions)."""

Mode = Literal["table", "compute"]
Op = Literal["decomposed", "onnx", "contrib"]
InputStyle = Literal["positions", "lengths"]
Role = Literal["query", "key"]


class ExportOptions(BaseModel):
    """What to export for a spec. Fields left None take the exporter's default (its first mode,
    op or input style); `posenc.onnx.resolve` fills them in.

    - `graph`: the graph name within the spec's kind (`cos_sin`, `rotary`, `bias`, `embedding`,
      `logits`, ...).
    - `opset`: default-domain opset, 17..23 (RotaryEmbedding op `onnx` needs 23).
    - `mode`: `table` gathers from an embedded table; `compute` builds values in the graph.
    - `op`: rotary graphs (rope, xpos) only: `decomposed` (plain ops), `onnx`
      (RotaryEmbedding-23) or `contrib` (com.microsoft.RotaryEmbedding).
    - `num_heads`: rotary graphs only: x is 3-D [B, S, num_heads * head_dim] instead of
      [B, N, S, H].
    - `inputs`: alibi, t5_bias and relative_index in mode compute: `positions`
      (query_positions [Q], key_positions [K]) or `lengths` (past_length, query_length scalars).
    - `role`: xpos/rotary only, required (no default): `query` (scale s) or `key` (scale 1/s).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    graph: str
    opset: Annotated[int, Field(ge=MIN_OPSET, le=MAX_OPSET)] = DEFAULT_OPSET
    mode: Mode | None = None
    op: Op | None = None
    num_heads: Annotated[int | None, Field(ge=1, le=65536)] = None
    inputs: InputStyle | None = None
    role: Role | None = None

    def canonical_json(self) -> str:
        """Sorted keys, no whitespace, None fields dropped."""
        data = self.model_dump(mode="json", exclude_none=True)
        return json.dumps(data, sort_keys=True, separators=(",", ":"))


def export_key(spec: SpecBase, options: ExportOptions) -> str:
    """sha256 over the canonical spec, the canonical options and the exporter versions. Pass the
    canonical options (`posenc.onnx.resolve`) so that defaults spelled out share the key."""
    payload = "\n".join(
        (
            f"posenc-onnx/{EXPORT_FORMAT_VERSION}/{__version__}",
            canonical_json(spec),
            options.canonical_json(),
        )
    )
    return hashlib.sha256(payload.encode()).hexdigest()
