"""Running the app under uvicorn: connection limits, a graceful drain, and log configuration.

Connections (`GuardedProtocol`, uvicorn's httptools protocol with what it lacks added):

- at most `max_connections` open: one beyond is answered 503 `too_many_connections` (the error
  contract, `Retry-After`, `Connection: close`) as soon as its headers arrive, and closed; it gets
  `REFUSED_GRACE` seconds to send them, so refused sockets never pile up; the health probes
  (`HEALTH_PATHS`) are answered even then (and the connection closed), so a flood of connections
  cannot fail a liveness probe into a restart loop;
- at most `max_connections_per_peer` open from one address (host): one more is refused the same
  way (`too_many_connections`, detail `max_connections_per_peer`), so one peer re-opening idle
  sockets cannot take every connection from the others;
- `max_header_bytes` of request line and headers per request: else 431 `headers_too_large` and
  closed (httptools keeps every header in memory and has no limit of its own). The head is
  counted on the wire, byte for byte, before the parser sees a read (`_head_bytes`): from the
  read it begins in (between requests) up to its blank line, whether it arrives in one read or
  many and with the body in the same read, so a head over the limit never reaches the parser or
  the app, and an over-long request line is 431 too (not the parser's 400). A head pipelined
  behind a body in the same read (its start is known only to the parser) is counted from the
  parser's callbacks, its URL and header names and values plus two bytes per line: a lower
  bound of its size on the wire. Behind a response in progress, the 431 follows that response;
- `header_timeout_seconds` from a connection's first byte (a silent socket: from its accept) or a
  keep-alive request's first byte to its last header line: else 408 `request_timeout` and closed
  (a header line every few seconds never completes a request);
- `body_timeout_seconds` from the headers to the last byte of the body: else 408 and closed (a
  body trickling in at a few bytes per second);
- `idle_timeout_seconds` between requests on a keep-alive connection (uvicorn's keep-alive);
- `send_timeout_seconds` during which a client reads nothing of its response (the transport stays
  over its high-water mark): the connection is cut, and the body's memory freed;
- `min_send_rate_bytes` per second over each `send_rate_window_seconds` window in which the
  response waited on its client (the transport went over its high-water mark): a client reading
  slower is cut (aborted) and the body's in-flight charge freed, so a reader trickling a few
  bytes at a time, which the send timeout never catches, holds its share of the budget for at
  most its size / the minimum rate. Bytes handed to the socket are counted by wrapping the
  transport the request's cycle writes to (`_CycleTransport`, which also writes a small
  response's headers and body in one system call).

uvicorn offers `limit_concurrency` (counted only once a request's headers are in, answered in
plain text) and the keep-alive timeout; it has no header, body or send timeout.

Ready answers: as a request's last byte is parsed, the protocol asks the app's door
(`api/door.py`) whether its answer is ready (a small prepared hit, a templated decode step) and
writes it at once, without an ASGI task (`_ready`); a request's task waits for that within the
read being parsed (`_start_asgi_task`), and starts as before for every request the door leaves
to the app.

On SIGTERM the server first drains: readiness turns 503 while requests keep being served for
`drain_seconds` (so a load balancer notices and stops routing here), then uvicorn stops accepting
connections and waits up to `grace_seconds` for in-flight requests before the lifespan shuts down.
The process then exits 0. SIGINT (Ctrl-C) and a second SIGTERM skip the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import socket
import struct
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import orjson
import uvicorn
from httptools import HttpParserError
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette._utils import get_route_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

from posenc.api.app import create_app
from posenc.api.serving.body import FIXED_HEADERS, FixedHeaders, ReadyResponse
from posenc.api.settings import Settings
from posenc.api.state import AppState
from posenc.runtime.budget import fix_mmap_threshold


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line."""
        entry: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def configure_logging(settings: Settings) -> None:
    """Route posenc's and uvicorn's loggers to one stderr handler in the configured format."""
    handler = logging.StreamHandler()
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


log = logging.getLogger("posenc.api.server")

HEALTH_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
"""The probes a connection over `max_connections` still gets answered
(`ConnectionLimits.refusing`)."""

REFUSED_GRACE = 1.0
"""Seconds a connection over `max_connections` gets to send its request headers (then it is
answered 503), capped by `header_timeout_seconds`."""

LOG_EVERY = 10.0
"""Seconds between two log lines about refused or timed-out connections (each line counts them)."""


def _error_bytes(status: int, reason: str, error_type: str, message: str, detail: Any) -> bytes:
    """A complete HTTP/1.1 response in the error contract, closing the connection."""
    body = orjson.dumps({"error": message, "error_type": error_type, "detail": detail})
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class _Tally:
    """Counts an event and logs it at most once per `LOG_EVERY` seconds (a flood of slow or
    refused sockets must be visible in the log without filling it)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.count = 0
        self.last = -math.inf

    def note(self) -> None:
        """One more; logged when the last line is `LOG_EVERY` seconds old."""
        self.count += 1
        now = time.monotonic()
        if now - self.last >= LOG_EVERY:
            log.warning("%s (%d since start)", self.what, self.count)
            self.last = now


class ConnectionLimits:
    """The limits `GuardedProtocol` enforces, from the settings, with canned responses and the
    per-server counters of what was refused or cut."""

    def __init__(self, settings: Settings) -> None:
        self.max_connections = settings.max_connections
        self.header_timeout = settings.header_timeout_seconds
        self.body_timeout = settings.body_timeout_seconds
        self.idle_timeout = settings.idle_timeout_seconds
        self.send_timeout = settings.send_timeout_seconds
        self.retry_after = str(settings.retry_after_seconds)
        self.header_408 = _error_bytes(
            408,
            "Request Timeout",
            "request_timeout",
            f"the request headers did not arrive within {self.header_timeout:g}s",
            {"header_timeout_seconds": self.header_timeout},
        )
        self.body_408 = _error_bytes(
            408,
            "Request Timeout",
            "request_timeout",
            f"the request body did not arrive within {self.body_timeout:g}s of its headers",
            {"body_timeout_seconds": self.body_timeout},
        )
        self.max_header_bytes = settings.max_header_bytes
        self.headers_431 = _error_bytes(
            431,
            "Request Header Fields Too Large",
            "headers_too_large",
            f"the request line and headers exceed {self.max_header_bytes} bytes",
            {"max_header_bytes": self.max_header_bytes},
        )
        self.malformed_400 = _error_bytes(
            400,
            "Bad Request",
            "bad_request",
            "the request is not valid HTTP/1.1 (request line or headers malformed)",
            None,
        )
        self.refused_body = orjson.dumps(
            {
                "error": f"{self.max_connections} connections are open, the most this server "
                f"keeps; retry in {self.retry_after}s",
                "error_type": "too_many_connections",
                "detail": {"max_connections": self.max_connections},
            }
        )
        self.refused = _Tally(f"connections over max_connections={self.max_connections} refused")
        self.max_per_peer = settings.max_connections_per_peer
        self.peer_refused_body = orjson.dumps(
            {
                "error": f"{self.max_per_peer} connections from this address are open, the most "
                f"this server keeps for one peer; retry in {self.retry_after}s",
                "error_type": "too_many_connections",
                "detail": {"max_connections_per_peer": self.max_per_peer},
            }
        )
        self.peer_refused = _Tally(
            f"connections over max_connections_per_peer={self.max_per_peer} refused"
        )
        self.per_peer: dict[str, int] = {}
        """Open connections by peer address (host only)."""
        self.header_timeouts = _Tally(f"header timeouts ({self.header_timeout:g}s)")
        self.header_floods = _Tally(f"requests over max_header_bytes={self.max_header_bytes}")
        self.body_timeouts = _Tally(f"body timeouts ({self.body_timeout:g}s)")
        self.send_timeouts = _Tally(
            f"responses cut: client read nothing for {self.send_timeout:g}s"
        )
        self.min_send_rate = settings.min_send_rate_bytes
        self.send_rate_window = settings.send_rate_window_seconds
        self.slow_readers = _Tally(
            f"responses cut: client read under {self.min_send_rate} bytes/s over "
            f"{self.send_rate_window:g}s"
        )

    def refusing(self, app: ASGIApp, body: bytes | None = None) -> ASGIApp:
        """The ASGI app of a connection over the cap: `app` for the health probes (`GET`/`HEAD`
        of `HEALTH_PATHS`, answered with `Connection: close`), so that a flood of connections
        never fails a liveness probe into a restart; `refuse` for everything else (with `body`,
        else the `max_connections` one)."""
        refused = body if body is not None else self.refused_body

        async def answer(scope: Scope, receive: Receive, send: Send) -> None:
            if (
                scope["type"] == "http"
                and get_route_path(scope) in HEALTH_PATHS
                and scope["method"]
                in {
                    "GET",
                    "HEAD",
                }
            ):

                async def closing(message: Message) -> None:
                    if message["type"] == "http.response.start":
                        headers = [*message.get("headers", ()), (b"connection", b"close")]
                        message = {**message, "headers": headers}
                    await send(message)

                await app(scope, receive, closing)
                return
            await self.refuse(scope, receive, send, refused)

        return answer

    async def refuse(
        self, scope: Scope, receive: Receive, send: Send, body: bytes | None = None
    ) -> None:
        """The ASGI app a connection over the cap gets: 503 `too_many_connections`, closed."""
        body = body if body is not None else self.refused_body
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", self.retry_after.encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class PosencConfig(uvicorn.Config):
    """uvicorn's Config serving with `GuardedProtocol` under `settings`' connection limits."""

    def __init__(self, app: Any, settings: Settings, **kwargs: Any) -> None:
        kwargs.setdefault("root_path", settings.root_path)
        super().__init__(app, http=GuardedProtocol, **kwargs)
        self.limits = ConnectionLimits(settings)
        state = getattr(getattr(app, "state", None), "posenc", None)
        self.door = state.door if isinstance(state, AppState) else None
        """The app's door (api/door.py), which the protocol asks first; None: off."""


COALESCE_BYTES = 64 << 10
"""A response whose `Content-Length` is at most this many bytes has its status line and headers
written together with its first body bytes (`_CycleTransport`)."""


class _CycleTransport:
    """The connection's transport as one request cycle writes to it: the bytes written are
    counted (`GuardedProtocol.sent`, for the minimum send rate), and a small response leaves in
    one socket write instead of uvicorn's two.

    uvicorn writes a response's status line and headers as soon as the app starts it, then each
    body message as it comes: two `send` system calls for a small answer, one of which costs
    as much as all of posenc's work on a cache hit (`docs/benchmarks.md`, section 9). When the
    response has a `Content-Length` of at most `COALESCE_BYTES` (not chunked), the header
    write is held and joined to the first body write. Whatever ends the cycle first sends what
    is held: the body write, `close` (uvicorn closing after the response, or after an app
    error), or the response's completion (`GuardedProtocol.on_response_complete`: uvicorn
    writes no body for HEAD). A `100 Continue` (written before the response starts) and every
    other write pass straight through. Everything else is the transport's."""

    __slots__ = ("_cycle", "_held", "_protocol", "_transport")

    def __init__(
        self, transport: asyncio.Transport, protocol: GuardedProtocol, cycle: RequestResponseCycle
    ) -> None:
        self._transport = transport
        self._protocol = protocol
        self._cycle: RequestResponseCycle | None = cycle
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._protocol.holding = None
            if len(data) <= COALESCE_BYTES:
                data = held + data
            else:
                self._put(held)
        elif self._cycle is not None and self._cycle.response_started:
            # the first write since the response started: its status line and headers (the
            # cycle let go: it holds this transport, and the pair would be garbage for the
            # collector on every request)
            cycle, self._cycle = self._cycle, None
            if cycle.chunked_encoding is False and cycle.expected_content_length <= COALESCE_BYTES:
                self._held = bytes(data)
                self._protocol.holding = self
                return
        self._put(data)

    def _put(self, data: bytes | bytearray | memoryview) -> None:
        self._protocol.sent += len(data)
        self._transport.write(data)

    def flush(self) -> None:
        """Write what is held, if anything."""
        held = self._held
        if held is not None:
            self._held = None
            self._put(held)
        self._protocol.holding = None

    def close(self) -> None:
        """What is held, then the transport's close (which sends what it buffers first)."""
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _render(lines: list[tuple[bytes, bytes]]) -> tuple[bytes, int] | None:
    """`lines` as uvicorn's `send` writes them (each checked by its two patterns, the name
    lowered) and their `Content-Length`, or None when uvicorn must see them itself: a line it
    would refuse, a `Connection` or `Transfer-Encoding` line, no `Content-Length`."""
    out: list[bytes] = []
    length = None
    for name, value in lines:
        if HEADER_RE.search(name) or HEADER_VALUE_RE.search(value):
            return None
        name = name.lower()
        if name == b"content-length" and length is None:
            length = int(value.decode())
        elif name in (b"connection", b"transfer-encoding"):
            return None
        out += (name, b": ", value, b"\r\n")
    return None if length is None else (b"".join(out), length)


class _FixedCycle(RequestResponseCycle):
    """uvicorn's request cycle, writing a ready answer's header lines (`FixedHeaders`, which
    `ReadyResponse` puts on its start message) as rendered once, instead of checking and lowering
    every line per response as uvicorn's `send` does: on a cached GET, with its twelve lines,
    that was a third of uvicorn's work (`docs/benchmarks.md`, section 9). The rendering is used
    only while the start message's lines still equal the ones it was made from (CORS adds and
    edits lines in place), and not when uvicorn logs the access line; the bytes are those
    uvicorn writes (`tests/api/test_coalesced_writes.py`). Everything else is uvicorn's."""

    async def send(self, message: Any) -> None:
        fixed = message.get(FIXED_HEADERS) if not self.response_started else None
        if isinstance(fixed, FixedHeaders) and not self.access_log:
            rendered = _rendered(fixed)
            if (
                rendered is not None
                and message["type"] == "http.response.start"
                and message["headers"] == fixed.lines
            ):
                lines, length = rendered
                await self._start(message["status"], lines, length)
                return
        await super().send(message)

    async def _start(self, status: int, lines: bytes, length: int) -> None:
        """uvicorn's start of a response whose header lines are `lines` (rendered) with a
        `Content-Length` of `length`."""
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        self.response_started = True
        self.waiting_for_100_continue = False
        self.expected_content_length = length
        self.chunked_encoding = False
        self.transport.write(b"".join(_head(self, status, lines)))


def _head(cycle: RequestResponseCycle, status: int, lines: bytes) -> list[bytes]:
    """The status line and header block uvicorn's `send` writes for `cycle`'s response, the
    rendered `lines` (`_render`) after the server's default headers."""
    content = [STATUS_LINE[status]]
    for name, value in cycle.default_headers:
        if HEADER_RE.search(name) or HEADER_VALUE_RE.search(value):
            raise RuntimeError("Invalid HTTP header.")
        content += (name.lower(), b": ", value, b"\r\n")
    content.append(lines)
    if not cycle.keep_alive:
        content.append(b"connection: close\r\n")
    content.append(b"\r\n")
    return content


def _rendered(fixed: FixedHeaders) -> tuple[bytes, int] | None:
    """`fixed`'s lines rendered (`_render`), once."""
    rendered = fixed.wire
    if rendered is None:
        rendered = fixed.wire = _render(fixed.lines) or False
    return rendered if isinstance(rendered, tuple) else None


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a connection cap and header, body and send timeouts
    (module docstring); needs a `PosencConfig`."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        if not isinstance(config, PosencConfig):
            raise TypeError("GuardedProtocol needs a PosencConfig")
        self.limits = config.limits
        # uvicorn annotates the keep-alive timeout as int; call_later takes any float
        self.timeout_keep_alive = config.limits.idle_timeout  # type: ignore[assignment]
        self.header_timer: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None
        self.send_timer: asyncio.TimerHandle | None = None
        self.in_headers = False
        self.header_bytes = 0
        """Bytes of the current request's head taken in so far (`_head_bytes`)."""
        self.in_message = False
        """Between a request's first byte and its last (the parser's view)."""
        self.head_tail = b""
        """The last bytes of a head still open at the end of a read: its blank line may span
        two reads."""
        self.head_scanned = False
        """This read's head was counted before the parser saw the read (`on_message_begin`
        keeps the count)."""
        self.head_loose = False
        """A head began inside this read behind another request: counted from the callbacks."""
        self.refusing_head = False
        """A head went over the limit behind a response in progress: the 431 follows it."""
        self.sent = 0
        self.holding: _CycleTransport | None = None
        """The cycle transport holding a response's headers until its body (at most one: a
        connection writes one response at a time)."""
        self.peer = ""
        self.rate_timer: asyncio.TimerHandle | None = None
        self.rate_mark = 0
        self.door = config.door
        self.door_app = self.app
        """The app whose requests the door may answer (not a refusing one: `connection_made`)."""
        self.parsing = False
        self.pending: tuple[RequestResponseCycle, Any] | None = None
        """A request whose task waits for its last byte, for the door (`_start_asgi_task`)."""
        self.awaiting = False
        """The pending request is awaited past the read its headers ended in (`_awaited`), and
        counted in flight meanwhile."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Accept, or (over the cap) serve only the 503; start the header timer."""
        super().connection_made(transport)
        wait = self.limits.header_timeout
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        per_peer = self.limits.per_peer
        per_peer[self.peer] = per_peer.get(self.peer, 0) + 1
        if len(self.connections) > self.limits.max_connections:
            self.app = self.limits.refusing(self.app)
            self.limits.refused.note()
            wait = min(wait, REFUSED_GRACE)
        elif per_peer[self.peer] > self.limits.max_per_peer:
            self.app = self.limits.refusing(self.app, self.limits.peer_refused_body)
            self.limits.peer_refused.note()
            wait = min(wait, REFUSED_GRACE)
        self.header_timer = self.loop.call_later(wait, self._header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        """uvicorn's, and every timer cancelled; a request the door awaited goes to the app,
        which reads the disconnect (as it would have, had its task started with the headers)."""
        pending = self._settle()
        if pending is not None:
            self._run(*pending)
        for timer in (self.header_timer, self.body_timer, self.send_timer, self.rate_timer):
            if timer is not None:
                timer.cancel()
        self.header_timer = self.body_timer = self.send_timer = self.rate_timer = None
        per_peer = self.limits.per_peer
        left = per_peer.get(self.peer, 0) - 1
        if left > 0:
            per_peer[self.peer] = left
        else:
            per_peer.pop(self.peer, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """uvicorn's; then, while a request's headers are incomplete, the header timer runs, and
        while its body is still to come, the body timer (a request that arrives whole in one
        read, the common case, starts neither)."""
        if self.refusing_head:  # a 431 waits for the response before it: nothing more is read
            return
        if (self.in_headers or not self.in_message) and not self._head_bytes(data):
            self._headers_too_large()
            return
        self.parsing = True
        try:
            super().data_received(data)
        finally:
            self.parsing = False
            self.head_scanned = self.head_loose = False
            if self.in_headers:  # the head goes on in the next read
                self.head_tail = (self.head_tail + data[-2:])[-2:]
            pending = self.pending
            if pending is not None:
                if not self._awaited(pending[0]):
                    self._settle()
                    self._run(*pending)  # its body is still to come: the app reads it
                elif not self.awaiting and self.door is not None:
                    # in flight, as `Gate` counts a request whose body it waits for
                    self.awaiting = True
                    self.door.tally.in_flight += 1
        if self.in_headers and self.header_timer is None and not self.transport.is_closing():
            self.header_timer = self.loop.call_later(
                self.limits.header_timeout, self._header_timeout
            )
        cycle = self.cycle
        if (
            self.body_timer is None
            and cycle is not None
            and cycle.more_body
            and not cycle.response_complete
            and not self.transport.is_closing()
        ):
            self.body_timer = self.loop.call_later(self.limits.body_timeout, self._body_timeout)

    def _head_bytes(self, data: bytes) -> bool:
        """Count the head bytes in `data`, a read that continues a head or comes between
        requests (where a head begins, after any blank lines, which the parser skips); False
        when the head is over `max_header_bytes`. The head ends with its blank line: the first
        `\n\r\n` or `\n\n` (a parser tolerant of bare LF ends it there too), searched only
        as far as the limit allows, with the tail of the previous read in front."""
        if not self.in_headers:
            data = data.lstrip(b"\r\n")
            if not data:
                return True
            self.header_bytes = 0
            self.head_tail = b""
            self.head_scanned = True
        room = self.limits.max_header_bytes - self.header_bytes
        tail = self.head_tail
        window = tail + data[:room]
        ends = [i + len(mark) for mark in (b"\n\r\n", b"\n\n") if (i := window.find(mark)) >= 0]
        if ends:
            self.header_bytes += min(ends) - len(tail)
            self.head_tail = b""
            return True
        if len(data) > room:
            self.header_bytes += len(data)
            return False
        self.header_bytes += len(data)
        return True

    def _loose_head(self, nbytes: int) -> None:
        """Count `nbytes` of a head that began behind another request in this read; over the
        limit, the parser stops here (uvicorn answers its error with `send_400_response`,
        which sends the 431)."""
        if not self.head_loose:
            return
        self.header_bytes += nbytes
        if self.header_bytes > self.limits.max_header_bytes:
            raise HttpParserError("request head over max_header_bytes")

    def on_url(self, url: bytes) -> None:
        """uvicorn's, the URL counted toward a loose head (`_loose_head`)."""
        self._loose_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """uvicorn's, the line counted toward a loose head (`_loose_head`)."""
        self._loose_head(len(name) + len(value) + 2)
        super().on_header(name, value)

    def on_message_begin(self) -> None:
        """A request's first byte: its headers are due within the header timeout (from the end
        of this read, `data_received`). The connection is no longer idle: a keep-alive timer
        armed by the door's answer to the request before it in the same read stops (uvicorn
        stops it as a read begins)."""
        super().on_message_begin()
        self.in_headers = True
        self.in_message = True
        if self.head_scanned:  # counted already, from this read's start (`_head_bytes`)
            self.head_scanned = False
        else:  # behind another request's end in this read
            self.header_bytes = 0
            self.head_tail = b""
            self.head_loose = True
        idle = self.timeout_keep_alive_task
        if idle is not None:
            idle.cancel()
            self.timeout_keep_alive_task = None

    def on_headers_complete(self) -> None:
        """The headers are in: the header timer stops, and the send-rate window of the last
        response."""
        self.in_headers = False
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None
        super().on_headers_complete()
        if self.rate_timer is not None:  # a new response: a new window from its first wait
            self.rate_timer.cancel()
            self.rate_timer = None

    def on_response_complete(self) -> None:
        """uvicorn's, after sending headers still held (a response whose body wrote nothing)."""
        if self.holding is not None:
            self.holding.flush()
        if self.refusing_head and not self.transport.is_closing():
            self.server_state.total_requests += 1
            self.transport.write(self.limits.headers_431)
            self.transport.close()
            return
        super().on_response_complete()

    def on_message_complete(self) -> None:
        """The body is in: the body timer stops; a request the door answers is done (`_ready`),
        the others' tasks start."""
        self.in_message = False
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        super().on_message_complete()
        pending = self.pending
        if pending is not None and pending[0] is self.cycle:
            self._settle()
            if not self._ready(pending[0]):
                self._run(*pending)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        """uvicorn's; but a request of the plain app whose headers arrive in a read being parsed
        waits for its last byte there, for the door (`on_message_complete`): its task would not
        have run before the end of that read anyway. It is started then when its body is still
        to come, unless the door awaits it (`_awaited`): a small POST to one of its routes,
        whose client wrote the body apart from the headers."""
        if self.door is not None and self.parsing and app is self.door_app and self.pending is None:
            self.pending = (cycle, app)
            return
        self._run(cycle, app)

    def _settle(self) -> tuple[RequestResponseCycle, Any] | None:
        """The pending request, no longer pending (nor counted in flight, if it was awaited:
        the door or the app counts it from here)."""
        pending, self.pending = self.pending, None
        if self.awaiting and self.door is not None:
            self.awaiting = False
            self.door.tally.in_flight -= 1
        return pending

    def _awaited(self, cycle: RequestResponseCycle) -> bool:
        """Whether `cycle`'s request, its body still to come at the end of a read, stays with
        the door until its last byte (`Door.awaits`; the body timer runs meanwhile)."""
        scope: Any = cycle.scope
        return (
            self.door is not None
            and cycle is self.cycle
            and cycle.more_body
            and not self.transport.is_closing()
            and self.door.awaits(scope)
        )

    def _run(self, cycle: RequestResponseCycle, app: Any) -> None:
        """uvicorn's task for `cycle`, which is a `_FixedCycle` writing through
        `_CycleTransport` (counting the bytes sent, one write for a small response)."""
        cycle.__class__ = _FixedCycle
        cycle.transport = _CycleTransport(self.transport, self, cycle)  # type: ignore[assignment]
        super()._start_asgi_task(cycle, app)

    def _ready(self, cycle: RequestResponseCycle) -> bool:
        """Whether the door answered `cycle`'s request (api/door.py): the connection kept
        alive, not paused, no access line logged; the answer and its headers in one write."""
        if (
            self.door is None
            or cycle.access_log
            or not cycle.keep_alive
            or self.flow.write_paused
            or self.transport.is_closing()
        ):
            return False

        def write(ready: ReadyResponse) -> bool:
            rendered = _rendered(ready.fixed)
            if rendered is None:
                return False
            lines, length = rendered
            views = ready.views
            for view in views:
                length -= view.nbytes
            if length:  # not the body's: uvicorn would refuse it
                return False
            data = b"".join([*_head(cycle, 200, lines), *views])
            cycle.response_started = cycle.response_complete = True
            self.sent += len(data)
            self.transport.write(data)
            return True

        scope: Any = cycle.scope  # uvicorn's typed dict, Starlette's mapping
        try:
            answered = self.door.answer(scope, cycle.body, write, COALESCE_BYTES)
        except Exception:
            if cycle.response_started:  # written: there is nothing to fall back to
                raise
            # a fault of the door must not cost the client its answer: the app gives it
            log.exception(
                "the door failed on %s %s; the app answers", scope["method"], scope["path"]
            )
            return False
        if answered:
            self.on_response_complete()
        return answered

    def pause_writing(self) -> None:
        """The client stopped reading (the transport is over its high-water mark): the send
        timer starts, and the send-rate window when none is running."""
        super().pause_writing()
        if self.send_timer is None:
            self.send_timer = self.loop.call_later(self.limits.send_timeout, self._send_timeout)
        if self.rate_timer is None and self.limits.min_send_rate:
            self.rate_mark = self._delivered()
            self.rate_timer = self.loop.call_later(self.limits.send_rate_window, self._rate_check)

    def _delivered(self) -> int:
        """Bytes of responses handed to the socket so far (written less still buffered)."""
        return self.sent - self.transport.get_write_buffer_size()

    def _rate_check(self) -> None:
        """End of a send-rate window: cut the connection when its response still waits on the
        client and it read under the minimum rate over the window; else measure another window
        while it waits."""
        self.rate_timer = None
        if self.transport.is_closing():
            return
        delivered = self._delivered()
        window = self.limits.send_rate_window
        waiting = self.flow.write_paused or self.transport.get_write_buffer_size() > 0
        if not waiting:  # the client has all it was sent: nothing waits on it
            return
        if delivered - self.rate_mark < self.limits.min_send_rate * window:
            self.limits.slow_readers.note()
            self._cut()
            return
        self.rate_mark = delivered
        self.rate_timer = self.loop.call_later(window, self._rate_check)

    def resume_writing(self) -> None:
        """The client read enough for the transport to drain: the send timer stops."""
        super().resume_writing()
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None

    def send_400_response(self, msg: str) -> None:
        """httptools could not parse the request: the error contract (400 `bad_request`, or 431
        `headers_too_large` when the headers were already past `max_header_bytes`) instead of
        uvicorn's plain text, and the connection closed."""
        if self.in_headers and self.header_bytes > self.limits.max_header_bytes:
            self._headers_too_large()  # a loose head's callbacks stopped the parser
            return
        self.transport.write(self.limits.malformed_400)
        self.transport.close()

    def _headers_too_large(self) -> None:
        """431 and close; behind a response still in progress (a request before it on the
        connection), once that response is complete (`on_response_complete`), the reads
        between ignored."""
        self.limits.header_floods.note()
        self.in_headers = False
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(self.limits.headers_431)
            self.transport.close()
        else:
            self.refusing_head = True

    def _header_timeout(self) -> None:
        self.header_timer = None
        if self.transport.is_closing():
            return
        self.limits.header_timeouts.note()
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(self.limits.header_408)
        self.transport.close()

    def _body_timeout(self) -> None:
        self.body_timer = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None or not cycle.more_body:
            return
        self.limits.body_timeouts.note()
        if not cycle.response_started:
            self.transport.write(self.limits.body_408)
        # the app reads a disconnect; whatever it sends now is dropped
        cycle.disconnected = True
        cycle.message_event.set()
        self.transport.close()

    def _send_timeout(self) -> None:
        self.send_timer = None
        if not self.transport.is_closing():
            self.limits.send_timeouts.note()
        self._cut()

    def _cut(self) -> None:
        """Abort the connection with a reset: abort, not close, since close would wait for the
        unread buffer to drain; and no lingering, or the kernel would go on trickling what its
        send buffer holds (megabytes on loopback) to the slow client."""
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()


class CutsCollector(Collector):
    """`posenc_responses_cut_total{reason}`: responses the connection rules cut mid-send, by
    rule (`slow_reader`: under `min_send_rate_bytes`; `send_timeout`: nothing read for
    `send_timeout_seconds`), so that a client cut mid-body can tell it from a failure."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "posenc_responses_cut",
            "Responses cut mid-send by the connection rules (a slow or stalled reader)",
            labels=["reason"],
        )
        family.add_metric(["slow_reader"], self.limits.slow_readers.count)
        family.add_metric(["send_timeout"], self.limits.send_timeouts.count)
        yield family


def server_config(app: Any, settings: Settings, **kwargs: Any) -> PosencConfig:
    """The uvicorn configuration posenc runs under (`serve`, and the tests' servers): its
    protocol with `settings`' connection limits, whose cuts `app`'s `/metrics` counts;
    `kwargs` are further `uvicorn.Config` arguments."""
    # uvicorn builds each access line's arguments before its logger drops them (INFO), and
    # then writes header lines as it checks them (`_FixedCycle`)
    kwargs.setdefault("access_log", settings.log_level in ("info", "debug"))
    config = PosencConfig(app, settings, **kwargs)
    state = getattr(getattr(app, "state", None), "posenc", None)
    if isinstance(state, AppState):
        state.metrics.registry.register(CutsCollector(config.limits))
    return config


def banner(settings: Settings, http_port: int, grpc_port: int | None) -> str:
    """The start-up line naming where everything is: the explorer, the API docs, `/v1`, `/v2`,
    the metrics and the gRPC port, as this address serves them (a wildcard host shown as this
    machine's loopback); with a `root_path`, the prefix the proxy serves them under, which it
    strips before they reach this address."""
    host = settings.host
    shown = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}.get(host, host)
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    base = f"http://{shown}:{http_port}"
    grpc = f"{shown}:{grpc_port}" if grpc_port is not None else "off (--grpc-port)"
    proxied = f" | behind the proxy under {settings.root_path}" if settings.root_path else ""
    return (
        f"posenc listening: explorer {base}/ui | API docs {base}/docs | "
        f"/v1 {base}/v1 | /v2 {base}/v2 | metrics {base}/metrics | gRPC {grpc}{proxied}"
    )


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first SIGTERM starts a drain instead of an immediate shutdown."""

    def __init__(self, config: uvicorn.Config, state: AppState) -> None:
        super().__init__(config)
        self.state = state
        self.drain_until: float | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's; then, once listening, the start-up banner (`banner`)."""
        await super().startup(sockets)
        listening = [s for server in self.servers for s in server.sockets]
        if listening and not self.should_exit:
            port = listening[0].getsockname()[1]
            log.info("%s", banner(self.state.settings, port, self.state.grpc_port))

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """SIGTERM: mark draining and exit after `drain_seconds`; otherwise uvicorn's behaviour."""
        if sig == signal.SIGTERM and self.drain_until is None and not self.should_exit:
            self.state.lifecycle.draining = True
            self.drain_until = time.monotonic() + self.state.settings.drain_seconds
            logging.getLogger("posenc.api").info(
                "SIGTERM: draining for %.1fs", self.state.settings.drain_seconds
            )
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's tick, plus: stop once the drain period is over."""
        if await super().on_tick(counter):
            return True
        return self.drain_until is not None and time.monotonic() >= self.drain_until


def serve(settings: Settings) -> int:
    """Run posenc until shut down; 0 after a clean stop, 3 when start-up failed. glibc's mmap
    threshold is fixed first (`runtime.budget.fix_mmap_threshold`), so that freed work leaves
    the process and the memory budgets hold without the images' environment."""
    fix_mmap_threshold()
    configure_logging(settings)
    app = create_app(settings)
    config = server_config(
        app,
        settings,
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level=settings.log_level,
        timeout_graceful_shutdown=max(1, math.ceil(settings.grace_seconds)),
        lifespan="on",
    )
    server = DrainingServer(config, app.state.posenc)
    server.run()
    return 0 if server.started else 3
