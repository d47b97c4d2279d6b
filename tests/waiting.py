"""Waiting on conditions, never on the clock: poll a predicate until it holds or a deadline passes.

A test that needs another thread, task or process to reach a state waits for that state (a
counter, a flag, an answer), not for a fixed time that is usually enough: fixed sleeps make a
test slow on a quiet machine and flaky on a loaded one. The polling interval only bounds the
latency of noticing; the deadline is the failure.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

PATIENCE = 30.0
"""Default seconds before a condition that does not come true fails the test."""


def wait_for(
    condition: Callable[[], bool], timeout: float = PATIENCE, interval: float = 0.01
) -> bool:
    """True as soon as `condition()` holds; False when it still does not after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


async def async_wait_for(
    condition: Callable[[], bool], timeout: float = PATIENCE, interval: float = 0.001
) -> bool:
    """`wait_for` inside an event loop: yields to the loop between polls."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval)
    return True


class Gate:
    """A blocking point a worker thread reaches and waits at until the test opens it.

    `reached` is set when the first worker arrives (so the test knows the work is in progress);
    `open()` lets every worker through. A worker that waits longer than `timeout` seconds fails
    loudly instead of hanging the suite.
    """

    def __init__(self, timeout: float = PATIENCE) -> None:
        self.reached = threading.Event()
        self._opened = threading.Event()
        self.timeout = timeout

    def pass_through(self) -> None:
        """Called by the worker: mark the gate reached, then wait until it is opened."""
        self.reached.set()
        if not self._opened.wait(self.timeout):
            raise TimeoutError("the test never opened the gate")

    def open(self) -> None:
        """Let every waiting (and later) worker through."""
        self._opened.set()
