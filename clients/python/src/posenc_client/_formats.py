"""Tensor files without the safetensors package: parse and write safetensors, save npz/npy.

The client always asks the server for safetensors: the one format that carries every tensor of a
table, bfloat16 natively, and the canonical spec, key and metadata in its header. The format
(https://huggingface.co/docs/safetensors) is an 8-byte little-endian header length N, N bytes of
JSON `{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}`, then
the raw little-endian tensor bytes (offsets relative to the end of the header).

Parsed arrays are zero-copy views of the buffer they were read from (writable when it is a
`bytearray`). bfloat16 and float8 come from `ml_dtypes` (imported only when such a tensor appears).
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from posenc_client._exceptions import DecodeError

Array = npt.NDArray[Any]
Buffer = bytes | bytearray | memoryview

_NUMPY_CODES: dict[str, str] = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U64": "<u8",
    "U32": "<u4",
    "U16": "<u2",
    "U8": "u1",
    "BOOL": "?",
}
_ML_DTYPES: dict[str, str] = {
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}
MAX_HEADER_BYTES = 100 << 20
"""The safetensors reference implementation's limit on the JSON header."""


_DTYPES: dict[str, np.dtype[Any]] = {}
"""numpy dtypes by safetensors code, filled as codes are met (ml_dtypes is imported only then)."""


def numpy_dtype(code: str) -> np.dtype[Any]:
    """The numpy dtype of a safetensors dtype code (`F32`, `BF16`, ...)."""
    found = _DTYPES.get(code)
    if found is not None:
        return found
    if code in _NUMPY_CODES:
        found = np.dtype(_NUMPY_CODES[code])
    elif code in _ML_DTYPES:
        import ml_dtypes

        found = np.dtype(getattr(ml_dtypes, _ML_DTYPES[code]))
    else:
        raise DecodeError(f"unsupported safetensors dtype {code!r}")
    _DTYPES[code] = found
    return found


def dtype_code(dtype: np.dtype[Any]) -> str:
    """The safetensors code of a numpy (or ml_dtypes) dtype."""
    name = dtype.name
    for code, ml_name in _ML_DTYPES.items():
        if name == ml_name:
            return code
    for code, np_code in _NUMPY_CODES.items():
        if np.dtype(np_code) == dtype.newbyteorder("<"):
            return code
    raise ValueError(f"no safetensors dtype for {dtype}")


def dtype_name(dtype: np.dtype[Any]) -> str:
    """The dtype's name as posenc writes it (`float32`, `bfloat16`, `int64`, `bool`)."""
    return "bool" if dtype == np.bool_ else dtype.name


def parse_safetensors(data: Buffer) -> tuple[dict[str, Array], dict[str, str]]:
    """(tensors, metadata) from safetensors bytes; arrays are views of `data`.

    Raises `DecodeError` on a truncated file, a bad header or offsets outside the data.

    Cost: one `json.loads` of the header, then per tensor a dict lookup of its dtype and one
    `np.ndarray` over the buffer at its offset (no slicing, no `np.prod` on small shapes): a few
    microseconds for a table's handful of tensors.
    """
    view = memoryview(data).cast("B")
    total = len(view)
    if total < 8:
        raise DecodeError(f"safetensors: {total} bytes is shorter than the 8-byte header")
    size = int.from_bytes(view[:8], "little")
    if size > MAX_HEADER_BYTES or 8 + size > total:
        raise DecodeError(f"safetensors: header length {size} exceeds the {total}-byte body")
    try:
        header = json.loads(bytes(view[8 : 8 + size]))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DecodeError(f"safetensors: the header is not JSON: {err}") from None
    if not isinstance(header, dict):
        raise DecodeError("safetensors: the header is not a JSON object")
    raw_meta = header.pop("__metadata__", None) or {}
    if not isinstance(raw_meta, dict):
        raise DecodeError("safetensors: __metadata__ is not an object")
    metadata: dict[str, str] = raw_meta  # JSON keys are strings; values are checked below
    for value in raw_meta.values():
        if type(value) is not str:
            metadata = {str(k): str(v) for k, v in raw_meta.items()}
            break
    start = 8 + size
    length = total - start
    tensors: dict[str, Array] = {}
    for name, info in header.items():
        try:
            code = info["dtype"]
            dtype = _DTYPES.get(code) if type(code) is str else None
            if dtype is None:
                dtype = numpy_dtype(str(code))
            shape = tuple(map(int, info["shape"]))
            begin, end = map(int, info["data_offsets"])
        except (KeyError, TypeError, ValueError) as err:
            raise DecodeError(f"safetensors: bad entry for tensor {name!r}: {err}") from None
        if not 0 <= begin <= end <= length or end - begin != math.prod(shape) * dtype.itemsize:
            raise DecodeError(
                f"safetensors: tensor {name!r} ({dtype.name}{list(shape)}) does not fit "
                f"bytes [{begin}, {end}) of a {length}-byte body"
            )
        tensors[name] = np.ndarray(shape, dtype, buffer=view, offset=start + begin)
    return tensors, metadata


def dump_safetensors(tensors: Mapping[str, Array], metadata: Mapping[str, str] | None) -> bytes:
    """Safetensors bytes of `tensors` (C order, little endian) with string `metadata`."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    blobs: list[bytes] = []
    for name, array in tensors.items():
        arr = np.asarray(array, order="C")  # ascontiguousarray would make 0-d arrays 1-d
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        blob = arr.tobytes()
        header[name] = {
            "dtype": dtype_code(arr.dtype),
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return b"".join([len(text).to_bytes(8, "little"), text, *blobs])


def _numpy_native(name: str, array: Array) -> None:
    if array.dtype.name in _ML_DTYPES.values():
        raise ValueError(
            f"tensor {name!r} is {array.dtype.name}, which .npy/.npz cannot hold: save as "
            ".safetensors, or fetch with dtype='float32'"
        )


def save_arrays(
    path: str | os.PathLike[str],
    tensors: Mapping[str, Array],
    *,
    metadata: Mapping[str, str] | None = None,
    tensor: str | None = None,
) -> None:
    """Write `tensors` to `path`, by suffix: `.safetensors`, `.npz` (uncompressed) or `.npy`
    (one tensor: `tensor=NAME`, or the only one). Raises ValueError for other suffixes, for
    bfloat16 in numpy formats and for an ambiguous `.npy`."""
    target = os.fspath(path)
    suffix = os.path.splitext(target)[1].lower()
    if tensor is not None:
        if tensor not in tensors:
            raise ValueError(f"no tensor {tensor!r}; there are {list(tensors)}")
        tensors = {tensor: tensors[tensor]}
    if suffix == ".safetensors":
        data = dump_safetensors(tensors, metadata)
    elif suffix == ".npz":
        for name, array in tensors.items():
            _numpy_native(name, array)
        buf = io.BytesIO()
        np.savez(buf, allow_pickle=False, **dict(tensors))
        data = buf.getvalue()
    elif suffix == ".npy":
        if len(tensors) != 1:
            raise ValueError(f".npy holds one tensor: pick one of {list(tensors)}")
        ((name, array),) = tensors.items()
        _numpy_native(name, array)
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        data = buf.getvalue()
    else:
        raise ValueError(f"unknown output suffix {suffix!r}: use .safetensors, .npz or .npy")
    write_atomic(target, data)


TEMP_SUFFIX = ".tmp"
"""The suffix of `write_atomic`'s temporary files (`DiskCache.stale_temp_files` finds those a
killed process left)."""


def write_atomic(path: str | os.PathLike[str], data: Buffer) -> None:
    """Write `data` to a temporary file beside `path`, then rename it into place. The temporary
    file gets a random name and is created exclusively (`O_EXCL`): a file or symlink planted at a
    predictable name is never followed or overwritten. Its mode is 0o666 less the umask, as
    `open(path, "w")` would give (`tempfile.mkstemp` gives 0o600: files a user asked for, readable
    only by them)."""
    import secrets

    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    os.makedirs(folder, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        name = f".{os.path.basename(target)}.{secrets.token_hex(6)}{TEMP_SUFFIX}"
        tmp = os.path.join(folder, name)
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
