"""The CLI's progress display on a terminal (tqdm): a "waiting for the server" spinner until an
answer's first byte, then a download bar with the size, rate and ETA.

`DownloadProgress` is two hooks a `Client` takes: `transport()`, an httpx transport that marks
when a request is sent and when its answer's headers (its first byte) arrive, and the object
itself, the client's `progress(received, total)` callback as the body arrives.

- Waiting: after `delay` seconds without an answer (the server computes a large table before it
  sends a byte: the body's size and digest come first), a spinner with the time waited, redrawn
  every `mininterval` seconds; nothing for an answer quicker than that.
- Downloading: a bar for bodies of at least `min_bytes` (total from `Content-Length`: percent,
  bytes, rate, ETA) and, after `delay`, for bodies of unknown size (bytes and rate). tqdm redraws
  it at most every `mininterval` seconds whatever the chunk count (a 390 MiB table is thousands
  of chunks), and the bar is closed when the body ends (or fails).

Sizes are decimal (kB, MB, GB: tqdm's unit scale with divisor 1000), as tqdm prints them.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, TextIO

import httpx
from tqdm import tqdm  # type: ignore[import-untyped]

SPINNER = "|/-\\"


class _WatchedStream(httpx.SyncByteStream):
    """An answer's body stream that tells `DownloadProgress` when it is closed (read or not)."""

    def __init__(self, inner: httpx.SyncByteStream, progress: DownloadProgress) -> None:
        self.inner = inner
        self.progress = progress

    def __iter__(self) -> Any:
        yield from self.inner

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self.progress.finished()


class _WatchingTransport(httpx.HTTPTransport):
    """httpx's own transport (the default one), marking a request's send and its answer."""

    def __init__(self, progress: DownloadProgress) -> None:
        super().__init__()
        self.progress = progress

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.progress.waiting(f"{request.method} {request.url.path}")
        try:
            response = super().handle_request(request)
        finally:
            self.progress.answered()
        assert isinstance(response.stream, httpx.SyncByteStream)
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_WatchedStream(response.stream, self.progress),
            extensions=response.extensions,
        )


class DownloadProgress:
    """tqdm on `stream` for `Client(transport=p.transport(), progress=p)`: a spinner while
    waiting for the server, a bar while downloading (see the module)."""

    def __init__(
        self,
        stream: TextIO,
        *,
        mininterval: float = 0.2,
        delay: float = 0.5,
        min_bytes: int = 1 << 20,
    ) -> None:
        self.stream = stream
        self.mininterval = mininterval
        self.delay = delay
        self.min_bytes = min_bytes
        self._bar: Any = None
        self._stop: threading.Event | None = None
        self._spinner: threading.Thread | None = None

    def transport(self) -> httpx.HTTPTransport:
        """The transport to give the client, which reports requests sent and answered."""
        return _WatchingTransport(self)

    # waiting for the first byte ---------------------------------------------------------------

    def waiting(self, what: str) -> None:
        """A request was sent: spin after `delay` until `answered`."""
        self.answered()
        stop = threading.Event()
        self._stop = stop
        self._spinner = threading.Thread(
            target=self._spin, args=(what, stop), name="posenc-progress", daemon=True
        )
        self._spinner.start()

    def _spin(self, what: str, stop: threading.Event) -> None:
        start = time.monotonic()
        if stop.wait(self.delay):
            return
        bar = tqdm(
            total=None,
            file=self.stream,
            bar_format="{desc}",
            leave=False,
            dynamic_ncols=True,
            mininterval=self.mininterval,
        )
        try:
            for char in itertools.cycle(SPINNER):
                waited = time.monotonic() - start
                bar.set_description_str(
                    f"{what}: waiting for the server (computing) {char} {waited:.1f}s",
                    refresh=True,
                )
                if stop.wait(self.mininterval):
                    break
        finally:
            bar.close()

    def answered(self) -> None:
        """The answer's headers arrived (or the request failed): stop the spinner."""
        stop, spinner = self._stop, self._spinner
        self._stop = self._spinner = None
        if stop is not None and spinner is not None:
            stop.set()
            spinner.join()

    # the body ----------------------------------------------------------------------------------

    def __call__(self, received: int, total: int | None) -> None:
        """The client's progress callback: `received` of `total` (None: unknown) bytes."""
        if self._bar is None:
            if total is not None and total < self.min_bytes:
                return
            self._bar = tqdm(
                total=total,
                initial=0,
                desc="downloading",
                unit="B",
                unit_scale=True,
                unit_divisor=1000,
                file=self.stream,
                mininterval=self.mininterval,
                delay=0.0 if total is not None else self.delay,
                dynamic_ncols=True,
                leave=True,
            )
        self._bar.update(received - self._bar.n)
        if total is not None and received >= total:
            self.finished()

    def finished(self) -> None:
        """The body ended (or the stream closed early): close the bar."""
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.close()

    def close(self) -> None:
        """Stop everything shown (the CLI calls it on the way out)."""
        self.answered()
        self.finished()
