"""The `rope` model: cos/sin rows for arbitrary position ids, multimodal sections included.

Input `position_ids` (INT64 or INT32, any shape) -> `cos`, `sin` of shape position_ids.shape +
[width] (or the packed `cos_sin` [.., d] / `pairs` [.., d/2, 2] per the spec's packing) and, when
asked for, `inv_freq` [d/2]. The spec is a `/v1` RoPE spec; flat keys that are scaling fields
(`rope_type`, `factor`, `original_max_position_embeddings`...) or close misspellings of one go
into `rope_scaling`; any other unknown key is refused at the top level (`bogus: unknown field`).

Multimodal RoPE: with `mrope_section` (three pair counts summing to d/2) and position ids whose
leading axis is 3 (temporal, height, width), each frequency pair reads the angle of its axis:
chunked sections as Qwen2-VL, `mrope_interleaved` as Qwen3-VL, or `mrope_layout` ("chunked",
"interleaved", "ernie": ERNIE-4.5-VL's alternating height/width pairs; "row_column": NeoMME's two
axes, row and column, with two pair counts [d/4, d/4] and position ids whose leading axis is 2,
even pairs row and odd pairs column; "channel_chunks": HunYuan-VL's len(mrope_section) axes,
the full width split into chunks of 2 * mrope_section[k] channels, chunk k reading axis k, with
position ids whose leading axis is len(mrope_section), for full-width half-split specs only)
(`posenc.runtime.rows`); the outputs drop that leading axis. `/v1/resolve` states these
parameters per model (`notes.mrope.v2_parameters`). Position ids without the leading 3 are the
text-only case (transformers expands them to all three axes, which changes nothing).

Rows are gathered from the cached table of `max_positions` rows when every position falls inside
it; otherwise exactly the distinct positions are computed with the core's own functions
(`rope_inv_freq`, `half_cos_sin`, `layout`), which give the same bits as the table's rows.
"""

from __future__ import annotations

from dataclasses import dataclass
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
from posenc.api.oip.params import spec_parameters as split_parameters
from posenc.encodings import TensorInfo, parse_spec
from posenc.encodings.errors import closest
from posenc.encodings.rope import RopeSpec, half_cos_sin, layout, rope_inv_freq
from posenc.encodings.rope.spec import MAX_POSITIONS
from posenc.encodings.rope.variants import flat_scaling_keys
from posenc.runtime.rows import (
    consecutive,
    gather_rows,
    gather_sections,
    mrope_channel_axes,
    mrope_pair_axes,
    row_index,
    unique_rows,
)

POSITION_IDS = TensorDecl(
    "position_ids",
    "INT64",
    (-1,),
    "position ids, any shape; a leading axis of 3 (T, H, W) with mrope_section (2, row and "
    "column, with mrope_layout row_column; len(mrope_section) with channel_chunks)",
    accepts=INDEX_TYPES,
)
FLOATS = ("FP32", "FP16", "BF16")
OUTPUTS = (
    TensorDecl("cos", "FP32", (-1, -1), "cos rows: position_ids.shape + [width]", FLOATS),
    TensorDecl("sin", "FP32", (-1, -1), "sin rows: position_ids.shape + [width]", FLOATS),
    TensorDecl("cos_sin", "FP32", (-1, -1), "packing cos_sin: [.., d] = cat(cos, sin)", FLOATS),
    TensorDecl("pairs", "FP32", (-1, -1, 2), "packing pairs: [.., d/2, 2] (cos, sin)", FLOATS),
    TensorDecl("inv_freq", "FP32", (-1,), "inverse frequencies [d/2] (FP64 when exact)"),
)
MROPE_KEYS = ("mrope_section", "mrope_interleaved", "mrope_layout")
MROPE_LAYOUTS = ("chunked", "interleaved", "ernie", "row_column", "channel_chunks")
TOP_LEVEL = frozenset(RopeSpec.model_fields)
SCALING_KEYS = flat_scaling_keys() | {"type"}
"""Flat keys that go into `rope_scaling`: every variant's fields (and the old `type`)."""


def _top_level_unknown(key: str) -> bool:
    """Whether an unknown flat key is refused at the top level: one that is no `rope_scaling`
    key nor close to one (`errors.closest`). A misspelt `rope_thetaa` and a `bogus` close to
    nothing are named where the spec's own error names them (`rope_thetaa: unknown field; did
    you mean 'rope_theta'?`, `bogus: unknown field`, as every other model says it), not inside
    `rope_scaling`; a misspelt `factr` stays there (`rope_scaling.factr: ... 'factor'?`)."""
    return key not in SCALING_KEYS and closest(key, [*TOP_LEVEL, *SCALING_KEYS]) not in SCALING_KEYS


@dataclass(frozen=True)
class RopeRequest:
    """What the request parameters say: the spec (and its key...), the MRoPE sections and their
    layout ("chunked", "interleaved" or "ernie")."""

    info: SpecInfo
    section: list[int] | None
    layout: str

    @property
    def spec(self) -> RopeSpec:
        assert isinstance(self.info.spec, RopeSpec)
        return self.info.spec


MEMO: JsonMemo[RopeRequest] = JsonMemo()


def build_spec(parameters: dict[str, Any]) -> RopeRequest:
    """The RoPE spec and the MRoPE sections from the request parameters."""
    base, flat = split_parameters("rope", parameters)
    raw_scaling = base.pop("rope_scaling", None)
    if raw_scaling is not None and not isinstance(raw_scaling, dict):
        raise bad_request("rope_scaling must be a JSON object")
    scaling: dict[str, Any] = dict(raw_scaling or {})
    extras: dict[str, Any] = {}
    for source in (base, scaling):
        for key in MROPE_KEYS:
            if key in source:
                extras[key] = source.pop(key)
    for key, value in flat.items():
        if key in MROPE_KEYS:
            extras[key] = value
        elif key in TOP_LEVEL or _top_level_unknown(key):
            base[key] = value  # an unknown top-level field is refused (and named) there
        else:
            scaling[key] = value
    if scaling.get("type") == "mrope" or scaling.get("rope_type") == "mrope":
        # Qwen2-VL configs spell the plain RoPE with sections `{"type": "mrope", ...}`.
        scaling.pop("type", None)
        scaling["rope_type"] = "default"
    if scaling:
        base["rope_scaling"] = scaling
    spec = parse_spec({**base, "kind": "rope"})
    assert isinstance(spec, RopeSpec)
    canon = spec.canonical()
    axes = {"row_column": 2, "channel_chunks": 0}.get(str(extras.get("mrope_layout")), 3)
    section = _section(extras.get("mrope_section"), canon.resolved_rotary_dim(), axes)
    interleaved = extras.get("mrope_interleaved", False)
    if isinstance(interleaved, str) and interleaved.lower() in ("true", "false"):
        interleaved = interleaved.lower() == "true"
    if not isinstance(interleaved, bool):
        raise bad_request(f"mrope_interleaved must be a boolean, got {interleaved!r}")
    if interleaved and section is None:
        raise bad_request("mrope_interleaved needs mrope_section")
    layout = extras.get("mrope_layout", "interleaved" if interleaved else "chunked")
    if layout not in MROPE_LAYOUTS:
        raise bad_request(f"mrope_layout must be one of {list(MROPE_LAYOUTS)}, got {layout!r}")
    if "mrope_layout" in extras and (section is None or (interleaved and layout != "interleaved")):
        raise bad_request("mrope_layout needs mrope_section (and agrees with mrope_interleaved)")
    if layout == "ernie" and section is not None and (section[0] != section[1] or not section[2]):
        raise bad_request(f"mrope_layout ernie needs sections [s, s, t] with t > 0, got {section}")
    if layout == "channel_chunks" and (canon.width != "full" or canon.repeats_interleaved()):
        raise bad_request(
            "mrope_layout channel_chunks splits the full-width half-split table (cat(c, c)) by "
            f"channel: it needs width 'full' and half-split pairs, got width {canon.width!r}"
            + (" with interleaved pairs" if canon.repeats_interleaved() else "")
        )
    if layout == "row_column" and section is not None and section[0] != section[1]:
        raise bad_request(
            f"mrope_layout row_column alternates row and column pairs: [s, s], got {section}"
        )
    return RopeRequest(describe(canon), section, layout)


def _section(value: Any, rotary_dim: int, axes: int = 3) -> list[int] | None:
    """The pair count of each of `axes` position axes (three; two for row_column; 0: any
    number of axes, at least one, for channel_chunks)."""
    if value is None:
        return None
    count = {0: "one or more", 2: "two", 3: "three"}[axes]
    if isinstance(value, str):
        parts = [part.strip() for part in value.split(",")]
        if not all(p.isascii() and p.isdigit() for p in parts):
            raise bad_request(f"mrope_section must be {count} integers, got {value!r}")
        value = [int(p) for p in parts]
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise bad_request(f"mrope_section must be {count} integers, got {value!r}")
    section: list[int] = value
    if (len(section) != axes if axes else not section) or any(s < 0 for s in section):
        raise bad_request(f"mrope_section must be {count} non-negative integers, got {section}")
    if sum(section) != rotary_dim // 2:
        raise bad_request(
            f"mrope_section {section} must sum to rotary_dim/2 = {rotary_dim // 2} "
            "(frequency pairs)"
        )
    return section


def _rows(spec: RopeSpec, positions: torch.Tensor, device: torch.device) -> dict[str, torch.Tensor]:
    """Laid-out rows (U, ...) for distinct `positions` (U,) plus `inv_freq`: the table's code."""
    inv, scaling, _ = rope_inv_freq(spec, device)
    cos, sin = half_cos_sin(spec, inv, scaling, positions.to(device))
    rows = layout(spec, cos, sin)
    rows["inv_freq"] = inv
    return rows


def _column_axes(spec: RopeSpec, section: list[int], mrope: str) -> dict[str, torch.Tensor]:
    """Position axis of every output column (`mrope`: the sections' layout), laid out by the
    spec's own `layout` (the axis of a pair travels with it through widening, interleaving and
    packing; small axis numbers are exact in any float dtype). channel_chunks maps the channels
    of the full width itself: laid out as a half-width table of that many columns (packing
    only)."""
    if mrope == "channel_chunks":
        channels = mrope_channel_axes(section).to(torch.float32)[None, :]
        flat = spec.model_copy(update={"width": "half"})
        return {name: t[0].to(torch.int64) for name, t in layout(flat, channels, channels).items()}
    axes = mrope_pair_axes(section, mrope).to(torch.float32)[None, :]
    return {name: t[0].to(torch.int64) for name, t in layout(spec, axes, axes).items()}


async def infer(ctx: OipContext, request: InferRequest) -> InferResult:
    check_unknown_inputs(request, MODEL)
    parsed = MEMO.get(request.parameters, lambda: build_spec(request.parameters))
    spec, section, mrope_layout = parsed.spec, parsed.section, parsed.layout
    positions = get_input(request, POSITION_IDS)
    assert positions is not None
    positions = positions.to(torch.int64)
    bounds = positions_in_range(positions, "position_ids", MAX_POSITIONS)
    mrope = section is not None and positions.dim() >= 1 and positions.shape[0] == len(section)
    lead = tuple(positions.shape[1:] if mrope else positions.shape)

    infos = parsed.info.outputs
    why = f"the spec's packing is {spec.packing!r}, width {spec.width!r}"
    available = {d.name: None if d.name in infos else why for d in OUTPUTS}
    default = [n for n in infos if n != "inv_freq"]
    names = wanted_outputs(request, MODEL, available, default)
    planned = {
        n: infos[n] if n == "inv_freq" else TensorInfo(lead + infos[n].shape[1:], infos[n].dtype)
        for n in names
    }
    nbytes = admit(ctx, request, planned)

    index = row_index(positions, 0, spec.max_positions, bounds)
    if index is not None and ctx.fits_cache(parsed.info.nbytes):
        table, source = await ctx.table(spec, parsed.info.key)
        src = table.tensors
        picked = index
    else:

        def computed() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            # torch.unique too runs off the event loop: 65,536 positions took it 0.2-0.6 s
            # on the loaded 2-core test machine, holding every other request
            uniq, inverse = unique_rows(positions)
            return inverse, _rows(spec, uniq, ctx.device)

        picked, src = await ctx.rows(computed, nbytes)
        source = "computed"
    device = str(next(iter(src.values())).device)

    def gather() -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        columns = _column_axes(spec, section, mrope_layout) if mrope and section else {}
        run = None if mrope else consecutive(picked.reshape(-1))
        for n in names:
            if n == "inv_freq":
                out[n] = src[n]
            elif mrope:
                out[n] = gather_sections(src[n], picked, columns[n])
            else:
                out[n] = gather_rows(src[n], picked, run)
        return out

    tensors = await ctx.offload(gather, nbytes)
    params = spec_parameters(parsed.info, source, device)
    if section is not None:
        params["posenc_mrope"] = f"{mrope_layout} {section}"
    rows_of = None
    if source == "hit" and not mrope and "inv_freq" not in names:
        rows_of = {n: src[n] for n in names}
    return InferResult(tensors, params, rows_of)


MODEL = OipModel(
    name="rope",
    description="RoPE cos/sin rows for position ids (every transformers scaling variant, MRoPE)",
    inputs=(POSITION_IDS,),
    outputs=OUTPUTS,
    infer=infer,
    parameters={
        "mrope_section": "three pair counts (T, H, W) summing to rotary_dim/2: Qwen2-VL MRoPE",
        "mrope_interleaved": "true: Qwen3-VL interleaved sections [THWTHW..TT]",
        "mrope_layout": "chunked (Qwen2-VL), interleaved (Qwen3-VL), ernie (ERNIE-4.5-VL: "
        "height/width pairs alternating, then time), row_column (NeoMME: two axes, "
        "mrope_section [s, s], position ids (2, ...), even pairs row, odd pairs column) or "
        "channel_chunks (HunYuan-VL: len(mrope_section) axes, chunks of 2 * mrope_section[k] "
        "channels of the full-width half-split table read axis k)",
        "rope_scaling keys": "flat rope_type, factor, ... go into rope_scaling",
    },
    notes=(
        "cos/sin (or cos_sin / pairs, per packing) are sent by default; inv_freq when asked",
        "rows come from the cached table of max_positions rows when every position is inside "
        "it, else exactly the distinct positions are computed (not cached)",
        "position ids are in [0, 2^24)",
    ),
)
