"""The committed gRPC stubs are what `make grpc-stubs` generates from the vendored .proto files
(byte for byte, with the locked grpcio-tools), and they coexist with tritonclient.grpc's own
build of the same protocol in one process."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("grpc_stubs", REPO / "tools" / "grpc_stubs.py")
assert _spec is not None
assert _spec.loader is not None
grpc_stubs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(grpc_stubs)


def test_regenerating_gives_the_committed_files(tmp_path: Path) -> None:
    written = grpc_stubs.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(grpc_stubs.GENERATED)
    for path in written:
        committed = grpc_stubs.PROTO_DIR / path.name
        assert committed.read_bytes() == path.read_bytes(), f"{path.name}: run make grpc-stubs"


def test_rewrites_are_required_to_match() -> None:
    with pytest.raises(RuntimeError, match="descriptor pool import not found"):
        grpc_stubs._rewrite("x_pb2.py", "import y\n")


def test_stubs_live_in_a_private_pool_beside_tritonclient() -> None:
    from google.protobuf import descriptor_pool
    from tritonclient.grpc import service_pb2 as theirs

    from posenc.api.grpc.proto import _pool
    from posenc.api.grpc.proto import grpc_service_pb2 as ours

    assert ours.DESCRIPTOR.pool is _pool.Default()
    assert theirs.DESCRIPTOR.pool is descriptor_pool.Default()
    assert ours.ModelInferRequest.DESCRIPTOR.full_name == "inference.ModelInferRequest"
    request = ours.ModelInferRequest(model_name="rope", raw_input_contents=[b"\x01"])
    assert theirs.ModelInferRequest.FromString(request.SerializeToString()).model_name == "rope"
