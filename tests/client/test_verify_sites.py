"""A verdict only for what was checked (issue 28): `posenc-client verify` exits 0 only when at
least one RoPE site was compared and every site is exact, and the CLI, the library and
`POST /v1/check/onnx` give the same outcome per site (`tests.client.parity`).

- an opset-23 `RotaryEmbedding` reading `cos_cache`/`sin_cache` from graph inputs holds no
  values: its site is "not checkable" (the node and the reason named), exit 9 (was an empty
  report and exit 0), also with `--allow-unchecked` since nothing was checked;
- posenc's own `POST /v1/onnx` `rope/rotary` graph (`op: onnx`, mode `table`: the caches
  gathered by position from `cos_table`/`sin_table` behind the range-guard Gather) is found
  through the Gather and verifies exact (was an empty report and exit 0); its table altered by
  the dropped scaling is diagnosed (exit 8), and plug repairs it: then exact, its tables those
  of posenc's export for the config (was exit 6: plug took only cache inputs);
- a model with one baked GQA site and one graph-input site: exit 9, `--allow-unchecked` 0;
- `--json` lists every site, checked or not.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h

from posenc_client import Client
from tests.client import blocks
from tests.client.parity import cli, verify_three_ways
from tests.conftest import ServerHandle

HD, HEADS, KV_HEADS, ROWS = 64, 4, 2, 256
LLAMA = blocks.CONFIGS / "meta-llama__Llama-3.1-8B.json"


def _small_llama(tmp_path: Path) -> Path:
    """Llama 3.1's config (llama3 scaling) with head_dim 64: small tables, the same RoPE."""
    config = json.loads(LLAMA.read_text())
    config.update(hidden_size=HEADS * HD, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def _graph_input_rotary(path: Path) -> onnx.ModelProto:
    """RotaryEmbedding-23 on q whose cos_cache/sin_cache are graph inputs (built by hand)."""
    inputs = [
        h.make_tensor_value_info("q", TensorProto.FLOAT, [1, HEADS, "S", HD]),
        h.make_tensor_value_info("cos_cache", TensorProto.FLOAT, ["P", HD // 2]),
        h.make_tensor_value_info("sin_cache", TensorProto.FLOAT, ["P", HD // 2]),
        h.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "S"]),
    ]
    node = h.make_node(
        "RotaryEmbedding", ["q", "cos_cache", "sin_cache", "position_ids"], ["q_rot"],
        name="rope_q",
    )  # fmt: skip
    out = h.make_tensor_value_info("q_rot", TensorProto.FLOAT, [1, HEADS, "S", HD])
    graph = h.make_graph([node], "rotary", inputs, [out])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 23)], ir_version=10)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return model


def test_graph_input_caches_are_not_checkable(server: ServerHandle, tmp_path: Path) -> None:
    model = tmp_path / "rotary.onnx"
    _graph_input_rotary(model)
    config = _small_llama(tmp_path)
    code, output = cli(server, tmp_path, "verify", str(model), "--config", str(config))
    assert code == 9, output
    assert "cos_cache: not checkable" in output
    assert "'rope_q'" in output
    assert "graph input" in output
    assert "outcome: not_checkable (0 checked, 1 not checkable)" in output
    code, output = cli(
        server, tmp_path, "verify", str(model), "--config", str(config), "--allow-unchecked"
    )
    assert code == 9, output  # nothing was checked: no pass, even knowingly
    code, report = verify_three_ways(server, tmp_path, model, config)
    assert code == 9
    (site,) = report["sites"]
    assert (site["name"], site["verdict"], site["nodes"]) == (
        "cos_cache",
        "not_checkable",
        ["rope_q"],
    )


def _posenc_rotary(client: Client, config: Path, path: Path, op: str = "onnx") -> None:
    (spec,) = client.resolve(json.loads(config.read_text()), kind="rope")
    graph = client.onnx(
        {**spec.spec, "max_positions": ROWS}, graph="rotary", op=op, mode="table", opset=23
    )
    path.write_bytes(graph.data)


@pytest.mark.parametrize("op", ["onnx", "contrib"])
def test_posenc_rotary_graph_is_found_through_its_gather(
    server: ServerHandle, pclient: Client, tmp_path: Path, op: str
) -> None:
    """RotaryEmbedding-23 reads the gathered [B, S, d/2] rows; com.microsoft.RotaryEmbedding a
    [B*S, d/2] Reshape of them: both found back to cos_table/sin_table."""
    config = _small_llama(tmp_path)
    model = tmp_path / "posenc_rotary.onnx"
    _posenc_rotary(pclient, config, model, op)
    code, report = verify_three_ways(server, tmp_path, model, config)
    assert code == 0, report
    assert report["outcome"] == "exact"
    kinds = {(s["name"], s["kind"], s["verdict"]) for s in report["sites"]}
    assert kinds == {("cos_table", "gathered", "exact"), ("sin_table", "gathered", "exact")}
    assert all(s["rows"] == ROWS for s in report["sites"])

    # the same graph with the llama3 scaling dropped from its tables (the default RoPE's)
    default = json.loads(config.read_text())
    default["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    default.pop("rope_scaling", None)
    default_path = tmp_path / "default.json"
    default_path.write_text(json.dumps(default))
    unscaled = tmp_path / "unscaled.onnx"
    _posenc_rotary(pclient, default_path, tmp_path / "default_rotary.onnx", op)
    tables = {t.name: t for t in onnx.load(tmp_path / "default_rotary.onnx").graph.initializer}
    broken = onnx.load(model)
    for initializer in broken.graph.initializer:
        if initializer.name in ("cos_table", "sin_table"):
            initializer.CopyFrom(tables[initializer.name])
    onnx.save(broken, unscaled)
    code, report = verify_three_ways(server, tmp_path, unscaled, config)
    assert code == 8, report
    assert "llama3 scaling is missing" in " ".join(report["sites"][0]["diagnosis"])

    # verify's repair is plug's: the gathered tables rewritten, then exact, the graph unchanged
    fixed = tmp_path / "fixed.onnx"
    code, output = cli(server, tmp_path, "plug", str(unscaled), "--config", str(config),
                       "-o", str(fixed))  # fmt: skip
    assert code == 0, output
    assert "into 1 gathered site;" in output
    code, report = verify_three_ways(server, tmp_path, fixed, config)
    assert code == 0, report
    plugged, exported = onnx.load(fixed), onnx.load(model)
    assert [n.SerializeToString() for n in plugged.graph.node] == [
        n.SerializeToString() for n in exported.graph.node
    ]
    got = {t.name: onnx.numpy_helper.to_array(t) for t in plugged.graph.initializer}
    for initializer in exported.graph.initializer:  # posenc's own export for the config
        assert np.array_equal(got[initializer.name], onnx.numpy_helper.to_array(initializer))


def test_checked_and_unchecked_sites_together(
    server: ServerHandle, pclient: Client, tmp_path: Path
) -> None:
    """A baked exact GQA site beside a RotaryEmbedding reading graph inputs: 9, and 0 only
    with --allow-unchecked; the JSON lists both sites."""
    config = _small_llama(tmp_path)
    (tables,) = pclient.tables_for_model(  # the reference bytes, as an exporter bakes them
        str(config), device="cpu", kind="rope", profile="ort_gqa", max_positions=ROWS
    ).values()
    model = blocks.baked_gqa_block(HD, HEADS, KV_HEADS, tables["cos"], tables["sin"])
    rotary = _graph_input_rotary(tmp_path / "rotary.onnx")
    model.graph.input.extend([i for i in rotary.graph.input if i.name != "q"])
    model.graph.input.append(rotary.graph.input[0])
    model.graph.node.extend(rotary.graph.node)
    model.graph.output.extend(rotary.graph.output)
    del model.opset_import[:]
    model.opset_import.extend([h.make_opsetid("", 23), h.make_opsetid("com.microsoft", 1)])
    onnx.checker.check_model(model)
    path = tmp_path / "mixed.onnx"
    onnx.save(model, path)
    code, report = verify_three_ways(server, tmp_path, path, config)
    assert code == 9, report
    verdicts = [(s["name"], s["verdict"]) for s in report["sites"]]
    assert verdicts == [("cos", "exact"), ("sin", "exact"), ("cos_cache", "not_checkable")]
    code, output = cli(server, tmp_path, "verify", str(path), "--config", str(config),
                       "--allow-unchecked")  # fmt: skip
    assert code == 0, output
    assert "outcome: exact (2 checked, 1 not checkable)" in output


def test_placeholder_caches_are_not_a_pass(server: ServerHandle, tmp_path: Path) -> None:
    """All-zero placeholder caches (an exporter left the slot to fill): exit 8, never 0."""
    model = tmp_path / "placeholder.onnx"
    onnx.save(blocks.gqa_block(HD, HEADS, KV_HEADS, caches="initializer"), model)
    code, report = verify_three_ways(server, tmp_path, model, _small_llama(tmp_path))
    assert code == 8, report
    assert [s["verdict"] for s in report["sites"]] == ["placeholder", "exact"]


@pytest.mark.parametrize("role", ["cos_and_sin", "many_pairs"])
def test_hostile_pairings_are_refused(server: ServerHandle, tmp_path: Path, role: str) -> None:
    """k initializers wired into k^2 GroupQueryAttention pairings: a tensor read as cos by one
    node and as sin by another is refused before any value is compared; k cos x k sin distinct
    pairs past MAX_SITES too (exit 6, the route 422 `site_limit`)."""
    from posenc_check.sites import MAX_SITES

    k = 8 if role == "cos_and_sin" else 17  # 17 * 17 = 289 > MAX_SITES
    assert role == "cos_and_sin" or k * k > MAX_SITES
    cache = np.zeros((4, HD // 2), np.float32)
    names = [f"c{i}" for i in range(k)]
    sin_names = names if role == "cos_and_sin" else [f"s{i}" for i in range(k)]
    model = blocks.gqa_pairings(HD, HEADS, KV_HEADS, names, sin_names, cache)
    path = tmp_path / "hostile.onnx"
    onnx.save(model, path)
    config = _small_llama(tmp_path)
    code, output = cli(server, tmp_path, "verify", str(path), "--config", str(config))
    assert code == 6, output
    expected = "as cos by one RoPE consumer and as sin" if role == "cos_and_sin" else "more than"
    assert expected in output
    with Client(server.url, cache=False) as client:
        (spec,) = client.resolve(json.loads(config.read_text()), kind="rope")
    with server.client() as http:
        response = http.post("/v1/check/onnx", params={"key": spec.key}, content=path.read_bytes())
    assert response.status_code == 422, response.text
    assert response.json()["error_type"] == "site_limit"
    assert expected in response.json()["error"]
