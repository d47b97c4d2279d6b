"""/v1/resolve on the non-rotary models of issue 24, through the real server: Falcon's bfloat16
slopes served as Falcon computes them, T5 default configs without n_positions, the models newly
mapped, and refusals that name the model's encoding."""

from __future__ import annotations

import math

import httpx
import torch
from transformers import AutoConfig

from tests.api.wire import decode
from tests.conftest import ServerHandle
from tests.tolerances import served_as_reference


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
    r = client.post("/v1/resolve", json=_config("sam2_prompt_encoder"))
    assert r.status_code == 422, r.text
    body = r.json()
    assert set(body) >= {"error", "error_type", "detail"}
    assert "random Fourier features" in r.text
    assert "model_type" in r.text
    r = client.post("/v1/resolve", json=_config("cpmant"))
    assert r.status_code == 422
    assert "CpmAntSegmentPositionEmbedding" in r.text


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


def test_a_learned_table_without_weights_is_listed_not_fatal(client: httpx.Client) -> None:
    """Swin with absolute embeddings: the window index is served; the checkpoint's learned table,
    which config.json does not carry, is listed in `unserved` naming `table_key`; given inline,
    both are served and nothing is left out."""
    config = _config("swin", use_absolute_embeddings=True, image_size=32)
    body = client.post("/v1/resolve", json=config).json()
    assert [s["name"] for s in body["specs"]] == ["relative_index"]
    (part,) = body["unserved"]
    assert (part["part"], part["config_key"]) == ("learned", "table_key")
    assert "embeddings.position_embeddings" in part["reason"]
    table = torch.arange(64 * 96, dtype=torch.float32).reshape(64, 96) / 1000
    full = client.post("/v1/resolve", json={"hf_config": config, "table": table.tolist()}).json()
    assert [s["name"] for s in full["specs"]] == ["relative_index", "learned"]
    assert full["unserved"] == []
    served = decode(client.get(full["specs"][1]["url"]))
    assert torch.equal(next(iter(served.values())), table)


def test_a_composite_serves_its_mapped_part_and_lists_the_others(
    server: ServerHandle, client: httpx.Client
) -> None:
    """Grounding DINO: the vision side's sine table (exactly the model's module) is served; the
    BERT text encoder, the per-phrase text positions and the backbone are listed with reasons."""
    from transformers.models.grounding_dino.modeling_grounding_dino import (
        GroundingDinoSinePositionEmbedding,
    )

    cfg = AutoConfig.for_model("grounding-dino")
    request = {"hf_config": cfg.to_dict(), "height": 9, "width": 12, "valid_height": 7}
    r = client.post("/v1/resolve", json=request)
    assert r.status_code == 200, r.text
    body = r.json()
    (spec,) = body["specs"]
    assert (spec["spec"]["temperature_h"], spec["spec"]["temperature_w"]) == (20.0, 20.0)
    assert [(u["part"], u["config_key"]) for u in body["unserved"]] == [
        ("text_config", "text_config.model_type"),
        ("text_positions", "text_config"),
        ("backbone_config", "backbone_config"),
    ]
    mask = torch.zeros(1, 9, 12, dtype=torch.long)
    mask[:, :7] = 1
    theirs = GroundingDinoSinePositionEmbedding(cfg)(torch.zeros(1, 3, 9, 12), mask)[0]
    got = decode(client.get(spec["url"]))["embedding"]
    assert served_as_reference(got, theirs, server.device)


def test_nothing_servable_is_still_a_422_naming_what_is_missing(client: httpx.Client) -> None:
    """ViT's only table is the checkpoint's: 422 naming `table_key`; a served config answers an
    empty `unserved` list."""
    r = client.post("/v1/resolve", json=_config("vit"))
    assert r.status_code == 422, r.text
    assert [p["field"] for p in r.json()["detail"]] == ["table_key"]
    assert client.post("/v1/resolve", json=_config("t5")).json()["unserved"] == []


def test_falcon_bias_is_what_falcon_model_adds(client: httpx.Client) -> None:
    """Issue 31: with bias='row_constant' the resolved Falcon-RW spec serves FalconModel's own
    bias (build_alibi_tensor's bfloat16 products / sqrt(head_dim)), bit for bit at 2048 keys."""
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    config = _config("falcon", alibi=True, num_attention_heads=32, hidden_size=2048)
    request = {"hf_config": config, "bias": "row_constant", "key_length": 2048}
    request |= {"query_length": 1, "query_offset": 2047}
    (spec,) = client.post("/v1/resolve", json=request).json()["specs"]
    assert spec["spec"]["bias_rounding"] == "bfloat16"
    r = client.get(spec["url"])
    assert r.status_code == 200, r.text
    ours = decode(r)["bias"][:, 0, :]
    mask = torch.ones(1, 2048, dtype=torch.long)
    theirs = build_alibi_tensor(mask, 32, torch.float32)[:, 0, :] / math.sqrt(64)
    assert torch.equal(ours, theirs)


def test_relative_sinusoids_for_an_input_length_from_the_request(
    server: ServerHandle, client: httpx.Client
) -> None:
    """Parakeet's relative sinusoids (descending rows, `position_step` -1): the default table is
    the distances max_position_embeddings-1 .. -(max_position_embeddings-1); the rows its notes
    name for an input of L frames, and the table the request's position_offset=L-1,
    max_positions=2L-1 gives, are what ParakeetEncoderRelPositionalEncoding returns for L."""
    from transformers.models.parakeet.modeling_parakeet import (
        ParakeetEncoderRelPositionalEncoding,
    )

    length, longest = 40, 300
    config = _config("parakeet_encoder", hidden_size=64, max_position_embeddings=longest)
    (spec,) = client.post("/v1/resolve", json=config).json()["specs"]
    assert spec["spec"]["position_step"] == -1
    assert f"r = {longest} - L .. {longest} + L - 2" in spec["notes"]["rows"]
    full = decode(client.get(spec["url"]))["embedding"]
    module = ParakeetEncoderRelPositionalEncoding(
        AutoConfig.for_model(
            "parakeet_encoder", **{"hidden_size": 64, "max_position_embeddings": longest}
        )
    )
    theirs = module(torch.zeros(1, length, 1))[0]
    assert served_as_reference(full[longest - length : longest + length - 1], theirs, server.device)
    request = {"hf_config": config, "position_offset": length - 1, "max_positions": 2 * length - 1}
    (short,) = client.post("/v1/resolve", json=request).json()["specs"]
    short_table = decode(client.get(short["url"]))["embedding"]
    assert served_as_reference(short_table, theirs, server.device)


def test_levit_indices_through_the_server(client: httpx.Client) -> None:
    """LeViT resolves to one `levit` index per stage and subsample block, each equal to the
    attention_bias_idxs of the module the encoder builds there."""
    from transformers.models.levit.modeling_levit import (
        LevitAttention,
        LevitAttentionSubsample,
    )

    specs = client.post("/v1/resolve", json=_config("levit")).json()["specs"]
    names = [s["name"] for s in specs]
    assert names == [
        "relative_index:stage0",
        "relative_index:subsample0",
        "relative_index:stage1",
        "relative_index:subsample1",
        "relative_index:stage2",
    ]
    by_name = {s["name"]: decode(client.get(s["url"]))["index"] for s in specs}
    assert torch.equal(
        by_name["relative_index:stage0"], LevitAttention(16, 4, 2, 2, 14).attention_bias_idxs
    )
    sub = LevitAttentionSubsample(16, 32, 4, 2, 2, 2, 14, 7)
    assert torch.equal(by_name["relative_index:subsample0"], sub.attention_bias_idxs)
    assert torch.equal(
        by_name["relative_index:stage2"], LevitAttention(16, 4, 2, 2, 4).attention_bias_idxs
    )
