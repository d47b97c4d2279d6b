"""The `t5_bias` model: T5 relative-position buckets and their learned bias for query x key
positions.

Inputs `query_positions` [Q], `key_positions` [K] (INT64/INT32) and optionally
`relative_attention_bias` [num_buckets, H] (the embedding weight, FP32/FP16/BF16/FP64; or in the
spec) -> `buckets` [Q, K] INT64 and, with weights, `bias` [H, Q, K] in the spec's `dtype`.
Buckets depend on `key - query` only, so any positions are served: gathered from the cached table
when the spec's lengths cover them (and it fits the cache), otherwise from the bounding block
computed for them, or, when that block is over the response limit (scattered positions, a table of
10M x 10M keys sampled by the explorer), computed at the asked pairs only (`t5_buckets_at`: the
table's ops entry by entry, equal to the table there).
"""

from __future__ import annotations

from typing import Any

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
    get_input,
    spec_parameters,
    wanted_outputs,
)
from posenc.api.oip.params import merged_spec
from posenc.encodings import TensorInfo, parse_spec
from posenc.encodings.base import DTYPES
from posenc.encodings.t5_bias import T5BiasSpec, t5_buckets_at
from posenc.runtime.rows import gather_block, lookup_bias

WEIGHTS = TensorDecl(
    "relative_attention_bias",
    "FP32",
    (-1, -1),
    "learned bias weight [num_buckets, H] (T5Attention.relative_attention_bias.weight)",
    ("FP32", "FP16", "BF16", "FP64"),
    optional=True,
)
OUTPUTS = (
    TensorDecl("buckets", "INT64", (-1, -1), "relative position buckets [Q, K]"),
    TensorDecl("bias", "FP32", (-1, -1, -1), "learned bias [H, Q, K]", ("FP32", "FP16", "BF16")),
)


def _t5(spec: dict[str, Any]) -> T5BiasSpec:
    parsed = parse_spec(spec).canonical()
    assert isinstance(parsed, T5BiasSpec)
    return parsed


async def infer(ctx: OipContext, request: InferRequest) -> InferResult:
    check_unknown_inputs(request, MODEL)
    spec = merged_spec("t5_bias", request.parameters)
    weights = get_input(request, WEIGHTS, ranks=(2,))
    if weights is not None:
        if spec.get("relative_attention_bias") is not None:
            raise bad_request(
                "relative_attention_bias is given both as an input and in the spec: give one"
            )
        spec["relative_attention_bias"] = weights.to(torch.float32).tolist()
    pos = pair_positions(request)
    if pos is None:
        raise bad_request("inputs 'query_positions' and 'key_positions' are required")
    q, k = pos
    has_weights = spec.get("relative_attention_bias") is not None
    available = {
        "buckets": None,
        "bias": None if has_weights else "it needs relative_attention_bias (input or spec)",
    }
    names = wanted_outputs(
        request, MODEL, available, ["buckets", "bias"] if has_weights else ["buckets"]
    )

    table = _t5(spec) if has_table(spec) else None
    use_table = table is not None and inside(table, q, k) and ctx.fits_cache(table.output_bytes())
    used = table if use_table and table is not None else _t5(block_dict(spec, q, k))
    plain_block = used.model_copy(update={"relative_attention_bias": None})
    direct = not use_table and plain_block.output_bytes() > ctx.max_response_bytes
    planned = {"buckets": TensorInfo((q.numel(), k.numel()), "int64")}
    if used.num_heads is not None:
        planned["bias"] = TensorInfo((used.num_heads, q.numel(), k.numel()), used.dtype)
    nbytes = admit(ctx, request, {n: planned[n] for n in names})

    info = describe(used)
    offset = int(used.query_offset)
    if use_table:
        computed, source = await ctx.table(used, info.key)
        src = computed.tensors

        def gather() -> dict[str, torch.Tensor]:
            out = {"buckets": gather_block(src["buckets"], q, k, 0, offset)}
            if "bias" in names:
                out["bias"] = gather_block(src["bias"], q, k, 1, offset)
            return out

    elif direct:
        source = "computed"

        def gather() -> dict[str, torch.Tensor]:
            out = {"buckets": t5_buckets_at(used, q, k).to(ctx.device)}
            if "bias" in names:
                table_w = torch.tensor(used.relative_attention_bias, dtype=torch.float32)
                out["bias"] = lookup_bias(table_w, out["buckets"], DTYPES[used.dtype])
            return out

    else:
        # Buckets of the block; the bias is looked up from the gathered buckets only.
        plain = used.model_copy(update={"relative_attention_bias": None, "dtype": "float32"})
        computed = await ctx.compute(plain)
        source = "computed"
        src = computed.tensors

        def gather() -> dict[str, torch.Tensor]:
            out = {"buckets": gather_block(src["buckets"], q, k, 0, offset)}
            if "bias" in names:
                table_w = torch.tensor(used.relative_attention_bias, dtype=torch.float32)
                out["bias"] = lookup_bias(table_w, out["buckets"], DTYPES[used.dtype])
            return out

    tensors = await ctx.offload(gather, nbytes)
    device = str(tensors["buckets"].device)
    return InferResult({n: tensors[n] for n in names}, spec_parameters(info, source, device))


MODEL = OipModel(
    name="t5_bias",
    description="T5 relative position buckets and their learned bias for query x key positions",
    inputs=(QUERY_POSITIONS, KEY_POSITIONS, WEIGHTS),
    outputs=OUTPUTS,
    infer=infer,
    notes=(
        "query_positions and key_positions are required",
        "bias needs relative_attention_bias, as an input or in the spec",
        "with query_length/key_length the spec is a table: positions inside it are gathered from "
        "the cached table; otherwise the block min(q)..max(q) x 0..max(k) is computed, or, when "
        "it is over the response limit, the buckets at the asked pairs only",
    ),
)
