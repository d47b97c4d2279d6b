"""posenc: exact position tables for transformer attention, served over HTTP and as ONNX graphs."""

__version__ = "0.1.0"
