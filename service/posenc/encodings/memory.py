"""Memory for tables and their bodies: large CPU buffers on transparent huge pages.

A table is written once into fresh memory, and on the CPU faulting that memory in costs more than
computing the values: the kernel zeroes and maps one 4 KiB page per fault (2-3 µs each on a KVM
guest), so a fresh 128 MiB tensor from torch's allocator took ~77 ms to fill where warm memory
takes ~13 ms (docs/benchmarks.md). Backed by 2 MiB pages, the same fill takes ~13-20 ms: 512x
fewer faults.

`empty(shape, dtype, device)` is `torch.empty` except for CPU tables of `HUGE_PAGE` bytes or more,
which get their own anonymous mapping advised `MADV_HUGEPAGE` (the kernel's THP setting is
usually `madvise`: only advised mappings get huge pages). The tensor holds the mapping through
the buffer protocol, so the memory goes back to the system when the last tensor (or view) over
it is freed, whatever glibc's heap does (its arenas keep freed blocks below its dynamic mmap
threshold: the RSS churn of docs/benchmarks.md section 3). Where huge pages are unavailable the
advice is ignored and the mapping is an ordinary one. torch's own `THP_MEM_ALLOC_ENABLE=1` does
the same for every torch allocation of 2 MiB or more.
"""

from __future__ import annotations

import contextlib
import math
import mmap

import torch

HUGE_PAGE = 2 << 20
"""Tables at least this large (bytes) get a huge-page mapping on the CPU."""

_ADVICE = getattr(mmap, "MADV_HUGEPAGE", None)


def empty(
    shape: tuple[int, ...] | list[int], dtype: torch.dtype, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """An uninitialised contiguous tensor, on huge pages for large CPU tables (see above)."""
    dev = torch.device(device)
    numel = math.prod(shape)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if dev.type != "cpu" or nbytes < HUGE_PAGE or _ADVICE is None:
        return torch.empty(tuple(shape), dtype=dtype, device=dev)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # a kernel without THP: an ordinary mapping
        region.madvise(_ADVICE)
    flat = torch.frombuffer(region, dtype=torch.uint8)
    return flat.view(dtype).view(tuple(shape))


def empty_like(t: torch.Tensor) -> torch.Tensor:
    """`empty(t.shape, t.dtype, t.device)`."""
    return empty(tuple(t.shape), t.dtype, t.device)
