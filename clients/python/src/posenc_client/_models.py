"""What the client returns (`Tables`, `ResolvedSpec`, `ResolvedSpecs`, `UnservedPart`, `Preset`,
`OnnxModel`), the keywords its
convenience methods take (`RopeOptions`, `AlibiOptions`, `SinusoidalOptions`, `T5BiasOptions`,
`OnnxOptions`: each declared once, here, and spelled out in the clients' signatures with
`typing.Unpack`), and the spec builders that turn those keywords into the server's spec JSON."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from posenc_client._exceptions import DecodeError, InvalidRowsError
from posenc_client._formats import Array, Buffer, dtype_name, parse_safetensors, save_arrays

if TYPE_CHECKING:
    import onnx
    import torch

JSON = dict[str, Any]


class RopeScalingOptions(TypedDict, total=False):
    """The keys of transformers' `rope_scaling` / `rope_parameters` that the `rope` spec's
    `rope_scaling` field holds; `rope()` takes them flat, as a config.json writes them, and moves
    them there. Which keys a `rope_type` reads is the server's business (`GET /v1/kinds`)."""

    rope_type: str | None
    factor: float | None
    low_freq_factor: float | None
    high_freq_factor: float | None
    original_max_position_embeddings: int | None
    beta_fast: float | None
    beta_slow: float | None
    mscale: float | None
    mscale_all_dim: float | None
    attention_factor: float | None
    truncate: bool | None
    short_factor: Sequence[float] | None
    long_factor: Sequence[float] | None
    alpha: float | None


ROPE_SCALING_KEYS: frozenset[str] = RopeScalingOptions.__optional_keys__
"""Keys of transformers' `rope_scaling` / `rope_parameters` that the `rope_scaling` spec field
holds (those of `RopeScalingOptions`); `rope()` moves them there when given flat, as a
config.json writes them."""

LENGTH_SCALED_TYPES: frozenset[str] = frozenset({"dynamic", "longrope"})
"""rope_types whose `rope_scaling` holds the model's `max_position_embeddings` (their scaling
depends on it); tests/client/test_rope_scaling_keys.py ties this to the server's registry."""


class RopeOptions(RopeScalingOptions, total=False):
    """The keywords of `Client.rope` / `AsyncClient.rope` after `head_dim` and `max_positions`,
    named as in transformers' configs (None: the server's default): the flat scaling keys it
    inherits from `RopeScalingOptions`, and `type`, transformers' old alias of `rope_type`."""

    rope_theta: float | None
    partial_rotary_factor: float | None
    rotary_dim: int | None
    rope_scaling: Mapping[str, Any] | None
    rope_parameters: Mapping[str, Any] | None
    max_position_embeddings: int | None
    type: str | None
    seq_len: int | None
    profile: str | None
    width: str | None
    interleaved: bool | None
    full_layout: str | None
    packing: str | None
    dtype: str | None
    precision: str | None


class AlibiOptions(TypedDict, total=False):
    """The keywords of `Client.alibi` / `AsyncClient.alibi` after `num_heads` (the `alibi` spec's
    fields; None: the server's default)."""

    bias: str | None
    query_length: int | None
    key_length: int | None
    query_offset: int | None
    masked_value: str | None
    alibi_bias_max: float | None
    slope_scale: float | None
    slope_rounding: str | None
    bias_rounding: str | None
    interpolation_factor: float | None
    tp_size: int | None
    tp_rank: int | None
    dtype: str | None


class SinusoidalOptions(TypedDict, total=False):
    """The keywords of `Client.sinusoidal` / `AsyncClient.sinusoidal` after `dim` and
    `max_positions` (the `sinusoidal` spec's fields; None: the convention's or server's
    default)."""

    convention: str | None
    positions: Sequence[float] | None
    base: float | None
    freq_shift: float | None
    layout: str | None
    position_offset: int | None
    padding_idx: int | None
    odd_dim: str | None
    compute_dtype: str | None
    scale: float | None
    dtype: str | None
    frequencies: str | None
    position_step: int | None
    standardize: str | None


class T5BiasOptions(TypedDict, total=False):
    """The keywords of `Client.t5_bias` / `AsyncClient.t5_bias` besides `query_length` (the
    `t5_bias` spec's fields; None: the server's default). `relative_attention_bias` is the
    checkpoint's (num_buckets, H) weight, for the (H, Q, K) `bias`."""

    key_length: int | None
    query_offset: int | None
    num_buckets: int | None
    max_distance: int | None
    bidirectional: bool | None
    relative_attention_bias: Sequence[Sequence[float]] | None
    dtype: str | None


class OnnxOptions(TypedDict, total=False):
    """The export options of `Client.onnx` / `AsyncClient.onnx` besides `graph` (unset or
    empty: the server's default)."""

    opset: int | None
    mode: str | None
    op: str | None
    num_heads: int | None
    inputs: str | None


def _drop_none(fields: Mapping[str, Any]) -> JSON:
    return {k: v for k, v in fields.items() if v is not None}


def rope_spec(**fields: Any) -> JSON:
    """A `rope` spec from transformers-style keywords (None values are dropped).

    Scaling keys (`rope_type` or its alias `type`, `factor`, `low_freq_factor`, ...) go into
    `rope_scaling`; `rope_parameters` (transformers 5) is split into `rope_theta`,
    `partial_rotary_factor` and `rope_scaling`; a flat `max_position_embeddings` becomes the
    default `max_positions` and, for `dynamic` and `longrope`, also `rope_scaling`'s own field.
    Everything else is a spec field (`head_dim`, `profile`, `dtype`, `width`, ...).
    """
    data = _drop_none(fields)
    scaling = dict(data.pop("rope_scaling", None) or {})
    parameters = dict(data.pop("rope_parameters", None) or {})
    for name in ("rope_theta", "partial_rotary_factor"):
        if name in parameters:
            data.setdefault(name, parameters.pop(name))
    scaling.update(parameters)
    for name in sorted(ROPE_SCALING_KEYS | {"type"}):
        if name in data:
            scaling[name] = data.pop(name)
    if "type" in scaling:
        scaling.setdefault("rope_type", scaling.pop("type"))
        scaling.pop("type", None)
    max_position_embeddings = data.pop("max_position_embeddings", None)
    if max_position_embeddings is not None:
        data.setdefault("max_positions", max_position_embeddings)
        if scaling.get("rope_type") in LENGTH_SCALED_TYPES:
            scaling.setdefault("max_position_embeddings", max_position_embeddings)
    spec: JSON = {"kind": "rope", **data}
    if scaling:
        spec["rope_scaling"] = scaling
    return spec


def family_spec(kind: str, **fields: Any) -> JSON:
    """`{"kind": kind, **fields}` without the None values."""
    return {"kind": kind, **_drop_none(fields)}


def onnx_body(spec: Mapping[str, Any], graph: str, options: OnnxOptions) -> JSON:
    """The POST /v1/onnx body: the spec and the export options that are set. An option
    `OnnxOptions` does not name is a TypeError, as for any unexpected keyword argument."""
    unknown = sorted(options.keys() - OnnxOptions.__optional_keys__)
    if unknown:
        raise TypeError(f"onnx() got unexpected keyword arguments {unknown}")
    return {"spec": dict(spec), "graph": graph, **{k: v for k, v in options.items() if v}}


def load_config(config: str | os.PathLike[str] | Mapping[str, Any]) -> JSON:
    """A transformers config: a dict, a config.json path, or a folder holding config.json."""
    if isinstance(config, Mapping):
        return dict(config)
    path = os.fspath(config)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a config.json holds a JSON object, got {type(data).__name__}")
    return data


@dataclass(frozen=True, eq=False)
class Tables(Mapping[str, Array]):
    """The tensors of one served table, by name, with what identifies them.

    A mapping from tensor name (`cos`, `sin`, `inv_freq`, `slopes`, `bias`, `embedding`,
    `buckets`, ...) to numpy arrays, zero-copy views of the received buffer (writing to them never
    touches the disk cache): bfloat16 tables are `ml_dtypes.bfloat16` arrays, every other dtype is
    native numpy. Attributes:

    - `key`: the content key (sha256 of the canonical spec and the algorithm version);
    - `kind`: the family; `spec`: the canonical spec (every default filled in);
    - `meta`: the server's facts (shapes, dtypes, attention_scaling, rotary_dim, device, ...);
    - `notes`: what a runtime must know beside the table (from `resolve`; empty otherwise);
    - `name`: the table's name in a model (`rope`, `rope:sliding_attention`, ...) or None.
    """

    key: str
    kind: str
    spec: JSON
    meta: JSON
    arrays: dict[str, Array]
    notes: JSON = field(default_factory=dict)
    name: str | None = None
    raw: Buffer | None = field(default=None, repr=False)

    @classmethod
    def from_safetensors(cls, data: Buffer, *, name: str | None = None) -> Tables:
        """Tables from the server's safetensors bytes (arrays are views of `data`); a header
        without the posenc metadata (`key`, `kind`, `spec` and `meta` as JSON) is a
        `DecodeError`."""
        arrays, metadata = parse_safetensors(data)
        try:
            key = metadata["key"]
            kind = metadata["kind"]
            spec = json.loads(metadata["spec"])
            meta = json.loads(metadata.get("meta", "{}"))
        except (KeyError, json.JSONDecodeError) as err:
            raise DecodeError(f"the table carries no posenc metadata: {err}") from None
        return cls(key, kind, spec, meta, arrays, name=name, raw=data)

    def __getitem__(self, name: str) -> Array:
        try:
            return self.arrays[name]
        except KeyError:
            raise KeyError(
                f"no tensor {name!r} in this {self.kind} table; it has {list(self.arrays)}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.arrays)

    def __len__(self) -> int:
        return len(self.arrays)

    def __repr__(self) -> str:
        shapes = ", ".join(
            f"{n}: {dtype_name(a.dtype)}{list(a.shape)}" for n, a in self.arrays.items()
        )
        label = f" {self.name!r}" if self.name else ""
        return f"<Tables{label} {self.kind} {self.key[:12]} {{{shapes}}}>"

    @property
    def etag(self) -> str:
        """The server's strong ETag for these bytes as safetensors: `"<key>"` for the whole
        table, `"<key>.safetensors.<start>-<end>"` for rows [start, end) (`meta["rows"]`), and
        `@<device>` after either for a table built off the CPU (`meta["device"]`)."""
        meta = self.meta
        tag = self.key
        rows = meta.get("rows")
        if isinstance(rows, list) and len(rows) == 2:
            tag = f"{tag}.safetensors.{rows[0]}-{rows[1]}"
        device = str(meta.get("device", "cpu"))
        return f'"{tag}"' if device == "cpu" else f'"{tag}@{device}"'

    @property
    def dtypes(self) -> dict[str, str]:
        """Tensor name -> dtype name (`float32`, `bfloat16`, ...)."""
        return {n: dtype_name(a.dtype) for n, a in self.arrays.items()}

    def with_notes(self, notes: Mapping[str, Any], name: str | None) -> Tables:
        """A copy carrying `notes` and `name` (the arrays are shared)."""
        return Tables(
            self.key, self.kind, self.spec, self.meta, self.arrays, dict(notes), name, self.raw
        )

    def to_torch(self, device: str | None = None) -> dict[str, torch.Tensor]:
        """The tensors as torch tensors (bfloat16 included), copied, on `device` (CPU default).

        Needs torch (`pip install posenc-client[torch]`); torch is imported only here.
        """
        try:
            import torch
        except ImportError as err:
            raise ImportError(
                "Tables.to_torch needs torch: pip install 'posenc-client[torch]'"
            ) from err
        out: dict[str, torch.Tensor] = {}
        for name, array in self.arrays.items():
            if array.dtype.name == "bfloat16":
                bits = torch.from_numpy(np.array(array.view(np.uint16)))
                tensor = bits.view(torch.bfloat16)
            else:
                tensor = torch.from_numpy(np.array(array))
            out[name] = tensor.to(device) if device is not None else tensor
        return out

    def save(self, path: str | os.PathLike[str], *, tensor: str | None = None) -> None:
        """Write the table by suffix: `.safetensors` (the server's file as received, metadata
        included, unless `tensor=` picks one), `.npz` or `.npy` (`tensor=NAME`, or the only one).
        numpy formats cannot hold bfloat16 (ValueError)."""
        from posenc_client._formats import write_atomic

        suffix = os.path.splitext(os.fspath(path))[1].lower()
        if suffix == ".safetensors" and tensor is None and self.raw is not None:
            write_atomic(path, self.raw)
            return
        metadata = {
            "key": self.key,
            "kind": self.kind,
            "spec": json.dumps(self.spec, sort_keys=True, separators=(",", ":")),
            "meta": json.dumps(self.meta, separators=(",", ":")),
        }
        save_arrays(path, self.arrays, metadata=metadata, tensor=tensor)


Rows = tuple[int, int | None] | list[int] | slice
"""A `rows=` argument: `(start, end)` or `[start, end]` (positions [start, end); `end=None`: to
the last one) or `slice(start, end)` (no step)."""

ROW_AXES: dict[str, dict[str, int | None]] = {
    "rope": {"cos": 0, "sin": 0, "cos_sin": 0, "pairs": 0, "inv_freq": None},
    "xpos": dict.fromkeys(
        ("cos", "sin", "scale_q", "scale_k", "cos_q", "sin_q", "cos_k", "sin_k"), 0
    ),
    "alibi": {"slopes": None, "bias": 1},
    "t5_bias": {"buckets": 0, "bias": 1},
    "relative_index": {"index": 0, "bias": 1},
    "sinusoidal": {"embedding": 0},
    "learned": {"embedding": 0},
    "normalized": {"embedding": -1},
    "sinusoidal_2d": {"embedding": None},
    "vision_rope": {"cos": 0, "sin": 0},
}
"""Each family's position axis per tensor, as the server declares it (`TensorInfo.row_axis`):
the axis a `rows=` range slices (the query axis of a (H, Q, K) bias), None for tensors sent
whole (`inv_freq`, `slopes`); negative counts from the end (normalized's `embedding` is (P,) or
(B, P)). A kind or tensor not listed is never sliced here: its rows come from the server."""


def rows_error(error_type: str, message: str, value: Any) -> InvalidRowsError:
    """The `InvalidRowsError` the client raises itself, shaped as the server's answer."""
    detail = [{"field": "rows", "message": message, "value": value}]
    return InvalidRowsError(message, status=400, error_type=error_type, detail=detail)


def rows_arg(rows: Rows) -> tuple[int, int | None]:
    """`(start, end_or_None)` from a `rows=` argument; `InvalidRowsError` unless it is
    `(start, end)`, `[start, end]` or `slice(start, end)` with integers `0 <= start < end`
    (`end` may be None: to the last position; a slice's `start` may be None: 0)."""
    if isinstance(rows, slice):
        if rows.step not in (None, 1):
            raise rows_error("invalid_rows", f"rows take no step, got {rows!r}", repr(rows))
        start, end = (0 if rows.start is None else rows.start), rows.stop
    elif isinstance(rows, tuple | list) and len(rows) == 2:
        start, end = rows
    else:
        raise rows_error(
            "invalid_rows", f"rows must be (start, end) or a slice, got {rows!r}", repr(rows)
        )
    for bound in (start, end):
        if bound is not None and (type(bound) is bool or not isinstance(bound, int)):
            message = f"rows must be integers, got {rows!r}"
            raise rows_error("invalid_rows", message, repr(rows))
    if not isinstance(start, int) or start < 0 or (end is not None and end <= start):
        raise rows_error("invalid_rows", f"rows need 0 <= start < end, got {rows!r}", [start, end])
    return start, end


def rows_param(start: int, end: int | None) -> str:
    """The `rows` query parameter: `START:END`, or `START:` to the last position."""
    return f"{start}:{'' if end is None else end}"


def slice_rows(tables: Tables, start: int, end: int | None) -> Tables | None:
    """Rows [start, end) of a whole table, as the server would send them, without a request.

    None when this client does not know the table's position axes (`ROW_AXES`): ask the
    server. Raises `InvalidRowsError` as the server does: `rows_unsupported` for a table
    without a position axis, `invalid_rows` for a range past its positions. A range covering
    every position is the table itself (the server answers the whole table then, without
    `meta["rows"]`); otherwise arrays are contiguous copies of those rows (the whole table's
    buffer is not kept alive) and `meta["rows"]` is `[start, end]`.
    """
    layout = ROW_AXES.get(tables.kind)
    if layout is None or any(name not in layout for name in tables.arrays):
        return None
    axes: dict[str, int | None] = {}
    for name, array in tables.arrays.items():
        axis = layout[name]
        if axis is not None:
            if not -array.ndim <= axis < array.ndim:
                return None  # not the layout this client knows: let the server decide
            axis %= array.ndim
        axes[name] = axis
    lengths = {tables.arrays[n].shape[a] for n, a in axes.items() if a is not None}
    if len(lengths) != 1:
        message = f"rows= needs a tensor with a position axis; this {tables.kind} table has none"
        raise rows_error("rows_unsupported", message, [start, end])
    total = lengths.pop()
    stop = total if end is None else end
    if not start < stop <= total:
        message = (
            f"rows {start}:{stop} outside the table's {total} positions "
            f"(need START < END <= {total})"
        )
        raise rows_error("invalid_rows", message, [start, stop])
    if (start, stop) == (0, total):
        return tables
    arrays: dict[str, Array] = {}
    for name, array in tables.arrays.items():
        axis = axes[name]
        if axis is not None:
            index = (slice(None),) * axis + (slice(start, stop),)
            array = array[index]
        arrays[name] = np.array(array, order="C")  # a copy: frees the whole table's buffer
    meta = {**tables.meta, "rows": [start, stop]}
    return Tables(
        tables.key, tables.kind, tables.spec, meta, arrays, dict(tables.notes), tables.name
    )


@dataclass(frozen=True)
class ResolvedSpec:
    """One table a model needs (`Client.resolve`): its name in the model, canonical spec, key,
    output shapes and dtypes, size in bytes and the notes a runtime must know."""

    name: str
    kind: str
    key: str
    url: str
    spec: JSON
    outputs: dict[str, JSON]
    bytes: int
    notes: JSON

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ResolvedSpec:
        try:
            return cls(
                name=str(data.get("name") or data["kind"]),
                kind=str(data["kind"]),
                key=str(data["key"]),
                url=str(data.get("url", f"/v1/tables/{data['key']}")),
                spec=dict(data["spec"]),
                outputs=dict(data.get("outputs", {})),
                bytes=int(data.get("bytes", 0)),
                notes=dict(data.get("notes") or {}),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise DecodeError(f"unexpected spec description from the server: {err!r}") from None


@dataclass(frozen=True, eq=False)
class MRopePositions:
    """M-RoPE position ids of one token layout (`Client.mrope_position_ids`): `position_ids`
    (3, N) int64 (temporal, height, width: feed them to the `/v2` `rope` model with the resolved
    notes' `mrope_section`), `mrope_position_deltas` (max id + 1 - N: decoding positions are
    cache length + delta), the server's `rule` and the vision parameters it used."""

    model_type: str
    rule: str
    position_ids: Array
    mrope_position_deltas: int
    parameters: JSON

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MRopePositions:
        try:
            ids = np.asarray(data["position_ids"], dtype=np.int64)
            if ids.ndim != 2 or ids.shape[0] != 3:
                raise ValueError(f"position_ids of shape {ids.shape}, expected (3, N)")
            return cls(
                model_type=str(data["model_type"]),
                rule=str(data["rule"]),
                position_ids=ids,
                mrope_position_deltas=int(data["mrope_position_deltas"]),
                parameters={
                    k: data[k]
                    for k in (
                        "spatial_merge_size",
                        "tokens_per_second",
                        "temporal_merge_size",
                        "position_id_per_seconds",
                    )
                    if k in data
                },
            )
        except (KeyError, TypeError, ValueError) as err:
            raise DecodeError(f"unexpected position ids from the server: {err!r}") from None


@dataclass(frozen=True)
class UnservedPart:
    """A part of the model the server serves no table for (`Client.resolve(...).unserved`):
    `part` (a table name such as "learned", or a sub-model such as "vision_config"), `reason`
    and `config_key` (the config.json key it comes from, or the request field that would serve
    it, such as `table_key`)."""

    part: str
    reason: str
    config_key: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UnservedPart:
        try:
            return cls(str(data["part"]), str(data["reason"]), str(data["config_key"]))
        except (KeyError, TypeError) as err:
            raise DecodeError(f"unexpected unserved part from the server: {err!r}") from None


class ResolvedSpecs(list[ResolvedSpec]):
    """What `Client.resolve` returns: the tables served (a list of `ResolvedSpec`, as before)
    and `unserved`, the parts of the model that get no table, each with its reason (empty when
    the server serves the whole config, or predates partial resolves)."""

    def __init__(self, specs: Sequence[ResolvedSpec], unserved: Sequence[UnservedPart] = ()):
        super().__init__(specs)
        self.unserved: list[UnservedPart] = list(unserved)


@dataclass(frozen=True)
class PresetPart:
    """One table of a preset (`rope`, `full_attention`, `encoder`, ...)."""

    name: str
    kind: str
    key: str
    spec: JSON | None = None


@dataclass(frozen=True)
class Preset:
    """A curated released model: its name, title, model id, source and parts (tables)."""

    name: str
    title: str
    model: str
    parts: tuple[PresetPart, ...]
    source: str | None = None
    notes: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Preset:
        try:
            parts = tuple(
                PresetPart(str(p["name"]), str(p["kind"]), str(p["key"]), p.get("spec"))
                for p in data.get("parts", [])
            )
            return cls(
                name=str(data["name"]),
                title=str(data.get("title", data["name"])),
                model=str(data.get("model", "")),
                parts=parts,
                source=data.get("source"),
                notes=tuple(str(n) for n in data.get("notes", ())),
            )
        except (KeyError, TypeError) as err:
            raise DecodeError(f"unexpected preset description from the server: {err!r}") from None


@dataclass(frozen=True, eq=False)
class OnnxModel:
    """A served ONNX subgraph: the model bytes, its export key and the `posenc.*` metadata
    (graph, spec, key, options, notes) read from its `metadata_props`."""

    key: str
    data: bytes
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def graph(self) -> str | None:
        """The graph name (`rope/rotary`, `alibi/bias`, ...), from the metadata."""
        return self.metadata.get("graph")

    @property
    def spec(self) -> JSON:
        """The canonical spec the graph was exported for."""
        text = self.metadata.get("spec")
        return dict(json.loads(text)) if text else {}

    @property
    def notes(self) -> JSON:
        text = self.metadata.get("notes")
        return dict(json.loads(text)) if text else {}

    def load(self) -> onnx.ModelProto:
        """The model as an `onnx.ModelProto` (needs `pip install 'posenc-client[onnx]'`)."""
        import onnx

        model = onnx.ModelProto()
        model.ParseFromString(self.data)
        return model

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the model bytes to `path`."""
        from posenc_client._formats import write_atomic

        write_atomic(path, self.data)

    def __repr__(self) -> str:
        return f"<OnnxModel {self.graph} {self.key[:12]} {len(self.data)} bytes>"


def onnx_metadata(data: bytes) -> dict[str, str]:
    """The `posenc.*` metadata_props of serialized ONNX bytes, read without the onnx package.

    ModelProto field 14 is `metadata_props` (StringStringEntryProto: key 1, value 2); this walks
    the protobuf wire format just far enough to read them.
    """
    out: dict[str, str] = {}
    try:
        for number, value in _fields(memoryview(data)):
            if number == 14 and isinstance(value, memoryview):
                entry = {n: bytes(v).decode() for n, v in _fields(value) if not isinstance(v, int)}
                key = entry.get(1, "")
                if key.startswith("posenc."):
                    out[key.removeprefix("posenc.")] = entry.get(2, "")
    except (IndexError, ValueError, UnicodeDecodeError) as err:
        raise DecodeError(f"not a valid ONNX model: {err}") from None
    return out


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: memoryview) -> Iterator[tuple[int, int | memoryview]]:
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, value
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise ValueError("truncated field")
            yield number, buf[pos : pos + size]
            pos += size
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
