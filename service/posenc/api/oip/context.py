"""What the /v2 models need from the running service: the table cache and store, limits, readiness.

`OipContext` is built per request from the service's own objects (the `TableCache` of
`posenc.runtime`, the `TableStore` of uploaded weight tables and the settings' limits) and
handed to the model. It is where a model gets a
whole table (through the cache: one computation per key) or rows computed for exactly the asked
positions (never cached, so a stream of decode steps cannot churn the cache), and where heavy work
leaves the event loop.

Memory: everything an inference makes the server hold is charged to the service's in-flight
budget (`runtime.budget`, the one `/v1` uses) before it is allocated, and new work that does not
fit is refused with `Overloaded` (503 `Retry-After`; gRPC UNAVAILABLE with `retry-after`):

- rows computed for the asked positions (`compute`, `rows`): `WORKING_FACTOR` times their bytes
  (the rows and their temporaries), from before the computation until the model has gathered its
  outputs (`release_work`); they also take one of the cache's `max_concurrent` computation slots
  (`TableCache.slot`; `Busy` when all are taken);
- the outputs (`charge_outputs`, from `admit` before anything is computed): their bytes, plus the
  copies the protocol makes (`output_copies`: gRPC's `raw_output_contents`, the serialised message
  and its core buffer) and, over HTTP, the JSON text of outputs sent as JSON; held until the last
  byte is handed over (`release`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import torch

from posenc.api.oip.codec import too_large
from posenc.api.oip.stats import InferenceStats
from posenc.api.serving.bind import bind_tables
from posenc.encodings import SpecBase, Table, compute
from posenc.encodings.weights import TableStore
from posenc.runtime import OFFLOAD_BYTES, CacheEntry, Lease, TableCache, is_out_of_memory
from posenc.runtime.cache import WORKING_FACTOR
from posenc.runtime.device import release_cached_memory

if TYPE_CHECKING:
    from posenc.api.oip.steps import StepTemplates

T = TypeVar("T")

JSON_BYTES_PER_ELEMENT = 24
"""What an output sent as JSON is charged per element (orjson writes a float in at most ~24
characters with its separator), as `/v1`'s `format=json`."""

HTTP_OUTPUT_COPIES = 0
"""Copies of the outputs `/v2` over HTTP makes: none (binary outputs on the CPU go out as views;
JSON text is charged by element)."""

GRPC_OUTPUT_COPIES = 3
"""Copies of the outputs gRPC makes while answering: `raw_output_contents` (bytes), the serialised
`ModelInferResponse`, and the buffer grpc's core sends it from."""


@dataclass
class OipContext:
    """The service's cache and limits as the /v2 models see them.

    Args:
        cache: the service's table cache (its device is where rows are gathered).
        tables: the service's store of uploaded weight tables (`learned` and `relative_index`
            specs by key).
        max_response_bytes: cap on one response's output bytes (checked before computing).
        json_max_elements: cap on the elements sent as JSON in one response.
        max_body_bytes: cap on one infer request body (`max_infer_body_bytes`).
        ready: the service's readiness (False while warming up or draining), for model ready.
        observe: called as `(model, source)` after each inference (`hit`, `miss`, `coalesced`,
            `computed`), for metrics.
        output_copies: full copies of the outputs the protocol makes (`HTTP_OUTPUT_COPIES`,
            `GRPC_OUTPUT_COPIES`), charged with them.
        json_outputs: whether outputs may travel as JSON text (HTTP), charged by element.
        stats: the app's per-model inference statistics (`oip/stats.py`), which the protocol's
            routes record into.
    """

    cache: TableCache
    tables: TableStore
    max_response_bytes: int
    json_max_elements: int
    max_body_bytes: int
    ready: Callable[[], bool] = lambda: True
    observe: Callable[[str, str], None] | None = None
    output_copies: int = HTTP_OUTPUT_COPIES
    json_outputs: bool = True
    stats: InferenceStats = field(default_factory=InferenceStats)
    held: list[Lease] = field(default_factory=list)
    """Charges of the outputs: released when the response has been handed over."""
    work: list[Lease] = field(default_factory=list)
    """Charges of rows computed for this request: released once the outputs are gathered."""

    charged: int = 0
    """Bytes this request has charged so far (at most the whole budget)."""

    entry: CacheEntry | None = None
    """The cache entry `table` last answered from."""

    steps: StepTemplates | None = None
    """The app's decode-step templates (`oip.steps`; HTTP only)."""

    def _charge(self, into: list[Lease], nbytes: int) -> None:
        # one request's charges are capped at what the budget leaves beside its own charges
        # (its body's too: `InFlightBudget.room`), as a computation's are: a request larger than
        # that still runs, alone (capped at the whole budget, the body's charge made it never fit)
        budget = self.cache.budget
        if budget is None:
            return
        nbytes = min(nbytes, budget.max_bytes - self.charged, budget.room())
        if nbytes <= 0:
            return
        into.append(budget.acquire(object(), nbytes))
        self.charged += nbytes

    def charge_outputs(self, nbytes: int, json_elements: int = 0) -> None:
        """Charge `nbytes` of outputs (and their protocol copies) plus `json_elements` sent as
        JSON, before they are computed; `Overloaded` when they do not fit."""
        size = nbytes * (1 + self.output_copies)
        if self.json_outputs:
            size += JSON_BYTES_PER_ELEMENT * json_elements
        self._charge(self.held, size)

    def release_work(self) -> None:
        """Give back the charges of computed rows (the outputs are gathered)."""
        for lease in self.work:
            lease.release()
        self.work.clear()

    def take_held(self) -> list[Lease]:
        """The outputs' charges, handed to what sends the response (which releases them)."""
        held, self.held = self.held, []
        return held

    def release(self) -> None:
        """Give back every charge (idempotent)."""
        self.release_work()
        for lease in self.take_held():
            lease.release()

    @property
    def device(self) -> torch.device:
        return self.cache.device

    def fits_cache(self, nbytes: int) -> bool:
        """Whether a whole table of `nbytes` can stay resident (else it would be recomputed for
        every request) and be computed beside this request's charges (`TableCache.can_compute`:
        a table over `max_response_bytes` whose working memory is over the in-flight budget
        would be 503 forever); else rows are computed instead."""
        return nbytes <= self.cache.max_bytes and self.cache.can_compute(nbytes)

    def bind(self, spec: SpecBase, key: str) -> SpecBase:
        """`spec` (content key `key`) ready to compute: the uploaded weight table it names bound
        from the store (`serving.bind.bind_tables`; 404 `unknown_table` when it holds none)."""
        return bind_tables(self.cache, self.tables, spec, key)

    async def table(self, spec: SpecBase, key: str) -> tuple[Table, str]:
        """The whole table of `spec` (content key `key`) from the cache, computed at most once;
        and the outcome (`hit`, `miss`, `coalesced`)."""
        entry, outcome = await self.cache.get(spec, key)
        self.entry = entry
        return entry.table, outcome

    async def compute(self, spec: SpecBase) -> Table:
        """Compute `spec` (rows for the asked positions) off the event loop on the cache device,
        retrying on the CPU after a CUDA out-of-memory. Not cached: takes a computation slot and
        charges `WORKING_FACTOR` times the table's bytes (module docstring)."""
        precision = spec.canonical().cache_precision()
        factor = WORKING_FACTOR.get(precision, max(WORKING_FACTOR.values()))
        with self.cache.slot():
            self._charge(self.work, factor * spec.output_bytes())
            return await asyncio.to_thread(self._compute, spec)

    async def rows(self, fn: Callable[[], T], nbytes: int) -> T:
        """Run `fn`, a computation of rows of about `nbytes` bytes, as `compute` runs a spec:
        in a computation slot, charged `WORKING_FACTOR` (reference) times `nbytes`."""
        with self.cache.slot():
            self._charge(self.work, WORKING_FACTOR["reference"] * nbytes)
            return await self.offload(fn, nbytes)

    def _compute(self, spec: SpecBase) -> Table:
        try:
            return compute(spec, self.device)
        except Exception as exc:
            if self.device.type != "cuda" or not is_out_of_memory(exc):
                raise
        release_cached_memory(self.device)
        return compute(spec, "cpu")

    async def offload(self, fn: Callable[[], T], nbytes: int) -> T:
        """Run `fn` in a worker thread when it touches more than `OFFLOAD_BYTES`, inline else."""
        if nbytes > OFFLOAD_BYTES:
            return await asyncio.to_thread(fn)
        return fn()

    def check_size(self, outputs: dict[str, tuple[tuple[int, ...], int]]) -> int:
        """Refuse a response over `max_response_bytes` before anything is computed (413, gRPC
        RESOURCE_EXHAUSTED).

        `outputs`: name -> (shape, item size). Returns the total bytes.
        """
        total = sum(math.prod(shape) * item for shape, item in outputs.values())
        if total > self.max_response_bytes:
            sizes = ", ".join(f"{n} {list(s)}" for n, (s, _) in outputs.items())
            raise too_large(
                f"the outputs ({sizes}) would take {total} bytes, more than the limit of "
                f"{self.max_response_bytes}: ask for fewer positions or outputs"
            )
        return total
