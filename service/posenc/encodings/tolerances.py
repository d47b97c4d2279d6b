"""Comparison tolerances per dtype (field guide section 0), read by the ONNX exporters' own
verification (`posenc.onnx._registry`) and published by `/v1/kinds` for the explorer, without
importing the ONNX stack."""

from __future__ import annotations

ATOL: dict[str, float] = {
    "float64": 1e-12,
    "float32": 2.4e-7,
    "float16": 2e-3,
    "bfloat16": 1.6e-2,
}
"""Absolute tolerance for O(1) values per dtype, about 2 ulp at 1.0: the table of
`tests/tolerances.py` (a test keeps the two equal), here because the service verifies too."""
