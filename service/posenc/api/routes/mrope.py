"""`POST /v1/mrope/position_ids`: a token layout -> the (3, N) M-RoPE position ids of a model.

The body names the model (`model_type`, or its config.json as `hf_config`, whose `vision_config`
gives spatial_merge_size, tokens_per_second and temporal_merge_size; an Omni thinker's
position_id_per_seconds) and the `layout` (spans of text tokens, image and video grids); those
parameters in the body override the config's. The answer is transformers' `get_rope_index` of that
model for one unpadded sequence (`posenc.encodings.mrope_index`): `position_ids` [3][N] and
`mrope_position_deltas`. N is capped at `json_max_elements` / 3 before anything is allocated.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from posenc.api.deps import State
from posenc.api.error_types import BODY, SPEC, TOO_LARGE_FOR_JSON, responses
from posenc.api.jsonio import json_object_body, json_response, read_json_object
from posenc.api.specs import guarded
from posenc.encodings import ConfigError, FieldProblem, SpecError
from posenc.encodings.mrope_index import parse_layout, rope_index, rule_for, vision_parameters

router = APIRouter(prefix="/v1", tags=["catalog"])

PARAMETERS = (
    "spatial_merge_size",
    "tokens_per_second",
    "temporal_merge_size",
    "position_id_per_seconds",
)
FIELDS = frozenset({"model_type", "hf_config", "layout", *PARAMETERS})


def _model(body: dict[str, Any]) -> tuple[str, dict[str, Any] | None, str]:
    """(model_type, config or None, the field that named it)."""
    config, model_type = body.get("hf_config"), body.get("model_type")
    if (config is None) == (model_type is None):
        raise SpecError(
            "name the model",
            [FieldProblem("model_type", "give model_type or hf_config (one of them)", None)],
        )
    if config is not None:
        if not isinstance(config, dict):
            raise ConfigError(
                "hf_config must be a JSON object (the model's config.json)",
                [FieldProblem("hf_config", "expected an object", type(config).__name__)],
            )
        model_type = config.get("model_type")
        where = "hf_config.model_type"
    else:
        where = "model_type"
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError("no model_type", [FieldProblem(where, "must be a string", model_type)])
    return model_type, config, where


@router.post(
    "/mrope/position_ids",
    summary="A token layout (text, image and video grids) -> M-RoPE position ids (get_rope_index)",
    responses=responses(BODY, SPEC, TOO_LARGE_FOR_JSON),
    openapi_extra={
        "requestBody": json_object_body(
            '{"model_type" | "hf_config", "layout": [{"text": n} | '
            '{"image": [t, h, w]} | {"video": [t, h, w], "second_per_grid_t"?}], '
            '"spatial_merge_size"?, "tokens_per_second"?, "temporal_merge_size"?, '
            '"position_id_per_seconds"?}'
        )
    },
)
async def position_ids(request: Request, state: State) -> Response:
    """transformers' get_rope_index of the model for one sequence: [3][N] ids and the delta."""
    body = await read_json_object(request)
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise SpecError(
            "unknown fields",
            [FieldProblem(unknown[0], f"unknown field; known: {sorted(FIELDS)}", None)],
        )
    model_type, config, where = _model(body)
    rule = rule_for(model_type, where)
    params = vision_parameters(rule, config)
    params.update({k: body[k] for k in PARAMETERS if body.get(k) is not None})
    spans = parse_layout(body.get("layout"))
    limit = max(state.settings.json_max_elements // 3, 1)
    ids, delta = guarded(
        "layout",
        lambda: rope_index(
            rule,
            spans,
            spatial_merge_size=params["spatial_merge_size"],
            tokens_per_second=params.get("tokens_per_second"),
            temporal_merge_size=params.get("temporal_merge_size", 1),
            position_id_per_seconds=params.get("position_id_per_seconds"),
            max_tokens=limit,
        ),
    )
    return json_response(
        {
            "model_type": model_type,
            "rule": rule.name,
            **{k: params[k] for k in PARAMETERS if k in params},
            "length": int(ids.shape[1]),
            "position_ids": ids.tolist(),
            "mrope_position_deltas": delta,
        }
    )
