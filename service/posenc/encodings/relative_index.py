"""Relative position indices into a learned bias table, and the bias they gather.

Schemes (`scheme`), each an integer table `index` whose entries address rows of a learned
(num_relative_distance, H) table, `relative_position_bias_table` in timm and transformers:

- `swin` (Liu et al. 2021, "Swin Transformer"; timm
  `layers/pos_embed_rel.gen_relative_position_index`, transformers
  `SwinRelativePositionBias._create_relative_position_index`): tokens of a Wh x Ww window in
  row-major order, token t at (t // Ww, t % Ww); for query a and key b,
  `index[a, b] = (h_a - h_b + Wh - 1) * (2 Ww - 1) + (w_a - w_b + Ww - 1)`. Shape (N, N),
  N = Wh Ww; num_relative_distance = (2 Wh - 1)(2 Ww - 1).
- `beit` (Bao et al. 2021, "BEiT"; timm `models/beit.gen_relative_position_index`, transformers
  `BeitRelativePositionBias.generate_relative_position_index`, timm's `class_token=True`): the
  Swin index shifted by one row and column for the class token at position 0, with three extra
  table rows: `index[0, 1:] = D` (class token attending to patches), `index[1:, 0] = D + 1`
  (patches attending to the class token), `index[0, 0] = D + 2`, D = (2 Wh - 1)(2 Ww - 1).
  Shape (N + 1, N + 1); num_relative_distance = D + 3.
- `swinv2` (Liu et al. 2022, "Swin Transformer V2"; transformers
  `Swinv2SelfAttention.create_coords_table_and_index`, `Swin2SRSelfAttention`'s copy): Swin's index
  and, as `coords` (num_relative_distance, 2) float32, the log-spaced relative coordinates the
  continuous position bias MLP reads: (dh, dw) for dh in -(Wh - 1)..Wh - 1 (rows) and dw likewise
  (columns), divided by `pretrained_window_size` - 1 (or by the window's - 1 when it is unset or
  0, and Wh > 1), times 8, then `sign(t) * log2(|t| + 1) / log2(8)`, in the reference's float32
  ops. The bias table is the checkpoint's MLP applied to `coords` (pass its output as the bias
  table); the model adds 16 * sigmoid of the gathered bias.
- `levit` (Graham et al. 2021, "LeViT"; transformers `LevitAttention` and
  `LevitAttentionSubsample.attention_bias_idxs`, timm `levit.py`): a square grid of R x R
  tokens (`window_size` [R, R]), queries every `stride`-th token of it (R' = (R - 1) // stride + 1
  per side, the subsample blocks; stride 1 elsewhere), both row-major; the offset of query (a, b)
  and key (c, d) is (|a stride - c|, |b stride - d|), and each distinct offset gets the next index
  in order of first appearance (queries outer, keys inner), as LeViT's dict does. Shape
  (R'^2, R^2); num_relative_distance = |A|^2, A the distinct |a stride - c| per axis (R^2 for
  stride 1). LeViT's `attention_biases` is (H, num_relative_distance): pass its transpose.
- `shaw` (Shaw et al. 2018, "Self-Attention with Relative Position Representations", section 3.2;
  tensor2tensor `common_attention._generate_relative_positions_matrix`): query position
  p_i = query_offset + i, key j, `index[i, j] = clip(j - p_i, -k, k) + k` with k =
  `max_relative_position`. Shape (Q, K); num_relative_distance = 2k + 1. tensor2tensor aligns
  Q < K queries with the last keys: `query_offset = K - Q`.
- `speecht5` (transformers `SpeechT5RelativePositionalEncoding`, k =
  `encoder_max_relative_position`): the other sign and an asymmetric clip,
  `index[i, j] = clip(p_i - j, -k, k - 1) + k`. Shape (Q, K); num_relative_distance = 2k.

With a bias table E (num_relative_distance, H) the output also holds
`bias[h, a, b] = E[index[a, b], h]` (H, rows, cols): exactly timm's and transformers'
`table[index.view(-1)].view(rows, cols, -1).permute(2, 0, 1)` (a gather of the fp32 weights,
cast to `dtype` last). Shaw's paper adds learned vectors, not scalars, per clipped distance; a
(2k + 1, H) table gives its per-head scalar form. For `shaw`/`speecht5` give `key_length` and/or
`query_length`: the missing one defaults to `key_length = query_offset + query_length` or
`query_length = key_length - query_offset`.

The bias table (checkpoint weights, `posenc.encodings.weights`) is given inline as
`relative_position_bias_table` (nested lists, bound at validation) or by
`relative_position_bias_table_key`, the content key of a table uploaded earlier
(`POST /v1/uploads`), with `relative_position_bias_table_shape` [num_relative_distance, H]; at most
one of the two, neither for the index alone. The canonical form names the table by key and shape,
never by its values: an inline table and its uploaded twin share one content key, and the key of
a BEiT-base spec (732 x 12 weights) is a hash of a few hundred bytes of JSON.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal, NoReturn, Self

import numpy as np
import torch
from pydantic import Field, field_validator, model_validator

from posenc.encodings._lengths import MAX_POSITIONS, check_lengths, resolve_lengths
from posenc.encodings._toeplitz import toeplitz
from posenc.encodings.base import DTYPES, TensorInfo, register_family
from posenc.encodings.errors import FieldProblem, SpecError
from posenc.encodings.memory import empty
from posenc.encodings.weights import (
    TableFields,
    TableKeyField,
    TableShapeField,
    WeightTableSpec,
)

MAX_SIDE = 1024
MAX_WINDOW_AREA = 4096
"""Wh * Ww: the (N + 1)^2 int64 index stays below 135 MB."""
MAX_DISTANCE = 1 << 20
MAX_HEADS = 4096
MAX_WEIGHTS = 1 << 20
"""Cap on num_relative_distance * H entries of the bias table (inline or by key)."""

Scheme = Literal["swin", "beit", "swinv2", "levit", "shaw", "speecht5"]
FloatDtype = Literal["float32", "float16", "bfloat16"]

WINDOW_SCHEMES = frozenset({"swin", "beit", "swinv2", "levit"})
MAX_LEVIT_SIDE = 64
"""R of a LeViT grid: the (R'^2, R^2) index stays below 17M entries."""
MAX_STRIDE = 64
SEQUENCE_FIELDS = ("max_relative_position", "query_length", "key_length")
TABLE = "relative_position_bias_table"
TABLE_KEY = "relative_position_bias_table_key"
TABLE_SHAPE = "relative_position_bias_table_shape"


def _bad(field: str, message: str, value: Any) -> NoReturn:
    raise SpecError("invalid relative_index spec", [FieldProblem(field, message, value)])


class RelativeIndexSpec(WeightTableSpec):
    """Relative position `index` (int64) and, with a bias table, `bias` (H, rows, cols); module
    docstring. `window_size` is [Wh, Ww] (an int means a square window), as timm's `window_size`
    and transformers' `config.window_size` (Swin) or `image_size // patch_size` (BEiT). The bias
    table is `relative_position_bias_table` inline or `relative_position_bias_table_key` with
    `relative_position_bias_table_shape` [num_relative_distance, H] (at most one of the two)."""

    table_fields: ClassVar[TableFields] = TableFields(TABLE, TABLE_KEY, TABLE_SHAPE)

    kind: Literal["relative_index"] = "relative_index"
    scheme: Scheme
    window_size: (
        Annotated[list[Annotated[int, Field(ge=1, le=MAX_SIDE)]], Field(min_length=2, max_length=2)]
        | None
    ) = None
    max_relative_position: Annotated[int | None, Field(ge=0, le=MAX_DISTANCE)] = None
    query_length: Annotated[int | None, Field(ge=1, le=MAX_POSITIONS)] = None
    key_length: Annotated[int | None, Field(ge=1, le=MAX_POSITIONS)] = None
    query_offset: Annotated[int, Field(ge=0, lt=MAX_POSITIONS)] = 0
    stride: Annotated[int | None, Field(ge=1, le=MAX_STRIDE)] = None
    pretrained_window_size: (
        Annotated[list[Annotated[int, Field(ge=0, le=MAX_SIDE)]], Field(min_length=2, max_length=2)]
        | None
    ) = None
    relative_position_bias_table: list[list[float]] | None = None
    relative_position_bias_table_key: TableKeyField = None
    relative_position_bias_table_shape: TableShapeField = None
    dtype: FloatDtype = "float32"

    @field_validator("window_size", mode="before")
    @classmethod
    def _square(cls, value: Any) -> Any:
        # An int means a square window, as timm's `to_2tuple(window_size)`.
        if isinstance(value, int) and not isinstance(value, bool):
            return [value, value]
        return value

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.scheme in WINDOW_SCHEMES:
            self._check_window()
        else:
            self._check_sequence()
        self._check_table()
        return self

    def _check_window(self) -> None:
        for name in SEQUENCE_FIELDS:
            if getattr(self, name) is not None:
                _bad(
                    name,
                    f"only for scheme 'shaw' or 'speecht5', not {self.scheme!r}",
                    getattr(self, name),
                )
        if self.query_offset:
            _bad(
                "query_offset",
                f"only for 'shaw' or 'speecht5', not {self.scheme!r}",
                self.query_offset,
            )
        if self.window_size is None:
            _bad("window_size", f"required with scheme={self.scheme!r}: [Wh, Ww]", None)
        wh, ww = self.window()
        if self.scheme != "levit" and self.stride is not None:
            _bad("stride", f"only for scheme 'levit', not {self.scheme!r}", self.stride)
        if self.scheme == "swinv2":
            self._check_swinv2(wh, ww)
        elif self.pretrained_window_size is not None:
            _bad(
                "pretrained_window_size",
                f"only for scheme 'swinv2', not {self.scheme!r}",
                self.pretrained_window_size,
            )
        if self.scheme == "levit" and (wh != ww or wh > MAX_LEVIT_SIDE):
            _bad(
                "window_size",
                f"a square LeViT grid [R, R] with R <= {MAX_LEVIT_SIDE} (LevitAttention's "
                "resolution)",
                [wh, ww],
            )
        if wh * ww > MAX_WINDOW_AREA:
            _bad("window_size", f"window area Wh*Ww must be <= {MAX_WINDOW_AREA}", [wh, ww])

    def _check_swinv2(self, wh: int, ww: int) -> None:
        """Swin V2 divides the coordinates by pretrained - 1 (or window - 1): a divisor of 0 on
        an axis with other coordinates than 0 gives the model inf / nan, refused here."""
        pre = self.pretrained_window_size or [0, 0]
        if pre[0] > 0:
            if min(pre) < 2:
                _bad(
                    "pretrained_window_size",
                    "each side must be >= 2 when set (Swin V2 divides by it - 1)",
                    pre,
                )
        elif pre[1] > 0:
            _bad(
                "pretrained_window_size",
                "Swin V2 reads pretrained_window_size[0] > 0 to use it: [0, w] is not applied",
                pre,
            )
        elif wh > 1 and ww < 2:
            _bad("window_size", "Swin V2 divides by Ww - 1: Ww must be >= 2 when Wh > 1", [wh, ww])

    def _check_sequence(self) -> None:
        if self.window_size is not None:
            _bad("window_size", "only for the window schemes", self.window_size)
        if self.pretrained_window_size is not None:
            _bad("pretrained_window_size", "only for scheme 'swinv2'", self.pretrained_window_size)
        if self.stride is not None:
            _bad("stride", f"only for scheme 'levit', not {self.scheme!r}", self.stride)
        k = self.max_relative_position
        least = 1 if self.scheme == "speecht5" else 0
        if k is None or k < least:
            _bad(
                "max_relative_position",
                f"required with scheme={self.scheme!r}, an integer in [{least}, {MAX_DISTANCE}]",
                k,
            )
        check_lengths("relative_index", self.query_length, self.key_length, self.query_offset)

    def _check_table(self) -> None:
        table = self.relative_position_bias_table
        key = self.relative_position_bias_table_key
        if table is not None and key is not None:
            _bad(
                TABLE,
                f"give at most one of {TABLE} (inline) or {TABLE_KEY} (uploaded)",
                None,
            )
        if table is None and key is None:
            if self.relative_position_bias_table_shape is not None:
                _bad(
                    TABLE_SHAPE,
                    f"only with {TABLE_KEY} (the shape of the uploaded table it names)",
                    self.relative_position_bias_table_shape,
                )
            if self.dtype != "float32":
                _bad(
                    "dtype",
                    "dtype is the bias dtype (the index is int64): give "
                    f"relative_position_bias_table (or {TABLE_KEY})",
                    self.dtype,
                )
            return
        if table is not None:
            self._check_inline(table)
        else:
            self._check_shape()

    def _check_inline(self, table: list[list[float]]) -> None:
        rows = self.num_relative_distance()
        if len(table) != rows:
            _bad(
                "relative_position_bias_table",
                f"must have num_relative_distance={rows} rows for this scheme and size "
                "(shape (num_relative_distance, num_heads))",
                f"{len(table)} rows",
            )
        heads = len(table[0])
        if not 1 <= heads <= MAX_HEADS:
            _bad("relative_position_bias_table", f"rows must hold 1..{MAX_HEADS} heads", heads)
        for r, row in enumerate(table):
            if len(row) != heads:
                _bad(
                    "relative_position_bias_table",
                    f"row {r} has {len(row)} entries, row 0 has {heads}: rows must be equal",
                    len(row),
                )
        if rows * heads > MAX_WEIGHTS:
            _bad(
                "relative_position_bias_table",
                f"at most {MAX_WEIGHTS} entries (num_relative_distance * num_heads)",
                rows * heads,
            )
        shape = self.relative_position_bias_table_shape
        if shape is not None and shape != [rows, heads]:
            _bad(TABLE_SHAPE, f"does not match the inline table's shape {[rows, heads]}", shape)
        self._bind_inline(table)

    def _check_shape(self) -> None:
        rows = self.num_relative_distance()
        shape = self.relative_position_bias_table_shape
        if shape is None:
            _bad(
                TABLE_SHAPE,
                f"required with {TABLE_KEY}: [num_relative_distance={rows}, num_heads] of the "
                "uploaded table",
                None,
            )
        got, heads = shape
        if got != rows:
            _bad(
                TABLE_SHAPE,
                f"must have num_relative_distance={rows} rows for this scheme and size "
                "([num_relative_distance, num_heads])",
                shape,
            )
        if not 1 <= heads <= MAX_HEADS:
            _bad(TABLE_SHAPE, f"num_heads must be in 1..{MAX_HEADS}", shape)
        if rows * heads > MAX_WEIGHTS:
            _bad(
                TABLE_SHAPE,
                f"at most {MAX_WEIGHTS} entries (num_relative_distance * num_heads)",
                shape,
            )

    def window(self) -> tuple[int, int]:
        """(Wh, Ww) for the window schemes."""
        wh, ww = self.window_size or (0, 0)
        return wh, ww

    def num_relative_distance(self) -> int:
        """Rows the bias table must have: the number of distinct index values."""
        if self.scheme == "levit":
            return len(levit_axis_offsets(self.window()[0], self.stride or 1)) ** 2
        if self.scheme in WINDOW_SCHEMES:
            wh, ww = self.window()
            d = (2 * wh - 1) * (2 * ww - 1)
            return d + 3 if self.scheme == "beit" else d
        k = int(self.max_relative_position or 0)
        return 2 * k + 1 if self.scheme == "shaw" else 2 * k

    def shape(self) -> tuple[int, int]:
        """(rows, cols) of `index`: (N, N), (N + 1, N + 1) or (Q, K)."""
        if self.scheme == "levit":
            side = self.window()[0]
            out = (side - 1) // (self.stride or 1) + 1
            return out * out, side * side
        if self.scheme in WINDOW_SCHEMES:
            wh, ww = self.window()
            n = wh * ww + (self.scheme == "beit")
            return n, n
        return resolve_lengths(self.query_length, self.key_length, self.query_offset)

    def named_table_shape(self) -> tuple[int, int] | None:
        """(num_relative_distance, H) of the bias table (inline or by key), or None without one."""
        table = self.relative_position_bias_table
        if table is not None:
            return len(table), len(table[0])
        shape = self.relative_position_bias_table_shape
        if self.relative_position_bias_table_key is None or shape is None:
            return None
        return shape[0], shape[1]

    @property
    def num_heads(self) -> int | None:
        """H, the width of the bias table, or None without one."""
        shape = self.named_table_shape()
        return None if shape is None else shape[1]

    def canonical(self) -> Self:
        """Lengths resolved (sequence schemes), LeViT's stride 1 left out, and the bias table
        named by key and shape."""
        update: dict[str, Any] = {}
        if self.stride == 1:
            update["stride"] = None
        if self.pretrained_window_size == [0, 0]:
            update["pretrained_window_size"] = None
        if self.scheme not in WINDOW_SCHEMES:
            q, k = self.shape()
            if (self.query_length, self.key_length) != (q, k):
                update.update(query_length=q, key_length=k)
        if self.relative_position_bias_table is not None:
            update.update(self._canonical_table())
        return self.model_copy(update=update) if update else self

    def outputs(self) -> dict[str, TensorInfo]:
        shape = self.shape()
        out = {"index": TensorInfo(shape, "int64", row_axis=0)}
        if self.scheme == "swinv2":
            out["coords"] = TensorInfo((self.num_relative_distance(), 2), "float32", row_axis=0)
        if self.num_heads is not None:
            out["bias"] = TensorInfo((self.num_heads, *shape), self.dtype, row_axis=1)
        return out


def _window_rows(wh: int, ww: int, device: torch.device | str) -> tuple[torch.Tensor, int]:
    """Per-token offsets r_t = h_t (2 Ww - 1) + w_t (N,) and the constant C of Swin's index.

    `index[a, b] = (h_a - h_b + Wh - 1)(2 Ww - 1) + (w_a - w_b + Ww - 1) = (r_a + C) - r_b` with
    C = (Wh - 1)(2 Ww - 1) + Ww - 1: one broadcast subtraction of exact integers per entry.
    """
    m = 2 * ww - 1
    # N <= 4096 values: numpy builds them without torch's per-op overhead, one copy moves them
    r = (np.arange(wh, dtype=np.int64)[:, None] * m + np.arange(ww, dtype=np.int64)).reshape(-1)
    return torch.from_numpy(r).to(device), (wh - 1) * m + (ww - 1)


def window_index(wh: int, ww: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Swin's relative position index (N, N) int64 for a Wh x Ww window, N = Wh * Ww (timm
    `gen_relative_position_index(q_size)`): `(r_a + C) - r_b` written in one pass
    (`_window_rows`), equal to the references' meshgrid arithmetic entry for entry."""
    r, c = _window_rows(wh, ww, device)
    n = r.shape[0]
    out = empty((n, n), torch.int64, device)
    return torch.sub((r + c)[:, None], r[None, :], out=out)


def class_token_index(wh: int, ww: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """BEiT's (N + 1, N + 1) index: Swin's (N, N) written straight into rows and columns 1..N,
    the class token at row/column 0 with indices D (cls -> patch), D + 1 (patch -> cls), D + 2
    (cls -> cls), D = (2 Wh - 1)(2 Ww - 1) (timm `gen_relative_position_index(class_token=True)`,
    transformers `BeitRelativePositionBias.generate_relative_position_index`)."""
    r, c = _window_rows(wh, ww, device)
    n = r.shape[0]
    d = (2 * wh - 1) * (2 * ww - 1)
    out = empty((n + 1, n + 1), torch.int64, device)
    torch.sub((r + c)[:, None], r[None, :], out=out[1:, 1:])
    out[0, 1:] = d
    out[1:, 0] = d + 1
    out[0, 0] = d + 2
    return out


def swinv2_coords(wh: int, ww: int, pretrained: list[int] | None) -> torch.Tensor:
    """Swin V2's `relative_coords_table` ((2 Wh - 1) (2 Ww - 1), 2) float32, op for op as
    `Swinv2SelfAttention.create_coords_table_and_index` (rows (dh, dw), dh outer)."""
    h = torch.arange(-(wh - 1), wh, dtype=torch.int64).float()
    w = torch.arange(-(ww - 1), ww, dtype=torch.int64).float()
    table = torch.stack(torch.meshgrid([h, w], indexing="ij")).permute(1, 2, 0).contiguous()
    pre = pretrained or [0, 0]
    if pre[0] > 0:
        table[:, :, 0] /= pre[0] - 1
        table[:, :, 1] /= pre[1] - 1
    elif wh > 1:
        table[:, :, 0] /= wh - 1
        table[:, :, 1] /= ww - 1
    table *= 8
    table = torch.sign(table) * torch.log2(torch.abs(table) + 1.0) / math.log2(8)
    return table.reshape(-1, 2)


def levit_axis_offsets(side: int, stride: int) -> list[int]:
    """The distinct |a stride - c| of one axis (a < (side - 1) // stride + 1, c < side)."""
    out = (side - 1) // stride + 1
    return sorted({abs(a * stride - c) for a in range(out) for c in range(side)})


def levit_index(side: int, stride: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """LeViT's `attention_bias_idxs` (R'^2, R^2) int64 (transformers `LevitAttentionSubsample`,
    `LevitAttention` for stride 1): offsets (|a stride - c|, |b stride - d|) numbered by first
    appearance, queries (a, b) outer and keys (c, d) inner, both row-major. Vectorised: the
    offsets' codes, their unique values, the first position of each, then each value's rank among
    those first positions (the order LeViT's dict assigns)."""
    out = (side - 1) // stride + 1
    q = torch.arange(out, dtype=torch.int64) * stride
    k = torch.arange(side, dtype=torch.int64)
    axis = (q[:, None] - k[None, :]).abs()  # (R', R): |a stride - c|
    rows = axis[:, None, :, None] * (side * stride + side)  # a vs c, scaled past any column code
    codes = (rows + axis[None, :, None, :]).reshape(-1)  # (R'^2 * R^2,), query-major, row-major
    unique, inverse = torch.unique(codes, return_inverse=True)
    first = torch.full((unique.numel(),), codes.numel(), dtype=torch.int64)
    first = first.scatter_reduce(0, inverse, torch.arange(codes.numel()), "amin")
    rank = torch.empty_like(first)
    rank[torch.argsort(first)] = torch.arange(unique.numel())
    return rank[inverse].view(out * out, side * side).to(device)


def sequence_index(spec: RelativeIndexSpec, device: torch.device | str = "cpu") -> torch.Tensor:
    """Shaw's or SpeechT5's clipped index (Q, K) int64 for a canonical spec.

    Both depend on r = j - i only: the Q + K - 1 clipped values (r from -(Q - 1) to K - 1) are
    computed once and laid out as a Toeplitz matrix (`_toeplitz.toeplitz`), the same integers
    as clipping the (Q, K) grid.
    """
    q, kl = spec.shape()
    k = int(spec.max_relative_position or 0)
    r = torch.arange(-(q - 1), kl, dtype=torch.int64, device=device)
    if spec.scheme == "shaw":  # clip(j - p_i, -k, k) + k, p_i = query_offset + i
        diagonals = (r - spec.query_offset).clamp(-k, k) + k
    else:  # clip(p_i - j, -k, k - 1) + k
        diagonals = (spec.query_offset - r).clamp(-k, k - 1) + k
    return toeplitz(diagonals, q, kl)


def relative_index(spec: RelativeIndexSpec, device: torch.device | str = "cpu") -> torch.Tensor:
    """The `index` table of a canonical spec (module docstring)."""
    if spec.scheme == "levit":
        return levit_index(spec.window()[0], spec.stride or 1, device)
    if spec.scheme in WINDOW_SCHEMES:
        wh, ww = spec.window()
        if spec.scheme == "beit":
            return class_token_index(wh, ww, device)
        return window_index(wh, ww, device)
    return sequence_index(spec, device)


@register_family(
    "relative_index",
    RelativeIndexSpec,
    "Swin/BEiT/Swin V2 windowed, LeViT offset and Shaw/SpeechT5 clipped relative indices and their "
    "learned bias",
)
def compute_relative_index(
    spec: RelativeIndexSpec, device: torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """`index` (rows, cols) int64 and, with a table E (num_relative_distance, H),
    `bias = E[index].permute(2, 0, 1)` (H, rows, cols) in `dtype`: gathered head-major from E's
    transpose (H, num_relative_distance) straight into the (H, rows * cols) layout, one pass with
    no permuting copy (a gather selects values: bit-identical), then cast. E is the bound float32
    table (inline, or from the table store by key: `weights.resolve_tables`); a key-only spec
    never bound raises `UnknownTableError`."""
    index = relative_index(spec, device)
    tensors = {"index": index}
    if spec.scheme == "swinv2":
        wh, ww = spec.window()
        tensors["coords"] = swinv2_coords(wh, ww, spec.pretrained_window_size).to(device)
    if spec.named_table_shape() is not None:
        table = spec.require_bound().tensor.to(device)  # (num_relative_distance, H) float32
        heads = table.shape[1]
        by_head = table.t().contiguous()  # (H, num_relative_distance)
        gathered = empty((heads, index.numel()), torch.float32, device)
        torch.index_select(by_head, 1, index.reshape(-1), out=gathered)
        bias = gathered.view(heads, *index.shape)
        dtype = DTYPES[spec.dtype]
        if dtype != torch.float32:  # cast last, as the references do (`copy_` rounds as `.to`)
            bias = empty(tuple(bias.shape), dtype, device).copy_(bias)
        tensors["bias"] = bias
    facts: dict[str, Any] = {"num_relative_distance": spec.num_relative_distance()}
    return tensors, facts
