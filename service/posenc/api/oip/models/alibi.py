"""The `alibi` model: ALiBi slopes and the additive bias for query x key positions.

Inputs `query_positions` [Q], `key_positions` [K] (INT64/INT32) -> `bias` [H, Q, K] in the spec's
`dtype` and `slopes` [H] FP32 (H = num_heads / tp_size). Without positions only `slopes` is sent.
The spec is a `/v1` ALiBi spec; its bias form defaults to `causal` when positions are given.
`causal`, `symmetric` and `row_constant` depend on the positions alone; `mpt` also on the table's
key length and `bottom_right` on both lengths, so those two need `query_length`/`key_length` and
positions inside that table (`mpt`: keys below its key length).

Where the rows come from: the cached table when the positions fall inside the spec's table and it
fits the cache; else the bounding block of the positions, computed; else (a block over the
response limit: scattered positions, or a table of 10M x 10M keys sampled by the explorer) the
entries at the asked (query, key) pairs only (`alibi_bias_at`: the table's ops entry by entry,
equal to the table there).
"""

from __future__ import annotations

import torch

from posenc.api.oip.codec import InferRequest, bad_request
from posenc.api.oip.context import OipContext
from posenc.api.oip.models._pairs import (
    KEY_POSITIONS,
    QUERY_POSITIONS,
    block_dict,
    has_table,
    inside,
    pair_positions,
)
from posenc.api.oip.models.base import (
    InferResult,
    OipModel,
    TensorDecl,
    admit,
    check_unknown_inputs,
    describe,
    spec_parameters,
    wanted_outputs,
)
from posenc.api.oip.params import merged_spec
from posenc.encodings import TensorInfo, parse_spec
from posenc.encodings.alibi import AlibiSpec, alibi_bias_at, alibi_slopes
from posenc.runtime.rows import gather_block

OUTPUTS = (
    TensorDecl("bias", "FP32", (-1, -1, -1), "additive bias [H, Q, K]", ("FP32", "FP16", "BF16")),
    TensorDecl("slopes", "FP32", (-1,), "per-head slopes [H], always FP32"),
)
SLOPE_FIELDS = ("num_heads", "alibi_bias_max", "slope_scale", "slope_rounding",
                "interpolation_factor", "tp_size", "tp_rank", "kind")  # fmt: skip


def _alibi(spec: dict[str, object]) -> AlibiSpec:
    parsed = parse_spec(spec).canonical()
    assert isinstance(parsed, AlibiSpec)
    return parsed


def _either(block: AlibiSpec | None, table: AlibiSpec | None) -> AlibiSpec:
    spec = block if block is not None else table
    assert spec is not None
    return spec


async def infer(ctx: OipContext, request: InferRequest) -> InferResult:
    check_unknown_inputs(request, MODEL)
    spec = merged_spec("alibi", request.parameters)
    pos = pair_positions(request)
    if pos is not None and spec.get("bias") is None:
        spec["bias"] = "causal"
    available = {
        "slopes": None,
        "bias": None if pos is not None else "it needs query_positions and key_positions",
    }
    names = wanted_outputs(
        request, MODEL, available, ["bias", "slopes"] if pos is not None else ["slopes"]
    )

    table: AlibiSpec | None = None
    block: AlibiSpec | None = None
    direct = False  # the entries at the asked pairs only (alibi_bias_at)
    if pos is None:
        kept = spec if has_table(spec) else {k: v for k, v in spec.items() if k in SLOPE_FIELDS}
        used: AlibiSpec = _alibi(kept)
    else:
        q, k = pos
        if has_table(spec):
            table = _alibi(spec)
        in_table = table is not None and inside(table, q, k)
        if in_table and table is not None and not ctx.fits_cache(table.output_bytes()):
            direct = True
        elif not in_table:
            form = table.bias if table is not None else spec.get("bias")
            key_length = None
            if form == "bottom_right":
                if table is None:
                    raise bad_request("bias 'bottom_right' needs query_length and key_length")
                raise bad_request(
                    "bias 'bottom_right' aligns the table's last query with its last key: "
                    f"positions must fall inside it (queries [0, {table.query_length}), "
                    f"keys [0, {table.key_length}))"
                )
            if form == "mpt":
                if table is None:
                    raise bad_request(
                        "bias 'mpt' needs key_length (it is relative to the last key)"
                    )
                key_length = int(table.key_length or 0)
                if int(k.max()) >= key_length:
                    raise bad_request(
                        f"bias 'mpt': key positions must be below key_length={key_length}"
                    )
            block = _alibi(block_dict(spec, q, k, key_length))
            direct = block.output_bytes() > ctx.max_response_bytes
        used = _either(block, table)
    heads = used.local_heads
    planned = {"slopes": TensorInfo((heads,), "float32")}
    if pos is not None:
        planned["bias"] = TensorInfo((heads, pos[0].numel(), pos[1].numel()), used.dtype)
    nbytes = admit(ctx, request, {n: planned[n] for n in names})

    tensors: dict[str, torch.Tensor]
    source = "computed"
    if pos is None:
        tensors = {"slopes": alibi_slopes(used, ctx.device)}
    elif direct:
        q, k = pos
        slopes = alibi_slopes(used, ctx.device)
        tensors = {
            "slopes": slopes,
            "bias": await ctx.offload(lambda: alibi_bias_at(used, slopes, q, k), nbytes),
        }
    else:
        q, k = pos
        if block is None:
            assert table is not None
            info = describe(table)
            computed, source = await ctx.table(table, info.key)
        else:
            computed = await ctx.compute(block)
        bias = computed.tensors["bias"]
        offset = int(used.query_offset)
        tensors = {
            "slopes": computed.tensors["slopes"],
            "bias": await ctx.offload(lambda: gather_block(bias, q, k, 1, offset), nbytes),
        }
    device = str(tensors["slopes"].device)
    return InferResult(
        {n: tensors[n] for n in names}, spec_parameters(describe(used), source, device)
    )


MODEL = OipModel(
    name="alibi",
    description="ALiBi slopes (reference rule) and additive biases for query x key positions",
    inputs=(QUERY_POSITIONS, KEY_POSITIONS),
    outputs=OUTPUTS,
    infer=infer,
    notes=(
        "bias defaults to the 'causal' form when positions are given",
        "with query_length/key_length the spec is a table: positions inside it are gathered from "
        "the cached table; otherwise the block min(q)..max(q) x 0..max(k) is computed, or, when "
        "the table does not fit the cache or the block is over the response limit, the entries "
        "at the asked pairs only",
        "masked entries (decoder forms) hold the dtype's minimum unless masked_value says -inf; "
        "-inf cannot travel as JSON",
    ),
)
