"""Print the runtime requirements of posenc from pyproject.toml, one per line, for `pip -r`.

The Dockerfile installs dependencies in a layer of their own, before the source is copied, so a
change to the code does not reinstall torch. This script keeps pyproject.toml the one list of
dependencies: `python requirements.py pyproject.toml cpu` prints `[project].dependencies` plus the
`cpu` extra. torch is left out: each image target installs its own build (CPU or CUDA) first.

Standard library only (it runs in a bare python image before anything is installed).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

# Installed by the Dockerfile from a chosen index before this list; never resolved again here.
SEPARATELY_INSTALLED = frozenset({"torch"})

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _name(requirement: str) -> str:
    match = _NAME.match(requirement)
    if match is None:
        raise ValueError(f"cannot read a package name from requirement {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    """The project's dependencies plus the named extras, torch excluded, in file order."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    optional = project.get("optional-dependencies", {})
    unknown = sorted(set(extras) - set(optional))
    if unknown:
        raise SystemExit(f"unknown extra(s) {unknown}; pyproject.toml defines {sorted(optional)}")
    found = list(project["dependencies"])
    for extra in extras:
        found.extend(optional[extra])
    return [r for r in found if _name(r) not in SEPARATELY_INSTALLED]


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: requirements.py PYPROJECT [EXTRA ...]", file=sys.stderr)
        return 2
    print("\n".join(requirements(Path(argv[1]), argv[2:])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
