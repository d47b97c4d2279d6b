"""Row selection from computed tables: gathers on the table's device, no arithmetic on values.

The Open Inference Protocol models (`posenc.api.oip`) answer requests for arbitrary positions.
They take rows out of a cached table when the positions fall inside it, or out of rows computed
for exactly the distinct positions asked (`unique_rows`), with the helpers here. Every function
only selects elements (index arithmetic on positions, never on table values), so a gathered row is
bit-identical to the row of the full table.

Multimodal RoPE (Qwen2-VL, Qwen3-VL): position ids carry a leading axis of 3 (temporal, height,
width) and each rotary frequency pair reads the angle of one of those axes. `mrope_pair_axes` gives
that axis per pair; `gather_sections` picks each column from the row of its axis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch


def unique_rows(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(distinct sorted positions (U,), inverse index of `positions`' shape into them)."""
    uniq, inverse = torch.unique(positions, sorted=True, return_inverse=True)
    return uniq, inverse


def row_index(
    positions: torch.Tensor, start: int, rows: int, bounds: tuple[int, int] | None = None
) -> torch.Tensor | None:
    """Rows of a table holding positions `start .. start+rows-1` for `positions` (any shape, any
    numeric dtype), as int64 on the same device; None unless every position is an integer inside.
    `bounds`: `extent(positions)` when the caller has it (integer positions).
    """
    if positions.numel() == 0:
        return positions.to(torch.int64)
    if positions.is_floating_point() and not bool(torch.all(positions == positions.floor())):
        return None
    lo, hi = extent(positions) if bounds is None else bounds
    if lo < start or hi >= start + rows:
        return None
    index = positions.to(torch.int64)
    return index - start if start else index


def extent(positions: torch.Tensor) -> tuple[int, int]:
    """(min, max) of a non-empty tensor; read through numpy on the CPU (a request's few
    positions: torch's per-operation dispatch would cost more than the reduction)."""
    if positions.device.type == "cpu":
        values = positions.numpy()
        return int(values.min()), int(values.max())
    return int(positions.min()), int(positions.max())


def gather_rows(
    table: torch.Tensor, index: torch.Tensor, run: int | Literal["find"] | None = "find"
) -> torch.Tensor:
    """`table[index]`: rows (R, *rest) picked by int64 `index` of any shape -> index.shape + rest.

    `index` is moved to the table's device; the gather runs there. A run of consecutive rows
    (a prefill, a whole table) is returned as a view of the table, without copying. `run` is
    `consecutive(index.reshape(-1))` when the caller has it (one test for several tables).
    """
    flat = index.reshape(-1)
    if run == "find":
        run = consecutive(flat)
    if run is not None:
        out = table.narrow(0, run, flat.numel())
    else:
        out = table.index_select(0, flat.to(table.device))
    return out.reshape(*index.shape, *table.shape[1:])


def consecutive(flat: torch.Tensor) -> int | None:
    """The first row when 1-D `flat` is `start, start+1, ...` (at least two rows), else None."""
    n = flat.numel()
    if n < 2:
        return None
    if flat.device.type == "cpu":
        values = flat.numpy()
        start = int(values[0])
        if int(values[-1]) != start + n - 1 or not bool(np.all(np.diff(values) == 1)):
            return None
        return start
    start = int(flat[0])
    if int(flat[-1]) != start + n - 1 or not bool(torch.all(flat[1:] - flat[:-1] == 1)):
        return None
    return start


def gather_sections(
    table: torch.Tensor, index: torch.Tensor, column_axis: torch.Tensor
) -> torch.Tensor:
    """Per-column rows from a (R, *rest) table for multi-axis positions.

    `index` (A, *S) int64 holds one row per position axis; `column_axis` (*rest) says which axis
    each column reads. Returns (*S, *rest) with `out[s, c] = table[index[column_axis[c], s], c]`.
    """
    rest = table.shape[1:]
    width = int(torch.tensor(rest).prod()) if rest else 1
    flat_table = table.reshape(table.shape[0], width)
    axes = column_axis.reshape(width).to(device=table.device, dtype=torch.int64)
    idx = index.reshape(index.shape[0], -1).to(table.device)  # (A, N)
    picked = idx.index_select(0, axes).t().contiguous()  # (N, width): row per column
    out = torch.gather(flat_table, 0, picked)
    return out.reshape(*index.shape[1:], *rest)


def gather_block(
    table: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    row_axis: int,
    row_offset: int = 0,
) -> torch.Tensor:
    """Sub-block of a table along two adjacent axes: `row_axis` picks `rows - row_offset`, the next
    axis picks `cols` (1-D int64 each). ALiBi (H, Q, K) and T5 (Q, K) / (H, Q, K) tables."""
    dev = table.device
    r = rows.reshape(-1).to(dev, torch.int64) - row_offset
    c = cols.reshape(-1).to(dev, torch.int64)
    return table.index_select(row_axis, r).index_select(row_axis + 1, c)


def mrope_pair_axes(section: Sequence[int], layout: str) -> torch.Tensor:
    """Position axis (0 temporal, 1 height, 2 width) of each rotary frequency pair, (sum(section),).

    Chunked (Qwen2-VL, transformers `Qwen2VLRotaryEmbedding.recomposition_frequencies`): pairs are
    split into consecutive runs of `section[0]`, `section[1]`, `section[2]`; run k reads axis k.
    Interleaved (Qwen3-VL, `Qwen3VLTextRotaryEmbedding.recomposition_frequencies`): pair i reads
    axis 1 when `i % 3 == 1 and i < 3*section[1]`, axis 2 when `i % 3 == 2 and i < 3*section[2]`,
    axis 0 otherwise (the layout [THWTHW...TT]). ERNIE-4.5-VL
    (`Ernie4_5_VLMoeTextRotaryEmbedding`: pre-permuted inverse frequencies, h and w stacked back):
    pairs below section[0] + section[1] alternate axis 1 (even) and 2 (odd), the rest read axis 0.
    Row-column (NeoMME, `NeoMMERotaryEmbedding.recomposition_frequencies`: two axes, 0 row and 1
    column, `section` [s, s]): pair i reads axis i % 2.
    """
    half = sum(section)
    if layout == "chunked":
        return torch.repeat_interleave(
            torch.arange(len(section), dtype=torch.int64), torch.tensor(list(section))
        )
    axes = torch.zeros(half, dtype=torch.int64)
    if layout == "row_column":
        axes[1::2] = 1
        return axes
    if layout == "ernie":
        hw = section[0] + section[1]
        axes[0:hw:2] = 1
        axes[1:hw:2] = 2
        return axes
    for axis in (1, 2):
        axes[axis : section[axis] * 3 : 3] = axis
    return axes


def mrope_channel_axes(section: Sequence[int]) -> torch.Tensor:
    """Position axis of each channel of a full-width half-split (`cat(c, c)`) table,
    (2 * sum(section),): HunYuan-VL (`HunYuanVLRotaryEmbedding.recomposition_frequencies`)
    splits the full width into chunks of 2 * section[k] channels, chunk k reading axis k, so the
    two channels of a rotate_half pair may read different axes (no per-pair map)."""
    sizes = torch.tensor([2 * s for s in section], dtype=torch.int64)
    return torch.repeat_interleave(torch.arange(len(section), dtype=torch.int64), sizes)


def lookup_bias(weights: torch.Tensor, buckets: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`bias[h, ...] = weights[buckets[...], h]` (H, *buckets.shape): T5's learned relative bias,
    `weights` (num_buckets, H) read as float32, gathered, cast last (as `compute_t5_bias`)."""
    table = weights.to(device=buckets.device, dtype=torch.float32)
    return table.t()[:, buckets].to(dtype)


def preview_steps(shape: Sequence[int], max_points: int) -> tuple[int, ...]:
    """Per-axis strides that cut a tensor of `shape` to at most `max_points` elements.

    Greedy: the axis with the most remaining elements has its stride doubled (capped at its
    length) until the strided shape fits, so a long position axis is thinned first and short
    axes (dimensions, heads) stay whole where the budget allows. `t[::s0, ::s1, ...]` with these
    strides then selects the preview: every `s`-th element, no arithmetic on values, so each
    previewed value is bit-identical to the table's. Shapes only: nothing is allocated.
    """
    if max_points < 1:
        raise ValueError(f"max_points must be at least 1, got {max_points}")
    steps = [1] * len(shape)

    def counts() -> list[int]:
        return [-(-n // s) if n else 0 for n, s in zip(shape, steps, strict=True)]

    current = counts()
    while math.prod(current) > max_points:
        axis = max(range(len(shape)), key=lambda i: current[i])
        steps[axis] = min(steps[axis] * 2, shape[axis])
        current = counts()
    return tuple(steps)


def _blocks(v: torch.Tensor, axis: int, step: int, fill: float) -> torch.Tensor:
    """`v` with axis `axis` padded with `fill` to a multiple of `step` and split into
    (count, step)."""
    n = v.shape[axis]
    count = -(-n // step)
    pad = count * step - n
    if pad:
        shape = list(v.shape)
        shape[axis] = pad
        v = torch.cat([v, v.new_full(shape, fill)], dim=axis)
    shape = list(v.shape)
    shape[axis : axis + 1] = [count, step]
    return v.reshape(shape)


def block_pool(t: torch.Tensor, steps: Sequence[int]) -> dict[str, torch.Tensor]:
    """{"min", "max", "mean"} of `t` over the blocks that `preview_steps`' strides tile it into.

    Block k of axis i covers indices [k*step_i, (k+1)*step_i) (the last one shorter), so each
    pooled element stands for every element its strided sample skips: a heatmap pixel drawn
    from it shows what the rows it covers hold, where a stride shows one row of them (and
    aliases a column whose period is shorter than the stride). Each output has the strided
    sample's shape, `ceil(n_i / step_i)` per axis; the mean is computed in float64. Values are
    combined here (unlike `preview_steps`' selection): the pooled arrays describe blocks, they
    are not table values.
    """
    x = t.to(torch.float64)
    lo, hi, mean = x, x, x
    for axis, step in enumerate(steps):
        n = x.shape[axis]
        if step <= 1 or n == 0:
            continue
        count = -(-n // step)
        lo = _blocks(lo, axis, step, math.inf).amin(dim=axis + 1)
        hi = _blocks(hi, axis, step, -math.inf).amax(dim=axis + 1)
        sizes = torch.full((count,), float(step), dtype=torch.float64)
        sizes[-1] = n - (count - 1) * step
        view = [1] * mean.dim()
        view[axis] = count
        mean = _blocks(mean, axis, step, 0.0).sum(dim=axis + 1) / sizes.reshape(view)
    return {"min": lo, "max": hi, "mean": mean}
