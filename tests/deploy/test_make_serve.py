"""`make serve`'s address: HOST=/PORT= on make's command line, else the server's own
POSENC_HOST / POSENC_PORT from the environment, else 127.0.0.1:8000 (the flags the target
passes hid POSENC_PORT: the server then failed on a busy port 8000). `make -n` prints the
command without running it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _serve_line(*args: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("POSENC_HOST", "POSENC_PORT")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "serve", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    (line,) = [row for row in done.stdout.splitlines() if "posenc serve" in row]
    return line


@pytest.mark.parametrize(
    ("args", "env", "address"),
    [
        ((), {}, "--host 127.0.0.1 --port 8000"),
        ((), {"POSENC_PORT": "8019", "POSENC_HOST": "0.0.0.0"}, "--host 0.0.0.0 --port 8019"),
        (("PORT=8021",), {"POSENC_PORT": "8019"}, "--host 127.0.0.1 --port 8021"),
    ],
)
def test_make_serve_takes_the_address(
    args: tuple[str, ...], env: dict[str, str], address: str
) -> None:
    assert _serve_line(*args, **env).endswith(f"posenc serve {address}")
