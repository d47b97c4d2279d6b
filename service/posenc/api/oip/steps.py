"""Decode steps: a repeated `/v2` infer request answered from a template of its last answer.

A decode loop sends the same request every step but for the positions: the same JSON header
(model, spec parameters, outputs, the input's datatype, shape and `binary_data_size`) followed
by the position ids as binary. Parsing that header, building the spec, planning and charging the
outputs, gathering through torch and encoding the response header are then the same work every
step, and cost more than the answer itself. So once such a request has been answered from a
resident cache entry (`posenc_source: hit`), `StepTemplates` keeps, keyed by the path and the
request's JSON header bytes, what the answer was made of (`Step`): the response header bytes and
header lines (the same for every step: the shapes and byte sizes depend only on the number of
positions), the cached table's tensors as host arrays, the charge. The next such request is
answered by reading its positions from the binary tail, checking them against the table's rows,
and gathering the rows with numpy; the body is the header followed by one row block per output.

Only the rows-of-a-cached-table answer has a template (`InferResult.rows_of`, set by the models
that gather rows of a whole CPU-resident table: RoPE without M-RoPE sections); a request with a
`Content-Encoding`, positions sent as JSON or as floats, a position outside the table (computed
rows), or an entry no longer resident takes the slow path, which answers it and every first
request. The template's answer counts a hit on the entry, takes the output charge and counts the
inference in the metrics as the slow path does (`tests/api/test_v2_steps.py` compares the two
through a real server).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from starlette.responses import Response

from posenc.api.oip.codec import InferRequest
from posenc.api.serving.body import ReadyResponse, acquire
from posenc.runtime import CacheEntry, TableCache

STEP_TEMPLATES = 1024
"""Request headers remembered (each holds a response header and its lines; the rows are the
cache's)."""

MAX_TEMPLATE_HEADER = 16 << 10
"""Requests whose JSON header is longer than this have no template."""


@dataclass(frozen=True)
class Step:
    """What answers one request header against one resident entry (module docstring)."""

    model: str
    header_end: int
    dtype: np.dtype[Any]
    count: int
    rows: int
    flats: tuple[memoryview, ...]
    """Each output's table as flat bytes (a view of the cached tensor's memory)."""
    row_bytes: tuple[int, ...]
    head: bytes
    raw_headers: list[tuple[bytes, bytes]]
    charge: int


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


class StepTemplates:
    """Request header -> the resident entry holding its `Step` (in `CacheEntry.answers`, so an
    evicted entry takes its templates with it); at most `size`, least recently used forgotten
    first (0: none)."""

    def __init__(self, size: int = STEP_TEMPLATES) -> None:
        self.size = size
        self._keys: OrderedDict[Hashable, weakref.ref[CacheEntry]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def answer(
        self,
        cache: TableCache,
        path: str,
        header_length: bytes | None,
        body: bytes,
        observe: Callable[[str, str], None] | None,
    ) -> Response | None:
        """The answer to an infer request to `path` without a `Content-Encoding` (its
        `Inference-Header-Content-Length` value `header_length`, its `body` read) from its
        template, or None (nothing done: the slow path answers)."""
        if not self._keys:
            return None
        shape = _shape(path, header_length, body)
        if shape is None:
            return None
        key, end = shape
        ref = self._keys.get(key)
        entry = ref() if ref is not None else None
        step = entry.answers.get(key) if entry is not None else None
        if entry is None or not isinstance(step, Step) or cache.peek(entry.key) is not entry:
            if ref is not None:
                self._forget(key)
            return None
        if len(body) - end != step.count * step.dtype.itemsize:
            return None
        positions = np.frombuffer(body, step.dtype, step.count, end).tolist()
        if positions and (min(positions) < 0 or max(positions) >= step.rows):
            return None
        self._keys.move_to_end(key)
        cache.touch(entry)
        leases = acquire(cache, [(object(), step.charge)]) if step.charge else []
        # the body assembled once: the header, then each output's rows (row bytes sliced from
        # the table's flat bytes, no numpy per row)
        parts: list[bytes | memoryview] = [step.head]
        for flat, size in zip(step.flats, step.row_bytes, strict=True):
            parts += [flat[p * size : (p + 1) * size] for p in positions]
        if observe is not None:
            observe(step.model, "hit")
        return ReadyResponse(step.raw_headers, [memoryview(b"".join(parts))], leases)

    def keep(
        self,
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
        `entry` is resident; nothing when the request has no template (module docstring)."""
        shape = _shape(path, header_length, body) if self.size else None
        if shape is None or len(parsed.inputs) != 1:
            return
        key, end = shape
        (given,) = parsed.inputs.values()
        if given.tensor.is_floating_point() or given.tensor.is_complex():
            return
        array = given.tensor.numpy()
        if len(body) - end != array.nbytes or not all(
            t.device.type == "cpu" for t in rows_of.values()
        ):
            return
        arrays = [np.ascontiguousarray(host_array(t)) for t in rows_of.values()]
        if any(a.base is None for a in arrays):  # a copy: not the cache's memory
            return
        rows = min(a.shape[0] for a in arrays)
        flats = tuple(memoryview(a.data).cast("B") for a in arrays)
        row_bytes = tuple(a.nbytes // a.shape[0] if a.shape[0] else 0 for a in arrays)
        step = Step(
            model,
            end,
            array.dtype,
            array.size,
            rows,
            flats,
            row_bytes,
            head,
            list(sent.raw_headers),
            charge,
        )
        entry.answers[key] = step
        self._keys[key] = weakref.ref(entry)
        self._keys.move_to_end(key)
        while len(self._keys) > self.size:
            self._forget(next(iter(self._keys)))

    def _forget(self, key: Hashable) -> None:
        ref = self._keys.pop(key, None)
        entry = ref() if ref is not None else None
        if entry is not None:
            entry.answers.pop(key, None)
