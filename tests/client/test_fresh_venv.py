"""posenc-client alone: a plain virtual environment (no system site-packages) with only httpx,
numpy, ml-dtypes, tqdm (from the package index, as pinned in requirements/client.txt) and the client
wheel (built from this tree, installed with --no-deps) imports `posenc_client` without torch or
onnx, fetches a table from the live server, and runs its console script. Takes ~30 s (mostly pip);
it runs in the default suite."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ServerHandle

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python"

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("fresh_venv")]


def _run(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(args, capture_output=True, text=True, cwd=cwd, check=False)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_client_alone_in_a_fresh_venv(server: ServerHandle, tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    wheels = tmp_path / "wheels"
    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(source))  # fmt: skip
    (wheel,) = wheels.glob("posenc_client-*.whl")

    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    _run(base, "-m", "venv", str(venv))
    python = venv / "bin" / "python"
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    _run(str(python), "-m", "pip", "install", "--quiet", "--require-hashes", "--no-deps",
         "-r", str(CLIENT.parents[1] / "requirements" / "client.txt"))  # fmt: skip
    _run(str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel))

    check = textwrap.dedent(
        f"""
        import importlib.util, sys
        import posenc_client
        from posenc_client import Client
        heavy = [m for m in ("torch", "onnx", "onnxruntime", "safetensors", "posenc")
                 if m in sys.modules]
        assert not heavy, heavy
        assert importlib.util.find_spec("torch") is None  # really absent, not just unimported
        with Client({server.url!r}, cache={str(tmp_path / "cache")!r}) as client:
            slopes = client.alibi(8)["slopes"]
            rope = client.rope(64, 16, dtype="bfloat16", profile="onnx")
        assert slopes.shape == (8,) and rope["cos"].dtype.name == "bfloat16"
        assert "torch" not in sys.modules
        try:
            rope.to_torch()
        except ImportError as err:
            assert "posenc-client[torch]" in str(err)
        else:
            raise AssertionError("to_torch worked without torch")
        try:
            import posenc_client.onnx
        except ImportError as err:
            assert "posenc-client[onnx]" in str(err)
        else:
            raise AssertionError("posenc_client.onnx imported without onnx")
        print("ok", posenc_client.__version__)
        """
    )
    assert _run(str(python), "-c", check).startswith("ok 0.1.0")
    cli = str(venv / "bin" / "posenc-client")
    assert "Exit codes" in _run(cli, "--help")
    out = _run(cli, "--url", server.url, "--no-cache", "fetch", "alibi", "num_heads=4")
    assert '"slopes"' in out
    # a model id without the hub extra: usage error (2) naming it
    done = subprocess.run(
        [cli, "--url", server.url, "resolve", "meta-llama/Llama-3.1-8B"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "pip install 'posenc-client[hub]'" in done.stderr
