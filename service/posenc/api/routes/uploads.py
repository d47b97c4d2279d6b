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
`serving.bind.bind_tables` binds the stored table to it before anything is computed (an inline table
is stored on the way, so that its canonical, key-only spec works afterwards). A key the store
does not hold is 404 `unknown_table` naming the spec's key field. Bodies are capped by
`max_upload_bytes`: from `Content-Length` before any of the body is read, and while it streams
(the `Gate` middleware).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from posenc.api.caps import body_cap
from posenc.api.deps import State
from posenc.api.error_types import (
    BODY_TOO_LARGE,
    INVALID_TABLE,
    STARTING,
    TENSOR_REQUIRED,
    TOO_LARGE,
    TOO_MANY_TENSORS,
    UNKNOWN_FORMAT,
    UNKNOWN_TABLE,
    UNKNOWN_TENSOR,
    UNSUPPORTED_MEDIA_TYPE,
    responses,
)
from posenc.api.errors import ApiError, spec_problems
from posenc.api.jsonio import check_content_encoding, json_response
from posenc.api.serving.bind import unknown_table
from posenc.api.serving.decode import invalid_table
from posenc.api.serving.formats import UPLOADS, Format
from posenc.encodings import SpecError
from posenc.encodings.weights import TableStore
from posenc.runtime import OFFLOAD_BYTES

router = APIRouter(prefix="/v1", tags=["uploads"])

BINARY = {"schema": {"type": "string", "format": "binary"}}

STORED_DTYPE = "float32"


def upload_format(param: str | None, content_type: str | None, body: bytes) -> Format:
    """The format of an upload (`UPLOADS`): `?format=`, else `Content-Type` (a format's media
    type or alias), else the magic bytes."""
    if param is not None:
        fmt = UPLOADS.get(param)
        if fmt is None:
            raise ApiError(
                UNKNOWN_FORMAT,
                f"unknown upload format {param!r}",
                [{"field": "format", "message": f"one of {sorted(UPLOADS)}", "value": param}],
            )
        return fmt
    media = (content_type or "").partition(";")[0].strip().lower()
    for fmt in UPLOADS.values():
        if media in fmt.media_types:
            return fmt
    for fmt in UPLOADS.values():
        if fmt.sniff is not None and fmt.sniff(body):
            return fmt
    raise invalid_table(
        "the body is neither safetensors nor .npy: send one table with Content-Type "
        "application/vnd.safetensors or application/x-npy (or ?format=)"
    )


def ingest(
    store: TableStore, fmt: Format, body: bytes, tensor: str | None, max_tensors: int
) -> tuple[str, list[int]]:
    """Decode an upload and put it into `store`: (table key, [N, D]). Raises `ApiError` 400 for a
    body that is not one real (N, D) table, 413 for one larger than the store or a safetensors
    file declaring more than `max_tensors` tensors."""
    assert fmt.decode is not None  # an upload format (`UPLOADS`)
    table = fmt.decode(body, tensor, max_tensors)
    stored_bytes = table.numel() * 4
    if stored_bytes > store.max_bytes:
        raise ApiError(
            TOO_LARGE,
            f"the table takes {stored_bytes} bytes as float32, more than the table store's "
            f"{store.max_bytes}",
            {"size_bytes": stored_bytes, "max_bytes": store.max_bytes},
        )
    try:
        key = store.put(table)
    except SpecError as err:
        message = "invalid table: " + "; ".join(p.describe() for p in err.problems)
        raise ApiError(INVALID_TABLE, message, spec_problems(err)) from None
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
        **responses(
            BODY_TOO_LARGE,
            UNSUPPORTED_MEDIA_TYPE,
            INVALID_TABLE,
            UNKNOWN_FORMAT,
            UNKNOWN_TENSOR,
            TENSOR_REQUIRED,
            TOO_LARGE,
            TOO_MANY_TENSORS,
            STARTING,
        ),
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                **{f.media_type: BINARY for f in UPLOADS.values()},
                "application/octet-stream": BINARY,
            },
        },
        "parameters": [
            {
                "name": "format",
                "in": "query",
                "required": False,
                "schema": {"type": "string", "enum": sorted(UPLOADS)},
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
@body_cap("max_upload_bytes")
async def post_upload(request: Request, state: State) -> Response:
    """Store one table under its content key (idempotent: the same values, the same key)."""
    store = state.require_tables()
    check_content_encoding(request)
    body = b"".join([chunk async for chunk in request.stream()])
    if not body:
        raise invalid_table("the body is empty: send one table as safetensors or .npy")
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
    responses=responses(UNKNOWN_TABLE, STARTING),
)
async def get_upload(state: State, table_key: str) -> Response:
    """Shape, dtype and size of a stored table."""
    table = state.require_tables().lookup(table_key)
    if table is None:
        raise unknown_table(table_key)
    return json_response(describe_upload(table_key, list(table.shape)))
