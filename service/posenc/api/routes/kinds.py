"""`/v1/kinds`: the encoding families, their JSON schemas and each field's valid values; the RoPE
consumer profiles (`profiles`, from the profile records, in the explorer's order), the comparison
tolerance per dtype (`tolerances`, `posenc.encodings.tolerances.ATOL`) and this server's size limits
(`limits`): the facts the explorer (`/ui`) reads instead of keeping its own copies."""

from __future__ import annotations

from functools import cache
from typing import Any

import orjson
from fastapi import APIRouter
from starlette.responses import Response

from posenc.api.deps import State
from posenc.encodings import FAMILIES
from posenc.encodings.rope import PROFILES
from posenc.encodings.tolerances import ATOL

router = APIRouter(prefix="/v1", tags=["catalog"])


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
def _kinds() -> dict[str, Any]:
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
    profiles = [profile.describe() for profile in PROFILES.values()]
    return {"kinds": kinds, "profiles": profiles, "tolerances": dict(ATOL)}


@router.get("/kinds", summary="Encoding families, their JSON schemas and valid values")
async def get_kinds(state: State) -> Response:
    """Every registered family (summary, JSON schema, each field's valid values); the RoPE
    consumer profiles (`profiles`: name, label, consumer entry point and source, in the order
    people pick them, the default first); the tolerance per dtype; and `limits`:
    `max_response_bytes` (a larger table is refused with 413) and `json_max_elements` (the
    largest preview)."""
    limits = {
        "max_response_bytes": state.settings.max_response_bytes,
        "json_max_elements": state.settings.json_max_elements,
    }
    return Response(orjson.dumps({**_kinds(), "limits": limits}), media_type="application/json")
