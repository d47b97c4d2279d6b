"""The `sinusoidal` model: 1-D sinusoidal embedding rows for position ids.

Input `position_ids` (INT64/INT32, or FP32/FP64 for fractional diffusion timesteps; any shape) ->
`embedding` of shape position_ids.shape + [dim]. The spec is a `/v1` sinusoidal spec without
`positions` (they come from the input). With `max_positions` it describes a table of positions
`position_offset .. position_offset + max_positions - 1` (descending, `position_offset` down, with
`position_step` -1): ids inside it are gathered from the cached table. Other ids, or every id when
the spec has no `max_positions`, are computed as the spec's explicit `positions` (the distinct ids
only, in chunks of the core's limit): a row is a function of its position alone, so these are the
table's rows there. Not so under `standardize` (PatchTST rescales by the whole table's mean and
standard deviation): a table with it answers ids inside it from the cached table only, and refuses
the others (400) rather than standardize over the ids asked.
"""

from __future__ import annotations

from typing import Any

import torch

from posenc.api.memo import JsonMemo
from posenc.api.oip.codec import InferRequest, bad_request
from posenc.api.oip.context import OipContext
from posenc.api.oip.models.base import (
    InferResult,
    OipModel,
    SpecInfo,
    TensorDecl,
    admit,
    check_unknown_inputs,
    describe,
    get_input,
    spec_parameters,
    wanted_outputs,
)
from posenc.api.oip.params import merged_spec
from posenc.encodings import Table, TensorInfo, parse_spec
from posenc.encodings.sinusoidal import (
    MAX_EXPLICIT_POSITIONS,
    MAX_POSITION_VALUE,
    SinusoidalSpec,
)
from posenc.runtime.rows import gather_rows, row_index, unique_rows

POSITION_IDS = TensorDecl(
    "position_ids",
    "INT64",
    (-1,),
    "positions, any shape (FP32/FP64 for fractional timesteps)",
    ("INT64", "INT32", "FP32", "FP64"),
)
OUTPUTS = (
    TensorDecl(
        "embedding", "FP32", (-1, -1), "position_ids.shape + [dim]", ("FP32", "FP16", "BF16")
    ),
)
TABLE_FIELDS = ("max_positions", "position_offset", "position_step")
MEMO: JsonMemo[SpecInfo] = JsonMemo()


def _sinusoidal(spec: dict[str, Any]) -> SinusoidalSpec:
    parsed = parse_spec(spec)
    assert isinstance(parsed, SinusoidalSpec)
    return parsed


def _check_positions(t: torch.Tensor) -> None:
    if t.numel() == 0:
        return
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise bad_request("input 'position_ids' holds NaN or infinite values")
    lo, hi = float(t.min()), float(t.max())
    if lo < -MAX_POSITION_VALUE or hi > MAX_POSITION_VALUE:
        raise bad_request(
            f"input 'position_ids': positions must be within +-{int(MAX_POSITION_VALUE)}"
        )


async def infer(ctx: OipContext, request: InferRequest) -> InferResult:
    check_unknown_inputs(request, MODEL)
    spec = merged_spec("sinusoidal", request.parameters)
    if spec.get("positions") is not None:
        raise bad_request("positions come from the 'position_ids' input, not the spec")
    positions = get_input(request, POSITION_IDS)
    assert positions is not None
    _check_positions(positions)
    names = wanted_outputs(request, MODEL, {"embedding": None}, ["embedding"])

    info = (
        MEMO.get(request.parameters, lambda: describe(_sinusoidal(spec)))
        if spec.get("max_positions") is not None
        else None
    )
    table = info.spec if info is not None else None
    assert table is None or isinstance(table, SinusoidalSpec)
    index = None
    if info is not None and table is not None and ctx.fits_cache(info.nbytes):
        offset, rows = int(table.position_offset or 0), int(table.max_positions or 0)
        if table.position_step == -1:  # row r holds position offset - r
            index = row_index(-positions, -offset, rows)
        else:
            index = row_index(positions, offset, rows)
    if index is None and table is not None and table.standardize is not None:
        raise bad_request(
            f"standardize {table.standardize!r} rescales by the whole table's mean and standard "
            "deviation: only positions inside the table are served (gathered from it, when it "
            "fits the cache), not rows computed for the positions asked"
        )
    uniq = inverse = None
    chunks: list[SinusoidalSpec] = []
    if index is None:
        uniq, inverse = unique_rows(positions)
        rows_spec = {k: v for k, v in spec.items() if k not in TABLE_FIELDS}
        values = uniq.tolist() if uniq.numel() else [0.0]
        chunks = [
            _sinusoidal({**rows_spec, "positions": values[i : i + MAX_EXPLICIT_POSITIONS]})
            for i in range(0, len(values), MAX_EXPLICIT_POSITIONS)
        ]
    used = table if index is not None and table is not None else chunks[0]
    dim = used.dim
    dtype = str(used.canonical().dtype)
    planned = {"embedding": TensorInfo((*positions.shape, dim), dtype)}
    nbytes = admit(ctx, request, planned)

    if index is not None and info is not None:
        computed, source = await ctx.table(info.spec, info.key)
        src, idx = computed.tensors["embedding"], index
    else:
        parts: list[Table] = [await ctx.compute(c) for c in chunks]
        src = torch.cat([p.tensors["embedding"] for p in parts])
        assert inverse is not None
        idx, source = inverse, "computed"
    embedding = await ctx.offload(lambda: gather_rows(src, idx), nbytes)
    params = spec_parameters(info if index is not None else None, source, str(src.device))
    return InferResult({n: {"embedding": embedding}[n] for n in names}, params)


MODEL = OipModel(
    name="sinusoidal",
    description="1-D sinusoidal embedding rows (Vaswani, tensor2tensor, fairseq, Whisper, ...)",
    inputs=(POSITION_IDS,),
    outputs=OUTPUTS,
    infer=infer,
    notes=(
        "with max_positions the spec is a table of positions position_offset.. : ids inside it "
        "are gathered from the cached table; other ids are computed as explicit positions",
        "fairseq-style padding_idx rows are zero wherever that position id is asked",
    ),
)
