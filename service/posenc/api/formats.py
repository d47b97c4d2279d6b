"""Wire formats of a table and their negotiation: safetensors, npz, npy, raw, json.

Builders take CPU tensors and return bytes; no math happens here beyond choosing, slicing and
packing tensors. Format choice: the `format` query parameter wins, else the `Accept` header
(q-values honoured), else safetensors.

| format      | media type                  | tensors     | notes                                  |
|-------------|-----------------------------|-------------|----------------------------------------|
| safetensors | application/vnd.safetensors | all/one     | metadata: key, kind, spec, meta; bf16  |
| npz         | application/x-npz           | all/one     | numpy has no bfloat16: 400             |
| npy         | application/x-npy           | exactly one | numpy has no bfloat16: 400             |
| raw         | application/octet-stream    | exactly one | little-endian, X-Posenc-Dtype/-Shape   |
| json        | application/json            | all/one     | up to `json_max_elements` elements     |
"""

from __future__ import annotations

import io
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import torch
from safetensors.torch import save as safetensors_save

from posenc.api.errors import ApiError
from posenc.encodings import TensorInfo
from posenc.encodings.memory import empty


@dataclass(frozen=True)
class Format:
    """One wire format: its name, media type, accepted aliases and whether it holds one tensor."""

    name: str
    media_type: str
    aliases: tuple[str, ...]
    single: bool
    numpy: bool
    suffix: str


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format(
            "safetensors",
            "application/vnd.safetensors",
            ("application/safetensors", "application/x-safetensors"),
            single=False,
            numpy=False,
            suffix="safetensors",
        ),
        Format("npz", "application/x-npz", ("application/zip",), False, True, "npz"),
        Format("npy", "application/x-npy", ("application/npy",), True, True, "npy"),
        Format("raw", "application/octet-stream", (), True, False, "bin"),
        Format("json", "application/json", (), False, False, "json"),
    )
}
DEFAULT_FORMAT = "safetensors"

_BY_MEDIA_TYPE = {m: f.name for f in FORMATS.values() for m in (f.media_type, *f.aliases)}

NUMPY_DTYPES = {"float32", "float64", "float16", "int64", "int32"}


def negotiate(format_param: str | None, accept: str | None) -> Format:
    """The format for a request: `format` query parameter, else `Accept`, else safetensors.

    Raises `ApiError` 400 for an unknown `format`, 406 when `Accept` names nothing we serve.
    """
    if format_param is not None:
        fmt = FORMATS.get(format_param.strip().lower())
        if fmt is None:
            raise ApiError(
                400,
                "unknown_format",
                f"unknown format {format_param!r}",
                [{"field": "format", "message": f"must be one of {sorted(FORMATS)}"}],
            )
        return fmt
    if not accept or not accept.strip():
        return FORMATS[DEFAULT_FORMAT]
    choices: list[tuple[float, int, str]] = []
    for order, item in enumerate(accept.split(",")):
        media, _, params = item.strip().partition(";")
        media = media.strip().lower()
        q = 1.0
        for param in params.split(";"):
            name, _, value = param.strip().partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if not math.isfinite(q) or q <= 0:
            continue
        if media in ("*/*", "application/*"):
            choices.append((q, order, DEFAULT_FORMAT))
        elif media in _BY_MEDIA_TYPE:
            choices.append((q, order, _BY_MEDIA_TYPE[media]))
    if not choices:
        offered = sorted(f.media_type for f in FORMATS.values())
        raise ApiError(
            406,
            "not_acceptable",
            f"none of the media types in Accept are served; offered: {', '.join(offered)}",
            {"accept": accept, "offered": offered},
        )
    choices.sort(key=lambda c: (-c[0], c[1]))
    return FORMATS[choices[0][2]]


@dataclass(frozen=True)
class Selection:
    """Which tensors a response carries, and which positions: `rows` is half-open (START, END),
    or None for all of them (a range covering the whole table is normalised to None). `axes`:
    each named tensor's position axis (`TensorInfo.row_axis`), the one `rows` slices; tensors
    without one (inv_freq, slopes) are sent whole."""

    names: tuple[str, ...]
    rows: tuple[int, int] | None
    axes: tuple[int | None, ...]


ROWS_PATTERN = re.compile(r"([0-9]*):([0-9]*)")
RANGE_PATTERN = re.compile(r"[Bb][Yy][Tt][Ee][Ss][ \t]*=[ \t]*([0-9]*)[ \t]*-[ \t]*([0-9]*)")
"""`START:END` in ASCII digits only (`int()` would also take `١:٢`, `+1`, ` 1`, `1_0`)."""


def parse_rows(text: str | None) -> tuple[int, int] | None:
    """`START:END` (either may be empty; ASCII digits only) -> (start, end-or--1); 400 on any
    other spelling."""
    if text is None:
        return None
    match = ROWS_PATTERN.fullmatch(text)
    if match is None:
        raise ApiError(
            400,
            "invalid_rows",
            f"rows must be START:END with non-negative integers in ASCII digits, got {text!r}",
            [{"field": "rows", "message": "expected START:END ([0-9]*:[0-9]*)", "value": text}],
        )
    start_text, end_text = match.groups()
    return int(start_text or 0), int(end_text) if end_text else -1


def select(
    kind: str,
    outputs: dict[str, TensorInfo],
    fmt: Format,
    tensor: str | None,
    rows: tuple[int, int] | None,
) -> Selection:
    """Validate `tensor` and `rows` against the spec's outputs, before anything is computed."""
    names = tuple(outputs)
    if tensor is not None:
        if tensor not in outputs:
            raise ApiError(
                400,
                "unknown_tensor",
                f"this table has no tensor {tensor!r}; it has {list(names)}",
                [{"field": "tensor", "message": f"must be one of {list(names)}", "value": tensor}],
            )
        names = (tensor,)
    elif fmt.single and len(names) > 1:
        raise ApiError(
            400,
            "tensor_required",
            f"format {fmt.name} carries one tensor: add tensor=NAME, one of {list(names)}",
            [{"field": "tensor", "message": f"required, one of {list(names)}", "value": None}],
        )
    if fmt.numpy:
        bad = [n for n in names if outputs[n].dtype not in NUMPY_DTYPES]
        if bad:
            raise ApiError(
                400,
                "unsupported_dtype",
                f"numpy has no {outputs[bad[0]].dtype}: fetch {bad} as safetensors or raw",
                [{"field": "format", "message": "no numpy dtype for " + ", ".join(bad)}],
            )
    axes = tuple(outputs[n].row_axis for n in names)
    if rows is None:
        return Selection(names, None, axes)
    lengths = {outputs[n].shape[a] for n, a in zip(names, axes, strict=True) if a is not None}
    if len(lengths) != 1:
        raise ApiError(
            400,
            "rows_unsupported",
            f"rows= needs a tensor with a position axis; {list(names)} of kind {kind} have none",
            [{"field": "rows", "message": "no position axis in the selected tensors"}],
        )
    total = lengths.pop()
    start, end = rows
    end = total if end == -1 else end
    if not start < end <= total:
        raise ApiError(
            400,
            "invalid_rows",
            f"rows {start}:{end} outside the table's {total} positions "
            f"(need START < END <= {total})",
            [{"field": "rows", "message": f"need 0 <= START < END <= {total}", "value": rows}],
        )
    return Selection(names, None if (start, end) == (0, total) else (start, end), axes)


def selected_infos(outputs: dict[str, TensorInfo], sel: Selection) -> dict[str, TensorInfo]:
    """Shapes and dtypes of what `sel` sends (row slices applied), without computing anything."""
    out: dict[str, TensorInfo] = {}
    for name, axis in zip(sel.names, sel.axes, strict=True):
        info = outputs[name]
        if sel.rows is not None and axis is not None:
            shape = list(info.shape)
            shape[axis] = sel.rows[1] - sel.rows[0]
            info = TensorInfo(tuple(shape), info.dtype, axis)
        out[name] = info
    return out


def selected_tensors(tensors: dict[str, torch.Tensor], sel: Selection) -> dict[str, torch.Tensor]:
    """The selected tensors, row-sliced and contiguous, on their own device (views when they
    are already contiguous)."""
    out: dict[str, torch.Tensor] = {}
    for name, axis in zip(sel.names, sel.axes, strict=True):
        t = tensors[name]
        if sel.rows is not None and axis is not None:
            t = t.narrow(axis, sel.rows[0], sel.rows[1] - sel.rows[0])
        out[name] = t.detach().contiguous()
    return out


def cpu_tensors(tensors: dict[str, torch.Tensor], sel: Selection) -> dict[str, Any]:
    """The selected tensors, row-sliced, contiguous and on the CPU (views when already there)."""
    return {n: t.to("cpu") for n, t in selected_tensors(tensors, sel).items()}


def raw_view(t: torch.Tensor) -> memoryview:
    """Little-endian bytes of a contiguous CPU tensor, without copying (bfloat16 as its bits)."""
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().data.cast("B")


SAFETENSORS_DTYPES: dict[torch.dtype, tuple[int, str]] = {
    torch.bool: (0, "BOOL"),
    torch.uint8: (4, "U8"),
    torch.int8: (5, "I8"),
    torch.int16: (9, "I16"),
    torch.float16: (11, "F16"),
    torch.bfloat16: (12, "BF16"),
    torch.int32: (13, "I32"),
    torch.float32: (15, "F32"),
    torch.float64: (17, "F64"),
    torch.int64: (18, "I64"),
}
"""safetensors' name of each dtype and its position in the library's `Dtype` enum, which orders
the tensors of a file (larger first, then by name)."""


def build_safetensors(
    tensors: dict[str, torch.Tensor], metadata: dict[str, str]
) -> bytes | memoryview:
    """A safetensors file holding `tensors` (bfloat16 native; on any device) and string
    `metadata`.

    The file `safetensors.torch.save` writes (its tensor order, header JSON and padding), except
    that the metadata keys are sorted: the library writes them in its hash map's order, which
    changes from process to process, so equal tables had unequal bytes across replicas. Built with
    one copy of the data into one uninitialised buffer and returned as a memoryview of it (the
    library copies twice, into its own buffer and then into a new `bytes`, and every copy of a
    large table is as many fresh pages to fault in). Dtypes without an entry go through the
    library.
    """
    if any(t.dtype not in SAFETENSORS_DTYPES for t in tensors.values()):
        data: bytes = safetensors_save({n: t.cpu() for n, t in tensors.items()}, metadata=metadata)
        return data
    order = sorted(tensors.items(), key=lambda kv: (-SAFETENSORS_DTYPES[kv[1].dtype][0], kv[0]))
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for name, t in order:
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[t.dtype][1],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    start = 8 + len(text)
    out = empty((start + offset,), torch.uint8)  # its own mapping when large (encodings.memory)
    out[:start] = torch.frombuffer(
        bytearray(len(text).to_bytes(8, "little") + text), dtype=torch.uint8
    )
    for _, t in order:
        size = t.numel() * t.element_size()
        # a GPU tensor is copied device-to-host straight into the body: one transfer, no
        # intermediate host copy
        out[start : start + size] = t.detach().reshape(-1).view(torch.uint8)
        start += size
    return out.numpy().data


def build_npz(tensors: dict[str, torch.Tensor]) -> bytes:
    """An uncompressed `.npz` archive (numpy.savez) of `tensors`."""
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=False, **{k: v.numpy() for k, v in tensors.items()})
    return buf.getvalue()


def build_npy(t: torch.Tensor) -> bytes:
    """A `.npy` file (numpy.save) of one tensor."""
    buf = io.BytesIO()
    np.save(buf, t.numpy(), allow_pickle=False)
    return buf.getvalue()


def build_json(tensors: dict[str, torch.Tensor], head: dict[str, Any]) -> bytes:
    """`{**head, "tensors": {name: {"dtype", "shape", "data"}}}` via orjson (bfloat16 as float)."""
    body: dict[str, Any] = dict(head)
    out: dict[str, Any] = {}
    for name, t in tensors.items():
        dtype = str(t.dtype).removeprefix("torch.")
        values = t.float() if t.dtype == torch.bfloat16 else t
        out[name] = {"dtype": dtype, "shape": list(t.shape), "data": values.numpy()}
    body["tensors"] = out
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def content_range(header: str | None, size: int) -> tuple[int, int] | bool | None:
    """Parse a single `bytes=` Range against `size`: (first, last) inclusive, None to ignore the
    header (absent, malformed or multi-range), False when unsatisfiable (416)."""
    if not header:
        return None
    match = RANGE_PATTERN.fullmatch(header.strip())
    if match is None:  # another unit, several ranges, or not ASCII digits: ignored
        return None
    first_text, last_text = match.groups()
    if not first_text:
        if not last_text:
            return None
        suffix = int(last_text)
        if suffix <= 0:
            return False
        return max(0, size - suffix), size - 1
    first = int(first_text)
    last = int(last_text) if last_text else max(first, size - 1)
    if first < 0 or last < first:
        return None
    if first >= size:
        return False
    return first, min(last, size - 1)
