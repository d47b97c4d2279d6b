"""The model abstraction of the /v2 API: declared inputs and outputs, metadata, config, infer.

Each family is one model named after its `kind`, version "1". A model's `infer` turns a parsed
request into output tensors (on the cache device) and response parameters; it validates inputs,
builds the spec from the request parameters, checks the response size and JSON limits before
computing anything, then takes rows from the cached table or from rows computed for exactly the
asked positions.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import torch

from posenc.api.oip.codec import (
    DATATYPE_OF_NAME,
    DATATYPES,
    InferRequest,
    bad_request,
    check_json_outputs,
)
from posenc.api.oip.context import OipContext
from posenc.encodings import FAMILIES, SpecBase, TensorInfo, canonical_dict, content_key
from posenc.runtime.rows import extent

VERSION = "1"
PLATFORM = "posenc"

INDEX_TYPES = ("INT64", "INT32")
"""Datatypes accepted for position inputs."""


@dataclass(frozen=True)
class TensorDecl:
    """A declared model input or output.

    `datatype` is what the metadata advertises; `accepts` lists every datatype taken (inputs) or
    produced (outputs, per the spec's `dtype`). `shape` uses -1 for variable dims.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    description: str
    accepts: tuple[str, ...] = ()
    optional: bool = False

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    def config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "data_type": f"TYPE_{self.datatype}",
            "dims": list(self.shape),
            "optional": self.optional,
            "datatypes": list(self.accepts or (self.datatype,)),
            "description": self.description,
        }


@dataclass(frozen=True)
class InferResult:
    """Output tensors in response order and the response `parameters`."""

    tensors: dict[str, torch.Tensor]
    parameters: dict[str, Any] = field(default_factory=dict)
    rows_of: dict[str, torch.Tensor] | None = None
    """When each output is the rows of a whole cached table (`OipContext.entry`'s) at the
    request's positions, in `tensors`' order: those tables (a decode step's template,
    `oip.steps`)."""


InferFn = Callable[[OipContext, InferRequest], Awaitable[InferResult]]


@dataclass(frozen=True)
class OipModel:
    """One model of the /v2 API: a family of tables, its tensors and its infer function."""

    name: str
    description: str
    inputs: tuple[TensorDecl, ...]
    outputs: tuple[TensorDecl, ...]
    infer: InferFn
    parameters: Mapping[str, str] = field(default_factory=dict)
    """Request parameters beyond the spec fields (name -> description)."""
    notes: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        return self.name

    def metadata(self) -> dict[str, Any]:
        """KServe v2 model metadata."""
        return {
            "name": self.name,
            "versions": [VERSION],
            "platform": PLATFORM,
            "inputs": [d.metadata() for d in self.inputs],
            "outputs": [d.metadata() for d in self.outputs],
        }

    def config(self, ctx: OipContext) -> dict[str, Any]:
        """Triton-style model configuration plus posenc's spec schema and limits."""
        family = FAMILIES[self.kind]
        return {
            "name": self.name,
            "platform": PLATFORM,
            "backend": PLATFORM,
            "version_policy": {"specific": {"versions": [int(VERSION)]}},
            "max_batch_size": 0,
            "input": [d.config() for d in self.inputs],
            "output": [d.config() for d in self.outputs],
            "parameters": {
                "spec": "a spec object as a JSON string: fields (the /v1 schema below, kind "
                "implied), {hf_config, ...overrides} or {preset, part?, ...overrides}",
                "flat keys": "any spec field as its own parameter; lists/objects as JSON strings",
                **self.parameters,
            },
            "posenc": {
                "kind": self.kind,
                "summary": family.summary,
                "spec_schema": family.spec_type.model_json_schema(),
                "notes": list(self.notes),
                "limits": {
                    "max_response_bytes": ctx.max_response_bytes,
                    "json_max_elements": ctx.json_max_elements,
                    "max_body_bytes": ctx.max_body_bytes,
                    "cache_bytes": ctx.cache.max_bytes,
                    "binary_only_datatypes": ["FP16", "BF16"],
                },
                "device": str(ctx.device),
            },
        }


def get_input(
    request: InferRequest,
    decl: TensorDecl,
    ranks: Sequence[int] | None = None,
) -> torch.Tensor | None:
    """The CPU tensor of input `decl` (None when absent and optional), datatype and rank checked."""
    item = request.inputs.get(decl.name)
    if item is None:
        if decl.optional:
            return None
        raise bad_request(f"input {decl.name!r} is required")
    accepted = decl.accepts or (decl.datatype,)
    if item.datatype not in accepted:
        raise bad_request(
            f"input {decl.name!r} must be one of {list(accepted)}, got {item.datatype}"
        )
    if ranks is not None and item.tensor.dim() not in ranks:
        raise bad_request(
            f"input {decl.name!r} must have rank {' or '.join(map(str, ranks))}, "
            f"got shape {list(item.tensor.shape)}"
        )
    return item.tensor


def check_unknown_inputs(request: InferRequest, model: OipModel) -> None:
    known = {d.name for d in model.inputs}
    extra = sorted(set(request.inputs) - known)
    if extra:
        raise bad_request(
            f"model {model.name!r} has no input {extra[0]!r}; its inputs are {sorted(known)}"
        )


def positions_in_range(t: torch.Tensor, name: str, limit: int) -> tuple[int, int] | None:
    """Integer positions must lie in [0, limit); returns their (min, max), None when empty."""
    if t.numel() == 0:
        return None
    lo, hi = extent(t)
    if lo < 0 or hi >= limit:
        bad = lo if lo < 0 else hi
        raise bad_request(f"input {name!r}: positions must be in [0, {limit}), got {bad}")
    return lo, hi


def wanted_outputs(
    request: InferRequest,
    model: OipModel,
    available: Mapping[str, str | None],
    default: Sequence[str],
) -> list[str]:
    """The output names to send, in order.

    `available`: every declared output -> None when this request can produce it, else why not.
    `default`: what is sent when the request names no outputs.
    """
    if request.outputs is None:
        return list(default)
    names = []
    for out in request.outputs:
        if out.name not in available:
            raise bad_request(
                f"model {model.name!r} has no output {out.name!r}; "
                f"its outputs are {[d.name for d in model.outputs]}"
            )
        why = available[out.name]
        if why is not None:
            raise bad_request(f"output {out.name!r} is not available: {why}")
        names.append(out.name)
    return names


def admit(
    ctx: OipContext,
    request: InferRequest,
    planned: Mapping[str, TensorInfo],
) -> int:
    """Check the planned outputs against the response and JSON limits before computing, then
    charge them to the in-flight budget (`OipContext.charge_outputs`: `Overloaded` when they do
    not fit).

    Returns the total output bytes.
    """
    infos = {n: (tuple(i.shape), DATATYPE_OF_NAME[i.dtype]) for n, i in planned.items()}
    check_json_outputs(infos, request, ctx.json_max_elements)
    total = ctx.check_size({n: (s, DATATYPES_ITEMSIZE[dt]) for n, (s, dt) in infos.items()})
    json_elements = sum(math.prod(s) for n, (s, _) in infos.items() if not request.binary(n))
    ctx.charge_outputs(total, json_elements)
    return total


DATATYPES_ITEMSIZE: dict[str, int] = {
    name: torch.empty((), dtype=dt).element_size() for name, dt in DATATYPES.items()
}


@dataclass(frozen=True)
class SpecInfo:
    """A canonical spec with what every request about it needs: its content key, its outputs'
    shapes, its table's size in bytes and the response parameters that echo it (computed once,
    see `api/memo.py`).
    """

    spec: SpecBase
    key: str
    outputs: dict[str, TensorInfo]
    nbytes: int
    echo: dict[str, str]


def describe(spec: SpecBase) -> SpecInfo:
    """`SpecInfo` of `spec` (canonicalised). Learned weights are left out of the echoed spec."""
    canon = spec.canonical()
    echoed = canonical_dict(canon)
    echoed.pop("relative_attention_bias", None)
    key = content_key(canon)
    echo = {
        "posenc_key": key,
        "posenc_spec": orjson.dumps(echoed, option=orjson.OPT_SORT_KEYS).decode(),
    }
    outputs = canon.outputs()
    return SpecInfo(canon, key, outputs, sum(t.nbytes for t in outputs.values()), echo)


def spec_parameters(info: SpecInfo | None, source: str, device: str) -> dict[str, Any]:
    """Response parameters: where the rows came from and, when given, the table's key and
    canonical spec.

    `source`: `hit`, `miss` or `coalesced` (the cached table) or `computed` (rows computed for
    the asked positions).
    """
    params: dict[str, Any] = {"posenc_source": source, "posenc_device": device}
    if info is not None:
        params.update(info.echo)
    return params
