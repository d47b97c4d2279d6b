"""`make grpc-stubs`: the Python stubs of the Open Inference Protocol's gRPC service, generated.

The sources are Triton's published protocol files, vendored unchanged in
`service/posenc/api/grpc/proto/`: `protobuf/grpc_service.proto` and `protobuf/model_config.proto`
of the GitHub repository triton-inference-server/common, commit
83adf7cf88a2f343005974dff3728be746de2d66: the KServe v2 service `inference.GRPCInferenceService`
as Triton serves it and tritonclient.grpc calls it (a superset of KServe's
`open_inference_grpc.proto`, field numbers equal).

grpcio-tools' protoc writes `grpc_service_pb2.py`/`.pyi`, `grpc_service_pb2_grpc.py` and
`model_config_pb2.py`/`.pyi`; then two rewrites, each required to match:

- protoc imports a dependency as a top-level module (`import model_config_pb2`); it becomes
  `from posenc.api.grpc.proto import model_config_pb2` (what tritonclient's own build does);
- the files register their descriptors in `posenc.api.grpc.proto._pool`, a private descriptor
  pool, instead of protobuf's default one: tritonclient.grpc (or any other build of these
  protos) registers the same message names (`inference.ModelInferRequest`) in the default pool,
  and protobuf refuses a second file defining them. The wire format is unchanged.

    python tools/grpc_stubs.py [--out DIR]     (default: the package folder itself)

`tests/api/test_grpc_stubs.py` regenerates into a temporary folder and compares byte for byte.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE_ROOT = REPO / "service"
PACKAGE = "posenc.api.grpc.proto"
PROTO_DIR = SOURCE_ROOT / Path(*PACKAGE.split("."))
PROTOS = ("grpc_service.proto", "model_config.proto")
GENERATED = (
    "grpc_service_pb2.py",
    "grpc_service_pb2.pyi",
    "grpc_service_pb2_grpc.py",
    "model_config_pb2.py",
    "model_config_pb2.pyi",
)
"""The files this tool writes (protoc's `model_config_pb2_grpc.py` declares no service: dropped)."""

_TOP_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)
_DEFAULT_POOL = "from google.protobuf import descriptor_pool as _descriptor_pool\n"
_PRIVATE_POOL = f"from {PACKAGE} import _pool as _descriptor_pool\n"


def _rewrite(name: str, text: str) -> str:
    """The two rewrites of one generated file (see the module docstring)."""
    text, imports = _TOP_IMPORT.subn(rf"from {PACKAGE} import \1 as \2", text)
    wants_import = name.startswith("grpc_service")
    if wants_import and imports != 1:
        raise RuntimeError(f"{name}: expected one top-level pb2 import, found {imports}")
    if name.endswith("_pb2.py"):
        if text.count(_DEFAULT_POOL) != 1:
            raise RuntimeError(f"{name}: protoc's descriptor pool import not found")
        text = text.replace(_DEFAULT_POOL, _PRIVATE_POOL)
    return text


def generate(out: Path) -> list[Path]:
    """Run protoc on the vendored protos and write the rewritten stubs into `out`."""
    from grpc_tools import protoc

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *(str(PROTO_DIR / p) for p in PROTOS),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed: " + " ".join(args))
        written = []
        for name in GENERATED:
            text = (Path(tmp) / name).read_text()
            target = out / name
            target.write_text(_rewrite(name, text))
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_DIR)
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
