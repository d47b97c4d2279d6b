"""schemathesis against the live server's OpenAPI (issue 23, item 8): every check (server errors,
status codes, content types, headers and bodies against the document, positive data accepted,
negative data rejected, auth enforced, 405s with their `Allow`...), positive and negative data,
a fixed seed and a bounded number of cases per operation (about 4 300 in all, every phase:
examples, coverage, fuzzing, stateful), through schemathesis' own CLI (`st run`, the lock's
release) with `tests/api/schemathesis.toml`.

The server runs with API keys and `protect_docs_and_metrics`, so the document itself is fetched
with the key and the Bearer scheme is exercised. Its limits are small so that generated specs stay
cheap (413 past 16 MiB). Runs in about 20 s on the 2-core test machine.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ServerHandle, start_server

CONFIG = Path(__file__).with_name("schemathesis.toml")
ST = Path(sys.executable).with_name("st")
KEY = "schemathesis-key"
MAX_EXAMPLES = 5
SEED = 23


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[ServerHandle]:
    with start_server(
        api_keys=[KEY],
        protect_docs_and_metrics=True,
        cache_bytes=64 << 20,
        max_response_bytes=16 << 20,
        json_max_elements=50_000,
        table_store_bytes=16 << 20,
        max_upload_bytes=1 << 20,
    ) as handle:
        yield handle


@pytest.mark.xdist_group("schemathesis")
def test_schemathesis_finds_nothing(fuzzed: ServerHandle, tmp_path: Path) -> None:
    command = [
        str(ST),
        "--config-file",
        str(CONFIG),
        "--no-color",
        "run",
        f"{fuzzed.url}/openapi.json",
        "--header",
        f"Authorization: Bearer {KEY}",
        "--checks",
        "all",
        "--mode",
        "all",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        str(SEED),
        "--request-timeout",
        "30",
        "--warnings",
        "off",
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path
    )
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-20000:]
    assert "No issues found" in report or " passed" in report, report[-3000:]
    with fuzzed.client() as client:
        assert client.get("/v2/health/ready").status_code == 200
