"""Triton's conventions beyond the core protocol, through tritonclient.http and
tritonclient.grpc on a real server: the repository index (`POST /v2/repository/index`, gRPC
RepositoryIndex), per-model inference statistics counted where the /v2 inferences run over
either protocol (`GET /v2/models[/{model}[/versions/1]]/stats`, gRPC ModelStatistics), both
behind the API keys like the model routes; and `posenc_build_info` on /metrics."""

from __future__ import annotations

import platform
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.grpc as tgrpc
import tritonclient.http as http
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

import posenc
from posenc.api.oip import MODELS
from tests.api.v2client import make_input, url
from tests.conftest import ServerHandle, start_server

KEY = "k-triton"


def auth() -> dict[str, str]:
    """The key as a header (a new dict each time: tritonclient.http adds its own headers to the
    dict it is given)."""
    return {"authorization": f"Bearer {KEY}"}


ROPE = {"head_dim": 32, "max_positions": 64, "rope_theta": 5000.0}
POSITIONS = np.array([1, 63, 5], np.int64)
DURATIONS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)


@pytest.fixture(scope="module")
def fresh() -> Iterator[ServerHandle]:
    """A server of its own (statistics start at zero), with gRPC and an API key."""
    with start_server(grpc_port=0, api_keys=[KEY]) as handle:
        yield handle


@pytest.fixture(scope="module")
def triton_http(fresh: ServerHandle) -> Iterator[http.InferenceServerClient]:
    client = http.InferenceServerClient(url(fresh))
    yield client
    client.close()


@pytest.fixture(scope="module")
def triton_grpc(fresh: ServerHandle) -> Iterator[tgrpc.InferenceServerClient]:
    client = tgrpc.InferenceServerClient(fresh.grpc_url)
    yield client
    client.close()


def _grpc_rope_input() -> list[tgrpc.InferInput]:
    item = tgrpc.InferInput("position_ids", list(POSITIONS.shape), "INT64")
    item.set_data_from_numpy(POSITIONS)
    return [item]


def _fails(call: Any) -> str:
    with pytest.raises(InferenceServerException) as failed:
        call()
    return str(failed.value.status())


def test_repository_index(
    fresh: ServerHandle,
    triton_http: http.InferenceServerClient,
    triton_grpc: tgrpc.InferenceServerClient,
) -> None:
    expected = [{"name": n, "version": "1", "state": "READY"} for n in sorted(MODELS)]
    over_http = triton_http.get_model_repository_index(headers=auth())
    assert [{k: m[k] for k in ("name", "version", "state")} for m in over_http] == expected
    assert {m["reason"] for m in over_http} == {""}
    over_grpc = triton_grpc.get_model_repository_index(headers=auth(), as_json=True)
    # protobuf's JSON leaves out empty strings (reason)
    assert over_grpc["models"] == expected
    # the protocol's own body: only ready models, a repository name
    with fresh.client(headers=auth()) as c:
        ready = c.post("/v2/repository/index", json={"ready": True, "repository_name": ""})
        assert ready.json() == over_http
        bad = c.post("/v2/repository/index", json={"ready": "yes"})
        assert bad.status_code == 400
        assert set(bad.json()) == {"error"}
        assert c.post("/v2/repository/index", content=b"[").status_code == 400


def test_index_and_statistics_need_the_key(
    triton_http: http.InferenceServerClient, triton_grpc: tgrpc.InferenceServerClient
) -> None:
    assert _fails(triton_http.get_model_repository_index) == "401"
    assert _fails(lambda: triton_http.get_inference_statistics("rope")) == "401"
    assert _fails(triton_grpc.get_model_repository_index) == "StatusCode.UNAUTHENTICATED"
    assert _fails(triton_grpc.get_inference_statistics) == "StatusCode.UNAUTHENTICATED"


def test_statistics_count_inferences_over_both_protocols(
    triton_http: http.InferenceServerClient, triton_grpc: tgrpc.InferenceServerClient
) -> None:
    before = time.time_ns() // 1_000_000
    # rope: two answered over HTTP (the table computed, then resident), one over gRPC, and two
    # refused after the model was found (an input it does not take; an unknown parameter)
    for _ in range(2):
        triton_http.infer(
            "rope", [make_input("position_ids", POSITIONS)], parameters=ROPE, headers=auth()
        )
    triton_grpc.infer("rope", _grpc_rope_input(), parameters=ROPE, headers=auth())
    wrong = make_input("positions", POSITIONS)
    assert (
        _fails(lambda: triton_http.infer("rope", [wrong], parameters=ROPE, headers=auth())) == "400"
    )
    assert (
        _fails(
            lambda: triton_grpc.infer(
                "rope", _grpc_rope_input(), parameters={**ROPE, "nope": 1}, headers=auth()
            )
        )
        == "StatusCode.INVALID_ARGUMENT"
    )
    # an unknown model counts nowhere
    assert _fails(lambda: triton_http.infer("nope", [wrong], headers=auth())) == "404"
    after = time.time_ns() // 1_000_000

    one = triton_http.get_inference_statistics("rope", headers=auth())["model_stats"]
    versioned = triton_http.get_inference_statistics("rope", "1", headers=auth())["model_stats"]
    assert one == versioned
    (rope,) = one
    assert (rope["name"], rope["version"]) == ("rope", "1")
    assert rope["inference_count"] == rope["execution_count"] == 3
    assert before <= rope["last_inference"] <= after
    stats = rope["inference_stats"]
    assert set(stats) == set(DURATIONS)
    assert stats["success"]["count"] == 3
    assert stats["fail"]["count"] == 2
    assert stats["fail"]["ns"] > 0
    for phase in ("compute_input", "compute_infer", "compute_output"):
        assert stats[phase]["count"] == 3, phase
        assert stats[phase]["ns"] > 0, phase
    phases = sum(stats[p]["ns"] for p in ("compute_input", "compute_infer", "compute_output"))
    assert stats["success"]["ns"] >= phases
    # the first computed the table, the next two found it resident
    assert stats["cache_miss"]["count"] == 1
    assert stats["cache_hit"]["count"] == 2
    assert stats["queue"] == {"count": 0, "ns": 0}

    # gRPC answers the same numbers (protobuf's JSON: 64-bit integers as strings, zeros left out)
    over_grpc = triton_grpc.get_inference_statistics("rope", headers=auth(), as_json=True)
    (grpc_rope,) = over_grpc["model_stats"]
    assert int(grpc_rope["inference_count"]) == 3
    assert int(grpc_rope["last_inference"]) == rope["last_inference"]
    for name in DURATIONS:
        got = grpc_rope["inference_stats"].get(name, {})
        assert int(got.get("count", 0)) == stats[name]["count"], name
        assert int(got.get("ns", 0)) == stats[name]["ns"], name

    # every model, untouched ones at zero
    every = triton_http.get_inference_statistics(headers=auth())["model_stats"]
    assert [m["name"] for m in every] == sorted(MODELS)
    assert next(m for m in every if m["name"] == "rope") == rope
    alibi = next(m for m in every if m["name"] == "alibi")
    assert alibi["inference_count"] == 0
    assert alibi["inference_stats"]["success"] == {"count": 0, "ns": 0}
    every_grpc = triton_grpc.get_inference_statistics(headers=auth(), as_json=True)
    assert [m["name"] for m in every_grpc["model_stats"]] == sorted(MODELS)

    # an unknown model or version is the protocol's 404 / NOT_FOUND
    assert _fails(lambda: triton_http.get_inference_statistics("nope", headers=auth())) == "404"
    assert (
        _fails(lambda: triton_grpc.get_inference_statistics("rope", "7", headers=auth()))
        == "StatusCode.NOT_FOUND"
    )


def test_build_info_metric(fresh: ServerHandle) -> None:
    with fresh.client() as c:
        text = c.get("/metrics").text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "posenc_build_info"]
    (sample,) = family.samples
    assert sample.name == "posenc_build_info"
    assert sample.value == 1
    assert sample.labels == {
        "version": posenc.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(fresh.device),
    }
