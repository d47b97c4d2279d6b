"""/metrics parses as Prometheus text and labels requests by route template."""

from __future__ import annotations

import random
import time
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from posenc.api.metrics import LATENCY_BUCKETS, RequestTally
from tests.api.metrics_util import scrape, value


def test_metrics_parse_and_cover_the_service(client: httpx.Client) -> None:
    key = client.post("/v1/tables", json={"kind": "alibi", "num_heads": 24}).headers["x-posenc-key"]
    client.get(f"/v1/tables/{key}")
    client.get("/no/such/route")
    r = client.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    expected = {
        "posenc_http_requests": "counter",
        "posenc_http_request_duration_seconds": "histogram",
        "posenc_http_requests_in_flight": "gauge",
        "posenc_compute_seconds": "histogram",
        "posenc_cache_hits": "counter",
        "posenc_cache_misses": "counter",
        "posenc_cache_coalesced": "counter",
        "posenc_cache_evictions": "counter",
        "posenc_compute_rejected": "counter",
        "posenc_compute_fallbacks": "counter",
        "posenc_cache_bytes": "gauge",
        "posenc_cache_max_bytes": "gauge",
        "posenc_cache_entries": "gauge",
        "posenc_computations_in_flight": "gauge",
        "posenc_in_flight_refused": "counter",
        "posenc_in_flight_refused_per_peer": "counter",
        "posenc_in_flight_bytes": "gauge",
        "posenc_in_flight_peak_bytes": "gauge",
        "posenc_in_flight_max_bytes": "gauge",
        "posenc_responses_cut": "counter",
        "posenc_fused_kernel": "gauge",
    }
    for name, kind in expected.items():
        assert families[name].type == kind, name
    samples = scrape(client)
    routes = {
        dict(labels).get("route")
        for (name, labels) in samples
        if name == "posenc_http_requests_total"
    }
    assert {"/v1/tables", "/v1/tables/{key}", "<unmatched>"} <= routes
    assert key not in "".join(str(r) for r in routes)  # templates, never raw paths
    assert value(samples, "posenc_http_requests_in_flight") >= 1  # this scrape
    device = client.get(f"/v1/tables/{key}").headers["x-posenc-device"]
    assert value(samples, "posenc_fused_kernel") in ((0.0,) if device == "cpu" else (0.0, 1.0))
    assert (
        value(
            samples,
            "posenc_http_request_duration_seconds_count",
            method="GET",
            route="/v1/tables/{key}",
        )
        >= 1
    )
    assert (
        value(
            samples,
            "posenc_compute_seconds_count",
            kind="alibi",
            device=client.get(f"/v1/tables/{key}").headers["x-posenc-device"],
        )
        >= 1
    )


def _exposed(registry: CollectorRegistry) -> list[tuple[str, str, str, list[tuple[str, Any]]]]:
    """Each family's name, type and help, and its samples (name, labels, value; a `_created`
    sample's value as whether it is a time in the last hour)."""
    now = time.time()
    return [
        (
            f.name,
            f.type,
            f.documentation,
            sorted(
                (
                    s.name,
                    sorted(s.labels.items()),
                    now - 3600 < s.value <= now if s.name.endswith("_created") else s.value,
                )
                for s in f.samples
            ),
        )
        for f in sorted(
            text_string_to_metric_families(generate_latest(registry).decode()),
            key=lambda f: f.name,
        )
    ]


def test_request_tally_exposes_what_prometheus_client_exposes() -> None:
    """`RequestTally` (plain numbers per request, families at scrape time) against
    prometheus_client's own Counter, Histogram and Gauge fed the same observations: the same
    families, types, help, series and values, `_created` samples included. Latencies fall on,
    between, below and above the bucket bounds (`le` is inclusive)."""
    rng = random.Random(36)
    tally = RequestTally()
    mine = CollectorRegistry(auto_describe=True)
    mine.register(tally)
    theirs = CollectorRegistry(auto_describe=True)
    requests = Counter(
        "posenc_http_requests",
        "HTTP requests by method, route template and status",
        ("method", "route", "status"),
        registry=theirs,
    )
    latency = Histogram(
        "posenc_http_request_duration_seconds",
        "HTTP request latency by route template (until the last body byte is handed over)",
        ("method", "route"),
        buckets=LATENCY_BUCKETS,
        registry=theirs,
    )
    in_flight = Gauge(
        "posenc_http_requests_in_flight", "HTTP requests being served", registry=theirs
    )
    infer = Counter(
        "posenc_v2_infer",
        "/v2 inferences by model and where their rows came from",
        ("model", "source"),
        registry=theirs,
    )
    assert _exposed(mine) == _exposed(theirs)  # nothing observed yet
    seconds = [0.0, 1e-7, 31.0, 1e3, *LATENCY_BUCKETS]
    seconds += [b * f for b in LATENCY_BUCKETS for f in (0.999, 1.001)]
    routes = [
        ("GET", "/v1/tables/{key}"),
        ("POST", "/v2/models/{model}/infer"),
        ("GET", "<unmatched>"),
    ]
    for s in seconds * 3:
        method, route = rng.choice(routes)
        status = rng.choice([200, 304, 404, 500, 503])
        tally.request(method, route, status, s)
        requests.labels(method, route, str(status)).inc()
        latency.labels(method, route).observe(s)
    for _ in range(50):
        model, source = rng.choice(["rope", "alibi"]), rng.choice(["hit", "miss", "computed"])
        tally.infer(model, source)
        infer.labels(model, source).inc()
    tally.in_flight += 3
    in_flight.inc(3)
    assert _exposed(mine) == _exposed(theirs)
