"""Learned absolute position tables, resampled to a new grid or length as each ecosystem does.

A learned table is checkpoint weights E (N, D): `num_prefix_tokens` leading rows (class,
distillation or register tokens; RoBERTa-style padding rows for text) followed by one row per
position of a grid (h, w) in row-major order, or of a sequence of length L. Resampling keeps the
prefix rows and interpolates the rest (`method`):

- `timm`: timm `layers/pos_embed.resample_abs_pos_embed`:
  `interpolate(size=new_grid, mode=interpolation, antialias=antialias, align_corners=...)`.
- `hf_vit`: transformers 5.23 `ViTEmbeddings.interpolate_pos_encoding` (and
  `Dinov2Embeddings.interpolate_pos_encoding`): `interpolate(size=new_grid, mode="bicubic",
  align_corners=False)`.
- `dinov2_legacy`: facebookresearch/dinov2 `DinoVisionTransformer.interpolate_pos_encoding` (and
  transformers' Dinov2 before it switched to `size=`): `interpolate(scale_factor=((h + o) / M,
  (w + o) / M), mode="bicubic")`.
- `linear_1d`: text models: `interpolate(E.T[None], size=new_length, mode="linear",
  align_corners=...)`.

Details per method:

- `timm`: prefix tokens kept (default 1), source grid `grid` (default square), bicubic with
  antialias on by default (`antialias` false for the older behaviour), `interpolation` bicubic or
  bilinear, `align_corners` default false. timm returns the table unchanged when the size does not
  change.
- `hf_vit`: one class token, a square source grid (`torch_int(num_positions ** 0.5)`), bicubic
  without antialias. The model derives the target grid as `height // patch_size, width //
  patch_size` (pixels floored to patches): give that grid as `new_grid`. It returns the table
  unchanged when the patch count is unchanged and height == width (the same grid). DINOv2 in
  transformers 5.23 makes the same call in fp32 (`Dinov2Embeddings` casts to float32 first), so it
  is this method too. The difference from `timm` is antialias only: the two differ by O(1) when
  downsampling (field guide section 4).
- `dinov2_legacy`: the original DINO/DINOv2 code (and transformers' Dinov2 until it moved to
  `size=`): target grid (h, w), M = sqrt(N - 1), `scale_factor = ((h + o) / M, (w + o) / M)` with
  the "historical kludge" o = `interpolate_offset` = 0.1 (dino#8). PyTorch then outputs
  floor(M * scale) = (h, w) rows but samples at source coordinates `(x + 0.5) / scale - 0.5`
  computed from the given scale, not from h / M: the table differs from `hf_vit`'s by the offset's
  shift. Square source grid, one class token, bicubic, no antialias.
- `linear_1d`: sequence tables (GPT-2, BERT, OPT, Whisper decoders) stretched to `new_length` by
  linear interpolation along positions, `align_corners` false by default; prefix rows kept
  (default 0; RoBERTa/OPT tables hold 2 offset rows).

Every method computes in float32 (as timm and DINOv2 do; ViT interpolates in the weights' dtype,
float32 for the checkpoints served here) and casts to `dtype` last. Output `embedding`
(num_prefix_tokens + new_h * new_w, D) or (num_prefix_tokens + new_length, D): the reference's
(1, N', D) without the batch axis.

The table itself (`table_key`)
------------------------------
A spec carries the table either inline (`table`, nested lists, at most `MAX_INLINE_ENTRIES`) or by
`table_key`, the content key of a table uploaded earlier, with its `table_shape` [N, D] so that
`outputs()` needs no lookup. The canonical form always names the table by key: an inline table and
the same table uploaded share one spec key, and canonical JSON stays small. The key, the
`TableStore` of uploaded tables and the binding (`resolve_tables`) are shared with the other
families that read checkpoint weights: `posenc.encodings.weights`. Computing a key-only spec that
was never bound raises `UnknownTableError` (error_type `unknown_table`).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal, NoReturn, Self

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator, model_validator

from posenc.encodings.base import DTYPES, TensorInfo, register_family
from posenc.encodings.errors import FieldProblem, SpecError
from posenc.encodings.memory import empty
from posenc.encodings.weights import (
    MAX_DIM,
    MAX_ROWS,
    MAX_TABLE_ENTRIES,
    TableFields,
    TableKeyField,
    TableShapeField,
    WeightTableSpec,
)

MAX_INLINE_ENTRIES = 1 << 20
"""Cap on N * D of an inline `table` (nested JSON lists); larger tables go through the store."""
MAX_SIDE = 4096
MAX_NEW_POSITIONS = 1 << 20

Method = Literal["timm", "hf_vit", "dinov2_legacy", "linear_1d"]
Interpolation = Literal["bicubic", "bilinear"]
FloatDtype = Literal["float32", "float16", "bfloat16"]

METHOD_FIELDS: dict[str, frozenset[str]] = {
    "timm": frozenset({"grid", "new_grid", "interpolation", "antialias", "align_corners"}),
    "hf_vit": frozenset({"grid", "new_grid"}),
    "dinov2_legacy": frozenset({"grid", "new_grid", "interpolate_offset"}),
    "linear_1d": frozenset({"new_length", "align_corners"}),
}
OPTIONAL_FIELDS = (
    "grid",
    "new_grid",
    "new_length",
    "interpolation",
    "antialias",
    "align_corners",
    "interpolate_offset",
)
DEFAULT_PREFIX: dict[str, int] = {"timm": 1, "hf_vit": 1, "dinov2_legacy": 1, "linear_1d": 0}

Side = Annotated[int, Field(ge=1, le=MAX_SIDE)]
Grid = Annotated[list[Side], Field(min_length=2, max_length=2)]


def _bad(field: str, message: str, value: Any) -> NoReturn:
    raise SpecError("invalid learned spec", [FieldProblem(field, message, value)])


class LearnedSpec(WeightTableSpec):
    """A learned absolute table (N, D) resampled per `method`; see the module docstring.

    Give exactly one of `table` (inline nested lists) or `table_key` with `table_shape`. Fields of
    one method are rejected on another; `canonical()` fills the method's defaults and names the
    table by its key.
    """

    table_fields: ClassVar[TableFields] = TableFields("table", "table_key", "table_shape")

    kind: Literal["learned"] = "learned"
    method: Method
    table: list[list[float]] | None = None
    table_key: TableKeyField = None
    table_shape: TableShapeField = None
    num_prefix_tokens: Annotated[int | None, Field(ge=0, le=MAX_ROWS)] = None
    grid: Grid | None = None
    new_grid: Grid | None = None
    new_length: Annotated[int | None, Field(ge=1, le=MAX_NEW_POSITIONS)] = None
    interpolation: Interpolation | None = None
    antialias: bool | None = None
    align_corners: bool | None = None
    interpolate_offset: Annotated[float | None, Field(gt=0.0, lt=1.0)] = None
    dtype: FloatDtype = "float32"

    @field_validator("table", mode="before")
    @classmethod
    def _table_size(cls, value: Any) -> Any:
        # Checked before pydantic parses every float, and without echoing the table in errors.
        if value is None or not isinstance(value, list):
            return value
        if not value or not isinstance(value[0], list) or not value[0]:
            _bad("table", "must be a non-empty list of non-empty rows (N, D)", None)
        d = len(value[0])
        for r, row in enumerate(value):
            if not isinstance(row, list) or len(row) != d:
                got = len(row) if isinstance(row, list) else type(row).__name__
                _bad("table", f"row {r} has {got} entries, row 0 has {d}: rows must be equal", got)
        if len(value) * d > MAX_INLINE_ENTRIES:
            _bad(
                "table",
                f"at most {MAX_INLINE_ENTRIES} entries inline (N * D); upload larger tables "
                "and send table_key",
                [len(value), d],
            )
        return value

    @model_validator(mode="after")
    def _check(self) -> Self:
        self._check_source()
        allowed = METHOD_FIELDS[self.method]
        for name in OPTIONAL_FIELDS:
            value = getattr(self, name)
            if value is not None and name not in allowed:
                _bad(name, f"not used by method {self.method!r}; it takes {sorted(allowed)}", value)
        n, _ = self.shape()
        prefix = self.prefix()
        if self.method in ("hf_vit", "dinov2_legacy") and prefix != 1:
            _bad(
                "num_prefix_tokens",
                f"method {self.method!r} keeps exactly one class token",
                self.num_prefix_tokens,
            )
        if prefix >= n:
            _bad(
                "num_prefix_tokens",
                f"must be < the table's {n} rows (at least one position row)",
                prefix,
            )
        if self.method == "linear_1d":
            if self.new_length is None:
                _bad("new_length", "required with method 'linear_1d'", None)
            return self
        self._check_grids(n - prefix)
        return self

    def _check_source(self) -> None:
        if (self.table is None) == (self.table_key is None):
            _bad("table", "give exactly one of table (inline) or table_key (uploaded)", None)
        if self.table is not None:
            shape = [len(self.table), len(self.table[0])]
            if self.table_shape is not None and self.table_shape != shape:
                _bad("table_shape", f"does not match the inline table's shape {shape}", None)
            self._bind_inline(self.table)
            return
        if self.table_shape is None:
            _bad("table_shape", "required with table_key: [N, D] of the uploaded table", None)
        n, d = self.table_shape
        if n > MAX_ROWS or d > MAX_DIM or n * d > MAX_TABLE_ENTRIES:
            _bad(
                "table_shape",
                f"at most {MAX_ROWS} rows, {MAX_DIM} columns and {MAX_TABLE_ENTRIES} entries",
                self.table_shape,
            )

    def _check_grids(self, positions: int) -> None:
        if self.new_grid is None:
            _bad("new_grid", f"required with method {self.method!r}: [h, w] in patches", None)
        nh, nw = self.new_grid
        if nh * nw > MAX_NEW_POSITIONS:
            _bad("new_grid", f"at most {MAX_NEW_POSITIONS} positions", self.new_grid)
        side = math.isqrt(positions)
        if self.grid is None:
            if side * side != positions:
                _bad(
                    "grid",
                    f"the table's {positions} position rows are not a square grid: give grid "
                    "[h, w] with h * w = N - num_prefix_tokens",
                    None,
                )
        elif self.grid[0] * self.grid[1] != positions:
            _bad(
                "grid",
                f"h * w must equal the table's {positions} position rows (N - num_prefix_tokens)",
                self.grid,
            )
        elif self.method != "timm" and self.grid[0] != self.grid[1]:
            _bad("grid", f"method {self.method!r} reshapes to a square grid", self.grid)
        if self.method == "dinov2_legacy":
            off = self.offset()
            for axis, new in zip(("h", "w"), self.new_grid, strict=True):
                if math.floor(side * ((new + off) / side)) != new:
                    _bad(
                        "interpolate_offset",
                        f"floor(M * (new_{axis} + offset) / M) != new_{axis} = {new}",
                        off,
                    )

    def shape(self) -> tuple[int, int]:
        """(N, D) of the source table."""
        if self.table is not None:
            return len(self.table), len(self.table[0])
        n, d = self.table_shape or (0, 0)
        return n, d

    def named_table_shape(self) -> tuple[int, int]:
        """(N, D): a learned spec always names its table."""
        return self.shape()

    def prefix(self) -> int:
        """num_prefix_tokens with the method's default."""
        if self.num_prefix_tokens is not None:
            return self.num_prefix_tokens
        return DEFAULT_PREFIX[self.method]

    def offset(self) -> float:
        """dinov2_legacy's interpolate_offset (default 0.1)."""
        return 0.1 if self.interpolate_offset is None else float(self.interpolate_offset)

    def source_grid(self) -> tuple[int, int]:
        """(h, w) of the source position rows (square unless `grid` says otherwise)."""
        if self.grid is not None:
            return self.grid[0], self.grid[1]
        n, _ = self.shape()
        side = math.isqrt(n - self.prefix())
        return side, side

    def new_rows(self) -> int:
        """Rows of the output: prefix plus the new grid's area or the new length."""
        if self.method == "linear_1d":
            return self.prefix() + int(self.new_length or 0)
        nh, nw = self.new_grid or (0, 0)
        return self.prefix() + nh * nw

    def canonical(self) -> Self:
        values: dict[str, Any] = dict.fromkeys(OPTIONAL_FIELDS)
        if self.method == "linear_1d":
            values["new_length"] = self.new_length
            values["align_corners"] = bool(self.align_corners)
        else:
            values["grid"] = list(self.source_grid())
            values["new_grid"] = list(self.new_grid or ())
            if self.method == "timm":
                values["interpolation"] = self.interpolation or "bicubic"
                values["antialias"] = True if self.antialias is None else self.antialias
                values["align_corners"] = bool(self.align_corners)
            elif self.method == "dinov2_legacy":
                values["interpolate_offset"] = self.offset()
        return self.model_copy(
            update={**values, **self._canonical_table(), "num_prefix_tokens": self.prefix()}
        )

    def outputs(self) -> dict[str, TensorInfo]:
        _, d = self.shape()
        return {"embedding": TensorInfo((self.new_rows(), d), self.dtype, row_axis=0)}


_GRID_KERNELS = {
    ("bicubic", False): torch.ops.aten.upsample_bicubic2d.out,
    ("bicubic", True): torch.ops.aten._upsample_bicubic2d_aa.out,
    ("bilinear", False): torch.ops.aten.upsample_bilinear2d.out,
    ("bilinear", True): torch.ops.aten._upsample_bilinear2d_aa.out,
}
"""The `out=` forms of the kernels `F.interpolate` runs on a 4-D CPU input, per (mode,
antialias): `(input, output_size, align_corners, scales_h, scales_w, out=)`."""


def _grid_resample(
    out: torch.Tensor,
    rows: torch.Tensor,
    old: tuple[int, int],
    *,
    mode: str,
    align_corners: bool = False,
    antialias: bool = False,
    scale: tuple[float, float] | None = None,
) -> None:
    """(h*w, D) rows resampled into `out` (h', w', D), contiguous, with the references'
    reshape/permute/interpolate sequence: the (1, D, h, w) channels-last view of the rows goes
    through the kernel `F.interpolate(x, size=(h', w'))` (or `scale_factor=scale`) runs, so the
    same kernel path computes the same values.

    On the CPU the kernel writes straight into `out`'s (1, D, h', w') channels-last view (its
    `out=` form, given the sizes and scales `F.interpolate` would pass it): no intermediate
    tensor and no copy. Elsewhere `F.interpolate` runs and its result is copied into `out`.
    """
    nh, nw, d = out.shape
    x = rows[None].reshape(1, old[0], old[1], d).permute(0, 3, 1, 2)
    dst = out[None].permute(0, 3, 1, 2)  # (1, D, h', w'), channels-last over `out`
    if out.device.type == "cpu":
        sh, sw = (None, None) if scale is None else scale
        _GRID_KERNELS[(mode, antialias)](x, (nh, nw), align_corners, sh, sw, out=dst)
        return
    if scale is None:
        y = F.interpolate(
            x, size=(nh, nw), mode=mode, align_corners=align_corners, antialias=antialias
        )
    else:
        y = F.interpolate(
            x, scale_factor=scale, mode=mode, align_corners=align_corners, antialias=antialias
        )
    dst.copy_(y)


def resample(spec: LearnedSpec, table: torch.Tensor) -> torch.Tensor:
    """The resampled (N', D) float32 table for a canonical spec and its (N, D) float32 source,
    in a new contiguous tensor (`memory.empty`: a mapping of its own when large)."""
    prefix = spec.prefix()
    head, rows = table[:prefix], table[prefix:]
    d = int(table.shape[1])
    out = empty((spec.new_rows(), d), torch.float32, table.device)
    if spec.method == "linear_1d":
        length = int(spec.new_length or 0)
        if length == rows.shape[0]:
            return out.copy_(table)
        x = rows.t()[None]
        y = F.interpolate(x, size=length, mode="linear", align_corners=bool(spec.align_corners))
        out[:prefix] = head
        out[prefix:] = y[0].t()
        return out
    old = spec.source_grid()
    nh, nw = spec.new_grid or (0, 0)
    new = (nh, nw)
    if new == old:
        # timm and transformers return the table itself when the grid does not change.
        return out.copy_(table)
    out[:prefix] = head
    body = out[prefix:].view(nh, nw, d)
    if spec.method == "timm":
        _grid_resample(
            body,
            rows,
            old,
            mode=spec.interpolation or "bicubic",
            align_corners=bool(spec.align_corners),
            antialias=bool(spec.antialias),
        )
    elif spec.method == "hf_vit":
        _grid_resample(body, rows, old, mode="bicubic")
    else:
        m = old[0]
        off = spec.offset()
        scale = (float((new[0] + off) / m), float((new[1] + off) / m))
        _grid_resample(body, rows, old, mode="bicubic", scale=scale)
    return out


@register_family(
    "learned",
    LearnedSpec,
    "Learned absolute tables resampled as timm, transformers ViT, DINOv2 or 1-D linear do",
)
def compute_learned(
    spec: LearnedSpec, device: torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """`embedding` (N', D): the bound table resampled per `method`, cast to `dtype` last."""
    bound = spec.require_bound()
    out = resample(spec, bound.tensor.to(device))
    facts: dict[str, Any] = {"table_key": bound.key, "source_rows": int(bound.tensor.shape[0])}
    if spec.method != "linear_1d":
        facts["source_grid"] = list(spec.source_grid())
    dtype = DTYPES[spec.dtype]
    if dtype != torch.float32:  # cast last (`copy_` rounds as `.to`)
        out = empty(tuple(out.shape), dtype, out.device).copy_(out)
    return {"embedding": out}, facts
