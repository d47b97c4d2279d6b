"""Errors of the ONNX exporters. They carry no HTTP: the API maps them to statuses.

PosencError (posenc.encodings.errors)
├── SpecError
│   └── UnsupportedExportError ... the request cannot be exported (graph, mode, op, opset,
│                                   dtype or spec field not supported): a client error
└── ExportError .................. a built graph failed the checker, shape inference or the
                                   onnxruntime comparison with the torch table: a bug, never
                                   a graph to serve
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from posenc.encodings.errors import FieldProblem, PosencError, SpecError


@dataclass
class UnsupportedExportError(SpecError):
    """The spec and export options name no graph posenc can build and verify; names the field."""

    error_type = "unsupported_export"


@dataclass
class ExportError(PosencError):
    """A graph failed verification. `detail` says which check and by how much."""

    message: str
    detail: dict[str, Any] = field(default_factory=dict)

    error_type = "export"

    def __str__(self) -> str:
        return self.message


def unsupported(message: str, field_name: str, value: Any, why: str) -> UnsupportedExportError:
    """An `UnsupportedExportError` with one field problem."""
    return UnsupportedExportError(message, [FieldProblem(field_name, why, value)])
