"""The whole-table model of a family without a position-input model (`learned`, `xpos`, ...).

No inputs: the spec (request parameters, `/v1` schema) is the whole request, and every tensor of
its table is an output (the names `/v1` uses), from the cache like `/v1/tables`. A `learned`
spec names an uploaded table by `table_key` (`POST /v1/uploads`) or carries it inline, and a
`relative_index` spec its bias table by `relative_position_bias_table_key` (or inline): bound from
the table store as `/v1` binds them (`OipContext.bind`). Datatypes and shapes follow the spec, so
the metadata declares none; `config` carries the spec schema.
"""

from __future__ import annotations

import torch

from posenc.api.oip.codec import InferRequest, bad_request
from posenc.api.oip.context import OipContext
from posenc.api.oip.models.base import (
    InferResult,
    OipModel,
    admit,
    check_unknown_inputs,
    describe,
    spec_parameters,
)
from posenc.api.oip.params import merged_spec
from posenc.encodings import FAMILIES, parse_spec


def table_model(kind: str) -> OipModel:
    """The whole-table model of family `kind`."""

    async def infer(ctx: OipContext, request: InferRequest) -> InferResult:
        check_unknown_inputs(request, model)
        spec = parse_spec(merged_spec(kind, request.parameters)).canonical()
        infos = spec.outputs()
        names = list(infos) if request.outputs is None else [o.name for o in request.outputs]
        unknown = [n for n in names if n not in infos]
        if unknown:
            raise bad_request(
                f"this {kind} table has no output {unknown[0]!r}; it has {list(infos)}"
            )
        admit(ctx, request, {n: infos[n] for n in names})
        info = describe(spec)
        spec = ctx.bind(info.spec, info.key)
        if ctx.fits_cache(info.nbytes):
            table, source = await ctx.table(spec, info.key)
        else:
            table, source = await ctx.compute(spec), "computed"
        tensors: dict[str, torch.Tensor] = {n: table.tensors[n] for n in names}
        device = str(next(iter(table.tensors.values())).device)
        return InferResult(tensors, spec_parameters(info, source, device))

    model = OipModel(
        name=kind,
        description=FAMILIES[kind].summary + " (the whole table)",
        inputs=(),
        outputs=(),
        infer=infer,
        notes=(
            "no inputs: the spec in the parameters is the request; outputs are the table's "
            "tensors as /v1 names them, all of them unless the request names some",
        ),
    )
    return model
