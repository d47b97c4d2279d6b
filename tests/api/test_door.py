"""The door (api/door.py): a ready cache hit answered by posenc's protocol as its request
completes, without an ASGI task, byte for byte what the app answers; every other request, and
every hit the door may not answer, is the app's.

Each request is fed to posenc's `GuardedProtocol` and to uvicorn's own `HttpToolsProtocol` over
the same app (uvicorn's protocol has no door: the app answers there), each writing to a
recording transport. "Answered at the door" is observed, not assumed: the response is complete
when `data_received` returns, and the protocol made no task.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from posenc.api.app import create_app
from posenc.api.door import AWAITED_BYTES
from posenc.api.server import COALESCE_BYTES, GuardedProtocol, server_config
from posenc.api.settings import Settings
from posenc.api.state import AppState
from posenc.runtime import for_peer
from tests.api.test_coalesced_writes import LARGE, SMALL, RecordingTransport, http, undated
from tests.api.test_v2_steps import step
from tests.conftest import start_server


@dataclass
class Answer:
    writes: list[bytes]
    at_door: bool
    """Complete when `data_received` returned, no task made."""

    @property
    def data(self) -> bytes:
        return b"".join(self.writes)


class Bench:
    """One app (lifespan started) and both protocols over it."""

    def __init__(self, app: FastAPI, settings: Settings) -> None:
        self.app = app
        # uvicorn's loggers are global, each config sets them up: posenc's last, as it serves
        self.plain = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        self.guarded = server_config(app, settings)
        for config in (self.guarded, self.plain):
            config.load()

    @property
    def state(self) -> AppState:
        state = self.app.state.posenc
        assert isinstance(state, AppState)
        return state

    async def send(
        self, raw: bytes | list[bytes], guarded: bool = True, responses: int = 1
    ) -> Answer:
        """The writes of the answer(s) to `raw` (one read, or one read per element) on a new
        connection of posenc's protocol (else uvicorn's)."""
        config = self.guarded if guarded else self.plain
        cls = GuardedProtocol if guarded else HttpToolsProtocol
        protocol = cls(config, ServerState(), {}, asyncio.get_running_loop())
        transport = RecordingTransport()
        protocol.connection_made(transport)
        reads = raw if isinstance(raw, list) else [raw]
        tasks = 0
        for read in reads:
            protocol.data_received(read)
            tasks += len(protocol.tasks)
        cycle = protocol.cycle
        at_door = tasks == 0 and cycle is not None and cycle.response_complete
        for _ in range(2000):
            cycle = protocol.cycle
            if cycle is not None and cycle.response_complete and not protocol.tasks:
                break
            await asyncio.sleep(0.005)
        else:
            raise AssertionError("no complete response")
        await asyncio.sleep(0)
        protocol.connection_lost(None)
        assert len(re.findall(rb"HTTP/1\.[01] \d{3} ", b"".join(transport.writes))) == responses
        return Answer(transport.writes, at_door)

    async def both(self, raw: bytes | list[bytes], responses: int = 1) -> Answer:
        """posenc's answer to `raw`, after checking it equals uvicorn's (the `date` aside)."""
        ours = await self.send(raw, responses=responses)
        theirs = await self.send(raw, guarded=False, responses=responses)
        assert undated(ours.data) == undated(theirs.data)
        return ours

    async def resolve(self, spec: dict[str, Any]) -> str:
        """The `GET` path of `spec`'s table, its answers to that GET and to the POST of `spec`
        cached and prepared (by the app)."""
        raw = http("POST", "/v1/tables", json.dumps(spec).encode())
        first = await self.send(raw)
        assert not first.at_door  # computed by the app
        key = re.search(rb"x-posenc-key: (\w+)", first.data)
        assert key is not None
        path = f"/v1/tables/{key.group(1).decode()}"
        assert not (await self.send(http("GET", path))).at_door  # its GET prepared
        return path


def with_bench(scenario: Callable[[Bench], Awaitable[None]], **settings_: Any) -> None:
    settings_.setdefault("log_level", "warning")
    settings = Settings(device="cpu", **settings_)
    app: FastAPI = create_app(settings)
    bench = Bench(app, settings)

    async def run() -> None:
        async with app.router.lifespan_context(app):
            await scenario(bench)

    asyncio.run(run())


def requests(bench: Bench, method: str, route: str, status: int) -> int:
    rows = bench.state.metrics.tally._requests
    row = rows.get((method, route, status))
    return int(row[0]) if row else 0


def test_ready_hits_are_answered_at_the_door_as_the_app_answers_them() -> None:
    async def scenario(bench: Bench) -> None:
        body = json.dumps(SMALL).encode()
        path = await bench.resolve(SMALL)
        counted = requests(bench, "GET", "/v1/tables/{key}", 200)
        for raw in (http("GET", path), http("POST", "/v1/tables", body)):
            answer = await bench.both(raw)
            assert answer.at_door
            assert b" 200 OK" in answer.writes[0]
            assert b"x-posenc-cache: hit" in answer.writes[0]
            assert len(answer.writes) == 1
        # counted as the app counts it: the route's template, 200 (uvicorn's protocol, the app,
        # counted the other)
        assert requests(bench, "GET", "/v1/tables/{key}", 200) == counted + 2
        # a bare key and an Accept the table has been asked with are shapes of their own: the
        # first of each is the app's, the next the door's
        for raw in (
            http("GET", path, headers={"accept": "application/x-npz"}),
            http("GET", path + "?format=npz"),
        ):
            assert not (await bench.send(raw)).at_door
            assert (await bench.both(raw)).at_door
        # nothing is held once the answers are written
        budget = bench.state.budget
        assert budget is not None
        assert budget.held == 0

    with_bench(scenario)


def test_what_the_door_may_not_answer_is_the_apps() -> None:
    async def scenario(bench: Bench) -> None:
        path = await bench.resolve(SMALL)
        etag = re.search(rb"etag: ([^\r]+)", (await bench.send(http("GET", path))).data)
        assert etag is not None
        chunked = (
            f"POST /v1/tables HTTP/1.1\r\nhost: test\r\ntransfer-encoding: chunked\r\n\r\n"
            f"{len(json.dumps(SMALL)):x}\r\n{json.dumps(SMALL)}\r\n0\r\n\r\n"
        ).encode()
        http10 = f"GET {path} HTTP/1.0\r\nhost: test\r\n\r\n".encode()
        for raw in (
            http("HEAD", path),
            http("GET", path, headers={"if-none-match": etag.group(1).decode()}),
            http("GET", path, headers={"range": "bytes=0-99"}),
            http("GET", path, headers={"x-forwarded-for": "10.1.2.3"}),
            http("GET", path, headers={"connection": "close"}),
            http10,
            chunked,
            http("GET", "/v1/tables/" + "0" * 64),  # unknown key: 404
            http("GET", "/v1/kinds"),  # not a hot route
        ):
            answer = await bench.both(raw)
            assert not answer.at_door, raw

    with_bench(scenario)


def test_a_small_body_written_apart_from_its_headers_is_awaited() -> None:
    async def scenario(bench: Bench) -> None:
        await bench.resolve(SMALL)
        raw = http("POST", "/v1/tables", json.dumps(SMALL).encode())
        head = raw.index(b"\r\n\r\n") + 4
        in_flight = bench.state.metrics.tally.in_flight
        for reads in (
            [raw[:head], raw[head:]],
            [raw[:-10], raw[-10:]],
            [raw[:head], raw[head:-5], raw[-5:]],
        ):
            answer = await bench.both(reads)
            assert answer.at_door
            assert b"x-posenc-cache: hit" in answer.writes[0]
            assert bench.state.metrics.tally.in_flight == in_flight
        step = v2_step([5])
        for _ in range(2):
            await bench.send(step)
        cut = step.index(b"\r\n\r\n") + 4
        assert (await bench.both([step[:cut], step[cut:]])).at_door
        # a client gone before its body is in: the awaited request goes to the app, which
        # reads the disconnect and counts its 400 as it would have with its task started early
        protocol = GuardedProtocol(bench.guarded, ServerState(), {}, asyncio.get_running_loop())
        protocol.connection_made(RecordingTransport())
        tally = bench.state.metrics.tally
        in_flight = tally.in_flight
        protocol.data_received(raw[:head] + raw[head : head + 10])
        assert protocol.pending is not None
        assert not protocol.tasks
        assert tally.in_flight == in_flight + 1  # in flight, as `Gate` counts it
        before = requests(bench, "POST", "/v1/tables", 400)
        protocol.connection_lost(None)
        assert len(protocol.tasks) == 1
        while protocol.tasks:
            await asyncio.sleep(0.005)
        assert requests(bench, "POST", "/v1/tables", 400) == before + 1
        assert tally.in_flight == in_flight
        # a request the door will not answer is not kept from the app: its task starts with
        # the read that ends its headers, as uvicorn starts it
        expect = http("POST", "/v1/tables", json.dumps(SMALL).encode(), {"expect": "100-continue"})
        big = http("POST", "/v1/tables", b" " * (AWAITED_BYTES + 1))
        for raw in (expect, big, http("POST", "/v1/nosuchroute", b"{}")):
            cut = raw.index(b"\r\n\r\n") + 4
            protocol = GuardedProtocol(bench.guarded, ServerState(), {}, asyncio.get_running_loop())
            protocol.connection_made(RecordingTransport())
            protocol.data_received(raw[:cut])
            assert protocol.pending is None, raw[:40]
            assert len(protocol.tasks) == 1, raw[:40]
            protocol.connection_lost(None)
            while protocol.tasks:
                await asyncio.sleep(0.005)

    with_bench(scenario)


def test_large_answers_are_the_apps_to_pace() -> None:
    async def scenario(bench: Bench) -> None:
        path = await bench.resolve(LARGE)
        answer = await bench.both(http("GET", path))
        assert not answer.at_door
        assert sum(len(w) for w in answer.writes) > COALESCE_BYTES

    with_bench(scenario)


def test_pipelined_hits_are_answered_in_order() -> None:
    async def scenario(bench: Bench) -> None:
        path = await bench.resolve(SMALL)
        small = await bench.send(http("GET", path))
        npz = http("GET", path + "?format=npz")
        await bench.send(npz)  # prepared
        answer = await bench.both(http("GET", path) + npz + http("GET", path), responses=3)
        assert answer.at_door
        assert len(answer.writes) == 3
        assert undated(answer.writes[0]) == undated(answer.writes[2]) == undated(small.data)
        assert answer.writes[1] != answer.writes[0]
        # a hit at the door, then a request the app computes, in one read: the connection is
        # not idle while the app works on the second (no keep-alive timer to cut it)
        config = bench.guarded
        protocol = GuardedProtocol(config, ServerState(), {}, asyncio.get_running_loop())
        protocol.connection_made(RecordingTransport())
        wide = http("POST", "/v1/tables", json.dumps({**SMALL, "max_positions": 96}).encode())
        protocol.data_received(http("GET", path) + wide)
        assert len(protocol.tasks) == 1  # the hit answered, the computation running
        assert protocol.timeout_keep_alive_task is None
        while protocol.tasks:
            await asyncio.sleep(0.005)
        assert protocol.timeout_keep_alive_task is not None  # idle again once answered
        protocol.connection_lost(None)

    with_bench(scenario)


def test_api_keys_guard_the_door() -> None:
    async def scenario(bench: Bench) -> None:
        auth = {"authorization": "Bearer sesame"}
        raw = http("POST", "/v1/tables", json.dumps(SMALL).encode(), auth)
        await bench.send(raw)
        assert (await bench.both(raw)).at_door
        for headers in ({}, {"authorization": "Bearer wrong"}):
            raw = http("POST", "/v1/tables", json.dumps(SMALL).encode(), headers)
            refused = await bench.both(raw)
            assert not refused.at_door
            assert b" 401 " in refused.writes[0]
            # refused as its headers arrive, its body not awaited
            cut = raw.index(b"\r\n\r\n") + 4
            early = await bench.both([raw[:cut], raw[cut:]])
            assert b" 401 " in early.writes[0]
            protocol = GuardedProtocol(bench.guarded, ServerState(), {}, asyncio.get_running_loop())
            protocol.connection_made(RecordingTransport())
            protocol.data_received(raw[:cut])
            assert protocol.pending is None
            assert len(protocol.tasks) == 1
            protocol.connection_lost(None)
            while protocol.tasks:
                await asyncio.sleep(0.005)

    with_bench(scenario, api_keys=["sesame"])


def test_a_charge_that_does_not_fit_is_refused_by_the_app_once() -> None:
    async def scenario(bench: Bench) -> None:
        path = await bench.resolve(SMALL)
        budget = bench.state.budget
        assert budget is not None
        others = budget.acquire(object(), budget.max_bytes)  # every byte in flight elsewhere
        refused = budget.refused
        answer = await bench.send(http("GET", path))
        assert not answer.at_door
        assert b" 503 " in answer.writes[0]
        assert budget.refused == refused + 1
        others.release()
        assert (await bench.send(http("GET", path))).at_door
        assert budget.held == 0

    with_bench(scenario)


def test_a_body_over_its_cap_is_refused_by_the_app() -> None:
    async def scenario(bench: Bench) -> None:
        raw = http("POST", "/v1/tables", json.dumps(SMALL).encode())
        await bench.send(raw)
        assert (await bench.send(raw)).at_door
        door = bench.state.door
        assert door is not None
        # the cap lowered under the running app: the rules `Gate` and the door share
        door.rules.routes = ()
        door.rules.max_bytes = len(json.dumps(SMALL)) - 1
        refused = await bench.both(raw)
        assert not refused.at_door
        assert b" 413 " in refused.writes[0]

    with_bench(scenario)


def test_charges_count_toward_the_clients_share() -> None:
    async def scenario(bench: Bench) -> None:
        path = await bench.resolve(SMALL)
        budget = bench.state.budget
        assert budget is not None
        assert budget.max_peer_bytes is not None
        with for_peer("127.0.0.1"):  # the recording transport's peer, another of its requests
            others = budget.acquire(object(), budget.max_peer_bytes - 1000)
        refused = await bench.send(http("GET", path))
        assert not refused.at_door
        assert b" 503 " in refused.writes[0]
        assert b"share" in refused.writes[0]
        assert budget.refused_peer == 1
        others.release()
        assert (await bench.send(http("GET", path))).at_door

    with_bench(scenario)


@pytest.mark.parametrize(
    "settings_",
    [{"cors_origins": ["https://app.example"]}, {"prepared_answers": False}, {"hot_routes": False}],
    ids=["cors", "no-prepared", "no-hot-routes"],
)
def test_no_door_where_the_app_must_answer_every_request(settings_: dict[str, Any]) -> None:
    async def scenario(bench: Bench) -> None:
        assert bench.state.door is None
        raw = http("POST", "/v1/tables", json.dumps(SMALL).encode())
        await bench.send(raw)
        assert not (await bench.both(raw)).at_door

    with_bench(scenario, **settings_)


def test_no_door_while_access_lines_are_logged() -> None:
    async def scenario(bench: Bench) -> None:
        raw = http("POST", "/v1/tables", json.dumps(SMALL).encode())
        await bench.send(raw)
        answer = await bench.send(raw)
        assert not answer.at_door
        assert b"x-posenc-cache: hit" in answer.writes[0]

    with_bench(scenario, log_level="info")


def v2_step(positions: list[int], **headers: str) -> bytes:
    """A `/v2` decode step of `SMALL`'s RoPE: binary positions, cos and sin binary."""
    params = {k: v for k, v in SMALL.items() if k != "kind"}
    body, extra = step(np.array(positions, dtype=np.int64), params, {"cos": True, "sin": True})
    return http("POST", "/v2/models/rope/infer", body, {**extra, **headers})


def test_templated_decode_steps_are_answered_at_the_door_as_the_app_answers_them() -> None:
    async def scenario(bench: Bench) -> None:
        for _ in range(2):  # computed; then a hit, whose answer leaves the template
            assert not (await bench.send(v2_step([3]))).at_door
        stats = bench.state.stats.get("rope")
        tally = bench.state.metrics.tally
        before = (
            stats.durations["success"].count,
            stats.durations["cache_hit"].count,
            requests(bench, "POST", "/v2/models/{model}/infer", 200),
            {k: v[0] for k, v in tally._infer.items()},  # posenc_v2_infer_total
        )
        for position in (17, 0, 63):
            answer = await bench.both(v2_step([position]))
            assert answer.at_door
            assert len(answer.writes) == 1
        # counted as the route counts a templated step (the app answered the other three)
        assert stats.durations["success"].count == before[0] + 6
        assert stats.durations["cache_hit"].count == before[1] + 6
        assert requests(bench, "POST", "/v2/models/{model}/infer", 200) == before[2] + 6
        infers = {k: v[0] - before[3].get(k, 0) for k, v in tally._infer.items()}
        assert {k: n for k, n in infers.items() if n} == {("rope", "hit"): 6}
        # what the template does not answer is the app's
        for raw in (
            v2_step([64]),  # a row beyond the table: computed
            v2_step([-1]),  # 400
            v2_step([1, 2]),  # another count: another template, the first is the app's
            v2_step([3], **{"content-encoding": "gzip"}),  # 415 or decoded: the app's
        ):
            assert not (await bench.both(raw)).at_door, raw
        budget = bench.state.budget
        assert budget is not None
        assert budget.held == 0

    with_bench(scenario)


def test_a_decode_step_over_the_door_size_is_the_apps() -> None:
    async def scenario(bench: Bench) -> None:
        # 300 positions of cos and sin, 64 float32 each: 150 KiB of rows
        wide = {**SMALL, "max_positions": 512}
        params = {k: v for k, v in wide.items() if k != "kind"}
        body, extra = step(np.arange(300, dtype=np.int64), params, {"cos": True, "sin": True})
        raw = http("POST", "/v2/models/rope/infer", body, extra)
        await bench.send(raw)
        answer = await bench.both(raw)
        assert not answer.at_door
        assert sum(len(w) for w in answer.writes) > COALESCE_BYTES

    with_bench(scenario)


def test_a_fault_of_the_door_leaves_the_answer_to_the_app(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(bench: Bench) -> None:
        path = await bench.resolve(SMALL)
        door = bench.state.door
        assert door is not None

        def broken(*args: Any) -> None:
            raise RuntimeError("a fault injected into the door's ready answer")

        door.routes = tuple((route, broken) for route, _ in door.routes)
        answer = await bench.both(http("GET", path))
        assert not answer.at_door
        assert b" 200 OK" in answer.writes[0]
        assert "the door failed on GET" in caplog.text

    with_bench(scenario)


def test_a_real_server_answers_repeated_hits_at_its_door() -> None:
    """Through uvicorn on loopback and httpx: the server's config carries the app's door, and
    the hits it answers are the app's bytes, counted in `/metrics` as the app counts them."""
    with start_server(device="cpu") as handle, handle.client() as client:
        door = handle.state.door
        assert door is not None
        verdicts: list[bool] = []
        answer = door.answer

        def observed(*args: Any) -> bool:  # the door itself, its verdicts recorded
            verdict = answer(*args)
            verdicts.append(verdict)
            return verdict

        door.answer = observed  # type: ignore[method-assign]
        first = client.post("/v1/tables", json=SMALL)
        assert first.status_code == 200
        path = "/v1/tables/" + first.headers["x-posenc-key"]
        gets = [client.get(path) for _ in range(4)]
        assert verdicts == [False, False, True, True, True]  # computed; then prepared by the app
        assert all(r.status_code == 200 and r.content == first.content for r in gets)
        assert gets[-1].headers["etag"] == first.headers["etag"]
        metrics = client.get("/metrics").text
        line = 'posenc_http_requests_total{method="GET",route="/v1/tables/{key}",status="200"} 4.0'
        assert line in metrics
