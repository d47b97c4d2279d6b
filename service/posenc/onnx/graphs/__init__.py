"""The graph modules, one per encoding family; importing them registers their exporters."""

from posenc.onnx.graphs import alibi, rope, sinusoidal, sinusoidal_2d, t5_bias

__all__ = ["alibi", "rope", "sinusoidal", "sinusoidal_2d", "t5_bias"]
