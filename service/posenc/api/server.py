"""Running the app under uvicorn with a graceful drain, and log configuration.

On SIGTERM the server first drains: readiness turns 503 while requests keep being served for
`drain_seconds` (so a load balancer notices and stops routing here), then uvicorn stops accepting
connections and waits up to `grace_seconds` for in-flight requests before the lifespan shuts down.
The process then exits 0. SIGINT (Ctrl-C) and a second SIGTERM skip the drain.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from types import FrameType
from typing import Any

import orjson
import uvicorn

from posenc.api.app import create_app
from posenc.api.settings import Settings
from posenc.api.state import AppState


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


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first SIGTERM starts a drain instead of an immediate shutdown."""

    def __init__(self, config: uvicorn.Config, state: AppState) -> None:
        super().__init__(config)
        self.state = state
        self.drain_until: float | None = None

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
    """Run posenc until shut down; 0 after a clean stop, 3 when start-up failed."""
    configure_logging(settings)
    app = create_app(settings)
    config = uvicorn.Config(
        app,
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
