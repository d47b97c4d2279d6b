"""Device resolution and CUDA housekeeping: the only module in posenc that touches `torch.cuda`.

`resolve_device("auto")` picks the first CUDA device when one is present and the CPU otherwise;
`"cpu"`, `"cuda"` and `"cuda:N"` are taken literally and checked against what is installed.
`is_out_of_memory` recognises a CUDA allocation failure so the cache can fall back to the CPU.
"""

from __future__ import annotations

import re

import torch

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


class DeviceError(ValueError):
    """The requested device is malformed or not available on this machine."""


def resolve_device(requested: str) -> torch.device:
    """The torch device for a setting of `auto`, `cpu`, `cuda` or `cuda:N`.

    Raises `DeviceError` when the name is malformed or names a CUDA device this machine lacks.
    """
    name = requested.strip().lower()
    if not _DEVICE_RE.match(name):
        raise DeviceError(f"device must be auto, cpu, cuda or cuda:N, got {requested!r}")
    if name == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DeviceError(f"device {requested!r} requested but CUDA is not available")
    index = int(name.partition(":")[2] or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceError(f"device {requested!r} requested but only {count} CUDA device(s) exist")
    return torch.device("cuda", index)


def describe(device: torch.device) -> str:
    """A human-readable name for logs: `cpu` or `cuda:0 (NVIDIA H100 80GB HBM3)`."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def is_out_of_memory(exc: BaseException) -> bool:
    """True when `exc` is a CUDA allocation failure (the cache then retries on the CPU)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc)


def release_cached_memory(device: torch.device) -> None:
    """Return the CUDA caching allocator's free blocks to the driver (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels on `device` so timings measure the work (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
