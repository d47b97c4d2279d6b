"""The reference releases posenc's tables are proven equal to.

The suite (`make test`) runs against the environment pinned in `requirements/suite.txt`; its
reference tests compare every table with the code that defines its convention in these releases.
`tests/requirements/test_lock.py` keeps this mapping equal to the lock's pins, so a lock refresh
that forgets it fails the suite. The server reports it in `GET /v2` (server metadata), `GET
/v1/version`, and in every safetensors table's metadata (`verified_against`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

VERIFIED_AGAINST: Final[Mapping[str, str]] = MappingProxyType(
    {
        "transformers": "5.24.0",
        "timm": "1.0.31",
        "torch": "2.13.0",
        "onnxruntime": "1.32.0",
        "onnx": "1.23.2",
        "tritonclient": "2.73.0",
        "numpy": "2.4.6",
    }
)
"""Package name -> release (no local build label: torch's CPU and CUDA builds compute alike)."""


VERIFIED_AGAINST_TEXT: Final[str] = ", ".join(f"{n} {v}" for n, v in VERIFIED_AGAINST.items())
"""`"transformers 5.24.0, timm 1.0.31, ..."`: the mapping as one metadata string (built once; every
safetensors body carries it)."""


def verified_against_text() -> str:
    """`VERIFIED_AGAINST_TEXT`, the mapping as one metadata string."""
    return VERIFIED_AGAINST_TEXT
