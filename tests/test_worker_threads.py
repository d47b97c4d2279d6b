"""tests/conftest.py's `_share_cores`: under pytest-xdist each worker's torch uses its share of
the cores (and tells its subprocesses so through `OMP_NUM_THREADS`); `OMP_NUM_THREADS` given by
the user, or no xdist, leaves torch's default alone."""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import _share_cores


def test_a_worker_gets_its_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
        share = max(1, (os.cpu_count() or 1) // 2)
        assert _share_cores() == share
        assert torch.get_num_threads() == share
        assert os.environ["OMP_NUM_THREADS"] == str(share)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(10 * (os.cpu_count() or 1)))
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert _share_cores() == 1  # never none
        assert _share_cores() is None  # OMP_NUM_THREADS set (here by the call before)
        monkeypatch.delenv("OMP_NUM_THREADS")
        monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT")
        assert _share_cores() is None  # not under xdist
    finally:
        torch.set_num_threads(before)
