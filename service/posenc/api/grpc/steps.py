"""gRPC decode steps (`ModelInfer`, `ModelStreamInfer`): a repeated request answered from the
template of its last answer, as `/v2` answers its HTTP decode steps (`posenc.api.oip.steps`).

A decode loop over gRPC sends the same `ModelInferRequest` every step but for the positions (its
`raw_input_contents`) and, often, its `id`. The request's key (`step_key`) is the message
without those two, serialised (deterministic); once a request with a key has been answered from
a resident cache entry (`posenc_source: hit`, the rows of whole cached tables: `rows_of`), the
app's `StepTemplates` keep a `GrpcStep` under it while the entry is resident: the response
message's fields but for the id and the outputs' bytes (`prefix`: model name and version;
`suffix`: parameters and output metadata, serialised once) and the tables' rows (`Rows`). The
next request with that key is answered by reading its positions from `raw_input_contents`,
checking them against the tables' rows and writing the response as `convert.infer_response_bytes`
writes it: prefix, the request's id, suffix, then each output's `raw_output_contents` field (its
rows sliced from the table's bytes), wrapped in a `ModelStreamInferResponse` on a stream.

Only requests with one input, carried in `raw_input_contents` (what tritonclient.grpc sends),
have a template; typed `contents`, a position outside the table or an evicted entry take the slow
path. The template's answer takes the same output charge, counts a cache hit on the entry, a
`hit` in `posenc_v2_infer_total` and in the model's statistics, as the slow path does
(`tests/api/test_grpc_steps.py` compares the two through tritonclient's stream API).
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from posenc.api.grpc.convert import (
    RAW_OUTPUT_FIELD,
    STREAM_RESPONSE_FIELD,
    fill_parameters,
    length_delimited,
)
from posenc.api.grpc.proto import grpc_service_pb2 as pb
from posenc.api.oip.codec import DATATYPE_OF
from posenc.api.oip.stats import InferTimer
from posenc.api.oip.steps import Rows, StepTemplates, rows_template
from posenc.runtime import CacheEntry, Lease, TableCache

ID_FIELD = 3
"""`ModelInferResponse.id`'s field number (grpc_service.proto)."""


@dataclass(frozen=True)
class GrpcStep:
    """What answers one gRPC request key against one resident entry (module docstring)."""

    rows: Rows
    prefix: bytes
    """The response's `model_name` and `model_version` fields, serialised."""
    suffix: bytes
    """Its `parameters` and `outputs` fields (no bytes), serialised."""


def step_key(request: pb.ModelInferRequest) -> Hashable | None:
    """The template key of `request` (module docstring), or None when it has no template."""
    if len(request.inputs) != 1 or len(request.raw_input_contents) != 1:
        return None
    shape = pb.ModelInferRequest()
    shape.CopyFrom(request)
    shape.ClearField("id")
    shape.ClearField("raw_input_contents")
    return ("grpc", shape.SerializeToString(deterministic=True))


def _id_field(request_id: str) -> bytes:
    if not request_id:
        return b""
    raw = request_id.encode()
    return length_delimited(ID_FIELD, len(raw)) + raw


def answer(
    steps: StepTemplates,
    cache: TableCache,
    key: Hashable,
    request: pb.ModelInferRequest,
    stream: bool,
    timer: InferTimer,
) -> tuple[str, bytes, list[Lease]] | None:
    """(model, the response's bytes, its output charge) for `request` (its key `key`) from its
    template, or None (nothing done: the slow path answers); its phases marked on `timer` as
    the slow path marks them. The bytes are those of `convert.infer_response_bytes` for the same
    answer (a `ModelStreamInferResponse` when `stream`)."""
    got = steps.gather(cache, key, GrpcStep, request.raw_input_contents[0])
    if got is None:
        return None
    step = got.step
    parts: list[bytes | memoryview] = [b"", step.prefix, _id_field(request.id), step.suffix]
    for block in got.blocks:
        parts.append(length_delimited(RAW_OUTPUT_FIELD, sum(len(b) for b in block)))
        parts += block
    if stream:
        parts[0] = length_delimited(STREAM_RESPONSE_FIELD, sum(len(p) for p in parts))
    response = b"".join(parts)
    timer.marks(got.input_end, got.infer_end, time.perf_counter_ns())
    return step.rows.model, response, got.leases


async def keep(
    steps: StepTemplates,
    cache: TableCache,
    key: Hashable | None,
    request: pb.ModelInferRequest,
    given: torch.Tensor,
    entry: CacheEntry,
    rows_of: dict[str, torch.Tensor],
    model: str,
    version: str,
    tensors: Mapping[str, torch.Tensor],
    parameters: Mapping[str, Any],
    charge: int,
) -> None:
    """Remember the answer to `request` (key `key`; its input `given`; outputs `tensors`, the
    rows of `rows_of` at the positions; response `parameters`) as its key's template while
    `entry` is resident; nothing when it has none (module docstring)."""
    if key is None or not steps.size:
        return
    rows = await rows_template(cache, entry, model, given, rows_of, charge)
    if rows is None or rows.positions(request.raw_input_contents[0]) is None:
        return
    prefix = pb.ModelInferResponse(model_name=model, model_version=version).SerializeToString()
    rest = pb.ModelInferResponse()
    fill_parameters(rest.parameters, parameters)
    for name, t in tensors.items():
        rest.outputs.add(name=name, datatype=DATATYPE_OF[t.dtype], shape=list(t.shape))
    steps.remember(key, entry, GrpcStep(rows, prefix, rest.SerializeToString()))
