"""Request bodies -> canonical specs: the one spec language of every route and protocol.

A *spec object* is one of three spellings, accepted alike by `POST /v1/tables` (the body),
`POST /v1/onnx` (`{"spec": <spec object>, ...export options}`), the `/v2` models (the `spec`
parameter; flat parameters override its fields), the Python client and its CLI:

- fields: `{"kind": ..., ...fields}` (`GET /v1/kinds` has each family's schema);
- a config: `{"hf_config": {...config.json...}, "kind"?, "layer_type"?, ...overrides}`;
- a preset: `{"preset": NAME, "part"?: PART, ...overrides}` (`GET /v1/presets`).

`spec_fields` turns any of them into the fields form, `spec_from_object` into the canonical spec
and its content key: the only place the API turns wire JSON into specs. Anything the core raises
for bad input surfaces as a `SpecError` (422); a config or preset that needs more than one table
answers 400 `ambiguous_config` naming the choices (`layer_type`, `part`); an unknown preset is
404 `unknown_preset`, an unknown part 404 `unknown_preset_part`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from posenc.api.error_types import AMBIGUOUS_CONFIG, UNKNOWN_PRESET, UNKNOWN_PRESET_PART
from posenc.api.errors import ApiError
from posenc.encodings import (
    ConfigError,
    FieldProblem,
    NamedSpec,
    PosencError,
    SpecBase,
    SpecError,
    canonical_dict,
    content_key,
    parse_spec,
)
from posenc.encodings.errors import did_you_mean
from posenc.encodings.hf_config import Resolution, resolve_hf_config, resolve_hf_parts
from posenc.presets import load_presets

log = logging.getLogger("posenc.api")

T = TypeVar("T")


def guarded(what: str, fn: Callable[[], T], error: type[SpecError] = SpecError) -> T:
    """Run `fn`, turning anything but a `PosencError` into a `SpecError`: bad input must never
    become a 500, even where a validator trips over a type it did not expect."""
    try:
        return fn()
    except PosencError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as err:
        log.warning("%s raised %s for client input", what, type(err).__name__, exc_info=True)
        raise error(f"invalid {what}: {err}", [FieldProblem("(body)", str(err), None)]) from None


def canonical_spec(data: dict[str, Any]) -> tuple[SpecBase, str]:
    """A spec dict -> (canonical spec, content key); raises `SpecError`."""

    def build() -> tuple[SpecBase, str]:
        spec = parse_spec(data).canonical()
        spec.outputs()  # shapes must be computable before anything is allocated
        return spec, content_key(spec)

    return guarded("spec", build)


def _optional_str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise SpecError(f"invalid {name}", [FieldProblem(name, "must be a string", value)])
    return value


def _config_request(
    body: dict[str, Any],
) -> tuple[dict[str, Any], str | None, str | None, dict[str, Any]]:
    """`{"hf_config": {...}, "kind"?, "layer_type"?, ...overrides}` (or a bare config.json)
    -> (config, kind, layer_type, overrides)."""
    if "hf_config" in body:
        config = body["hf_config"]
        rest = {k: v for k, v in body.items() if k != "hf_config"}
    else:
        config, rest = body, {}
    if not isinstance(config, dict):
        raise ConfigError(
            "hf_config must be a JSON object (the model's config.json)",
            [FieldProblem("hf_config", "expected an object", type(config).__name__)],
        )
    kind = _optional_str(rest, "kind")
    layer_type = _optional_str(rest, "layer_type")
    overrides = {k: v for k, v in rest.items() if k not in ("kind", "layer_type")}
    return config, kind, layer_type, overrides


def _no_table() -> ConfigError:
    return ConfigError(
        "the config maps to no position table",
        [FieldProblem("hf_config", "no position encoding found", None)],
    )


def resolve_config(body: dict[str, Any]) -> list[NamedSpec]:
    """`{"hf_config": {...}, "kind"?, "layer_type"?, ...overrides}` (or a bare config.json)
    -> the named specs the model needs; raises `ConfigError`/`SpecError`."""
    config, kind, layer_type, overrides = _config_request(body)
    named = guarded(
        "config",
        lambda: resolve_hf_config(config, kind=kind, layer_type=layer_type, **overrides),
        ConfigError,
    )
    if not named:
        raise _no_table()
    return named


def resolve_config_parts(body: dict[str, Any]) -> Resolution:
    """`resolve_config`, serving what can be served (`resolve_hf_parts`): the tables and the
    parts that get none; raises `ConfigError`/`SpecError` when nothing can be served."""
    config, kind, layer_type, overrides = _config_request(body)
    resolution = guarded(
        "config",
        lambda: resolve_hf_parts(config, kind=kind, layer_type=layer_type, **overrides),
        ConfigError,
    )
    if not resolution.specs:
        raise _no_table()
    return resolution


def _ambiguous(what: str, field: str, names: list[str], hint: str) -> ApiError:
    return ApiError(
        AMBIGUOUS_CONFIG,
        f"this {what} needs {len(names)} tables ({', '.join(names)}): pick one with {field}" + hint,
        [{"field": field, "message": f"one of {names}", "value": None}],
    )


def _preset_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """`{"preset": NAME, "part"?: PART, ...overrides}` -> the part's canonical fields with the
    overrides laid over them."""
    name = _optional_str(dict(body), "preset")
    part_name = _optional_str(dict(body), "part")
    overrides = {k: v for k, v in body.items() if k not in ("preset", "part")}
    presets = load_presets()
    preset = presets.get(name or "")
    if preset is None:
        raise ApiError(
            UNKNOWN_PRESET,
            f"no preset {name!r}{did_you_mean(name, presets)}; GET /v1/presets lists them",
            [{"field": "preset", "message": f"one of {sorted(presets)}", "value": name}],
        )
    if part_name is None:
        if len(preset.parts) > 1:
            raise _ambiguous("preset", "part", [p.name for p in preset.parts], "")
        part = preset.parts[0]
    else:
        found = preset.part(part_name)
        if found is None:
            names = [p.name for p in preset.parts]
            raise ApiError(
                UNKNOWN_PRESET_PART,
                f"preset {preset.name!r} has no part {part_name!r}; it has {names}",
                [{"field": "part", "message": f"one of {names}", "value": part_name}],
            )
        part = found
    fields = canonical_dict(part.spec)
    if "kind" in overrides and overrides["kind"] != part.spec.kind:
        raise SpecError(
            f"preset {preset.name!r} part {part.name!r} is a {part.spec.kind} table",
            [FieldProblem("kind", f"must be {part.spec.kind!r} (or left out)", overrides["kind"])],
        )
    return {**fields, **overrides}


def spec_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """Any spec object (fields, `hf_config` plus overrides, or a preset plus overrides) -> its
    fields form `{"kind": ..., ...}`; raises `SpecError`/`ConfigError` (422), `ApiError` (400
    `ambiguous_config`, 404 `unknown_preset`/`unknown_preset_part`)."""
    if not isinstance(body, Mapping):
        raise SpecError(
            "a spec must be a JSON object",
            [FieldProblem("(spec)", "expected an object", type(body).__name__)],
        )
    if "hf_config" in body and "preset" in body:
        raise SpecError(
            "give hf_config or preset, not both",
            [FieldProblem("preset", "not allowed with hf_config", body["preset"])],
        )
    if "preset" in body:
        return _preset_fields(body)
    if "hf_config" not in body:
        return dict(body)
    named = resolve_config(dict(body))
    if len(named) > 1:
        names = [n.name.partition(":")[2] or n.name for n in named]
        raise _ambiguous("config", "layer_type", names, ", or POST it to /v1/resolve")
    return canonical_dict(named[0].spec)


def spec_from_object(body: Mapping[str, Any]) -> tuple[SpecBase, str]:
    """Any spec object -> (canonical spec, content key): `canonical_spec(spec_fields(body))`."""
    return canonical_spec(spec_fields(body))
