"""`GET /v1/version`: posenc's release and the reference releases its tables are proven equal to
(`posenc.verified`: the releases the suite's lock pins and the reference tests compare against)."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

import posenc
from posenc.api.jsonio import json_response
from posenc.verified import VERIFIED_AGAINST

router = APIRouter(prefix="/v1", tags=["catalog"])


@router.get(
    "/version", summary="posenc's version and the reference releases it is verified against"
)
async def version() -> Response:
    """`{"posenc": "0.1.0", "verified_against": {"transformers": "5.24.0", ...}}`."""
    return json_response({"posenc": posenc.__version__, "verified_against": dict(VERIFIED_AGAINST)})
