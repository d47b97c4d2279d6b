"""Domain errors of the encodings core. They carry no HTTP: the API maps them to statuses."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


def closest(word: object, choices: Iterable[str]) -> str | None:
    """The one of `choices` closest to a misspelt `word` (difflib's ratio at least 0.75), else
    None (and for a word that is one of them, or not a string of at most 200 characters)."""
    names = list(choices)
    if not isinstance(word, str) or len(word) > 200 or word in names:
        return None
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.75)
    return close[0] if close else None


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """`; did you mean 'x'?` for the `closest` of `choices` to a misspelt `word`, else "":
    appended to the message naming the unknown value."""
    found = closest(word, choices)
    return f"; did you mean {found!r}?" if found else ""


@dataclass(frozen=True)
class FieldProblem:
    """One invalid field: its dotted path, the offending value and what would be valid."""

    field: str
    message: str
    value: Any = None

    def describe(self) -> str:
        """`field: message (got value)`, leaving out a value the message already states."""
        if self.value is None or "got" in self.message:
            return f"{self.field}: {self.message}"
        return f"{self.field}: {self.message} (got {self.value!r})"


class PosencError(Exception):
    """Root of every error the encodings core raises."""

    error_type = "posenc_error"


@dataclass
class SpecError(PosencError):
    """A spec is invalid. `problems` names each field, its value and the valid range."""

    message: str
    problems: list[FieldProblem] = field(default_factory=list)

    error_type = "invalid_spec"

    def __str__(self) -> str:
        if not self.problems:
            return self.message
        return f"{self.message}: " + "; ".join(p.describe() for p in self.problems)


@dataclass
class UnknownKindError(SpecError):
    """The `kind` field names no registered family."""

    error_type = "unknown_kind"


@dataclass
class ConfigError(SpecError):
    """A model config.json (transformers shape) cannot be mapped to a spec; names the key."""

    error_type = "unsupported_config"
