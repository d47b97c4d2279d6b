"""Vision transformers: the patch grid, learned absolute tables (ViT, optional in Swin and BEiT),
relative position indices (Swin windows, BEiT / data2vec-vision with the class token) and ViTMAE's
fixed 2-D sin-cos tables.

Sources: transformers `modeling_vit.py`, `modeling_swin.py`, `modeling_beit.py`,
`modeling_data2vec_vision.py`, `modeling_vit_mae.py`. The patch grid is `image_size //
patch_size` per axis (ints or [h, w] pairs). A learned absolute table is checkpoint weights that no
config carries: its spec names `table_shape` and needs the uploaded table's `table_key` (or an
inline `table`) as an override.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc.encodings.config_values import check_number, fail
from posenc.encodings.errors import FieldProblem
from posenc.encodings.hf_config.view import ConfigView, Entry

BEIT_MODELS = frozenset({"beit", "data2vec-vision"})

DETR_MODELS: dict[str, float] = {
    "detr": 0.0,
    "conditional_detr": 0.0,
    "deformable_detr": -0.5,
    "table-transformer": 0.0,
}
"""DETR-family model_type -> the normalisation offset of its sine embedding (Deformable DETR
subtracts 0.5 from the cumulative sums)."""


def _pair(view: ConfigView, name: str) -> tuple[int, int]:
    """An int-or-[h, w] config value (`image_size`, `patch_size`) as (h, w), as transformers'
    `PatchEmbeddings` read them (`value if isinstance(value, Iterable) else (value, value)`)."""
    value = view.get(name)
    if value is None:
        fail(view.key(name), "required key missing", None)
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            fail(view.key(name), "must be an int or [height, width]", value)
        h, w = (check_number(view.key(name), v) for v in value)
    else:
        h = w = check_number(view.key(name), value)
    if int(h) != h or int(w) != w or h < 1 or w < 1:
        fail(view.key(name), "must hold positive integers", value)
    return int(h), int(w)


def _patch_grid(view: ConfigView) -> tuple[int, int]:
    """(image_size // patch_size) per axis: the patch grid every vision table is laid out on."""
    ih, iw = _pair(view, "image_size")
    ph, pw = _pair(view, "patch_size")
    gh, gw = ih // ph, iw // pw
    if gh < 1 or gw < 1:
        fail(view.key("patch_size"), "larger than image_size: no patches", [ph, pw])
    return gh, gw


def _learned_entry(
    view: ConfigView,
    grid: tuple[int, int],
    dim: int,
    prefix: int,
    weights: str,
    notes: dict[str, Any],
) -> Entry:
    """A learned absolute table (prefix + gh * gw, dim) of the checkpoint, resampled as the model's
    `interpolate_pos_encoding` does; `new_grid` defaults to the config's grid (the table as is)."""
    gh, gw = grid
    data: dict[str, Any] = {
        "kind": "learned",
        "table_shape": [prefix + gh * gw, dim],
        "grid": [gh, gw],
        "new_grid": [gh, gw],
    }
    problem = None
    if prefix:
        # ViTEmbeddings / BeitEmbeddings.interpolate_pos_encoding: class token kept, the square
        # grid (torch_int(sqrt(num_positions))) bicubic-resampled to size=(h, w) without antialias.
        if gh != gw:
            problem = FieldProblem(
                view.key("image_size"),
                f"a {gh}x{gw} patch grid: transformers' interpolate_pos_encoding reshapes the "
                "learned table to a square grid",
                view.get("image_size"),
            )
        data["method"] = "hf_vit"
    else:
        # SwinEmbeddings.interpolate_pos_encoding: no class token; the same bicubic call, which is
        # timm's resample without antialias.
        data.update(
            method="timm",
            num_prefix_tokens=0,
            interpolation="bicubic",
            antialias=False,
            align_corners=False,
        )
    notes = {
        "weights": f"{weights} of the checkpoint, shape (1, {prefix + gh * gw}, {dim}): upload "
        "it and pass table_key (or pass table inline)",
        "resample": "new_grid [height // patch_size, width // patch_size] gives the table that "
        "interpolate_pos_encoding=True adds for other image sizes",
        **notes,
    }
    return Entry("learned", None, data, notes, weights=weights, problem=problem)


def vit(view: ConfigView) -> list[Entry]:
    """ViT (`modeling_vit.ViTEmbeddings`): a learned (1 + gh * gw, hidden_size) table."""
    grid = _patch_grid(view)
    dim = int(view.number("hidden_size"))
    notes = {"transformers": "ViTEmbeddings.position_embeddings, class token row first"}
    return [_learned_entry(view, grid, dim, 1, "embeddings.position_embeddings", notes)]


def swin(view: ConfigView) -> list[Entry]:
    """Swin (`modeling_swin.SwinRelativePositionBias`): every window attention gathers its
    (2W - 1)^2-row bias table through the same (W^2, W^2) index; W = `window_size`."""
    window = view.number("window_size")
    if int(window) != window or window < 1:
        fail(view.key("window_size"), "must be a positive integer", window)
    heads = view.get("num_heads")
    notes: dict[str, Any] = {
        "bias": "each block has its own ((2W-1)^2, num_heads) relative_position_bias_table "
        "(checkpoint weights); pass one as relative_position_bias_table for that block's bias, "
        "or upload it and pass relative_position_bias_table_key and _shape",
        "transformers": "SwinRelativePositionBias.relative_position_index: this (N, N) index "
        "flattened; the shifted-window mask (SW-MSA) is separate and not a position table",
        "window_clamp": "SwinLayer uses min(resolution) as the window (and no shift) for stages "
        "whose feature map is not larger than window_size",
    }
    if isinstance(heads, list):
        notes["num_heads_per_stage"] = list(heads)
    entries = [
        Entry(
            "relative_index",
            None,
            {"kind": "relative_index", "scheme": "swin", "window_size": [int(window)] * 2},
            notes,
        )
    ]
    if view.get("use_absolute_embeddings"):
        grid = _patch_grid(view)
        dim = int(view.number("embed_dim"))
        extra = {"transformers": "SwinEmbeddings.position_embeddings: no class token"}
        entries.append(_learned_entry(view, grid, dim, 0, "embeddings.position_embeddings", extra))
    return entries


SAM2_NECKS: dict[str, str] = {
    **dict.fromkeys(("sam2", "sam2_vision_model"), "Sam2"),
    **dict.fromkeys(("edgetam", "edgetam_vision_model"), "EdgeTam"),
}
"""Model types whose vision neck is SAM 2's FPN -> the class prefix of its modules."""


def sam2_neck(view: ConfigView) -> list[Entry]:
    """SAM 2 and EdgeTAM (`<Model>VisionNeck`): a `<Model>SinePositionEmbedding(fpn_hidden_size //
    2, normalize=True)` table per FPN level, without a mask; the model keeps the last
    `num_feature_levels` levels, high resolution first, at `backbone_feature_sizes` (the
    backbone's feature maps of an `image_size` input): one DETR-style table per level,
    `sinusoidal_2d:level<i>`. The prompt encoder's random Fourier features and a Hiera
    backbone's learned positions are listed unserved (`unmapped.LEFT_OUT`)."""
    vision = view
    if isinstance(view.data.get("vision_config"), Mapping):
        vision = ConfigView(
            view.data["vision_config"], view.key("vision_config."), view.model_type, None
        )
    prefix = SAM2_NECKS[view.model_type]
    features = int(vision.number("fpn_hidden_size")) // 2
    sizes = vision.get("backbone_feature_sizes")
    levels = int(vision.number("num_feature_levels"))
    if not isinstance(sizes, list) or len(sizes) < levels:
        fail(
            vision.key("backbone_feature_sizes"),
            f"required: the [height, width] of each of the num_feature_levels={levels} levels",
            sizes,
        )
    entries = []
    for i, size in enumerate(sizes[:levels]):
        height, width = (int(v) for v in size)
        data = {
            "kind": "sinusoidal_2d",
            "style": "detr",
            "num_pos_feats": features,
            "normalize": True,
            "height": height,
            "width": width,
        }
        notes = {
            "transformers": f"{prefix}VisionNeck.position_encoding({prefix}SinePositionEmbedding("
            f"fpn_hidden_size // 2, normalize=True)) of FPN level {i} (fpn_position_encoding[{i}] "
            "after the model keeps the last num_feature_levels, high resolution first), "
            "computed in the features' dtype",
            "size": f"backbone_feature_sizes[{i}] = [{height}, {width}]: an image_size input",
        }
        entries.append(Entry("sinusoidal_2d", f"level{i}", data, notes))
    return entries


SAM3_FPN_SCALES: dict[float, str] = {
    4.0: "two stride-2 ConvTranspose2d",
    2.0: "one stride-2 ConvTranspose2d",
    1.0: "no resampling",
    0.5: "MaxPool2d(kernel_size=2, stride=2): floor(side / 2)",
}
"""The scale factors `Sam3FPNLayer` builds (transformers 5.24 modeling_sam3.py; any other
raises NotImplementedError) -> how the level's feature map is resampled."""


def _sam3_side(side: int, scale: float) -> int:
    """The side of a `Sam3FPNLayer` output for a `side` x `side` ViT grid (`SAM3_FPN_SCALES`)."""
    return side // 2 if scale == 0.5 else side * int(scale)


def sam3_neck(view: ConfigView) -> list[Entry]:
    """SAM 3's vision neck (`Sam3VisionNeck`, transformers 5.24 modeling_sam3.py): one
    `Sam3SinePositionEmbedding(fpn_hidden_size // 2, normalize=True)` table, without a mask, per
    `scale_factors` entry, over that FPN level's feature map. `Sam3VisionModel` reshapes the ViT
    output to its patch grid (input side // `backbone_config.patch_size`) and each `Sam3FPNLayer`
    resamples it (x4, x2, x1, max-pooled /2): at an `backbone_config.image_size` input (1008 / 14
    = 72 at the defaults) the levels are 288, 144, 72 and 36 wide, one DETR-style table each,
    `sinusoidal_2d:level<i>`. The config's `backbone_feature_sizes` (three levels) is not what the
    neck reads. The ViT backbone's positions are listed unserved (`unmapped.LEFT_OUT`)."""
    backbone = view.get("backbone_config")
    if not isinstance(backbone, Mapping):
        fail(
            view.key("backbone_config"),
            "required: the ViT backbone's image_size and patch_size size SAM 3's FPN levels",
            backbone,
        )
    inner = ConfigView(backbone, view.key("backbone_config."), view.model_type, None)
    image_size = int(inner.number("image_size"))
    patch_size = int(inner.number("patch_size"))
    scales = view.get("scale_factors")
    if not isinstance(scales, list) or not scales:
        fail(view.key("scale_factors"), "required: the FPN levels' scale factors", scales)
    features = int(view.number("fpn_hidden_size")) // 2
    side = image_size // patch_size
    entries = []
    for i, scale in enumerate(scales):
        if scale not in SAM3_FPN_SCALES:
            fail(
                view.key(f"scale_factors[{i}]"),
                f"Sam3FPNLayer builds only scale factors {sorted(SAM3_FPN_SCALES)}",
                scale,
            )
        level = _sam3_side(side, float(scale))
        data = {
            "kind": "sinusoidal_2d",
            "style": "detr",
            "num_pos_feats": features,
            "normalize": True,
            "height": level,
            "width": level,
        }
        notes = {
            "transformers": "Sam3VisionNeck.position_encoding(Sam3SinePositionEmbedding("
            f"fpn_hidden_size // 2, normalize=True)) of FPN level {i} "
            f"(fpn_position_encoding[{i}]), computed in the features' dtype",
            "size": f"backbone_config.image_size // patch_size = {side}, scale_factors[{i}] = "
            f"{scale} ({SAM3_FPN_SCALES[float(scale)]}): {level} x {level}; another input size "
            "gives other levels",
        }
        entries.append(Entry("sinusoidal_2d", f"level{i}", data, notes))
    return entries


def levit(view: ConfigView) -> list[Entry]:
    """LeViT (`modeling_levit.LevitEncoder`): stage i attends over an R_i x R_i grid (R_0 =
    image_size // patch_size) through `LevitAttention.attention_bias_idxs` (stride 1), and a
    `down_ops[i]` "Subsample" block through `LevitAttentionSubsample.attention_bias_idxs` (stride
    down_ops[i][5], queries on the strided grid, R_{i+1} = (R_i - 1) // stride + 1): one
    `levit` index per distinct (R, stride), named `stage<i>` and `subsample<i>`."""
    side = int(view.number("image_size")) // int(view.number("patch_size"))
    depths = view.get("depths")
    down_ops = view.get("down_ops")
    if not isinstance(depths, list) or not isinstance(down_ops, list):
        fail(view.key("depths"), "required: LeViT's depths and down_ops lists", depths)
    entries = []
    for i, depth in enumerate(depths):
        if depth:
            entries.append(
                _levit_entry(
                    f"stage{i}", side, 1, f"the {depth} LevitAttention layers of stage {i}"
                )
            )
        op = down_ops[i] if i < len(down_ops) else None
        if isinstance(op, list) and op and op[0] == "Subsample":
            stride = int(op[5])
            entries.append(
                _levit_entry(
                    f"subsample{i}",
                    side,
                    stride,
                    f"LevitAttentionSubsample after stage {i} (down_ops[{i}])",
                )
            )
            side = (side - 1) // stride + 1
    return entries


def _levit_entry(role: str, side: int, stride: int, where: str) -> Entry:
    data: dict[str, Any] = {
        "kind": "relative_index",
        "scheme": "levit",
        "window_size": [side, side],
    }
    if stride != 1:
        data["stride"] = stride
    notes = {
        "transformers": f"{where}: attention_bias_idxs over a {side} x {side} grid"
        + (f", queries every {stride}-th token" if stride != 1 else ""),
        "bias": "each layer has its own attention_biases (num_heads, num_relative_distance): "
        "pass its transpose as relative_position_bias_table for that layer's (H, Q, K) bias",
    }
    return Entry("relative_index", role, data, notes)


def swinv2(view: ConfigView) -> list[Entry]:
    """Swin V2 and Swin2SR (`Swinv2SelfAttention` / `Swin2SRSelfAttention.
    create_coords_table_and_index`): per stage, the window min(resolution, window_size) (the
    layers' `_compute_window_shift`) and the stage's `pretrained_window_sizes` entry (Swin2SR:
    one resolution, pretrained 0): one `swinv2` index with its log-spaced `coords` per distinct
    (window, pretrained), named `stages<i>+<j>...` when the stages differ. The bias is each
    layer's continuous_position_bias_mlp (checkpoint weights) applied to `coords`, gathered by
    the index, then 16 * sigmoid: the notes say so."""
    grid = _patch_grid(view)
    window = int(view.number("window_size"))
    if view.model_type == "swin2sr":
        stages = [(min(grid[0], window), 0)]
    else:
        depths = view.get("depths")
        if not isinstance(depths, list):
            fail(view.key("depths"), "required: a list of stage depths", depths)
        pretrained = view.get("pretrained_window_sizes") or [0] * len(depths)
        stages = [
            (min(grid[0] // 2**i, window), int(pretrained[i]))
            for i in range(len(depths))
            if depths[i]
        ]
    distinct: dict[tuple[int, int], list[str]] = {}
    for i, key in enumerate(stages):
        distinct.setdefault(key, []).append(str(i))
    module = "Swin2SRSelfAttention" if view.model_type == "swin2sr" else "Swinv2SelfAttention"
    entries = []
    for (win, pre), which in distinct.items():
        data: dict[str, Any] = {
            "kind": "relative_index",
            "scheme": "swinv2",
            "window_size": [win, win],
        }
        if pre:
            data["pretrained_window_size"] = [pre, pre]
        notes = {
            "transformers": f"{module}.relative_position_index and relative_coords_table (as "
            "`coords`, (num_relative_distance, 2)) of stage(s) " + ", ".join(which),
            "bias": "each layer's continuous_position_bias_mlp (checkpoint weights) applied to "
            "coords gives its (num_relative_distance, num_heads) table: pass that as "
            "relative_position_bias_table for the gathered bias; the model adds 16 * "
            "sigmoid(bias) to its cosine-attention scores",
        }
        role = None if len(distinct) == 1 else "stages" + "+".join(which)
        entries.append(Entry("relative_index", role, data, notes))
    if view.get("use_absolute_embeddings"):
        dim = int(view.number("embed_dim"))
        extra = {"transformers": f"{view.model_type} embeddings.position_embeddings"}
        entries.append(_learned_entry(view, grid, dim, 0, "embeddings.position_embeddings", extra))
    return entries


def swin_copy(view: ConfigView) -> list[Entry]:
    """Donut's and MaskFormer's Swin encoders (`DonutSwinSelfAttention`,
    `MaskFormerSwinSelfAttention`): Swin's window index under their own model_type."""
    entries = swin(view)
    entries[0].notes["transformers"] = (
        f"{view.model_type}: <Model>SelfAttention.relative_position_index, Swin's (N, N) window "
        "index; the shifted-window mask (SW-MSA) is separate and not a position table"
    )
    return entries


def beit(view: ConfigView) -> list[Entry]:
    """BEiT / data2vec-vision (`modeling_beit.BeitRelativePositionBias`,
    `modeling_data2vec_vision.Data2VecVisionRelativePositionBias`): the class-token index over the
    patch grid, per layer and/or shared; optionally a learned absolute table (`BeitEmbeddings`)."""
    grid = _patch_grid(view)
    per_layer = bool(view.get("use_relative_position_bias"))
    shared = bool(view.get("use_shared_relative_position_bias"))
    absolute = bool(view.get("use_absolute_position_embeddings"))
    if not (per_layer or shared or absolute):
        fail(
            view.key("use_relative_position_bias"),
            "no position encoding: use_absolute_position_embeddings, use_relative_position_bias "
            "and use_shared_relative_position_bias are all false",
            view.get("use_relative_position_bias"),
        )
    entries: list[Entry] = []
    if per_layer or shared:
        tables = []
        if per_layer:
            tables.append("every layer has its own table (use_relative_position_bias)")
        if shared:
            tables.append("one table shared by all layers (use_shared_relative_position_bias)")
        heads = view.number("num_attention_heads", required=False)
        notes: dict[str, Any] = {
            "bias": f"{' plus '.join(tables)}: ((2Wh-1)(2Ww-1)+3, num_attention_heads={heads}) "
            "relative_position_bias_table checkpoint weights; pass one as "
            "relative_position_bias_table (or upload it and pass relative_position_bias_table_key "
            "and _shape) for its bias (transformers adds both when both are set)",
            "transformers": "generate_relative_position_index(window_size), window_size = "
            "image_size // patch_size; class token at row/column 0",
            "resolution": "other image sizes: override window_size [height // patch_size, "
            "width // patch_size] for the index; transformers then also resamples the table "
            "bilinearly, which the bias output does not reproduce",
        }
        data = {"kind": "relative_index", "scheme": "beit", "window_size": list(grid)}
        entries.append(Entry("relative_index", None, data, notes))
    if absolute:
        dim = int(view.number("hidden_size"))
        extra = {"transformers": "BeitEmbeddings.position_embeddings, class token row first"}
        entries.append(_learned_entry(view, grid, dim, 1, "embeddings.position_embeddings", extra))
    return entries


def vit_mae(view: ConfigView) -> list[Entry]:
    """ViTMAE (`modeling_vit_mae.ViTMAEEmbeddings.initialize_weights`, `ViTMAEDecoder.
    initialize_weights`): fixed 2-D sin-cos tables on a square grid of int(sqrt(num_patches)),
    zero class-token row first, at hidden_size (encoder) and decoder_hidden_size (decoder)."""
    gh, gw = _patch_grid(view)
    patches = gh * gw
    side = int(patches**0.5)
    if side * side != patches:
        fail(
            view.key("image_size"),
            f"{patches} patches: ViTMAE builds its table on a square grid of "
            "int(sqrt(num_patches)) and cannot initialise it",
            view.get("image_size"),
        )
    dims = {
        "encoder": int(view.number("hidden_size")),
        "decoder": int(view.number("decoder_hidden_size")),
    }
    notes = {
        "encoder": "ViTMAEEmbeddings.position_embeddings (requires_grad=False)",
        "decoder": "ViTMAEDecoder.decoder_pos_embed (ViTMAEForPreTraining only)",
    }
    base = {
        "kind": "sinusoidal_2d",
        "style": "mae",
        "grid_height": side,
        "grid_width": side,
        "cls_token": True,
    }
    common = {
        "layout": "[sin(x w), cos(x w), sin(y w), cos(y w)] (transformers' half rotation of "
        "build_2d_sinusoidal_position_embedding), zero class-token row first",
        "resample": "interpolate_pos_encoding=True resamples this table bicubically (the "
        "learned family's hf_vit method on the uploaded table)",
    }
    if dims["encoder"] == dims["decoder"]:
        note = {"transformers": f"{notes['encoder']}; {notes['decoder']}: one table", **common}
        return [Entry("sinusoidal_2d", None, {**base, "dim": dims["encoder"]}, note)]
    return [
        Entry(
            "sinusoidal_2d",
            role,
            {**base, "dim": dim},
            {"transformers": notes[role], **common},
        )
        for role, dim in dims.items()
    ]


def videomae(view: ConfigView) -> list[Entry]:
    """VideoMAE (`modeling_videomae.get_sinusoid_encoding_table(num_patches, width)`): one row per
    tubelet patch, num_patches = (num_frames // tubelet_size) * grid_h * grid_w, numpy float64
    `pos / 10000 ** (2 * (j // 2) / width)`, sin at even columns, cos at odd ones, rounded once
    (posenc's vaswani convention in float64): the encoder's table (hidden_size) and the
    pre-training decoder's (decoder_hidden_size)."""
    gh, gw = _patch_grid(view)
    frames = int(view.number("num_frames")) // int(view.number("tubelet_size"))
    if frames < 1:
        fail(view.key("tubelet_size"), "larger than num_frames: no tubelets", frames)
    rows = frames * gh * gw
    entries = []
    for role, width, owner in (
        ("encoder", "hidden_size", "VideoMAEEmbeddings.position_embeddings"),
        ("decoder", "decoder_hidden_size", "VideoMAEForPreTraining.position_embeddings"),
    ):
        data = {
            "kind": "sinusoidal",
            "dim": int(view.number(width)),
            "max_positions": rows,
            "convention": "vaswani",
            "compute_dtype": "float64",
            "odd_dim": "extra_sin",
        }
        notes = {
            "transformers": f"{owner} = get_sinusoid_encoding_table(num_patches, {width})",
            "rows": f"patch index t * {gh * gw} + y * {gw} + x over {frames} tubelets of a "
            f"{gh} x {gw} patch grid (the Conv3d patch embedding's flattening order); the "
            "table is fixed: other input sizes are not interpolated",
        }
        if role == "decoder":
            notes["decoder"] = "VideoMAEForPreTraining only: the decoder adds it to the visible "
            notes["decoder"] += "and masked tokens at their patch indices"
        entries.append(Entry("sinusoidal", role, data, notes))
    return entries


def detr(view: ConfigView) -> list[Entry]:
    """DETR family (`DetrSinePositionEmbedding(d_model // 2, normalize=True)` and its copies in
    conditional DETR, Deformable DETR and Table Transformer): the sine table of a feature map.

    Its size is the backbone feature map of each batch, which no config gives: the request passes
    `height`, `width` (and the image's unpadded `valid_height`, `valid_width` there)."""
    kind = view.get("position_embedding_type", "sine")
    if kind != "sine":
        fail(
            view.key("position_embedding_type"),
            f"{kind!r}: learned row/column embeddings (checkpoint weights), not a formula",
            kind,
        )
    data: dict[str, Any] = {
        "kind": "sinusoidal_2d",
        "style": "detr",
        "num_pos_feats": int(view.number("d_model")) // 2,
        "normalize": True,
    }
    offset = DETR_MODELS[view.model_type]
    if offset:
        data["offset"] = offset
    notes = {
        "size": "pass height and width: the backbone feature map of the batch (the pixel mask "
        "resized to it, nearest), and valid_height / valid_width: the image's unpadded extent "
        "there (default: all valid); config.json does not give them",
        "transformers": f"{view.model_type}: <Model>SinePositionEmbedding(d_model // 2, "
        f"normalize=True){' with (cumsum - 0.5)' if offset else ''}, computed per feature map "
        "(one table per feature level in Deformable DETR)",
    }
    return [Entry("sinusoidal_2d", None, data, notes)]


def _sine_entry(
    role: str | None, num_pos_feats: int, source: str, temperature: float | None = None
) -> Entry:
    """A DETR-style normalised sine table of a feature map (`sinusoidal_2d`, style detr) whose
    size the request gives (`height`, `width`, `valid_height`, `valid_width`)."""
    data: dict[str, Any] = {
        "kind": "sinusoidal_2d",
        "style": "detr",
        "num_pos_feats": num_pos_feats,
        "normalize": True,
    }
    if temperature is not None:
        data["temperature"] = temperature
    notes = {
        "size": "pass height and width: the feature map's size (one table per feature level), "
        "and valid_height / valid_width where the model masks padding (default: all valid); "
        "config.json does not give them",
        "transformers": source,
    }
    return Entry("sinusoidal_2d", role, data, notes)


def _sine_tables(parts: dict[str, tuple[int, str]]) -> list[Entry]:
    """One entry per part {role: (num_pos_feats, source)}; a single entry when all parts share
    one table (equal num_pos_feats)."""
    if len({feats for feats, _ in parts.values()}) == 1:
        feats = next(iter(parts.values()))[0]
        return [_sine_entry(None, feats, "; ".join(src for _, src in parts.values()))]
    return [_sine_entry(role, feats, src) for role, (feats, src) in parts.items()]


def mask2former(view: ConfigView) -> list[Entry]:
    """Mask2Former / OneFormer (`<Model>SinePositionEmbedding(num_position_features=F,
    normalize=True)`, no mask: every position valid): the pixel decoder's tables at
    feature_size // 2 (OneFormer: conv_dim // 2) and the transformer decoder's at hidden_dim // 2,
    each per feature level of the image."""
    name = "Mask2Former" if view.model_type == "mask2former" else "OneFormer"
    pixel_key = "feature_size" if view.model_type == "mask2former" else "conv_dim"
    pixel = int(view.number(pixel_key))
    hidden = int(view.number("hidden_dim"))
    return _sine_tables(
        {
            "pixel_decoder": (
                pixel // 2,
                f"{name}PixelDecoder: {name}SinePositionEmbedding({pixel_key} // 2, "
                "normalize=True) per feature level, no mask",
            ),
            "transformer_decoder": (
                hidden // 2,
                f"{name}TransformerModule: {name}SinePositionEmbedding(hidden_dim // 2, "
                "normalize=True) per feature level, no mask",
            ),
        }
    )


def maskformer(view: ConfigView) -> list[Entry]:
    """MaskFormer (`MaskFormerTransformerModule`: `MaskFormerSinePositionEmbedding(
    decoder_config.hidden_size // 2, normalize=True)` over the backbone's last feature map, no
    mask)."""
    decoder = view.data.get("decoder_config")
    if decoder is None:
        decoder = {}
    if not isinstance(decoder, Mapping):
        fail(view.key("decoder_config"), "must be an object (a DETR config)", decoder)
    sub = ConfigView(decoder, view.key("decoder_config."), "detr", {"d_model": 256})
    hidden = int(sub.number("d_model", "hidden_size"))
    source = (
        "MaskFormerTransformerModule: MaskFormerSinePositionEmbedding(decoder_config.hidden_size "
        "// 2, normalize=True) over the last feature map, no mask"
    )
    return [_sine_entry(None, hidden // 2, source)]


def grounding_dino(config: Mapping[str, Any]) -> list[Entry]:
    """Grounding DINO / MM Grounding DINO's vision side (`GroundingDinoSinePositionEmbedding`):
    DETR's normalised sine table at d_model // 2 features with temperature
    `positional_embedding_temperature` (20), per feature level of the padded image."""
    model_type = str(config.get("model_type"))
    view = ConfigView(config, "", model_type, {"d_model": 256})
    kind = view.get("position_embedding_type", "sine")
    if kind != "sine":
        fail(
            view.key("position_embedding_type"),
            f"{kind!r}: learned row/column embeddings (checkpoint weights), not a formula",
            kind,
        )
    temperature = float(view.number("positional_embedding_temperature", required=False) or 20)
    entry = _sine_entry(
        None,
        int(view.number("d_model")) // 2,
        f"{model_type}: GroundingDinoSinePositionEmbedding(config) per feature level, on the "
        "pixel mask resized to the level (nearest); a learned level_embed (checkpoint weights) "
        "is added per level",
        temperature,
    )
    entry.notes["size"] = (
        "pass height and width: the feature level's size, and valid_height / valid_width: the "
        "image's unpadded extent there (default: all valid); config.json does not give them"
    )
    return [entry]


RT_DETR_MODELS: dict[str, str] = {
    "rt_detr": "RTDetr",
    "rt_detr_v2": "RTDetrV2",
    "d_fine": "DFine",
    "deimv2": "Deimv2",
    "pp_doclayout_v2": "PPDocLayoutV2",
    "pp_doclayout_v3": "PPDocLayoutV3",
    "pp_doclayout_v4": "PPDocLayoutV4",
}
"""RT-DETR-family model_type -> its class prefix (`<Prefix>SinePositionEmbedding`)."""

EVAL_SIZE_NOTE = (
    "eval_size is set: transformers adds this table in training only (eval mode passes no "
    "position embedding)"
)
"""The note of an RT-DETR-family or OmDet-Turbo config with `eval_size` set."""


def rt_detr(view: ConfigView) -> list[Entry]:
    """RT-DETR and its copies (`<Model>AIFILayer`: `<Model>SinePositionEmbedding(
    encoder_hidden_dim, positional_encoding_temperature)`, `build_2d_sinusoidal_position_embedding`
    in float64): per token [sin h, cos h, sin w, cos w] of bands 1 / t^(k / (D/4)), tokens
    row-major: timm's layout with `interleave_sin_cos`, computed in float64 and cast last."""
    dim = int(view.number("encoder_hidden_dim"))
    if dim % 4:
        fail(view.key("encoder_hidden_dim"), "must be divisible by 4 (the 2-D sin-cos table)", dim)
    temperature = float(view.number("positional_encoding_temperature"))
    data: dict[str, Any] = {
        "kind": "sinusoidal_2d",
        "style": "timm",
        "dim": dim,
        "temperature": temperature,
        "interleave_sin_cos": True,
        "compute_dtype": "float64",
    }
    prefix = RT_DETR_MODELS[view.model_type]
    notes: dict[str, Any] = {
        "size": "pass grid_height and grid_width: the AIFI level's feature map (stride 32 with "
        "the default encode_proj_layers [2]); config.json does not give it",
        "transformers": f"{prefix}AIFILayer: {prefix}SinePositionEmbedding(encoder_hidden_dim, "
        "positional_encoding_temperature), build_2d_sinusoidal_position_embedding in float64, "
        "cast to the activations' dtype",
    }
    if view.get("eval_size") is not None:
        notes["eval_size"] = EVAL_SIZE_NOTE
    return [Entry("sinusoidal_2d", None, data, notes)]


def dab_detr(view: ConfigView) -> list[Entry]:
    """DAB-DETR (`DabDetrSinePositionEmbedding(config)`): DETR's normalised sine table at
    F = hidden_size / 2 features with per-axis temperatures (`temperature_height`,
    `temperature_width`) and `sine_position_embedding_scale` (2 pi when null). Its exponents are
    (i // 2) * (2 / F), equal to posenc's 2 * (i // 2) / F when F is a power of two (2 / F
    exact)."""
    hidden = view.number("hidden_size", "d_model")
    feats = hidden / 2
    if feats != int(feats) or int(feats) & (int(feats) - 1):
        fail(
            view.key("hidden_size"),
            f"DabDetrSinePositionEmbedding's exponents (i // 2) * (2 / {feats:g}) round "
            "differently from 2 * (i // 2) / F unless hidden_size / 2 is a power of two; not "
            "mapped",
            hidden,
        )
    data: dict[str, Any] = {
        "kind": "sinusoidal_2d",
        "style": "detr",
        "num_pos_feats": int(feats),
        "normalize": True,
        "temperature_h": float(view.number("temperature_height")),
        "temperature_w": float(view.number("temperature_width")),
    }
    scale = view.get("sine_position_embedding_scale")
    if scale is not None:
        data["scale"] = float(check_number(view.key("sine_position_embedding_scale"), scale))
    notes = {
        "size": "pass height and width: the backbone's last feature map, and valid_height / "
        "valid_width: the image's unpadded extent there (default: all valid); config.json does "
        "not give them",
        "transformers": "DabDetrModel: DabDetrSinePositionEmbedding(config) on the last feature "
        "map's pixel mask (object_queries)",
    }
    return [Entry("sinusoidal_2d", None, data, notes)]


def clap_audio(config: Mapping[str, Any]) -> list[Entry]:
    """CLAP's audio encoder (HTS-AT; `ClapAudioSelfAttention.relative_position_index`): Swin's
    window index, W = `audio_config.window_size`, read from the whole CLAP config."""
    audio = config.get("audio_config")
    if not isinstance(audio, Mapping):
        fail("audio_config", "must be an object (the CLAP audio encoder's config)", audio)
    view = ConfigView(audio, "audio_config.", "clap_audio_model", {"window_size": 8})
    entries = swin_copy(view)
    entries[0].notes.pop("num_heads_per_stage", None)
    return entries


def omdet_turbo(config: Mapping[str, Any]) -> list[Entry]:
    """OmDet-Turbo's encoder (`OmDetTurboHybridEncoder.build_2d_sincos_position_embedding`):
    float32, tokens column-major (`meshgrid(grid_w, grid_h)`), per token [sin w, cos w, sin h,
    cos h] of bands 1 / t^(k / (D/4)): timm's layout with `reverse_coord` and
    `interleave_sin_cos`."""
    view = ConfigView(config, "", "omdet-turbo", None)
    dim = int(view.number("encoder_hidden_dim", "d_model"))
    if dim % 4:
        fail(view.key("d_model"), "must be divisible by 4 (the 2-D sin-cos table)", dim)
    data: dict[str, Any] = {
        "kind": "sinusoidal_2d",
        "style": "timm",
        "dim": dim,
        "temperature": float(view.number("positional_encoding_temperature")),
        "reverse_coord": True,
        "interleave_sin_cos": True,
    }
    notes: dict[str, Any] = {
        "size": "pass grid_height and grid_width: the projected feature map's size at each "
        "encoder_projection_indices level; config.json does not give it",
        "transformers": "OmDetTurboHybridEncoder.build_2d_sincos_position_embedding(width, "
        "height, encoder_hidden_dim, positional_encoding_temperature), float32",
    }
    if view.get("eval_size") is not None:
        notes["eval_size"] = EVAL_SIZE_NOTE
    return [Entry("sinusoidal_2d", None, data, notes)]


def granite_docling_vision(view: ConfigView) -> list[Entry]:
    """granite_docling's vision connector (`GraniteDoclingConnectorPath.pos_embed`,
    `GraniteDoclingPositionEmbedding.build`): the float64 2-D sin-cos table of a tile's
    (image_size // patch_size) // factor square grid, rolled by out_hidden_size / 2 to
    [sin w, cos w, sin h, cos h] (MAE's layout, no class token), at out_hidden_size; one table for
    the coarse path (scale_factor) and one for the fine path (scale_factor // 2, when
    use_fine_route)."""
    gh, gw = _patch_grid(view)
    if gh != gw:
        fail(view.key("image_size"), "granite_docling's connector assumes square tiles", [gh, gw])
    dim = int(view.number("out_hidden_size"))
    factor = int(view.number("scale_factor"))
    paths = {"coarse": factor}
    if view.get("use_fine_route", True):
        paths["fine"] = factor // 2
    entries = []
    for role, f in paths.items():
        if f < 1 or gh // f < 1:
            fail(view.key("scale_factor"), f"the {role} path's grid {gh} // {f} is empty", factor)
        data = {
            "kind": "sinusoidal_2d",
            "style": "mae",
            "dim": dim,
            "grid_height": gh // f,
            "grid_width": gh // f,
            "cls_token": False,
        }
        notes = {
            "transformers": f"GraniteDoclingConnector.{role}.pos_embed: build_2d_sinusoidal_"
            f"position_embedding({gh} // {f}, ..., out_hidden_size).roll(out_hidden_size // 2): "
            "columns before rows, added to each tile's shuffled tokens",
        }
        entries.append(Entry("sinusoidal_2d", role, data, notes))
    return entries


def granite_docling(config: Mapping[str, Any]) -> list[Entry]:
    """granite_docling's parts beside its text model: the vision connector's tables
    (`granite_docling_vision` of `vision_config`)."""
    vision_config = config.get("vision_config") or {}
    if not isinstance(vision_config, Mapping):
        fail("vision_config", "must be an object", vision_config)
    view = ConfigView(
        vision_config,
        "vision_config.",
        "granite_docling_vision",
        {"image_size": 512, "patch_size": 16, "out_hidden_size": 1024, "scale_factor": 4},
    )
    return granite_docling_vision(view)


def aimv2_vision(view: ConfigView) -> list[Entry]:
    """AIMv2's vision encoder when `is_native` (`Aimv2VisionEmbeddings.forward`:
    `build_2d_sinusoidal_position_embedding` of the image's patch grid in float64, halves swapped
    to [sin w, cos w, sin h, cos h]: MAE's layout, no class token); otherwise its positions are a
    learned table (checkpoint weights) and the config is refused."""
    if not view.get("is_native"):
        fail(
            view.key("is_native"),
            "false (the class default): AIMv2 then adds a learned position_embedding (checkpoint "
            "weights), not a formula",
            view.get("is_native"),
        )
    gh, gw = _patch_grid(view)
    data = {
        "kind": "sinusoidal_2d",
        "style": "mae",
        "dim": int(view.number("hidden_size")),
        "grid_height": gh,
        "grid_width": gw,
        "cls_token": False,
    }
    notes = {
        "size": "the native-resolution model builds the table per image: pass grid_height and "
        "grid_width (height // patch_size, width // patch_size); the default is image_size's grid",
        "transformers": "Aimv2VisionEmbeddings: build_2d_sinusoidal_position_embedding(h, w, "
        "hidden_size) with its halves swapped ([sin_w|cos_w|sin_h|cos_h]), float64 then cast",
    }
    return [Entry("sinusoidal_2d", None, data, notes)]


def aimv2(config: Mapping[str, Any]) -> list[Entry]:
    """AIMv2's vision side (`aimv2_vision` of `vision_config`) beside its text encoder."""
    vision_config = config.get("vision_config") or {}
    if not isinstance(vision_config, Mapping):
        fail("vision_config", "must be an object", vision_config)
    defaults = {"image_size": 224, "patch_size": 14, "hidden_size": 1024, "is_native": False}
    return aimv2_vision(ConfigView(vision_config, "vision_config.", "aimv2_vision_model", defaults))
