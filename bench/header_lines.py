"""A response's header lines through uvicorn's `send` against posenc's rendered-once lines.

    python -m bench.header_lines [--repeat 20000]

The start message of a cached small GET and of a templated `/v2` decode step, captured from the
app in process (lifespan started, device cpu), is sent through a request cycle writing to a
transport that discards its bytes: uvicorn's `RequestResponseCycle.send`, which checks each line
with two regular expressions and lowers its name, and posenc's `_FixedCycle` (api/server.py),
which writes the lines as rendered on their first use. Both write the same bytes (checked), and
the per-send µs (thread CPU, best of 7) are printed as markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import Any

from bench._common import table
from bench.floor import decode_step
from bench.inproc import _scope
from bench.serve import SMALL, get, post_json


class Sink(asyncio.Transport):
    """A transport keeping only the last write."""

    def __init__(self) -> None:
        super().__init__()
        self.last = b""

    def write(self, data: Any) -> None:
        self.last = bytes(data)

    def is_closing(self) -> bool:
        return False


async def _start_message(app: Any, raw: bytes) -> dict[str, Any]:
    """The `http.response.start` message `app` sends for `raw` (its second answer: a hit)."""
    scope, body = _scope(raw)
    started: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            started.append(message)

    for _ in range(2):
        await app({**scope, "app": app}, _receiving(body), send)
    return started[-1]


def _receiving(body: bytes) -> Any:
    """An ASGI `receive` giving `body` whole, then a disconnect."""
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    return receive


async def _per_send(cls: type, message: dict[str, Any], repeat: int) -> tuple[float, bytes]:
    """µs of thread CPU per start message sent through a cycle of class `cls`, and its bytes."""
    from uvicorn.protocols.http.flow_control import FlowControl
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    sink = Sink()
    cycle = RequestResponseCycle(
        scope={"method": "GET", "http_version": "1.1", "headers": []},
        transport=sink,
        flow=FlowControl(sink),
        logger=logging.getLogger("bench"),
        access_logger=logging.getLogger("bench.access"),
        access_log=False,
        default_headers=[(b"date", b"Fri, 27 Nov 2026 12:00:00 GMT"), (b"server", b"uvicorn")],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )
    cycle.__class__ = cls
    best = float("inf")
    for _ in range(7):
        start = time.thread_time()
        for _ in range(repeat):
            cycle.response_started = False
            cycle.chunked_encoding = None
            await cycle.send({**message, "headers": list(message["headers"])})
        best = min(best, (time.thread_time() - start) / repeat * 1e6)
    return best, sink.last


async def _run(repeat: int) -> list[list[str]]:
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    from posenc.api.app import create_app
    from posenc.api.server import _FixedCycle
    from posenc.api.settings import Settings
    from posenc.encodings import content_key, parse_spec

    app = create_app(Settings(device="cpu", log_level="warning"))
    rows = []
    async with app.router.lifespan_context(app):
        await _start_message(app, post_json("/v1/tables", SMALL))
        key = content_key(parse_spec(SMALL))
        cases = {
            "cached small GET": get(f"/v1/tables/{key}"),
            "templated /v2 decode step": decode_step(SMALL, 17),
        }
        for name, raw in cases.items():
            message = await _start_message(app, raw)
            theirs, wire = await _per_send(RequestResponseCycle, message, repeat)
            ours, same = await _per_send(_FixedCycle, message, repeat)
            if wire != same:
                raise RuntimeError(f"{name}: the rendered lines differ from uvicorn's")
            lines = len(message["headers"]) + 2
            rows.append([name, str(lines), f"{theirs:.1f}", f"{ours:.1f}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20000, help="sends per measurement")
    args = parser.parse_args(argv)
    rows = asyncio.run(_run(args.repeat))
    print(f"µs of thread CPU per start message (best of 7 x {args.repeat}); {json.dumps(SMALL)}")
    print()
    print(table(["answer", "header lines", "uvicorn's send", "rendered once"], rows, "lrrr"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
