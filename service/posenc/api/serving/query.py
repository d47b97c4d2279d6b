"""Typed query records: a route's query parameters declared once, as a frozen dataclass whose
fields carry their OpenAPI schema and description (`param`), read from a request with
`from_request` and documented with `parameters()`.

Hot routes read their query from the request directly (FastAPI's per-parameter validation costs
more than the rest of a cache hit), so the record, not FastAPI, is where the query is declared;
values stay strings and are checked where their meaning is known (`selection.py`,
`preview.parse_max_points`), with errors naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Self

from starlette.requests import Request

from posenc.api.serving.formats import DEFAULT, FORMATS


def param(description: str, **schema: Any) -> Any:
    """A query field (a string, or None when absent) with its OpenAPI schema and description."""
    return field(
        default=None, metadata={"schema": {"type": "string", **schema}, "doc": description}
    )


class QueryRecord:
    """Base of the query records: `from_request` and `parameters`."""

    @classmethod
    def from_request(cls, request: Request) -> Self:
        """The record of `request`'s query string (absent parameters None)."""
        query = request.query_params
        return cls(**{f.name: query.get(f.name) for f in fields(cls)})  # type: ignore[arg-type]

    @classmethod
    def parameters(cls) -> list[dict[str, Any]]:
        """The OpenAPI `parameters` of the record's fields."""
        out = []
        for f in fields(cls):  # type: ignore[arg-type]
            schema = dict(f.metadata["schema"])
            example = schema.pop("example", None)
            item = {
                "name": f.name,
                "in": "query",
                "required": False,
                "schema": schema,
                "description": f.metadata["doc"],
            }
            if example is not None:
                item["example"] = example
            out.append(item)
        return out


ROWS_DOC = "START:END: positions [START, END) only"
ROWS_SCHEMA = {"pattern": "^[0-9]*:[0-9]*$", "example": "0:2048"}


@dataclass(frozen=True)
class TableQuery(QueryRecord):
    """The query of a table route: the format (else Accept), one tensor, a row range."""

    format: str | None = param(f"overrides Accept; {DEFAULT.name} by default", enum=list(FORMATS))
    tensor: str | None = param(
        "send only this tensor (required for "
        + " and ".join(f.name for f in FORMATS.values() if f.single)
        + ")"
    )
    rows: str | None = param(ROWS_DOC, **ROWS_SCHEMA)
    device: str | None = param(
        "cpu: the table computed on the CPU whatever the server's device, the reference bytes "
        "(transformers on the CPU, bit for bit; a GPU's cos/sin may differ by up to 2 float32 "
        "ulps): what `posenc-client verify` compares models with. Default: the server's device",
        enum=["cpu"],
    )
