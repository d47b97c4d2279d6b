"""Per-model inference statistics as Triton reports them (its statistics extension: HTTP
`GET /v2/models[/{model}[/versions/{version}]]/stats`, gRPC `ModelStatistics`), recorded where
the `/v2` inferences run, over HTTP and gRPC alike.

Each model's record (`ModelStats`), per the fields of Triton's `ModelStatistics` message
(`grpc_service.proto`; durations are a count and cumulative nanoseconds):

| field            | what posenc counts                                                    |
|------------------|-----------------------------------------------------------------------|
| success, fail    | inference requests that succeeded / failed, from the model found to   |
|                  | the response built (a request for an unknown model counts nowhere)    |
| compute_input    | reading and parsing the request (successful requests)                 |
| compute_infer    | the rows gathered or computed (`OipModel.infer`)                      |
| compute_output   | the response encoded                                                  |
| cache_hit        | inferences served from a resident table (`posenc_source` `hit`), with |
|                  | their compute_infer time                                              |
| cache_miss       | inferences that computed their table (`miss`, `coalesced`); rows      |
|                  | computed for the asked positions (`computed`) are neither             |
| inference_count, | successful inferences (posenc does not batch: one execution each)     |
| execution_count  |                                                                       |
| last_inference   | when the last one succeeded, ms since the epoch                       |

`queue` stays zero (no scheduler queue: a computation over the in-flight limits is refused with
503, never queued), as do `batch_stats` and `memory_usage`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

PHASES = ("compute_input", "compute_infer", "compute_output")
"""The timed phases of a successful inference, in order."""
DURATIONS = ("success", "fail", "queue", *PHASES, "cache_hit", "cache_miss")
"""The fields of Triton's `InferStatistics`, in its order."""
CACHE_SOURCES = {"hit": "cache_hit", "miss": "cache_miss", "coalesced": "cache_miss"}


@dataclass
class Duration:
    """Triton's `StatisticDuration`: how many, and their total time in nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns


@dataclass
class ModelStats:
    """One model's statistics (the table in the module docstring)."""

    durations: dict[str, Duration] = field(
        default_factory=lambda: {name: Duration() for name in DURATIONS}
    )
    inference_count: int = 0
    last_inference: int = 0

    def as_json(self, name: str, version: str) -> dict[str, Any]:
        """Triton's HTTP form of `ModelStatistics` (what tritonclient.http returns)."""
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference,
            "inference_count": self.inference_count,
            "execution_count": self.inference_count,
            "inference_stats": {
                k: {"count": d.count, "ns": d.ns} for k, d in self.durations.items()
            },
            "batch_stats": [],
            "memory_usage": [],
        }


class InferTimer:
    """Times one inference of one model: `mark` each phase as it ends, then `succeeded` (with
    where its rows came from) or `failed`."""

    def __init__(self, record: ModelStats) -> None:
        self.record = record
        self.start = self.last = time.perf_counter_ns()
        self.phases: dict[str, int] = {}

    def mark(self, phase: str) -> None:
        """The phase `phase` (one of `PHASES`) ends now."""
        now = time.perf_counter_ns()
        self.phases[phase] = now - self.last
        self.last = now

    def marks(self, input_end: int, infer_end: int, output_end: int) -> None:
        """The three `PHASES` ended at these `time.perf_counter_ns()` readings (one call where
        a decode step would make three)."""
        self.phases = {
            "compute_input": input_end - self.last,
            "compute_infer": infer_end - input_end,
            "compute_output": output_end - infer_end,
        }
        self.last = output_end

    def succeeded(self, source: str) -> None:
        """The response is built; `source` is its `posenc_source` parameter."""
        # `Duration.add` written out: this runs once per decode step
        durations = self.record.durations
        d = durations["success"]
        d.count += 1
        d.ns += time.perf_counter_ns() - self.start
        for phase, ns in self.phases.items():
            d = durations[phase]
            d.count += 1
            d.ns += ns
        cache = CACHE_SOURCES.get(source)
        if cache is not None:
            d = durations[cache]
            d.count += 1
            d.ns += self.phases.get("compute_infer", 0)
        self.record.inference_count += 1
        self.record.last_inference = time.time_ns() // 1_000_000

    def failed(self) -> None:
        """The inference failed (any error after the model was found)."""
        self.record.durations["fail"].add(time.perf_counter_ns() - self.start)


class InferenceStats:
    """Every model's `ModelStats` for one app (`AppState.stats`), made on a model's first
    inference; updated on the event loop only, so no lock."""

    def __init__(self) -> None:
        self._models: dict[str, ModelStats] = {}

    def timer(self, model: str) -> InferTimer:
        """A timer recording into `model`'s statistics."""
        record = self._models.get(model)
        if record is None:  # not `setdefault`: a `ModelStats` is a dozen objects to build
            record = self._models[model] = ModelStats()
        return InferTimer(record)

    def get(self, model: str) -> ModelStats:
        """`model`'s statistics (all zero before its first inference)."""
        return self._models.get(model) or ModelStats()
