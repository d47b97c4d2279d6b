"""Wire formats of a table, one complete record each, and their negotiation.

A `Format` holds everything about one format: its name (the `format` query parameter), media
type and aliases (for `Accept` and for uploads' `Content-Type`), file suffix, its encoder
(`encode.py`) and, for formats a table can be uploaded in, its decoder and magic-byte test
(`decode.py`), and what it can carry and do: one tensor only (`single`), numpy dtypes only
(`numpy`), a zero-copy view of a CPU table (`zero_copy`), byte ranges (`ranges`, `ranges.py`),
per-tensor headers, and a text body (capped by `json_max_elements`, charged per element).
Negotiation, upload parsing, the OpenAPI parameters and media types (`params.py`) and every
serving decision read these records: a new format is one record here plus its tests. Format
choice: the `format` query parameter wins, else the `Accept` header (q-values honoured), else
safetensors.

| format      | media type                  | tensors     | notes                                  |
|-------------|-----------------------------|-------------|----------------------------------------|
| safetensors | application/vnd.safetensors | all/one     | metadata: key, kind, spec, meta; bf16  |
| npz         | application/x-npz           | all/one     | numpy has no bfloat16: 400             |
| npy         | application/x-npy           | exactly one | numpy has no bfloat16: 400             |
| raw         | application/octet-stream    | exactly one | little-endian, X-Posenc-Dtype/-Shape   |
| json        | application/json            | all/one     | up to `json_max_elements` elements     |
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from posenc.api.error_types import NOT_ACCEPTABLE, UNKNOWN_FORMAT
from posenc.api.errors import ApiError
from posenc.api.serving.decode import (
    decode_npy,
    decode_safetensors,
    is_npy,
    is_safetensors,
)
from posenc.api.serving.encode import (
    Encoding,
    encode_json,
    encode_npy,
    encode_npz,
    encode_raw,
    encode_safetensors,
)
from posenc.encodings import TensorInfo
from posenc.runtime import Buffer

JSON_BYTES_PER_ELEMENT = 24
"""What a text body is charged per element (orjson writes a float32 in at most ~16 characters
plus a separator; integers in fewer)."""


def _tensor_headers(info: TensorInfo) -> dict[str, str]:
    """A bare tensor's dtype and shape, which its bytes do not say."""
    return {"X-Posenc-Dtype": info.dtype, "X-Posenc-Shape": ",".join(str(d) for d in info.shape)}


@dataclass(frozen=True)
class Format:
    """One wire format of a table (see the module docstring)."""

    name: str
    media_type: str
    aliases: tuple[str, ...]
    suffix: str
    encode: Callable[[Encoding], Buffer]
    single: bool = False
    numpy: bool = False
    zero_copy: bool = False
    ranges: bool = False
    text: bool = False
    headers: Callable[[TensorInfo], dict[str, str]] | None = None
    decode: Callable[[bytes, str | None, int], torch.Tensor] | None = None
    sniff: Callable[[bytes], bool] | None = None

    @property
    def media_types(self) -> tuple[str, ...]:
        """The media type and its aliases: what `Accept` and `Content-Type` may name."""
        return (self.media_type, *self.aliases)

    def charge(self, nbytes: int) -> int:
        """Bytes a body of `nbytes` of tensor data takes while sent (a text body more)."""
        return max(nbytes, JSON_BYTES_PER_ELEMENT * (nbytes // 2)) if self.text else nbytes


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format(
            "safetensors",
            "application/vnd.safetensors",
            ("application/safetensors", "application/x-safetensors"),
            "safetensors",
            encode_safetensors,
            decode=decode_safetensors,
            sniff=is_safetensors,
        ),
        Format("npz", "application/x-npz", ("application/zip",), "npz", encode_npz, numpy=True),
        Format(
            "npy",
            "application/x-npy",
            ("application/npy",),
            "npy",
            encode_npy,
            single=True,
            numpy=True,
            decode=decode_npy,
            sniff=is_npy,
        ),
        Format(
            "raw",
            "application/octet-stream",
            (),
            "bin",
            encode_raw,
            single=True,
            zero_copy=True,
            ranges=True,
            headers=_tensor_headers,
        ),
        Format("json", "application/json", (), "json", encode_json, text=True),
    )
}
"""Every table format by name; the first is the default."""

DEFAULT = FORMATS["safetensors"]
DEFAULT_FORMAT = DEFAULT.name

UPLOADS: dict[str, Format] = {f.name: f for f in FORMATS.values() if f.decode is not None}
"""The formats a weight table can be uploaded in (`POST /v1/uploads`)."""

_BY_MEDIA_TYPE = {m: f.name for f in FORMATS.values() for m in f.media_types}


def negotiate(format_param: str | None, accept: str | None) -> Format:
    """The format for a request: `format` query parameter, else `Accept`, else safetensors.

    Raises `ApiError` 400 for an unknown `format`, 406 when `Accept` names nothing we serve.
    """
    if format_param is not None:
        fmt = FORMATS.get(format_param.strip().lower())
        if fmt is None:
            raise ApiError(
                UNKNOWN_FORMAT,
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
            NOT_ACCEPTABLE,
            f"none of the media types in Accept are served; offered: {', '.join(offered)}",
            {"accept": accept, "offered": offered},
        )
    choices.sort(key=lambda c: (-c[0], c[1]))
    return FORMATS[choices[0][2]]
