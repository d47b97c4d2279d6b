"""`make drift`: do posenc's tables still equal the newest releases of its references?

Builds a throwaway environment (`.venv-drift`) with the newest releases that the package index
serves of everything pyproject.toml names (transformers, onnxruntime, onnx, tritonclient, numpy,
timm, ...), torch's newest CPU build that installs here (else the locked one), and the two
projects; runs the reference and interop tests there (tests/encodings, tests/onnx, tests/api,
tests/client); writes what it found to docs/compatibility.md: the versions next to the lock's,
what passed, and each failure's first line. It never changes the lock and never fails `make test`:
it tells us when the world moved, and the lock is then refreshed on purpose (`make lock`).

Standard library only: it runs before the environment it builds exists.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv-drift"
PYTHON = VENV / "bin" / "python"
REPORT = REPO / "docs" / "compatibility.md"
JUNIT = VENV / "junit.xml"
TESTS = ("tests/encodings", "tests/onnx", "tests/api", "tests/client")
REFERENCES = ("transformers", "timm", "torch", "onnxruntime", "onnx", "tritonclient", "numpy")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(args), flush=True)
    return subprocess.run(args, cwd=REPO, text=True, capture_output=True, check=check)


def pip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(str(PYTHON), "-m", "pip", "install", "--quiet", *args, check=check)


def locked() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (REPO / "requirements" / "suite.txt").read_text(encoding="utf-8").splitlines():
        match = _PIN.match(line)
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def installed(name: str) -> str:
    code = f"from importlib import metadata; print(metadata.version({name!r}))"
    done = run(str(PYTHON), "-c", code, check=False)
    return done.stdout.strip() if done.returncode == 0 else "(not installed)"


def newest_cpu_torch(locked_torch: str) -> str:
    """The newest torch release with a CPU build that installs here, else the locked one."""
    done = run(str(PYTHON), "-m", "pip", "index", "versions", "torch", check=False)
    match = re.search(r"Available versions: (.*)", done.stdout)
    releases = [v.strip() for v in match.group(1).split(",")] if match else []
    floor = tuple(int(p) for p in locked_torch.split("+")[0].split("."))
    for release in releases:
        if tuple(int(p) for p in release.split(".") if p.isdigit()) <= floor:
            break
        if pip("--no-deps", f"torch=={release}+cpu", check=False).returncode == 0:
            return f"{release}+cpu"
    pip("--no-deps", f"torch=={locked_torch}")
    return locked_torch


def build() -> str:
    shutil.rmtree(VENV, ignore_errors=True)
    run(sys.executable, "-m", "venv", str(VENV))
    torch = newest_cpu_torch(locked()["torch"])
    constraints = VENV / "constraints.txt"
    constraints.write_text(f"torch=={torch}\n", encoding="utf-8")
    # --upgrade-strategy eager: every dependency at its newest release, not only the top level.
    pip("--upgrade", "--upgrade-strategy", "eager", "-c", str(constraints), "setuptools", "wheel",
        "-e", ".[cpu,test]", "-e", "clients/python[onnx]")  # fmt: skip
    pip("--upgrade", "--no-deps", "timm")  # as in the lock: its torchvision has no CPU build here
    return torch


def test() -> tuple[dict[str, int], list[tuple[str, str]], str]:
    JUNIT.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    args = [str(PYTHON), "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
            "-p", "no:cacheprovider", f"--junitxml={JUNIT}", *TESTS]  # fmt: skip
    print("+", " ".join(args), flush=True)
    done = subprocess.run(args, cwd=REPO, text=True, capture_output=True, env=env, check=False)
    tail = done.stdout.strip().splitlines()[-1:] or ["(no output)"]
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures: list[tuple[str, str]] = []
    if JUNIT.exists():
        for case in ET.parse(JUNIT).getroot().iter("testcase"):
            test_id = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            problem = case.find("failure")
            if problem is None:
                problem = case.find("error")
            if problem is not None:
                counts["failed"] += 1
                message = (problem.get("message") or "").strip().splitlines()
                failures.append((test_id, message[0][:160] if message else ""))
            elif case.find("skipped") is not None:
                counts["skipped"] += 1
            else:
                counts["passed"] += 1
    return counts, failures, tail[0]


def report(torch: str, counts: dict[str, int], failures: list[tuple[str, str]], tail: str) -> str:
    pins = locked()
    rows = []
    for name in REFERENCES:
        lock, new = pins.get(name, "-"), installed(name)
        rows.append(f"| {name} | {lock} | {new} | {'same' if lock == new else 'moved'} |")
    moved = [row.split(" | ")[0].strip("| ") for row in rows if row.endswith("moved |")]
    verdict = (
        "every reference and interop test passes with the newest releases"
        if counts["failed"] == 0 and counts["passed"] > 0
        else f"{counts['failed']} test(s) fail with the newest releases: the lock stays where it "
        "is until they are understood"
    )
    lines = [
        "# Compatibility: the lock against the newest releases",
        "",
        "Written by `make drift` (tools/drift.py); the lock itself is `requirements/*.txt`",
        "(docs/dependencies.md). The suite, the images and posenc's claims of exactness",
        "(`posenc.verified`, `GET /v1/version`) are the lock's versions; this page says whether",
        "the newest releases the package index serves would still pass.",
        "",
        f"Last run: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on {platform.machine()}, "
        f"Python {platform.python_version()}; torch tried: {torch}.",
        "",
        "| package | lock | newest | |",
        "|---|---|---|---|",
        *rows,
        "",
        f"Tests run: `{' '.join(TESTS)}` in `.venv-drift`: {counts['passed']} passed, "
        f"{counts['failed']} failed, {counts['skipped']} skipped (pytest: `{tail}`).",
        "",
        f"Verdict: {verdict}" + (f"; moved: {', '.join(moved)}." if moved else "; nothing moved."),
        "",
    ]
    if failures:
        lines += ["Failures (first line of each):", ""]
        lines += [f"- `{test_id}`: {message}" for test_id, message in failures[:60]]
        if len(failures) > 60:
            lines.append(f"- ... and {len(failures) - 60} more")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    torch = build()
    counts, failures, tail = test()
    REPORT.write_text(report(torch, counts, failures, tail), encoding="utf-8")
    print(f"{REPORT.relative_to(REPO)}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
