"""The table routes' query parameters and responses, as OpenAPI documents them, derived from the
format records (`formats.FORMATS`) and the query record (`query.TableQuery`)."""

from __future__ import annotations

from typing import Any

from posenc.api.serving.formats import FORMATS
from posenc.api.serving.query import TableQuery

TABLE_PARAMETERS = TableQuery.parameters()
"""The table query parameters, from the typed record (`query.TableQuery`)."""


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
