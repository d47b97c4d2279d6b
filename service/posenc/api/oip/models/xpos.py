"""The `xpos` model: xPos query/key rows for position ids (torchscale `XPOS`, Sun et al. 2022).

Input `position_ids` (INT64 or INT32, rank >= 1, absolute positions n in [0, 2^24)) -> the four
tensors of the spec's `packing`, each position_ids.shape + [w] (w = head_dim for `width` full,
head_dim/2 for half), in the spec's dtype:

- `premultiplied` (default): `cos_q`, `sin_q`, `cos_k`, `sin_k` (cos/sin times s or 1/s);
- `factored`: `cos`, `sin`, `scale_q` (s), `scale_k` (1/s).

The spec is a `/v1` xpos spec (`posenc.encodings.xpos.XposSpec`; `spec` JSON or flat keys):
`head_dim`, `max_positions`, `position_offset`, `centre`, `packing`, `width`, `interleaved`,
`dtype`, `precision`, `scale_base`, `gamma`, `base`. It fixes the centre c (s = 1 at n = c;
`torchscale` c = ceil((position_offset + max_positions) / 2)), whatever positions are asked; c
cancels in every q.k, so one spec serves a whole decode.

Rows are gathered from the cached table of positions position_offset .. position_offset +
max_positions - 1 when every position falls inside it (on the table's device; a run of
consecutive positions is a view); otherwise exactly the distinct positions are computed with the
core's own `xpos_rows` (same c, same ops in the same order, one rounding), rows equal to those of
any table holding them with that c. Positions so far from c that the decay would leave the
dtype's normal range are refused (400 naming `position_ids`), as specs are at validation.
"""

from __future__ import annotations

from typing import Any

import torch

from posenc.api.memo import JsonMemo
from posenc.api.oip.codec import InferRequest, bad_request
from posenc.api.oip.context import OipContext
from posenc.api.oip.models.base import (
    INDEX_TYPES,
    InferResult,
    OipModel,
    SpecInfo,
    TensorDecl,
    admit,
    check_unknown_inputs,
    describe,
    get_input,
    positions_in_range,
    spec_parameters,
    wanted_outputs,
)
from posenc.api.oip.params import merged_spec
from posenc.encodings import TensorInfo, parse_spec
from posenc.encodings.xpos import MAX_POSITIONS, XposSpec, log_range, xpos_rows
from posenc.runtime.rows import consecutive, gather_rows, row_index, unique_rows

POSITION_IDS = TensorDecl(
    "position_ids",
    "INT64",
    (-1,),
    "absolute positions n, any shape of rank >= 1, in [0, 2^24)",
    accepts=INDEX_TYPES,
)
FLOATS = ("FP32", "FP16", "BF16")
OUTPUTS = (
    TensorDecl(
        "cos_q", "FP32", (-1, -1), "premultiplied: cos * s, position_ids.shape + [w]", FLOATS
    ),
    TensorDecl(
        "sin_q", "FP32", (-1, -1), "premultiplied: sin * s, position_ids.shape + [w]", FLOATS
    ),
    TensorDecl(
        "cos_k", "FP32", (-1, -1), "premultiplied: cos / s, position_ids.shape + [w]", FLOATS
    ),
    TensorDecl(
        "sin_k", "FP32", (-1, -1), "premultiplied: sin / s, position_ids.shape + [w]", FLOATS
    ),
    TensorDecl("cos", "FP32", (-1, -1), "factored: cos, position_ids.shape + [w]", FLOATS),
    TensorDecl("sin", "FP32", (-1, -1), "factored: sin, position_ids.shape + [w]", FLOATS),
    TensorDecl("scale_q", "FP32", (-1, -1), "factored: s, position_ids.shape + [w]", FLOATS),
    TensorDecl("scale_k", "FP32", (-1, -1), "factored: 1 / s, position_ids.shape + [w]", FLOATS),
)
MEMO: JsonMemo[SpecInfo] = JsonMemo()


def build_spec(parameters: dict[str, Any]) -> SpecInfo:
    """The canonical xPos spec (centre resolved to its integer) of the request parameters."""
    spec = parse_spec(merged_spec("xpos", parameters))
    assert isinstance(spec, XposSpec)
    return describe(spec)


def check_decay(spec: XposSpec, bounds: tuple[int, int] | None) -> None:
    """Positions outside the table (`bounds`: their min and max, None when there are none) must
    keep |ln s| within the dtype's normal range, as the spec's validation demands of the table's
    own rows (400 naming `position_ids`)."""
    if bounds is None:
        return
    c = spec.resolved_centre()
    lo, hi = bounds
    far = lo if abs(lo - c) >= abs(hi - c) else hi
    peak, limit = spec.log_scale_at(abs(far - c)), log_range(spec.dtype)
    if peak > limit:
        raise bad_request(
            f"input 'position_ids': position {far} is {abs(far - c)} from the centre c={c}: the "
            f"decay overflows {spec.dtype} (|ln scale| = {peak:.4g} > {limit:.4g}, "
            f"scale_base={spec.scale_base:g}); ask positions nearer c, or use a larger "
            "scale_base, a centre nearer them or dtype float32"
        )


async def infer(ctx: OipContext, request: InferRequest) -> InferResult:
    check_unknown_inputs(request, MODEL)
    info = MEMO.get(request.parameters, lambda: build_spec(request.parameters))
    spec = info.spec
    assert isinstance(spec, XposSpec)
    positions = get_input(request, POSITION_IDS)
    assert positions is not None
    if positions.dim() == 0:
        raise bad_request("input 'position_ids' must have rank 1 or more, got shape []")
    positions = positions.to(torch.int64)
    bounds = positions_in_range(positions, "position_ids", MAX_POSITIONS)
    lead = tuple(positions.shape)

    infos = info.outputs
    why = f"the spec's packing is {spec.packing!r} (outputs {list(infos)})"
    available = {d.name: None if d.name in infos else why for d in OUTPUTS}
    names = wanted_outputs(request, MODEL, available, list(infos))
    planned = {n: TensorInfo(lead + infos[n].shape[1:], infos[n].dtype) for n in names}

    index = row_index(positions, spec.position_offset, spec.max_positions, bounds)
    cached = index is not None and ctx.fits_cache(info.nbytes)
    if not cached:
        check_decay(spec, bounds)
    nbytes = admit(ctx, request, planned)

    if cached and index is not None:
        table, source = await ctx.table(spec, info.key)
        src = table.tensors
        picked = index
    else:

        def computed() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            uniq, inverse = unique_rows(positions)  # off the event loop too (rope.py)
            return inverse, xpos_rows(spec, uniq, ctx.device)

        picked, src = await ctx.rows(computed, nbytes)
        source = "computed"
    device = str(next(iter(src.values())).device)

    def gather() -> dict[str, torch.Tensor]:
        run = consecutive(picked.reshape(-1))
        return {n: gather_rows(src[n], picked, run) for n in names}

    tensors = await ctx.offload(gather, nbytes)
    return InferResult(tensors, spec_parameters(info, source, device))


MODEL = OipModel(
    name="xpos",
    description="xPos query/key rows for position ids (torchscale XPOS: rotary with a decay)",
    inputs=(POSITION_IDS,),
    outputs=OUTPUTS,
    infer=infer,
    notes=(
        "outputs per packing: premultiplied cos_q, sin_q, cos_k, sin_k; factored cos, sin, "
        "scale_q, scale_k; each position_ids.shape + [w], all four sent by default",
        "the spec fixes the centre c for every position asked (torchscale: ceil((position_offset"
        " + max_positions) / 2)); it cancels in q.k, so one spec serves a whole decode",
        "rows come from the cached table of positions position_offset .. position_offset + "
        "max_positions - 1 when every position is inside it, else exactly the distinct positions "
        "are computed (not cached), equal bit for bit to the rows of a table holding them",
        "position ids are in [0, 2^24) and within the decay's range of c for the dtype",
    ),
)
