"""The app's one pure ASGI middleware pass, `Gate`: metrics, API keys, body caps and budget,
the client's share of the budget, and HEAD.

Each of these was its own middleware; every layer costs a coroutine call and a wrapper per
request, which is most of what a cache hit costs over the framework (`docs/benchmarks.md`,
section 9). `Gate` does them in one pass, in the order the layers had (outermost first):

1. metrics (`metrics.Metrics`): the in-flight gauge, then the request counted under its route
   template (`scope["route"]`, `<unmatched>` when routing found none) with the status it was
   answered with (500 when none was sent) and its latency, refused requests included;
2. API keys (`auth.refusal`): a request to a guarded path (`prefixes`) without one of `keys` as
   its bearer token is answered 401, nothing else done;
3. the body cap of the request's path (`routes`: the first full match of a pattern, else
   `max_bytes`): 413 (the error contract) when `Content-Length` exceeds it, before reading any of
   the body, and `ApiError` 413 (answered by the error handlers) raised from `receive` when a
   body streamed without one grows past it, so a route never holds more than its cap;
4. HEAD (`serving.head.HeadRequests`): a HEAD request runs as its GET, without the body.

Bodies are also charged to the in-flight budget (`runtime.budget`, `budget`): `BODY_COPIES` times
the declared `Content-Length` before any of the body is read (503 `overloaded` with `Retry-After`
when it does not fit: nothing read), and, for a body without one, as it arrives, in steps of at
least `BODY_STEP` (`Overloaded` raised from `receive`, answered 503 by the error handlers); the
charge is held until the request's response is sent. A body's charge is capped at the whole
budget, as a computation's is: a body larger than that is still taken, alone. So however many
clients upload at once, the bodies held stay inside the budget.

Every request past the key check is served inside `runtime.for_peer(host)` (the client's address,
from the ASGI scope): the charges it makes, its body's and those of the routes it reaches
(computations, bodies being sent), count toward its peer's share of the budget
(`in_flight_bytes_per_peer`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from starlette._utils import get_route_path
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from posenc.api.auth import PROTECTED_PREFIXES, refusal
from posenc.api.error_types import BODY_TOO_LARGE
from posenc.api.errors import ApiError, error_response, to_response
from posenc.api.metrics import Metrics
from posenc.api.serving.head import HeadRequests
from posenc.runtime import InFlightBudget, Lease, Overloaded, for_peer

BODY_COPIES = 2
"""What a request body is charged, in multiples of its bytes: the chunks as received and the
joined body a route reads."""

BODY_STEP = 1 << 20
"""A body without `Content-Length` is charged as it arrives, at least this many bytes at a time."""

RouteLimit = tuple[re.Pattern[str], int]
"""A path pattern (matched in full) and the body cap of the requests to it."""


class GateRules:
    """What `Gate` enforces, shared with the server's ready answers (`api/door.py`, which take
    only requests these rules let through, and leave every other to `Gate`): the metrics, the
    body caps (`max_bytes`, and per path `routes`), the in-flight `budget`, and the API `keys`
    guarding the paths under `prefixes`."""

    def __init__(
        self,
        metrics: Metrics,
        max_bytes: int,
        routes: Sequence[RouteLimit] = (),
        budget: InFlightBudget | None = None,
        keys: Sequence[str] = (),
        prefixes: tuple[str, ...] = PROTECTED_PREFIXES,
    ) -> None:
        self.metrics = metrics
        self.max_bytes = max_bytes
        self.routes = tuple(routes)
        self.budget = budget
        self.keys = [k.encode() for k in keys]
        self.prefixes = prefixes

    def limit_for(self, path: str) -> int:
        """The body cap of a request to `path`."""
        for pattern, limit in self.routes:
            if pattern.fullmatch(path):
                return limit
        return self.max_bytes

    def refusal(self, scope: Scope, path: str) -> ASGIApp | None:
        """The 401 answer to a request (ASGI `scope`) to `path` without a valid key, else None."""
        return refusal(scope, self.keys) if self.keys and path.startswith(self.prefixes) else None


class Gate:
    """Metrics, API keys, body caps and budget, the peer's share and HEAD in one pass (the
    module docstring), under `rules`."""

    def __init__(self, app: ASGIApp, rules: GateRules) -> None:
        self.app = app
        self.head = HeadRequests(app)
        self.rules = rules
        self.tally = rules.metrics.tally
        self.budget = rules.budget

    @staticmethod
    def _reject(size: int, limit: int) -> ASGIApp:
        return error_response(
            BODY_TOO_LARGE.status,
            BODY_TOO_LARGE.name,
            f"request body of {size} bytes exceeds the limit of {limit} bytes",
            {"max_bytes": limit, "size_bytes": size},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tally = self.tally
        status = 500
        start = time.perf_counter()
        tally.in_flight += 1

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            path = get_route_path(scope)
            refused = self.rules.refusal(scope, path) if self.rules.keys else None
            if refused is not None:
                await refused(scope, receive, send_status)
            else:
                client = scope.get("client")
                with for_peer(str(client[0]) if client else ""):
                    await self._limited(scope, receive, send_status, path)
        finally:
            route = scope.get("route")
            template = route.path if isinstance(route, Route) else "<unmatched>"
            tally.in_flight -= 1
            tally.request(scope["method"], template, status, time.perf_counter() - start)

    async def _limited(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        limit = self.rules.limit_for(path)
        budget = self.budget
        leases: list[Lease] = []
        charged = 0
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit:
                    await self._reject(declared, limit)(scope, receive, send)
                    return
                if budget is not None and declared > 0:
                    charged = min(BODY_COPIES * declared, budget.max_bytes)
                    try:
                        leases.append(budget.acquire(object(), charged))
                    except Overloaded as exc:
                        await to_response(exc)(scope, receive, send)
                        return
                break
        received = 0

        async def limited_receive() -> Message:
            nonlocal received, charged
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise ApiError(
                        BODY_TOO_LARGE,
                        f"request body exceeds the limit of {limit} bytes",
                        {"max_bytes": limit, "size_bytes": None},
                    )
                cap = min(BODY_COPIES * limit, budget.max_bytes) if budget is not None else 0
                if budget is not None and min(BODY_COPIES * received, cap) > charged:
                    step = min(max(BODY_COPIES * received - charged, BODY_STEP), cap - charged)
                    leases.append(budget.acquire(object(), step))
                    charged += step
            return message

        app = self.head if scope["method"] == "HEAD" else self.app
        try:
            await app(scope, limited_receive, send)
        finally:
            for lease in leases:
                lease.release()
