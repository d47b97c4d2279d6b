"""Decode-step templates (api/oip/steps.py): a repeated `/v2` infer request answered from the
template of its last answer is the answer the slow path gives.

Two real servers on loopback, with templates (the default) and without
(`prepared_answers=False`), get the same sequence of binary infer requests (one header, varying
positions: in the table, past it, negative, repeated); status, headers (but `date`) and bodies
must be equal at every step, the template server must have kept the templates it should (so the
fast path is what is compared), and the inference counters and cache hits must move alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.api.metrics_util import scrape, value
from tests.conftest import SERVER_DEVICES, ServerHandle, start_server

ROPE = {"head_dim": 64, "max_positions": 64}


@pytest.fixture(scope="module", params=SERVER_DEVICES)
def servers(request: pytest.FixtureRequest) -> Iterator[tuple[ServerHandle, ServerHandle]]:
    """Servers with templates and without, on the CPU and, where present, on the GPU (where
    templates slice rows from a host copy of the device table)."""
    with (
        start_server(device=request.param) as fast,
        start_server(device=request.param, prepared_answers=False) as slow,
    ):
        yield fast, slow


def step(
    positions: np.ndarray[Any, Any],
    params: dict[str, Any],
    outputs: dict[str, bool] | None = None,
    request_id: str | None = None,
) -> tuple[bytes, dict[str, str]]:
    """A binary infer request: the body (JSON header, then the positions) and its headers."""
    ids = positions.tobytes()
    datatype = {np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}[positions.dtype]
    head: dict[str, Any] = {
        "inputs": [
            {
                "name": "position_ids",
                "shape": list(positions.shape),
                "datatype": datatype,
                "parameters": {"binary_data_size": len(ids)},
            }
        ],
        "parameters": params,
    }
    if outputs is not None:
        head["outputs"] = [
            {"name": n, "parameters": {"binary_data": b}} for n, b in outputs.items()
        ]
    if request_id is not None:
        head["id"] = request_id
    text = json.dumps(head).encode()
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(text)),
    }
    return text + ids, headers


def _exchange(server: ServerHandle, path: str, body: bytes, headers: dict[str, str]) -> Any:
    with server.client() as c:
        r = c.post(path, content=body, headers=headers)
    return r.status_code, sorted((k, v) for k, v in r.headers.items() if k != "date"), r.content


SEQUENCES: list[tuple[str, dict[str, Any], dict[str, bool] | None, str, bool]] = [
    # (dtype of the positions, spec parameters, outputs, path, templated)
    ("int64", ROPE, {"cos": True, "sin": True}, "/v2/models/rope/infer", True),
    ("int64", ROPE, None, "/v2/models/rope/versions/1/infer", False),  # default outputs: JSON
    ("int32", {**ROPE, "dtype": "bfloat16"}, {"sin": True}, "/v2/models/rope/infer", True),
    (
        "int64",
        {**ROPE, "head_dim": 32},
        {"cos": True, "inv_freq": True},
        "/v2/models/rope/infer",
        False,
    ),
    ("int64", ROPE, {"cos": True, "sin": False}, "/v2/models/rope/infer", False),
]
POSITIONS = [[5], [5], [17], [63], [64], [-1], [0], [200], [63], [3]]


@pytest.mark.parametrize(("dtype", "params", "outputs", "path", "templated"), SEQUENCES)
def test_steps_answer_as_the_slow_path(
    servers: tuple[ServerHandle, ServerHandle],
    dtype: str,
    params: dict[str, Any],
    outputs: dict[str, bool] | None,
    path: str,
    templated: bool,
) -> None:
    fast, slow = servers
    before = len(fast.state.steps)
    with fast.client() as c:
        counts = scrape(c)
    for positions in POSITIONS:
        body, headers = step(np.array(positions, dtype=dtype), params, outputs, "step")
        got = _exchange(fast, path, body, headers)
        assert got == _exchange(slow, path, body, headers), positions
    assert (len(fast.state.steps) > before) == templated
    assert len(slow.state.steps) == 0
    with fast.client() as c:
        after = scrape(c)
    hits = value(after, "posenc_v2_infer_total", model="rope", source="hit")
    assert hits - value(counts, "posenc_v2_infer_total", model="rope", source="hit") >= 6


def test_a_batch_of_positions_and_shapes(servers: tuple[ServerHandle, ServerHandle]) -> None:
    """Several positions per step, in a 2-D input, repeated and out of order."""
    fast, slow = servers
    for positions in ([[3, 9, 9, 0]], [[63, 1, 2, 3]], [[4, 5, 6, 7]], [[1, 64, 2, 3]]):
        body, headers = step(np.array(positions, dtype=np.int64), ROPE, {"sin": True})
        got = _exchange(fast, "/v2/models/rope/infer", body, headers)
        assert got == _exchange(slow, "/v2/models/rope/infer", body, headers)
        assert got[0] == 200


def test_templates_count_hits_and_hold_no_charge(
    servers: tuple[ServerHandle, ServerHandle],
) -> None:
    body, headers = step(np.array([7], dtype=np.int64), {**ROPE, "rope_theta": 500.0})
    for server in servers:
        cache = server.state.require_cache()
        _exchange(server, "/v2/models/rope/infer", body, headers)
        hits = cache.stats.hits
        for _ in range(4):
            assert _exchange(server, "/v2/models/rope/infer", body, headers)[0] == 200
        assert cache.stats.hits == hits + 4
        budget = server.state.budget
        assert budget is not None
        assert budget.held == 0


def test_an_evicted_table_is_computed_again() -> None:
    """A cache holding one table: a step after its eviction recomputes it (`miss`)."""
    a, b = {**ROPE, "max_positions": 100}, {**ROPE, "max_positions": 101}
    answers = []
    for prepared in (True, False):
        seen = []
        with start_server(device="cpu", cache_bytes=60_000, prepared_answers=prepared) as s:
            for params in (a, a, a, b, a, a):
                body, headers = step(np.array([9], dtype=np.int64), params, {"cos": True})
                status, _, content = _exchange(s, "/v2/models/rope/infer", body, headers)
                seen.append((status, content))
        answers.append(seen)
    assert answers[0] == answers[1]
    assert b'"posenc_source":"miss"' in answers[0][4][1]


def _counts(server: ServerHandle) -> dict[str, float]:
    """What both paths must move alike: Triton's statistics of `rope` (counts; durations
    differ), `posenc_v2_infer_total{model=rope}` by source, the cache's hits, the requests
    counted per route and status."""
    with server.client() as c:
        (stats,) = c.get("/v2/models/rope/stats").json()["model_stats"]
        metrics = scrape(c)
    counts: dict[str, float] = {
        f"stats.{k}": d["count"] for k, d in stats["inference_stats"].items()
    }
    counts["stats.inference_count"] = stats["inference_count"]
    for source in ("hit", "miss", "computed"):
        counts[f"infer.{source}"] = value(
            metrics, "posenc_v2_infer_total", model="rope", source=source
        )
    for status in ("200", "400"):
        counts[f"http.{status}"] = value(
            metrics,
            "posenc_http_requests_total",
            method="POST",
            route="/v2/models/{model}/infer",
            status=status,
        )
    counts["cache.hits"] = server.state.require_cache().stats.hits
    return counts


def test_statistics_and_metrics_move_alike(servers: tuple[ServerHandle, ServerHandle]) -> None:
    """A templated step is counted as the slow path counts it: a success and a cache hit in
    Triton's statistics, a `hit` inference, a 200 under the route's template, a cache hit."""
    fast, slow = servers
    params = {**ROPE, "rope_theta": 20000.0}
    before = [_counts(s) for s in servers]
    for positions in POSITIONS:
        body, headers = step(np.array(positions, dtype=np.int64), params, {"cos": True})
        got = _exchange(fast, "/v2/models/rope/infer", body, headers)
        assert got == _exchange(slow, "/v2/models/rope/infer", body, headers)
    moved_fast, moved_slow = (
        {k: v - b[k] for k, v in _counts(s).items()} for b, s in zip(before, servers, strict=True)
    )
    assert moved_fast == moved_slow
    assert moved_fast["stats.cache_hit"] >= 6
    assert moved_fast["http.200"] >= 8
