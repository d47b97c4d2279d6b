"""posenc.runtime: device resolution, the byte-bounded, single-flight table cache and the in-flight
byte budget beside it.

Imports only `posenc.encodings` and torch; `device.py` is the only module touching CUDA.
"""

from posenc.runtime.budget import InFlightBudget, Lease, Overloaded, for_peer
from posenc.runtime.cache import (
    OFFLOAD_BYTES,
    Buffer,
    Busy,
    CacheEntry,
    CacheKey,
    CacheStats,
    TableCache,
)
from posenc.runtime.device import DeviceError, describe, is_out_of_memory, resolve_device

__all__ = [
    "OFFLOAD_BYTES",
    "Buffer",
    "Busy",
    "CacheEntry",
    "CacheKey",
    "CacheStats",
    "DeviceError",
    "InFlightBudget",
    "Lease",
    "Overloaded",
    "TableCache",
    "describe",
    "for_peer",
    "is_out_of_memory",
    "resolve_device",
]
