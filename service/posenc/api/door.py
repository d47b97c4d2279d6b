"""The door: a cache hit answered by the server as its request completes, without an ASGI task.

After the hot routes (`api/hot.py`), the prepared answers (`serving.prepared`) and the decode-step
templates (`oip.steps`), a small cache hit still went through everything an ASGI request costs:
uvicorn's task and its `run_asgi`, FastAPI's and Starlette's layers, `Gate`, the dispatcher, the
endpoint and two `send` calls, each a coroutine, and a turn of the event loop before any of it
runs. Its answer was ready all along. So posenc's protocol (`api/server.py`, `GuardedProtocol`)
asks the `Door` first, as a request's last byte is parsed: when the request is one the door may
answer and its answer is ready, the protocol writes it at once (one socket write) and no task is
made; otherwise (and for every request the door declines) the request goes to the app as before,
which answers it the way it always has.

The door answers only what the app would answer the same way, with the same side effects:

- a request to a hot route marked `answered_by` (`GET /v1/tables/{key}`, `POST /v1/tables`,
  `POST /v2/models/{model}[/versions/{version}]/infer`), whose `ReadyAnswer` (the route's own
  code, shared with its endpoint) finds a ready answer (a prepared hit, a templated decode step)
  of at most the bytes the protocol writes at once (`COALESCE_BYTES`: nothing to pace) whose
  in-flight charges fit (`InFlightBudget.try_acquire`: a refusal is left to the route, counted
  once);
- GET or POST only (HEAD, OPTIONS: the app), no `Transfer-Encoding`, `Expect` nor proxy headers
  (`X-Forwarded-For`/`-Proto`: uvicorn's proxy middleware rewrites the client), a body within
  its path's cap and charged to the budget as `Gate` charges it (`BODY_COPIES`), with a valid
  API key where keys guard the path (`GateRules`, the rules `Gate` enforces);
- counted in the metrics as `Gate` counts it (the route's template, 200, the latency; a decode
  step also as the route counts it: the cache hit, `posenc_v2_infer_total`, Triton's
  statistics), its charges made for the client's peer (`runtime.for_peer`) and held until the
  answer is written.

There is no door with CORS on (`cors_origins`): Starlette's CORS middleware edits every answer
(`Vary: Origin` even to a request without an `Origin`), so the app answers them all.

What the protocol checks itself (the connection's side): the app it would run is the plain app
(not a refusal over the connection cap or uvicorn's concurrency limit), the connection is kept
alive, no access line is logged, and the transport is not paused. A request's task waits for its
last byte in the read its headers end (uvicorn's task would not have run before the end of that
read anyway); a request whose body is still to come then starts its task as uvicorn would have,
unless the door awaits it (`Door.awaits`: a POST to one of its routes declaring a body of at
most 4 KiB within its cap, which many clients, httpx among them, write apart from the headers),
which then waits for its body in the later reads, the body timeout running, as the route would
have.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from fastapi.routing import APIRoute
from starlette._utils import get_route_path
from starlette.types import Scope

from posenc.api.hot import READY, ReadyAnswer
from posenc.api.middleware import BODY_COPIES, GateRules
from posenc.api.serving.body import ReadyResponse
from posenc.api.state import AppState
from posenc.runtime import for_peer

DECLINED = frozenset((b"transfer-encoding", b"expect", b"x-forwarded-for", b"x-forwarded-proto"))
"""Request headers whose request the app answers (module docstring)."""

AWAITED_BYTES = 4 << 10
"""The largest body the door awaits (`Door.awaits`): a spec, a decode step's header and
positions. Held in the connection until the answer or the task (it is charged by whichever
answers), it stays far below the header bytes a connection may send (`max_header_bytes`)."""

Write = Callable[[ReadyResponse], bool]
"""Writes a ready answer to the connection; False when it cannot (nothing written)."""


class Door:
    """Ready answers to the requests of `routes` (those marked `answered_by`), under `rules`
    (module docstring)."""

    def __init__(
        self,
        state: AppState,
        rules: GateRules,
        routes: Sequence[APIRoute],
    ) -> None:
        self.state = state
        self.rules = rules
        self.routes: tuple[tuple[APIRoute, ReadyAnswer], ...] = tuple(
            (route, getattr(route.endpoint, READY))
            for route in routes
            if getattr(route.endpoint, READY, None) is not None
        )
        self.tally = rules.metrics.tally

    def route(self, method: str, path: str) -> tuple[APIRoute, ReadyAnswer] | None:
        """The route (and its ready answer) of a request, if the door has one."""
        for route, ready_answer in self.routes:
            if method in (route.methods or ()) and route.path_regex.match(path) is not None:
                return route, ready_answer
        return None

    def awaits(self, scope: Scope) -> bool:
        """Whether a request whose headers are in and whose body is not (yet: many clients write
        them apart) is one the door may answer once it is: a POST to one of its routes
        declaring a body of at most `AWAITED_BYTES` and its path's cap, with a valid API key
        where keys guard the path and none of the headers it declines. The protocol then starts
        no task for it before its last byte (a route would only wait for the body too; what it
        answers without reading it, a 413 over the cap, a 401, an unknown path, is not
        awaited)."""
        if scope["method"] != "POST":
            return False
        declared = -1
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = int(value) if value.isdigit() else -1
                break
        return 0 <= declared <= AWAITED_BYTES and self._admitted(scope, declared) is not None

    def _admitted(self, scope: Scope, size: int) -> tuple[APIRoute, ReadyAnswer] | None:
        """The route (and its ready answer) of a request the door may take, with a body of
        `size` bytes: GET or POST to one of its routes, none of the headers it declines, the
        body within its path's cap (else the app's 413), a valid key where keys guard the path
        (else the app's 401); else None."""
        method = scope["method"]
        if method != "GET" and method != "POST":
            return None
        for name, _ in scope["headers"]:
            if name in DECLINED:
                return None
        path = get_route_path(scope)
        found = self.route(method, path)
        rules = self.rules
        if found is None or size > rules.limit_for(path):
            return None
        if rules.keys and rules.refusal(scope, path) is not None:
            return None
        return found

    def answer(self, scope: Scope, body: bytes | bytearray, write: Write, max_bytes: int) -> bool:
        """Answer the request (ASGI `scope`, its whole `body`) with `write` when its answer is
        ready and at most `max_bytes`, counted and its charges held while it is written; False
        when the door declines it (nothing done)."""
        found = self._admitted(scope, len(body))
        if found is None:
            return False
        route, ready_answer = found
        start = time.perf_counter()
        client = scope.get("client")
        budget = self.rules.budget
        with for_peer(str(client[0]) if client else ""):
            lease = None
            if body and budget is not None:  # as `Gate` charges a declared body
                lease = budget.try_acquire(object(), min(BODY_COPIES * len(body), budget.max_bytes))
                if lease is None:
                    return False
            ready = ready_answer(self.state, scope, body, max_bytes)
        if ready is None:
            if lease is not None:
                lease.release()
            return False
        if lease is not None:
            ready.leases.append(lease)
        try:
            if not write(ready):
                return False
        finally:
            ready.release()
        self.tally.request(scope["method"], route.path, 200, time.perf_counter() - start)
        return True
