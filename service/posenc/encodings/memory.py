"""Memory for tables and their bodies: CPU buffers in mappings of their own, populated up front.

`empty(shape, dtype, device)` is `torch.empty` except for CPU buffers of `OWN_MAPPING_BYTES`
(128 KiB, glibc's own initial `M_MMAP_THRESHOLD`) or more, which get their own anonymous mapping.
The tensor holds the mapping through the buffer protocol, so the memory goes back to the system
when the last tensor (or view) over it is freed, whatever glibc's heap does: below its dynamic
mmap threshold (which rises to 32 MiB after the first large free) glibc serves such blocks from
heap arenas that keep freed memory and fragment, so a cache that evicts and recomputes tables
grew well past its budget (measured in docs/benchmarks.md, section 3).

The mapping is made with `MAP_POPULATE`: every buffer here is written in full right after it is
allocated (a table, or a body), so the kernel maps and zeroes all its pages in one call instead
of taking one fault per 4 KiB page on the first write, which is faster where a fault is costly
(a virtual machine's trap; measured in docs/benchmarks.md, section 1). The pages are the ones
the first write would fault in anyway: resident memory is unchanged. When the
kernel refuses a mapping (`vm.max_map_count` reached, say) the buffer comes from torch's
allocator instead.

Huge pages were tried and are not used: advised `MADV_HUGEPAGE`, a buffer reused right after a
free fills faster, but a buffer that is kept (a cached table) was slower to fault in, and kept is
what tables are (docs/benchmarks.md has the experiment). torch's `THP_MEM_ALLOC_ENABLE=1` remains
an option for machines where they pay.
"""

from __future__ import annotations

import math
import mmap

import torch

OWN_MAPPING_BYTES = 128 << 10
"""CPU buffers at least this large (bytes) get a mapping of their own."""

_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
"""Private anonymous memory, populated when the platform has `MAP_POPULATE` (Linux)."""


def empty(
    shape: tuple[int, ...] | list[int], dtype: torch.dtype, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """An uninitialised contiguous tensor, in a mapping of its own when large and on the CPU."""
    dev = torch.device(device)
    nbytes = math.prod(shape) * dtype.itemsize
    if dev.type != "cpu" or nbytes < OWN_MAPPING_BYTES:
        return torch.empty(tuple(shape), dtype=dtype, device=dev)
    try:
        region = mmap.mmap(-1, nbytes, flags=_FLAGS)
    except OSError:  # no mapping to be had (ENOMEM: vm.max_map_count reached): torch's heap
        return torch.empty(tuple(shape), dtype=dtype, device=dev)
    flat = torch.frombuffer(region, dtype=torch.uint8)
    return flat.view(dtype).view(tuple(shape))


def empty_like(t: torch.Tensor) -> torch.Tensor:
    """`empty(t.shape, t.dtype, t.device)`."""
    return empty(tuple(t.shape), t.dtype, t.device)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor (a frequency vector: a few hundred bytes) moved to `device`, same bits.

    To CUDA it goes through a pinned copy with a non-blocking transfer: a copy from pageable
    memory synchronises the stream (torch's `copy_` waits for the copy, and with it for all work
    queued before it), a copy from pinned memory is queued behind that work instead. The pinned
    copy is this function's own, and torch's caching host allocator keeps its block from reuse
    until the transfer's recorded event completes, so nothing can overwrite it in flight.
    """
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
