"""Vision towers' rotary tables through the real server: `/v1/resolve` entries beside the text
tables, `/v1/tables`, `/v2` (tritonclient) and ONNX (onnxruntime), each compared bit for bit with
the tower's own module in the installed transformers (tables and q.k after its apply function)."""

from __future__ import annotations

import copy
import logging
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import tritonclient.http as http
from transformers import AutoConfig

from posenc.encodings import parse_spec
from posenc.encodings.hf_config.vision_rope import ROTARY_CLASSES, TOWERS, VISION_ONLY
from tests.api.v2client import as_torch, make_input, spec_param, url
from tests.api.wire import decode
from tests.conftest import ServerHandle
from tests.encodings import vision_reference as ref
from tests.tolerances import served_as_reference

CLASSES = ref.rotary_classes()
DEFAULT_TYPES = (
    "pixtral",
    "mistral3",
    "llama4",
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    "glm4v",
    "ernie4_5_vl_moe",
    "qwen2_5_omni",
    "dinov3_vit",
    "eomt_dinov3",
    "llama4_vision_model",
    "gemma4_vision",
)
"""Default configs: resolved whole, or (GLM-4V, whose class-default M-RoPE sections transformers
cannot apply) the tower served and the text side listed in `unserved`."""
TOWER_TYPES = sorted({CLASSES[name] for name in CLASSES if name in ROTARY_CLASSES})
"""The model type of every served vision rotary module (its modeling directory), derived from the
installed package: resolved with kind=vision_rope (their text side may be refused or M-RoPE)."""

RELEASED: dict[str, dict[str, Any]] = {
    # the vision_config keys of released checkpoints' config.json (the rotary facts)
    "mistral-community/pixtral-12b": {
        "model_type": "llava",
        "vision_config": {"model_type": "pixtral", "head_dim": 64, "hidden_size": 1024,
                          "num_attention_heads": 16, "image_size": 1024, "patch_size": 16,
                          "rope_theta": 10000.0},
    },
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503": {
        "model_type": "mistral3",
        "vision_config": {"model_type": "pixtral", "head_dim": 64, "hidden_size": 1024,
                          "num_attention_heads": 16, "image_size": 1540, "patch_size": 14,
                          "rope_theta": 10000.0},
    },
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": {
        "model_type": "llama4",
        "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 1408,
                          "num_attention_heads": 16, "image_size": 336, "patch_size": 14,
                          "rope_theta": 10000},
    },
    "Qwen/Qwen2-VL-7B-Instruct": {
        "model_type": "qwen2_vl",
        "vision_config": {"depth": 32, "embed_dim": 1280, "hidden_size": 3584, "num_heads": 16,
                          "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
    },
    "Qwen/Qwen2.5-VL-7B-Instruct": {
        "model_type": "qwen2_5_vl",
        "vision_config": {"hidden_size": 1280, "num_heads": 16, "patch_size": 14,
                          "spatial_merge_size": 2, "window_size": 112, "temporal_patch_size": 2,
                          "fullatt_block_indexes": [7, 15, 23, 31]},
    },
    "Qwen/Qwen3-VL-8B-Instruct": {
        "model_type": "qwen3_vl",
        "vision_config": {"model_type": "qwen3_vl", "hidden_size": 1152, "num_heads": 16,
                          "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                          "num_position_embeddings": 2304},
    },
    "zai-org/GLM-4.1V-9B-Thinking": {
        "model_type": "glm4v",
        "vision_config": {"hidden_size": 1536, "num_heads": 12, "image_size": 336,
                          "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
    },
    "facebook/dinov3-vits16-pretrain-lvd1689m": {
        "model_type": "dinov3_vit", "hidden_size": 384, "num_attention_heads": 6,
        "patch_size": 16, "image_size": 224, "rope_theta": 100.0, "num_register_tokens": 4,
    },
}  # fmt: skip


def _default(model_type: str) -> dict[str, Any]:
    logging.disable(logging.WARNING)  # Qwen2.5-Omni's default token ids outside its vocabulary
    try:
        config: dict[str, Any] = AutoConfig.for_model(model_type).to_dict()
    finally:
        logging.disable(logging.NOTSET)
    return config


def _vision_config(config: dict[str, Any]) -> Any:
    """transformers' vision config object of a config.json (class defaults filled)."""
    model_type = config["model_type"]
    if model_type == "llava":  # Llava-Pixtral: the vision config is Pixtral's
        from transformers.models.pixtral.configuration_pixtral import PixtralVisionConfig

        return PixtralVisionConfig(**config["vision_config"])
    full = type(AutoConfig.for_model(model_type)).from_dict(copy.deepcopy(config))
    if hasattr(full, "thinker_config"):
        full = full.thinker_config
    return getattr(full, "vision_config", full)


def _rotary_class(vision_config: Any) -> str:
    model_dir = type(vision_config).__module__.split(".")[2]
    (name,) = [n for n, d in CLASSES.items() if d == model_dir and n in ROTARY_CLASSES]
    return name


def _check_exact(
    config: dict[str, Any],
    entry: dict[str, Any],
    got: dict[str, Any],
    device: torch.device,
) -> None:
    """The served cos/sin equal the tower's and rotate q, k to the tower's q.k: bit for bit from
    a CPU server (`device`: the server's), within `tolerances.GPU_ULPS` from a GPU server."""
    vision = _vision_config(config)
    name = _rotary_class(vision)
    spec = parse_spec(entry["spec"]).canonical()
    cos, sin = ref.tower_tables(name, CLASSES[name], vision, spec)
    assert got["cos"].dtype == cos.dtype
    assert got["cos"].shape == cos.shape
    assert served_as_reference(got["cos"], cos, device)
    assert served_as_reference(got["sin"], sin, device)
    gen = torch.Generator().manual_seed(1)
    # q.k over at most 512 rows (the apply functions work row by row): Mistral 3's 12100 rows
    # would make a 12100 x 12100 score matrix per head
    rows = torch.randperm(cos.shape[0], generator=gen)[:512].sort().values
    cos, sin, mine_cos, mine_sin = cos[rows], sin[rows], got["cos"][rows], got["sin"][rows]
    q = torch.randn(len(rows), 2, spec.head_dim, generator=gen)
    k = torch.randn(len(rows), 2, spec.head_dim, generator=gen)
    model_dir, style = CLASSES[name], spec.style
    theirs = ref.applied(name, model_dir, style, q, k, cos, sin)
    ours = ref.applied(name, model_dir, style, q, k, mine_cos, mine_sin)
    if device.type == "cpu":
        assert torch.equal(ref.scores(*theirs), ref.scores(*ours))
    else:  # tables within GPU_ULPS: the scores within the same relative error
        assert torch.allclose(ref.scores(*theirs), ref.scores(*ours), rtol=1e-5, atol=1e-5)


def _vision_entry(specs: list[dict[str, Any]]) -> dict[str, Any]:
    (entry,) = [s for s in specs if s["name"] == "vision_rope:vision"]
    notes = entry["notes"]
    assert {"transformers", "pairing", "patch_order"} <= set(notes)
    return entry


def _body(config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"hf_config": config, **extra}
    if _vision_config(config).__dict__.get("spatial_merge_size"):
        body |= {"grid_height": 8, "grid_width": 12}  # tiny: a request for one image's grid
    return body


@pytest.mark.parametrize("model_type", DEFAULT_TYPES)
def test_resolve_default_configs_return_text_and_vision_tables(
    server: ServerHandle, client: httpx.Client, model_type: str
) -> None:
    config = _default(model_type)
    r = client.post("/v1/resolve", json=_body(config))
    assert r.status_code == 200, r.text
    specs = r.json()["specs"]
    entry = _vision_entry(specs)
    if model_type in VISION_ONLY:
        assert [s["name"] for s in specs] == ["vision_rope:vision"]
    elif model_type == "glm4v":
        assert [s["name"] for s in specs] == ["vision_rope:vision"]
        (text,) = r.json()["unserved"]
        assert text["part"] == "text_config"
        assert text["config_key"] == "text_config.rope_parameters.mrope_section"
    else:
        # the text tables (rope, or M-RoPE entries) come first, the tower's last
        assert len(specs) > 1
        assert specs[-1]["name"] == "vision_rope:vision"
    if model_type == "qwen2_5_vl":
        assert "get_vision_window_index" in entry["notes"]["window"]
    if model_type == "llama4":
        assert "last row" in entry["notes"]["class_token"]
    got = decode(client.get(entry["url"]))
    _check_exact(config, entry, got, server.device)


def test_every_served_module_is_reachable_from_a_config() -> None:
    assert set(TOWER_TYPES) <= set(TOWERS)


@pytest.mark.parametrize("model_type", sorted(set(TOWER_TYPES) | set(TOWERS)))
def test_every_served_tower_resolves_to_its_table(
    server: ServerHandle, client: httpx.Client, model_type: str
) -> None:
    config = _default(model_type)
    path, _ = TOWERS[model_type]
    if path == ("vision_config",) and config.get("vision_config") is None:
        # a text-only default (Gemma 4): give it its tower's default config
        (name,) = [n for n, d in CLASSES.items() if d == model_type and n in ROTARY_CLASSES]
        config["vision_config"] = ref.config_class(ref.load(name, model_type)[0])().to_dict()
    r = client.post("/v1/resolve", json=_body(config, kind="vision_rope"))
    assert r.status_code == 200, r.text
    entry = _vision_entry(r.json()["specs"])
    name = _rotary_class(_vision_config(config))
    if ref.uses_window(ref.load(name, CLASSES[name])[1]):
        assert "window" in entry["notes"]
        assert entry["spec"]["window_size"]
    else:
        assert "window" not in entry["notes"]
    _check_exact(config, entry, decode(client.get(entry["url"])), server.device)


def test_refused_tower_is_noted_beside_the_text_tables(client: httpx.Client) -> None:
    config = _default("kimi_k25")
    r = client.post("/v1/resolve", json=config)
    assert r.status_code == 200, r.text
    specs = r.json()["specs"]
    assert specs
    assert all("Kimi_K25VisionRotaryEmbedding" in s["notes"]["not_served"] for s in specs)
    r = client.post("/v1/resolve", json={"hf_config": config, "kind": "vision_rope"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "model_type"


@pytest.mark.parametrize("repo", sorted(RELEASED))
def test_resolve_released_configs_serve_the_towers_table(
    server: ServerHandle, client: httpx.Client, repo: str
) -> None:
    config = RELEASED[repo]
    body: dict[str, Any] = {"hf_config": config, "kind": "vision_rope"}
    if config["model_type"].startswith("qwen"):
        body |= {"grid_height": 10, "grid_width": 14, "frames": 2}
    r = client.post("/v1/resolve", json=body)
    assert r.status_code == 200, r.text
    entry = _vision_entry(r.json()["specs"])
    got = decode(client.get(entry["url"]))
    _check_exact(config, entry, got, server.device)


def test_resolve_refusals_name_the_key(client: httpx.Client) -> None:
    config = _default("llama4")
    config["vision_config"]["image_size"] = [448, 336]
    r = client.post("/v1/resolve", json={"hf_config": config, "kind": "vision_rope"})
    assert r.status_code == 422, r.text
    body = r.json()
    assert set(body) >= {"error", "error_type", "detail"}
    assert body["detail"][0]["field"] == "vision_config.image_size"
    r = client.post("/v1/resolve", json={"hf_config": _default("qwen2_vl"), "grid_height": 7})
    assert r.status_code == 422
    assert "spatial_merge_size" in r.text


def test_tables_route_serves_the_towers_table(client: httpx.Client) -> None:
    spec = {"kind": "vision_rope", "style": "llama4", "head_dim": 16, "grid_height": 4,
            "grid_width": 4, "width": "full", "dtype": "bfloat16"}  # fmt: skip
    r = client.post("/v1/tables", json=spec)
    assert r.status_code == 200, r.text
    got = decode(r)
    assert got["cos"].shape == (17, 16)
    assert got["cos"].dtype == torch.bfloat16
    from transformers.models.llama4.configuration_llama4 import Llama4VisionConfig
    from transformers.models.llama4.modeling_llama4 import Llama4VisionRotaryEmbedding

    config = Llama4VisionConfig(hidden_size=32, num_attention_heads=2, image_size=56, patch_size=14)
    freqs = Llama4VisionRotaryEmbedding(config).freqs_ci[:, 0]
    assert torch.equal(got["cos"], freqs.real.repeat_interleave(2, -1).to(torch.bfloat16))
    bad = client.post("/v1/tables", json={**spec, "grid_width": 5})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["field"] == "grid_width"


def test_v2_infer_takes_the_grid(server: ServerHandle) -> None:
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig

    triton = http.InferenceServerClient(url(server))
    vision = Qwen2_5_VLVisionConfig(hidden_size=64, num_heads=4)
    spec = {"kind": "vision_rope", "style": "qwen2_vl", "head_dim": 16, "grid_height": 2,
            "grid_width": 2, "window_size": 112, "patch_size": 14}  # fmt: skip
    grid = np.array([2, 12, 20], np.int64)
    result = triton.infer("vision_rope", [make_input("grid", grid)], parameters=spec_param(spec))
    got = {n: as_torch(result, n) for n in ("cos", "sin")}
    canon = parse_spec({**spec, "frames": 2, "grid_height": 12, "grid_width": 20}).canonical()
    name = "Qwen2_5_VLVisionRotaryEmbedding"
    cos, sin = ref.tower_tables(name, CLASSES[name], vision, canon)
    assert served_as_reference(got["cos"], cos, server.device)
    assert served_as_reference(got["sin"], sin, server.device)
    with pytest.raises(http.InferenceServerException) as err:
        triton.infer("vision_rope", [make_input("grid", np.array([1, 2, 3, 4], np.int64))],
                     parameters=spec_param(spec))  # fmt: skip
    assert "grid" in str(err.value)


def test_onnx_subgraph_gathers_the_towers_rows(client: httpx.Client) -> None:
    from transformers.models.dinov3_vit.configuration_dinov3_vit import DINOv3ViTConfig

    config = DINOv3ViTConfig(hidden_size=64, num_attention_heads=2, image_size=80, patch_size=16)
    body = {"hf_config": config.to_dict(), "kind": "vision_rope", "graph": "cos_sin"}
    r = client.post("/v1/onnx", json=body)
    assert r.status_code == 200, r.text
    model = onnx.load_from_string(r.content)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.arange(25, dtype=np.int64)[::-1].copy()
    cos, sin = session.run(["cos", "sin"], {"patch_ids": ids})
    fields = {"style": "dinov3", "head_dim": 32, "grid_height": 5, "grid_width": 5}
    spec = parse_spec({"kind": "vision_rope", **fields, "rope_theta": 100.0}).canonical()
    name = "DINOv3ViTRopePositionEmbedding"
    want_cos, want_sin = ref.tower_tables(name, CLASSES[name], config, spec)
    assert torch.equal(torch.from_numpy(cos), want_cos[torch.from_numpy(ids)])
    assert torch.equal(torch.from_numpy(sin), want_sin[torch.from_numpy(ids)])
    with pytest.raises(Exception, match="patch_ids must lie in"):
        session.run(["cos"], {"patch_ids": np.array([25], np.int64)})
