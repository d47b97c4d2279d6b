"""The hot-route dispatcher: cache hits without FastAPI's per-request machinery.

A small cache hit spends most of its time outside posenc: FastAPI 0.165 matches the path through
its included-router contexts (every router, then every route), solves the (empty) dependency set
and opens two `AsyncExitStack`s per request, about half of a small hit in process
(`docs/benchmarks.md`, section 2, has the figures). `HotRoutes` is a pure ASGI middleware, the
innermost of the app's own, that matches the few routes every client calls per request
(`GET /v1/tables/{key}`, `POST /v1/tables`, `POST /v2/models/{model}[/versions/{version}]/infer`)
itself and calls their endpoints directly; every other request goes on to FastAPI.

The routes stay declared once, as FastAPI routes (they are what OpenAPI documents and what the
dispatcher reads: path regex, methods, endpoint), each marked hot on itself (`@hot` on its
endpoint; `hot_routes` collects the marked ones), and the dispatcher only accepts routes that
need nothing from FastAPI: no dependencies, an endpoint taking the `Request` and the path
parameters as strings, returning a `Response`. The route's metrics template (`scope["route"]`),
path parameters and the error contract (`errors.to_response` for any exception raised before a
response exists) are what FastAPI would give them; the request-body caps and API keys are
enforced by the outer middlewares as for every route.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette._utils import get_route_path
from starlette.convertors import StringConvertor
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from posenc.api.errors import to_response
from posenc.api.serving.body import ReadyResponse

if TYPE_CHECKING:
    from posenc.api.state import AppState

Endpoint = Callable[..., Awaitable[Response]]
E = TypeVar("E", bound=Endpoint)

HOT = "__posenc_hot__"
"""The attribute `hot` sets on an endpoint."""

READY = "__posenc_ready__"
"""The attribute `answered_by` sets on a hot endpoint: its `ReadyAnswer`."""

ReadyAnswer = Callable[["AppState", Scope, bytes | bytearray, int], ReadyResponse | None]
"""`(state, scope, body, max_bytes)` -> the route's answer to a request whose answer is ready
(a prepared cache hit) of at most `max_bytes` bytes, its charges taken; else None, and nothing
done that the route would then do again (counted, touched, refused): `api/door.py`."""


def hot(endpoint: E) -> E:
    """Mark `endpoint` as a hot route's: called once per table fetch or decode step, it is
    dispatched by `HotRoutes` without FastAPI's per-request machinery (so it must take
    `(request, <path parameters>)` and no dependencies: `_arguments` checks)."""
    setattr(endpoint, HOT, True)
    return endpoint


def answered_by(ready: ReadyAnswer) -> Callable[[E], E]:
    """Mark a hot endpoint's ready answers (`ready`: the same answer the endpoint gives, from
    the same code) as given by the server as the request completes (`api/door.py`)."""

    def mark(endpoint: E) -> E:
        setattr(endpoint, READY, ready)
        return endpoint

    return mark


def hot_routes(*routers: APIRouter) -> list[APIRoute]:
    """The routes of `routers` whose endpoint is marked `hot`."""
    return [
        route
        for router in routers
        for route in router.routes
        if isinstance(route, APIRoute) and getattr(route.endpoint, HOT, False)
    ]


def _arguments(route: APIRoute) -> tuple[str, ...]:
    """The path parameters the endpoint takes after `request`; refuses a route that the
    dispatcher would serve differently from FastAPI."""
    if route.dependencies or route.dependant.dependencies:
        raise ValueError(f"hot route {route.path} has dependencies; FastAPI must serve it")
    if not inspect.iscoroutinefunction(route.endpoint):
        raise ValueError(f"hot route {route.path}: the endpoint must be `async def`")
    names = list(inspect.signature(route.endpoint).parameters)
    params = set(route.param_convertors)
    if not names or names[0] != "request" or set(names[1:]) - params:
        raise ValueError(
            f"hot route {route.path}: the endpoint must take (request, <path parameters>), "
            f"takes {names}"
        )
    if not all(isinstance(c, StringConvertor) for c in route.param_convertors.values()):
        raise ValueError(f"hot route {route.path}: path parameters must be plain strings")
    return tuple(names[1:])


class HotRoutes:
    """Serve `routes` (FastAPI routes, checked by `_arguments`) directly; pass the rest to
    `app`."""

    def __init__(self, app: ASGIApp, routes: Sequence[APIRoute]) -> None:
        self.app = app
        self.routes = tuple((route, _arguments(route)) for route in routes)

    def match(self, scope: Scope) -> tuple[APIRoute, tuple[str, ...], dict[str, Any]] | None:
        """The route, its endpoint's arguments and the path parameters of a request it serves,
        else None."""
        path = get_route_path(scope)
        method = scope["method"]
        for route, arguments in self.routes:
            found = route.path_regex.match(path)
            if found is not None and method in (route.methods or ()):
                return route, arguments, found.groupdict()
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        matched = self.match(scope)
        if matched is None:
            await self.app(scope, receive, send)
            return
        route, arguments, params = matched
        scope["route"] = route
        scope["endpoint"] = route.endpoint
        scope["path_params"] = params
        request = Request(scope, receive, send)
        endpoint: Endpoint = route.endpoint
        try:
            response = await endpoint(request, **{name: params[name] for name in arguments})
        except Exception as exc:  # the error contract, as the app's exception handlers answer
            response = to_response(exc)
        await response(scope, receive, send)
