"""`mrope_index.rope_index` equals transformers' `get_rope_index` of every M-RoPE model posenc
serves a rule for (issue 18): the real method of the model class (`<Model>Model.get_rope_index`)
on an instance carrying only the config (no weights: the method reads `self.config` and
`self.get_vision_position_ids`), over text-only, one-image, several-image and image+video layouts.
"""

from __future__ import annotations

import importlib
import json
import warnings
from typing import Any

import pytest
import torch

from posenc.encodings import ConfigError, SpecError
from posenc.encodings.hf_config.mrope import MROPE_MODELS
from posenc.encodings.mrope_index import (
    RULES,
    parse_layout,
    rope_index,
    rule_for,
    vision_parameters,
)

SERVED = sorted(
    t
    for t, facts in MROPE_MODELS.items()
    if facts.rule is not None and not t.endswith("_text") and not RULES[facts.rule].omni
)
"""Composite model types (config with a vision_config) whose get_rope_index posenc serves with
the transformers 5.24 signature (mm_token_type_ids); Qwen2.5-Omni has its own test below."""


def _video(rule: str, t: int, h: int, w: int, seconds: float | None = None) -> list[dict[str, Any]]:
    """A video as the layout gives it: one span, or (frames rules) t frame spans with timestamp
    text between."""
    if RULES[rule].frames:
        frames: list[dict[str, Any]] = []
        for k in range(t):
            frames += [{"text": 2}] if k else []
            frames.append({"video": [1, h, w]})
        return frames
    span: dict[str, Any] = {"video": [t, h, w]}
    if seconds is not None:
        span["second_per_grid_t"] = seconds
    return [span]


def layouts(rule: str) -> dict[str, list[dict[str, Any]]]:
    return {
        "text": [{"text": 7}],
        "image": [{"text": 3}, {"image": [1, 4, 6]}, {"text": 5}],
        "images": [
            {"text": 2},
            {"image": [1, 4, 4]},
            {"text": 1},
            {"image": [1, 6, 2]},
            {"text": 3},
            {"image": [1, 8, 10]},
            {"text": 1},
        ],
        "image_video": [
            {"text": 2},
            {"image": [1, 4, 4]},
            {"text": 2},
            *_video(rule, 4, 4, 6, 0.5),
            {"text": 3},
            *_video(rule, 2, 6, 4, 2.0),
            {"text": 1},
        ],
        "video_first": [*_video(rule, 2, 2, 2, 1.0 / 3.0), {"text": 4}],
    }


def _config(model_type: str, tokens_per_second: int | None = None) -> Any:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = CONFIG_MAPPING[model_type]()
    if tokens_per_second is not None:
        config.vision_config.tokens_per_second = tokens_per_second
    return config


def transformers_index(
    model_type: str, config: Any, layout: list[dict[str, Any]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """get_rope_index of the model class whose config this is, for the layout as transformers'
    inputs (mm_token_type_ids, image/video_grid_thw, second_per_grid_ts)."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    name = model_type_to_module_name(model_type)
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    (cls,) = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and "get_rope_index" in obj.__dict__
        and getattr(obj, "config_class", None) is type(config)
    ]
    model = cls.__new__(cls)
    torch.nn.Module.__init__(model)
    model.config = config
    spatial = config.vision_config.spatial_merge_size
    temporal = getattr(config.vision_config, "temporal_merge_size", 1)
    types, images, videos, seconds = [], [], [], []
    frames = rule_for(model_type).frames
    for span in layout:
        if "text" in span:
            types += [0] * span["text"]
            continue
        kind = "image" if "image" in span else "video"
        t, h, w = span[kind]
        merge_t = temporal if kind == "video" and model_type.startswith("ernie") else 1
        types += [1 if kind == "image" else 2] * ((t // merge_t) * (h // spatial) * (w // spatial))
        if kind == "image":
            images.append([t, h, w])
        elif frames and videos and videos[-1][1:] == [h, w] and types[-1] == 2:
            videos[-1][0] += 1  # consecutive frames of one video: one video_grid_thw row
        else:
            videos.append([t, h, w])
        if "second_per_grid_t" in span:
            seconds.append(span["second_per_grid_t"])
    ids = torch.zeros(1, len(types), dtype=torch.long)
    kwargs: dict[str, Any] = {
        "mm_token_type_ids": torch.tensor([types], dtype=torch.int32),
        "image_grid_thw": torch.tensor(images) if images else None,
        "video_grid_thw": torch.tensor(videos) if videos else None,
    }
    if seconds:
        kwargs["second_per_grid_ts"] = torch.tensor(seconds, dtype=torch.float32)
    with torch.no_grad():
        position_ids, deltas = model.get_rope_index(ids, **kwargs)
    return position_ids[:, 0], deltas


@pytest.mark.parametrize("model_type", SERVED)
def test_rope_index_equals_get_rope_index(model_type: str) -> None:
    rule = rule_for(model_type)
    config = _config(model_type)
    params = vision_parameters(rule, json.loads(config.to_json_string()))
    for name, layout in layouts(rule.name).items():
        if not rule.video_seconds:
            layout = [{k: v for k, v in s.items() if k != "second_per_grid_t"} for s in layout]
        want, want_delta = transformers_index(model_type, config, layout)
        got, delta = rope_index(rule, parse_layout(layout), **params, max_tokens=10_000)
        assert torch.equal(got, want), (name, got, want)
        assert delta == int(want_delta), name


@pytest.mark.parametrize("seconds", [0.5, 1.0 / 3.0, 2.0, 0.7, None])
@pytest.mark.parametrize("tokens_per_second", [2, 4, 25])
def test_qwen2_5_vl_temporal_scaling(tokens_per_second: int, seconds: float | None) -> None:
    """Qwen2.5-VL videos: temporal ids int(k * tokens_per_second * second_per_grid_t) in float32,
    as transformers with the processor's second_per_grid_ts tensor."""
    config = _config("qwen2_5_vl", tokens_per_second)
    video: dict[str, Any] = {"video": [6, 4, 4]}
    if seconds is not None:
        video["second_per_grid_t"] = seconds
    layout = [{"text": 2}, video, {"text": 1}, {"image": [1, 2, 4]}, {"text": 2}]
    want, want_delta = transformers_index("qwen2_5_vl", config, layout)
    params = vision_parameters(RULES["qwen2_5_vl"], json.loads(config.to_json_string()))
    got, delta = rope_index(RULES["qwen2_5_vl"], parse_layout(layout), **params, max_tokens=999)
    assert torch.equal(got, want)
    assert delta == int(want_delta)


BAD: list[tuple[str, list[Any], str]] = [
    ("qwen2_vl", [], "layout"),
    ("qwen2_vl", [{"text": 0}], "layout[0].text"),
    ("qwen2_vl", [{"text": 1, "image": [1, 2, 2]}], "layout[0]"),
    ("qwen2_vl", [{"image": [1, 2]}], "layout[0].image"),
    ("qwen2_vl", [{"image": [1, 2, -2]}], "layout[0].image[2]"),
    ("qwen2_vl", [{"image": [1, 1, 1]}], "layout[0].image"),
    ("qwen2_vl", [{"image": [1, 2, 2]}, {"image": [1, 2, 2]}], "layout[1]"),
    ("qwen2_vl", [{"video": [1, 2, 2], "second_per_grid_t": 1.0}], "layout[0].second_per_grid_t"),
    ("qwen2_vl", [{"image": [1, 2, 2], "second_per_grid_t": 1.0}], "layout[0].second_per_grid_t"),
    ("qwen3_vl", [{"video": [2, 2, 2]}], "layout[0].video[0]"),
    (
        "qwen2_5_vl",
        [{"video": [1, 2, 2], "second_per_grid_t": 1.0}, {"text": 1}, {"video": [1, 2, 2]}],
        "layout[2].second_per_grid_t",
    ),
    ("qwen2_vl", [{"text": 5000}, {"image": [1, 200, 200]}], "layout"),
]


@pytest.mark.parametrize(("model_type", "layout", "field"), BAD)
def test_bad_layouts_name_the_field(model_type: str, layout: list[Any], field: str) -> None:
    rule = rule_for(model_type)
    with pytest.raises(SpecError) as err:
        rope_index(rule, parse_layout(layout), **vision_parameters(rule, None), max_tokens=10_000)
    assert err.value.problems[0].field == field


def test_unserved_model_types_are_refused() -> None:
    for model_type in ("llama", "qwen2_5_omni_talker", "hy_v4_vl"):
        with pytest.raises(ConfigError) as err:
            rule_for(model_type)
        assert err.value.problems[0].field == "model_type"


def omni_index(config: Any, layout: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2.5-Omni's get_rope_index (`Qwen2_5OmniThinkerForConditionalGeneration`, the thinker
    config) on input_ids spelled from the layout: text spans end with vision_start before a
    vision span and start with vision_end after one; image and video tokens; second_per_grids."""
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as omni

    thinker = config.thinker_config
    # Released thinker configs carry the vision start/end ids (Qwen/Qwen2.5-Omni-7B config.json);
    # the 5.24 thinker class has no default for them, and its get_rope_index reads the start id.
    thinker.vision_start_token_id = 151652
    thinker.vision_end_token_id = 151653
    cls = omni.Qwen2_5OmniThinkerForConditionalGeneration
    model = cls.__new__(cls)
    torch.nn.Module.__init__(model)
    model.config = thinker
    model.spatial_merge_size = thinker.vision_config.spatial_merge_size
    merge = model.spatial_merge_size
    tokens: list[int] = []
    images, videos, seconds = [], [], []
    for index, span in enumerate(layout):
        if "text" in span:
            ids = [100] * span["text"]
            if index + 1 < len(layout) and "text" not in layout[index + 1]:
                ids[-1] = thinker.vision_start_token_id
            if index > 0 and "text" not in layout[index - 1]:
                ids[0] = thinker.vision_end_token_id
            tokens += ids
            continue
        kind = "image" if "image" in span else "video"
        t, h, w = span[kind]
        token = thinker.image_token_id if kind == "image" else thinker.video_token_id
        tokens += [token] * (t * (h // merge) * (w // merge))
        (images if kind == "image" else videos).append([t, h, w])
        if kind == "video":
            seconds.append(span["second_per_grid_t"])
    ids = torch.tensor([tokens])
    with torch.no_grad():
        position_ids, deltas = model.get_rope_index(
            ids,
            torch.tensor(images) if images else None,
            torch.tensor(videos) if videos else None,
            torch.ones_like(ids),
            False,
            None,
            torch.tensor(seconds, dtype=torch.float32) if seconds else None,
        )
    return position_ids[:, 0], deltas


OMNI_LAYOUTS = {
    "text": [{"text": 7}],
    "image": [{"text": 3}, {"image": [1, 4, 6]}, {"text": 5}],
    "images": [{"text": 2}, {"image": [1, 4, 4]}, {"text": 2}, {"image": [1, 6, 2]}, {"text": 1}],
    "image_video": [
        {"text": 2},
        {"image": [1, 4, 4]},
        {"text": 3},
        {"video": [4, 4, 6], "second_per_grid_t": 0.7},
        {"text": 3},
        {"video": [3, 6, 4], "second_per_grid_t": 1.0 / 3.0},
        {"text": 2},
    ],
    "video": [{"text": 1}, {"video": [6, 2, 2], "second_per_grid_t": 2.0}, {"text": 1}],
}


@pytest.mark.parametrize("name", sorted(OMNI_LAYOUTS))
def test_qwen2_5_omni_equals_get_rope_index(name: str) -> None:
    """The Qwen2.5-Omni thinker's rule (audio not interleaved with video), from the config."""
    config = _config("qwen2_5_omni")
    layout = OMNI_LAYOUTS[name]
    rule = rule_for("qwen2_5_omni")
    params = vision_parameters(rule, json.loads(config.to_json_string()))
    assert params == {"spatial_merge_size": 2, "position_id_per_seconds": 25}
    want, want_delta = omni_index(config, layout)
    got, delta = rope_index(rule, parse_layout(layout), **params, max_tokens=10_000)
    assert torch.equal(got, want), (got, want)
    assert delta == int(want_delta)


@pytest.mark.parametrize(
    ("layout", "field"),
    [
        ([{"image": [1, 2, 2]}, {"text": 2}], "layout[0]"),
        ([{"text": 2}, {"image": [1, 2, 2]}], "layout[1]"),
        ([{"text": 1}, {"video": [1, 2, 2]}, {"text": 1}], "layout[1].second_per_grid_t"),
        (
            [{"text": 1}, {"image": [1, 2, 2]}, {"text": 1}, {"image": [1, 2, 2]}, {"text": 1}],
            "layout[2].text",
        ),
    ],
)
def test_qwen2_5_omni_layouts_transformers_cannot_take(layout: list[Any], field: str) -> None:
    rule = rule_for("qwen2_5_omni")
    with pytest.raises(SpecError) as err:
        rope_index(rule, parse_layout(layout), **vision_parameters(rule, None), max_tokens=999)
    assert err.value.problems[0].field == field
