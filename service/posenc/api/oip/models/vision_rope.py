"""The `vision_rope` model: a vision tower's 2-D rotary cos/sin for one image grid.

Input `grid` (INT64/INT32, optional when the spec has the sizes): [2] = (height, width) in
patches, or [3] = (frames, height, width), one row of the tower's `grid_thw` (frames: style
qwen2_vl only) -> `cos`, `sin` (N, w) in the tower's row order and layout
(`posenc.encodings.vision_rope`). The grid is the whole table, so it comes from the cache (one
computation per grid and spec).
"""

from __future__ import annotations

from posenc.api.oip.codec import InferRequest, bad_request
from posenc.api.oip.context import OipContext
from posenc.api.oip.models.base import (
    INDEX_TYPES,
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
from posenc.encodings import parse_spec

GRID = TensorDecl(
    "grid",
    "INT64",
    (-1,),
    "(height, width) [2] or (frames, height, width) [3] in patches",
    INDEX_TYPES,
    optional=True,
)
OUTPUTS = tuple(
    TensorDecl(name, "FP32", (-1, -1), f"{name} (N, w), rows in the tower's order",
               ("FP32", "FP16", "BF16"))
    for name in ("cos", "sin")
)  # fmt: skip


async def infer(ctx: OipContext, request: InferRequest) -> InferResult:
    check_unknown_inputs(request, MODEL)
    spec = merged_spec("vision_rope", request.parameters)
    grid = get_input(request, GRID, ranks=(1,))
    if grid is not None:
        if grid.shape[0] not in (2, 3):
            raise bad_request(f"input 'grid' must have shape [2] or [3], got {list(grid.shape)}")
        values = [int(v) for v in grid.tolist()]
        if len(values) == 3:
            spec["frames"] = values[0]
        spec["grid_height"], spec["grid_width"] = values[-2:]
    parsed = parse_spec(spec).canonical()
    names = wanted_outputs(request, MODEL, {"cos": None, "sin": None}, ["cos", "sin"])
    outputs = parsed.outputs()
    admit(ctx, request, {n: outputs[n] for n in names})
    info = describe(parsed)
    if ctx.fits_cache(info.nbytes):
        table, source = await ctx.table(parsed, info.key)
    else:
        table, source = await ctx.compute(parsed), "computed"
    params = spec_parameters(info, source, str(table.tensors["cos"].device))
    return InferResult({n: table.tensors[n] for n in names}, params)


MODEL = OipModel(
    name="vision_rope",
    description="2-D rotary cos/sin of vision towers (Qwen2-VL family, Pixtral, Llama 4, DINOv3)",
    inputs=(GRID,),
    outputs=OUTPUTS,
    infer=infer,
    notes=(
        "cos, sin: (N, w) in the tower's patch order (qwen2_vl: merge blocks, window order with "
        "window_size; llama4: class token last); w = head_dim (full) or head_dim / 2 (half)",
        "grid overrides the spec's grid_height/grid_width (and frames with [3])",
    ),
)
