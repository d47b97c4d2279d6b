"""Operational routes, always open: `/v2/health/live`, `/v2/health/ready` and `/metrics`.

Liveness answers as soon as the process serves HTTP. Readiness answers 503 until the configured
presets are warm and again from SIGTERM on (draining), so a load balancer stops routing here while
in-flight requests finish.
"""

from __future__ import annotations

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from posenc.api.deps import State
from posenc.api.error_types import NOT_READY, responses
from posenc.api.errors import error_response
from posenc.api.jsonio import json_response

router = APIRouter(tags=["health"])


@router.get("/v2/health/live", summary="Liveness (Open Inference Protocol)")
async def live() -> Response:
    """200 while the process serves HTTP."""
    return json_response({"live": True})


@router.get(
    "/v2/health/ready",
    summary="Readiness (Open Inference Protocol)",
    responses=responses(NOT_READY),
)
async def ready(state: State) -> Response:
    """200 once warm-up is done; 503 before that and while draining after SIGTERM."""
    lifecycle = state.lifecycle
    if state.is_ready():
        return json_response({"ready": True})
    reason = "draining" if lifecycle.draining else "warming up"
    return error_response(
        NOT_READY.status,
        NOT_READY.name,
        f"not ready: {reason}",
        {"draining": lifecycle.draining, "warm": lifecycle.ready},
        {"Retry-After": "1"},
    )


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(state: State) -> Response:
    """The app's registry in the Prometheus text format."""
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
