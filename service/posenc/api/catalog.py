"""Discovery routes: `/v1/kinds` (families, schemas, valid values), `/v1/presets` (released
models and their tables) and `/v1/resolve` (config.json -> the specs a model needs)."""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from posenc.api.errors import ApiError
from posenc.api.jsonio import json_response, read_json_object
from posenc.api.specs import resolve_config
from posenc.api.state import AppState, State, app_state
from posenc.api.tables import TABLE_PARAMETERS, TABLE_RESPONSES, serve_table, table_params
from posenc.encodings import FAMILIES, SpecBase, canonical_dict, content_key
from posenc.presets import Preset, PresetPart

router = APIRouter(prefix="/v1", tags=["catalog"])

PRESET_CACHE_CONTROL = "public, max-age=3600"
"""A preset's URL is stable but its table changes when the algorithm version does."""


def valid_values(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Field path -> its allowed values (`enum`) and bounds, read from a JSON schema.

    Discriminated unions list the discriminator's values (`rope_scaling.rope_type`) and then each
    variant's fields as `rope_scaling[rope_type=yarn].factor`.
    """
    defs: dict[str, Any] = schema.get("$defs", {})
    out: dict[str, dict[str, Any]] = {}

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        return defs[ref.rsplit("/", 1)[-1]] if isinstance(ref, str) else node

    def constraints(node: dict[str, Any]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        enum: list[Any] = []
        for option in node.get("anyOf") or node.get("oneOf") or [node]:
            option = resolve(option)
            enum.extend(option.get("enum", ()))
            if "const" in option:
                enum.append(option["const"])
            for bound in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                if bound in option:
                    found[bound] = option[bound]
            if option.get("type") == "null":
                found["nullable"] = True
        if enum:
            found["enum"] = enum
        if "default" in node:
            found["default"] = node["default"]
        return found

    def walk(props: dict[str, Any], prefix: str) -> None:
        for name, node in props.items():
            path = prefix + name
            disc = node.get("discriminator")
            if disc:
                key = disc["propertyName"]
                out[f"{path}.{key}"] = {"enum": sorted(disc["mapping"])}
                for value, ref in sorted(disc["mapping"].items()):
                    variant = defs[ref.rsplit("/", 1)[-1]]
                    fields = {k: v for k, v in variant.get("properties", {}).items() if k != key}
                    walk(fields, f"{path}[{key}={value}].")
                continue
            found = constraints(node)
            if found:
                out[path] = found

    walk(schema.get("properties", {}), "")
    return out


@cache
def _kinds_body() -> bytes:
    kinds = []
    for kind, family in sorted(FAMILIES.items()):
        schema = family.spec_type.model_json_schema()
        kinds.append(
            {
                "kind": kind,
                "summary": family.summary,
                "description": (family.spec_type.__doc__ or "").strip(),
                "required": schema.get("required", []),
                "valid_values": valid_values(schema),
                "schema": schema,
            }
        )
    return orjson.dumps({"kinds": kinds})


@router.get("/kinds", summary="Encoding families, their JSON schemas and valid values")
async def get_kinds() -> Response:
    """Every registered family: summary, JSON schema and each field's valid values."""
    return Response(_kinds_body(), media_type="application/json")


def describe_spec(spec: SpecBase, key: str | None = None) -> dict[str, Any]:
    """A canonical spec as the catalog shows it: kind, key, table URL, spec, outputs, bytes."""
    key = key or content_key(spec)
    return {
        "kind": spec.kind,
        "key": key,
        "url": f"/v1/tables/{key}",
        "spec": canonical_dict(spec),
        "outputs": {
            name: {"shape": list(info.shape), "dtype": info.dtype}
            for name, info in spec.outputs().items()
        },
        "bytes": spec.output_bytes(),
    }


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
            {"name": p.name, "kind": p.spec.kind, "key": p.key, "url": f"/v1/tables/{p.key}"}
            for p in preset.parts
        ],
    }


def _preset(state: AppState, name: str) -> Preset:
    preset = state.presets.get(name)
    if preset is None:
        raise ApiError(
            404,
            "unknown_preset",
            f"no preset named {name!r}; GET /v1/presets lists them",
            {"name": name, "presets": sorted(state.presets)},
        )
    return preset


def _preset_part(state: AppState, name: str, part_name: str) -> tuple[Preset, PresetPart]:
    preset = _preset(state, name)
    part = preset.part(part_name)
    if part is None:
        parts = [p.name for p in preset.parts]
        raise ApiError(
            404,
            "unknown_preset_part",
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


@router.get("/presets/{name}", summary="One preset: its specs, keys, outputs and notes")
async def get_preset(state: State, name: PresetName) -> Response:
    """The preset's model, source, notes and each part's canonical spec and URLs."""
    preset = _preset(state, name)
    body = _summary(preset) | {
        "source": preset.source,
        "notes": list(preset.notes),
        "parts": [_part(preset, p) for p in preset.parts],
    }
    return json_response(body)


@router.get("/presets/{name}/{part}", summary="One table of a preset: its spec and URLs")
async def get_preset_part(state: State, name: PresetName, part: PartName) -> Response:
    """A single part (e.g. Gemma 3's `full_attention`) with its spec, key and table URLs."""
    preset, found = _preset_part(state, name, part)
    return json_response({"preset": preset.name, **_part(preset, found)})


@router.get(
    "/presets/{name}/{part}/table",
    summary="The table of one preset part (same formats as /v1/tables/{key})",
    responses=TABLE_RESPONSES,
    openapi_extra={"parameters": TABLE_PARAMETERS},
)
async def get_preset_table(request: Request, name: PresetName, part: PartName) -> Response:
    """The preset part's table at a stable URL; Content-Location names its content key."""
    state = app_state(request)
    _, found = _preset_part(state, name, part)
    return await serve_table(
        request,
        state,
        found.spec,
        found.key,
        *table_params(request),
        cache_control=PRESET_CACHE_CONTROL,
    )


@router.post(
    "/resolve",
    summary="A transformers config.json -> the specs, keys and URLs the model needs",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "description": "a config.json, or "
                        '{"hf_config": {...}, "kind"?, "layer_type"?, ...overrides}',
                    }
                }
            },
        }
    },
)
async def resolve(request: Request, state: State) -> Response:
    """One entry per distinct table (per layer type where they differ) with runtime notes."""
    body = await read_json_object(request)
    specs = []
    for item in resolve_config(body):
        spec = item.spec.canonical()
        key = content_key(spec)
        state.index.remember(key, spec)
        specs.append({"name": item.name, **describe_spec(spec, key), "notes": item.notes})
    return json_response({"specs": specs})
