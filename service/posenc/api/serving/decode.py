"""Decoding an uploaded table (`Format.decode`): safetensors and `.npy` bodies -> one tensor.

Every check that needs only the header runs before anything is allocated (a header may claim
any shape or any number of tensors); errors are 400 `invalid_table`, `unknown_tensor`,
`tensor_required` and 413 `too_many_tensors`, naming the field.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
import orjson
import torch
from safetensors import SafetensorError
from safetensors.torch import load as safetensors_load

from posenc.api.error_types import INVALID_TABLE, TENSOR_REQUIRED, TOO_MANY_TENSORS, UNKNOWN_TENSOR
from posenc.api.errors import ApiError

NPY_MAGIC = b"\x93NUMPY"
NPY_DTYPES = frozenset({"float16", "float32", "float64", "int32", "int64"})
"""The .npy dtypes a table may have (stored as float32, as every family computes)."""


def invalid_table(message: str, field: str = "(body)", value: Any = None) -> ApiError:
    """400 `invalid_table`: an upload that is not one readable table."""
    return ApiError(INVALID_TABLE, message, [{"field": field, "message": message, "value": value}])


def decode_npy(body: bytes, tensor: str | None, max_tensors: int) -> torch.Tensor:
    """The one array of a `.npy` upload (`tensor` and `max_tensors` do not apply), its header
    checked against the body before numpy allocates anything."""
    if not body.startswith(NPY_MAGIC):
        raise invalid_table("not a .npy file (it must start with \\x93NUMPY)")
    # The header is read and checked against the body's length before any array exists: a
    # header may claim any shape, and numpy would allocate it before noticing the data is short.
    stream = io.BytesIO(body)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ValueError(f"format version {version[0]}.{version[1]} (1.0 and 2.0 are read)")
    except (ValueError, TypeError, OSError, EOFError, SyntaxError) as err:
        raise invalid_table(f"not a readable .npy file: {err}") from None
    if dtype.name not in NPY_DTYPES:
        raise invalid_table(
            f"a table's dtype must be one of {sorted(NPY_DTYPES)}, got {dtype}",
            "dtype",
            str(dtype),
        )
    claimed = math.prod(shape) * dtype.itemsize
    present = len(body) - stream.tell()
    if claimed != present:
        raise invalid_table(
            f"the .npy header claims shape {tuple(shape)} {dtype} ({claimed} bytes) but the body "
            f"holds {present} bytes of data",
            "shape",
            list(shape),
        )
    try:
        array = np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, TypeError, OSError, EOFError) as err:
        raise invalid_table(f"not a readable .npy file: {err}") from None
    native = array.astype(array.dtype.newbyteorder("="), copy=False)
    return torch.from_numpy(np.ascontiguousarray(native))


SAFETENSORS_HEADER_BYTES_PER_TENSOR = 1024
"""A safetensors upload's JSON header may take this many bytes per allowed tensor."""


def _count_tensors(body: bytes, max_tensors: int) -> None:
    """Refuse (413 `too_many_tensors`) a safetensors file whose header declares more than
    `max_tensors` tensors, or is longer than `SAFETENSORS_HEADER_BYTES_PER_TENSOR` bytes per
    allowed tensor, before safetensors allocates anything for them. A malformed header is left
    to safetensors to refuse."""
    size = int.from_bytes(body[:8], "little")
    if len(body) < 8 or 8 + size > len(body):  # malformed: safetensors says how
        return
    max_header = SAFETENSORS_HEADER_BYTES_PER_TENSOR * max_tensors
    count: int | None = None
    if size <= max_header:
        try:
            header = orjson.loads(body[8 : 8 + size])
        except orjson.JSONDecodeError:
            return
        if not isinstance(header, dict):
            return
        count = len(header) - ("__metadata__" in header)
        if count <= max_tensors:
            return
    declared = f"declares {count} tensors" if count is not None else f"has a {size}-byte header"
    raise ApiError(
        TOO_MANY_TENSORS,
        f"the safetensors file {declared}; an upload may declare at most {max_tensors} tensors "
        f"in a header of at most {max_header} bytes",
        {"max_tensors": max_tensors, "max_header_bytes": max_header, "tensors": count},
    )


def decode_safetensors(body: bytes, tensor: str | None, max_tensors: int) -> torch.Tensor:
    """The tensor `tensor` of a safetensors upload (or its only one), the header's tensor count
    checked first (`_count_tensors`)."""
    _count_tensors(body, max_tensors)
    try:
        tensors = safetensors_load(body)
    except SafetensorError as err:
        raise invalid_table(f"not a readable safetensors file: {err}") from None
    names = sorted(tensors)
    if tensor is not None:
        if tensor not in tensors:
            raise ApiError(
                UNKNOWN_TENSOR,
                f"the file has no tensor {tensor!r}; it has {names[:20]}",
                [{"field": "tensor", "message": f"one of {names[:20]}", "value": tensor}],
            )
        return tensors[tensor]
    if len(names) != 1:
        if not names:
            raise invalid_table("the safetensors file holds no tensor")
        raise ApiError(
            TENSOR_REQUIRED,
            f"the file holds {len(names)} tensors: name the table with tensor=NAME, one of "
            f"{names[:20]}",
            [{"field": "tensor", "message": f"required, one of {names[:20]}", "value": None}],
        )
    return tensors[names[0]]


def is_npy(body: bytes) -> bool:
    """A `.npy` file starts with its magic bytes."""
    return body.startswith(NPY_MAGIC)


def is_safetensors(body: bytes) -> bool:
    """safetensors: an 8-byte little-endian header length, then the JSON header."""
    return len(body) > 8 and body[8:9] == b"{"
