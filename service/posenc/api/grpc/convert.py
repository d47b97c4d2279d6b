"""Protocol buffers <-> the /v2 codec's types: what the gRPC service hands the models and sends.

A `ModelInferRequest` becomes the same `InferRequest` an HTTP body parses into (the checks and
their messages are the codec's: `check_input`, `check_output`, `tensor_from_bytes`,
`tensor_from_data`), so every model runs unchanged. Inputs come either all in
`raw_input_contents` (little-endian bytes, one entry per input, in input order: what
tritonclient.grpc sends) or each in its typed `contents`; outputs always travel as raw bytes in
`raw_output_contents`, in output order, as Triton sends them (so the JSON limits of HTTP never
apply, and FP16/BF16 travel like any other datatype).

`model_config` is the `/v2/models/{model}/config` document as Triton's `ModelConfig` message,
`model_statistics` a model's inference statistics as its `ModelStatistics`.

Parameters (`map<string, InferParameter>`) become Python values: `bool_param`, `int64_param`,
`uint64_param`, `double_param`, `string_param`; the response parameters go back the same way
(strings stay strings, as the HTTP response's JSON has them).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import orjson
import torch

from posenc.api.grpc.proto import grpc_service_pb2 as pb
from posenc.api.grpc.proto import model_config_pb2 as mc
from posenc.api.oip.codec import (
    DATATYPE_OF,
    InferRequest,
    InputTensor,
    RequestedOutput,
    bad_request,
    check_input,
    check_output,
    host_bytes,
    tensor_from_bytes,
    tensor_from_data,
)
from posenc.api.oip.models import VERSION
from posenc.api.oip.stats import ModelStats

CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}
"""Protocol datatype -> the `InferTensorContents` field that carries it (FP16 and BF16 have none:
raw bytes only)."""


def parameter_value(parameter: pb.InferParameter) -> Any:
    """The Python value of one `InferParameter` (None when no field of the oneof is set)."""
    which = parameter.WhichOneof("parameter_choice")
    return None if which is None else getattr(parameter, which)


def parameters_dict(parameters: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """A protobuf parameter map as a dict (parameters without a value are left out)."""
    values = {name: parameter_value(p) for name, p in parameters.items()}
    return {name: v for name, v in values.items() if v is not None}


def set_parameter(target: pb.InferParameter, value: Any) -> None:
    """Store `value` in the `InferParameter` field of its type (other values as strings)."""
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = str(value)


def _contents(item: pb.ModelInferRequest.InferInputTensor, datatype: str) -> list[Any]:
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        # the codec refuses it with the message HTTP gives (binary-only datatypes)
        return []
    return list(getattr(item.contents, field))


def infer_request(request: pb.ModelInferRequest) -> InferRequest:
    """The codec's `InferRequest` of a gRPC request; `OipError` 400 for anything malformed."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise bad_request(
            f"raw_input_contents holds {len(raw)} tensors for {len(request.inputs)} inputs: "
            "send every input's bytes there, or none"
        )
    inputs: dict[str, InputTensor] = {}
    for i, item in enumerate(request.inputs):
        name = item.name
        iparams = parameters_dict(item.parameters)
        datatype, shape = check_input(name, item.datatype, list(item.shape), iparams, inputs)
        if raw:
            tensor = tensor_from_bytes(name, datatype, shape, raw[i])
        elif item.HasField("contents"):
            tensor = tensor_from_data(name, datatype, shape, _contents(item, datatype))
        else:
            raise bad_request(f"input {name!r} has neither contents nor raw_input_contents")
        inputs[name] = InputTensor(name, datatype, tensor)
    seen: list[RequestedOutput] = []
    for out in request.outputs:
        check_output(out.name, parameters_dict(out.parameters), seen)
        seen.append(RequestedOutput(out.name, True))
    return InferRequest(
        request.id or None,
        parameters_dict(request.parameters),
        inputs,
        tuple(seen) or None,
        True,
    )


def infer_response(
    model_name: str,
    model_version: str,
    request_id: str | None,
    tensors: Mapping[str, torch.Tensor],
    parameters: Mapping[str, Any],
) -> pb.ModelInferResponse:
    """A `ModelInferResponse`: every output's bytes in `raw_output_contents` (row-major,
    little-endian; BF16 as its bits; a GPU tensor copied to the host once)."""
    response = pb.ModelInferResponse(
        model_name=model_name, model_version=model_version, id=request_id or ""
    )
    fill_parameters(response.parameters, parameters)
    for name, t in tensors.items():
        response.outputs.add(name=name, datatype=DATATYPE_OF[t.dtype], shape=list(t.shape))
        response.raw_output_contents.append(bytes(host_bytes(t)))
    return response


WIRE_CHUNK = 1 << 20
"""Bytes of an output copied per step by `infer_response_bytes` (the event loop's thread gets the
interpreter between two steps)."""

RAW_OUTPUT_FIELD = 6
"""`ModelInferResponse.raw_output_contents`' field number (grpc_service.proto)."""

STREAM_RESPONSE_FIELD = 2
"""`ModelStreamInferResponse.infer_response`' field number (grpc_service.proto)."""


def varint(n: int) -> bytes:
    """`n` as a protobuf base-128 varint."""
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def length_delimited(field: int, size: int) -> bytes:
    """The tag and length of a length-delimited field (wire type 2) of `size` bytes."""
    return varint(field << 3 | 2) + varint(size)


def infer_response_bytes(
    model_name: str,
    model_version: str,
    request_id: str | None,
    tensors: Mapping[str, torch.Tensor],
    parameters: Mapping[str, Any],
    stream: bool = False,
) -> bytes:
    """`infer_response(...)` serialised (as a `ModelStreamInferResponse` holding it when
    `stream`), built without protobuf's serialiser for the outputs' bytes.

    protobuf (upb) holds the interpreter lock while it copies and serialises: 64 MiB of outputs
    stalled the event loop 290 ms from a worker thread, so a large gRPC answer kept health
    probes and every other request waiting. Here the message without `raw_output_contents` is
    serialised by protobuf (small), each output's field is written as its tag, length and bytes
    (copied `WIRE_CHUNK` at a time, the lock free between copies), and the parts are joined by
    `bytes.join`, which releases the lock while it copies (CPython, parts over 1 MiB). The bytes
    are the message protobuf writes, up to field order (`raw_output_contents` last), which
    parsers take alike (protobuf encoding: fields may appear in any order)."""
    head = pb.ModelInferResponse(
        model_name=model_name, model_version=model_version, id=request_id or ""
    )
    fill_parameters(head.parameters, parameters)
    for name, t in tensors.items():
        head.outputs.add(name=name, datatype=DATATYPE_OF[t.dtype], shape=list(t.shape))
    parts = [b"", head.SerializeToString()]  # [the stream message's field head, the message]
    for t in tensors.values():
        raw = host_bytes(t)
        parts.append(length_delimited(RAW_OUTPUT_FIELD, len(raw)))
        parts.extend(bytes(raw[i : i + WIRE_CHUNK]) for i in range(0, len(raw), WIRE_CHUNK))
    if stream:
        inner = sum(len(p) for p in parts)
        parts[0] = length_delimited(STREAM_RESPONSE_FIELD, inner)
    return b"".join(parts)


def fill_parameters(
    target: MutableMapping[str, pb.InferParameter], parameters: Mapping[str, Any]
) -> None:
    """Copy `parameters` into a protobuf parameter map."""
    for name, value in parameters.items():
        set_parameter(target[name], value)


def model_config(config: Mapping[str, Any]) -> mc.ModelConfig:
    """`/v2/models/{model}/config` (`OipModel.config`) as Triton's `ModelConfig`: name, platform,
    backend, version policy, batch size, inputs and outputs (datatype, dims, optional), and the
    `parameters` map; posenc's own block (spec schema, limits, device) is the JSON string of the
    parameter `posenc`. The tensors' descriptions and accepted datatypes have no field in the
    message: the HTTP document carries them."""
    versions = config["version_policy"]["specific"]["versions"]
    parameters = {
        k: mc.ModelParameter(string_value=str(v)) for k, v in config["parameters"].items()
    }
    parameters["posenc"] = mc.ModelParameter(
        string_value=orjson.dumps(config["posenc"], option=orjson.OPT_SORT_KEYS).decode()
    )
    return mc.ModelConfig(
        name=config["name"],
        platform=config["platform"],
        backend=config["backend"],
        version_policy=mc.ModelVersionPolicy(
            specific=mc.ModelVersionPolicy.Specific(versions=versions)
        ),
        max_batch_size=config["max_batch_size"],
        input=[
            mc.ModelInput(
                name=t["name"],
                data_type=mc.DataType.Value(t["data_type"]),
                dims=t["dims"],
                optional=t["optional"],
            )
            for t in config["input"]
        ],
        output=[
            mc.ModelOutput(
                name=t["name"], data_type=mc.DataType.Value(t["data_type"]), dims=t["dims"]
            )
            for t in config["output"]
        ],
        parameters=parameters,
    )


def model_statistics(name: str, stats: ModelStats) -> pb.ModelStatistics:
    """One model's statistics as Triton's `ModelStatistics` message (`oip/stats.py`)."""
    durations = {
        field: pb.StatisticDuration(count=d.count, ns=d.ns) for field, d in stats.durations.items()
    }
    return pb.ModelStatistics(
        name=name,
        version=VERSION,
        last_inference=stats.last_inference,
        inference_count=stats.inference_count,
        execution_count=stats.inference_count,
        inference_stats=pb.InferStatistics(**durations),
    )
