"""Request `parameters` -> a wire spec dict, the same schema as `/v1` (`posenc.encodings`).

Two spellings, combinable (flat keys override the JSON):

- `spec`: a JSON string (or, from a JSON client, an object) holding a spec object, the same as
  `/v1` takes (`api/specs.py`: fields, `hf_config` plus overrides, or a preset plus overrides);
- flat keys: one parameter per spec field (`head_dim`, `rope_theta`, `num_heads`, ...). Protocol
  parameters carry scalars only, so list or object values travel as JSON strings
  (`"mrope_section": "[16, 24, 24]"`).

Protocol parameters (`binary_data_output`, `sequence_id`, `priority`, `timeout`, ... and anything
starting with `triton_`: tritonclient's reserved names) are not spec fields and are dropped here.
The domain conversion to a frozen spec happens in exactly one place, `posenc.encodings.parse_spec`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from posenc.api.oip.codec import bad_request
from posenc.api.specs import spec_fields

PROTOCOL_PARAMETERS = frozenset(
    {
        "binary_data_output",
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "headers",
    }
)
"""Request parameters of the protocol itself (tritonclient's `TRITON_RESERVED_REQUEST_PARAMS`)."""

RESERVED_PREFIX = "triton_"


def _decode(name: str, value: Any) -> Any:
    """A flat value: strings that hold a JSON list or object are decoded, the rest kept."""
    if isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"parameter {name!r} is not valid JSON: {exc}") from None
    return value


def spec_parameters(
    kind: str, parameters: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the `spec` parameter decoded, the flat spec keys decoded) for model `kind`.

    Raises `OipError` 400 when `spec` is not a JSON object or names another kind.
    """
    flat: dict[str, Any] = {}
    base: dict[str, Any] = {}
    for name, value in parameters.items():
        if name in PROTOCOL_PARAMETERS or name.startswith(RESERVED_PREFIX):
            continue
        if name == "spec":
            base = _spec(value)
        else:
            flat[name] = _decode(name, value)
    for source in (base, flat):
        if "kind" in source and source["kind"] != kind:
            raise bad_request(
                f"model {kind!r} computes kind {kind!r}, the parameters say {source['kind']!r}"
            )
    base.pop("kind", None)
    flat.pop("kind", None)
    return base, flat


def _spec(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return spec_fields(value)
    if not isinstance(value, str):
        raise bad_request("parameter 'spec' must be a JSON object in a string")
    try:
        decoded = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"parameter 'spec' is not valid JSON: {exc}") from None
    if not isinstance(decoded, dict):
        raise bad_request("parameter 'spec' must be a JSON object")
    return spec_fields(decoded)


def merged_spec(kind: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """`spec` with the flat keys laid over it, plus `kind` (families without nested groups)."""
    base, flat = spec_parameters(kind, parameters)
    return {**base, **flat, "kind": kind}
