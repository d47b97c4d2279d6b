"""tests/waiting.py: conditions are waited for until they hold or the deadline passes, and a gate
nobody opens fails its worker instead of hanging the suite."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.waiting import Gate, async_wait_for, wait_for


def test_wait_for_returns_as_soon_as_the_condition_holds_or_false_at_the_deadline() -> None:
    calls = iter(range(100))
    assert wait_for(lambda: next(calls) == 3, timeout=5, interval=0)
    assert next(calls) == 4  # polled exactly until it held
    assert wait_for(lambda: False, timeout=0.05) is False


def test_async_wait_for_yields_to_the_loop() -> None:
    async def run() -> tuple[bool, bool]:
        flag = asyncio.Event()
        asyncio.get_running_loop().call_soon(flag.set)
        return await async_wait_for(flag.is_set, timeout=5), await async_wait_for(
            lambda: False, timeout=0.05
        )

    assert asyncio.run(run()) == (True, False)


def test_gate_holds_workers_until_opened_and_fails_when_never_opened() -> None:
    gate = Gate()
    passed = threading.Event()

    def worker() -> None:
        gate.pass_through()
        passed.set()

    thread = threading.Thread(target=worker)
    thread.start()
    assert gate.reached.wait(5)
    assert not passed.is_set()
    gate.open()
    thread.join(5)
    assert passed.is_set()
    with pytest.raises(TimeoutError, match="never opened"):
        Gate(timeout=0.01).pass_through()
