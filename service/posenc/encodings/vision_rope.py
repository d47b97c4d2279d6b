"""2-D rotary tables of vision towers: the cos/sin each tower computes for its patch grid, rows in
the order the tower applies them, columns in its own layout (`style`).

Notation: head dim D, patch grid H x W (rows h, columns w), f = the tower's inverse frequencies,
products `float(position) * f` in fp32 as the reference module computes them, then cos/sin.

- "qwen2_vl": transformers' axial vision rotary of Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V and
  their copies (`Qwen2VLVisionRotaryEmbedding.compute_axial_rope_parameters` and `forward`;
  `vision_utils.get_vision_position_ids`). f = 1 / theta^(arange(0, D/2, 2) / (D/2)) (D/4
  values); per patch `[h*f, w*f]` (D/2), full width `cat(half, half)` (rotate-half pairing,
  `apply_rotary_pos_emb_vision`). Rows in spatial-merge order: the grid split into
  `spatial_merge_size` x `spatial_merge_size` blocks, blocks row-major, patches row-major inside
  each block; `frames` > 1 repeats the frame's rows per frame (video). With `window_size` and
  `patch_size` (Qwen2.5-VL) the rows are then permuted in merge units of m*m rows by
  `vision_utils.get_vision_window_index`, as `Qwen2_5_VisionTransformerPretrainedModel.
  permute_input_for_window_attn` permutes cos and sin: the table is in the order the blocks see
  the hidden states (the merger output is restored with argsort of that index).
- "minimax_m3": `MiniMaxM3VLVisionRotaryEmbedding` (MiniMax-M3-VL), the 3-D form: positions
  (t, h, w) from `get_vision_position_ids(..., include_temporal=True)` (t the frame index, h and w
  in merge-block order as above), S = 2*((D//3)//2), f = 1 / theta^(arange(0, S, 2) / S) (S/2
  values), per patch `[t*f, h*f, w*f]` (3S/2), full width `cat(., .)` = 3S <= D: the tower
  rotates the first 3S dims (rotate-half) and passes the other D - 3S through
  (`apply_rotary_pos_emb_vision`).
- "gemma4": `Gemma4VisionRotaryEmbedding` (Gemma 4's vision tower): f as qwen2_vl; positions
  (x, y) = (column, row) from `Gemma4ImageProcessor` (`meshgrid(arange(W), arange(H),
  indexing="xy")`, rows row-major); full width `cat(x*f, x*f, y*f, y*f)`, applied by
  `apply_multidimensional_rope`: dims [0, D/2) rotate by x and [D/2, D) by y, each block
  rotate-half within itself. Half width is `[x*f, y*f]`. The processor pads every image to
  `max_patches` rows at position (-1, -1), masked out of attention: not part of the table.
- "pixtral": `PixtralVisionRotaryEmbedding` (Pixtral, Mistral 3's vision tower): f = 1 /
  theta^(arange(0, D, 2) / D) (D/2 values); per patch `[h*f[0::2], w*f[1::2]]` (D/2), full width
  `cat(half, half)` (rotate-half, `apply_rotary_pos_emb`); rows row-major over the image's
  patches (`PixtralVisionModel.forward`'s meshgrid). Each image of a batch has its own grid.
- "llama4": `Llama4VisionRotaryEmbedding._compute_freqs_ci`: a square grid of side S = image_size
  // patch_size, f = 1 / theta^(arange(0, D/2, 2)[:D/4] / (D/2)); per patch
  `[(x+1)*f, (y+1)*f]` (D/2; x the column, y the row), rows row-major, then the class token as the
  last row with angle 0 (cos 1, sin 0: `masked_fill` of ID_CLS_TOKEN). The tower multiplies
  complex pairs (2i, 2i+1) by `freqs_ci = view_as_complex(stack([cos, sin], -1))`
  (`vision_apply_rotary_emb`): half width is (S*S + 1, D/2) with cos/sin the real and imaginary
  parts, full width repeats each value twice (interleaved pairing).
- "dinov3": `DINOv3ViTRopePositionEmbedding` (DINOv3 ViT, inference: the training-time
  augmentation of the coordinates is off): f = 1 / theta^arange(0, 1, 4/D) (D/4 values), patch
  centres normalised to [-1, 1] (`get_patches_center_coordinates`: `(arange(0.5, n) / n) * 2 -
  1`), angles `2*pi * [y, x] * f` (D/2), full width `tile(2)` (rotate-half). Rows row-major over
  the patches only: the class and register tokens before them are not rotated
  (`apply_rotary_pos_emb` splits them off).

The reference computes in fp32 (`precision` reference only); Qwen-style towers apply the fp32
table, Pixtral and DINOv3 cast it to the activation dtype: `dtype` casts last.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, NoReturn, Self

import torch
from pydantic import Field, model_validator

from posenc.encodings.base import DTYPES, SpecBase, TensorInfo, register_family
from posenc.encodings.errors import FieldProblem, SpecError

MAX_SIDE = 1 << 12
MAX_FRAMES = 1 << 12
MAX_HEAD_DIM = 8192

Style = Literal["qwen2_vl", "minimax_m3", "gemma4", "pixtral", "llama4", "dinov3"]
Width = Literal["full", "half"]
FloatDtype = Literal["float32", "float16", "bfloat16"]

DEFAULT_THETA: dict[str, float] = {
    "qwen2_vl": 10000.0,
    "minimax_m3": 10000.0,
    "gemma4": 100.0,
    "pixtral": 10000.0,
    "llama4": 10000.0,
    "dinov3": 100.0,
}
"""The config classes' default `rope_theta` (DINOv3ViTConfig and Gemma4VisionConfig: 100)."""
DEFAULT_WIDTH: dict[str, str] = {
    "qwen2_vl": "full",
    "minimax_m3": "full",
    "gemma4": "full",
    "pixtral": "full",
    "llama4": "half",
    "dinov3": "full",
}
"""The layout each tower itself applies (Llama 4: complex pairs, one value per pair)."""
QWEN_FIELDS = ("spatial_merge_size", "frames", "window_size", "patch_size")
MERGE_STYLES = ("qwen2_vl", "minimax_m3")
"""Styles whose rows follow `get_vision_position_ids` (merge blocks, frames)."""

Side = Annotated[int, Field(ge=1, le=MAX_SIDE)]


def _bad(field: str, message: str, value: Any) -> NoReturn:
    raise SpecError("invalid vision_rope spec", [FieldProblem(field, message, value)])


class VisionRopeSpec(SpecBase):
    """cos and sin (N, w) of one image's patch grid in a vision tower's order and layout (module
    docstring). N = frames * grid_height * grid_width (qwen2_vl, minimax_m3), grid_height *
    grid_width + 1 (llama4: class token last), grid_height * grid_width (pixtral, dinov3); w =
    the rotated width R (head_dim; minimax_m3: 3 * 2 * ((head_dim // 3) // 2)) when full, R / 2
    when half."""

    kind: Literal["vision_rope"] = "vision_rope"
    style: Style
    head_dim: Annotated[int, Field(ge=4, le=MAX_HEAD_DIM)]
    grid_height: Side
    grid_width: Side
    rope_theta: Annotated[float | None, Field(gt=0.0)] = None
    spatial_merge_size: Annotated[int | None, Field(ge=1, le=64)] = None
    frames: Annotated[int | None, Field(ge=1, le=MAX_FRAMES)] = None
    window_size: Annotated[int | None, Field(ge=1, le=1 << 20)] = None
    patch_size: Annotated[int | None, Field(ge=1, le=1 << 12)] = None
    width: Width | None = None
    dtype: FloatDtype = "float32"

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.style == "minimax_m3":
            if self.head_dim < 6:
                _bad("head_dim", "must be >= 6 for minimax_m3 (three axes of pairs)", self.head_dim)
        elif self.head_dim % 4:
            _bad("head_dim", "must be divisible by 4 (two axes of cos/sin pairs)", self.head_dim)
        for name in QWEN_FIELDS:
            value = getattr(self, name)
            if value is None or self.style == "qwen2_vl":
                continue
            if self.style != "minimax_m3" or name in ("window_size", "patch_size"):
                applies = (
                    "qwen2_vl" if name in ("window_size", "patch_size") else "qwen2_vl, minimax_m3"
                )
                _bad(name, f"applies to style {applies} only", value)
        if self.style == "llama4" and self.grid_height != self.grid_width:
            _bad(
                "grid_width",
                "llama4 builds a square grid of image_size // patch_size: must equal grid_height",
                self.grid_width,
            )
        if self.style in MERGE_STYLES:
            self._check_qwen()
        return self

    def _check_qwen(self) -> None:
        merge = self.spatial_merge_size or 2
        for name in ("grid_height", "grid_width"):
            if getattr(self, name) % merge:
                _bad(
                    name,
                    f"must be a multiple of spatial_merge_size={merge} (the tower reshapes the "
                    "grid into merge blocks)",
                    getattr(self, name),
                )
        if (self.window_size is None) != (self.patch_size is None):
            name = "patch_size" if self.patch_size is None else "window_size"
            _bad(name, "window_size and patch_size go together (the Qwen2.5-VL window order)", None)
        if (
            self.window_size is not None
            and self.window_size // merge // int(self.patch_size or 1) < 1
        ):
            _bad(
                "window_size",
                f"window_size // spatial_merge_size // patch_size must be >= 1 (merge={merge}, "
                f"patch_size={self.patch_size})",
                self.window_size,
            )

    def canonical(self) -> Self:
        update: dict[str, Any] = {
            "rope_theta": DEFAULT_THETA[self.style]
            if self.rope_theta is None
            else float(self.rope_theta),
            "width": self.width or DEFAULT_WIDTH[self.style],
        }
        if self.style in MERGE_STYLES:
            update["spatial_merge_size"] = self.spatial_merge_size or 2
            update["frames"] = self.frames or 1
        return self.model_copy(update=update)

    def rows(self) -> int:
        """N: the tokens the tower rotates (module docstring)."""
        patches = self.grid_height * self.grid_width
        if self.style in MERGE_STYLES:
            return patches * (self.frames or 1)
        return patches + (1 if self.style == "llama4" else 0)

    def rotary_width(self) -> int:
        """R: the head dims the tower rotates (all of them but in minimax_m3)."""
        if self.style == "minimax_m3":
            return 3 * 2 * ((self.head_dim // 3) // 2)
        return self.head_dim

    def outputs(self) -> dict[str, TensorInfo]:
        width = self.width or DEFAULT_WIDTH[self.style]
        rotated = self.rotary_width()
        cols = rotated if width == "full" else rotated // 2
        info = TensorInfo((self.rows(), cols), self.dtype, row_axis=0)
        return {"cos": info, "sin": info}


def merge_order(height: int, width: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, w) int64 positions (H*W,) in spatial-merge block order (`get_vision_position_ids`)."""
    hpos, wpos = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    block = (height // merge, merge, width // merge, merge)
    return (
        hpos.reshape(block).transpose(1, 2).flatten(),
        wpos.reshape(block).transpose(1, 2).flatten(),
    )


def window_index(frames: int, height: int, width: int, merge: int, window: int) -> torch.Tensor:
    """Merge-unit permutation (frames * H/m * W/m,) of `vision_utils.get_vision_window_index` for
    one grid; `window` = window_size // spatial_merge_size // patch_size (in merge units)."""
    gh, gw = height // merge, width // merge
    index = torch.arange(frames * gh * gw).reshape(frames, gh, gw)
    pad_h, pad_w = window - gh % window, window - gw % window
    nh, nw = (gh + pad_h) // window, (gw + pad_w) // window
    padded = torch.nn.functional.pad(index, (0, pad_w, 0, pad_h), "constant", -100)
    padded = padded.reshape(frames, nh, window, nw, window).permute(0, 1, 3, 2, 4).reshape(-1)
    return padded[padded != -100]


Pair = tuple[torch.Tensor, torch.Tensor]


def _trig(angles: torch.Tensor) -> Pair:
    """cos and sin of `angles` as the towers take them (`freqs.cos() * attention_scaling`, the
    scaling being 1.0: an exact product). The element order and shape of `angles` are the
    reference's, so that the vectorised and scalar parts of the CPU kernels see the same values."""
    return torch.cos(angles), torch.sin(angles)


def _qwen(spec: VisionRopeSpec, device: torch.device) -> Pair:
    """Full-width (N, D) `cat(h*f, w*f, h*f, w*f)` in the tower's row order."""
    spatial = spec.head_dim // 2
    inv = 1.0 / (
        float(spec.rope_theta or 0.0) ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial)
    )
    merge = int(spec.spatial_merge_size or 2)
    frames = int(spec.frames or 1)
    hpos, wpos = merge_order(spec.grid_height, spec.grid_width, merge)
    positions = torch.stack([hpos, wpos], dim=-1).repeat(frames, 1).to(device)  # (N, 2)
    freqs = positions[..., None].float() * inv.to(device)  # (N, 2, D/4)
    out = []
    for table in _trig(freqs):
        hw = torch.cat([table[:, 0], table[:, 1]], dim=-1)  # (N, D/2)
        full = torch.cat([hw, hw], dim=-1)  # (N, D)
        if spec.window_size is not None:
            unit = merge * merge
            window = int(spec.window_size) // merge // int(spec.patch_size or 1)
            order = window_index(frames, spec.grid_height, spec.grid_width, merge, window)
            full = full.reshape(-1, unit, spec.head_dim)[order.to(device)]
            full = full.reshape(-1, spec.head_dim)
        out.append(full)
    return out[0], out[1]


def _minimax(spec: VisionRopeSpec, device: torch.device) -> Pair:
    """Full-width (N, 3S) `cat(t*f, h*f, w*f, t*f, h*f, w*f)` in the tower's row order."""
    spatial = 2 * ((spec.head_dim // 3) // 2)
    inv = 1.0 / (
        float(spec.rope_theta or 0.0) ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial)
    )
    merge = int(spec.spatial_merge_size or 2)
    frames = int(spec.frames or 1)
    hpos, wpos = merge_order(spec.grid_height, spec.grid_width, merge)
    tpos = torch.arange(frames).repeat_interleave(spec.grid_height * spec.grid_width)
    positions = torch.stack([tpos, hpos.repeat(frames), wpos.repeat(frames)], dim=-1)  # (N, 3)
    freqs = positions.to(device)[..., None].float() * inv.to(device)  # (N, 3, S/2)
    out = []
    for table in _trig(freqs):
        flat = table.flatten(1)  # (N, 3S/2)
        out.append(torch.cat([flat, flat], dim=-1))
    return out[0], out[1]


def _gemma4(spec: VisionRopeSpec, device: torch.device) -> Pair:
    """Full-width (H*W, D) `cat(x*f, x*f, y*f, y*f)`, rows row-major, x the column."""
    spatial = spec.head_dim // 2
    inv = 1.0 / (
        float(spec.rope_theta or 0.0) ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial)
    )
    xs, ys = torch.meshgrid(
        torch.arange(spec.grid_width), torch.arange(spec.grid_height), indexing="xy"
    )
    positions = torch.stack([xs, ys], dim=-1).reshape(-1, 2).to(device)  # (N, 2): (x, y)
    freqs = positions[..., None].float() * inv.to(device)  # (N, 2, D/4)
    out = []
    for table in _trig(freqs):
        x, y = table[:, 0], table[:, 1]
        out.append(torch.cat([x, x, y, y], dim=-1))
    return out[0], out[1]


def _pixtral(spec: VisionRopeSpec, device: torch.device) -> Pair:
    """Full-width (H*W, D) `cat(h*f[0::2], w*f[1::2])` twice, rows row-major."""
    dim = spec.head_dim
    inv = 1.0 / (
        float(spec.rope_theta or 0.0) ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    )
    inv_2d = torch.cat([inv[0::2], inv[1::2]]).to(device)  # (D/2,)
    hpos, wpos = torch.meshgrid(
        torch.arange(spec.grid_height), torch.arange(spec.grid_width), indexing="ij"
    )
    positions = torch.stack([hpos.flatten(), wpos.flatten()], dim=-1).to(device)  # (N, 2)
    freqs = positions[..., None].float() * inv_2d  # (N, 2, D/2): every product, as the tower
    out = []
    for table in _trig(freqs):
        first, second = table.chunk(2, dim=-1)
        hw = torch.cat([first[:, 0], second[:, 1]], dim=-1)  # (N, D/2)
        out.append(torch.cat([hw, hw], dim=-1))
    return out[0], out[1]


def _llama4(spec: VisionRopeSpec, device: torch.device) -> Pair:
    """Half-width (S*S + 1, D/2) `[(x+1)*f, (y+1)*f]`, the class token's zero angles last."""
    side = spec.grid_height
    freq_dim = spec.head_dim // 2
    img_idx = torch.arange(side * side, dtype=torch.int32).reshape(side * side, 1)
    img_idx = torch.cat([img_idx, img_idx[:1]], dim=0)
    img_idx[-1, -1] = -2  # ID_CLS_TOKEN
    img_idx = img_idx.to(device)
    frequencies_x = img_idx % side
    frequencies_y = img_idx // side
    rope_freq = 1.0 / (
        float(spec.rope_theta or 0.0)
        ** (torch.arange(0, freq_dim, 2)[: (freq_dim // 2)].float() / freq_dim)
    )
    rope_freq = rope_freq.to(device)
    freqs_x = ((frequencies_x + 1)[..., None] * rope_freq[None, None, :]).repeat_interleave(2, -1)
    freqs_y = ((frequencies_y + 1)[..., None] * rope_freq[None, None, :]).repeat_interleave(2, -1)
    freqs = torch.cat([freqs_x, freqs_y], dim=-1).float().contiguous()[..., ::2]
    freqs = freqs.masked_fill(img_idx.reshape(-1, 1, 1) < 0, 0)  # (S*S + 1, 1, D/2)
    cos, sin = _trig(freqs)
    return cos[:, 0], sin[:, 0]


def _dinov3(spec: VisionRopeSpec, device: torch.device) -> Pair:
    """Full-width (H*W, D) `tile(2*pi * [y, x] * f, 2)` over the normalised patch centres.

    Computed on the CPU whatever `device`, then moved: on an H200 (docs/gpu.md, second run) the
    GPU's table departed from the CPU's (and transformers') by more than 2 ulps, and the table
    (H*W patches) is small."""
    cos, sin = _dinov3_cpu(spec)
    return cos.to(device), sin.to(device)


def _dinov3_cpu(spec: VisionRopeSpec) -> Pair:
    """`_dinov3` on the CPU, as `DINOv3ViTRopePositionEmbedding` computes it."""
    inv = 1 / float(spec.rope_theta or 0.0) ** torch.arange(
        0, 1, 4 / spec.head_dim, dtype=torch.float32
    )
    coords_h = torch.arange(0.5, spec.grid_height, dtype=torch.float32)
    coords_w = torch.arange(0.5, spec.grid_width, dtype=torch.float32)
    coords_h = coords_h / spec.grid_height
    coords_w = coords_w / spec.grid_width
    coords = torch.stack(torch.meshgrid(coords_h, coords_w, indexing="ij"), dim=-1).flatten(0, 1)
    coords = 2.0 * coords - 1.0
    angles = 2 * math.pi * coords[:, :, None] * inv[None, None, :]  # (N, 2, D/4)
    return _trig(angles.flatten(1, 2).tile(2))


_TABLES = {
    "qwen2_vl": _qwen,
    "minimax_m3": _minimax,
    "gemma4": _gemma4,
    "pixtral": _pixtral,
    "llama4": _llama4,
    "dinov3": _dinov3,
}


@register_family(
    "vision_rope",
    VisionRopeSpec,
    "2-D and 3-D rotary cos/sin of vision towers (Qwen2-VL family, MiniMax-M3-VL, Gemma 4, "
    "Pixtral, Llama 4, DINOv3)",
)
def compute_vision_rope(
    spec: VisionRopeSpec, device: torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """`cos`, `sin` (N, w) for a canonical spec: the tower's fp32 table, then the width, cast
    last."""
    out = {}
    native = DEFAULT_WIDTH[spec.style]
    for name, table in zip(("cos", "sin"), _TABLES[spec.style](spec, device), strict=True):
        if spec.width != native:
            # llama4 -> full: each complex pair's value twice; the others -> half: the first
            # copy of cat(c, c) / tile(c, 2)
            half = spec.rotary_width() // 2
            if native == "half":
                table = table.repeat_interleave(2, dim=-1)
            elif spec.style == "gemma4":  # one copy of each axis block: [x*f, y*f]
                quarter = half // 2
                table = torch.cat([table[:, :quarter], table[:, half : half + quarter]], dim=-1)
            else:
                table = table[:, :half]
        out[name] = table.to(DTYPES[spec.dtype])
    pairing = {"llama4": "interleaved", "gemma4": "half_split_per_axis"}.get(
        spec.style, "half_split"
    )
    facts = {"style": spec.style, "rows": spec.rows(), "pairing": pairing}
    return out, facts | {"rotary_width": spec.rotary_width()}
