"""`POST /v1/mrope/position_ids` and M-RoPE through `/v1/resolve` and `/v2`, end to end (issue 18).

The route, called through posenc_client, equals transformers' `get_rope_index`; its ids fed to
the `/v2` `rope` model with the resolved config's `notes.mrope.v2_parameters` (and the resolved
table's URL gathered per `notes.mrope.pair_axes`) give per-token cos/sin bit-equal to the model's
own rotary module run on the position ids of its `get_rope_index`.
"""

from __future__ import annotations

import io
import json
import warnings
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as http

from posenc_client import Client, InvalidSpecError, UnsupportedConfigError
from tests.api.v2client import as_torch, make_input, url
from tests.conftest import ServerHandle
from tests.encodings.hf_config import mrope_sweep
from tests.encodings.test_mrope_index import (
    OMNI_LAYOUTS,
    layouts,
    omni_index,
    transformers_index,
)
from tests.tolerances import served_as_reference

LAYOUT = [
    {"text": 3},
    {"image": [1, 4, 6]},
    {"text": 2},
    {"video": [3, 6, 4], "second_per_grid_t": 0.5},
    {"text": 4},
]
FRAMES = [
    {"text": 3},
    {"image": [1, 4, 6]},
    {"text": 2},
    {"video": [1, 6, 4]},
    {"text": 1},
    {"video": [1, 6, 4]},
    {"text": 4},
]


@pytest.fixture(scope="module")
def triton(server: ServerHandle) -> http.InferenceServerClient:
    return http.InferenceServerClient(url(server))


@pytest.fixture
def pclient(server: ServerHandle) -> Any:
    with Client(server.url, retries=0) as client:
        yield client


def _layout(model_type: str) -> list[dict[str, Any]]:
    if model_type in ("qwen3_vl", "glm4v"):
        return FRAMES
    if model_type == "qwen2_5_vl":
        return LAYOUT
    return [{k: v for k, v in s.items() if k != "second_per_grid_t"} for s in LAYOUT]


@pytest.mark.parametrize(
    "model_type", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "ernie4_5_vl_moe"]
)
def test_route_equals_get_rope_index(pclient: Client, model_type: str) -> None:
    """The client's mrope_position_ids for a model_type (class defaults) equals get_rope_index."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = CONFIG_MAPPING[model_type]()
    rule = "qwen3_vl" if model_type in ("qwen3_vl", "glm4v") else "qwen2_vl"
    cases = {**layouts(rule), "mixed": _layout(model_type)}
    for name, layout in cases.items():
        if model_type != "qwen2_5_vl":
            layout = [{k: v for k, v in s.items() if k != "second_per_grid_t"} for s in layout]
        got = pclient.mrope_position_ids(layout, model_type=model_type)
        want, delta = transformers_index(model_type, config, layout)
        assert np.array_equal(got.position_ids, want.numpy()), name
        assert got.mrope_position_deltas == int(delta), name
        assert got.position_ids.dtype == np.int64


def test_route_equals_qwen2_5_omni(pclient: Client) -> None:
    """Qwen2.5-Omni's thinker rule through the client, from a released-style config.json (its
    thinker_config's position_id_per_seconds and vision_config), equals its get_rope_index."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = CONFIG_MAPPING["qwen2_5_omni"]()
    data = json.loads(config.to_json_string())
    for name, layout in OMNI_LAYOUTS.items():
        got = pclient.mrope_position_ids(layout, config=data)
        want, delta = omni_index(config, layout)
        assert got.rule == "qwen2_5_omni"
        assert got.parameters["position_id_per_seconds"] == 25
        assert np.array_equal(got.position_ids, want.numpy()), name
        assert got.mrope_position_deltas == int(delta), name


def _rotary(data: dict[str, Any]) -> torch.nn.Module:
    config = mrope_sweep.sweep.load_config(data)
    text = mrope_sweep._text_config(config)
    return mrope_sweep._rotary_class(mrope_sweep._module(text), text)(text)


@pytest.mark.parametrize(
    "name",
    [
        "Qwen/Qwen2-VL-7B-Instruct",
        "Qwen/Qwen2.5-VL-7B-Instruct",
        "Qwen/Qwen3-VL-8B-Instruct",
        "zai-org/GLM-4.1V-9B-Thinking",
        "baidu/ERNIE-4.5-VL-28B-A3B-PT",
    ],
)
def test_route_ids_through_v2_equal_the_model(
    client: httpx.Client, triton: http.InferenceServerClient, server: ServerHandle, name: str
) -> None:
    """Released config -> /v1/resolve -> /v1/mrope/position_ids -> /v2 rope (or the table URL)
    -> cos/sin per token, bit-equal to the model's rotary module on get_rope_index's ids."""
    data = mrope_sweep.RELEASED[name]
    model_type = str(data["model_type"])
    layout = _layout(model_type)
    resolved = client.post("/v1/resolve", json={"hf_config": data, "max_positions": 256})
    assert resolved.status_code == 200, resolved.text
    specs = resolved.json()["specs"]
    (entry,) = [e for e in specs if e["name"] == "rope"]
    # the vision tower's rotary comes beside the text table (issue 18's vision half)
    assert [e["name"] for e in specs if e is not entry] == ["vision_rope:vision"]
    mrope = entry["notes"]["mrope"]
    answer = client.post("/v1/mrope/position_ids", json={"hf_config": data, "layout": layout})
    assert answer.status_code == 200, answer.text
    ids = np.asarray(answer.json()["position_ids"], dtype=np.int64)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = CONFIG_MAPPING[model_type].from_dict(json.loads(json.dumps(data)))
    want_ids, _ = transformers_index(model_type, config, layout)
    assert np.array_equal(ids, want_ids.numpy())
    want_cos, want_sin = _rotary(data)(torch.zeros(1), want_ids[:, None, :])
    pairing = entry["notes"]["pairing"]
    params = {"spec": json.dumps(entry["spec"]), **{
        k: json.dumps(v) if isinstance(v, list) else v
        for k, v in mrope["v2_parameters"].items()
    }}  # fmt: skip
    result = triton.infer("rope", [make_input("position_ids", ids[:, None, :])], parameters=params)
    cos, sin = as_torch(result, "cos")[0], as_torch(result, "sin")[0]
    # the same from the table's URL, column i from the row of axis pair_axes[i]
    got = client.get(entry["url"], params={"format": "npz"})
    assert got.status_code == 200, got.text
    npz = np.load(io.BytesIO(got.content))
    step = 2 if pairing == "interleaved" else 1
    half = entry["spec"]["rotary_dim"] // 2
    cos_t = torch.from_numpy(npz["cos"].copy())[:, ::step][:, :half]
    sin_t = torch.from_numpy(npz["sin"].copy())[:, ::step][:, :half]
    ids_t = torch.from_numpy(ids)
    cos_u = mrope_sweep.widen(mrope_sweep.gather(cos_t, ids_t, mrope["pair_axes"]), pairing)
    sin_u = mrope_sweep.widen(mrope_sweep.gather(sin_t, ids_t, mrope["pair_axes"]), pairing)
    assert torch.equal(cos_u, cos)
    assert torch.equal(sin_u, sin)
    if server.device.type == "cpu":
        assert torch.equal(cos, want_cos[0])
        assert torch.equal(sin, want_sin[0])
    else:
        torch.testing.assert_close(cos, want_cos[0], atol=2.4e-7, rtol=0)
        torch.testing.assert_close(sin, want_sin[0], atol=2.4e-7, rtol=0)


Q2 = {"model_type": "qwen2_vl"}
ERRORS: list[tuple[dict[str, Any], str]] = [
    ({"model_type": "llama", "layout": [{"text": 1}]}, "model_type"),
    ({"hf_config": {"model_type": "hy_v4_vl"}, "layout": [{"text": 1}]}, "hf_config.model_type"),
    ({"layout": [{"text": 1}]}, "model_type"),
    ({**Q2, "hf_config": Q2, "layout": []}, "model_type"),
    ({**Q2, "layout": [{"text": 1}], "stride": 2}, "stride"),
    ({**Q2, "layout": "text"}, "layout"),
    ({**Q2, "layout": [{"text": 1 << 40}]}, "layout"),
    ({**Q2, "layout": [{"image": [1, 2, 2]}], "spatial_merge_size": 0}, "spatial_merge_size"),
    (
        {"model_type": "qwen2_5_vl", "layout": [{"video": [1, 2, 2]}], "tokens_per_second": -1},
        "tokens_per_second",
    ),
    ({"model_type": "qwen3_vl", "layout": [{"video": [2, 2, 2]}]}, "layout[0].video[0]"),
]


@pytest.mark.parametrize(("body", "field"), ERRORS)
def test_bad_requests_name_the_field(
    client: httpx.Client, body: dict[str, Any], field: str
) -> None:
    response = client.post("/v1/mrope/position_ids", json=body)
    assert response.status_code == 422, response.text
    data = response.json()
    assert set(data) >= {"error", "error_type", "detail"}
    assert data["detail"][0]["field"] == field


def test_client_takes_a_config(pclient: Client, client: httpx.Client) -> None:
    """config= (a config.json dict) sends hf_config: its vision_config's tokens_per_second (2,
    not the class default 4) is used."""
    data = mrope_sweep.RELEASED["Qwen/Qwen2.5-VL-7B-Instruct"]
    got = pclient.mrope_position_ids(LAYOUT, config=data)
    direct = client.post("/v1/mrope/position_ids", json={"hf_config": data, "layout": LAYOUT})
    assert got.parameters["tokens_per_second"] == 2
    assert got.position_ids.tolist() == direct.json()["position_ids"]
    default = pclient.mrope_position_ids(LAYOUT, model_type="qwen2_5_vl")
    assert default.parameters["tokens_per_second"] == 4
    assert not np.array_equal(default.position_ids, got.position_ids)


def test_client_errors_are_typed(pclient: Client) -> None:
    with pytest.raises(UnsupportedConfigError):
        pclient.mrope_position_ids([{"text": 1}], model_type="llama")
    with pytest.raises(InvalidSpecError):
        pclient.mrope_position_ids([{"text": 0}], model_type="qwen2_vl")


def test_resolve_notes_describe_mrope(client: httpx.Client) -> None:
    """Qwen2-VL's v4 config ({"type": "mrope"}) resolves to the 1-D table with its sections;
    GLM-4V's class defaults (sections that do not fit its rotary width) are refused naming the
    key."""
    answer = client.post("/v1/resolve", json=mrope_sweep.RELEASED["Qwen/Qwen2-VL-7B-Instruct"])
    assert answer.status_code == 200, answer.text
    (entry,) = [e for e in answer.json()["specs"] if e["name"] == "rope"]
    assert entry["notes"]["mrope"]["mrope_section"] == [16, 24, 24]
    assert entry["notes"]["mrope"]["layout"] == "chunked"
    assert entry["notes"]["mrope"]["v2_parameters"]["mrope_interleaved"] is False
    text = {"model_type": "glm4v_text", "hidden_size": 4096, "num_attention_heads": 32}
    glm = {"model_type": "glm4v", "text_config": {**text, "rope_theta": 1e4}}
    refused = client.post("/v1/resolve", json=glm)
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["field"] == "text_config.rope_parameters.mrope_section"


def test_v2_mrope_layout_errors(triton: http.InferenceServerClient) -> None:
    from tritonclient.utils import InferenceServerException

    pos = make_input("position_ids", np.zeros((3, 1, 4), np.int64))
    spec = {"head_dim": 64, "max_positions": 32, "mrope_section": "[8, 12, 12]"}
    for extra, message in (
        ({"mrope_layout": "ernie"}, "needs sections"),
        ({"mrope_layout": "diagonal"}, "must be one of"),
        ({"mrope_layout": "chunked", "mrope_interleaved": "true"}, "agrees with"),
    ):
        with pytest.raises(InferenceServerException, match=message):
            triton.infer("rope", [pos], parameters={**spec, **extra})
    ok = triton.infer("rope", [pos], parameters={**spec, "mrope_section": "[10, 10, 12]",
                                                  "mrope_layout": "ernie"})  # fmt: skip
    assert ok.get_response()["parameters"]["posenc_mrope"] == "ernie [10, 10, 12]"


PER_LAYER = {
    "neomme (class defaults: the released shape)": None,
    **{name: name for name in mrope_sweep.BUILT if name.startswith("cohere_compass")},
}
CHANNEL_CHUNKS = [name for name in mrope_sweep.BUILT if name.startswith("hunyuan_vl")]
"""HunYuan-VL's built configs (HunyuanOCR's four axes, a three-axis one): `channel_axes`."""


def _per_layer_config(name: str | None) -> dict[str, Any]:
    if name is None:
        return mrope_sweep.case_config("neomme", "default", "v5")
    return json.loads(json.dumps(mrope_sweep.BUILT[name]))


@pytest.mark.parametrize("name", list(PER_LAYER.values()), ids=list(PER_LAYER))
def test_per_layer_type_mrope_through_the_api_equals_the_model(
    client: httpx.Client, triton: http.InferenceServerClient, server: ServerHandle, name: str | None
) -> None:
    """NeoMME (two axes, row and column) and Cohere Compass (a section per layer type): each
    `rope:<layer type>` table of /v1/resolve, fetched from its URL and gathered per its
    `notes.mrope.pair_axes` over `notes.mrope.axes`, and the /v2 rope model with the spec and
    `notes.mrope.v2_parameters`, give the model's own rotary module's cos/sin for that layer
    type on position ids whose axes differ; and the model's apply_rotary_pos_emb rotates q and
    k alike from them."""
    data = _per_layer_config(name)
    resolved = client.post("/v1/resolve", json={"hf_config": data, "max_positions": 256})
    assert resolved.status_code == 200, resolved.text
    entries = {e["name"]: e for e in resolved.json()["specs"] if e["name"].startswith("rope")}
    rotary = _rotary(data)
    kinds = sorted(rotary.rope_type)
    axes = mrope_sweep.axis_count(type(rotary))
    ids = mrope_sweep.positions(mrope_sweep.N, axes)
    module = mrope_sweep._module(mrope_sweep._text_config(mrope_sweep.sweep.load_config(data)))
    for layer_type in kinds:
        entry = entries.get(f"rope:{layer_type}") or entries["rope"]
        mrope = entry["notes"]["mrope"]
        assert len(mrope["axes"]) == axes
        want_cos, want_sin = rotary(torch.zeros(1), ids[:, None, :], layer_type=layer_type)
        # the reference bytes (`?device=cpu`, what a CPU server serves): bit-equal to the model
        got = client.get(entry["url"], params={"format": "npz", "device": "cpu"})
        assert got.status_code == 200, got.text
        npz = np.load(io.BytesIO(got.content))
        half = entry["spec"]["rotary_dim"] // 2
        assert entry["notes"]["pairing"] == "half_split"
        cos_t = torch.from_numpy(npz["cos"].copy())[:, :half]
        sin_t = torch.from_numpy(npz["sin"].copy())[:, :half]
        cos = mrope_sweep.widen(mrope_sweep.gather(cos_t, ids, mrope["pair_axes"]), "half_split")
        sin = mrope_sweep.widen(mrope_sweep.gather(sin_t, ids, mrope["pair_axes"]), "half_split")
        assert torch.equal(cos, want_cos[0]), layer_type
        assert torch.equal(sin, want_sin[0]), layer_type
        # the server's own table (a GPU server's: within the 2-ulp bound of docs/gpu.md)
        own = np.load(io.BytesIO(client.get(entry["url"], params={"format": "npz"}).content))
        for name_, ref in (("cos", npz["cos"]), ("sin", npz["sin"])):
            assert served_as_reference(
                torch.from_numpy(own[name_].copy()), torch.from_numpy(ref.copy()), server.device
            ), (layer_type, name_)
        params = {"spec": json.dumps(entry["spec"]), **{
            k: json.dumps(v) if isinstance(v, list) else v
            for k, v in mrope["v2_parameters"].items()
        }}  # fmt: skip
        position_ids = ids[:, None, :].numpy()
        result = triton.infer("rope", [make_input("position_ids", position_ids)], parameters=params)
        v2_cos, v2_sin = as_torch(result, "cos")[0], as_torch(result, "sin")[0]
        assert served_as_reference(v2_cos, want_cos[0], server.device), layer_type
        assert served_as_reference(v2_sin, want_sin[0], server.device), layer_type
        torch.manual_seed(0)
        head_dim = entry["spec"]["head_dim"]
        q, k = torch.randn(2, 1, 2, ids.shape[1], head_dim).unbind(0)
        q_model, k_model = module.apply_rotary_pos_emb(q, k, want_cos, want_sin)
        q_mine, k_mine = module.apply_rotary_pos_emb(q, k, cos[None], sin[None])
        assert torch.equal(q_model, q_mine)
        assert torch.equal(k_model, k_mine)


def test_per_layer_type_mrope_notes() -> None:
    """NeoMME's notes name its two axes and the row/column alternation; a Cohere Compass layer
    type with null rope parameters runs without rotation (nope_layers), its flat rope_theta /
    rope_type beside the layer types dropped as its config class drops them."""
    from posenc.api.specs import resolve_config

    neomme = {
        e.name: e.notes
        for e in resolve_config({"hf_config": _per_layer_config(None), "max_positions": 64})
    }
    full = neomme["rope:full_attention"]["mrope"]
    assert full["axes"] == ["row", "column"]
    assert full["layout"] == "row_column"
    assert full["pair_axes"] == [0, 1] * (len(full["pair_axes"]) // 2)
    assert full["v2_parameters"] == {
        "mrope_section": full["mrope_section"],
        "mrope_layout": "row_column",
    }
    assert "position_ids (2, N) = row, column" in full["apply"]
    name = "cohere_compass: NoPE full attention, flat keys beside the layer types"
    (entry,) = resolve_config({"hf_config": _per_layer_config(name), "max_positions": 64})
    assert entry.notes["nope_layers"] == [3]
    assert entry.notes["mrope"]["axes"] == ["temporal", "height", "width"]


@pytest.mark.parametrize("name", CHANNEL_CHUNKS)
def test_channel_chunks_mrope_through_the_api_equals_the_model(
    client: httpx.Client, triton: http.InferenceServerClient, server: ServerHandle, name: str
) -> None:
    """HunYuan-VL (issue 30): the `rope` table of /v1/resolve, fetched from its URL (full width,
    half-split) and gathered per channel by `notes.mrope.channel_axes` over
    `len(mrope_section)` axes, and the /v2 rope model with the spec and
    `notes.mrope.v2_parameters` (mrope_layout channel_chunks), give HunYuanVLRotaryEmbedding's
    cos/sin on position ids whose axes all differ; its apply_rotary_pos_emb rotates q and k
    alike from them. A per-pair gather (the two channels of a pair on one axis) would not."""
    data = json.loads(json.dumps(mrope_sweep.BUILT[name]))
    resolved = client.post("/v1/resolve", json={"hf_config": data, "max_positions": 256})
    assert resolved.status_code == 200, resolved.text
    (entry,) = [e for e in resolved.json()["specs"] if e["name"].startswith("rope")]
    mrope = entry["notes"]["mrope"]
    rotary = _rotary(data)
    axes = mrope_sweep.axis_count(type(rotary), rotary)
    assert axes == len(mrope["axes"]) == len(mrope["mrope_section"]) == len(rotary.mrope_section)
    assert mrope["layout"] == "channel_chunks"
    assert "pair_axes" not in mrope
    assert mrope["v2_parameters"] == {
        "mrope_section": mrope["mrope_section"],
        "mrope_layout": "channel_chunks",
    }
    ids = mrope_sweep.positions(mrope_sweep.N, axes)
    assert all(not torch.equal(ids[a], ids[b]) for a in range(axes) for b in range(a))
    want_cos, want_sin = rotary(torch.zeros(1), ids[:, None, :])
    got = client.get(entry["url"], params={"format": "npz", "device": "cpu"})
    assert got.status_code == 200, got.text
    npz = np.load(io.BytesIO(got.content))
    assert entry["notes"]["pairing"] == "half_split"
    assert npz["cos"].shape[1] == entry["spec"]["rotary_dim"] == len(mrope["channel_axes"])
    cos_t = torch.from_numpy(npz["cos"].copy())
    sin_t = torch.from_numpy(npz["sin"].copy())
    cos = mrope_sweep.gather(cos_t, ids, mrope["channel_axes"])
    sin = mrope_sweep.gather(sin_t, ids, mrope["channel_axes"])
    assert torch.equal(cos, want_cos[0])
    assert torch.equal(sin, want_sin[0])
    # the two channels of some rotate_half pair read different axes: a per-pair map cannot serve
    half = len(mrope["channel_axes"]) // 2
    assert mrope["channel_axes"][:half] != mrope["channel_axes"][half:]
    params = {"spec": json.dumps(entry["spec"]), **{
        k: json.dumps(v) if isinstance(v, list) else v
        for k, v in mrope["v2_parameters"].items()
    }}  # fmt: skip
    result = triton.infer("rope", [make_input("position_ids", ids[:, None, :].numpy())],
                          parameters=params)  # fmt: skip
    assert result.get_response()["parameters"]["posenc_mrope"] == (
        f"channel_chunks {mrope['mrope_section']}"
    )
    v2_cos, v2_sin = as_torch(result, "cos")[0], as_torch(result, "sin")[0]
    assert served_as_reference(v2_cos, want_cos[0], server.device)
    assert served_as_reference(v2_sin, want_sin[0], server.device)
    module = mrope_sweep._module(mrope_sweep._text_config(mrope_sweep.sweep.load_config(data)))
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, 2, ids.shape[1], entry["spec"]["head_dim"]).unbind(0)
    q_model, k_model = module.apply_rotary_pos_emb(q, k, want_cos, want_sin)
    q_mine, k_mine = module.apply_rotary_pos_emb(q, k, cos[None], sin[None])
    assert torch.equal(q_model, q_mine)
    assert torch.equal(k_model, k_mine)


def test_channel_chunks_refusals(client: httpx.Client, triton: http.InferenceServerClient) -> None:
    """HunYuan-VL without a section (its class default: the rotary module takes len(None)) is
    refused naming mrope_section; the /v2 channel_chunks layout refuses a half-width spec."""
    from tritonclient.utils import InferenceServerException

    data = mrope_sweep.case_config("hunyuan_vl_text", "default", "v5")
    refused = client.post("/v1/resolve", json={"hf_config": data, "max_positions": 64})
    assert refused.status_code == 422, refused.text
    assert "mrope_section" in refused.text
    # NTK alpha without head_dim: HunYuanVLRotaryEmbedding reads config.head_dim (None: TypeError)
    built = json.loads(json.dumps(mrope_sweep.BUILT[CHANNEL_CHUNKS[0]]))
    del built["head_dim"], built["attention_head_dim"]
    built["hidden_size"] = 128 * built["num_attention_heads"]  # the section's sum stays d/2
    with pytest.raises(mrope_sweep.sweep.UnbuildableError, match="TypeError"):
        mrope_sweep.reference(built)
    refused = client.post("/v1/resolve", json={"hf_config": built, "max_positions": 64})
    assert refused.status_code == 422, refused.text
    assert "head_dim" in refused.text
    pos = make_input("position_ids", np.zeros((4, 1, 4), np.int64))
    spec = {"head_dim": 64, "max_positions": 32, "mrope_section": "[8, 8, 8, 8]",
            "mrope_layout": "channel_chunks"}  # fmt: skip
    with pytest.raises(InferenceServerException, match="width 'full'"):
        triton.infer("rope", [pos], parameters={**spec, "width": "half"})
    ok = triton.infer("rope", [pos], parameters=spec)
    assert ok.get_response()["parameters"]["posenc_mrope"] == "channel_chunks [8, 8, 8, 8]"
