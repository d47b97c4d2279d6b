"""Discovery: /v1/kinds, /v1/presets (>= 15 released models, values as published), /v1/resolve."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import torch

from posenc.encodings import FAMILIES, compute, content_key, parse_spec
from posenc.encodings.rope import PROFILES
from posenc.encodings.tolerances import ATOL
from posenc.presets import builtin_presets
from tests.api.wire import decode, table_url_parts
from tests.conftest import ServerHandle, start_server

CONFIGS = Path(__file__).parents[1] / "data" / "configs"

# preset -> the real config.json (tests/data/configs) it must agree with
PRESET_CONFIGS = {
    "llama-3.1-8b": "meta-llama__Llama-3.1-8B",
    "llama-3.2-1b": "meta-llama__Llama-3.2-1B",
    "llama-2-7b": "meta-llama__Llama-2-7b-hf",
    "mistral-7b-v0.3": "mistralai__Mistral-7B-v0.3",
    "qwen2.5-7b": "Qwen__Qwen2.5-7B-Instruct",
    "qwen3-8b": "Qwen__Qwen3-8B",
    "phi-3.5-mini": "microsoft__Phi-3.5-mini-instruct",
    "deepseek-v3": "deepseek-ai__DeepSeek-V3",
    "gpt-oss-20b": "openai__gpt-oss-20b",
    "gpt-j-6b": "EleutherAI__gpt-j-6b",
    "gpt-neox-20b": "EleutherAI__gpt-neox-20b",
    "bloom-560m": "bigscience__bloom-560m",
    "mpt-7b": "mosaicml__mpt-7b",
}

REQUIRED_MODELS = [
    "llama-3",
    "mistral",
    "qwen2.5",
    "qwen3",
    "phi-3.5",
    "gemma-3",
    "gpt-neox",
    "gpt-j",
    "deepseek-v3",
    "bloom",
    "mpt",
    "falcon",
    "t5",
    "whisper",
]


def test_presets_list(client: httpx.Client) -> None:
    presets = client.get("/v1/presets").json()["presets"]
    names = [p["name"] for p in presets]
    assert len(names) >= 15
    for model in REQUIRED_MODELS:
        assert any(n.startswith(model) for n in names), model
    kinds = {part["kind"] for p in presets for part in p["parts"]}
    assert kinds == {"rope", "alibi", "t5_bias", "sinusoidal"}


@pytest.mark.parametrize("name", sorted(builtin_presets()))
def test_each_preset(client: httpx.Client, name: str) -> None:
    body = client.get(f"/v1/presets/{name}").json()
    assert body["name"] == name
    assert body["model"]
    assert body["source"].startswith("https://")
    assert body["parts"]
    for part in body["parts"]:
        spec = parse_spec(part["spec"])
        assert part["key"] == content_key(spec)
        assert table_url_parts(part["url"]) == (part["key"], part["spec"])
        assert part["bytes"] == spec.output_bytes()
        assert part["outputs"] == {
            k: {"shape": list(v.shape), "dtype": v.dtype} for k, v in spec.outputs().items()
        }
        single = client.get(part["preset_url"]).json()
        assert single["key"] == part["key"]
        assert single["preset"] == name


@pytest.mark.parametrize(("preset", "config"), sorted(PRESET_CONFIGS.items()))
def test_presets_match_published_configs(client: httpx.Client, preset: str, config: str) -> None:
    published = json.loads((CONFIGS / f"{config}.json").read_text())
    resolved = client.post("/v1/resolve", json=published).json()["specs"]
    preset_keys = {p["key"] for p in client.get(f"/v1/presets/{preset}").json()["parts"]}
    assert {s["key"] for s in resolved} <= preset_keys


def test_multi_part_presets_are_addressable(
    server: ServerHandle, client: httpx.Client, etag_for: Callable[[str], str]
) -> None:
    gemma = client.get("/v1/presets/gemma-3-27b/full_attention").json()
    assert gemma["spec"]["rope_theta"] == 1_000_000.0
    assert gemma["spec"]["rope_scaling"] == {"rope_type": "linear", "factor": 8.0}
    local = client.get("/v1/presets/gemma-3-27b/sliding_attention").json()
    assert local["spec"]["rope_theta"] == 10_000.0
    assert local["key"] != gemma["key"]
    enc = client.get("/v1/presets/t5-base/encoder/table", params={"rows": "0:4"})
    dec = client.get("/v1/presets/t5-base/decoder/table", params={"rows": "0:4"})
    assert enc.status_code == dec.status_code == 200
    assert enc.headers["content-location"] != dec.headers["content-location"]
    assert enc.headers["cache-control"] == "public, max-age=3600"
    spec = parse_spec(client.get("/v1/presets/t5-base/encoder").json()["spec"])
    want = compute(spec, server.device).tensors["buckets"][:4].cpu()
    assert torch.equal(decode(enc)["buckets"], want)
    key = enc.headers["x-posenc-key"]
    r = client.get("/v1/presets/t5-base/encoder/table", headers={"If-None-Match": etag_for(key)})
    assert r.status_code == 304


def test_kinds(client: httpx.Client) -> None:
    kinds = {k["kind"]: k for k in client.get("/v1/kinds").json()["kinds"]}
    assert set(kinds) == set(FAMILIES)
    rope = kinds["rope"]
    assert rope["schema"]["properties"]["head_dim"]["type"] == "integer"
    assert "max_positions" in rope["required"]
    values = rope["valid_values"]
    assert {"llama3", "yarn", "longrope", "dynamic", "linear", "default"} <= set(
        values["rope_scaling.rope_type"]["enum"]
    )
    assert set(values["dtype"]["enum"]) == {"float32", "float16", "bfloat16"}
    assert values["head_dim"]["minimum"] == 2
    assert values["rope_scaling[rope_type=yarn].factor"]["minimum"] == 1.0
    assert "bias" in kinds["alibi"]["valid_values"]
    for kind in kinds.values():
        assert kind["summary"]
        assert kind["description"]


def test_kinds_list_the_consumer_profiles(client: httpx.Client) -> None:
    """`profiles` lists every consumer record in order, the default first, and the spec's
    `profile` values are exactly those records' names."""
    body = client.get("/v1/kinds").json()
    profiles = body["profiles"]
    assert [p["name"] for p in profiles] == list(PROFILES)
    assert profiles[0] == {
        "name": "hf",
        "label": "transformers (default)",
        "consumer": PROFILES["hf"].consumer,
        "source": PROFILES["hf"].source,
    }
    for profile in profiles:
        assert set(profile) == {"name", "label", "consumer", "source"}
        assert all(isinstance(v, str) and v for v in profile.values()), profile
    labels = [p["label"] for p in profiles]
    assert len(set(labels)) == len(labels)
    rope = next(k for k in body["kinds"] if k["kind"] == "rope")
    assert rope["valid_values"]["profile"]["enum"] == list(PROFILES)
    for name, record in PROFILES.items():
        spec = parse_spec({"kind": "rope", "head_dim": 64, "max_positions": 4, "profile": name})
        canon = spec.canonical()
        assert (canon.interleaved, canon.width, canon.packing, canon.dtype) == (
            record.interleaved,
            record.width,
            record.packing,
            record.dtype,
        ), name


def test_kinds_publish_the_explorers_facts(client: httpx.Client) -> None:
    """`tolerances` (the ONNX verifier's, per dtype) and `limits` (this server's settings), as
    the explorer reads them (the profiles: test_kinds_list_the_consumer_profiles)."""
    body = client.get("/v1/kinds").json()
    assert body["tolerances"] == ATOL
    assert set(body["limits"]) == {"max_response_bytes", "json_max_elements"}
    with start_server(max_response_bytes=12345, json_max_elements=777) as srv, srv.client() as c:
        limits = c.get("/v1/kinds").json()["limits"]
    assert limits == {"max_response_bytes": 12345, "json_max_elements": 777}


def test_resolve_names_keys_urls_and_notes(client: httpx.Client) -> None:
    config = json.loads((CONFIGS / "google__gemma-3-4b-it.json").read_text())
    specs = client.post("/v1/resolve", json=config).json()["specs"]
    names = {s["name"] for s in specs}
    assert names == {"rope:sliding_attention", "rope:full_attention"}
    for s in specs:
        assert table_url_parts(s["url"]) == (s["key"], s["spec"])
        assert isinstance(s["notes"], dict)
        assert s["bytes"] == 2 * 131072 * 256 * 4 + 128 * 4
    short = client.post("/v1/resolve", json={"hf_config": config, "max_positions": 64}).json()
    for s in short["specs"]:
        r = client.get(s["url"], params={"format": "raw", "tensor": "inv_freq"})
        assert r.status_code == 200  # resolved keys are served by GET
    one = client.post(
        "/v1/resolve",
        json={"hf_config": config, "layer_type": "full_attention", "max_positions": 8},
    ).json()["specs"]
    assert len(one) == 1
    assert one[0]["spec"]["max_positions"] == 8


def test_resolve_reports_runtime_notes(client: httpx.Client) -> None:
    deepseek = json.loads((CONFIGS / "deepseek-ai__DeepSeek-V3.json").read_text())
    notes = client.post("/v1/resolve", json=deepseek).json()["specs"][0]["notes"]
    assert notes  # e.g. YaRN's softmax scale multiplier, which no cos/sin table carries
    phi = json.loads((CONFIGS / "microsoft__Phi-3.5-mini-instruct.json").read_text())
    phi_notes = client.post("/v1/resolve", json=phi).json()["specs"][0]["notes"]
    assert phi_notes


def test_openapi(client: httpx.Client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in (
        "/v1/tables",
        "/v1/tables/{key}",
        "/v1/resolve",
        "/v1/presets",
        "/v1/presets/{name}",
        "/v1/kinds",
        "/v2/health/ready",
        "/metrics",
    ):
        assert path in paths
    assert client.get("/docs").status_code == 200
