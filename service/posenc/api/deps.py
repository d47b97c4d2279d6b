"""The FastAPI dependencies of the routes: what a request needs from the app serving it.

- `State` (`Annotated[AppState, Depends(get_state)]`): this app's `AppState` (settings, metrics,
  presets, readiness, key index, cache and table store) for routes FastAPI dispatches;
- `app_state(request)`: the same for the hot routes, which take no dependencies
  (`posenc.api.hot` serves them without FastAPI's dependency solving);
- `oip_context(request)`: the `OipContext` the `/v2` models get from the service (its cache,
  table store, limits and readiness), 503 while the app starts or stops; `context_for(state)`
  the same from the state alone (the gRPC service's way in).

Each inference is counted in the app's metrics (`Metrics.observe_infer`,
`posenc_v2_infer_total{model, source}`): where its rows came from (`hit`, `miss`, `coalesced`: the
cached table; `computed`: rows computed for the asked positions).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from posenc.api.oip.context import GRPC_OUTPUT_COPIES, HTTP_OUTPUT_COPIES, OipContext
from posenc.api.state import AppState


def app_state(request: Request) -> AppState:
    """This app's `AppState`."""
    state: AppState = request.app.state.posenc
    return state


async def get_state(request: Request) -> AppState:
    """Dependency: this app's `AppState` (async: FastAPI runs sync dependencies in threads)."""
    return app_state(request)


State = Annotated[AppState, Depends(get_state)]


def context_for(state: AppState, grpc: bool = False) -> OipContext:
    """The `OipContext` of the app whose state is `state` (503 while it starts or stops): what
    its `/v2` routes and (`grpc`: with gRPC's output copies charged, no JSON) its gRPC service
    (`posenc.api.grpc`) hand the models."""
    cache = state.require_cache()
    lifecycle = state.lifecycle
    settings = state.settings
    return OipContext(
        cache=cache,
        tables=state.require_tables(),
        max_response_bytes=settings.max_response_bytes,
        json_max_elements=settings.json_max_elements,
        max_body_bytes=settings.max_infer_body_bytes,
        ready=lambda: lifecycle.ready and not lifecycle.draining,
        observe=state.metrics.observe_infer,
        output_copies=GRPC_OUTPUT_COPIES if grpc else HTTP_OUTPUT_COPIES,
        json_outputs=not grpc,
        stats=state.stats,
        steps=state.steps,
    )


def oip_context(request: Request) -> OipContext:
    """The `OipContext` of the app serving `request` (503 while it starts or stops)."""
    return context_for(app_state(request))
