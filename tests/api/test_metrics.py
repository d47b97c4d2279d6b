"""/metrics parses as Prometheus text and labels requests by route template."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

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
