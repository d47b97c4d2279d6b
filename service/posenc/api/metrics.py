"""Prometheus metrics on a per-app `CollectorRegistry` (two apps in one process never collide).

HTTP request metrics are recorded by the app's `Gate` (`api/middleware.py`), a pure ASGI
middleware (no BaseHTTPMiddleware: it would buffer streamed bodies), labelled with the route
*template* (`/v1/tables/{key}`), never the raw path; gRPC calls by the service itself
(`observe_grpc`). Cache counters are read from `TableCache.stats` at scrape time by
`CacheCollector`; compute time is observed by the cache's `on_compute` hook; `/v2` inferences
(HTTP and gRPC) by where their rows came from through `observe_infer`.

The per-request series (the HTTP requests, their latency, those in flight, and the `/v2`
inferences) are tallied in plain numbers by `RequestTally` and exposed at scrape time in
prometheus_client's own form: its `Counter.inc` and `Histogram.observe` cost four or five Python
calls and a lock each, a fifth of a decode step's work (`docs/benchmarks.md`, section 9).
`tests/api/test_metrics.py` holds the tally's exposition to prometheus_client's metrics fed the
same observations.

| metric                                        | type      | labels                |
|-----------------------------------------------|-----------|-----------------------|
| posenc_http_requests_total                    | counter   | method, route, status |
| posenc_http_request_duration_seconds          | histogram | method, route         |
| posenc_http_requests_in_flight                | gauge     |                       |
| posenc_grpc_requests_total                    | counter   | method, code          |
| posenc_grpc_request_duration_seconds          | histogram | method                |
| posenc_compute_seconds                        | histogram | kind, device          |
| posenc_v2_infer_total                         | counter   | model, source         |
| posenc_cache_{hits,misses,coalesced}_total    | counter   |                       |
| posenc_cache_evictions_total                  | counter   |                       |
| posenc_compute_{rejected,fallbacks}_total     | counter   |                       |
| posenc_in_flight_refused[_per_peer]_total     | counter   |                       |
| posenc_cache_{bytes,max_bytes,entries}        | gauge     |                       |
| posenc_computations_in_flight                 | gauge     |                       |
| posenc_fused_kernel                           | gauge     |                       |
| posenc_build_info                             | info (1)  | version, python,      |
|                                               |           | torch, device         |

`posenc_build_info` is set once the lifespan has resolved the device (`set_build`).
`posenc_fused_kernel` is 0 on a CPU server, and on a CUDA server turns 0 when the fused kernel
fails or its first-launch probe finds other bits than torch's (`encodings/fused.py`).
"""

from __future__ import annotations

import platform
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from prometheus_client import CollectorRegistry, Counter, Histogram, Info
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from posenc import __version__
from posenc.encodings import fused
from posenc.runtime import TableCache

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
COMPUTE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class RequestTally(Collector):
    """The per-request series, tallied in plain numbers on the event loop (HTTP requests and
    gRPC calls share it; no lock) and exposed at scrape time as prometheus_client exposes its
    own metrics, `_created` samples included:

    - `posenc_http_requests_total{method, route, status}` (counter),
    - `posenc_http_request_duration_seconds{method, route}` (histogram over `buckets`),
    - `posenc_http_requests_in_flight` (gauge: `in_flight`, moved by the caller),
    - `posenc_v2_infer_total{model, source}` (counter).
    """

    def __init__(self, buckets: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(float(b) for b in buckets)
        # the `le` labels as prometheus_client writes them (its helper is untyped)
        self._les: list[str] = [floatToGoString(b) for b in self.bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        self.in_flight = 0
        # label values -> [count, created]
        self._requests: dict[tuple[str, str, int], list[float]] = {}
        self._infer: dict[tuple[str, str], list[float]] = {}
        # label values -> [per-bucket counts (the last: above every bound), sum, created]
        self._latency: dict[tuple[str, str], list[Any]] = {}

    def request(self, method: str, route: str, status: int, seconds: float) -> None:
        """One HTTP request to `route` (its template) answered `status` after `seconds`."""
        row = self._requests.get((method, route, status))
        if row is None:
            row = self._requests[(method, route, status)] = [0, time.time()]
        row[0] += 1
        hist = self._latency.get((method, route))
        if hist is None:
            hist = self._latency[(method, route)] = [[0] * (len(self.bounds) + 1), 0.0, time.time()]
        hist[0][bisect_left(self.bounds, seconds)] += 1
        hist[1] += seconds

    def infer(self, model: str, source: str) -> None:
        """One `/v2` inference of `model` whose rows came from `source`."""
        row = self._infer.get((model, source))
        if row is None:
            row = self._infer[(model, source)] = [0, time.time()]
        row[0] += 1

    def collect(self) -> Iterator[Metric]:
        """The four families (the class docstring)."""
        requests = CounterMetricFamily(
            "posenc_http_requests",
            "HTTP requests by method, route template and status",
            labels=("method", "route", "status"),
        )
        for (method, route, status), (count, created) in list(self._requests.items()):
            requests.add_metric((method, route, str(status)), count, created=created)
        yield requests
        name = "posenc_http_request_duration_seconds"
        latency = HistogramMetricFamily(
            name,
            "HTTP request latency by route template (until the last body byte is handed over)",
            labels=("method", "route"),
        )
        les = self._les
        for (method, route), (counts, total, created) in list(self._latency.items()):
            cumulative, buckets = 0, []
            for le, count in zip(les, list(counts), strict=True):
                cumulative += count
                buckets.append((le, float(cumulative)))
            latency.add_metric((method, route), buckets, total)
            labels = {"method": method, "route": route}
            latency.samples.append(Sample(f"{name}_created", labels, created))
        yield latency
        yield GaugeMetricFamily(
            "posenc_http_requests_in_flight", "HTTP requests being served", value=self.in_flight
        )
        infer = CounterMetricFamily(
            "posenc_v2_infer",
            "/v2 inferences by model and where their rows came from",
            labels=("model", "source"),
        )
        for (model, source), (count, created) in list(self._infer.items()):
            infer.add_metric((model, source), count, created=created)
        yield infer


class Metrics:
    """The app's registry and the metric objects the middleware and the cache hook update."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.tally = RequestTally()
        self.registry.register(self.tally)
        self.grpc_requests = Counter(
            "posenc_grpc_requests",
            "gRPC calls (inference.GRPCInferenceService) by method and status code",
            ("method", "code"),
            registry=self.registry,
        )
        self.grpc_latency = Histogram(
            "posenc_grpc_request_duration_seconds",
            "gRPC call latency by method (until the response message is handed over)",
            ("method",),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.compute = Histogram(
            "posenc_compute_seconds",
            "Table computations by kind and device (count = computations)",
            ("kind", "device"),
            buckets=COMPUTE_BUCKETS,
            registry=self.registry,
        )
        self.build = Info(
            "posenc_build",
            "posenc's version, the Python and torch it runs on, and its compute device",
            registry=self.registry,
        )
        self.observe_infer = self.tally.infer
        """One `/v2` inference of `model` whose rows came from `source` (`hit`, `miss`,
        `coalesced`, `computed`): `posenc_v2_infer_total{model, source}`."""

    def set_build(self, device: str) -> None:
        """`posenc_build_info{version, python, torch, device} 1` for a server on `device`."""
        self.build.info(
            {
                "version": __version__,
                "python": platform.python_version(),
                "torch": torch.__version__,
                "device": device,
            }
        )

    def observe_grpc(self, method: str, code: str, seconds: float) -> None:
        """One gRPC call of `method` that ended with status `code` (`OK`, `NOT_FOUND`, ...)."""
        self.grpc_requests.labels(method, code).inc()
        self.grpc_latency.labels(method).observe(seconds)

    def observe_compute(self, kind: str, device: str, seconds: float) -> None:
        """The cache's `on_compute` hook."""
        self.compute.labels(kind, device).observe(seconds)

    def watch(self, cache: TableCache) -> CacheCollector:
        """Register a collector exposing `cache`'s counters; returns it (to unregister)."""
        collector = CacheCollector(cache)
        self.registry.register(collector)
        return collector


class CacheCollector(Collector):
    """Reads `TableCache.stats` and sizes at scrape time."""

    def __init__(self, cache: TableCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        """Yield the cache's counters and gauges."""
        s = self.cache.stats
        counters: tuple[tuple[str, str, int], ...] = (
            ("posenc_cache_hits", "Lookups served from a resident table", s.hits),
            ("posenc_cache_misses", "Lookups that started a computation", s.misses),
            ("posenc_cache_coalesced", "Lookups that joined a computation in flight", s.coalesced),
            ("posenc_cache_evictions", "Entries dropped to keep the byte budget", s.evictions),
            ("posenc_compute_rejected", "Computations refused: too many in flight", s.rejected),
            ("posenc_compute_fallbacks", "Computations redone on the CPU (CUDA OOM)", s.fallbacks),
        )
        b = self.cache.budget
        if b is not None:
            counters += (
                (
                    "posenc_in_flight_refused",
                    "Work refused: in-flight byte budget spent (or a client address's share)",
                    b.refused,
                ),
                (
                    "posenc_in_flight_refused_per_peer",
                    "Work refused: a client address's share of the in-flight budget spent",
                    b.refused_peer,
                ),
            )
        for name, doc, value in counters:
            yield CounterMetricFamily(name, doc, value=value)
        c = self.cache
        gauges: tuple[tuple[str, str, int], ...] = (
            ("posenc_cache_bytes", "Bytes of resident tables and prepared bodies", c.bytes_held),
            ("posenc_cache_max_bytes", "The cache byte budget", c.max_bytes),
            ("posenc_cache_entries", "Resident tables", len(c)),
            ("posenc_computations_in_flight", "Computations running now", c.in_flight),
            (
                "posenc_fused_kernel",
                "1 while this server's tables may come from the fused CUDA kernel (CUDA, triton, "
                "enabled, not turned off by a failure or by its bit probe)",
                int(fused.usable(torch.device(str(c.device)))),
            ),
        )
        if b is not None:
            gauges += (
                ("posenc_in_flight_bytes", "Bytes charged to the in-flight budget", b.held),
                ("posenc_in_flight_peak_bytes", "Most bytes ever charged to it", b.peak),
                ("posenc_in_flight_max_bytes", "The in-flight byte budget", b.max_bytes),
            )
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=value)
