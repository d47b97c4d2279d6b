"""M-RoPE position ids: transformers' `get_rope_index` of the multimodal models, for one sequence.

A token layout is a list of spans in sequence order: `{"text": n}` (n text tokens), `{"image":
[t, h, w]}` and `{"video": [t, h, w]}` (one image or video by its patch grid, `image_grid_thw` /
`video_grid_thw` rows, before the spatial merge), a video optionally with `second_per_grid_t`
(Qwen2.5-VL's `second_per_grid_ts` entry). `rope_index` returns the (3, N) int64 position ids
(temporal, height, width) and `mrope_position_deltas` (max id + 1 - N: what decoding adds to the
cache length), equal to transformers 5.24 `<Model>Model.get_rope_index(input_ids,
mm_token_type_ids, image_grid_thw, video_grid_thw[, second_per_grid_ts])` of one unpadded row:

- a text span of n tokens: ids `current .. current+n-1` on all three axes; current += n;
- a vision span of grid (t, h, w): `get_vision_position_ids`: its tokens cover the merged grid
  (t // tm, h // s, w // s) in (t, h, w) order with ids temporal `int(k * interval) + current`,
  height `i + current`, width `j + current`; then current += max(h, w) // s.

Rules (`RULES`), by the modeling code of each family (transformers 5.24):
- `qwen2_vl` (Qwen2-VL, PaddleOCR-VL): interval 1, tm 1.
- `qwen2_5_vl` (Qwen2.5-VL): videos use interval `tokens_per_second * second_per_grid_t`
  (float32, as the processor's `second_per_grid_ts` tensor; 1 second when the layout gives
  none), truncated toward zero; images interval 1.
- `qwen3_vl` (Qwen3-VL (+MoE), Qwen3.5 (+MoE), Qwen4-Exp, GLM-4V, GLM-4.1V-MoE, GLM-OCR): a video
  is split into frames (`video_grid_thw` repeated t times with t = 1), each frame its own span
  between the timestamp text the processor writes: the layout gives each frame as a video span
  [1, h, w].
- `ernie4_5_vl` (ERNIE-4.5-VL): videos merge `temporal_merge_size` patches in time (tm).
- `qwen2_5_omni` (Qwen2.5-Omni thinker, `Qwen2_5OmniPreTrainedModelForConditionalGeneration.
  get_rope_index`, audio not interleaved with video): every span starts at the previous span's
  largest id + 1; temporal ids are `int(k * position_id_per_seconds)` for images and
  `int(float32(k * second_per_grid_t) * position_id_per_seconds)` for videos (each video needs its
  `second_per_grid_t`); a vision span needs text on both sides (its start and end tokens). Audio
  tokens are positioned as text: give them as a text span.

transformers groups consecutive tokens of one modality (`itertools.groupby` over
`mm_token_type_ids`), so two vision spans of one modality must have text between them: such a
layout is refused rather than answered with ids transformers would not produce. `spatial_merge_size`
(s), `tokens_per_second` and `temporal_merge_size` come from the config's `vision_config` or the
config class defaults (`RULE_DEFAULTS`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from posenc.encodings.errors import ConfigError, FieldProblem, SpecError
from posenc.encodings.hf_config.mrope import MROPE_MODELS

__all__ = [
    "RULES",
    "RULE_DEFAULTS",
    "MRopeRule",
    "Span",
    "parse_layout",
    "rope_index",
    "rule_for",
    "vision_parameters",
]


@dataclass(frozen=True)
class MRopeRule:
    """One `get_rope_index` family: `video_seconds` (video temporal ids scaled by
    tokens_per_second * second_per_grid_t), `frames` (each video frame its own span),
    `temporal_merge` (videos merge temporal_merge_size patches in time), `omni` (Qwen2.5-Omni:
    vision spans between their start/end tokens, the next span after max id + 1, temporal ids
    in position_id_per_seconds)."""

    name: str
    video_seconds: bool = False
    frames: bool = False
    temporal_merge: bool = False
    omni: bool = False


RULES: dict[str, MRopeRule] = {
    "qwen2_vl": MRopeRule("qwen2_vl"),
    "qwen2_5_vl": MRopeRule("qwen2_5_vl", video_seconds=True),
    "qwen3_vl": MRopeRule("qwen3_vl", frames=True),
    "ernie4_5_vl": MRopeRule("ernie4_5_vl", temporal_merge=True),
    "qwen2_5_omni": MRopeRule("qwen2_5_omni", omni=True),
}
"""Rule name -> rule; `hf_config.mrope.MROPE_MODELS` names the rule of each model type."""

RULE_DEFAULTS: dict[str, dict[str, float]] = {
    # The vision config classes' defaults (transformers 5.24).
    "qwen2_vl": {"spatial_merge_size": 2},
    "qwen2_5_vl": {"spatial_merge_size": 2, "tokens_per_second": 4},
    "qwen3_vl": {"spatial_merge_size": 2},
    "ernie4_5_vl": {"spatial_merge_size": 2, "temporal_merge_size": 2},
    "qwen2_5_omni": {"spatial_merge_size": 2, "position_id_per_seconds": 25},
}

MAX_SECONDS = 86400.0
"""Largest second_per_grid_t and tokens_per_second accepted (a day: ids stay far below 2^53)."""


@dataclass(frozen=True)
class Span:
    """One run of the token layout: `kind` "text" (`length` tokens) or "image"/"video" (`grid`
    (t, h, w) before merging, `seconds` the video's second_per_grid_t or None)."""

    kind: str
    length: int = 0
    grid: tuple[int, int, int] = (0, 0, 0)
    seconds: float | None = None


def _int(where: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SpecError(
            "invalid layout", [FieldProblem(where, f"must be an integer >= {low}", value)]
        )
    return value


def parse_layout(raw: Any) -> list[Span]:
    """The wire layout (a list of `{"text": n}`, `{"image": [t, h, w]}`, `{"video": [t, h, w],
    "second_per_grid_t"?: s}`) as spans; raises `SpecError` naming `layout[i]...`."""
    if not isinstance(raw, list) or not raw:
        raise SpecError(
            "invalid layout", [FieldProblem("layout", "must be a non-empty list of spans", raw)]
        )
    spans = []
    for index, item in enumerate(raw):
        where = f"layout[{index}]"
        kinds = [k for k in ("text", "image", "video") if isinstance(item, dict) and k in item]
        extra = set(item) - {"text", "image", "video", "second_per_grid_t"} if kinds else set()
        if len(kinds) != 1 or extra:
            raise SpecError(
                "invalid layout",
                [
                    FieldProblem(
                        where,
                        'one of {"text": n}, {"image": [t, h, w]}, {"video": [t, h, w], '
                        '"second_per_grid_t"?: s}',
                        item,
                    )
                ],
            )
        kind = kinds[0]
        if kind == "text":
            spans.append(Span("text", length=_int(f"{where}.text", item["text"], 1)))
            continue
        grid = item[kind]
        if not isinstance(grid, list) or len(grid) != 3:
            raise SpecError(
                "invalid layout",
                [FieldProblem(f"{where}.{kind}", "must be a grid [t, h, w] of 3 integers", grid)],
            )
        t, h, w = (_int(f"{where}.{kind}[{i}]", v, 1) for i, v in enumerate(grid))
        seconds = item.get("second_per_grid_t")
        if seconds is not None:
            if kind != "video":
                raise SpecError(
                    "invalid layout",
                    [FieldProblem(f"{where}.second_per_grid_t", "only a video has it", seconds)],
                )
            if (
                isinstance(seconds, bool)
                or not isinstance(seconds, (int, float))
                or not 0 <= seconds <= MAX_SECONDS
            ):
                raise SpecError(
                    "invalid layout",
                    [
                        FieldProblem(
                            f"{where}.second_per_grid_t",
                            f"must be in [0, {MAX_SECONDS:g}]",
                            seconds,
                        )
                    ],
                )
            seconds = float(seconds)
        spans.append(Span(kind, grid=(t, h, w), seconds=seconds))
    return spans


def rule_for(model_type: str, where: str = "model_type") -> MRopeRule:
    """The `get_rope_index` rule of a model type (composite or text type); `ConfigError` naming
    `where` for a model type posenc serves no rule for."""
    facts = MROPE_MODELS.get(model_type)
    if facts is None or facts.rule is None:
        served = sorted(
            t for t, f in MROPE_MODELS.items() if f.rule is not None and not t.endswith("_text")
        )
        why = (
            "its get_rope_index is not served"
            if facts is not None
            else "not an M-RoPE model type posenc knows"
        )
        raise ConfigError(
            "no M-RoPE position rule", [FieldProblem(where, f"{why}; served: {served}", model_type)]
        )
    return RULES[facts.rule]


def _check_number(name: str, value: Any, integer: bool) -> float:
    bad = isinstance(value, bool) or not isinstance(value, int if integer else (int, float))
    if bad or not 0 < value <= MAX_SECONDS:
        kind = "a positive integer" if integer else "a positive number"
        raise SpecError("invalid parameter", [FieldProblem(name, f"must be {kind}", value)])
    return float(value)


def rope_index(
    rule: MRopeRule,
    spans: Sequence[Span],
    *,
    spatial_merge_size: int,
    tokens_per_second: float | None = None,
    temporal_merge_size: int = 1,
    position_id_per_seconds: float | None = None,
    max_tokens: int,
) -> tuple[torch.Tensor, int]:
    """(3, N) int64 position ids and mrope_position_deltas of one sequence (module docstring).

    Args:
        rule: the model family's rule (`RULES`).
        spans: the token layout (`parse_layout`).
        spatial_merge_size: s, the vision config's `spatial_merge_size`.
        tokens_per_second: the vision config's `tokens_per_second` (rule `qwen2_5_vl`).
        temporal_merge_size: the vision config's `temporal_merge_size` (rule `ernie4_5_vl`).
        position_id_per_seconds: the thinker config's `position_id_per_seconds` (rule
            `qwen2_5_omni`).
        max_tokens: N must not exceed it; checked before anything is allocated.

    Raises:
        SpecError: naming the span or parameter that transformers could not apply as given.
    """
    merge = int(_check_number("spatial_merge_size", spatial_merge_size, True))
    tm = int(_check_number("temporal_merge_size", temporal_merge_size, True))
    sizes: list[tuple[int, int, int]] = []
    total = 0
    previous = "text"
    timed = [s.seconds is not None for s in spans if s.kind == "video"]
    for index, span in enumerate(spans):
        where = f"layout[{index}]"
        if span.kind == "text":
            between = 0 < index < len(spans) - 1 and spans[index + 1].kind != "text"
            if rule.omni and between and previous != "text" and span.length < 2:
                raise SpecError(
                    "invalid layout",
                    [
                        FieldProblem(
                            f"{where}.text",
                            f"rule {rule.name!r}: text between two vision spans holds the end "
                            "token of one and the start token of the next: at least 2",
                            span.length,
                        )
                    ],
                )
            total += span.length
            previous = "text"
            sizes.append((span.length, 0, 0))
            continue
        if span.kind == previous:
            raise SpecError(
                "invalid layout",
                [
                    FieldProblem(
                        where,
                        f"follows another {span.kind} directly: transformers groups adjacent "
                        f"{span.kind} tokens into one span; put the text between them "
                        "(vision start/end tokens) in the layout",
                        None,
                    )
                ],
            )
        previous = span.kind
        t, h, w = span.grid
        if rule.omni and not (0 < index < len(spans) - 1 and spans[index + 1].kind == "text"):
            raise SpecError(
                "invalid layout",
                [
                    FieldProblem(
                        where,
                        f"rule {rule.name!r} needs text before and after every {span.kind} "
                        "(its start and end tokens are text positions)",
                        None,
                    )
                ],
            )
        if rule.omni and span.kind == "video" and span.seconds is None:
            raise SpecError(
                "invalid layout",
                [
                    FieldProblem(
                        f"{where}.second_per_grid_t",
                        f"rule {rule.name!r} needs it for every video (second_per_grids)",
                        None,
                    )
                ],
            )
        uses_seconds = rule.video_seconds or rule.omni
        if span.kind == "video" and span.seconds is not None and not uses_seconds:
            raise SpecError(
                "invalid layout",
                [
                    FieldProblem(
                        f"{where}.second_per_grid_t",
                        f"rule {rule.name!r} does not use it (qwen2_5_vl and qwen2_5_omni do)",
                        span.seconds,
                    )
                ],
            )
        if span.kind == "video" and rule.video_seconds and any(timed) and span.seconds is None:
            raise SpecError(
                "invalid layout",
                [
                    FieldProblem(
                        f"{where}.second_per_grid_t",
                        "give it for every video or for none (second_per_grid_ts is one list)",
                        span.seconds,
                    )
                ],
            )
        if span.kind == "video" and rule.frames and t != 1:
            raise SpecError(
                "invalid layout",
                [
                    FieldProblem(
                        f"{where}.video[0]",
                        f"rule {rule.name!r} positions each video frame as its own span: give "
                        "the video as t spans [1, h, w] with the processor's timestamp text "
                        "between them",
                        t,
                    )
                ],
            )
        temporal = tm if (span.kind == "video" and rule.temporal_merge) else 1
        grid = (t // temporal, h // merge, w // merge)
        count = grid[0] * grid[1] * grid[2]
        if count == 0:
            raise SpecError(
                "invalid layout",
                [
                    FieldProblem(
                        f"{where}.{span.kind}",
                        f"merges to no token: (t // {temporal}, h // {merge}, w // {merge}) = "
                        f"{grid}",
                        list(span.grid),
                    )
                ],
            )
        total += count
        sizes.append(grid)
        if total > max_tokens:
            break
    if total > max_tokens:
        raise SpecError(
            "layout too long",
            [
                FieldProblem(
                    "layout", f"has more than {max_tokens} tokens (the server's limit)", total
                )
            ],
        )
    if rule.video_seconds and any(s.kind == "video" for s in spans):
        _check_number("tokens_per_second", tokens_per_second, False)
    if rule.omni and any(s.kind != "text" for s in spans):
        _check_number("position_id_per_seconds", position_id_per_seconds, False)
    columns: list[torch.Tensor] = []
    current = 0
    for span, grid in zip(spans, sizes, strict=True):
        if span.kind == "text":
            columns.append((torch.arange(span.length) + current).view(1, -1).expand(3, -1))
            current += span.length
            continue
        steps = torch.arange(grid[0])
        if span.kind == "video" and rule.video_seconds:
            assert tokens_per_second is not None
            # transformers: tokens_per_second * second_per_grid_ts[i] (a float32 tensor from the
            # processor), else * 1; arange * that, truncated by .long().
            interval: Any = (
                tokens_per_second * torch.tensor(span.seconds, dtype=torch.float32)
                if span.seconds is not None
                else tokens_per_second
            )
            steps = (steps * interval).long()
        elif rule.omni:
            # transformers: (arange(t) * 1 * position_id_per_seconds).long() for an image,
            # (arange(t) * second_per_grids[i].float() * position_id_per_seconds).long() for a
            # video: two float32 products, each rounded.
            seconds: Any = (
                1 if span.kind == "image" else torch.tensor(span.seconds, dtype=torch.float32)
            )
            steps = (steps * seconds * position_id_per_seconds).long()
        height = torch.arange(grid[1]) + current
        width = torch.arange(grid[2]) + current
        t_ids, h_ids, w_ids = torch.meshgrid(steps, height, width, indexing="ij")
        block = torch.stack([t_ids, h_ids, w_ids]).reshape(3, -1)
        block[0] += current
        columns.append(block)
        if rule.omni:
            current = int(block.max()) + 1
        else:
            current += max(span.grid[1], span.grid[2]) // merge
    ids = torch.cat(columns, dim=1).to(torch.int64)
    delta = int(ids.max()) + 1 - ids.shape[1]
    return ids, delta


def vision_parameters(rule: MRopeRule, config: Mapping[str, Any] | None) -> dict[str, Any]:
    """spatial_merge_size, tokens_per_second, temporal_merge_size: the config's `vision_config`
    values (position_id_per_seconds: the Omni thinker config's), else the rule's class defaults
    (`RULE_DEFAULTS`)."""
    values: dict[str, Any] = dict(RULE_DEFAULTS[rule.name])
    config = config or {}
    thinker = config.get("thinker_config")
    if isinstance(thinker, Mapping):
        config = thinker
    if config.get("position_id_per_seconds") is not None and rule.omni:
        values["position_id_per_seconds"] = config["position_id_per_seconds"]
    vision = config.get("vision_config")
    if isinstance(vision, Mapping):
        for name in ("spatial_merge_size", "tokens_per_second", "temporal_merge_size"):
            if vision.get(name) is not None:
                values[name] = vision[name]
    return values
