"""The vision towers' own rotary tables, from the installed transformers, for the vision_rope tests.

`rotary_classes()` enumerates every vision rotary module of the package from its modeling sources
(class names matching `PATTERN`; no hand list). `tower_tables(cls, config, spec)` runs the module
as its tower runs it for `spec`'s grid: the Qwen2-VL family through
`vision_utils.get_vision_position_ids` (and, where the modeling module calls
`get_vision_window_index`, the tower's own `permute_input_for_window_attn`; MiniMax-M3-VL with
its temporal axis), Pixtral over its
meshgrid, Llama 4's `freqs_ci` buffer, DINOv3's forward on a blank image in eval mode.
`applied(cls, q, k, cos, sin)` rotates q and k with the tower's own apply function.
"""

from __future__ import annotations

import importlib
import inspect
import re
import types
import typing
from pathlib import Path
from typing import Any

import torch

PATTERN = re.compile(
    r"^class (\w*(?:Vision|ViT|Vit|Dinov3)\w*(?:Rotary|Rope|RoPE)\w*Embedding)\(", re.M
)
"""Vision rotary class names: a vision tower's, or a DINOv3 backbone's (EoMT-DINOv3)."""


def _models_root() -> Path:
    import transformers

    return Path(transformers.__file__).resolve().parent / "models"


def rotary_classes() -> dict[str, str]:
    """Class name -> model directory, for every vision rotary module of the installed package."""
    found: dict[str, str] = {}
    for path in sorted(_models_root().glob("*/modeling_*.py")):
        for name in PATTERN.findall(path.read_text(encoding="utf-8")):
            found[name] = path.parent.name
    return found


def load(name: str, model_dir: str) -> tuple[type[Any], types.ModuleType]:
    module = importlib.import_module(f"transformers.models.{model_dir}.modeling_{model_dir}")
    return getattr(module, name), module


def config_class(cls: type[Any]) -> type[Any]:
    """The config class the rotary module's `__init__` is annotated with."""
    hints = typing.get_type_hints(cls.__init__)
    config: type[Any] = hints["config"]
    return config


def uses_window(module: types.ModuleType) -> bool:
    return "get_vision_window_index(" in inspect.getsource(module)


def _permute(module: types.ModuleType, table: torch.Tensor, merge: int, index: torch.Tensor) -> Any:
    for obj in vars(module).values():
        fn = getattr(obj, "permute_input_for_window_attn", None)
        if inspect.isclass(obj) and fn is not None:
            fake = types.SimpleNamespace(spatial_merge_unit=merge * merge)
            return fn(fake, table, index, seq_len=table.shape[0])
    raise AssertionError(f"{module.__name__} calls get_vision_window_index without a permute")


def tower_tables(
    name: str, model_dir: str, config: Any, spec: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) the tower applies for `spec`'s grid (llama4: freqs_ci's real and imaginary
    parts, (S*S + 1, D/2))."""
    from transformers.vision_utils import get_vision_position_ids, get_vision_window_index

    cls, module = load(name, model_dir)
    h, w = spec.grid_height, spec.grid_width
    if spec.style == "llama4":
        freqs = cls(config).freqs_ci[:, 0]
        return freqs.real, freqs.imag
    if spec.style == "dinov3":
        rope = cls(config).eval()
        p = config.patch_size
        cos, sin = rope(torch.zeros(1, 3, h * p, w * p, dtype=torch.float32))
        return cos, sin
    x = torch.zeros(1, dtype=torch.float32)
    if spec.style == "gemma4":
        cos, sin = cls(config)(x, gemma4_positions(h, w))
        return cos[0], sin[0]
    if spec.style == "pixtral":
        hp, wp = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        cos, sin = cls(config)(x, torch.stack([hp.flatten(), wp.flatten()], dim=-1))
        return cos, sin
    merge = config.spatial_merge_size
    grid = torch.tensor([[spec.frames or 1, h, w]])
    temporal = spec.style == "minimax_m3"  # MiniMaxM3VLVisionModel: include_temporal = True
    cos, sin = cls(config)(x, get_vision_position_ids(grid, merge, include_temporal=temporal))
    if uses_window(module):
        index, _ = get_vision_window_index(grid, merge, config.window_size, config.patch_size)
        cos, sin = (_permute(module, t, merge, index) for t in (cos, sin))
    return cos, sin


def gemma4_positions(h: int, w: int) -> torch.Tensor:
    """(1, H*W, 2) (x, y) positions as `Gemma4ImageProcessor` builds them (no padding rows)."""
    grid = torch.meshgrid(torch.arange(w), torch.arange(h), indexing="xy")
    return torch.stack(grid, dim=-1).reshape(1, h * w, 2)


def applied(
    name: str, model_dir: str, style: str, q: torch.Tensor, k: torch.Tensor, cos: Any, sin: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k (N, heads, D) rotated by the tower's own apply function with (cos, sin)."""
    _, module = load(name, model_dir)
    if style == "llama4":
        freqs = torch.complex(cos, sin)  # (N, D/2)
        # Llama4VisionAttention rotates (B, N, heads, D) before its transpose
        rq, rk = module.vision_apply_rotary_emb(q[None], k[None], freqs_ci=freqs)
        return rq[0], rk[0]
    if style == "gemma4":
        # Gemma4VisionAttention: (B, L, heads, D) with (B, L, D) tables and (B, L, 2) positions
        pos = torch.zeros(1, cos.shape[0], 2, dtype=torch.long)  # only its last axis (2) is read
        rq = module.apply_multidimensional_rope(q[None], cos[None], sin[None], pos)
        rk = module.apply_multidimensional_rope(k[None], cos[None], sin[None], pos)
        return rq[0], rk[0]
    if style == "dinov3":
        rq, rk = module.apply_rotary_pos_emb(q.transpose(0, 1), k.transpose(0, 1), cos, sin)
        return rq.transpose(0, 1), rk.transpose(0, 1)
    if style == "pixtral":
        q4, k4 = q.transpose(0, 1)[None], k.transpose(0, 1)[None]  # (1, heads, N, D)
        rq, rk = module.apply_rotary_pos_emb(q4, k4, cos, sin, unsqueeze_dim=0)
        return rq[0].transpose(0, 1), rk[0].transpose(0, 1)
    rq, rk = module.apply_rotary_pos_emb_vision(q, k, cos, sin)
    return rq, rk


def scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q.k per head: (heads, N, N)."""
    return torch.einsum("qhd,khd->hqk", q, k)
