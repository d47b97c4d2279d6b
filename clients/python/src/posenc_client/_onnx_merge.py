"""`merge_subgraph`: `onnx.compose.merge_models` made to work on real (model, served subgraph)
pairs, with the IR versions and default-domain opsets aligned first."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from posenc_client._exceptions import IncompatibleModelError
from posenc_client._onnx_patch import ModelLike, load_model


def _main_opset(model: onnx.ModelProto) -> int | None:
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return int(opset.version)
    return None


def _align(model: onnx.ModelProto, subgraph: onnx.ModelProto) -> onnx.ModelProto:
    """`subgraph` converted to the model's default-domain opset (the model gains the subgraph's
    when it imports none); custom domains must already agree."""
    target, have = _main_opset(model), _main_opset(subgraph)
    if target is None and have is not None:
        model.opset_import.add(domain="", version=have)
    elif target is not None and have is not None and target != have:
        from onnx import version_converter

        try:
            subgraph = version_converter.convert_version(subgraph, target)
        except Exception as err:
            raise IncompatibleModelError(
                f"the subgraph uses opset {have} and the model opset {target}; converting the "
                f"subgraph failed ({err}): fetch it with opset={target}"
            ) from err
    versions = {
        opset.domain: opset.version
        for opset in model.opset_import
        if opset.domain not in ("", "ai.onnx")
    }
    for opset in subgraph.opset_import:
        if opset.domain in versions and versions[opset.domain] != opset.version:
            raise IncompatibleModelError(
                f"domain {opset.domain!r}: the model imports version {versions[opset.domain]}, "
                f"the subgraph {opset.version}"
            )
    return subgraph


def _keep_model_identity(merged: onnx.ModelProto, base: onnx.ModelProto) -> None:
    """The model's outputs only (merge_models' `outputs=` would prune unconnected subgraph
    nodes), the model's inputs first, in their order, its producer, domain, version and docs,
    and one opset import per domain (the larger version)."""
    outputs = {output.name for output in base.graph.output}
    keep = [output for output in merged.graph.output if output.name in outputs]
    del merged.graph.output[:]
    merged.graph.output.extend(keep)
    own = {value.name for value in base.graph.input}
    ordered = sorted(merged.graph.input, key=lambda value: value.name not in own)
    del merged.graph.input[:]
    merged.graph.input.extend(ordered)
    merged.producer_name = base.producer_name
    merged.producer_version = base.producer_version
    merged.domain = base.domain
    merged.model_version = base.model_version
    merged.doc_string = base.doc_string
    merged.graph.doc_string = base.graph.doc_string
    seen: dict[str, int] = {}
    for opset in merged.opset_import:
        opset_domain = "" if opset.domain == "ai.onnx" else opset.domain
        seen[opset_domain] = max(seen.get(opset_domain, 0), int(opset.version))
    del merged.opset_import[:]
    for opset_domain, version in seen.items():
        merged.opset_import.add(domain=opset_domain, version=version)


def merge_subgraph(
    model: ModelLike,
    subgraph: ModelLike,
    io_map: Sequence[tuple[str, str]] | Mapping[str, str],
    prefix: str = "posenc/",
) -> onnx.ModelProto:
    """`onnx.compose.merge_models(subgraph, model, io_map)` made to work on real pairs.

    Args:
        model: the consumer model (kept as is: opset, outputs, name, producer, metadata).
        subgraph: the producer (a served posenc graph): converted to the model's default-domain
            opset when they differ, every name prefixed with `prefix`, its metadata kept as
            `<prefix><key>`.
        io_map: (subgraph output, model input) pairs, unprefixed: each model input is replaced
            by the subgraph output. Subgraph inputs become model inputs (`<prefix><name>`).
        prefix: added to every name of the subgraph (nodes, values, initializers).

    The IR version of the result is the larger of the two. Raises `IncompatibleModelError` on
    unknown names, clashing opsets, or a failed conversion.
    """
    base = load_model(model)
    producer = _align(base, load_model(subgraph))
    pairs = list(io_map.items()) if isinstance(io_map, Mapping) else list(io_map)
    producer_outputs = {output.name for output in producer.graph.output}
    model_inputs = {value.name for value in base.graph.input}
    bad = [f"subgraph output {output!r}" for output, _ in pairs if output not in producer_outputs]
    bad += [f"model input {value!r}" for _, value in pairs if value not in model_inputs]
    if bad:
        raise IncompatibleModelError(
            f"io_map names unknown values: {', '.join(bad)} (subgraph outputs: "
            f"{sorted(producer_outputs)}; model inputs: {sorted(model_inputs)})"
        )
    ir_version = max(base.ir_version, producer.ir_version)
    base.ir_version = producer.ir_version = ir_version
    producer_metadata = {item.key: item.value for item in producer.metadata_props}
    del producer.metadata_props[:]
    model_metadata = {item.key: item.value for item in base.metadata_props}
    del base.metadata_props[:]
    try:
        merged = onnx.compose.merge_models(
            producer, base, io_map=pairs, prefix1=prefix, name=base.graph.name
        )
    except ValueError as err:
        raise IncompatibleModelError(f"cannot merge the subgraph: {err}") from err
    _keep_model_identity(merged, base)
    del merged.metadata_props[:]
    properties = {
        **model_metadata,
        **{f"{prefix}{key}": value for key, value in producer_metadata.items()},
    }
    onnx.helper.set_model_props(merged, properties)
    return merged
