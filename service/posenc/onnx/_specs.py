"""Specs of graphs that have no table: CoPE. `parse_export_spec` accepts them beside every family.

CoPE (Golovneva et al. 2024; `posenc.encodings.cope`) depends on q and k, so there is nothing to
precompute: it is not a registered family of `posenc.encodings` (no `/v1/tables` entry, no
`compute`), only a graph. Its spec says which graph to build and is hashed like any other spec
(canonical JSON, content key, export key):

- `head_dim` d: the last dim of q and k (and the rows of pos_emb).
- `npos_max`: contextual positions are clamped to npos_max - 1 (RAM's `npos_max`, its default
  block size + 1).
- `variant`: `repo` (RAM's default: position logits divided by sqrt(d)) or `paper` (the paper's
  listing, RAM's `--cope-nodiv`: added unscaled); see `posenc.encodings.cope`.
- `mask`: `causal` (built in the graph from the shapes, queries aligned with the last keys),
  `none`, or `input` (a boolean `attention_mask` input, True = attend).
- `pos_emb`: the learned (d, npos) embedding, npos >= npos_max, embedded as a float32 initializer;
  when absent the graph takes it as an input `pos_emb` [d, npos] (the consumer model's weight).
  Columns past npos_max are never read: the canonical form drops them.
- `dtype`: of q, k, v, pos_emb and the output (float32, float16, bfloat16).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, NoReturn, Self

from pydantic import Field, field_validator, model_validator

from posenc.encodings import FieldProblem, SpecBase, SpecError, TensorInfo, parse_spec
from posenc.encodings.base import validate_as

MAX_HEAD_DIM = 8192
MAX_NPOS = 1 << 20
MAX_WEIGHTS = 1 << 20
"""Cap on d * npos of an inline `pos_emb`."""

CopeVariant = Literal["repo", "paper"]
CopeMask = Literal["causal", "none", "input"]
FloatDtype = Literal["float32", "float16", "bfloat16"]


def _bad(field: str, message: str, value: Any) -> NoReturn:
    raise SpecError("invalid cope spec", [FieldProblem(field, message, value)])


class CopeSpec(SpecBase):
    """The CoPE attention subgraph (module docstring): q [B, N, S, d], k [B, N, T, d] ->
    logits [B, N, S, T] (or attention [B, N, S, dv] with v)."""

    kind: Literal["cope"] = "cope"
    head_dim: Annotated[int, Field(ge=1, le=MAX_HEAD_DIM)]
    npos_max: Annotated[int, Field(ge=1, le=MAX_NPOS)]
    variant: CopeVariant = "repo"
    mask: CopeMask = "causal"
    pos_emb: list[list[float]] | None = None
    dtype: FloatDtype = "float32"

    @field_validator("pos_emb", mode="before")
    @classmethod
    def _pos_emb_size(cls, value: Any) -> Any:
        # Checked before pydantic parses every float, and without echoing the weights.
        if not isinstance(value, list):
            return value
        if not value or not isinstance(value[0], list) or not value[0]:
            _bad("pos_emb", "must be a non-empty list of non-empty rows (d, npos)", None)
        npos = len(value[0])
        for r, row in enumerate(value):
            if not isinstance(row, list) or len(row) != npos:
                got = len(row) if isinstance(row, list) else type(row).__name__
                _bad("pos_emb", f"row {r} has {got} entries, row 0 has {npos}", got)
        if len(value) * npos > MAX_WEIGHTS:
            _bad("pos_emb", f"at most {MAX_WEIGHTS} entries (d * npos)", [len(value), npos])
        return value

    @model_validator(mode="after")
    def _check(self) -> Self:
        table = self.pos_emb
        if table is not None:
            if len(table) != self.head_dim:
                _bad(
                    "pos_emb",
                    f"must have head_dim={self.head_dim} rows (shape (d, npos))",
                    f"{len(table)} rows",
                )
            if len(table[0]) < self.npos_max:
                _bad(
                    "pos_emb",
                    f"must have at least npos_max={self.npos_max} columns (shape (d, npos))",
                    f"{len(table[0])} columns",
                )
        return self

    def canonical(self) -> Self:
        table = self.pos_emb
        if table is None or len(table[0]) == self.npos_max:
            return self
        return self.model_copy(update={"pos_emb": [row[: self.npos_max] for row in table]})

    def outputs(self) -> dict[str, TensorInfo]:
        """None: CoPE has no table (its graph's outputs depend on the runtime q and k)."""
        return {}


ONNX_SPECS: dict[str, type[SpecBase]] = {"cope": CopeSpec}
"""Kinds that exist only as graphs, by `kind`."""


def parse_export_spec(data: Mapping[str, Any]) -> SpecBase:
    """`parse_spec` that also knows the graph-only kinds (`ONNX_SPECS`); raises `SpecError`."""
    kind = data.get("kind") if isinstance(data, Mapping) else None
    if not isinstance(kind, str) or kind not in ONNX_SPECS:
        return parse_spec(data)
    return validate_as(ONNX_SPECS[kind], data, kind)
