"""Request bodies -> canonical specs: a spec dict, or a transformers config.json to resolve.

The only place the API turns wire JSON into specs. Anything the core raises for bad input
surfaces as a `SpecError` (422); a config that needs more than one table answers 400
`ambiguous_config` naming the choices for `layer_type`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from posenc.api.errors import ApiError
from posenc.encodings import (
    ConfigError,
    FieldProblem,
    NamedSpec,
    PosencError,
    SpecBase,
    SpecError,
    content_key,
    parse_spec,
)
from posenc.encodings.hf_config import resolve_hf_config

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


def resolve_config(body: dict[str, Any]) -> list[NamedSpec]:
    """`{"hf_config": {...}, "kind"?, "layer_type"?, ...overrides}` (or a bare config.json)
    -> the named specs the model needs; raises `ConfigError`/`SpecError`."""
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
    named = guarded(
        "config",
        lambda: resolve_hf_config(config, kind=kind, layer_type=layer_type, **overrides),
        ConfigError,
    )
    if not named:
        raise ConfigError(
            "the config maps to no position table",
            [FieldProblem("hf_config", "no position encoding found", None)],
        )
    return named


def spec_from_body(body: dict[str, Any]) -> tuple[SpecBase, str]:
    """POST /v1/tables body -> (canonical spec, key): a spec, or an `hf_config` naming one table."""
    if "hf_config" not in body:
        return canonical_spec(body)
    named = resolve_config(body)
    if len(named) > 1:
        names = [n.name.partition(":")[2] or n.name for n in named]
        raise ApiError(
            400,
            "ambiguous_config",
            f"this config needs {len(named)} tables ({', '.join(names)}): pick one with "
            "layer_type, or POST it to /v1/resolve",
            [{"field": "layer_type", "message": f"one of {names}", "value": None}],
        )
    spec = named[0].spec.canonical()
    return spec, content_key(spec)
