"""`POST /v1/check/onnx`: the RoPE caches baked into an uploaded ONNX model against a rope table
the server resolved, with `posenc-client verify`'s verdicts and diagnosis (the same code,
`posenc_check.verify`), a departure map, caches in external data named and not read, and every
bad request a 4xx with `{"error", "error_type", "detail"}`.

The models are GQA blocks (`tests.client.blocks`) baked with served tables of another spec, as
in tests/client/test_onnx_verify.py: Llama 3.1's theta without its llama3 scaling is what
onnxruntime-genai's builder bakes for a linear-scaled model (its scaling dropped, issue 19).
"""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest

from tests.client import blocks
from tests.conftest import ServerHandle, start_server

HD, HEADS, KV_HEADS, ROWS = 128, 4, 2, 512
LLAMA31 = "llama-3.1-8b"


def _rope(client: httpx.Client, rows: int = ROWS, **fields: object) -> dict[str, np.ndarray]:
    """A served half-width rope table (Llama 3.1's head size and theta unless overridden): the
    reference bytes (`device=cpu`), what a model exported on the CPU bakes and the check
    compares with, whatever the server's device."""
    spec = {"kind": "rope", "head_dim": HD, "rope_theta": 500000.0, "max_positions": rows,
            "profile": "ort_gqa", **fields}  # fmt: skip
    response = client.post("/v1/tables", params={"format": "npz", "device": "cpu"}, json=spec)
    assert response.status_code == 200, response.text
    return dict(np.load(io.BytesIO(response.content)))


def _model_bytes(cos: np.ndarray, sin: np.ndarray) -> bytes:
    return blocks.baked_gqa_block(HD, HEADS, KV_HEADS, cos, sin).SerializeToString()


def _preset_key(client: httpx.Client, name: str = LLAMA31) -> str:
    key: str = client.get(f"/v1/presets/{name}").json()["parts"][0]["key"]
    return key


def _check(client: httpx.Client, key: str, body: bytes) -> httpx.Response:
    return client.post(
        "/v1/check/onnx",
        params={"key": key},
        content=body,
        headers={"Content-Type": "application/octet-stream"},
    )


def test_missing_scaling_is_diagnosed_with_where_it_departs(client: httpx.Client) -> None:
    default = _rope(client)  # Llama 3.1's theta, its llama3 scaling dropped
    key = _preset_key(client)
    response = _check(client, key, _model_bytes(default["cos"], default["sin"]))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["key"] == key
    assert body["external"] == []
    cos, sin = body["caches"]
    assert (cos["name"], sin["name"]) == ("cos", "sin")
    for report in (cos, sin):
        assert report["verdict"] == "repair"
        assert report["nodes"] == ["gqa"]
        assert report["shape"] == [ROWS, HD // 2]
        assert report["dtype"] == "float32"
        assert report["rows"] == ROWS
        assert "the config's llama3 scaling is missing" in " ".join(report["diagnosis"])
        assert report["max_abs"] > 0.1
        assert report["max_ulp"] > 1000
        assert report["line"].startswith(f"{report['name']}: repair: max abs")
    # row 0 is angle 0 for every frequency; llama3 leaves pairs 0..28 unscaled (field guide)
    assert cos["first"][0] == 1
    assert cos["first"][1] > 28
    # the map: the largest |model - exact| per block of 2 positions x 1 column, none at row 0
    grid = np.array(cos["map"]["data"])
    assert (cos["map"]["row_step"], cos["map"]["col_step"]) == (2, 1)
    assert grid.shape == (ROWS // 2, HD // 2)
    assert grid.max() == pytest.approx(cos["max_abs"])
    assert np.all(grid[:, :29] == 0)  # unscaled pairs agree
    # the exact table it was compared with: Llama 3.1's at the model's rows, half width
    exact = client.get(f"/v1/tables/{cos['exact_key']}", params={"format": "npz", "device": "cpu"})
    table = np.load(io.BytesIO(exact.content))
    assert table["cos"].shape == (ROWS, HD // 2)
    assert np.abs(table["cos"] - default["cos"]).max() == pytest.approx(cos["max_abs"])


def test_exact_caches_and_another_theta(client: httpx.Client) -> None:
    key = _preset_key(client)
    served = client.get(f"/v1/presets/{LLAMA31}").json()["parts"][0]["spec"]
    fields = {"rope_scaling": served["rope_scaling"], "max_positions": ROWS}
    exact = _rope(client, **fields)
    body = _check(client, key, _model_bytes(exact["cos"], exact["sin"])).json()
    assert [(r["verdict"], r["first"], r["max_abs"]) for r in body["caches"]] == [
        ("exact", None, 0.0),
        ("exact", None, 0.0),
    ]
    other = _rope(client, rope_theta=10000.0)
    llama2 = _preset_key(client, "llama-2-7b")  # default RoPE, theta 1e4
    body = _check(client, llama2, _model_bytes(other["cos"], other["sin"])).json()
    assert {r["verdict"] for r in body["caches"]} == {"exact"}
    body = _check(
        client, _preset_key(client, "qwen2.5-7b"), _model_bytes(other["cos"], other["sin"])
    ).json()
    verdicts = {r["verdict"] for r in body["caches"]}
    assert verdicts == {"mismatch"}
    assert "wrong theta" in body["caches"][0]["diagnosis"][0]


def test_caches_in_external_data_are_named_not_read(client: httpx.Client, tmp_path: Path) -> None:
    default = _rope(client)
    model = blocks.baked_gqa_block(HD, HEADS, KV_HEADS, default["cos"], default["sin"])
    path = tmp_path / "model.onnx"
    onnx.save(model, path, save_as_external_data=True, location="model.onnx.data",
              size_threshold=0)  # fmt: skip
    response = _check(client, _preset_key(client), path.read_bytes())  # the graph only
    assert response.status_code == 200, response.text
    body = response.json()
    # the route reads no data file: both caches are named, and the site is not checkable
    (site,) = body["caches"]
    assert (site["name"], site["verdict"], site["nodes"]) == ("cos", "not_checkable", ["gqa"])
    assert "external data" in site["diagnosis"][0]
    assert body["outcome"] == "not_checkable"
    assert body["external"] == [
        {"name": "cos", "location": "model.onnx.data"},
        {"name": "sin", "location": "model.onnx.data"},
    ]


def _error(response: httpx.Response, status: int, error_type: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error_type"] == error_type
    assert set(body) >= {"error", "error_type", "detail"}
    message: str = body["error"]
    return message


def test_bad_requests_are_4xx(client: httpx.Client) -> None:
    key = _preset_key(client)
    default = _rope(client)
    model = _model_bytes(default["cos"], default["sin"])
    assert "not an ONNX model" in _error(_check(client, key, b"not a model"), 400, "invalid_model")
    assert "no graph" in _error(_check(client, key, b""), 400, "invalid_model")
    missing = client.post("/v1/check/onnx", content=model)
    assert "key" in _error(missing, 422, "invalid_request")
    _error(_check(client, "0" * 64, model), 404, "unknown_key")
    alibi = _preset_key(client, "bloom-560m")
    assert "rope table" in _error(_check(client, alibi, model), 422, "invalid_request")
    no_rope = blocks.alibi_block(2, 8).SerializeToString()
    assert "no RoPE site" in _error(_check(client, key, no_rope), 422, "no_rope_caches")
    # caches that are no (P, d/2) tables: a site reported not checkable, never a pass
    flat = _check(client, key, _model_bytes(default["cos"][0], default["sin"][0]))
    assert flat.status_code == 200, flat.text
    (site,) = flat.json()["caches"]
    assert site["verdict"] == "not_checkable"
    assert "(P, d/2)" in site["diagnosis"][0]
    assert flat.json()["outcome"] == "not_checkable"
    # a cache of a dtype a table cannot have: the spec error names the field
    wide = _model_bytes(default["cos"].astype(np.float64), default["sin"].astype(np.float64))
    _error(_check(client, key, wide), 422, "invalid_spec")


def test_upload_limit_is_checked_before_the_body() -> None:
    with start_server(max_upload_bytes=4096) as srv, srv.client() as c:
        key = _preset_key(c)
        response = c.post(
            "/v1/check/onnx",
            params={"key": key},
            content=b"\x08" * 8192,
            headers={"Content-Type": "application/octet-stream"},
        )
        assert "exceeds the limit of 4096" in _error(response, 413, "body_too_large")


def _pairings(cos_names: list[str], sin_names: list[str], rows: int, value: np.ndarray) -> bytes:
    """A GQA model whose initializers (each `value`, (rows, HD/2)) are wired into one
    GroupQueryAttention per (cos, sin) pairing: len(cos_names) x len(sin_names) nodes."""
    cache = np.ascontiguousarray(value[:rows])
    model = blocks.gqa_pairings(HD, HEADS, KV_HEADS, cos_names, sin_names, cache)
    return model.SerializeToString()


class _Probe:
    """/v2/health/live polled from a thread while a check runs: each answer's status and
    latency (a liveness probe's view of the event loop)."""

    def __init__(self, client: httpx.Client) -> None:
        import threading

        self.client = client
        self.results: list[tuple[int, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import time

        while not self.stop.is_set():
            start = time.perf_counter()
            status = self.client.get("/v2/health/live").status_code
            self.results.append((status, time.perf_counter() - start))
            # the probe's own cadence (a liveness prober, 100 Hz), not a wait for a condition
            time.sleep(0.01)

    def __enter__(self) -> _Probe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


HEALTH_BOUND_S = 2.0
"""A generous bound on one health answer during a check (2 shared CPU cores; the blocking route
took 17.5 s): the refusal and the caps are the asserted bounds, speed is measured in bench/."""


def test_hostile_pairings_are_refused_while_health_answers(server: ServerHandle) -> None:
    """k = 40 initializers of (1024, 64) float32 (a 10.5 MB model) wired into k^2 = 1600
    GroupQueryAttention pairings, each tensor read as cos by some nodes and as sin by others:
    refused (422 `site_limit`) before any value is compared, health answering all along."""
    names = [f"c{i}" for i in range(40)]
    with server.client() as http, server.client() as health:
        body = _pairings(names, names, 1024, _rope(http, rows=1024)["cos"])
        assert len(body) > 10 * 10**6
        key = _preset_key(http)
        with _Probe(health) as probe:
            response = _check(http, key, body)
    message = _error(response, 422, "site_limit")
    assert "read as cos by one RoPE consumer and as sin by another" in message
    assert probe.results, "no health answer during the check"
    assert {status for status, _ in probe.results} == {200}
    assert max(latency for _, latency in probe.results) < HEALTH_BOUND_S


def test_the_most_sites_answer_within_the_map_cap(server: ServerHandle) -> None:
    """15 cos x 15 sin distinct initializers (225 sites, under MAX_SITES) holding the exact
    table: every site is reported exact, and the maps of the 450 reports hold at most
    MAP_CELLS cells in all; health answers meanwhile. 17 x 17 (289 sites) is refused."""
    from posenc.api.routes.check import MAP_CELLS
    from posenc_check.sites import MAX_SITES

    with server.client() as http, server.client() as health:
        key = _preset_key(http)
        served = http.get(f"/v1/presets/{LLAMA31}").json()["parts"][0]["spec"]
        exact = _rope(http, rows=64, rope_scaling=served["rope_scaling"])
        cos, sin = [f"cos{i}" for i in range(15)], [f"sin{i}" for i in range(15)]
        assert len(cos) * len(sin) <= MAX_SITES
        model = _pairings(cos, sin, 64, exact["cos"])
        # each sin initializer must hold the sin table: rebuild with both tables
        loaded = onnx.load_from_string(model)
        for initializer in loaded.graph.initializer:
            if initializer.name.startswith("sin"):
                values = np.ascontiguousarray(exact["sin"][:64])
                initializer.CopyFrom(onnx.numpy_helper.from_array(values, initializer.name))
        with _Probe(health) as probe:
            response = _check(http, key, loaded.SerializeToString())
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["outcome"] == "exact"
        assert len(body["caches"]) == 2 * 15 * 15
        assert {r["verdict"] for r in body["caches"]} == {"exact"}
        cells = sum(len(r["map"]["data"]) * len(r["map"]["data"][0]) for r in body["caches"])
        assert cells <= MAP_CELLS
        assert {status for status, _ in probe.results} <= {200}
        assert max((latency for _, latency in probe.results), default=0.0) < HEALTH_BOUND_S

        names = [f"c{i}" for i in range(17)]
        refused = _check(http, key, _pairings(names, [f"s{i}" for i in range(17)], 4, exact["cos"]))
        assert f"more than {MAX_SITES}" in _error(refused, 422, "site_limit")


def test_the_check_is_charged_to_the_in_flight_budget() -> None:
    """A model whose check (WORK_FACTOR x its bytes) does not fit the in-flight budget is 503
    `overloaded`, one just under it is answered, and the budget is whole again afterwards."""
    from posenc.api.middleware import BODY_COPIES
    from posenc.api.routes.check import WORK_FACTOR

    budget = 2 * 4 * 1024 * 1024  # the smallest the server takes: twice max_response_bytes
    settings = {"in_flight_bytes": budget, "max_response_bytes": 4 * 1024 * 1024}
    with start_server(**settings) as srv, srv.client() as c:
        key = _preset_key(c)
        row = 2 * (HD // 2) * 4  # body bytes per cache row (cos and sin, float32)
        # answered: the body's charge (BODY_COPIES, held by the middleware until the answer is
        # sent), the check's and the exact table's (twice its bytes) all fit; refused: the body's
        # and the check's charges alone are past the budget (the table alone would fit)
        fits = budget // ((BODY_COPIES + WORK_FACTOR + 2) * row) - 64
        past = budget // ((BODY_COPIES + WORK_FACTOR) * row) + 64
        assert 2 * past * row < budget
        for rows, status in ((fits, 200), (past, 503)):
            cos = np.ones((rows, HD // 2), np.float32)
            response = _check(c, key, _model_bytes(cos, cos * 0))
            assert response.status_code == status, response.text
        _error(response, 503, "overloaded")
        assert srv.state.require_cache().budget is not None
        assert srv.state.require_cache().budget.held == 0
