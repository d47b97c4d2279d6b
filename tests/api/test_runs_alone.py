"""A computation larger than the in-flight budget runs alone (docs/service.md, "Memory under
load"): it is admitted once nothing but its own request is in flight, and nothing else while it
runs.

Its charge used to be capped at the whole budget, while the request's own body (charged by the
body middleware before the route runs) already held a few bytes of it: held + budget never fit,
and valid tables under `max_response_bytes` were answered 503 `overloaded` ("retry in 1s")
forever, on an idle server. The cases are the outside probe's, on real servers with its settings:
a sinusoidal table computed in float32 is charged four times its bytes (`WORKING_FACTOR`), so an
8 MiB table takes exactly the 32 MiB budget and a 64 MiB one exactly 256 MiB. Each table served
is compared with `posenc.encodings.compute` of the same spec.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

from posenc.encodings import compute, parse_spec
from posenc.runtime import InFlightBudget
from posenc.runtime.cache import WORKING_FACTOR
from tests import waiting
from tests.api.test_memory_budget import stalled_get, status_line
from tests.api.wire import decode
from tests.conftest import ServerHandle, start_server

MiB = 1 << 20
PATIENCE = 20.0

SMALL_SERVER = {
    "cache_bytes": 64 * MiB,
    "in_flight_bytes": 32 * MiB,
    "max_response_bytes": 16 * MiB,
}
"""`posenc serve --cache-bytes 64MiB --in-flight-bytes 32MiB --max-response-bytes 16MiB`."""

EIGHT_MIB = {"kind": "sinusoidal", "dim": 64, "max_positions": 32768}
"""8 MiB of float32, charged 32 MiB to compute: the whole budget of `SMALL_SERVER`."""


def budget_of(handle: ServerHandle) -> InFlightBudget:
    budget = handle.state.require_cache().budget
    assert budget is not None
    return budget


def assert_served_exactly(response: httpx.Response, spec: dict[str, Any]) -> None:
    """200, and the tensors equal the library's table of `spec`, bit for bit."""
    assert response.status_code == 200, response.text[:300]
    expected = compute(parse_spec(spec))
    got = decode(response)
    assert set(got) == set(expected.tensors)
    for name, tensor in expected.tensors.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor), name


@pytest.fixture(scope="module")
def small() -> Iterator[ServerHandle]:
    with start_server(**SMALL_SERVER, send_timeout_seconds=PATIENCE) as handle:
        yield handle


def test_the_charge_of_the_probes_table_is_the_whole_budget() -> None:
    # what makes the case: the computation's charge is exactly the budget, beside a body charge
    spec = parse_spec(EIGHT_MIB).canonical()
    factor = WORKING_FACTOR.get(spec.cache_precision(), max(WORKING_FACTOR.values()))
    assert factor * spec.output_bytes() == SMALL_SERVER["in_flight_bytes"]


def test_a_table_whose_computation_takes_the_whole_budget_is_served(small: ServerHandle) -> None:
    budget = budget_of(small)
    with small.client() as client:
        assert_served_exactly(client.post("/v1/tables", json=EIGHT_MIB), EIGHT_MIB)
        assert waiting.wait_for(lambda: budget.held == 0, PATIENCE)
        # again, computed again once out of the cache
        small.state.require_cache().clear()
        assert_served_exactly(client.post("/v1/tables", json=EIGHT_MIB), EIGHT_MIB)
    assert budget.peak <= budget.max_bytes


def test_it_runs_alone_503_while_other_work_holds_the_budget(small: ServerHandle) -> None:
    """Admitted only when nothing else is in flight: while a stalled send holds part of the
    budget, the computation is refused (503, and its retry succeeds once the send is gone)."""
    budget = budget_of(small)
    other = {"kind": "sinusoidal", "dim": 64, "max_positions": 30000}  # 7.3 MiB: more than
    # loopback's socket buffers take, so the send stays in flight
    spec = {**EIGHT_MIB, "max_positions": 32767}
    with small.client() as client:
        path = client.post("/v1/tables", json=other).headers["content-location"]
        assert waiting.wait_for(lambda: budget.held == 0, PATIENCE)
        sock = stalled_get(small, path)
        try:
            assert status_line(sock).startswith(b"HTTP/1.1 200")
            assert waiting.wait_for(lambda: budget.held > 0, PATIENCE)
            refused = client.post("/v1/tables", json=spec)
            assert refused.status_code == 503, refused.text[:300]
            assert refused.json()["error_type"] == "overloaded"
        finally:
            sock.close()
        assert waiting.wait_for(lambda: budget.held == 0, PATIENCE)
        assert_served_exactly(client.post("/v1/tables", json=spec), spec)


@pytest.mark.parametrize("positions", [262143, 262144])
def test_a_64_mib_table_on_a_256_mib_budget_is_served(positions: int) -> None:
    """The probe's second server: 262143 positions were served, 262144 (charged 256 MiB, the
    whole budget) answered 503 forever."""
    spec = {"kind": "sinusoidal", "dim": 64, "max_positions": positions}
    with (
        start_server(
            cache_bytes=128 * MiB, in_flight_bytes=256 * MiB, max_response_bytes=64 * MiB
        ) as handle,
        handle.client() as client,
    ):
        assert_served_exactly(client.post("/v1/tables", json=spec), spec)
        assert budget_of(handle).peak <= 256 * MiB


@pytest.mark.parametrize("fmt", ["safetensors", "npy", "raw"])
def test_a_table_too_large_for_the_cache_at_the_response_limit_is_sent(fmt: str) -> None:
    """A table of exactly `max_response_bytes` that the cache cannot keep is charged twice
    (the table and its body) while sent: the whole budget at its minimum (twice
    `max_response_bytes`, checked at start-up), beside the request's own body; it runs alone
    too (was 503 forever in safetensors and npy; raw, a view, is charged once)."""
    spec = {"kind": "sinusoidal", "dim": 64, "max_positions": 65536}  # 16 MiB
    with (
        start_server(
            cache_bytes=8 * MiB, in_flight_bytes=32 * MiB, max_response_bytes=16 * MiB
        ) as handle,
        handle.client() as client,
    ):
        response = client.post("/v1/tables", json=spec, params={"format": fmt})
        assert_served_exactly(response, spec)
        budget = budget_of(handle)
        assert waiting.wait_for(lambda: budget.held == 0, PATIENCE)
        assert budget.peak <= budget.max_bytes


def test_v2_rows_of_a_table_too_large_to_compute_whole_are_served() -> None:
    """/v2 rope rows of a 64 MiB table: it fits a 512 MiB cache but is over the 16 MiB response
    limit, and its computation (4 x 64 MiB) over the 32 MiB in-flight budget: the asked rows are
    computed instead of the whole table (503 `overloaded` forever before), equal to the same
    rows of the library's table."""
    spec = {"kind": "rope", "head_dim": 128, "max_positions": 65536}
    positions = [0, 1, 40000, 65535]
    body = {
        "inputs": [{"name": "position_ids", "shape": [4], "datatype": "INT64", "data": positions}],
        "parameters": {"head_dim": 128, "max_positions": 65536},
    }
    settings = {**SMALL_SERVER, "cache_bytes": 512 * MiB}
    with start_server(**settings, send_timeout_seconds=PATIENCE) as handle, handle.client() as c:
        response = c.post("/v2/models/rope/infer", json=body)
        assert response.status_code == 200, response.text[:300]
        outputs = {o["name"]: o for o in response.json()["outputs"]}
        table = compute(parse_spec(spec)).tensors
        for name in ("cos", "sin"):
            got = torch.tensor(outputs[name]["data"], dtype=torch.float32)
            want = table[name][positions]
            assert list(outputs[name]["shape"]) == list(want.shape), name
            assert torch.equal(got.reshape(want.shape), want), name
        assert waiting.wait_for(lambda: budget_of(handle).held == 0, PATIENCE)
