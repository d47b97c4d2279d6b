"""The OpenAPI document, made truthful: what `GET /openapi.json` says each route takes and answers.

FastAPI's generated document is completed here, once per app (`install_openapi`):

- request bodies typed per kind: `SpecObject` is the one spec language (`api/specs.py`): a
  discriminated union of every family's spec (`SpecFields`, on `kind`; each schema is the
  family's pydantic model, `GET /v1/kinds`), or `SpecFromConfig` (`hf_config` plus overrides), or
  `SpecFromPreset` (a preset name plus overrides). `POST /v1/tables` takes one, `POST /v1/onnx`
  one under `spec` (or a config or preset at the top level) with the export options;
- the error models every route's declared errors refer to: `Error` (`{"error", "error_type",
  "detail"}`, `api/errors.py`) on `/v1`, `OipError` (`{"error"}`) on the `/v2` models, where
  tritonclient reads it. Each route declares its errors itself, from the typed catalog
  (`api/error_types.py`: `responses(...)` in its decorator, each status described by every
  error_type it may carry); FastAPI's `HTTPValidationError` (never sent: `api/errors.py` maps
  validation errors to `Error`) is removed;
- path parameters declared on every templated path (some handlers read `request.path_params`);
- the Bearer scheme (`bearer`), required by every route the `Gate` middleware guards when
  `api_keys` is set (each then documents its 401), `/metrics` included with
  `protect_docs_and_metrics` (which also puts this document and `/docs` behind the key).

405 answers are not listed per operation: any method a path does not take gets one, with an
`Allow` header naming every method of the path (`api/errors.py`).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from posenc.api.error_types import UNAUTHORIZED
from posenc.api.error_types import responses as error_responses
from posenc.api.settings import Settings
from posenc.encodings import FAMILIES

REF = "#/components/schemas/{model}"

ERROR_SCHEMA: dict[str, Any] = {
    "title": "Error",
    "type": "object",
    "description": "The error contract of every /v1 route and of health, metrics and catalog "
    "routes (api/errors.py).",
    "properties": {
        "error": {"type": "string", "description": "what went wrong, at most 1 KiB"},
        "error_type": {"type": "string", "description": "stable code, e.g. invalid_spec"},
        "detail": {
            "description": "null, or [{field, message, value}] for spec problems, or an object "
            "naming sizes and limits"
        },
    },
    "required": ["error", "error_type", "detail"],
    "additionalProperties": False,
}
OIP_ERROR_SCHEMA: dict[str, Any] = {
    "title": "OipError",
    "type": "object",
    "description": "Open Inference Protocol error (what tritonclient decodes)",
    "properties": {"error": {"type": "string"}},
    "required": ["error"],
}

PATH_PARAMETER = re.compile(r"{([^}]+)}")
KEY_PATTERN = "^[0-9a-f]{64}$"
PARAMETER_DOCS = {
    "key": "a content key: 64 hex digits (X-Posenc-Key, Content-Location)",
    "table_key": "an uploaded table's key: 64 hex digits",
    "name": "a preset name (GET /v1/presets)",
    "part": "a part of the preset (GET /v1/presets/{name})",
    "model": "a model name: a family kind (GET /v1/kinds)",
    "version": "the model version (1)",
}


def _spec_schemas(components: dict[str, Any], presets: list[str]) -> None:
    """Add `SpecFields` (one schema per kind, discriminated on `kind`), `SpecFromConfig`,
    `SpecFromPreset`, `SpecObject`, `OnnxOptions` and `OnnxRequest` to `components`."""
    from posenc.onnx._options import ExportOptions
    from posenc.onnx._specs import ONNX_SPECS

    refs: dict[str, str] = {}
    for kind, family in sorted(FAMILIES.items()):
        schema = family.spec_type.model_json_schema(ref_template=REF)
        for name, sub in schema.pop("$defs", {}).items():
            components.setdefault(name, sub)
        name = schema.get("title", family.spec_type.__name__)
        schema["properties"]["kind"] = {"const": kind, "type": "string"}
        schema["required"] = sorted({*schema.get("required", []), "kind"})
        components[name] = schema
        refs[kind] = REF.format(model=name)
    components["SpecFields"] = {
        "title": "SpecFields",
        "description": "A spec by its fields; `kind` selects the family (GET /v1/kinds).",
        "oneOf": [{"$ref": ref} for ref in refs.values()],
        "discriminator": {"propertyName": "kind", "mapping": refs},
    }
    components["SpecFromConfig"] = {
        "title": "SpecFromConfig",
        "description": "A transformers config.json that maps to one table, and overrides "
        "(spec fields such as max_positions, dtype, profile)",
        "type": "object",
        "properties": {
            "hf_config": {"type": "object", "description": "the model's config.json"},
            "kind": {"type": "string", "enum": sorted(FAMILIES)},
            "layer_type": {"type": "string", "description": "which table, when it has several"},
        },
        "required": ["hf_config"],
        "additionalProperties": True,
    }
    components["SpecFromPreset"] = {
        "title": "SpecFromPreset",
        "description": "A preset's table (GET /v1/presets), and overrides (spec fields)",
        "type": "object",
        "properties": {
            "preset": {"type": "string", "enum": sorted(presets)},
            "part": {"type": "string", "description": "the part, when the preset has several"},
        },
        "required": ["preset"],
        "additionalProperties": True,
    }
    components["SpecObject"] = {
        "title": "SpecObject",
        "description": "The one spec language of /v1/tables, /v1/onnx, the /v2 `spec` "
        "parameter, the client and the CLI: fields, a config or a preset.",
        "anyOf": [
            {"$ref": REF.format(model="SpecFields")},
            {"$ref": REF.format(model="SpecFromConfig")},
            {"$ref": REF.format(model="SpecFromPreset")},
        ],
    }
    graph_only = []
    for kind, spec_type in sorted(ONNX_SPECS.items()):
        schema = spec_type.model_json_schema(ref_template=REF)
        for name, sub in schema.pop("$defs", {}).items():
            components.setdefault(name, sub)
        schema["properties"]["kind"] = {"const": kind, "type": "string"}
        schema["required"] = sorted({*schema.get("required", []), "kind"})
        name = schema.get("title", spec_type.__name__)
        components[name] = schema
        graph_only.append({"$ref": REF.format(model=name)})
    options = ExportOptions.model_json_schema(ref_template=REF)
    for name, sub in options.pop("$defs", {}).items():
        components.setdefault(name, sub)
    option_properties = options["properties"]
    components["OnnxRequest"] = {
        "title": "OnnxRequest",
        "description": "A spec object (under `spec`, or a config or preset at the top level) "
        "and the export options (GET /v1/onnx lists the graphs).",
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "spec": {"anyOf": [{"$ref": REF.format(model="SpecObject")}, *graph_only]},
                    **option_properties,
                },
                "required": ["spec"],
                "additionalProperties": False,
            },
            {
                "allOf": [{"$ref": REF.format(model="SpecFromConfig")}],
                "properties": option_properties,
            },
            {
                "allOf": [{"$ref": REF.format(model="SpecFromPreset")}],
                "properties": option_properties,
            },
        ],
    }


def _complete_operation(
    method: str, path: str, op: dict[str, Any], guarded: bool
) -> dict[str, Any]:
    """Security and undeclared path parameters added; FastAPI's own 422 (`HTTPValidationError`,
    never sent: `errors.py` answers `invalid_request` with the `Error` body) removed. The errors
    themselves are each route's declaration (`error_types.responses`)."""
    responses: dict[str, Any] = op.setdefault("responses", {})
    if "HTTPValidationError" in str(responses.get("422", "")):
        del responses["422"]
    if guarded:
        op["security"] = [{"bearer": []}]
        responses["401"] = error_responses(UNAUTHORIZED)[401]
    declared = {p["name"] for p in op.get("parameters", []) if p.get("in") == "path"}
    for name in PATH_PARAMETER.findall(path):
        if name in declared:
            continue
        schema: dict[str, Any] = {"type": "string"}
        if name in ("key", "table_key"):
            schema["pattern"] = KEY_PATTERN
        op.setdefault("parameters", []).insert(
            0,
            {
                "name": name,
                "in": "path",
                "required": True,
                "schema": schema,
                "description": PARAMETER_DOCS.get(name, name),
            },
        )
    return op


def guarded_path(path: str, settings: Settings, prefixes: tuple[str, ...]) -> bool:
    """True when the `Gate` middleware asks requests to `path` for a key."""
    return bool(settings.api_keys) and path.startswith(prefixes)


def build_openapi(app: FastAPI, settings: Settings, prefixes: tuple[str, ...]) -> dict[str, Any]:
    """The completed OpenAPI document of `app` (see the module docstring); `prefixes`: the
    paths the `Gate` middleware guards."""
    doc = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        description=app.description,
        routes=app.routes,
    )
    components = doc.setdefault("components", {})
    schemas: dict[str, Any] = components.setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas["Error"] = ERROR_SCHEMA
    schemas["OipError"] = OIP_ERROR_SCHEMA
    _spec_schemas(schemas, list(app.state.posenc.presets))
    components["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "one of POSENC_API_KEYS (only when set)",
        }
    }
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            _complete_operation(method, path, op, guarded_path(path, settings, prefixes))
    body = doc["paths"]["/v1/tables"]["post"]["requestBody"]["content"]["application/json"]
    body["schema"] = {"$ref": REF.format(model="SpecObject")}
    onnx = doc["paths"]["/v1/onnx"]["post"]
    onnx["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": REF.format(model="OnnxRequest")}}},
    }
    return doc


def install_openapi(app: FastAPI, settings: Settings, prefixes: tuple[str, ...]) -> None:
    """Serve `build_openapi` as `app.openapi()` (built on first use, then kept)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app, settings, prefixes)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
