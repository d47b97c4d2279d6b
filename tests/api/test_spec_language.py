"""One spec language (issue 23, item 6): the same spec object (fields, `hf_config` plus overrides,
or a preset plus overrides) is accepted by `POST /v1/tables`, `POST /v1/onnx`, the `/v2` models'
`spec` parameter, the Python client and its CLI, all parsed by `api/specs.spec_fields`: the three
spellings of Llama 3.1 8B's RoPE at 64 positions give one content key everywhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from posenc_client import Client
from posenc_client.cli import main
from tests.conftest import ServerHandle

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
LLAMA31 = json.loads((CONFIGS / "meta-llama__Llama-3.1-8B.json").read_text())

FIELDS = {
    "kind": "rope",
    "head_dim": 128,
    "rope_theta": 500000.0,
    "max_positions": 64,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}
CONFIG = {"hf_config": LLAMA31, "max_positions": 64}
PRESET = {"preset": "llama-3.1-8b", "max_positions": 64}
SPELLINGS = {"fields": FIELDS, "hf_config": CONFIG, "preset": PRESET}


@pytest.fixture(scope="module")
def key(client: httpx.Client) -> str:
    answer = client.post("/v1/tables", json=FIELDS)
    assert answer.status_code == 200, answer.text
    return str(answer.headers["x-posenc-key"])


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_tables(client: httpx.Client, key: str, name: str) -> None:
    answer = client.post("/v1/tables", json=SPELLINGS[name])
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-posenc-key"] == key


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_onnx_spec(client: httpx.Client, key: str, name: str) -> None:
    # the case: {"spec": {"kind": "rope", "hf_config": {...}}} answered 422 head_dim
    spec: dict[str, Any] = dict(SPELLINGS[name])
    if name == "hf_config":
        spec["kind"] = "rope"
    answer = client.post("/v1/onnx", json={"graph": "cos_sin", "spec": spec})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-posenc-spec-key"] == key


def test_onnx_top_level_spec_object(client: httpx.Client, key: str) -> None:
    for body in (CONFIG, PRESET):
        answer = client.post("/v1/onnx", json={"graph": "cos_sin", **body})
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-posenc-spec-key"] == key


@pytest.mark.parametrize("name", list(SPELLINGS))
@pytest.mark.parametrize("as_string", [True, False], ids=["json-string", "object"])
def test_v2_spec_parameter(client: httpx.Client, key: str, name: str, as_string: bool) -> None:
    spec = {k: v for k, v in SPELLINGS[name].items() if k != "max_positions"}
    body = {
        "inputs": [{"name": "position_ids", "shape": [2], "datatype": "INT64", "data": [0, 5]}],
        "parameters": {
            "spec": json.dumps(spec) if as_string else spec,
            "max_positions": 64,  # a flat parameter overrides the spec's field
            "binary_data_output": False,
        },
    }
    answer = client.post("/v2/models/rope/infer", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["parameters"]["posenc_key"] == key


def test_client_and_cli(server: ServerHandle, key: str, tmp_path: Path) -> None:
    with Client(server.url, cache=tmp_path / "cache") as client:
        for spec in SPELLINGS.values():
            assert client.table(spec).key == key
        model = client.onnx(PRESET, graph="cos_sin")
        assert model.metadata.get("spec_key", key) == key
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"preset": "llama-3.1-8b"}))
    out = tmp_path / "rope.safetensors"
    base = ["--url", server.url, "--cache-dir", str(tmp_path / "cache")]
    assert (
        main([*base, "fetch", "--spec", f"@{spec_file}", "max_positions=64", "-o", str(out)]) == 0
    )
    assert main([*base, "fetch", "--spec", json.dumps(CONFIG), "-o", str(out)]) == 0
    onnx_out = tmp_path / "rope.onnx"
    assert (
        main(
            [*base, "onnx", "--spec", json.dumps(PRESET), "--graph", "cos_sin", "-o", str(onnx_out)]
        )
        == 0
    )
    assert main([*base, "fetch", "--spec", "[1, 2]"]) == 2


@pytest.mark.parametrize(
    ("body", "status", "error_type", "field"),
    [
        ({"preset": "no-such-model"}, 404, "unknown_preset", "preset"),
        ({"preset": "gemma-3-27b", "part": "nope"}, 404, "unknown_preset_part", "part"),
        ({"preset": "gemma-3-27b"}, 400, "ambiguous_config", "part"),
        ({"preset": "llama-3.1-8b", "kind": "alibi"}, 422, "invalid_spec", "kind"),
        ({"preset": "llama-3.1-8b", "hf_config": LLAMA31}, 422, "invalid_spec", "preset"),
        ({"preset": 7}, 422, "invalid_spec", "preset"),
        ({"preset": "llama-3.1-8b", "max_positions": "64"}, 422, "invalid_spec", "max_positions"),
    ],
)
def test_spec_object_errors(
    client: httpx.Client, body: dict[str, Any], status: int, error_type: str, field: str
) -> None:
    for answer in (
        client.post("/v1/tables", json=body),
        client.post("/v1/onnx", json={"graph": "cos_sin", "spec": body}),
    ):
        assert answer.status_code == status, answer.content[:300]
        error = answer.json()
        assert error["error_type"] == error_type
        assert field in json.dumps(error["detail"])
    v2 = client.post(
        "/v2/models/rope/infer",
        json={
            "inputs": [{"name": "position_ids", "shape": [1], "datatype": "INT64", "data": [0]}],
            "parameters": {"spec": json.dumps(body)},
        },
    )
    assert v2.status_code in (400, 404), v2.text
    assert "error" in v2.json()
