"""The descriptor pool of posenc's generated gRPC stubs (`tools/grpc_stubs.py`).

The generated `*_pb2.py` import this module in place of `google.protobuf.descriptor_pool` and
call `Default()`: their descriptors live in a pool of their own, so the same protocol compiled
elsewhere in the process (tritonclient.grpc registers `inference.*` in protobuf's default pool)
does not collide with them.
"""

from __future__ import annotations

from google.protobuf import descriptor_pool

_POOL = descriptor_pool.DescriptorPool()


def Default() -> descriptor_pool.DescriptorPool:  # noqa: N802 (the name protoc's code calls)
    """posenc's private pool (named as the function it stands in for)."""
    return _POOL
