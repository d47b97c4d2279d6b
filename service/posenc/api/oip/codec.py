"""Wire format of the Open Inference Protocol (KServe v2) with the binary tensor extension.

Requests are parsed from the raw body, never through a pydantic body model: tritonclient's sync
client sends no Content-Type (field guide section 5). A request body is a JSON header, optionally
followed by the raw little-endian bytes of the inputs that carry `parameters.binary_data_size`,
in input order; the header's length is the `Inference-Header-Content-Length` request header (the
whole body is JSON when it is absent). Responses mirror that: outputs asked for as binary
(`binary_data` per output, `binary_data_output` for all, every output when none is named) follow
the JSON header as raw bytes, the others travel in `data` as flat row-major lists. FP16 and BF16
travel only as binary, both ways. Errors are `OipError(status, message)`; the routes send them as
`{"error": message}`, the one shape tritonclient decodes.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import torch

HEADER_LENGTH = "Inference-Header-Content-Length"

DATATYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "UINT8": torch.uint8,
    "INT8": torch.int8,
    "INT16": torch.int16,
    "INT32": torch.int32,
    "INT64": torch.int64,
    "FP16": torch.float16,
    "BF16": torch.bfloat16,
    "FP32": torch.float32,
    "FP64": torch.float64,
}
"""Protocol datatype -> torch dtype, for every datatype posenc reads or writes."""

DATATYPE_OF: dict[torch.dtype, str] = {v: k for k, v in DATATYPES.items()}

DATATYPE_OF_NAME: dict[str, str] = {
    "float32": "FP32",
    "float16": "FP16",
    "bfloat16": "BF16",
    "float64": "FP64",
    "int64": "INT64",
    "int32": "INT32",
}
"""posenc dtype names (`TensorInfo.dtype`) -> protocol datatypes."""

BINARY_ONLY = frozenset({"FP16", "BF16"})
"""Datatypes that travel only as binary (no exact JSON spelling in the protocol)."""

_NUMPY: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "BF16": np.dtype("<i2"),  # the bits; viewed as torch.bfloat16 after decoding
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}


MAX_ERROR_CHARS = 1024
"""An error message is cut to this many characters (an input name, a parameter or a spec value
quoted in it may be as long as the request): the rest is left out and counted."""

MAX_INPUT_RANK = 8
"""Dimensions an input may have (the models take at most 3; numpy stops at 64)."""


def excerpt(message: str, limit: int = MAX_ERROR_CHARS) -> str:
    """`message`, or its first `limit` characters and how many were left out."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]}... ({len(message) - limit} more characters left out)"


class OipError(Exception):
    """A protocol-level failure: HTTP status and the message sent as `{"error": message}`
    (`excerpt`ed: never an echo of a large request)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        message = excerpt(message)
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def bad_request(message: str) -> OipError:
    return OipError(400, message)


def too_large(message: str) -> OipError:
    """413 (gRPC RESOURCE_EXHAUSTED): a request body, decompressed or not, over
    `max_infer_body_bytes`, or outputs over `max_response_bytes`; as `/v1` answers its size
    limits (`too_large`, `body_too_large`) and gRPC its own message size limits."""
    return OipError(413, message)


@dataclass(frozen=True)
class InputTensor:
    """One decoded request input: CPU tensor in the dtype of its protocol `datatype`."""

    name: str
    datatype: str
    tensor: torch.Tensor


@dataclass(frozen=True)
class RequestedOutput:
    """An output named in the request and whether it comes back as binary."""

    name: str
    binary: bool


@dataclass(frozen=True)
class InferRequest:
    """A parsed inference request.

    `outputs` is None when the request names none (the model's default outputs are sent, as
    binary when `binary_data_output` is true, which tritonclient sets in that case).
    """

    id: str | None
    parameters: dict[str, Any]
    inputs: dict[str, InputTensor]
    outputs: tuple[RequestedOutput, ...] | None
    binary_data_output: bool

    def binary(self, name: str) -> bool:
        """Whether output `name` is sent as binary."""
        if self.outputs is not None:
            for out in self.outputs:
                if out.name == name:
                    return out.binary
        return self.binary_data_output


@dataclass(frozen=True)
class OutputTensor:
    """One response output: the tensor (any device) and whether it travels as binary."""

    name: str
    tensor: torch.Tensor
    binary: bool


@dataclass
class EncodedResponse:
    """A response body as consecutive byte parts (header, then each binary output), with its
    media type and extra headers. Parts may be views of cached tables: nothing is concatenated."""

    parts: list[bytes | memoryview]
    media_type: str
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(len(p) for p in self.parts)

    def body(self) -> bytes:
        """The parts joined (tests and small bodies)."""
        return b"".join(self.parts)


def decompress(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    """Undo a request `Content-Encoding` of gzip or deflate (tritonclient's request compression),
    refusing more than `limit` decompressed bytes."""
    if not content_encoding or content_encoding.strip().lower() == "identity":
        return body
    encoding = content_encoding.strip().lower()
    wbits = {"gzip": 31, "deflate": 15}.get(encoding)
    if wbits is None:
        raise bad_request(f"unsupported Content-Encoding {content_encoding!r}: use gzip or deflate")
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise bad_request(f"request body is not valid {encoding}: {exc}") from None
    if len(out) > limit:
        raise too_large(f"decompressed request body exceeds the limit of {limit} bytes")
    if not inflater.eof:
        raise bad_request(f"request body is truncated {encoding}")
    return out


def _as_bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    raise bad_request(f"{what} must be a boolean, got {value!r}")


def check_shape(value: Any, name: str) -> tuple[int, ...]:
    """The shape of input `name`: a list of at most `MAX_INPUT_RANK` non-negative integers."""
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value
    ):
        raise bad_request(f"input {name!r}: shape must be a list of non-negative integers")
    if len(value) > MAX_INPUT_RANK:
        raise bad_request(
            f"input {name!r}: shape has {len(value)} dimensions, more than {MAX_INPUT_RANK}"
        )
    return tuple(value)


def tensor_from_data(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> torch.Tensor:
    """Input `name` from its elements (a JSON `data` list, or a gRPC `contents` field), checked
    against its datatype and shape."""
    if datatype in BINARY_ONLY:
        raise bad_request(f"input {name!r}: {datatype} travels only as binary data")
    count = math.prod(shape)
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError) as exc:
        raise bad_request(f"input {name!r}: data is not a numeric array: {exc}") from None
    if arr.size != count:
        raise bad_request(
            f"input {name!r}: data holds {arr.size} elements, shape {list(shape)} needs {count}"
        )
    if count == 0:
        arr = np.zeros(0, dtype=_NUMPY[datatype])
    kinds = {"BOOL": "b", "FP32": "biuf", "FP64": "biuf"}.get(datatype, "iu")
    if arr.dtype.kind not in kinds:
        raise bad_request(f"input {name!r}: data does not match datatype {datatype}")
    target = _NUMPY[datatype]
    if target.kind in "iu":
        info = np.iinfo(target)
        if arr.size and (int(arr.min()) < info.min or int(arr.max()) > info.max):
            raise bad_request(f"input {name!r}: values out of range for {datatype}")
    out = torch.from_numpy(np.ascontiguousarray(arr, dtype=target).reshape(shape))
    return out


def tensor_from_bytes(
    name: str, datatype: str, shape: tuple[int, ...], blob: memoryview | bytes
) -> torch.Tensor:
    """Input `name` from its raw little-endian bytes (a binary HTTP part, or a gRPC
    `raw_input_contents` entry), checked against its datatype and shape."""
    np_dtype = _NUMPY[datatype]
    count = math.prod(shape)
    if len(blob) != count * np_dtype.itemsize:
        raise bad_request(
            f"input {name!r}: binary_data_size {len(blob)} does not match shape {list(shape)} "
            f"of {datatype} ({count * np_dtype.itemsize} bytes)"
        )
    arr = np.frombuffer(blob, dtype=np_dtype, count=count).copy().reshape(shape)
    out = torch.from_numpy(arr)
    return out.view(torch.bfloat16) if datatype == "BF16" else out


def check_input(
    name: str,
    datatype: Any,
    shape: Any,
    parameters: Mapping[str, Any],
    seen: Mapping[str, InputTensor],
) -> tuple[str, tuple[int, ...]]:
    """(datatype, shape) of input `name`, checked: not given twice (`seen`: the inputs so far),
    a known datatype, a shape of non-negative integers, no shared memory."""
    if name in seen:
        raise bad_request(f"input {name!r} is given twice")
    if datatype not in DATATYPES:
        raise bad_request(
            f"input {name!r}: datatype must be one of {sorted(DATATYPES)}, got {datatype!r}"
        )
    checked = check_shape(shape, name)
    if "shared_memory_region" in parameters:
        raise bad_request(f"input {name!r}: shared memory is not supported")
    return datatype, checked


def check_output(name: str, parameters: Mapping[str, Any], seen: Sequence[RequestedOutput]) -> None:
    """Refuse a requested output that `seen` (the outputs so far) holds already, or that asks
    for shared memory or classification."""
    if "shared_memory_region" in parameters:
        raise bad_request(f"output {name!r}: shared memory is not supported")
    if "classification" in parameters:
        raise bad_request(f"output {name!r}: classification is not supported")
    if any(o.name == name for o in seen):
        raise bad_request(f"output {name!r} is requested twice")


def parse_infer_request(body: bytes, header_length: str | None) -> InferRequest:
    """Parse a raw request body (JSON header plus binary inputs) into an `InferRequest`.

    Raises `OipError` 400 naming the offending part for anything malformed.
    """
    size = len(body)
    if header_length is None:
        json_end = size
    else:
        text = header_length.strip()
        if not (text.isascii() and text.isdigit()):
            raise bad_request(f"{HEADER_LENGTH} must be an integer, got {header_length!r}")
        json_end = int(text)
        if not 0 < json_end <= size:
            raise bad_request(f"{HEADER_LENGTH} {json_end} is outside the body of {size} bytes")
    try:
        head = orjson.loads(body[:json_end])
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"request header is not valid JSON: {exc}") from None
    if not isinstance(head, dict):
        raise bad_request("request header must be a JSON object")
    request_id = head.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise bad_request("id must be a string")
    params = head.get("parameters") or {}
    if not isinstance(params, dict):
        raise bad_request("parameters must be a JSON object")
    binary_all = _as_bool(params.get("binary_data_output", False), "binary_data_output")

    raw_inputs = head.get("inputs", [])
    if not isinstance(raw_inputs, list):
        raise bad_request("inputs must be a list")
    view = memoryview(body)
    offset = json_end
    inputs: dict[str, InputTensor] = {}
    for item in raw_inputs:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise bad_request("each input must be an object with a string name")
        name = item["name"]
        iparams = item.get("parameters") or {}
        if not isinstance(iparams, dict):
            raise bad_request(f"input {name!r}: parameters must be an object")
        datatype, shape = check_input(
            name, item.get("datatype"), item.get("shape"), iparams, inputs
        )
        nbytes = iparams.get("binary_data_size")
        if nbytes is not None:
            if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
                raise bad_request(f"input {name!r}: binary_data_size must be a non-negative int")
            if offset + nbytes > size:
                raise bad_request(
                    f"input {name!r}: binary_data_size {nbytes} runs past the end of the body"
                )
            tensor = tensor_from_bytes(name, datatype, shape, view[offset : offset + nbytes])
            offset += nbytes
        elif "data" in item:
            tensor = tensor_from_data(name, datatype, shape, item["data"])
        else:
            raise bad_request(f"input {name!r} has neither data nor binary_data_size")
        inputs[name] = InputTensor(name, datatype, tensor)
    if offset != size:
        raise bad_request(
            f"{size - offset} bytes after the binary inputs are not claimed by any input"
        )

    raw_outputs = head.get("outputs")
    outputs: tuple[RequestedOutput, ...] | None = None
    if raw_outputs is not None:
        if not isinstance(raw_outputs, list):
            raise bad_request("outputs must be a list")
        seen: list[RequestedOutput] = []
        for item in raw_outputs:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise bad_request("each requested output must be an object with a string name")
            oparams = item.get("parameters") or {}
            if not isinstance(oparams, dict):
                raise bad_request(f"output {item['name']!r}: parameters must be an object")
            check_output(item["name"], oparams, seen)
            binary = oparams.get("binary_data", binary_all)
            seen.append(RequestedOutput(item["name"], _as_bool(binary, "binary_data")))
        outputs = tuple(seen) if seen else None
    return InferRequest(request_id, dict(params), inputs, outputs, binary_all)


def check_json_outputs(
    outputs: Mapping[str, tuple[tuple[int, ...], str]],
    request: InferRequest,
    json_max_elements: int,
) -> None:
    """Refuse, before computing, outputs that cannot travel as JSON: FP16/BF16, or more elements
    in total than `json_max_elements`. `outputs`: name -> (shape, datatype)."""
    total = 0
    for name, (shape, datatype) in outputs.items():
        if request.binary(name):
            continue
        if datatype in BINARY_ONLY:
            raise bad_request(
                f"output {name!r} is {datatype}, which travels only as binary: "
                "request it with binary_data=true"
            )
        total += math.prod(shape)
    if total > json_max_elements:
        raise bad_request(
            f"JSON outputs would hold {total} elements, more than the limit of "
            f"{json_max_elements}: request them with binary_data=true"
        )


def _json_data(t: torch.Tensor, name: str) -> np.ndarray[Any, Any]:
    data = t.detach().to("cpu").contiguous().reshape(-1).numpy()
    if data.dtype.kind == "f" and not np.isfinite(data).all():
        raise bad_request(
            f"output {name!r} holds non-finite values (masked -inf) that JSON cannot carry: "
            "request it with binary_data=true"
        )
    return data


def encode_infer_response(
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: Sequence[OutputTensor],
    parameters: Mapping[str, Any] | None = None,
) -> EncodedResponse:
    """The response: JSON header, then the binary outputs' bytes in output order.

    A binary output on the CPU is sent as a view of its memory (a row range of a cached table is
    never copied); one on a GPU is copied to the host once.
    """
    head: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        head["id"] = request_id
    if parameters:
        head["parameters"] = dict(parameters)
    entries: list[dict[str, Any]] = []
    blobs: list[memoryview] = []
    for out in outputs:
        t = out.tensor
        datatype = DATATYPE_OF[t.dtype]
        entry: dict[str, Any] = {"name": out.name, "datatype": datatype, "shape": list(t.shape)}
        if out.binary:
            entry["parameters"] = {"binary_data_size": t.numel() * t.element_size()}
            blobs.append(host_bytes(t))
        else:
            entry["data"] = _json_data(t, out.name)
        entries.append(entry)
    head["outputs"] = entries
    header = orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return EncodedResponse([header], "application/json")
    return EncodedResponse(
        [header, *blobs], "application/octet-stream", {HEADER_LENGTH: str(len(header))}
    )


PINNED_MIN_BYTES = 1 << 20
"""GPU outputs at least this large are copied into pinned (page-locked) host memory: a
device-to-host copy into pageable memory is staged through a driver buffer, into pinned memory
it is one DMA at full bus speed. torch's caching host allocator reuses the pinned blocks, so the
allocation is paid once; below this size the copy is too short for it to matter."""


def host_bytes(t: torch.Tensor) -> memoryview:
    """The little-endian bytes of `t` in row-major order, as a byte view of host memory (no copy
    when `t` is a contiguous CPU tensor; one device-to-host copy, into pinned memory when large,
    for a GPU tensor; BF16 as its bits)."""
    src = t.detach()
    if src.device.type == "cpu":
        cpu = src.contiguous()
    elif src.numel() * src.element_size() >= PINNED_MIN_BYTES:
        cpu = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        cpu.copy_(src)  # synchronous: the bytes are complete when the response is encoded
    else:
        cpu = src.to("cpu").contiguous()
    if cpu.dtype == torch.bfloat16:
        cpu = cpu.view(torch.int16)
    return cpu.numpy().reshape(-1).data.cast("B")


def error_body(message: str) -> bytes:
    """`{"error": message}`: the error shape tritonclient decodes."""
    return orjson.dumps({"error": message})
