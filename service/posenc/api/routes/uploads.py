"""`/v1/uploads`: checkpoint weight tables, uploaded once and then named by content key.

Any weight table a spec can name (`posenc.encodings.weights`): a `learned` position table E
(N, D), or a `relative_index` bias table E (num_relative_distance, H), Swin's or BEiT's
`relative_position_bias_table`.

- `POST /v1/uploads`: the body is one table E (N, D), or a checkpoint's (1, N, D), as safetensors
  or `.npy`. The format is `?format=` (`safetensors`, `npy`), else `Content-Type`
  (`application/vnd.safetensors`, `application/x-npy`), else the body's magic bytes. A
  safetensors file holding several tensors needs `?tensor=NAME` (`pos_embed` of a checkpoint).
  Answers 201 `{"table_key", "shape", "dtype", "nbytes", "url"}` with `Location: url`.
- `GET /v1/uploads/{table_key}`: the same description; 404 `unknown_table` when not stored.

Tables are kept as float32 in the server's `TableStore` (`posenc.encodings.weights`, created in
the lifespan, `table_store_bytes`, least recently used dropped first) under
`weights.table_key`, a sha256 of the shape and the float32 values that any client can compute:
uploading the same values again gives the same key and keeps one copy. A spec then names the
table by key and shape (`learned`: `table_key`, `table_shape`; `relative_index`:
`relative_position_bias_table_key`, `relative_position_bias_table_shape`);
`serving.bind_tables` binds the stored table to it before anything is computed (an inline table
is stored on the way, so that its canonical, key-only spec works afterwards). A key the store
does not hold is 404 `unknown_table` naming the spec's key field. Bodies are capped by
`max_upload_bytes`: from `Content-Length` before any of the body is read, and while it streams
(`BodyLimitMiddleware`).
"""

from __future__ import annotations

import asyncio
import io
import math
from typing import Any

import numpy as np
import orjson
import torch
from fastapi import APIRouter, Request
from safetensors import SafetensorError
from safetensors.torch import load as safetensors_load
from starlette.responses import Response

from posenc.api.deps import State
from posenc.api.errors import ApiError, spec_problems
from posenc.api.jsonio import check_content_encoding, json_response
from posenc.api.serving import unknown_table
from posenc.encodings import SpecError
from posenc.encodings.weights import TableStore
from posenc.runtime import OFFLOAD_BYTES

router = APIRouter(prefix="/v1", tags=["uploads"])

UPLOAD_FORMATS: dict[str, tuple[str, ...]] = {
    "safetensors": (
        "application/vnd.safetensors",
        "application/safetensors",
        "application/x-safetensors",
    ),
    "npy": ("application/x-npy", "application/npy"),
}
"""Upload format -> the media types that name it."""

NPY_MAGIC = b"\x93NUMPY"
NPY_DTYPES = frozenset({"float16", "float32", "float64", "int32", "int64"})
"""The .npy dtypes a table may have (stored as float32, as every family computes)."""
STORED_DTYPE = "float32"


def _invalid(message: str, field: str = "(body)", value: Any = None) -> ApiError:
    return ApiError(
        400, "invalid_table", message, [{"field": field, "message": message, "value": value}]
    )


def upload_format(param: str | None, content_type: str | None, body: bytes) -> str:
    """The format of an upload: `?format=`, else `Content-Type`, else the magic bytes."""
    if param is not None:
        name = param
        if name not in UPLOAD_FORMATS:
            raise ApiError(
                400,
                "unknown_format",
                f"unknown upload format {param!r}",
                [
                    {
                        "field": "format",
                        "message": f"one of {sorted(UPLOAD_FORMATS)}",
                        "value": param,
                    }
                ],
            )
        return name
    media = (content_type or "").partition(";")[0].strip().lower()
    for name, media_types in UPLOAD_FORMATS.items():
        if media in media_types:
            return name
    if body.startswith(NPY_MAGIC):
        return "npy"
    # safetensors: an 8-byte little-endian header length, then the JSON header
    if len(body) > 8 and body[8:9] == b"{":
        return "safetensors"
    raise _invalid(
        "the body is neither safetensors nor .npy: send one table with Content-Type "
        "application/vnd.safetensors or application/x-npy (or ?format=)"
    )


def _from_npy(body: bytes) -> torch.Tensor:
    if not body.startswith(NPY_MAGIC):
        raise _invalid("not a .npy file (it must start with \\x93NUMPY)")
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
        raise _invalid(f"not a readable .npy file: {err}") from None
    if dtype.name not in NPY_DTYPES:
        raise _invalid(
            f"a table's dtype must be one of {sorted(NPY_DTYPES)}, got {dtype}",
            "dtype",
            str(dtype),
        )
    claimed = math.prod(shape) * dtype.itemsize
    present = len(body) - stream.tell()
    if claimed != present:
        raise _invalid(
            f"the .npy header claims shape {tuple(shape)} {dtype} ({claimed} bytes) but the body "
            f"holds {present} bytes of data",
            "shape",
            list(shape),
        )
    try:
        array = np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, TypeError, OSError, EOFError) as err:
        raise _invalid(f"not a readable .npy file: {err}") from None
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
        413,
        "too_many_tensors",
        f"the safetensors file {declared}; an upload may declare at most {max_tensors} tensors "
        f"in a header of at most {max_header} bytes",
        {"max_tensors": max_tensors, "max_header_bytes": max_header, "tensors": count},
    )


def _from_safetensors(body: bytes, tensor: str | None, max_tensors: int) -> torch.Tensor:
    _count_tensors(body, max_tensors)
    try:
        tensors = safetensors_load(body)
    except SafetensorError as err:
        raise _invalid(f"not a readable safetensors file: {err}") from None
    names = sorted(tensors)
    if tensor is not None:
        if tensor not in tensors:
            raise ApiError(
                400,
                "unknown_tensor",
                f"the file has no tensor {tensor!r}; it has {names[:20]}",
                [{"field": "tensor", "message": f"one of {names[:20]}", "value": tensor}],
            )
        return tensors[tensor]
    if len(names) != 1:
        if not names:
            raise _invalid("the safetensors file holds no tensor")
        raise ApiError(
            400,
            "tensor_required",
            f"the file holds {len(names)} tensors: name the table with tensor=NAME, one of "
            f"{names[:20]}",
            [{"field": "tensor", "message": f"required, one of {names[:20]}", "value": None}],
        )
    return tensors[names[0]]


def ingest(
    store: TableStore, fmt: str, body: bytes, tensor: str | None, max_tensors: int
) -> tuple[str, list[int]]:
    """Decode an upload and put it into `store`: (table key, [N, D]). Raises `ApiError` 400 for a
    body that is not one real (N, D) table, 413 for one larger than the store or a safetensors
    file declaring more than `max_tensors` tensors."""
    table = _from_npy(body) if fmt == "npy" else _from_safetensors(body, tensor, max_tensors)
    stored_bytes = table.numel() * 4
    if stored_bytes > store.max_bytes:
        raise ApiError(
            413,
            "too_large",
            f"the table takes {stored_bytes} bytes as float32, more than the table store's "
            f"{store.max_bytes}",
            {"size_bytes": stored_bytes, "max_bytes": store.max_bytes},
        )
    try:
        key = store.put(table)
    except SpecError as err:
        message = "invalid table: " + "; ".join(p.describe() for p in err.problems)
        raise ApiError(400, "invalid_table", message, spec_problems(err)) from None
    return key, list(table.shape[-2:])


def describe_upload(key: str, shape: list[int]) -> dict[str, Any]:
    """The JSON description of a stored table."""
    return {
        "table_key": key,
        "shape": shape,
        "dtype": STORED_DTYPE,
        "nbytes": shape[0] * shape[1] * 4,
        "url": f"/v1/uploads/{key}",
    }


@router.post(
    "/uploads",
    status_code=201,
    summary="Upload a weight table (learned positions, relative_index bias; safetensors or .npy)",
    responses={
        201: {"description": '{"table_key", "shape", "dtype", "nbytes", "url"}'},
        400: {"description": "Not one real (N, D) table (error_type invalid_table, ...)"},
        413: {"description": "Body over max_upload_bytes, or table over the table store"},
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/vnd.safetensors": {"schema": {"type": "string", "format": "binary"}},
                "application/x-npy": {"schema": {"type": "string", "format": "binary"}},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            },
        },
        "parameters": [
            {
                "name": "format",
                "in": "query",
                "required": False,
                "schema": {"type": "string", "enum": sorted(UPLOAD_FORMATS)},
                "description": "overrides Content-Type (else the magic bytes decide)",
            },
            {
                "name": "tensor",
                "in": "query",
                "required": False,
                "schema": {"type": "string"},
                "description": "the table's name in a safetensors file with several tensors",
            },
        ],
    },
)
async def post_upload(request: Request, state: State) -> Response:
    """Store one table under its content key (idempotent: the same values, the same key)."""
    store = state.require_tables()
    check_content_encoding(request)
    body = b"".join([chunk async for chunk in request.stream()])
    if not body:
        raise _invalid("the body is empty: send one table as safetensors or .npy")
    fmt = upload_format(
        request.query_params.get("format"), request.headers.get("content-type"), body
    )
    tensor = request.query_params.get("tensor")
    limit = state.settings.max_upload_tensors
    if len(body) > OFFLOAD_BYTES:
        key, shape = await asyncio.to_thread(ingest, store, fmt, body, tensor, limit)
    else:
        key, shape = ingest(store, fmt, body, tensor, limit)
    described = describe_upload(key, shape)
    return json_response(described, 201, {"Location": described["url"]})


@router.get(
    "/uploads/{table_key}",
    summary="An uploaded table's description (404 when the store does not hold it)",
    responses={404: {"description": "error_type unknown_table"}},
)
async def get_upload(state: State, table_key: str) -> Response:
    """Shape, dtype and size of a stored table."""
    table = state.require_tables().lookup(table_key)
    if table is None:
        raise unknown_table(table_key)
    return json_response(describe_upload(table_key, list(table.shape)))
