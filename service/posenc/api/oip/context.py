"""What the /v2 models need from the running service: the table cache and store, limits, readiness.

`OipContext` is built per request from the service's own objects (the `TableCache` of
`posenc.runtime`, the `TableStore` of uploaded weight tables and the settings' limits) and
handed to the model. It is where a model gets a
whole table (through the cache: one computation per key) or rows computed for exactly the asked
positions (never cached, so a stream of decode steps cannot churn the cache), and where heavy work
leaves the event loop.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from posenc.api.oip.codec import bad_request
from posenc.api.serving import bind_tables
from posenc.encodings import SpecBase, Table, compute
from posenc.encodings.weights import TableStore
from posenc.runtime import OFFLOAD_BYTES, TableCache, is_out_of_memory
from posenc.runtime.device import release_cached_memory

T = TypeVar("T")


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
    """

    cache: TableCache
    tables: TableStore
    max_response_bytes: int
    json_max_elements: int
    max_body_bytes: int
    ready: Callable[[], bool] = lambda: True
    observe: Callable[[str, str], None] | None = None

    @property
    def device(self) -> torch.device:
        return self.cache.device

    def fits_cache(self, nbytes: int) -> bool:
        """Whether a whole table of `nbytes` can stay resident (else it would be recomputed for
        every request, so rows are computed instead)."""
        return nbytes <= self.cache.max_bytes

    def bind(self, spec: SpecBase, key: str) -> SpecBase:
        """`spec` (content key `key`) ready to compute: the uploaded weight table it names bound
        from the store (`serving.bind_tables`; 404 `unknown_table` when it holds none)."""
        return bind_tables(self.cache, self.tables, spec, key)

    async def table(self, spec: SpecBase, key: str) -> tuple[Table, str]:
        """The whole table of `spec` (content key `key`) from the cache, computed at most once;
        and the outcome (`hit`, `miss`, `coalesced`)."""
        entry, outcome = await self.cache.get(spec, key)
        return entry.table, outcome

    async def compute(self, spec: SpecBase) -> Table:
        """Compute `spec` (rows for the asked positions) off the event loop on the cache device,
        retrying on the CPU after a CUDA out-of-memory. Not cached."""
        return await asyncio.to_thread(self._compute, spec)

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
        """Refuse a response over `max_response_bytes` before anything is computed.

        `outputs`: name -> (shape, item size). Returns the total bytes.
        """
        total = sum(math.prod(shape) * item for shape, item in outputs.values())
        if total > self.max_response_bytes:
            sizes = ", ".join(f"{n} {list(s)}" for n, (s, _) in outputs.items())
            raise bad_request(
                f"the outputs ({sizes}) would take {total} bytes, more than the limit of "
                f"{self.max_response_bytes}: ask for fewer positions or outputs"
            )
        return total
