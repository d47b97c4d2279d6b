"""The exporter registry, the request resolution and its refusals, metadata, keys, and what
`verify` catches."""

from __future__ import annotations

import json
import sys
from typing import Any

import onnx
import pytest
import torch
from onnx import helper, numpy_helper

import posenc.onnx
from posenc import __version__
from posenc.encodings import FAMILIES, SpecError, canonical_json, content_key, parse_spec
from posenc.encodings.t5_bias import relative_position_bucket
from posenc.onnx import (
    ATOL,
    EXPORTERS,
    IR_VERSIONS,
    ONNX_SPECS,
    OPSETS,
    CopeSpec,
    ExportError,
    ExportOptions,
    GraphExporter,
    UnsupportedExportError,
    export,
    export_key,
    metadata,
    parse_export_spec,
    register_exporter,
    resolve,
    verify,
)
from posenc.onnx.graphs.t5_bias import bucket_lookup
from tests.onnx.cases import BASE, run, spec_for
from tests.tolerances import ATOL as TEST_ATOL

NOT_EXPORTED: set[str] = set()
"""Families without a graph: a new family must either get an exporter or be listed here (with the
reason in docs/onnx.md), so that none is forgotten silently. Every family has one since issue 9."""
GRAPH_ONLY = {"cope"}
"""Kinds with graphs and no table (`ONNX_SPECS`): not families of `posenc.encodings`."""


def test_registry_covers_every_family_and_graph() -> None:
    assert set(EXPORTERS) == set(BASE)
    assert set(ONNX_SPECS) == GRAPH_ONLY
    assert not GRAPH_ONLY & set(FAMILIES)
    assert set(FAMILIES) >= NOT_EXPORTED
    assert {kind for kind, _ in EXPORTERS} == (set(FAMILIES) - NOT_EXPORTED) | GRAPH_ONLY
    for exporter in EXPORTERS.values():
        assert exporter.summary
        assert exporter.modes
        assert sys.modules[type(exporter).__module__].__doc__
        assert exporter.describe()["graph"] == exporter.graph


def test_registering_a_graph_twice_raises() -> None:
    existing = type(EXPORTERS[("alibi", "bias")])
    with pytest.raises(ValueError, match="already registered"):
        register_exporter(type("Again", (existing,), {}))


def test_public_api_is_honest() -> None:
    public = {n for n in dir(posenc.onnx) if not n.startswith("_")}
    assert set(posenc.onnx.__all__) == public
    for name in posenc.onnx.__all__:
        assert getattr(posenc.onnx, name) is not None


def test_verify_tolerances_are_the_shared_table() -> None:
    assert TEST_ATOL == ATOL


def test_ir_versions_are_the_lowest_each_opset_needs() -> None:
    assert tuple(IR_VERSIONS) == OPSETS == tuple(range(17, 24))
    for opset, ir in IR_VERSIONS.items():
        assert ir == helper.find_min_ir_version_for([helper.make_opsetid("", opset)])
        assert ir <= 13  # onnxruntime 1.31 loads up to IR 13


@pytest.mark.parametrize(
    ("key", "options", "field"),
    [
        (("rope", "cos_sin"), {"graph": "nope"}, "graph"),
        (("alibi", "bias"), {"graph": "bias", "mode": "table"}, "mode"),
        (("alibi", "bias"), {"graph": "bias", "op": "onnx"}, "op"),
        (("sinusoidal", "embedding"), {"graph": "embedding", "num_heads": 2}, "num_heads"),
        (("rope", "cos_sin"), {"graph": "cos_sin", "inputs": "lengths"}, "inputs"),
        (("rope", "rotary"), {"graph": "rotary", "op": "onnx"}, "opset"),
        (("sinusoidal_2d", "embedding"), {"graph": "embedding", "mode": "table"}, "mode"),
        (("xpos", "rotary"), {"graph": "rotary"}, "role"),
        (("xpos", "rotary"), {"graph": "rotary", "role": "key", "op": "onnx"}, "opset"),
        (("xpos", "cos_sin"), {"graph": "cos_sin", "role": "key"}, "role"),
        (("rope", "rotary"), {"graph": "rotary", "role": "query"}, "role"),
        (("relative_index", "bias"), {"graph": "bias", "inputs": "positions"}, "inputs"),
        (("cope", "logits"), {"graph": "logits", "mode": "table"}, "mode"),
        (("learned", "embedding"), {"graph": "embedding", "mode": "compute"}, "mode"),
    ],
)
def test_unsupported_requests_name_the_field(
    key: tuple[str, str], options: dict[str, Any], field: str
) -> None:
    spec = spec_for(*key)
    with pytest.raises(UnsupportedExportError) as info:
        resolve(spec, ExportOptions(**options))
    assert [p.field for p in info.value.problems] == [field]


@pytest.mark.parametrize("opset", [16, 24])
def test_opsets_outside_17_to_23_are_invalid(opset: int) -> None:
    with pytest.raises(SpecError) as info:
        export(spec_for("rope", "cos_sin"), "cos_sin", opset=opset)
    assert info.value.problems[0].field == "opset"


def test_alibi_slopes_only_and_explicit_sinusoidal_positions_are_refused() -> None:
    with pytest.raises(UnsupportedExportError, match="bias"):
        export(parse_spec({"kind": "alibi", "num_heads": 8}), "bias")
    explicit = parse_spec({"kind": "sinusoidal", "dim": 8, "positions": [0.5, 3.0]})
    with pytest.raises(UnsupportedExportError, match="positions"):
        export(explicit, "embedding")


def test_metadata_carries_spec_key_version_graph_and_notes() -> None:
    spec = parse_spec(
        {
            "kind": "rope",
            "head_dim": 16,
            "max_positions": 32,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 40.0,
                "original_max_position_embeddings": 8,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
        }
    )
    model = export(spec, "cos_sin", mode="compute", opset=19)
    meta = metadata(model)
    request = resolve(spec, ExportOptions(graph="cos_sin", mode="compute", opset=19))
    assert meta["graph"] == "rope/cos_sin"
    assert meta["spec"] == canonical_json(request.spec)
    assert meta["key"] == content_key(request.spec)
    assert meta["export_key"] == request.key
    assert meta["version"] == __version__
    assert json.loads(meta["options"]) == {"graph": "cos_sin", "mode": "compute", "opset": 19}
    notes = json.loads(meta["notes"])
    assert notes["attention_scaling"] == pytest.approx(1.0)  # mscale == mscale_all_dim
    assert notes["softmax_scale_multiplier"] == pytest.approx(
        (0.1 * torch.log(torch.tensor(40.0)).item() + 1) ** 2
    )
    assert model.producer_name == "posenc"
    assert model.producer_version == __version__
    assert model.ir_version == IR_VERSIONS[19]
    longrope = parse_spec(
        {
            "kind": "rope",
            "head_dim": 4,
            "max_positions": 8,
            "rope_scaling": {
                "rope_type": "longrope",
                "short_factor": [1, 1],
                "long_factor": [2, 2],
                "original_max_position_embeddings": 4,
                "factor": 2.0,
            },
        }
    )
    notes = json.loads(metadata(export(longrope, "rotary"))["notes"])
    assert notes["longrope_switch_point"] == 4
    assert notes["attention_scaling"] > 1.0


def test_export_keys_follow_the_canonical_request() -> None:
    spec = spec_for("rope", "cos_sin")
    plain = resolve(spec, ExportOptions(graph="cos_sin"))
    spelled = resolve(spec, ExportOptions(graph="cos_sin", opset=17, mode="table"))
    assert plain.key == spelled.key == export_key(plain.spec, plain.options)
    assert resolve(spec, ExportOptions(graph="cos_sin", opset=18)).key != plain.key
    longer = parse_spec({**spec.model_dump(), "seq_len": 1000})
    assert resolve(longer, ExportOptions(graph="cos_sin")).key == plain.key  # graph reads L itself


def test_verify_rejects_a_wrong_graph() -> None:
    spec = spec_for("rope", "cos_sin")
    model = export(spec, "cos_sin")
    tampered = onnx.ModelProto()
    tampered.CopyFrom(model)
    for init in tampered.graph.initializer:
        if init.name == "cos_table":
            values = numpy_helper.to_array(init).copy()
            values[7, 3] += 1e-3
            init.CopyFrom(numpy_helper.from_array(values, "cos_table"))
    with pytest.raises(ExportError) as info:
        verify(tampered, spec)
    assert info.value.error_type == "export"
    assert info.value.detail["max_abs_error"] == pytest.approx(1e-3, rel=1e-2)


def test_verify_rejects_a_model_for_another_spec_or_without_metadata() -> None:
    spec = spec_for("rope", "cos_sin")
    model = export(spec, "cos_sin")
    other = parse_spec({**spec.model_dump(), "head_dim": 8})
    with pytest.raises(ExportError, match="another spec"):
        verify(model, other)
    del model.metadata_props[:]
    with pytest.raises(ExportError, match="no posenc export options"):
        verify(model, spec)


def test_verify_rejects_a_graph_the_checker_refuses() -> None:
    spec = spec_for("alibi", "bias")
    model = export(spec, "bias")
    model.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(ExportError, match="checker"):
        verify(model, spec)


def test_sinusoidal_table_rejects_positions_outside_its_rows() -> None:
    spec = parse_spec({"kind": "sinusoidal", "dim": 8, "max_positions": 10, "position_offset": 2})
    model = export(spec, "embedding", mode="table")
    run(model, {"position_ids": torch.tensor([[2, 11]])})
    with pytest.raises(Exception, match=r"position_ids must lie in \[2, 12\)"):
        run(model, {"position_ids": torch.tensor([[1]])})


@pytest.mark.parametrize(
    ("num_buckets", "max_distance", "bidirectional"),
    [(32, 128, True), (32, 128, False), (64, 1000, True), (8, 20, False), (320, 4096, True)],
)
def test_t5_bucket_lookup_is_complete_past_max_distance(
    num_buckets: int, max_distance: int, bidirectional: bool
) -> None:
    spec = parse_spec(
        {
            "kind": "t5_bias",
            "num_buckets": num_buckets,
            "max_distance": max_distance,
            "bidirectional": bidirectional,
            "key_length": 4,
        }
    )
    lut = bucket_lookup(spec)
    n = torch.arange(60 * max_distance)
    nb = num_buckets // 2 if bidirectional else num_buckets
    direct = relative_position_bucket(-n, False, nb, max_distance)
    assert torch.equal(direct, lut[n.clamp(max=max_distance)])


def test_graph_exporter_is_abstract() -> None:
    with pytest.raises(TypeError):
        GraphExporter()  # type: ignore[abstract]


def test_relative_index_window_schemes_have_no_compute_mode() -> None:
    swin = parse_spec({"kind": "relative_index", "scheme": "swin", "window_size": 3})
    with pytest.raises(UnsupportedExportError) as info:
        export(swin, "bias", mode="compute")
    assert [p.field for p in info.value.problems] == ["mode"]
    model = export(swin, "bias")  # table mode: no position inputs, only the learned table
    assert [i.name for i in model.graph.input] == ["relative_position_bias_table"]
    assert json.loads(metadata(model)["options"]) == {"graph": "bias", "mode": "table", "opset": 17}


def test_xpos_role_is_part_of_the_export_key() -> None:
    spec = spec_for("xpos", "rotary")
    query = resolve(spec, ExportOptions(graph="rotary", role="query"))
    key = resolve(spec, ExportOptions(graph="rotary", role="key"))
    assert query.key != key.key
    assert json.loads(query.options.canonical_json())["role"] == "query"
    plain = resolve(spec_for("rope", "rotary"), ExportOptions(graph="rotary"))
    assert "role" not in json.loads(plain.options.canonical_json())  # older keys unchanged


def test_parse_export_spec_knows_graph_only_kinds() -> None:
    spec = parse_export_spec({"kind": "cope", "head_dim": 4, "npos_max": 3})
    assert isinstance(spec, CopeSpec)
    assert spec.outputs() == {}
    assert parse_export_spec(BASE[("alibi", "bias")]) == parse_spec(BASE[("alibi", "bias")])
    with pytest.raises(SpecError) as info:
        parse_spec({"kind": "cope", "head_dim": 4, "npos_max": 3})  # not a table family
    assert info.value.problems[0].field == "kind"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"head_dim": 0, "npos_max": 3}, "head_dim"),
        ({"head_dim": 4, "npos_max": 3, "variant": "nodiv"}, "variant"),
        ({"head_dim": 4, "npos_max": 3, "mask": "tril"}, "mask"),
        ({"head_dim": 2, "npos_max": 3, "pos_emb": [[1.0, 2.0, 3.0]]}, "pos_emb"),
        ({"head_dim": 1, "npos_max": 3, "pos_emb": [[1.0, 2.0]]}, "pos_emb"),
        ({"head_dim": 2, "npos_max": 2, "pos_emb": [[1.0, 2.0], [3.0]]}, "pos_emb"),
        ({"head_dim": 4, "npos_max": 3, "extra": 1}, "extra"),
    ],
)
def test_cope_spec_errors_name_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_export_spec({"kind": "cope", **fields})
    assert info.value.problems[0].field == field


def test_cope_canonical_form_drops_unread_pos_emb_columns() -> None:
    wide = parse_export_spec(
        {"kind": "cope", "head_dim": 2, "npos_max": 2, "pos_emb": [[1, 2, 3], [4, 5, 6]]}
    )
    narrow = parse_export_spec(
        {"kind": "cope", "head_dim": 2, "npos_max": 2, "pos_emb": [[1, 2], [4, 5]]}
    )
    assert canonical_json(wide) == canonical_json(narrow)
    assert content_key(wide) == content_key(narrow)
    options = ExportOptions(graph="logits", mode="compute", opset=17)
    assert export_key(wide.canonical(), options) == export_key(narrow.canonical(), options)
    assert resolve(wide, ExportOptions(graph="logits")).key == (
        resolve(narrow, ExportOptions(graph="logits")).key
    )
