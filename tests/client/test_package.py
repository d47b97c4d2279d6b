"""The package's public surface stays honest: a sorted `__all__` of real public objects (of
posenc_client or posenc_check, the ONNX check it ships and shares with the server), every
exception in the tree drawn in the docstring and exported, every `error_type` the server can
send mapped to a class, and `import posenc_client` importing neither torch nor onnx."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys

import posenc_client
import posenc_client.gguf as gguf_check
import posenc_client.onnx as plug
from posenc.api.error_types import ERROR_TYPES
from posenc_client import _exceptions


def test_all_is_sorted_and_real() -> None:
    for module in (posenc_client, plug, gguf_check):
        names = module.__all__
        assert names == sorted(names), module.__name__
        assert len(set(names)) == len(names)
        for name in names:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                # posenc_check ships in the client's distribution (shared with the server)
                assert obj.__module__.startswith(("posenc_client", "posenc_check")), name


def test_every_exception_is_exported_and_drawn() -> None:
    classes = {
        name
        for name, obj in vars(_exceptions).items()
        if inspect.isclass(obj) and issubclass(obj, posenc_client.PosencError)
    }
    assert classes <= set(posenc_client.__all__)
    tree = _exceptions.__doc__ or ""
    drawn = set(re.findall(r"[├└]── (\w+)", tree)) | {"PosencError"}
    assert drawn == classes


def test_every_server_error_type_is_mapped() -> None:
    """The server's catalog of error_types (`posenc.api.error_types`) against the client's
    classes: every error the server sends has its exception here."""
    types = set(ERROR_TYPES)
    assert len(types) > 25
    missing = types - set(_exceptions._BY_ERROR_TYPE)
    assert not missing, f"server error_types without a client class: {sorted(missing)}"


def test_import_is_light() -> None:
    code = (
        "import sys, posenc_client; "
        "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'ml_dtypes', 'posenc', 'tqdm', "
        "'huggingface_hub') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
