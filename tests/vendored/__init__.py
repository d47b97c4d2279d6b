"""Upstream reference code kept byte for byte, for references that do not install with the lock.

A file here is the published file itself, not a transcription: `tests/test_vendored.py` holds
each one to the sha256 its published distribution records, so an edit (even a reformat) fails.
Ruff skips this folder (pyproject.toml); the tests import the code as it was published.

`SOURCES` maps each vendored file (relative to this folder) to where it comes from and its
sha256 in the wheel's RECORD notation (urlsafe base64, no padding).
"""

from __future__ import annotations

SOURCES: dict[str, tuple[str, str]] = {
    # torchscale 0.3.0 cannot join the lock: it pins timm==0.6.13 (the lock has timm 1.0.31) and
    # fairscale==0.4.0. The module is pure torch; its license is torchscale/LICENSE (MIT).
    "torchscale/xpos_relative_position.py": (
        "torchscale 0.3.0 wheel (PyPI), torchscale/component/xpos_relative_position.py",
        "0ze6MMW4NwGIOdbEQoMv4SzyN_nZt0ItU9t7IP0YuZE",
    ),
}
