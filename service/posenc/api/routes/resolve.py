"""`/v1/resolve`: a transformers config.json -> the specs, keys and URLs the model needs.

The body is a config.json, `{"hf_config": {...}, "kind"?, "layer_type"?, ...overrides}`
(`specs.resolve_config`), or `{"model_id": "ORG/NAME[@REVISION]", ...the same}`: a Hugging Face
model id whose config.json the server reads from its Hugging Face cache or the Hub (`api.hub`),
answered with `model: {id, commit}` beside the specs. The answer has one entry per distinct
table (per layer type where they differ) with its runtime notes, plus `unserved`: the parts no
table is served for, each with `part`, `reason` and `config_key` (422 only when nothing at all
can be served). Each entry's `url` is `/v1/tables/{key}.{spec}` (`api.tableurl`), which any
replica answers; each key is also remembered here, so that the bare `GET /v1/tables/{key}`
answers afterwards.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from posenc.api.deps import State
from posenc.api.error_types import BODY, COMPUTE, MODEL_ID, SPEC, responses
from posenc.api.hub import with_model_config
from posenc.api.jsonio import json_object_body, json_response, read_json_object
from posenc.api.serving.describe import describe_spec
from posenc.api.specs import resolve_config_parts
from posenc.encodings import content_key

router = APIRouter(prefix="/v1", tags=["catalog"])


@router.post(
    "/resolve",
    summary="A transformers config.json -> the specs, keys and URLs the model needs",
    responses=responses(BODY, SPEC, COMPUTE, MODEL_ID),
    openapi_extra={
        "requestBody": json_object_body(
            'a config.json, {"hf_config": {...}, "kind"?, "layer_type"?, ...overrides}, or '
            '{"model_id": "ORG/NAME[@REVISION]", "kind"?, "layer_type"?, ...overrides}'
        )
    },
)
async def resolve(request: Request, state: State) -> Response:
    """One entry per distinct table (per layer type where they differ) with runtime notes, and
    the parts served no table (`unserved`: part, reason, config_key)."""
    body = await read_json_object(request)
    body, model = await with_model_config(body)
    resolution = resolve_config_parts(body)
    specs = []
    for item in resolution.specs:
        spec = item.spec.canonical()
        key = content_key(spec)
        state.index.remember(key, spec)
        specs.append({"name": item.name, **describe_spec(spec, key), "notes": item.notes})
    unserved = [
        {"part": u.part, "reason": u.reason, "config_key": u.config_key}
        for u in resolution.unserved
    ]
    answer: dict[str, object] = {"specs": specs, "unserved": unserved}
    if model is not None:
        answer["model"] = {"id": model.model_id, "commit": model.commit}
    return json_response(answer)
