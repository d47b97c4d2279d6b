"""2-D sinusoidal position tables for image grids, in three published layouts (`style`).

- "detr": DETR's sine embedding (Carion et al. 2020; transformers `DetrSinePositionEmbedding`,
  `DeformableDetrSinePositionEmbedding`, DINO's `PositionEmbeddingSineHW`). The padded feature
  grid is `height` x `width`; the valid (unpadded) pixels are the top-left `valid_height` x
  `valid_width` block. Coordinates are the cumulative sums of that mask (1-based); with `normalize`
  they become `(c + offset) / (c_last + eps) * scale` (offset -0.5 in Deformable DETR). Channel
  `2i` of an axis is `sin(c / t^(2i/F))`, `2i+1` is `cos(c / t^(2i/F))`, F = `num_pos_feats`; the y
  block comes first. Output `embedding` (2F, H, W): DETR's (B, 2F, H, W) channel-first layout
  without the batch axis. Positions in the padding get the values DETR computes there (cumsum of
  the mask: 0 in padded columns, the valid extent in padded rows). Sizes are at feature-map
  resolution (DETR resizes the pixel mask to the feature map with nearest interpolation first).
  DINO and Grounding DINO use temperature 20 (`pe_temperatureH/W`,
  `positional_embedding_temperature`). transformers builds this table in the activation dtype
  (fp16 models: fp16 arithmetic); here it is computed in fp32 and cast last (4.7e-3 apart in
  fp16 at 25x34, F=128).
- "mae": MAE `get_2d_sincos_pos_embed` (He et al. 2021; transformers
  `modeling_vit_mae.build_2d_sinusoidal_position_embedding` plus the half rotation in
  `ViTMAEEmbeddings.initialize_weights`): float64, omega = 1 / t^(k/(D/4)), per token
  `[sin(x w), cos(x w), sin(y w), cos(y w)]` with x the column and y the row (MAE's meshgrid
  order quirk), tokens row-major; an optional zero `cls_token` row first. Output (H*W [+1], D).
- "timm": timm `layers/pos_embed_sincos.build_sincos2d_pos_embed`: float32 bands
  `1 / t^(k/(D/4))`, default per token `[sin y, sin x, cos y, cos x]`; `interleave_sin_cos` gives
  `[sin y, cos y, sin x, cos x]`; `reverse_coord` swaps the axes (coordinates (x, y) and tokens
  column-major, as timm's `feat_shape[::-1]` does). Output (H*W, D).

Fields of one style are rejected on another. Each style computes in its reference precision by
default (detr/timm float32, mae float64); `compute_dtype` float64 runs the same op order in float64
(the "exact" mode); the table is cast to `dtype` last.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Self

import torch
from pydantic import Field, model_validator

from posenc.encodings.base import DTYPES, SpecBase, TensorInfo, register_family
from posenc.encodings.memory import empty
from posenc.encodings.sinusoidal import ComputeDtype, FloatDtype, raise_field_errors

MAX_SIDE = 1 << 14
MAX_DIM = 65536

Style = Literal["detr", "mae", "timm"]

DETR_FIELDS = (
    "num_pos_feats",
    "height",
    "width",
    "valid_height",
    "valid_width",
    "temperature_h",
    "temperature_w",
    "normalize",
    "scale",
    "offset",
    "eps",
)
GRID_FIELDS = ("dim", "grid_height", "grid_width")
STYLE_FIELDS: dict[str, tuple[str, ...]] = {
    "detr": (*DETR_FIELDS, "temperature"),
    "mae": (*GRID_FIELDS, "temperature", "cls_token"),
    "timm": (*GRID_FIELDS, "temperature", "reverse_coord", "interleave_sin_cos"),
}
REQUIRED: dict[str, tuple[str, ...]] = {
    "detr": ("num_pos_feats", "height", "width"),
    "mae": GRID_FIELDS,
    "timm": GRID_FIELDS,
}
OPTIONAL_FIELDS = (*DETR_FIELDS, *GRID_FIELDS, "cls_token", "reverse_coord", "interleave_sin_cos")
DEFAULT_COMPUTE: dict[str, str] = {"detr": "float32", "mae": "float64", "timm": "float32"}

Side = Annotated[int | None, Field(ge=1, le=MAX_SIDE)]
Temperature = Annotated[float | None, Field(gt=0.0)]


class Sinusoidal2DSpec(SpecBase):
    """Fixed 2-D sine/cosine position table `embedding`; layout per `style` (module docstring).

    Shapes: detr (2 * num_pos_feats, height, width); mae (grid_height * grid_width [+1], dim);
    timm (grid_height * grid_width, dim).
    """

    kind: Literal["sinusoidal_2d"] = "sinusoidal_2d"
    style: Style
    # detr
    num_pos_feats: Annotated[int | None, Field(ge=2, le=MAX_DIM)] = None
    height: Side = None
    width: Side = None
    valid_height: Annotated[int | None, Field(ge=0, le=MAX_SIDE)] = None
    valid_width: Annotated[int | None, Field(ge=0, le=MAX_SIDE)] = None
    temperature_h: Temperature = None
    temperature_w: Temperature = None
    normalize: bool | None = None
    scale: float | None = None
    offset: float | None = None
    eps: Annotated[float | None, Field(gt=0.0)] = None
    # mae / timm
    dim: Annotated[int | None, Field(ge=4, le=MAX_DIM)] = None
    grid_height: Side = None
    grid_width: Side = None
    cls_token: bool | None = None
    reverse_coord: bool | None = None
    interleave_sin_cos: bool | None = None
    # all styles
    temperature: Temperature = None
    compute_dtype: ComputeDtype | None = None
    dtype: FloatDtype | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        style = self.style
        allowed = STYLE_FIELDS[style]
        problems: list[tuple[str, str, Any]] = [
            (name, f"does not apply to style {style!r} (fields: {', '.join(allowed)})", value)
            for name in OPTIONAL_FIELDS
            if name not in allowed and (value := getattr(self, name)) is not None
        ]
        problems += [
            (name, f"required for style {style!r}", None)
            for name in REQUIRED[style]
            if getattr(self, name) is None
        ]
        if not problems:
            problems = self._check_detr() if style == "detr" else self._check_grid()
        if problems:
            raise_field_errors("Sinusoidal2DSpec", problems)
        return self

    def _check_grid(self) -> list[tuple[str, str, Any]]:
        if int(self.dim or 0) % 4:
            return [("dim", f"must be divisible by 4 for style {self.style!r}", self.dim)]
        return []

    def _check_detr(self) -> list[tuple[str, str, Any]]:
        problems: list[tuple[str, str, Any]] = []
        if int(self.num_pos_feats or 0) % 2:
            problems.append(("num_pos_feats", "must be even (sin/cos pairs)", self.num_pos_feats))
        for name, side in (("valid_height", "height"), ("valid_width", "width")):
            value, limit = getattr(self, name), int(getattr(self, side) or 0)
            if value is not None and value > limit:
                problems.append((name, f"must be in [0, {side}={limit}]", value))
        if self.temperature is not None and (
            self.temperature_h is not None or self.temperature_w is not None
        ):
            problems.append(
                ("temperature", "give temperature or temperature_h/_w, not both", self.temperature)
            )
        if not self.normalize:
            # transformers raises "normalize should be True if scale is passed".
            problems += [
                (name, "applies only with normalize=true", value)
                for name in ("scale", "offset", "eps")
                if (value := getattr(self, name)) is not None
            ]
        return problems

    def canonical(self) -> Self:
        update: dict[str, Any] = {
            "compute_dtype": self.compute_dtype or DEFAULT_COMPUTE[self.style],
            "dtype": self.dtype or "float32",
        }
        if self.style == "detr":
            t = 10000.0 if self.temperature is None else float(self.temperature)
            vh = self.height if self.valid_height is None else self.valid_height
            vw = self.width if self.valid_width is None else self.valid_width
            if not vh or not vw:
                vh, vw = 0, 0  # an empty valid block is empty whichever side is zero
            normalize = bool(self.normalize)
            update |= {
                "temperature": None,
                "temperature_h": t if self.temperature_h is None else float(self.temperature_h),
                "temperature_w": t if self.temperature_w is None else float(self.temperature_w),
                "valid_height": vh,
                "valid_width": vw,
                "normalize": normalize,
                "scale": (2 * math.pi if self.scale is None else float(self.scale))
                if normalize
                else None,
                "offset": (0.0 if self.offset is None else float(self.offset))
                if normalize
                else None,
                "eps": (1e-6 if self.eps is None else float(self.eps)) if normalize else None,
            }
        else:
            update["temperature"] = 10000.0 if self.temperature is None else float(self.temperature)
            if self.style == "mae":
                update["cls_token"] = bool(self.cls_token)
            else:
                update["reverse_coord"] = bool(self.reverse_coord)
                update["interleave_sin_cos"] = bool(self.interleave_sin_cos)
        return self.model_copy(update=update)

    def cache_precision(self) -> str:
        """This family's precision is its compute dtype (float32 or float64)."""
        return self.compute_dtype or DEFAULT_COMPUTE[self.style]

    def outputs(self) -> dict[str, TensorInfo]:
        dtype = self.dtype or "float32"
        shape: tuple[int, ...]
        if self.style == "detr":
            shape = (2 * int(self.num_pos_feats or 0), int(self.height or 0), int(self.width or 0))
        else:
            tokens = int(self.grid_height or 0) * int(self.grid_width or 0)
            shape = (tokens + int(bool(self.cls_token)), int(self.dim or 0))
        return {"embedding": TensorInfo(shape, dtype)}


def _dtype(spec: Sinusoidal2DSpec) -> torch.dtype:
    return torch.float64 if spec.compute_dtype == "float64" else torch.float32


def detr_embedding(spec: Sinusoidal2DSpec, device: torch.device) -> torch.Tensor:
    """(2F, H, W) in the compute dtype, in transformers `DetrSinePositionEmbedding`'s op order.

    `build_sine_position_embedding`: mask cumsums, optional normalisation
    `(c + offset) / (c_last + eps) * scale`, `dim_t = t ** (2 * (i // 2) / F)`, `c / dim_t`, sin of
    the even channels and cos of the odd ones stacked pairwise, `cat(pos_y, pos_x)`.
    """
    dt = _dtype(spec)
    height, width = int(spec.height or 0), int(spec.width or 0)
    feats = int(spec.num_pos_feats or 0)
    mask = torch.zeros(height, width, dtype=dt, device=device)
    mask[: int(spec.valid_height or 0), : int(spec.valid_width or 0)] = 1
    y_embed = mask.cumsum(0)
    x_embed = mask.cumsum(1)
    if spec.normalize:
        eps, scale, offset = float(spec.eps or 0.0), float(spec.scale or 0.0), spec.offset
        y_num = y_embed if not offset else y_embed + offset
        x_num = x_embed if not offset else x_embed + offset
        y_embed = y_num / (y_embed[-1:, :] + eps) * scale
        x_embed = x_num / (x_embed[:, -1:] + eps) * scale
    # dim_t (F,) is computed on the CPU and moved: CUDA's pow differs by an ulp on some elements
    i = torch.arange(feats, dtype=torch.int64).to(dt)
    exponent = 2 * torch.div(i, 2, rounding_mode="floor") / feats
    # written channel-first, (2F, H, W) as served, instead of DETR's (H, W, 2F) then permuted:
    # channels 2c (sin) and 2c+1 (cos) divide by the same dim_t value (equal exponents), so the
    # quotient is computed once per pair
    table = empty((2 * feats, height, width), dt, device)
    for block, coord, temperature in (
        (table[:feats], y_embed, spec.temperature_h),
        (table[feats:], x_embed, spec.temperature_w),
    ):
        dim_t = (float(temperature or 0.0) ** exponent).to(device)
        pos = coord[None, :, :] / dim_t[0::2, None, None]  # (F/2, H, W)
        torch.sin(pos, out=block[0::2])
        torch.cos(pos, out=block[1::2])
    return table


def mae_embedding(spec: Sinusoidal2DSpec, device: torch.device) -> torch.Tensor:
    """(H*W [+1], D): `build_2d_sinusoidal_position_embedding` with ViTMAE's half rotation.

    omega = 1 / t ** (k / (D/4)); per token [sin(x w), cos(x w), sin(y w), cos(y w)], tokens
    row-major (H outer), an optional zero cls row first. Computed in the compute dtype and
    returned already cast to the spec's dtype.
    """
    dt = _dtype(spec)
    dim = int(spec.dim or 0)
    pos_dim = dim // 4
    omega = torch.arange(pos_dim, dtype=dt) / pos_dim  # on the CPU, as detr_embedding's dim_t
    omega = (1.0 / float(spec.temperature or 0.0) ** omega).to(device)
    grid_h = torch.arange(int(spec.grid_height or 0), dtype=dt, device=device)
    grid_w = torch.arange(int(spec.grid_width or 0), dtype=dt, device=device)
    grid_h, grid_w = torch.meshgrid(grid_h, grid_w, indexing="ij")
    emb_h = grid_h.flatten().outer(omega)
    emb_w = grid_w.flatten().outer(omega)
    # each block is written into the output dtype directly (copy_ rounds as .to() does)
    cls = int(bool(spec.cls_token))
    table = empty((cls + emb_w.shape[0], dim), DTYPES[str(spec.dtype)], device)
    if cls:
        table[0] = 0.0
    for n, block in enumerate((emb_w.sin(), emb_w.cos(), emb_h.sin(), emb_h.cos())):
        table[cls:, n * pos_dim : (n + 1) * pos_dim] = block
    return table


def timm_embedding(spec: Sinusoidal2DSpec, device: torch.device) -> torch.Tensor:
    """(H*W, D): timm `build_sincos2d_pos_embed` (bands `1 / t ** (k / (D/4))`, ndgrid coords)."""
    dt = _dtype(spec)
    pos_dim = int(spec.dim or 0) // 4
    exp = torch.arange(0, pos_dim, 1, dtype=torch.int64).to(dt) / pos_dim  # CPU: see detr_embedding
    bands = (1.0 / (float(spec.temperature or 0.0) ** exp)).to(device)
    shape = [int(spec.grid_height or 0), int(spec.grid_width or 0)]
    if spec.reverse_coord:
        shape = shape[::-1]
    axes = [torch.arange(s, dtype=torch.int64, device=device).to(dt) for s in shape]
    grid = torch.stack(torch.meshgrid(axes, indexing="ij")).flatten(1).transpose(0, 1)
    pos2 = grid.unsqueeze(-1) * bands.unsqueeze(0)
    stack_dim = 2 if spec.interleave_sin_cos else 1
    return torch.stack([torch.sin(pos2), torch.cos(pos2)], dim=stack_dim).flatten(1)


_STYLES = {"detr": detr_embedding, "mae": mae_embedding, "timm": timm_embedding}


@register_family(
    "sinusoidal_2d",
    Sinusoidal2DSpec,
    "2-D sine/cosine tables for image grids: DETR (padded masks), MAE, timm",
)
def compute_sinusoidal_2d(
    spec: Sinusoidal2DSpec, device: torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """`embedding` for a canonical spec (shape per style, see the class docstring)."""
    table = _STYLES[spec.style](spec, device)
    return {"embedding": table.to(DTYPES[str(spec.dtype)])}, {"style": spec.style}
