"""Spec base class, the family registry, canonical JSON and content keys.

Every family registers a frozen pydantic spec type and a pure compute function. `parse_spec`
converts wire dicts into specs in exactly one place; `content_key` hashes the canonical form (all
defaults filled, profile shortcuts expanded, floats normalised) together with `ALGORITHM_VERSION`,
so equal tables have equal keys and a change of algorithm changes every key.
"""

from __future__ import annotations

import hashlib
import json
import math
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Self, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from posenc.encodings.errors import FieldProblem, SpecError, UnknownKindError, did_you_mean

ALGORITHM_VERSION = "1"
"""Bump when any computation changes its output bits: every content key changes with it."""

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
}
ITEMSIZE: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int64": 8,
    "int32": 4,
}


@dataclass(frozen=True)
class TensorInfo:
    """Shape and dtype name of one output tensor, known before anything is allocated.

    `row_axis` is the position axis (the query axis of a bias), the one a row range slices; None
    when the tensor has none (`inv_freq`, `slopes`). It says how to read the tensor, not what it
    holds, so equality compares shape and dtype only.
    """

    shape: tuple[int, ...]
    dtype: str
    row_axis: int | None = field(default=None, compare=False)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE[self.dtype]


class SpecBase(BaseModel):
    """Base of every family's spec: frozen, unknown fields rejected, NaN and infinities rejected."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        allow_inf_nan=False,
        validate_default=True,
        strict=True,
    )

    kind: str

    def canonical(self) -> Self:
        """The canonical spelling of this spec (defaults resolved); override to normalise."""
        return self

    def outputs(self) -> dict[str, TensorInfo]:
        """Name -> shape and dtype of every tensor `compute` returns, known without allocating."""
        raise NotImplementedError

    def output_bytes(self) -> int:
        return sum(t.nbytes for t in spec_facts(self).outputs.values())

    def cache_dtype(self) -> str:
        """The dtype the cache keys this spec under (the canonical main output dtype)."""
        return str(getattr(spec_facts(self).canon, "dtype", "float32"))

    def cache_precision(self) -> str:
        """The precision the cache keys this spec under (`reference` unless a family says)."""
        return str(getattr(spec_facts(self).canon, "precision", "reference"))


@dataclass(frozen=True)
class Table:
    """A computed table: named tensors on one device and JSON-able metadata.

    `meta` holds `kind`, `spec` (canonical), `key`, `algorithm_version`, `device`, `shapes`
    and the family's derived facts (attention scaling, YaRN softmax scale, LongRoPE switch...).
    """

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


_M = TypeVar("_M", bound=BaseModel)

ComputeFn = Callable[[Any, torch.device], tuple[dict[str, torch.Tensor], dict[str, Any]]]


@dataclass(frozen=True)
class Family:
    """A registered family: its `kind`, spec type, compute function and a one-line summary."""

    kind: str
    spec_type: type[SpecBase]
    compute: ComputeFn
    summary: str


FAMILIES: dict[str, Family] = {}


def register_family(
    kind: str, spec_type: type[SpecBase], summary: str
) -> Callable[[ComputeFn], ComputeFn]:
    """Decorator registering `compute` for `kind`; registering a name twice raises."""

    def deco(fn: ComputeFn) -> ComputeFn:
        if kind in FAMILIES:
            raise ValueError(f"family {kind!r} is already registered")
        FAMILIES[kind] = Family(kind=kind, spec_type=spec_type, compute=fn, summary=summary)
        return fn

    return deco


@cache
def _field_names(model: type[BaseModel]) -> tuple[frozenset[str], frozenset[str]]:
    """(the model's own field names, every field name of its JSON schema): what a misspelt
    top-level and nested field is matched against."""
    schema = model.model_json_schema()
    nested = set(schema.get("properties", {}))
    for definition in schema.get("$defs", {}).values():
        nested |= set(definition.get("properties", {}))
    return frozenset(model.model_fields), frozenset(nested)


def _problems(err: ValidationError, model: type[BaseModel] | None = None) -> list[FieldProblem]:
    out = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        msg = e["msg"]
        ctx = e.get("ctx") or {}
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
            if model is not None and e["loc"]:
                own, nested = _field_names(model)
                msg += did_you_mean(str(e["loc"][-1]), own if len(e["loc"]) == 1 else nested)
        elif e["type"] == "literal_error" and "expected" in ctx:
            msg = f"must be one of {ctx['expected']}"
        out.append(FieldProblem(field=loc or "(spec)", message=msg, value=e.get("input")))
    return out


def validate_as(model: type[_M], data: Mapping[str, Any], what: str) -> _M:
    """Validate `data` as `model`, turning pydantic errors into a `SpecError` naming each field."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as err:
        raise SpecError(f"invalid {what} spec", _problems(err, model)) from None


def parse_spec(data: Mapping[str, Any]) -> SpecBase:
    """Build a validated, frozen spec from a wire dict; `kind` selects the family.

    Raises `SpecError` (or `UnknownKindError`) naming the field, the value and the valid range.
    """
    if not isinstance(data, Mapping):
        raise SpecError(
            "a spec must be a JSON object",
            [FieldProblem("(spec)", "expected an object", type(data).__name__)],
        )
    kind = data.get("kind")
    if kind is None:
        raise SpecError(
            "missing field 'kind'",
            [FieldProblem("kind", f"required, one of {sorted(FAMILIES)}", None)],
        )
    family = FAMILIES.get(kind) if isinstance(kind, str) else None
    if family is None:
        raise UnknownKindError(
            f"unknown kind {kind!r}{did_you_mean(kind, FAMILIES)}",
            [FieldProblem("kind", f"must be one of {sorted(FAMILIES)}", kind)],
        )
    return validate_as(family.spec_type, data, kind)


_PLAIN = (str, int, bool)


def _normalise(value: Any) -> Any:
    """Floats normalised (-0.0 -> 0.0, subclasses -> float), None dropped from dicts, tuples as
    lists, recursively (plain values and float rows tested first: this runs once per table and
    per request)."""
    kind = type(value)
    if kind in _PLAIN or value is None:
        return value
    if (kind is list or kind is tuple) and all(type(v) is float for v in value):
        # rows of inline weights: x + 0.0 is x, and turns -0.0 into 0.0 (no NaN/inf in specs)
        return [v + 0.0 for v in value]
    if isinstance(value, float):
        return 0.0 if value == 0.0 else float(value)
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_normalise(v) for v in value]
    return value


def canonical_dict(spec: SpecBase) -> dict[str, Any]:
    """The canonical form as a dict: defaults filled, None fields dropped, floats normalised."""
    return _dict_of(spec.canonical())


def _dict_of(canon: SpecBase) -> dict[str, Any]:
    """`canonical_dict` of a spec that is canonical already."""
    result: dict[str, Any] = _normalise(canon.model_dump(mode="python"))
    return result


def canonical_json(spec: SpecBase) -> str:
    """Canonical JSON: sorted keys, no whitespace, shortest round-trip float spelling."""
    return _json_of(canonical_dict(spec))


def content_key(spec: SpecBase) -> str:
    """Stable sha256 over the canonical JSON and the algorithm version (64 hex digits)."""
    return spec_facts(spec).key


@dataclass(frozen=True)
class SpecFacts:
    """What every computation and lookup of one spec derives from it: the canonical spec, its
    canonical dict (shared: read only), content key and outputs (shapes, dtypes, row axes)."""

    canon: SpecBase
    spec_dict: dict[str, Any]
    key: str
    outputs: dict[str, TensorInfo]


_FACTS: dict[int, tuple[weakref.ref[SpecBase], SpecBase | None, dict[str, Any], str, Any]] = {}
"""id(spec) -> (a weak reference to the spec, its canonical form or None when that is the spec
itself, then the facts' other fields): dropped with the spec, and never keeping it alive."""


def spec_facts(spec: SpecBase) -> SpecFacts:
    """`SpecFacts` of `spec`, worked out once per spec object (specs are frozen): the canonical
    form, its JSON and sha256 and the output shapes cost ~200 µs per call of a RoPE spec on the
    CPU of docs/benchmarks.md (section 9), as much as computing a 1 KiB table."""
    ident = id(spec)
    found = _FACTS.get(ident)
    if found is not None and found[0]() is spec:
        _, canon, spec_dict, key, outputs = found
        return SpecFacts(spec if canon is None else canon, spec_dict, key, outputs)
    canon = spec.canonical()
    spec_dict = _dict_of(canon)
    facts = SpecFacts(canon, spec_dict, _key_of(spec_dict), canon.outputs())
    memo = _FACTS  # held by the callback: module globals are gone at interpreter exit

    def forget(_: weakref.ref[SpecBase]) -> None:
        memo.pop(ident, None)

    try:
        ref = weakref.ref(spec, forget)
    except TypeError:  # a spec type without weak references: not remembered
        return facts
    kept = None if canon is spec else canon
    memo[ident] = (ref, kept, facts.spec_dict, facts.key, facts.outputs)
    return facts


_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)
"""`json.dumps(..., sort_keys=True, separators=(",", ":"), allow_nan=False)`, built once (dumps
builds a new encoder per call when given options)."""


def _json_of(canon: dict[str, Any]) -> str:
    return _CANONICAL_JSON.encode(canon)


def _key_of(canon: dict[str, Any]) -> str:
    payload = f"posenc/{ALGORITHM_VERSION}\n{_json_of(canon)}".encode()
    return hashlib.sha256(payload).hexdigest()


def compute(spec: SpecBase, device: str | torch.device = "cpu") -> Table:
    """Compute the table for `spec` on `device`. Pure: same spec and device, same bits."""
    known = spec_facts(spec)
    canon = known.canon
    family = FAMILIES[canon.kind]
    dev = torch.device(device)
    tensors, facts = family.compute(canon, dev)
    meta: dict[str, Any] = {
        "kind": canon.kind,
        "spec": known.spec_dict,
        "key": known.key,
        "algorithm_version": ALGORITHM_VERSION,
        "device": str(dev),
        "shapes": {name: list(t.shape) for name, t in tensors.items()},
        "dtypes": {name: str(t.dtype).removeprefix("torch.") for name, t in tensors.items()},
        # each tensor's position axis (`TensorInfo.row_axis`, None: sent whole), so a client
        # slices rows of a table it holds without its own copy of every family's layout
        "row_axes": {name: info.row_axis for name, info in known.outputs.items()},
        **facts,
    }
    return Table(tensors=tensors, meta=meta)
