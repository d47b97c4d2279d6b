"""/v1/resolve on the non-rotary models of issue 24, through the real server: Falcon's bfloat16
slopes served as Falcon computes them, T5 default configs without n_positions, the models newly
mapped, and refusals that name the model's encoding."""

from __future__ import annotations

import math

import httpx
import torch
from transformers import AutoConfig

from tests.api.wire import decode


def _config(model_type: str, **extra: object) -> dict[str, object]:
    config: dict[str, object] = AutoConfig.for_model(model_type, **extra).to_dict()
    return config


def test_falcon_alibi_slopes_are_falcons_bfloat16_slopes(client: httpx.Client) -> None:
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    config = _config("falcon", alibi=True, num_attention_heads=12, hidden_size=768)
    (spec,) = client.post("/v1/resolve", json=config).json()["specs"]
    assert spec["spec"]["slope_rounding"] == "bfloat16"
    r = client.get(spec["url"])
    assert r.status_code == 200
    ours = decode(r)["slopes"]
    hf = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), 12, torch.float32)[:, 0, 1]
    torch.testing.assert_close(ours, hf / math.sqrt(64), rtol=1e-6, atol=0)


def test_t5_default_config_gets_a_key_length_the_request_can_change(client: httpx.Client) -> None:
    config = _config("t5")
    specs = client.post("/v1/resolve", json=config).json()["specs"]
    assert [s["name"] for s in specs] == ["t5_bias:encoder", "t5_bias:decoder"]
    assert {s["spec"]["key_length"] for s in specs} == {512}
    short = client.post("/v1/resolve", json={"hf_config": config, "key_length": 16}).json()
    assert {s["spec"]["key_length"] for s in short["specs"]} == {16}


def test_newly_mapped_sinusoid_models(client: httpx.Client) -> None:
    for model_type, names in {
        "pegasus": ["sinusoidal"],
        "xglm": ["sinusoidal"],
        "speech_to_text": ["sinusoidal:encoder", "sinusoidal:decoder"],
    }.items():
        r = client.post("/v1/resolve", json=_config(model_type))
        assert r.status_code == 200, (model_type, r.text)
        assert [s["name"] for s in r.json()["specs"]] == names


def test_unmapped_models_are_refused_with_their_encoding(client: httpx.Client) -> None:
    r = client.post("/v1/resolve", json=_config("mask2former"))
    assert r.status_code == 422, r.text
    body = r.json()
    assert set(body) >= {"error", "error_type", "detail"}
    assert "Mask2FormerSinePositionEmbedding" in r.text
    assert "model_type" in r.text
    r = client.post("/v1/resolve", json=_config("swinv2"))
    assert r.status_code == 422
    assert "relative_coords_table" in r.text


def test_detr_needs_the_feature_map_size_from_the_request(client: httpx.Client) -> None:
    config = _config("detr")
    r = client.post("/v1/resolve", json=config)
    assert r.status_code == 422
    assert {p["field"] for p in r.json()["detail"]} >= {"height", "width"}
    request = {"hf_config": config, "height": 25, "width": 34, "valid_width": 30}
    (spec,) = client.post("/v1/resolve", json=request).json()["specs"]
    assert spec["name"] == "sinusoidal_2d"
    assert spec["spec"]["num_pos_feats"] == 128
    table = decode(client.get(spec["url"]))["embedding"]
    assert table.shape == (256, 25, 34)
