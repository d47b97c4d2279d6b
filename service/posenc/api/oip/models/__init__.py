"""The /v2 models, one per family, named after its `kind` (version "1").

| model         | inputs                                    | outputs                           |
|---------------|-------------------------------------------|-----------------------------------|
| rope          | position_ids [..] (3, .. with mrope)      | cos, sin [.., w] (or cos_sin,     |
|               |                                           | pairs), inv_freq [d/2]            |
| alibi         | query_positions [Q], key_positions [K]    | bias [H, Q, K], slopes [H]        |
| sinusoidal    | position_ids [..]                         | embedding [.., dim]               |
| sinusoidal_2d | grid [2], valid [2] or [B, 2]             | embedding (per style)             |
| t5_bias       | query_positions [Q], key_positions [K],   | buckets [Q, K], bias [H, Q, K]    |
|               | relative_attention_bias [nb, H]           |                                   |
| xpos          | position_ids [..]                         | cos_q, sin_q, cos_k, sin_k        |
|               |                                           | [.., w] (or cos, sin, scale_q,    |
|               |                                           | scale_k: packing factored)        |
| vision_rope   | grid [2] or [3] (frames, height, width)   | cos, sin [N, w] (tower order)     |
| other kinds   | none (the spec is the request)            | the table's tensors, as in /v1    |
"""

from __future__ import annotations

from posenc.api.oip.codec import OipError
from posenc.api.oip.models import (
    alibi,
    rope,
    sinusoidal,
    sinusoidal_2d,
    t5_bias,
    vision_rope,
    xpos,
)
from posenc.api.oip.models.base import VERSION, InferResult, OipModel, TensorDecl
from posenc.api.oip.models.table import table_model
from posenc.encodings import FAMILIES

POSITION_MODELS: dict[str, OipModel] = {
    m.name: m
    for m in (
        rope.MODEL,
        alibi.MODEL,
        sinusoidal.MODEL,
        sinusoidal_2d.MODEL,
        t5_bias.MODEL,
        xpos.MODEL,
        vision_rope.MODEL,
    )
}
"""The models whose inputs are positions (the rows a runtime needs)."""

MODELS: dict[str, OipModel] = {
    **POSITION_MODELS,
    **{kind: table_model(kind) for kind in sorted(FAMILIES) if kind not in POSITION_MODELS},
}
"""Model name -> model for every registered family (a test keeps it complete); families without a
position model are served whole (`table_model`)."""


def find_model(name: str, version: str | None) -> OipModel:
    """The model `name` (at `version`, when given: only "1" exists), or `OipError` 404 naming
    the models or versions there are (the same answer over HTTP and gRPC)."""
    model = MODELS.get(name)
    if model is None:
        raise OipError(404, f"unknown model {name!r}; models: {sorted(MODELS)}")
    if version is not None and version != VERSION:
        raise OipError(404, f"model {name!r} has no version {version!r}; versions: [{VERSION!r}]")
    return model


__all__ = [
    "MODELS",
    "POSITION_MODELS",
    "VERSION",
    "InferResult",
    "OipModel",
    "TensorDecl",
    "find_model",
]
