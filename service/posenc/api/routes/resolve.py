"""`/v1/resolve`: a transformers config.json -> the specs, keys and URLs the model needs.

The body is a config.json, or `{"hf_config": {...}, "kind"?, "layer_type"?, ...overrides}`
(`specs.resolve_config`); the answer has one entry per distinct table (per layer type where they
differ) with its runtime notes, plus `unserved`: the parts no table is served for, each with
`part`, `reason` and `config_key` (422 only when nothing at all can be served). Each entry's `url`
is `/v1/tables/{key}.{spec}` (`api.tableurl`), which any replica answers; each key is also
remembered here, so that the bare `GET /v1/tables/{key}` answers afterwards.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from posenc.api.deps import State
from posenc.api.error_types import BODY, COMPUTE, SPEC, responses
from posenc.api.jsonio import json_object_body, json_response, read_json_object
from posenc.api.serving.describe import describe_spec
from posenc.api.specs import resolve_config_parts
from posenc.encodings import content_key

router = APIRouter(prefix="/v1", tags=["catalog"])


@router.post(
    "/resolve",
    summary="A transformers config.json -> the specs, keys and URLs the model needs",
    responses=responses(BODY, SPEC, COMPUTE),
    openapi_extra={
        "requestBody": json_object_body(
            'a config.json, or {"hf_config": {...}, "kind"?, "layer_type"?, ...overrides}'
        )
    },
)
async def resolve(request: Request, state: State) -> Response:
    """One entry per distinct table (per layer type where they differ) with runtime notes, and
    the parts served no table (`unserved`: part, reason, config_key)."""
    body = await read_json_object(request)
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
    return json_response({"specs": specs, "unserved": unserved})
