"""Running a model once in onnxruntime on the CPU, bfloat16 inputs and outputs included.

onnxruntime's Python API cannot turn bfloat16 tensors into numpy arrays; they travel as their
uint16 bit patterns through `OrtValue`s and IO binding and come back as torch tensors.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import torch

_NUMPY = {
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.float64: np.float64,
    torch.int64: np.int64,
    torch.bool: np.bool_,
}
_BF16 = onnx.TensorProto.BFLOAT16


def session(model: onnx.ModelProto | bytes, *, threads: int = 1) -> Any:
    """A CPU `InferenceSession` for `model` (onnxruntime imported here: it is an optional extra).

    One intra-op thread by default: verification runs small batches, and a thread pool per
    session costs more to start than these graphs take to run."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def run(sess: Any, feeds: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Run `sess` once on CPU torch tensors; returns every output as a CPU torch tensor."""
    import onnxruntime as ort

    binding = sess.io_binding()
    keep: list[Any] = []
    for name, tensor in feeds.items():
        t = tensor.detach().to("cpu").contiguous()
        if t.dtype == torch.bfloat16:
            bits = t.view(torch.int16).numpy().view(np.uint16)
            keep.append(bits)
            value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, _BF16)
        else:
            array: np.ndarray[Any, Any] = np.ascontiguousarray(
                t.numpy().astype(_NUMPY[t.dtype], copy=False)
            )
            keep.append(array)
            value = ort.OrtValue.ortvalue_from_numpy(array)
        binding.bind_ortvalue_input(name, value)
    names = [o.name for o in sess.get_outputs()]
    for name in names:
        binding.bind_output(name)
    sess.run_with_iobinding(binding)
    return {name: _to_torch(v) for name, v in zip(names, binding.get_outputs(), strict=True)}


def _to_torch(value: Any) -> torch.Tensor:
    if value.data_type() == "tensor(bfloat16)":
        shape = tuple(value.shape())
        count = int(np.prod(shape, dtype=np.int64))
        raw = ctypes.string_at(value.data_ptr(), 2 * count)
        bits = np.frombuffer(raw, dtype=np.int16).copy().reshape(shape)
        return torch.from_numpy(bits).view(torch.bfloat16)
    return torch.from_numpy(np.array(value.numpy(), copy=True))
