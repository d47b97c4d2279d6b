"""Table memory (`encodings/memory.py`) and Toeplitz layout (`encodings/_toeplitz.py`).

CPU tables from 128 KiB live in mappings of their own, populated up front: they must behave as
torch.empty tensors (shape, dtype, contiguity, writes, views outliving the base), be resident
before the first write, go back to the system when the last view dies, and come from torch's
allocator when the kernel refuses a mapping. Toeplitz tables are written by numpy through a
row-reversed view: they must equal the definition `out[..., i, j] = d[..., Q - 1 - i + j]` for
every shape and dtype.
"""

from __future__ import annotations

import gc
import mmap
import sys

import pytest
import torch

from posenc.encodings._toeplitz import toeplitz
from posenc.encodings.memory import OWN_MAPPING_BYTES, empty, empty_like


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
@pytest.mark.parametrize("shape", [(0, 3), (5,), (7, 3, 2), (1024, 1024), (3, 700, 1000)])
def test_empty_is_a_plain_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    t = empty(shape, dtype)
    assert (t.shape, t.dtype, t.device.type) == (torch.Size(shape), dtype, "cpu")
    assert t.is_contiguous()
    t.fill_(3)
    assert bool((t == 3).all())
    like = empty_like(t)
    assert (like.shape, like.dtype) == (t.shape, t.dtype)


def test_large_tables_are_their_own_mapping_and_go_back_when_freed() -> None:
    # a freed 30 MiB block raises glibc's dynamic mmap threshold to 30 MiB: from then on it
    # serves 16 MiB from its heap and keeps it when freed (the churn of docs/benchmarks.md)
    block = torch.ones(30 << 18)  # 30 MiB of float32
    del block
    gc.collect()
    size = 16 << 20
    assert size >= OWN_MAPPING_BYTES
    before = _rss_bytes()
    t = empty((size // 4,), torch.float32)
    t.fill_(1.0)
    assert _rss_bytes() - before >= size * 0.9
    view = t[1000:2000]
    del t
    gc.collect()
    assert float(view.sum()) == 1000.0  # a view keeps the mapping alive
    del view
    gc.collect()
    assert _rss_bytes() - before < size * 0.25  # unmapped, whatever glibc's heap keeps


def reference_toeplitz(d: torch.Tensor, q: int, k: int) -> torch.Tensor:
    i = torch.arange(q)[:, None]
    j = torch.arange(k)[None, :]
    return d[..., q - 1 - i + j]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize(
    ("lead", "q", "k"),
    [((), 1, 1), ((), 1, 9), ((), 9, 1), ((3,), 4, 4), ((2,), 5, 8), ((2, 3), 8, 5),
     ((12,), 512, 512), ((4,), 300, 1200)],
)  # fmt: skip
def test_toeplitz_is_the_definition(
    lead: tuple[int, ...], q: int, k: int, dtype: torch.dtype
) -> None:
    g = torch.Generator().manual_seed(q * 1000 + k)
    d = (torch.randn(*lead, q + k - 1, generator=g) * 100).to(dtype)
    got = toeplitz(d, q, k)
    assert got.is_contiguous()
    assert got.dtype == dtype
    assert torch.equal(got, reference_toeplitz(d, q, k))


def test_toeplitz_reads_strided_diagonals_and_checks_their_count() -> None:
    d = torch.arange(40.0).reshape(4, 10)[:, ::2]  # not contiguous, 5 diagonals
    assert torch.equal(toeplitz(d, 2, 4), reference_toeplitz(d.contiguous(), 2, 4))
    with pytest.raises(ValueError, match="Q \\+ K - 1"):
        toeplitz(d, 3, 4)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MAP_POPULATE is Linux's")
def test_own_mappings_are_populated_before_the_first_write() -> None:
    size = 32 << 20
    before = _rss_bytes()
    t = empty((size // 4,), torch.float32)
    # resident already: the kernel mapped every page in the mmap call, none faults on the write
    assert _rss_bytes() - before >= size * 0.9
    del t
    gc.collect()


def test_a_refused_mapping_falls_back_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> mmap.mmap:
        raise OSError(12, "Cannot allocate memory")  # ENOMEM, as at vm.max_map_count

    monkeypatch.setattr(mmap, "mmap", refuse)
    t = empty((OWN_MAPPING_BYTES // 4, 2), torch.float32)
    assert (t.shape, t.dtype, t.is_contiguous()) == (
        (OWN_MAPPING_BYTES // 4, 2),
        torch.float32,
        True,
    )
    t.fill_(2.0)
    assert float(t.sum()) == 2.0 * t.numel()
