"""posenc.encodings: pure, exact position-table math (torch only).

Public API:
- `parse_spec(data) -> Spec`: `kind` selects the family; invalid input raises `SpecError`.
- `compute(spec, device=...) -> Table`: `Table.tensors` (named torch tensors) and `Table.meta`.
- `from_hf_config(config, **overrides) -> list[Spec]`: specs a transformers config.json needs;
  `resolve_hf_parts(config, ...) -> Resolution`: the tables it can serve and the parts it cannot.
- `canonical_json(spec)`, `content_key(spec)`: canonical form and its stable sha256 key.
- `weights`: checkpoint tables specs name by content key (`TableStore`, `resolve_tables`).
"""

from posenc.encodings import (
    alibi,
    learned,
    normalized,
    relative_index,
    rope,
    sinusoidal,
    sinusoidal_2d,
    t5_bias,
    vision_rope,
    weights,
    xpos,
)
from posenc.encodings.base import (
    ALGORITHM_VERSION,
    FAMILIES,
    Family,
    SpecBase,
    Table,
    TensorInfo,
    canonical_dict,
    canonical_json,
    compute,
    content_key,
    parse_spec,
)
from posenc.encodings.errors import (
    ConfigError,
    FieldProblem,
    PosencError,
    SpecError,
    UnknownKindError,
)
from posenc.encodings.hf_config import (
    NamedSpec,
    Resolution,
    Unserved,
    from_hf_config,
    resolve_hf_config,
    resolve_hf_parts,
)

Spec = SpecBase

__all__ = [
    "ALGORITHM_VERSION",
    "FAMILIES",
    "ConfigError",
    "Family",
    "FieldProblem",
    "NamedSpec",
    "PosencError",
    "Resolution",
    "Spec",
    "SpecBase",
    "SpecError",
    "Table",
    "TensorInfo",
    "UnknownKindError",
    "Unserved",
    "alibi",
    "canonical_dict",
    "canonical_json",
    "compute",
    "content_key",
    "from_hf_config",
    "learned",
    "normalized",
    "parse_spec",
    "relative_index",
    "resolve_hf_config",
    "resolve_hf_parts",
    "rope",
    "sinusoidal",
    "sinusoidal_2d",
    "t5_bias",
    "vision_rope",
    "weights",
    "xpos",
]
