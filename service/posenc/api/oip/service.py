"""Glue to the running app: the `OipContext` of a request, built from the app's `AppState`.

The cache, the table store, limits and readiness are the service's own (`posenc.api.state`); the
only addition is one counter on the app's metrics registry, `posenc_v2_infer_total{model,
source}`, saying where the rows of each inference came from (`hit`, `miss`, `coalesced`: the
cached table; `computed`: rows computed for the asked positions).
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from fastapi import Request
from prometheus_client import CollectorRegistry, Counter

from posenc.api.oip.context import OipContext
from posenc.api.state import AppState

_COUNTERS: WeakKeyDictionary[CollectorRegistry, Counter] = WeakKeyDictionary()


def _counter(registry: CollectorRegistry) -> Counter:
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


def app_context(request: Request) -> OipContext:
    """The `OipContext` of the app serving `request` (503 while it starts or stops)."""
    state: AppState = request.app.state.posenc
    cache = state.require_cache()
    life = state.lifecycle
    counter = _counter(state.metrics.registry)
    settings = state.settings
    return OipContext(
        cache=cache,
        tables=state.require_tables(),
        max_response_bytes=settings.max_response_bytes,
        json_max_elements=settings.json_max_elements,
        max_body_bytes=settings.max_infer_body_bytes,
        ready=lambda: life.ready and not life.draining,
        observe=lambda model, source: counter.labels(model, source).inc(),
    )
