"""`/v1/presets`: curated released models (`posenc.presets`), their parts' specs and tables.

- `GET /v1/presets`: every preset with its parts' keys and table URLs;
- `GET /v1/presets/{name}`, `GET /v1/presets/{name}/{part}`: canonical specs, keys, outputs;
- `GET /v1/presets/{name}/{part}/table`: that part's table at a stable URL, sent like
  `/v1/tables/{key}` (`serving.table.serve_table`) but cacheable for an hour only: the table changes
  when the algorithm version does.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from posenc.api.deps import State
from posenc.api.error_types import (
    COMPUTE,
    TABLE,
    UNKNOWN_PRESET,
    UNKNOWN_PRESET_PART,
    UNKNOWN_TABLE,
    responses,
)
from posenc.api.errors import ApiError
from posenc.api.jsonio import json_response
from posenc.api.serving.describe import describe_spec
from posenc.api.serving.params import TABLE_PARAMETERS, TABLE_RESPONSES
from posenc.api.serving.query import TableQuery
from posenc.api.serving.table import serve_table
from posenc.api.state import AppState
from posenc.api.tableurl import table_url
from posenc.encodings.errors import did_you_mean
from posenc.presets import Preset, PresetPart

router = APIRouter(prefix="/v1", tags=["catalog"])

PRESET_CACHE_CONTROL = "public, max-age=3600"
"""A preset's URL is stable but its table changes when the algorithm version does."""


def _part(preset: Preset, part: PresetPart) -> dict[str, Any]:
    base = f"/v1/presets/{preset.name}/{part.name}"
    return {"name": part.name, "preset_url": base, "table_url": f"{base}/table"} | describe_spec(
        part.spec, part.key
    )


def _summary(preset: Preset) -> dict[str, Any]:
    return {
        "name": preset.name,
        "title": preset.title,
        "model": preset.model,
        "url": f"/v1/presets/{preset.name}",
        "parts": [
            {"name": p.name, "kind": p.spec.kind, "key": p.key, "url": table_url(p.spec, p.key)}
            for p in preset.parts
        ],
    }


def _preset(state: AppState, name: str) -> Preset:
    preset = state.presets.get(name)
    if preset is None:
        raise ApiError(
            UNKNOWN_PRESET,
            f"no preset named {name!r}{did_you_mean(name, state.presets)}; GET /v1/presets lists "
            "them",
            {"name": name, "presets": sorted(state.presets)},
        )
    return preset


def _preset_part(state: AppState, name: str, part_name: str) -> tuple[Preset, PresetPart]:
    preset = _preset(state, name)
    part = preset.part(part_name)
    if part is None:
        parts = [p.name for p in preset.parts]
        raise ApiError(
            UNKNOWN_PRESET_PART,
            f"preset {name!r} has no part {part_name!r}; it has {parts}",
            {"name": name, "part": part_name, "parts": parts},
        )
    return preset, part


PresetName = Annotated[str, Path(description="preset name, e.g. llama-3.1-8b")]
PartName = Annotated[str, Path(description="part name, e.g. rope, full_attention, encoder")]


@router.get("/presets", summary="Released models with curated specs")
async def list_presets(state: State) -> Response:
    """Every preset with its parts' keys and table URLs."""
    return json_response({"presets": [_summary(p) for p in state.presets.values()]})


@router.get(
    "/presets/{name}",
    summary="One preset: its specs, keys, outputs and notes",
    responses=responses(UNKNOWN_PRESET),
)
async def get_preset(state: State, name: PresetName) -> Response:
    """The preset's model, source, notes and each part's canonical spec and URLs."""
    preset = _preset(state, name)
    body = _summary(preset) | {
        "source": preset.source,
        "notes": list(preset.notes),
        "parts": [_part(preset, p) for p in preset.parts],
    }
    return json_response(body)


@router.get(
    "/presets/{name}/{part}",
    summary="One table of a preset: its spec and URLs",
    responses=responses(UNKNOWN_PRESET, UNKNOWN_PRESET_PART),
)
async def get_preset_part(state: State, name: PresetName, part: PartName) -> Response:
    """A single part (e.g. Gemma 3's `full_attention`) with its spec, key and table URLs."""
    preset, found = _preset_part(state, name, part)
    return json_response({"preset": preset.name, **_part(preset, found)})


@router.get(
    "/presets/{name}/{part}/table",
    summary="The table of one preset part (same formats as /v1/tables/{key})",
    responses={
        **TABLE_RESPONSES,
        **responses(UNKNOWN_PRESET, UNKNOWN_PRESET_PART, UNKNOWN_TABLE, TABLE, COMPUTE),
    },
    openapi_extra={"parameters": TABLE_PARAMETERS},
)
async def get_preset_table(
    request: Request, state: State, name: PresetName, part: PartName
) -> Response:
    """The preset part's table at a stable URL; Content-Location names its content key."""
    _, found = _preset_part(state, name, part)
    return await serve_table(
        request,
        state,
        found.spec,
        found.key,
        TableQuery.from_request(request),
        cache_control=PRESET_CACHE_CONTROL,
    )
