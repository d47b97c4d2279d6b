"""A small response leaves in one socket write (api/server.py `_CycleTransport`), byte for byte
what uvicorn's own protocol writes in two.

Each request is fed to two protocols over the same app (lifespan started): posenc's
`GuardedProtocol` and uvicorn's `HttpToolsProtocol` as uvicorn runs it, each writing to a
transport that records every `write` (the asyncio transport's interface; the socket is the only
thing replaced). The bytes written must be equal (the `date` header aside), and the number of
writes must be one for a response of at most `COALESCE_BYTES` with a body, and uvicorn's for
every other (HEAD, 304, empty and large bodies), with nothing held back when the response ends.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from posenc.api.app import create_app
from posenc.api.server import COALESCE_BYTES, GuardedProtocol, server_config
from posenc.api.settings import Settings
from tests.api.test_v2_steps import step

SMALL = {"kind": "rope", "head_dim": 64, "max_positions": 64}
"""33.6 KiB as safetensors: under `COALESCE_BYTES`."""
LARGE = {"kind": "rope", "head_dim": 128, "max_positions": 1024}
"""1 MiB: over it."""


class RecordingTransport(asyncio.Transport):
    """A connected socket's transport that keeps what is written, one entry per `write`."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


def http(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: test"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method == "POST":
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def decode_step(position: int) -> bytes:
    """A `/v2` decode step of `SMALL`'s RoPE: one binary position, cos and sin binary."""
    params = {k: v for k, v in SMALL.items() if k != "kind"}
    body, headers = step(np.array([position]), params, {"cos": True, "sin": True})
    return http("POST", "/v2/models/rope/infer", body, headers)


Exchange = Callable[[type[HttpToolsProtocol], bytes], Awaitable[list[bytes]]]


def with_app(scenario: Callable[[Exchange], Awaitable[None]], **settings_: Any) -> None:
    """Run `scenario(exchange)` against one app (lifespan started; `settings_` its settings),
    where `exchange(protocol class, request bytes)` returns the writes of the response on a new
    connection."""
    settings = Settings(device="cpu", log_level="warning", **settings_)
    app: FastAPI = create_app(settings)
    guarded = server_config(app, settings)
    # neither logs access lines (below INFO; the loggers are global, so both say so)
    plain = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
    for config in (guarded, plain):
        config.load()

    async def exchange(cls: type[HttpToolsProtocol], raw: bytes) -> list[bytes]:
        config = guarded if cls is GuardedProtocol else plain
        protocol = cls(config, ServerState(), {}, asyncio.get_running_loop())
        transport = RecordingTransport()
        protocol.connection_made(transport)
        protocol.data_received(raw)
        for _ in range(2000):
            cycle = protocol.cycle
            if cycle is not None and cycle.response_complete:
                break
            await asyncio.sleep(0.005)
        else:
            raise AssertionError("no complete response")
        await asyncio.sleep(0)
        protocol.connection_lost(None)
        return transport.writes

    async def run() -> None:
        async with app.router.lifespan_context(app):
            await scenario(exchange)

    asyncio.run(run())


def undated(data: bytes) -> bytes:
    return re.sub(rb"\r\ndate: [^\r]*", b"", data)


async def both(exchange: Exchange, raw: bytes) -> tuple[list[bytes], list[bytes]]:
    """The writes of posenc's protocol and of uvicorn's for `raw` (asked once before, so both
    answer from the cache and its prepared answers), their bytes equal."""
    await exchange(HttpToolsProtocol, raw)  # the answer cached (and prepared) for both
    ours = await exchange(GuardedProtocol, raw)
    theirs = await exchange(HttpToolsProtocol, raw)
    assert undated(b"".join(ours)) == undated(b"".join(theirs))
    return ours, theirs


def test_small_answers_leave_in_one_write() -> None:
    with_app(small_answers)


async def small_answers(exchange: Exchange) -> None:
    ours, theirs = await both(exchange, http("POST", "/v1/tables", json.dumps(SMALL).encode()))
    assert b" 200 OK" in ours[0]
    assert len(b"".join(ours)) < COALESCE_BYTES + 1024
    assert (len(ours), len(theirs)) == (1, 2)
    key = re.search(rb"x-posenc-key: (\w+)", ours[0])
    assert key is not None
    path = f"/v1/tables/{key.group(1).decode()}"
    ours, theirs = await both(exchange, http("GET", path))  # a prepared cache hit
    assert (len(ours), len(theirs)) == (1, 2)
    ours, theirs = await both(exchange, decode_step(17))  # a templated step
    assert (len(ours), len(theirs)) == (1, 2)
    ours, theirs = await both(exchange, http("GET", "/v1/tables/nosuchkey"))  # an error body
    assert b" 404 " in ours[0]
    assert (len(ours), len(theirs)) == (1, 2)


def test_answers_without_a_body_write_nothing_held() -> None:
    with_app(bodiless_answers)


async def bodiless_answers(exchange: Exchange) -> None:
    ours, theirs = await both(exchange, http("POST", "/v1/tables", json.dumps(SMALL).encode()))
    etag = re.search(rb"etag: ([^\r]+)", ours[0])
    key = re.search(rb"x-posenc-key: (\w+)", ours[0])
    assert etag is not None
    assert key is not None
    path = f"/v1/tables/{key.group(1).decode()}"
    ours, theirs = await both(exchange, http("HEAD", path))
    assert b" 200 OK" in ours[0]
    assert len(ours) == len(theirs) == 1
    ours, theirs = await both(
        exchange, http("GET", path, headers={"if-none-match": etag.group(1).decode()})
    )
    assert b" 304 " in ours[0]
    assert len(ours) == len(theirs)


def test_large_answers_are_written_as_uvicorn_writes_them() -> None:
    with_app(large_answers)


async def large_answers(exchange: Exchange) -> None:
    ours, theirs = await both(exchange, http("POST", "/v1/tables", json.dumps(LARGE).encode()))
    assert sum(len(w) for w in ours) > COALESCE_BYTES
    assert [len(w) for w in ours] == [len(w) for w in theirs]


ORIGIN = "https://app.example"


def test_cors_lines_added_to_a_ready_answer_are_written_as_uvicorn_writes_them() -> None:
    """CORS adds lines to a prepared answer's start message and edits `Vary` in place: the
    header lines rendered once for the answer must not be used then."""
    with_app(cors_answers, cors_origins=[ORIGIN])


async def cors_answers(exchange: Exchange) -> None:
    origin = {"origin": ORIGIN}
    raw = http("POST", "/v1/tables", json.dumps(SMALL).encode(), origin)
    ours, theirs = await both(exchange, raw)
    assert f"access-control-allow-origin: {ORIGIN}".encode() in ours[0]
    key = re.search(rb"x-posenc-key: (\w+)", ours[0])
    assert key is not None
    path = f"/v1/tables/{key.group(1).decode()}"
    await both(exchange, http("GET", path))  # rendered once without CORS's lines
    ours, theirs = await both(exchange, http("GET", path, headers=origin))
    assert f"access-control-allow-origin: {ORIGIN}".encode() in ours[0]
    assert (len(ours), len(theirs)) == (1, 2)
