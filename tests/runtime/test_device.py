"""Device resolution and the CUDA out-of-memory test."""

from __future__ import annotations

import pytest
import torch

from posenc.runtime import DeviceError, describe, is_out_of_memory, resolve_device


def test_cpu_and_auto() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    expected = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    assert resolve_device("auto") == expected
    assert describe(torch.device("cpu")) == "cpu"


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:x", "cuda:-1", "", "tpu:0"])
def test_malformed_names(name: str) -> None:
    with pytest.raises(DeviceError, match="auto, cpu, cuda or cuda:N"):
        resolve_device(name)


def test_missing_cuda_device() -> None:
    if torch.cuda.is_available():
        with pytest.raises(DeviceError, match="only"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")
        assert resolve_device("cuda") == torch.device("cuda", 0)
    else:
        with pytest.raises(DeviceError, match="CUDA is not available"):
            resolve_device("cuda:0")


def test_is_out_of_memory() -> None:
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory."))
    assert is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_out_of_memory(RuntimeError("CUDA error: device-side assert triggered"))
    assert not is_out_of_memory(MemoryError())
