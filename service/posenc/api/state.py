"""Per-app state built by `create_app` and its lifespan.

`AppState` lives on `app.state.posenc` (routes get it through `posenc.api.deps`). The cache, the
device and the table store (uploaded weight tables) exist only between lifespan start and
shutdown; routes reach them through `AppState.require_cache` and `AppState.require_tables`, which
answer 503 outside that window.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from posenc.api.error_types import STARTING
from posenc.api.errors import ApiError
from posenc.api.metrics import Metrics
from posenc.api.oip.stats import InferenceStats
from posenc.api.oip.steps import StepTemplates
from posenc.api.serving.prepared import PreparedAnswers
from posenc.api.settings import Settings
from posenc.encodings import SpecBase, TensorInfo
from posenc.encodings.weights import TableStore
from posenc.presets import Preset
from posenc.runtime import InFlightBudget, TableCache

if TYPE_CHECKING:
    from posenc.api.door import Door


@dataclass
class Lifecycle:
    """Readiness: `ready` after warm-up, `draining` from SIGTERM until exit; `startup_error`:
    why start-up failed, as the one line the server logs (`app.StartupFailures`)."""

    ready: bool = False
    draining: bool = False
    warm_errors: list[str] = field(default_factory=list)
    startup_error: str | None = None


class StartupError(Exception):
    """Start-up cannot go on for a reason one line states (a gRPC port in use): logged as that
    line, without a traceback, and `posenc serve` exits 3 as for an HTTP port in use."""


class KeyIndex:
    """Content key -> canonical spec for every key resolved since start (bounded LRU) plus the
    presets' keys (pinned), so `GET /v1/tables/{key}` can recompute an evicted table; and the
    output shapes of each known key, worked out once (`outputs`)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._pinned: dict[str, SpecBase] = {}
        self._recent: OrderedDict[str, SpecBase] = OrderedDict()
        self._outputs: dict[str, dict[str, TensorInfo]] = {}

    def pin(self, key: str, spec: SpecBase) -> None:
        """Remember `key` for the life of the process."""
        self._pinned[key] = spec

    def remember(self, key: str, spec: SpecBase) -> None:
        """Remember `key`, forgetting the least recently used unpinned key beyond capacity."""
        if key in self._pinned:
            return
        self._recent[key] = spec
        self._recent.move_to_end(key)
        while len(self._recent) > self.capacity:
            forgotten, _ = self._recent.popitem(last=False)
            self._outputs.pop(forgotten, None)

    def get(self, key: str) -> SpecBase | None:
        """The canonical spec of `key`, or None when this server has not seen it."""
        spec = self._pinned.get(key)
        if spec is None:
            spec = self._recent.get(key)
            if spec is not None:
                self._recent.move_to_end(key)
        return spec

    def outputs(self, key: str, spec: SpecBase) -> dict[str, TensorInfo]:
        """`spec.outputs()` (name -> shape and dtype; `key` is `spec`'s content key), memoised
        while the index knows `key`: a cache hit then never re-canonicalises its spec."""
        found = self._outputs.get(key)
        if found is None:
            found = spec.outputs()
            if key in self._pinned or key in self._recent:
                self._outputs[key] = found
        return found


@dataclass
class AppState:
    """Everything a route needs: settings, metrics, presets, readiness, key index, cache and
    the store of uploaded weight tables."""

    settings: Settings
    metrics: Metrics
    presets: Mapping[str, Preset]
    lifecycle: Lifecycle
    index: KeyIndex
    cache: TableCache | None = None
    device: torch.device | None = None
    tables: TableStore | None = None

    budget: InFlightBudget | None = None
    """The in-flight byte budget (`runtime.budget`): request bodies, computations, answers."""

    prepared: PreparedAnswers = field(default_factory=PreparedAnswers)
    """Cache hits answered from headers and bodies built once (`serving.prepared`)."""

    steps: StepTemplates = field(default_factory=StepTemplates)
    """`/v2` decode steps answered from templates (`oip.steps`)."""

    grpc_port: int | None = None
    """The port the gRPC service listens on (the bound one when `grpc_port` is 0), while up."""

    stats: InferenceStats = field(default_factory=InferenceStats)
    """Per-model inference statistics (`/v2/models/stats`, gRPC ModelStatistics)."""

    door: Door | None = None
    """Cache hits the server answers as their requests complete (`api/door.py`); None: off."""

    def is_ready(self) -> bool:
        """Readiness: warm, not draining, the cache up (`/v2/health/ready`, gRPC ServerReady)."""
        return self.lifecycle.ready and not self.lifecycle.draining and self.cache is not None

    def require_cache(self) -> TableCache:
        """The cache, or 503 `starting` outside the lifespan."""
        if self.cache is None:
            raise _starting()
        return self.cache

    def require_tables(self) -> TableStore:
        """The table store, or 503 `starting` outside the lifespan."""
        if self.tables is None:
            raise _starting()
        return self.tables


def _starting() -> ApiError:
    return ApiError(STARTING, "the server is starting or stopping", None, {"Retry-After": "1"})
