"""The table routes' query parameters and responses, as OpenAPI documents them, derived from the
format records (`formats.FORMATS`), and the query read from a request."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from posenc.api.serving.formats import DEFAULT, FORMATS

ROWS_PARAMETER: dict[str, Any] = {
    "name": "rows",
    "in": "query",
    "required": False,
    "schema": {"type": "string", "pattern": "^[0-9]*:[0-9]*$"},
    "description": "START:END: positions [START, END) only",
    "example": "0:2048",
}

TABLE_PARAMETERS: list[dict[str, Any]] = [
    {
        "name": "format",
        "in": "query",
        "required": False,
        "schema": {"type": "string", "enum": list(FORMATS)},
        "description": f"overrides Accept; {DEFAULT.name} by default",
    },
    {
        "name": "tensor",
        "in": "query",
        "required": False,
        "schema": {"type": "string"},
        "description": "send only this tensor (required for "
        + " and ".join(f.name for f in FORMATS.values() if f.single)
        + ")",
    },
    ROWS_PARAMETER,
]
"""The table query parameters. Hot routes read them from the request directly (FastAPI's
per-parameter validation costs more than the rest of a cache hit); this documents them."""


def table_params(request: Request) -> tuple[str | None, str | None, str | None]:
    """(format, tensor, rows) from the query string."""
    query = request.query_params
    return query.get("format"), query.get("tensor"), query.get("rows")


TABLE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The table. Headers: ETag, Content-Location, X-Posenc-Key, "
        "X-Posenc-Device (raw also X-Posenc-Dtype, X-Posenc-Shape).",
        "content": {f.media_type: {} for f in FORMATS.values()},
    },
    206: {
        "description": "Range of a raw table (Content-Range; Repr-Digest names the whole)",
        "content": {f.media_type: {} for f in FORMATS.values() if f.ranges},
    },
}
