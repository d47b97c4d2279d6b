"""Prometheus metrics on a per-app `CollectorRegistry` (two apps in one process never collide).

HTTP request metrics are recorded by the app's `Gate` (`api/gate.py`), a pure ASGI middleware
(no BaseHTTPMiddleware: it would buffer streamed bodies), labelled with the route *template*
(`/v1/tables/{key}`), never the raw path; gRPC calls by the service itself (`observe_grpc`). Cache
counters are read from `TableCache.stats` at scrape time by `CacheCollector`; compute time is
observed by the cache's `on_compute` hook; `/v2` inferences (HTTP and gRPC) by where their rows
came from through `observe_infer`. Labelled children are looked up once per label set and kept
(`request_children`, `observe_infer`): prometheus_client's `labels()` costs a few µs a call.

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
| posenc_build_info                             | info (1)  | version, python,      |
|                                               |           | torch, device         |

`posenc_build_info` is set once the lifespan has resolved the device (`set_build`).
"""

from __future__ import annotations

import platform
from collections.abc import Iterator

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from posenc import __version__
from posenc.runtime import TableCache

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
COMPUTE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """The app's registry and the metric objects the middleware and the cache hook update."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "posenc_http_requests",
            "HTTP requests by method, route template and status",
            ("method", "route", "status"),
            registry=self.registry,
        )
        self.latency = Histogram(
            "posenc_http_request_duration_seconds",
            "HTTP request latency by route template (until the last body byte is handed over)",
            ("method", "route"),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "posenc_http_requests_in_flight", "HTTP requests being served", registry=self.registry
        )
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
        self.v2_infer = Counter(
            "posenc_v2_infer",
            "/v2 inferences by model and where their rows came from",
            ("model", "source"),
            registry=self.registry,
        )
        self.build = Info(
            "posenc_build",
            "posenc's version, the Python and torch it runs on, and its compute device",
            registry=self.registry,
        )

        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self._infer_children: dict[tuple[str, str], Counter] = {}

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

    def request_children(self, method: str, route: str, status: int) -> tuple[Counter, Histogram]:
        """The labelled request counter and latency histogram, looked up once per label set."""
        key = (method, route, status)
        found = self._children.get(key)
        if found is None:
            found = (
                self.requests.labels(method, route, str(status)),
                self.latency.labels(method, route),
            )
            self._children[key] = found
        return found

    def observe_infer(self, model: str, source: str) -> None:
        """One `/v2` inference of `model` whose rows came from `source` (`hit`, `miss`,
        `coalesced`, `computed`): `posenc_v2_infer_total{model, source}`."""
        child = self._infer_children.get((model, source))
        if child is None:
            child = self._infer_children[(model, source)] = self.v2_infer.labels(model, source)
        child.inc()

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
        )
        if b is not None:
            gauges += (
                ("posenc_in_flight_bytes", "Bytes charged to the in-flight budget", b.held),
                ("posenc_in_flight_peak_bytes", "Most bytes ever charged to it", b.peak),
                ("posenc_in_flight_max_bytes", "The in-flight byte budget", b.max_bytes),
            )
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=value)
