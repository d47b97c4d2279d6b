"""Memory for tables and their bodies: large CPU buffers in mappings of their own.

`empty(shape, dtype, device)` is `torch.empty` except for CPU buffers of `OWN_MAPPING_BYTES` or
more, which get their own anonymous mapping. The tensor holds the mapping through the buffer
protocol, so the memory goes back to the system when the last tensor (or view) over it is freed,
whatever glibc's heap does: below its dynamic mmap threshold (which rises to 32 MiB after the
first large free) glibc serves 2-32 MiB blocks from heap arenas that keep freed memory and
fragment, so a cache that evicts and recomputes such tables grew to about twice its budget
(docs/benchmarks.md, section 3). Faulting the pages in costs what it costs for torch's own
allocations (measured alike here).

Huge pages were tried and are not used: advised `MADV_HUGEPAGE`, a buffer reused right after a
free fills 5-10x faster, but a buffer that is kept (a cached table) cost 5x more to fault in on
the benchmark machine (a KVM guest: 131 against 25 ms per 64 MiB, held), and kept is what
tables are. torch's `THP_MEM_ALLOC_ENABLE=1` remains an option for machines where they pay.
"""

from __future__ import annotations

import math
import mmap

import torch

OWN_MAPPING_BYTES = 2 << 20
"""CPU buffers at least this large (bytes) get a mapping of their own."""


def empty(
    shape: tuple[int, ...] | list[int], dtype: torch.dtype, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """An uninitialised contiguous tensor, in a mapping of its own when large and on the CPU."""
    dev = torch.device(device)
    nbytes = math.prod(shape) * dtype.itemsize
    if dev.type != "cpu" or nbytes < OWN_MAPPING_BYTES:
        return torch.empty(tuple(shape), dtype=dtype, device=dev)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    flat = torch.frombuffer(region, dtype=torch.uint8)
    return flat.view(dtype).view(tuple(shape))


def empty_like(t: torch.Tensor) -> torch.Tensor:
    """`empty(t.shape, t.dtype, t.device)`."""
    return empty(tuple(t.shape), t.dtype, t.device)
