"""The graph modules, one per encoding family; importing them registers their exporters."""

from posenc.onnx.graphs import (
    alibi,
    cope,
    learned,
    normalized,
    relative_index,
    rope,
    sinusoidal,
    sinusoidal_2d,
    t5_bias,
    vision_rope,
    xpos,
)

__all__ = [
    "alibi",
    "cope",
    "learned",
    "normalized",
    "relative_index",
    "rope",
    "sinusoidal",
    "sinusoidal_2d",
    "t5_bias",
    "vision_rope",
    "xpos",
]
