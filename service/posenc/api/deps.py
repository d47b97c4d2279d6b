"""The FastAPI dependencies of the routes: what a request needs from the app serving it.

- `State` (`Annotated[AppState, Depends(get_state)]`): this app's `AppState` (settings, metrics,
  presets, readiness, key index, cache and table store) for routes FastAPI dispatches;
- `app_state(request)`: the same for the hot routes, which take no dependencies
  (`posenc.api.hot` serves them without FastAPI's dependency solving);
- `oip_context(request)`: the `OipContext` the `/v2` models get from the service (its cache,
  table store, limits and readiness), 503 while the app starts or stops; `context_for(state)`
  the same from the state alone (the gRPC service's way in).

`oip_context` adds one counter to the app's metrics registry, `posenc_v2_infer_total{model,
source}`: where the rows of each inference came from (`hit`, `miss`, `coalesced`: the cached
table; `computed`: rows computed for the asked positions).
"""

from __future__ import annotations

from typing import Annotated
from weakref import WeakKeyDictionary

from fastapi import Depends, Request
from prometheus_client import CollectorRegistry, Counter

from posenc.api.oip.context import GRPC_OUTPUT_COPIES, HTTP_OUTPUT_COPIES, OipContext
from posenc.api.state import AppState

_COUNTERS: WeakKeyDictionary[CollectorRegistry, Counter] = WeakKeyDictionary()


def app_state(request: Request) -> AppState:
    """This app's `AppState`."""
    state: AppState = request.app.state.posenc
    return state


async def get_state(request: Request) -> AppState:
    """Dependency: this app's `AppState` (async: FastAPI runs sync dependencies in threads)."""
    return app_state(request)


State = Annotated[AppState, Depends(get_state)]


def _infer_counter(registry: CollectorRegistry) -> Counter:
    counter = _COUNTERS.get(registry)
    if counter is None:
        counter = Counter(
            "posenc_v2_infer",
            "/v2 inferences by model and where their rows came from",
            ("model", "source"),
            registry=registry,
        )
        _COUNTERS[registry] = counter
    return counter


def context_for(state: AppState, grpc: bool = False) -> OipContext:
    """The `OipContext` of the app whose state is `state` (503 while it starts or stops): what
    its `/v2` routes and (`grpc`: with gRPC's output copies charged, no JSON) its gRPC service
    (`posenc.api.grpc`) hand the models."""
    cache = state.require_cache()
    lifecycle = state.lifecycle
    counter = _infer_counter(state.metrics.registry)
    settings = state.settings
    return OipContext(
        cache=cache,
        tables=state.require_tables(),
        max_response_bytes=settings.max_response_bytes,
        json_max_elements=settings.json_max_elements,
        max_body_bytes=settings.max_infer_body_bytes,
        ready=lambda: lifecycle.ready and not lifecycle.draining,
        observe=lambda model, source: counter.labels(model, source).inc(),
        output_copies=GRPC_OUTPUT_COPIES if grpc else HTTP_OUTPUT_COPIES,
        json_outputs=not grpc,
        stats=state.stats,
        steps=None if grpc else state.steps,
    )


def oip_context(request: Request) -> OipContext:
    """The `OipContext` of the app serving `request` (503 while it starts or stops)."""
    return context_for(app_state(request))
