"""The vendored upstream files (`tests/vendored`) are the published bytes: each one's sha256
equals the one its distribution's RECORD lists."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest

from tests.vendored import SOURCES

ROOT = Path(__file__).parent / "vendored"


@pytest.mark.parametrize("path", sorted(SOURCES))
def test_vendored_file_is_the_published_file(path: str) -> None:
    source, record = SOURCES[path]
    digest = hashlib.sha256((ROOT / path).read_bytes()).digest()
    got = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    assert got == record, f"{path} is no longer {source}"


def test_every_vendored_code_file_is_listed() -> None:
    code = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if p.name != "__init__.py"}
    assert code == set(SOURCES)
