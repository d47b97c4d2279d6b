"""The `sinusoidal_2d` model: 2-D sine/cosine embeddings for an image grid.

Inputs `grid` [2] = (height, width) and, for the DETR style, `valid` [2] = (valid_height,
valid_width) or [B, 2] for a batch of padded images (INT64/INT32; both optional when the spec has
the sizes) -> `embedding`: detr (2F, H, W) or (B, 2F, H, W); mae (H*W [+1], D); timm (H*W, D).
The grid is the whole table, so it comes from the cache (one computation per grid and spec).
"""

from __future__ import annotations

from typing import Any

import torch

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
from posenc.encodings import Table, TensorInfo, parse_spec
from posenc.encodings.sinusoidal_2d import Sinusoidal2DSpec

GRID = TensorDecl(
    "grid", "INT64", (2,), "(height, width) of the feature grid", INDEX_TYPES, optional=True
)
VALID = TensorDecl(
    "valid",
    "INT64",
    (-1,),
    "detr: (valid_height, valid_width) [2], or [B, 2] for a batch",
    INDEX_TYPES,
    optional=True,
)
OUTPUTS = (
    TensorDecl(
        "embedding",
        "FP32",
        (-1, -1, -1),
        "per style, see the model notes",
        ("FP32", "FP16", "BF16"),
    ),
)
SIZE_FIELDS = {"detr": ("height", "width"), "mae": ("grid_height", "grid_width"),
               "timm": ("grid_height", "grid_width")}  # fmt: skip


def _pairs(t: torch.Tensor | None, name: str) -> list[tuple[int, int]] | None:
    if t is None:
        return None
    if t.shape[-1:] != (2,) or t.dim() > 2:
        raise bad_request(f"input {name!r} must have shape [2] or [B, 2], got {list(t.shape)}")
    rows = t.reshape(-1, 2).tolist()
    return [(int(a), int(b)) for a, b in rows]


def _spec(spec: dict[str, Any]) -> Sinusoidal2DSpec:
    parsed = parse_spec(spec).canonical()
    assert isinstance(parsed, Sinusoidal2DSpec)
    return parsed


async def infer(ctx: OipContext, request: InferRequest) -> InferResult:
    check_unknown_inputs(request, MODEL)
    spec = merged_spec("sinusoidal_2d", request.parameters)
    grid = _pairs(get_input(request, GRID, ranks=(1,)), "grid")
    valid_t = get_input(request, VALID, ranks=(1, 2))
    valid = _pairs(valid_t, "valid")
    style = spec.get("style")
    if grid is not None:
        # a JSON list or object is no style (and unhashable: never a dict lookup before the check)
        sizes = SIZE_FIELDS.get(style) if isinstance(style, str) else None
        if sizes is None:
            raise bad_request(f"style must be one of {sorted(SIZE_FIELDS)}, got {style!r}")
        spec.update(dict(zip(sizes, grid[0], strict=True)))
    specs: list[Sinusoidal2DSpec]
    if valid is not None:
        if style != "detr":
            raise bad_request("input 'valid' applies to style 'detr' only")
        specs = [_spec({**spec, "valid_height": h, "valid_width": w}) for h, w in valid]
    else:
        specs = [_spec(spec)]
    batched = valid_t is not None and valid_t.dim() == 2
    names = wanted_outputs(request, MODEL, {"embedding": None}, ["embedding"])
    info = specs[0].outputs()["embedding"]
    shape = (len(specs), *info.shape) if batched else info.shape
    nbytes = admit(ctx, request, {"embedding": TensorInfo(shape, info.dtype)})

    tables: list[Table] = []
    sources: list[str] = []
    infos = [describe(s) for s in specs]
    for s, i in zip(specs, infos, strict=True):
        if ctx.fits_cache(i.nbytes):
            table, source = await ctx.table(s, i.key)
        else:
            table, source = await ctx.compute(s), "computed"
        tables.append(table)
        sources.append(source)
    parts = [t.tensors["embedding"] for t in tables]
    embedding = await ctx.offload(lambda: torch.stack(parts), nbytes) if batched else parts[0]
    source = sources[0] if len(set(sources)) == 1 else ",".join(sources)
    params = spec_parameters(infos[0], source, str(embedding.device))
    return InferResult({n: {"embedding": embedding}[n] for n in names}, params)


MODEL = OipModel(
    name="sinusoidal_2d",
    description="2-D sine/cosine embeddings for image grids (DETR, MAE, timm)",
    inputs=(GRID, VALID),
    outputs=OUTPUTS,
    infer=infer,
    notes=(
        "embedding: detr (2F, H, W) or (B, 2F, H, W) with valid [B, 2]; "
        "mae (H*W [+1 cls], D); timm (H*W, D)",
        "grid overrides the spec's height/width (detr) or grid_height/grid_width (mae, timm)",
    ),
)
