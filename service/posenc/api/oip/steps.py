"""Decode steps: a repeated `/v2` infer request answered from a template of its last answer.

A decode loop sends the same request every step but for the positions: the same JSON header
(model, spec parameters, outputs, the input's datatype, shape and `binary_data_size`) followed
by the position ids as binary. Parsing that header, building the spec, planning and charging the
outputs, gathering through torch and encoding the response header are then the same work every
step, and cost more than the answer itself. So once such a request has been answered from a
resident cache entry (`posenc_source: hit`), `StepTemplates` keeps, keyed by the path and the
request's JSON header bytes, what the answer was made of (`Step`): the response header bytes and
header lines (the same for every step: the shapes and byte sizes depend only on the number of
positions), the cached table's tensors as host bytes, the charge. The next such request is
answered by reading its positions from the binary tail, checking them against the table's rows,
and slicing the rows from those bytes; the body is the header followed by one row block per
output. A CPU table's host bytes are its tensors' memory; a table a GPU server keeps in device
memory has a host copy made once on its entry (`serving.host.host_bytes`, the same buffer as its
raw `/v1` body, counted in the cache's byte budget), so a step costs no device gather, copy or
synchronisation.

Only the rows-of-a-cached-table answer has a template (`InferResult.rows_of`, set by the models
that gather rows of a whole cached table: RoPE without M-RoPE sections); a request with a
`Content-Encoding`, positions sent as JSON or as floats, a position outside the table (computed
rows), or an entry no longer resident takes the slow path, which answers it and every first
request. The template's answer counts a hit on the entry, takes the output charge and counts the
inference in the metrics as the slow path does (`tests/api/test_v2_steps.py` compares the two
through a real server).
"""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import torch
from starlette.responses import Response

from posenc.api.oip.codec import InferRequest
from posenc.api.oip.stats import InferenceStats, InferTimer
from posenc.api.serving.body import FixedHeaders, ReadyResponse, acquire, try_acquire
from posenc.api.serving.host import host_bytes
from posenc.runtime import CacheEntry, Lease, TableCache

T = TypeVar("T")

STEP_TEMPLATES = 1024
"""Request headers remembered (each holds a response header and its lines; the rows are the
cache's)."""

MAX_TEMPLATE_HEADER = 16 << 10
"""Requests whose JSON header is longer than this have no template."""


@dataclass(frozen=True)
class Rows:
    """The rows half of a template, whatever the protocol: the positions' datatype and count,
    each output's table as flat bytes and its row size, and the output charge."""

    model: str
    dtype: np.dtype[Any]
    count: int
    rows: int
    """Rows every output's table has (a position must be below)."""
    flats: tuple[memoryview, ...]
    """Each output's table as flat bytes (a view of the cached tensor's memory, or of its host
    copy kept on the entry)."""
    row_bytes: tuple[int, ...]
    charge: int

    def positions(self, data: bytes, offset: int = 0) -> list[int] | None:
        """The positions a request carries as `data[offset:]`, or None when they are not this
        template's (another count) or not all rows of the tables (the slow path answers)."""
        if len(data) - offset != self.count * self.dtype.itemsize:
            return None
        positions: list[int] = np.frombuffer(data, self.dtype, self.count, offset).tolist()
        if positions and (min(positions) < 0 or max(positions) >= self.rows):
            return None
        return positions

    def blocks(self, positions: list[int]) -> list[list[memoryview]]:
        """Each output's rows at `positions` (row bytes sliced from the table's flat bytes, no
        numpy per row)."""
        return [
            [flat[p * size : (p + 1) * size] for p in positions]
            for flat, size in zip(self.flats, self.row_bytes, strict=True)
        ]

    def lease(self, cache: TableCache) -> list[Lease]:
        """The output charge, taken (`Overloaded` when it does not fit)."""
        return acquire(cache, [(object(), self.charge)]) if self.charge else []

    def try_lease(self, cache: TableCache) -> list[Lease] | None:
        """`lease`, or None (nothing counted) when the charge does not fit."""
        return try_acquire(cache, [(object(), self.charge)]) if self.charge else []

    @property
    def nbytes(self) -> int:
        """The bytes of the rows of an answer."""
        return self.count * sum(self.row_bytes)


async def rows_template(
    cache: TableCache,
    entry: CacheEntry,
    model: str,
    given: torch.Tensor,
    rows_of: dict[str, torch.Tensor],
    charge: int,
) -> Rows | None:
    """The `Rows` of an answer whose outputs were the rows of `rows_of` (tables of the resident
    `entry`) at the positions `given` (the request's input), or None when it has none:
    positions that are not integers, a table that is not `entry`'s, or whose bytes the entry
    does not hold in host memory. A CPU table's rows are views of its tensors; a table off the
    CPU is gathered from its host copy (`serving.host.host_bytes`: made once, charged to the
    cache's byte budget with the entry)."""
    if given.is_floating_point() or given.is_complex():
        return None
    flats: list[memoryview] = []
    for name, t in rows_of.items():
        if entry.table.tensors.get(name) is not t or not t.shape or not t.shape[0]:
            return None
        flat = _view(t) if t.device.type == "cpu" else await host_bytes(cache, entry, name)
        if flat is None:
            return None
        flats.append(flat)
    array = given.numpy()
    heights = [t.shape[0] for t in rows_of.values()]
    return Rows(
        model,
        array.dtype,
        array.size,
        min(heights),
        tuple(flats),
        tuple(f.nbytes // h for f, h in zip(flats, heights, strict=True)),
        charge,
    )


def _view(t: torch.Tensor) -> memoryview | None:
    """The bytes of CPU tensor `t` as a flat view of its memory, or None when they are not
    contiguous (a copy would not be the cache's memory)."""
    array = np.ascontiguousarray(host_array(t))
    return memoryview(array.data).cast("B") if array.base is not None else None


@dataclass(frozen=True)
class Step:
    """What answers one HTTP request header against one resident entry (module docstring)."""

    rows: Rows
    header_end: int
    head: bytes
    headers: FixedHeaders


def _shape(path: str, header_length: bytes | None, body: bytes) -> tuple[Hashable, int] | None:
    """(template key, JSON header length) of an infer request to `path` (its
    `Inference-Header-Content-Length` value, None when absent), or None when it has no template:
    no header length, a long header."""
    if header_length is None or not header_length.isdigit():
        return None
    end = int(header_length)
    if not 0 < end <= min(len(body), MAX_TEMPLATE_HEADER):
        return None
    return (path, body[:end]), end


def host_array(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """`t` (a CPU tensor) as a numpy array sharing its memory (BF16 as its int16 bits, as the
    protocol's bytes carry it)."""
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


class Templated(Protocol):
    """A template of either protocol: what it answers with is its `rows`."""

    @property
    def rows(self) -> Rows: ...


S = TypeVar("S", bound=Templated)


@dataclass(frozen=True)
class Gathered(Generic[S]):
    """A template applied to one request's positions (`StepTemplates.gather`): the template,
    each output's rows, the output charge taken, and when its input and infer phases ended
    (`time.perf_counter_ns()`)."""

    step: S
    blocks: list[list[memoryview]]
    leases: list[Lease]
    input_end: int
    infer_end: int


class StepTemplates:
    """Request header -> the resident entry holding its `Step` (in `CacheEntry.answers`, so an
    evicted entry takes its templates with it); at most `size`, least recently used forgotten
    first (0: none)."""

    def __init__(self, size: int = STEP_TEMPLATES) -> None:
        self.size = size
        self._keys: OrderedDict[Hashable, weakref.ref[CacheEntry]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def find(self, cache: TableCache, key: Hashable, kind: type[T]) -> tuple[CacheEntry, T] | None:
        """The resident entry and the template of kind `kind` kept under `key`, or None (a
        template whose entry was evicted is forgotten)."""
        ref = self._keys.get(key)
        if ref is None:
            return None
        entry = ref()
        step = entry.answers.get(key) if entry is not None else None
        if entry is None or not isinstance(step, kind) or cache.peek(entry.key) is not entry:
            self._forget(key)
            return None
        return entry, step

    def used(self, cache: TableCache, key: Hashable, entry: CacheEntry) -> None:
        """The template under `key` answered: most recently used, its entry a cache hit."""
        self._keys.move_to_end(key)
        cache.touch(entry)

    def remember(self, key: Hashable, entry: CacheEntry, step: object) -> None:
        """Keep `step` under `key` while `entry` is resident (the least recently used template
        forgotten past `size`)."""
        if not self.size:
            return
        entry.answers[key] = step
        self._keys[key] = weakref.ref(entry)
        self._keys.move_to_end(key)
        while len(self._keys) > self.size:
            self._forget(next(iter(self._keys)))

    def gather(
        self,
        cache: TableCache,
        key: Hashable,
        kind: type[S],
        data: bytes,
        offset: int = 0,
        found: tuple[CacheEntry, S] | None = None,
        ready: bool = False,
    ) -> Gathered[S] | None:
        """The template of kind `kind` under `key` (`found` already) applied to the positions
        in `data[offset:]`: a cache hit counted, the output charge taken, each output's rows
        sliced; or None (nothing done: no such template, or positions it does not cover; when
        `ready`, also a charge that does not fit, for the route to refuse). The HTTP and gRPC
        decode steps build their bodies from it."""
        if found is None:
            found = self.find(cache, key, kind)
            if found is None:
                return None
        entry, step = found
        rows = step.rows
        positions = rows.positions(data, offset)
        if positions is None:
            return None
        input_end = time.perf_counter_ns()
        if ready:
            taken = rows.try_lease(cache)
            if taken is None:
                return None
            self.used(cache, key, entry)
            leases = taken
        else:
            self.used(cache, key, entry)
            leases = rows.lease(cache)
        blocks = rows.blocks(positions)
        return Gathered(step, blocks, leases, input_end, time.perf_counter_ns())

    def answer(
        self,
        cache: TableCache,
        path: str,
        header_length: bytes | None,
        body: bytes,
        observe: Callable[[str, str], None] | None,
        timer: InferTimer,
    ) -> Response | None:
        """The answer to an infer request to `path` without a `Content-Encoding` (its
        `Inference-Header-Content-Length` value `header_length`, its `body` read) from its
        template, or None (nothing done: the slow path answers); its phases marked on `timer`
        as the slow path marks them (the caller records the success)."""
        shape = self._templated(path, header_length, body)
        got = self.gather(cache, shape[0], Step, body, shape[1]) if shape is not None else None
        return self._answer(got, observe, timer) if got is not None else None

    def ready(
        self,
        cache: TableCache,
        path: str,
        header_length: bytes | None,
        body: bytes,
        observe: Callable[[str, str], None] | None,
        stats: InferenceStats,
        max_bytes: int,
    ) -> ReadyResponse | None:
        """`answer`, for the server's ready answers (`api/door.py`): an answer of at most
        `max_bytes` whose charge fits, the success recorded in `stats` as the route records it;
        else None, and nothing counted."""
        shape = self._templated(path, header_length, body)
        found = self.find(cache, shape[0], Step) if shape is not None else None
        if shape is None or found is None:
            return None
        key, end = shape
        step = found[1]
        if len(step.head) + step.rows.nbytes > max_bytes:
            return None
        timer = stats.timer(step.rows.model)
        got = self.gather(cache, key, Step, body, end, found, ready=True)
        if got is None:
            return None
        answer = self._answer(got, observe, timer)
        timer.succeeded("hit")
        return answer

    def _templated(
        self, path: str, header_length: bytes | None, body: bytes
    ) -> tuple[Hashable, int] | None:
        """`_shape` of a request while any template is kept, else None."""
        return _shape(path, header_length, body) if self._keys else None

    @staticmethod
    def _answer(
        got: Gathered[Step], observe: Callable[[str, str], None] | None, timer: InferTimer
    ) -> ReadyResponse:
        """The body assembled once: the header, then each output's rows."""
        parts: list[bytes | memoryview] = [got.step.head]
        for block in got.blocks:
            parts += block
        body = b"".join(parts)
        timer.marks(got.input_end, got.infer_end, time.perf_counter_ns())
        if observe is not None:
            observe(got.step.rows.model, "hit")
        return ReadyResponse(got.step.headers, [memoryview(body)], got.leases)

    async def keep(
        self,
        cache: TableCache,
        path: str,
        header_length: bytes | None,
        body: bytes,
        parsed: InferRequest,
        entry: CacheEntry,
        rows_of: dict[str, torch.Tensor],
        model: str,
        head: bytes,
        sent: Response,
        charge: int,
    ) -> None:
        """Remember the answer `sent` (response header `head`, outputs the rows of `rows_of` at
        the positions, all binary) to an infer request to `path` without a `Content-Encoding`
        (`header_length` and `body` as `answer` takes them) as its header's template while
        `entry` is resident in `cache`; nothing when the request has no template (module
        docstring)."""
        shape = _shape(path, header_length, body) if self.size else None
        if shape is None or len(parsed.inputs) != 1:
            return
        key, end = shape
        (given,) = parsed.inputs.values()
        rows = await rows_template(cache, entry, model, given.tensor, rows_of, charge)
        if rows is None or rows.positions(body, end) is None:
            return
        self.remember(key, entry, Step(rows, end, head, FixedHeaders(list(sent.raw_headers))))

    def _forget(self, key: Hashable) -> None:
        ref = self._keys.pop(key, None)
        entry = ref() if ref is not None else None
        if entry is not None:
            entry.answers.pop(key, None)
