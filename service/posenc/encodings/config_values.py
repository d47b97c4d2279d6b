"""Reading values of a transformers `config.json`: every failure names the config key.

Shared by the `hf_config` package (model mappings) and the RoPE variants' `from_hf` (their rope
parameter dicts). Failures are `ConfigError`s with one `FieldProblem(key, message, value)`.
"""

from __future__ import annotations

from typing import Any, NoReturn

from posenc.encodings.errors import ConfigError, FieldProblem


def fail(key: str, message: str, value: Any = None) -> NoReturn:
    """Raise the `ConfigError` of one config key that cannot be mapped."""
    raise ConfigError("cannot map config", [FieldProblem(key, message, value)])


def check_number(key: str, value: Any) -> Any:
    """`value` when it is an int or a float (not a bool), else a failure naming `key`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(key, "must be a number", value)
    return value
