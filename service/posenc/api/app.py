"""The app factory: `create_app(settings) -> FastAPI`.

Everything stateful is built per app: the metrics registry, the key index and the presets in
`create_app`; the device, the cache, the table store (uploaded weight tables) and, with `grpc_port`,
the gRPC service (`posenc.api.grpc`) in the lifespan (never at import), which then warms the
configured presets in the background and flips readiness when done. Routers are composed here, in
one place, from the route modules (`posenc.api.routes`: `/v1`, `/v2`, health and metrics, and the
explorer page at `/ui`, the API documentation at `/docs` and `/redoc`, its bundles served
offline); one pure ASGI pass (`middleware.Gate`) counts every request in the metrics, guards
`/v1` and `/v2/models` with the API keys (and `/metrics` and the OpenAPI pages with
`protect_docs_and_metrics`), caps request bodies per route (`caps.body_limits`: the caps the
routes declare, `@body_cap`) and answers HEAD; `api/openapi.py` completes the OpenAPI document;
`GET /` redirects to the explorer (`/ui`); with `cors_origins`, Starlette's `CORSMiddleware` is
the outermost layer (a browser's preflight never meets the key check). Behind `root_path`, every
middleware matches the path without the prefix (`starlette._utils.get_route_path`).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from posenc import __version__
from posenc.api.auth import DOCS_PREFIXES, PROTECTED_PREFIXES
from posenc.api.caps import body_limits
from posenc.api.deps import oip_context
from posenc.api.door import Door
from posenc.api.errors import install_error_handlers
from posenc.api.grpc import GrpcServer
from posenc.api.hot import HotRoutes, hot_routes
from posenc.api.metrics import Metrics
from posenc.api.middleware import Gate, GateRules
from posenc.api.oip.steps import STEP_TEMPLATES, StepTemplates
from posenc.api.openapi import install_openapi
from posenc.api.routes import (
    check,
    docs,
    health,
    kinds,
    mrope,
    oip,
    onnx,
    presets,
    resolve,
    tables,
    ui,
    uploads,
    version,
)
from posenc.api.serving.prepared import PREPARED_SHAPES, PreparedAnswers
from posenc.api.settings import Settings
from posenc.api.state import AppState, KeyIndex, Lifecycle, StartupError
from posenc.encodings import fused
from posenc.encodings.weights import TableStore
from posenc.presets import Preset, builtin_presets, read_user_presets, register_user_presets
from posenc.runtime import InFlightBudget, TableCache, describe, resolve_device

log = logging.getLogger("posenc.api")


CORS_EXPOSED = [
    "ETag",
    "Retry-After",
    "Content-Disposition",
    "Inference-Header-Content-Length",
    "WWW-Authenticate",
]
"""Response headers a cross-origin page may read (CORS `Access-Control-Expose-Headers`)."""


def app_presets(settings: Settings) -> dict[str, Preset]:
    """The presets an app serves: the built-in ones, then those of `presets_dir`; `PresetError`
    (one line naming the file) for a user preset that cannot be served."""
    presets = dict(builtin_presets())
    if settings.presets_dir:
        presets.update(read_user_presets(Path(settings.presets_dir)))
    return presets


def warm_list(settings: Settings, names: list[str]) -> list[str]:
    """The presets of `names` that `settings.warm_presets` asks to warm; ValueError naming each
    unknown one (with the closest known name) otherwise."""
    wanted = settings.warm_presets
    if wanted == ["all"]:
        return names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, names, n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(
            f"warm_presets names unknown presets {', '.join(hints)}; known: {', '.join(names)} "
            "or 'all'"
        )
    return list(wanted)


async def warm(state: AppState, names: list[str]) -> None:
    """Compute every part of the named presets, then mark the server ready."""
    cache = state.require_cache()
    for name in names:
        for part in state.presets[name].parts:
            size = part.spec.output_bytes()
            if size > state.settings.max_response_bytes:
                msg = f"preset {name}/{part.name}: {size} bytes exceed max_response_bytes"
                log.warning("skipping warm-up of %s", msg)
                state.lifecycle.warm_errors.append(msg)
                continue
            try:
                entry, _ = await cache.get(part.spec, part.key)
            except Exception as err:
                log.exception("warm-up of preset %s/%s failed", name, part.name)
                state.lifecycle.warm_errors.append(f"preset {name}/{part.name}: {err}")
                continue
            log.info(
                "warmed %s/%s (%d bytes on %s in %.3fs)",
                name,
                part.name,
                entry.table_bytes,
                entry.device,
                entry.compute_seconds,
            )
    state.lifecycle.ready = True
    log.info("ready")


class StartupFailures:
    """ASGI: a start-up the lifespan failed for a reason it stated in one line
    (`Lifecycle.startup_error`, from a `StartupError`: a gRPC port in use) reaches the server as
    that line. uvicorn logs the message of `lifespan.startup.failed` as sent, and Starlette sends
    the traceback of the lifespan: some 60 lines through every router's merged lifespan for a
    busy port, where uvicorn's own busy port is one line. Other failures keep their traceback;
    requests pass straight through."""

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle) -> None:
        self.app = app
        self.lifecycle = lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def stated(message: Message) -> None:
            error = self.lifecycle.startup_error
            if message["type"] == "lifespan.startup.failed" and error is not None:
                message = {**message, "message": error}
            await send(message)

        await self.app(scope, receive, stated)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Resolve the device, build the cache and the table store, start the gRPC service when
    `grpc_port` is set, warm presets in the background; tear down on exit."""
    state: AppState = app.state.posenc
    settings = state.settings
    device = resolve_device(settings.device)
    state.metrics.set_build(str(device))
    cache = TableCache(
        max_bytes=settings.cache_bytes,
        device=device,
        max_concurrent=settings.max_concurrent_computations,
        retry_after=settings.retry_after_seconds,
        on_compute=state.metrics.observe_compute,
        budget=state.budget,
        max_alone_bytes=settings.max_response_bytes,
    )
    collector = state.metrics.watch(cache)
    state.device, state.cache = device, cache
    state.tables = TableStore(settings.table_store_bytes)
    log.info(
        "posenc %s on %s, cache budget %d bytes, in-flight budget %d bytes",
        __version__,
        describe(device),
        cache.max_bytes,
        settings.in_flight_bytes,
    )
    grpc_server = None
    if settings.grpc_port is not None:
        grpc_server = GrpcServer(state)
        try:
            state.grpc_port = await grpc_server.start(settings.host, settings.grpc_port)
        except StartupError as exc:
            state.lifecycle.startup_error = str(exc)
            state.cache = state.tables = None
            state.metrics.registry.unregister(collector)
            cache.close()
            raise
    warming = asyncio.create_task(warm(state, warm_list(settings, list(state.presets))))
    try:
        yield
    finally:
        if grpc_server is not None:
            # HTTP has stopped accepting and finished (uvicorn's graceful shutdown): gRPC now
            # refuses new calls and gives those in flight the same grace
            await grpc_server.stop(settings.grace_seconds)
            state.grpc_port = None
        warming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await warming
        state.lifecycle.ready = False
        state.cache = None
        state.tables = None
        state.metrics.registry.unregister(collector)
        cache.close()


def create_app(settings: Settings | None = None) -> FastAPI:
    """A posenc FastAPI app for `settings` (read from the environment when omitted)."""
    settings = settings or Settings()
    curated = app_presets(settings)
    # a user preset's name keeps its meaning for the process (the spec language reads presets
    # through `load_presets`, its results memoised by request)
    register_user_presets({n: p for n, p in curated.items() if n not in builtin_presets()})
    warm_list(settings, list(curated))  # fail fast on unknown names
    metrics = Metrics()
    index = KeyIndex(settings.known_keys)
    for preset in curated.values():
        for part in preset.parts:
            index.pin(part.key, part.spec)
    state = AppState(settings, metrics, curated, Lifecycle(), index)
    fused.ENABLED = settings.fused_kernels
    state.prepared = PreparedAnswers(PREPARED_SHAPES if settings.prepared_answers else 0)
    state.steps = StepTemplates(STEP_TEMPLATES if settings.prepared_answers else 0)
    # one in-flight budget for the app's life: request bodies (`middleware.Gate`), tables
    # computed, answers being sent, over HTTP and gRPC
    state.budget = InFlightBudget(
        settings.in_flight_bytes, settings.retry_after_seconds, settings.in_flight_bytes_per_peer
    )

    app = FastAPI(
        title="posenc",
        version=__version__,
        summary="Exact position tables (RoPE, ALiBi, sinusoidal, T5 buckets), cached and served.",
        lifespan=lifespan,
        # /docs and /redoc are served offline by posenc.api.routes.docs
        docs_url=None,
        redoc_url=None,
        telemetry=None if settings.otel else {"tracing": False, "metrics": False, "logs": False},
    )
    app.state.posenc = state
    install_error_handlers(app)

    @app.get("/", include_in_schema=False)
    async def front(request: Request) -> RedirectResponse:
        """The explorer page: `/ui` (under the proxy's prefix, `root_path`)."""
        return RedirectResponse(request.scope.get("root_path", "") + "/ui", status_code=307)

    # routes are matched router by router, in this order: the hot ones first
    oip_server, oip_models = oip.build_router(oip_context)
    routers = (
        tables.router,
        health.router,
        uploads.router,
        oip_models,
        oip_server,
        kinds.router,
        presets.router,
        resolve.router,
        mrope.router,
        onnx.router,
        check.router,
        version.router,
        ui.router,
        docs.router,
    )
    for router in routers:
        app.include_router(router)
    # the last added is the outermost: the gate's metrics see every request, refused ones
    # included (api/middleware.py: metrics, API keys, body caps, HEAD in one pass)
    keys = [k.get_secret_value() for k in settings.api_keys]
    guarded = PROTECTED_PREFIXES + (DOCS_PREFIXES if settings.protect_docs_and_metrics else ())
    rules = GateRules(
        metrics=metrics,
        max_bytes=settings.max_body_bytes,
        routes=body_limits(settings, routers),
        budget=state.budget,
        keys=keys,
        prefixes=guarded,
    )
    if settings.hot_routes:
        hot = hot_routes(tables.router, oip_models)
        app.add_middleware(HotRoutes, routes=hot)
        if settings.prepared_answers and not settings.cors_origins:
            # cache hits answered by the server as their requests complete (api/door.py; CORS
            # edits every answer, with an `Origin` or without)
            state.door = Door(state, rules, hot)
    app.add_middleware(Gate, rules=rules)
    install_openapi(app, settings, guarded)
    app.add_middleware(StartupFailures, lifecycle=state.lifecycle)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "HEAD", "POST", "DELETE", "OPTIONS"],
            allow_headers=["*"],
            expose_headers=CORS_EXPOSED,
            max_age=600,
        )
    return app
