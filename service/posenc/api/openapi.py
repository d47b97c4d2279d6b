"""The OpenAPI document, made truthful: what `GET /openapi.json` says each route takes and answers.

FastAPI's generated document is completed here, once per app (`install_openapi`):

- request bodies typed per kind: `SpecObject` is the one spec language (`api/specs.py`): a
  discriminated union of every family's spec (`SpecFields`, on `kind`; each schema is the
  family's pydantic model, `GET /v1/kinds`), or `SpecFromConfig` (`hf_config` plus overrides), or
  `SpecFromPreset` (a preset name plus overrides). `POST /v1/tables` takes one, `POST /v1/onnx`
  one under `spec` (or a config or preset at the top level) with the export options;
- every error a route can answer, per route (`ROUTE_ERRORS`), with the error model: `Error`
  (`{"error", "error_type", "detail"}`, `api/errors.py`) on `/v1`, `OipError` (`{"error"}`) on
  the `/v2` models, where tritonclient reads it; FastAPI's `HTTPValidationError` (never sent:
  `api/errors.py` maps validation errors to `Error`) is removed;
- path parameters declared on every templated path (some handlers read `request.path_params`);
- the Bearer scheme (`bearer`), required by every route `ApiKeyMiddleware` guards when
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

from posenc.api.settings import Settings
from posenc.encodings import FAMILIES
from posenc.presets import load_presets

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

BODY_ERRORS = {
    413: "Request body over its cap (body_too_large)",
    415: "A Content-Encoding other than identity (unsupported_media_type)",
}
TABLE_ERRORS = {
    400: "Malformed JSON, an unknown format or tensor, bad rows, an ambiguous config or preset",
    404: "Unknown key, preset, preset part or uploaded table",
    406: "Accept names no format served (not_acceptable)",
    413: "Table over max_response_bytes, or JSON over json_max_elements (detail: sizes)",
    416: "Range outside the raw body (Content-Range: bytes */size)",
    503: "Too many computations in flight (busy, Retry-After), or the server is starting",
}
OIP_ERRORS = {
    404: "Unknown model or version",
}

ROUTE_ERRORS: dict[tuple[str, str], dict[int, str]] = {
    ("post", "/v1/tables"): {
        **TABLE_ERRORS,
        **BODY_ERRORS,
        422: "Invalid spec or config: detail lists [{field, message, value}]",
    },
    ("get", "/v1/tables/{key}"): {
        **TABLE_ERRORS,
        400: TABLE_ERRORS[400] + "; a table URL's malformed key or spec (invalid_table_url), "
        "or a spec whose content key is not the URL's (key_mismatch)",
        404: "A bare key this server never resolved (unknown_key), or an unknown uploaded table",
        414: "A table URL's spec part over 4096 characters (invalid_table_url)",
        422: "The spec a table URL carries is invalid: detail lists [{field, message, value}]",
    },
    ("get", "/v1/tables/{key}/preview"): {
        400: "Bad tensor, rows or max_points (invalid_max_points); a malformed table URL "
        "(invalid_table_url) or a spec not of the URL's key (key_mismatch)",
        404: "Unknown key, or uploaded table",
        413: "Table over max_response_bytes",
        414: "A table URL's spec part over 4096 characters (invalid_table_url)",
        422: "The spec a table URL carries is invalid: detail lists [{field, message, value}]",
        503: "Too many computations in flight, or the in-flight budget is full (Retry-After)",
    },
    ("get", "/v1/presets/{name}/{part}/table"): TABLE_ERRORS,
    ("get", "/v1/presets/{name}"): {404: "Unknown preset"},
    ("get", "/v1/presets/{name}/{part}"): {404: "Unknown preset or part"},
    ("post", "/v1/uploads"): {
        **BODY_ERRORS,
        400: "Not one real (N, D) table, or an unknown format or tensor",
        413: "Body over max_upload_bytes, or a table larger than the table store",
    },
    ("get", "/v1/uploads/{table_key}"): {404: "No uploaded table with this key (unknown_table)"},
    ("post", "/v1/resolve"): {
        **BODY_ERRORS,
        400: "Malformed JSON, or not an object",
        422: "A config of which nothing can be served (detail names each part's key), or invalid "
        "overrides; a config served in part answers 200 with `unserved`",
    },
    ("post", "/v1/mrope/position_ids"): {
        **BODY_ERRORS,
        400: "Malformed JSON, or not an object",
        422: "An unknown or unserved model_type, a bad layout or a layout over json_max_elements "
        "/ 3 tokens (detail names the field)",
    },
    ("post", "/v1/onnx"): {
        **BODY_ERRORS,
        400: "Malformed JSON, an ambiguous config or preset",
        404: "Unknown preset, preset part or uploaded table",
        413: "The spec's table over max_response_bytes, or the body over its cap",
        422: "Invalid spec or export options (detail names the field)",
        500: "error_type export: the graph failed verification (logged; never sent)",
        503: "Too many computations in flight (busy, Retry-After)",
    },
    ("get", "/v1/onnx/{key}"): {
        404: "Unknown export key: POST the request to /v1/onnx first",
        413: "The spec's table over max_response_bytes",
        500: "error_type export: the graph failed verification",
        503: "Too many computations in flight (busy, Retry-After)",
    },
    ("post", "/v1/check/onnx"): {
        **BODY_ERRORS,
        400: "Not an ONNX model, or a cache that is not a (P, d/2) table (invalid_model)",
        404: "Unknown key: resolve its config or preset first",
        413: "Body over max_upload_bytes, or the exact table over max_response_bytes",
        422: "key missing or not a rope table; no RoPE cache baked in (no_rope_caches); the "
        "caches' rows or dtype out of a spec's range",
        503: "Too many computations in flight (busy, Retry-After)",
    },
    ("get", "/v2/health/ready"): {503: "Warming up or draining (not_ready)"},
}
"""Per operation: every error status it can answer and when. Unlisted operations answer none
(beyond 401 where keys guard them, and 405)."""

OIP_ROUTE_ERRORS: dict[str, dict[int, str]] = {
    "get": {**OIP_ERRORS},
    "ready": {**OIP_ERRORS, 503: "The server is not ready (warming up or draining)"},
    "infer": {
        **OIP_ERRORS,
        400: "Malformed request, inputs or parameters (the message names them), or a body that "
        "is not the gzip or deflate its Content-Encoding says (tritonclient's compression)",
        413: "Body over max_infer_body_bytes, or the outputs over max_response_bytes",
        503: "Too many computations in flight (Retry-After), or the server is starting",
    },
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


def _spec_schemas(components: dict[str, Any]) -> None:
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
    presets = load_presets()
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


def _error_response(description: str, model: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": REF.format(model=model)}}},
    }


def _complete_operation(
    method: str, path: str, op: dict[str, Any], guarded: bool
) -> dict[str, Any]:
    responses: dict[str, Any] = op.setdefault("responses", {})
    responses.pop("422", None)  # FastAPI's HTTPValidationError, never sent as such
    oip = path.startswith("/v2/models/")
    if oip:
        leaf = path.rsplit("/", 1)[-1]
        errors = OIP_ROUTE_ERRORS.get(leaf if leaf in ("ready", "infer") else method, {})
    else:
        errors = ROUTE_ERRORS.get((method, path), {})
    model = "OipError" if oip else "Error"
    for code in list(responses):
        if code.isdigit() and int(code) >= 400 and int(code) not in errors:
            del responses[code]  # a hand-written entry this table does not vouch for
    for status, description in sorted(errors.items()):
        responses[str(status)] = _error_response(description, model)
    if guarded:
        op["security"] = [{"bearer": []}]
        responses["401"] = _error_response("Missing or invalid bearer key (unauthorized)", "Error")
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
    """True when `ApiKeyMiddleware` asks requests to `path` for a key."""
    return bool(settings.api_keys) and path.startswith(prefixes)


def build_openapi(app: FastAPI, settings: Settings, prefixes: tuple[str, ...]) -> dict[str, Any]:
    """The completed OpenAPI document of `app` (see the module docstring); `prefixes`: the
    paths `ApiKeyMiddleware` guards."""
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
    _spec_schemas(schemas)
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
