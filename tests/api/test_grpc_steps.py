"""gRPC decode-step templates (api/grpc/steps.py): a repeated `ModelInfer` / `ModelStreamInfer`
request answered from the template of its last answer is the answer the slow path gives.

Two real servers on loopback with gRPC, with templates (the default) and without
(`prepared_answers=False`), get the same requests through tritonclient's gRPC clients (the stream
API and plain `infer`): one request shape, varying positions (in the table, past it, negative,
repeated) and ids. Every response message (or error) must be equal, the template server must
have kept templates (so the fast path is what is compared), and the inference counters, the
Triton statistics' counts, the cache's hits and the in-flight budget must move alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException

from tests.api.metrics_util import scrape, value
from tests.conftest import SERVER_DEVICES, ServerHandle, start_server
from tests.waiting import wait_for

ROPE = {"head_dim": 64, "max_positions": 64}
POSITIONS = [[5], [5], [17], [63], [64], [-1], [0], [200], [63], [3]]


@pytest.fixture(scope="module", params=SERVER_DEVICES)
def servers(request: pytest.FixtureRequest) -> Iterator[tuple[ServerHandle, ServerHandle]]:
    """Servers with templates and without, on the CPU and, where present, on the GPU (where
    templates slice rows from a host copy of the device table)."""
    with (
        start_server(device=request.param, grpc_port=0) as fast,
        start_server(device=request.param, grpc_port=0, prepared_answers=False) as slow,
    ):
        yield fast, slow


def _inputs(positions: np.ndarray[Any, Any]) -> list[tgrpc.InferInput]:
    datatype = {np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}[positions.dtype]
    item = tgrpc.InferInput("position_ids", list(positions.shape), datatype)
    item.set_data_from_numpy(positions)
    return [item]


def _outputs(names: list[str] | None) -> list[tgrpc.InferRequestedOutput] | None:
    return None if names is None else [tgrpc.InferRequestedOutput(n) for n in names]


Outcome = tuple[Any, str | None]
"""(the response message, or None; the error's status and message, or None)."""


def _stream(
    server: ServerHandle,
    steps: list[tuple[np.ndarray[Any, Any], str]],
    params: dict[str, Any],
    outputs: list[str] | None,
) -> list[Outcome]:
    """Every step over one `ModelStreamInfer` stream, in order."""
    got: list[Outcome] = []

    def callback(result: Any, error: Any) -> None:
        if error is not None:
            got.append((None, f"{error.status()} {error.message()}"))
        else:
            got.append((result.get_response(), None))

    client = tgrpc.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=callback)
    try:
        for positions, request_id in steps:
            client.async_stream_infer(
                "rope",
                _inputs(positions),
                outputs=_outputs(outputs),
                request_id=request_id,
                parameters=params,
            )
        assert wait_for(lambda: len(got) == len(steps))
    finally:
        client.stop_stream()
        client.close()
    return got


def _unary(
    server: ServerHandle,
    steps: list[tuple[np.ndarray[Any, Any], str]],
    params: dict[str, Any],
    outputs: list[str] | None,
) -> list[Outcome]:
    """Every step as its own `ModelInfer` call."""
    got: list[Outcome] = []
    client = tgrpc.InferenceServerClient(server.grpc_url)
    try:
        for positions, request_id in steps:
            try:
                result = client.infer(
                    "rope",
                    _inputs(positions),
                    outputs=_outputs(outputs),
                    request_id=request_id,
                    parameters=params,
                )
                got.append((result.get_response(), None))
            except InferenceServerException as err:
                got.append((None, f"{err.status()} {err.message()}"))
    finally:
        client.close()
    return got


def _counts(server: ServerHandle) -> dict[str, float]:
    """The counters both paths must move alike: Triton's statistics of `rope` (counts only;
    durations differ), `posenc_v2_infer_total{model=rope}` by source, the cache's hits."""
    client = tgrpc.InferenceServerClient(server.grpc_url)
    try:
        (stats,) = client.get_inference_statistics("rope").model_stats
    finally:
        client.close()
    inference = stats.inference_stats
    counts: dict[str, float] = {
        f"stats.{field}": getattr(inference, field).count
        for field in (
            "success",
            "fail",
            "compute_input",
            "compute_infer",
            "compute_output",
            "cache_hit",
            "cache_miss",
        )
    }
    counts["stats.inference_count"] = stats.inference_count
    with server.client() as c:
        metrics = scrape(c)
    for source in ("hit", "miss", "computed"):
        counts[f"infer.{source}"] = value(
            metrics, "posenc_v2_infer_total", model="rope", source=source
        )
    counts["cache.hits"] = server.state.require_cache().stats.hits
    return counts


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


SHAPES: list[tuple[str, dict[str, Any], list[str] | None, bool]] = [
    # (dtype of the positions, spec parameters, outputs, the same id every step)
    ("int64", ROPE, ["cos", "sin"], False),
    ("int32", {**ROPE, "dtype": "bfloat16"}, ["sin"], True),
    ("int64", {**ROPE, "rope_theta": 5000.0}, None, False),  # default outputs
]


@pytest.mark.parametrize("call", ["stream", "unary"])
@pytest.mark.parametrize(("dtype", "params", "outputs", "same_id"), SHAPES)
def test_steps_answer_as_the_slow_path(
    servers: tuple[ServerHandle, ServerHandle],
    call: str,
    dtype: str,
    params: dict[str, Any],
    outputs: list[str] | None,
    same_id: bool,
) -> None:
    fast, slow = servers
    run = _stream if call == "stream" else _unary
    if call == "unary":  # another table than the stream's: its own template
        params = {**params, "rope_theta": 2 * params.get("rope_theta", 10000.0)}
    steps = [
        (np.array(p, dtype=dtype), "step" if same_id else f"step-{i}")
        for i, p in enumerate(POSITIONS)
    ]
    templates = len(fast.state.steps)
    before = [_counts(s) for s in servers]
    got = run(fast, steps, params, outputs)
    want = run(slow, steps, params, outputs)
    assert got == want
    answered = [r for r, _ in got if r is not None]
    assert len(answered) >= 7
    assert [r.parameters["posenc_source"].string_param for r in answered].count("hit") >= 5
    assert len(fast.state.steps) > templates  # the fast path was taken
    assert len(slow.state.steps) == 0
    moved_fast, moved_slow = (_delta(b, _counts(s)) for b, s in zip(before, servers, strict=True))
    assert moved_fast == moved_slow
    assert moved_fast["stats.cache_hit"] >= 5
    for server in servers:
        budget = server.state.budget
        assert budget is not None
        assert wait_for(lambda b=budget: b.held == 0)


def test_batches_of_positions(servers: tuple[ServerHandle, ServerHandle]) -> None:
    """Several positions per step, in a 2-D input, repeated and out of order, over a stream."""
    fast, slow = servers
    steps = [
        (np.array(p, dtype=np.int64), "")
        for p in ([[3, 9, 9, 0]], [[63, 1, 2, 3]], [[4, 5, 6, 7]], [[1, 64, 2, 3]], [[0, 0, 0, 0]])
    ]
    got = _stream(fast, steps, ROPE, ["cos"])
    assert got == _stream(slow, steps, ROPE, ["cos"])
    assert all(error is None for _, error in got)


def test_an_evicted_table_is_computed_again() -> None:
    """A cache holding one table: a step after its eviction recomputes it (`miss`)."""
    a, b = {**ROPE, "max_positions": 100}, {**ROPE, "max_positions": 101}
    answers = []
    for prepared in (True, False):
        with start_server(
            device="cpu", grpc_port=0, cache_bytes=60_000, prepared_answers=prepared
        ) as s:
            seen = []
            for params in (a, a, a, b, a, a):
                (outcome,) = _unary(s, [(np.array([9], dtype=np.int64), "")], params, ["cos"])
                seen.append(outcome)
            answers.append(seen)
    assert answers[0] == answers[1]
    sources = [r.parameters["posenc_source"].string_param for r, _ in answers[0]]
    assert sources == ["miss", "hit", "hit", "miss", "miss", "hit"]
