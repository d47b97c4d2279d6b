"""`export(spec, graph=...)` builds a model; `verify(model, spec)` proves it against the core.

Verification (what the API runs before a model is first served):
1. the model's metadata names this spec (canonical JSON) and options;
2. `onnx.checker.check_model(full_check=True)` and strict shape inference with type checks;
3. one onnxruntime CPU session runs every `Sample` of the exporter and each output must equal
   the torch table of `posenc.encodings` within the sample's tolerance.
Any failure raises `ExportError` (error_type "export"): a wrong graph is never returned.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import onnx
import torch

from posenc import __version__
from posenc.encodings import FieldProblem, SpecBase, SpecError, canonical_json, content_key
from posenc.encodings.base import validate_as
from posenc.onnx._errors import ExportError, UnsupportedExportError
from posenc.onnx._graph import IR_DTYPES, Graph, finish, notes_json
from posenc.onnx._options import ExportOptions, export_key
from posenc.onnx._ort import run, session
from posenc.onnx._registry import EXPORTERS, GraphExporter, Sample, graphs_for

META_PREFIX = "posenc."
DTYPE_NAMES = {int(v): k for k, v in IR_DTYPES.items()} | {int(onnx.TensorProto.BOOL): "bool"}


@dataclass(frozen=True)
class Resolved:
    """A request made concrete: the normalized canonical spec, resolved options, the exporter."""

    spec: SpecBase
    options: ExportOptions
    exporter: GraphExporter

    @property
    def key(self) -> str:
        return export_key(self.spec, self.options)


def resolve(spec: SpecBase, options: ExportOptions) -> Resolved:
    """Check `options` against the exporter for `spec.kind` and fill their defaults.

    Raises `UnsupportedExportError` naming the field (graph, mode, op, opset, num_heads, inputs,
    role, or a spec field the graph cannot serve).
    """
    canon = spec.canonical()
    exporter = EXPORTERS.get((canon.kind, options.graph))
    if exporter is None:
        raise UnsupportedExportError(
            f"no graph {options.graph!r} for kind {canon.kind!r}",
            [FieldProblem("graph", f"must be one of {graphs_for(canon.kind)}", options.graph)],
        )
    problems: list[FieldProblem] = []

    def pick(name: str, value: Any, allowed: tuple[str, ...]) -> Any:
        if not allowed:
            if value is not None:
                problems.append(FieldProblem(name, f"{exporter.name} takes no {name}", value))
            return None
        if value is None:
            return allowed[0]
        if value not in allowed:
            problems.append(FieldProblem(name, f"{exporter.name} supports {list(allowed)}", value))
        return value

    mode = pick("mode", options.mode, exporter.modes)
    op = pick("op", options.op, exporter.ops)
    inputs = pick("inputs", options.inputs, exporter.styles(mode))
    role = pick("role", options.role, exporter.roles)
    if exporter.roles and options.role is None:
        problems.append(
            FieldProblem("role", f"{exporter.name} needs role, one of {list(exporter.roles)}", None)
        )
    if options.num_heads is not None and not exporter.takes_num_heads:
        problems.append(
            FieldProblem("num_heads", f"{exporter.name} takes no num_heads", options.num_heads)
        )
    if problems:
        raise UnsupportedExportError(f"cannot export {exporter.name}", problems)
    resolved = options.model_copy(update={"mode": mode, "op": op, "inputs": inputs, "role": role})
    problems = exporter.problems(canon, resolved)
    if problems:
        raise UnsupportedExportError(f"cannot export {exporter.name}", problems)
    return Resolved(exporter.normalize(canon), resolved, exporter)


def options_from(graph: str, **fields: Any) -> ExportOptions:
    """`ExportOptions` from keyword fields (None dropped); invalid values raise `SpecError`."""
    data = {"graph": graph, **{k: v for k, v in fields.items() if v is not None}}
    return validate_as(ExportOptions, data, "export options")


def export(
    spec: SpecBase,
    graph: str,
    *,
    opset: int | None = None,
    mode: str | None = None,
    op: str | None = None,
    num_heads: int | None = None,
    inputs: str | None = None,
    role: str | None = None,
) -> onnx.ModelProto:
    """Build the ONNX model of `graph` for `spec` (see `EXPORTERS` for what each supports).

    Unverified: pass the result to `verify` before serving it. Raises `SpecError` /
    `UnsupportedExportError` for requests that cannot be exported.
    """
    options = options_from(
        graph, opset=opset, mode=mode, op=op, num_heads=num_heads, inputs=inputs, role=role
    )
    return build(resolve(spec, options))


def build(request: Resolved) -> onnx.ModelProto:
    """The model for a resolved request, with its metadata."""
    spec, options, exporter = request.spec, request.options, request.exporter
    g = Graph(
        f"posenc_{spec.kind}_{exporter.graph}", options.opset, contrib=options.op == "contrib"
    )
    notes = exporter.build(g, spec, options)
    metadata = {
        "posenc.graph": exporter.name,
        "posenc.spec": canonical_json(spec),
        "posenc.key": content_key(spec),
        "posenc.options": options.canonical_json(),
        "posenc.export_key": request.key,
        "posenc.version": __version__,
        "posenc.notes": notes_json(notes),
    }
    doc = f"posenc {exporter.name}: {exporter.summary}. Spec: {canonical_json(spec)}"
    return finish(g, doc=doc, metadata=metadata)


def metadata(model: onnx.ModelProto) -> dict[str, str]:
    """The `posenc.*` metadata_props of a model, keys without the prefix."""
    return {
        p.key.removeprefix(META_PREFIX): p.value
        for p in model.metadata_props
        if p.key.startswith(META_PREFIX)
    }


@dataclass(frozen=True)
class Verification:
    """What `verify` ran: samples, outputs compared and the largest error seen per output."""

    graph: str
    samples: int
    max_abs_error: dict[str, float] = field(default_factory=dict)


def verify(model: onnx.ModelProto, spec: SpecBase) -> Verification:
    """Check `model` (from `export`) and run it once in onnxruntime against the torch tables.

    Raises `ExportError` (error_type "export") on any failure.
    """
    meta = metadata(model)
    try:
        options = ExportOptions.model_validate_json(meta["options"])
        request = resolve(spec, options)
    except (KeyError, ValueError, SpecError) as err:
        raise ExportError(
            "the model carries no posenc export options for this spec", {"reason": str(err)}
        ) from err
    if meta.get("spec") != canonical_json(request.spec):
        raise ExportError(
            "the model was exported for another spec",
            {"model_spec": meta.get("spec"), "spec": canonical_json(request.spec)},
        )
    name = request.exporter.name
    try:
        onnx.checker.check_model(model, full_check=True)
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        raise ExportError(
            f"{name}: the ONNX checker rejects the graph", {"reason": str(err)}
        ) from err
    try:
        sess = session(model)
    except Exception as err:
        raise ExportError(
            f"{name}: onnxruntime cannot load the graph", {"reason": str(err)}
        ) from err
    samples = request.exporter.samples(request.spec, request.options)
    errors: dict[str, float] = {}
    for sample in samples:
        try:
            outputs = run(sess, sample.feeds)
        except Exception as err:
            raise ExportError(
                f"{name}: onnxruntime failed on sample {sample.label!r}", {"reason": str(err)}
            ) from err
        for out_name, expected in sample.expected.items():
            error = compare(outputs[out_name], expected, sample)
            errors[out_name] = max(errors.get(out_name, 0.0), error)
    return Verification(graph=name, samples=len(samples), max_abs_error=errors)


def compare(actual: torch.Tensor, expected: torch.Tensor, sample: Sample) -> float:
    """Largest |actual - expected| over finite entries; raises `ExportError` past tolerance, on a
    shape or dtype difference, or where non-finite values differ."""
    where: dict[str, Any] = {"sample": sample.label}
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise ExportError(
            "graph output differs in shape or dtype from the torch table",
            {
                **where,
                "shape": list(actual.shape),
                "expected_shape": list(expected.shape),
                "dtype": str(actual.dtype),
                "expected_dtype": str(expected.dtype),
            },
        )
    if not actual.dtype.is_floating_point:
        bad = int((actual != expected).sum())
        if bad:
            raise ExportError("graph output differs from the torch table", {**where, "bad": bad})
        return 0.0
    a, e = actual.double(), expected.double()
    finite = torch.isfinite(e)
    if not torch.equal(torch.isfinite(a), finite) or not torch.equal(a[~finite], e[~finite]):
        raise ExportError("graph output differs in non-finite entries", where)
    diff = (a - e).abs()[finite]
    if diff.numel() == 0:
        return 0.0
    over = diff > sample.atol
    worst = float(diff.max())
    if bool(over.any()):
        raise ExportError(
            "graph output differs from the torch table beyond tolerance",
            {
                **where,
                "max_abs_error": worst,
                "atol": sample.atol,
                "entries_over": int(over.sum()),
            },
        )
    return worst if math.isfinite(worst) else 0.0


def model_summary(model: onnx.ModelProto) -> dict[str, Any]:
    """Inputs, outputs, opsets and metadata of a model, JSON-able."""

    def io(values: Any) -> list[dict[str, Any]]:
        out = []
        for v in values:
            t = v.type.tensor_type
            dims = [d.dim_param or d.dim_value for d in t.shape.dim]
            dtype = DTYPE_NAMES.get(t.elem_type, onnx.TensorProto.DataType.Name(t.elem_type))
            out.append({"name": v.name, "dtype": dtype, "shape": dims})
        return out

    meta = metadata(model)
    return {
        "inputs": io(model.graph.input),
        "outputs": io(model.graph.output),
        "ir_version": model.ir_version,
        "opset_imports": {o.domain or "ai.onnx": o.version for o in model.opset_import},
        "notes": json.loads(meta.get("notes", "{}")),
    }
