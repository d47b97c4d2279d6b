"""Vision towers with rotary positions: the `vision_rope:vision` entry of a multimodal (or
vision-only) config, beside its text tables.

Sources: transformers 5.24 `modeling_<model>.py` of each tower (the rotary module named in
`ROTARY_CLASSES`, `vision_utils.get_vision_position_ids` / `get_vision_window_index`) and the
config classes' defaults. `ROTARY_CLASSES` and `REFUSED_CLASSES` together name every vision rotary
module of the installed transformers (a test enumerates them from the package): a class is mapped
only when the test reproduces its tower's cos/sin bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from posenc.encodings.config_values import check_number, fail
from posenc.encodings.hf_config.view import ConfigView, Entry

ROTARY_CLASSES: dict[str, str] = {
    **dict.fromkeys(
        (
            "Qwen2VLVisionRotaryEmbedding",
            "Qwen2_5_VLVisionRotaryEmbedding",
            "Qwen2_5OmniVisionRotaryEmbedding",
            "Qwen3VLVisionRotaryEmbedding",
            "Qwen3VLMoeVisionRotaryEmbedding",
            "Qwen3OmniMoeVisionRotaryEmbedding",
            "Qwen3_5VisionRotaryEmbedding",
            "Qwen3_5MoeVisionRotaryEmbedding",
            "Qwen4ExpVisionRotaryEmbedding",
            "Glm4vVisionRotaryEmbedding",
            "Glm4vMoeVisionRotaryEmbedding",
            "GlmOcrVisionRotaryEmbedding",
            "Glm5NextVisionRotaryEmbedding",
            "Ernie4_5_VLMoeVisionRotaryEmbedding",
            "CohereCompassVisionRotaryEmbedding",
            "Dots3NoteVisionRotaryEmbedding",
            "Exaone4_5_VisionRotaryEmbedding",
            "Lfm3VlVisionRotaryEmbedding",
        ),
        "qwen2_vl",
    ),
    "MiniMaxM3VLVisionRotaryEmbedding": "minimax_m3",
    "Gemma4VisionRotaryEmbedding": "gemma4",
    "PixtralVisionRotaryEmbedding": "pixtral",
    "Llama4VisionRotaryEmbedding": "llama4",
    "DINOv3ViTRopePositionEmbedding": "dinov3",
    "EomtDinov3RotaryEmbedding": "dinov3",
}
"""transformers vision rotary module -> the `vision_rope` style that reproduces its tower."""

REFUSED_CLASSES: dict[str, str] = {
    "Sam2VideoVisionRotaryEmbedding": "memory-attention rotary with pairwise (2i, 2i+1) rotation "
    "of the SAM 2 video memory, not a patch grid of this family",
    "EdgeTamVideoVisionRotaryEmbedding": "SAM 2 video memory-attention rotary (pairwise), not "
    "served",
    "Sam3ViTRotaryEmbedding": "pairwise (2i, 2i+1) layout (repeat_interleave of cat(h, w)) over "
    "its own position grid (not served)",
    "Sam3TrackerVideoVisionRotaryEmbedding": "SAM 2 video memory-attention rotary (pairwise), "
    "not served",
    "Kimi_K25VisionRotaryEmbedding": "W-H order interleaved within the head dim (not served)",
    "Inkling2VisionRotaryEmbedding": "W-H order with pairwise rotation (not served)",
    "Step3p7VisionRotaryEmbedding": "W-H order (not served)",
    "MuseGlimmerVisionRotaryEmbedding": "not verified against its tower (not served)",
    "MuseSparkVisionRotaryEmbedding": "not verified against its tower (not served)",
    "PaddleOCRVisionRotaryEmbedding": "its tower builds its own position ids (not "
    "get_vision_position_ids with spatial_merge_size; not served)",
    "VideoLlama3VisionRotaryEmbedding": "its tower builds its own position ids (not served)",
    "DeepseekOcr2VisionRotaryEmbedding": "a 1-D text-style rotary inside the vision encoder: the "
    "rope family, not a patch grid",
    "Granite4VisionTextRotaryEmbedding": "the text model's rotary (the rope family)",
}
"""Vision rotary modules posenc does not serve, with the reason (a test keeps the two dicts equal
to the installed package's classes)."""

UNSERVED: dict[str, str] = {
    "kimi_k25": "Kimi_K25VisionRotaryEmbedding",
    "inkling2": "Inkling2VisionRotaryEmbedding",
    "step3p7": "Step3p7VisionRotaryEmbedding",
    "muse_glimmer": "MuseGlimmerVisionRotaryEmbedding",
    "muse_spark": "MuseSparkVisionRotaryEmbedding",
    "paddleocr_vl": "PaddleOCRVisionRotaryEmbedding",
    "video_llama_3": "VideoLlama3VisionRotaryEmbedding",
    "sam3": "Sam3ViTRotaryEmbedding",
    "sam2_video": "Sam2VideoVisionRotaryEmbedding",
    "edgetam_video": "EdgeTamVideoVisionRotaryEmbedding",
    "sam3_tracker_video": "Sam3TrackerVideoVisionRotaryEmbedding",
}
"""Model types whose vision tower's rotary is refused (`REFUSED_CLASSES`): `/v1/resolve` notes it
as `not_served` beside the text tables, and refuses `kind: vision_rope` naming `model_type`."""

DEFAULT_GRID = 16
"""Patches per side when the config gives no image size (the Qwen2-VL family sizes each image at
run time): the request passes grid_height and grid_width for its images."""

QWEN_WINDOW = frozenset({"qwen2_5_vl", "qwen2_5_omni", "qwen2_5_omni_thinker", "exaone4_5"})
"""Towers that apply `get_vision_window_index`'s permutation (Qwen2.5-VL's window attention)."""

Reader = Callable[[ConfigView], Entry]


def _number(view: ConfigView, *names: str, default: Any = None) -> Any:
    for name in names:
        value = view.data.get(name)
        if value is not None:
            return check_number(view.key(name), value)
    if default is None:
        fail(view.key(names[0]), "required key missing", None)
    return default


def _int(view: ConfigView, *names: str, default: int | None = None) -> int:
    value = _number(view, *names, default=default)
    if int(value) != value or value < 1:
        fail(view.key(names[0]), "must be a positive integer", value)
    return int(value)


def _theta(view: ConfigView, default: float) -> float:
    params = view.data.get("rope_parameters")
    if isinstance(params, Mapping) and params.get("rope_theta") is not None:
        return float(check_number(view.key("rope_parameters.rope_theta"), params["rope_theta"]))
    return float(_number(view, "rope_theta", default=default))


def _head_dim(view: ConfigView, hidden: tuple[str, ...], heads: tuple[str, ...]) -> int:
    explicit = view.data.get("head_dim")
    if explicit:
        return int(check_number(view.key("head_dim"), explicit))
    width = _int(view, *hidden)
    count = _int(view, *heads)
    return width // count


def _grid(view: ConfigView) -> tuple[int, int] | None:
    """image_size // patch_size per axis (ints or [h, w]); None without an image size."""
    image = view.data.get("image_size")
    patch = view.data.get("patch_size")
    if image is None or patch is None:
        return None
    pairs = []
    for name, value in (("image_size", image), ("patch_size", patch)):
        items = value if isinstance(value, list) else [value, value]
        if len(items) != 2:
            fail(view.key(name), "must be an int or [height, width]", value)
        pairs.append([int(check_number(view.key(name), v)) for v in items])
    (ih, iw), (ph, pw) = pairs
    if min(ph, pw) < 1 or ih // ph < 1 or iw // pw < 1:
        fail(view.key("patch_size"), "larger than image_size: no patches", patch)
    return ih // ph, iw // pw


def _entry(data: dict[str, Any], notes: dict[str, Any]) -> Entry:
    return Entry("vision_rope", "vision", {"kind": "vision_rope", **data}, notes)


def qwen(view: ConfigView) -> Entry:
    """Qwen2-VL, Qwen2.5-VL (window order), Qwen3-VL, GLM-4V and the towers sharing their axial
    rotary (`Qwen2VLVisionRotaryEmbedding` and copies)."""
    hidden = ("embed_dim", "hidden_size") if view.has("embed_dim") else ("hidden_size",)
    head_dim = _head_dim(view, hidden, ("num_heads", "num_attention_heads"))
    merge = _int(view, "spatial_merge_size", default=2)
    grid = _grid(view)
    side_h, side_w = grid or (DEFAULT_GRID, DEFAULT_GRID)
    data: dict[str, Any] = {
        "style": "qwen2_vl",
        "head_dim": head_dim,
        "rope_theta": _theta(view, 10000.0),
        "spatial_merge_size": merge,
        "grid_height": side_h,
        "grid_width": side_w,
    }
    notes: dict[str, Any] = {
        "transformers": "<Model>VisionRotaryEmbedding (axial: f = 1/theta^(arange(0, D/2, 2) / "
        "(D/2)), cos/sin = cat(h*f, w*f, h*f, w*f)) applied by apply_rotary_pos_emb_vision "
        "(rotate-half, fp32)",
        "pairing": "half_split",
        "patch_order": "vision_utils.get_vision_position_ids: spatial_merge_size x "
        "spatial_merge_size blocks row-major, patches row-major inside each block; a video "
        "repeats the frame's rows per frame (frames)",
        "grid": "grid_height, grid_width = each image's resized height // patch_size, width // "
        "patch_size (grid_thw[1:]); pass them per image"
        + (
            ""
            if grid
            else f" (config.json has no image size: {DEFAULT_GRID}x{DEFAULT_GRID} unless given)"
        ),
        "images": "each image (grid_thw row) is its own table, concatenated in order",
    }
    if view.model_type in QWEN_WINDOW:
        data["window_size"] = _int(view, "window_size", default=112)
        data["patch_size"] = _int(view, "patch_size", default=14)
        notes["window"] = (
            "rows permuted in merge units (spatial_merge_size^2 rows) by "
            "vision_utils.get_vision_window_index, as permute_input_for_window_attn permutes "
            "cos, sin and the hidden states; the merger output is restored with "
            "argsort(window_index); full-attention blocks (fullatt_block_indexes) use the same "
            "permuted table"
        )
    return _entry(data, notes)


def minimax_m3(view: ConfigView) -> Entry:
    """MiniMax-M3-VL's tower (`MiniMaxM3VLVisionRotaryEmbedding`): 3-D (t, h, w), partial."""
    head_dim = _head_dim(view, ("hidden_size",), ("num_attention_heads", "num_heads"))
    grid = _grid(view)
    side_h, side_w = grid or (DEFAULT_GRID, DEFAULT_GRID)
    rotated = 3 * 2 * ((head_dim // 3) // 2)
    data: dict[str, Any] = {
        "style": "minimax_m3",
        "head_dim": head_dim,
        "rope_theta": _theta(view, 10000.0),
        "spatial_merge_size": _int(view, "spatial_merge_size", default=2),
        "grid_height": side_h,
        "grid_width": side_w,
    }
    notes: dict[str, Any] = {
        "transformers": "MiniMaxM3VLVisionRotaryEmbedding (S = 2*((D//3)//2), f = 1/theta^"
        "(arange(0, S, 2) / S), cos/sin = cat(t*f, h*f, w*f) twice) applied by "
        "apply_rotary_pos_emb_vision to the first rotary_width dims (rotate-half)",
        "pairing": "half_split",
        "rotary_width": f"{rotated} of head_dim {head_dim}: the other {head_dim - rotated} dims "
        "pass through unrotated",
        "patch_order": "vision_utils.get_vision_position_ids(include_temporal=True): t the frame "
        "index, h and w in spatial_merge_size blocks (row-major blocks, row-major inside); one "
        "attention segment per clip (merge_temporal)",
        "grid": "grid_height, grid_width, frames = each input's grid_thw; pass them per input"
        + (
            ""
            if grid
            else f" (config.json has no image size: {DEFAULT_GRID}x{DEFAULT_GRID} unless given)"
        ),
    }
    return _entry(data, notes)


def gemma4(view: ConfigView) -> Entry:
    """Gemma 4's vision tower (`Gemma4VisionRotaryEmbedding`, `apply_multidimensional_rope`)."""
    head_dim = _head_dim(view, ("hidden_size",), ("num_attention_heads",))
    data = {
        "style": "gemma4",
        "head_dim": head_dim,
        "rope_theta": _theta(view, 100.0),
        "grid_height": DEFAULT_GRID,
        "grid_width": DEFAULT_GRID,
    }
    notes = {
        "transformers": "Gemma4VisionRotaryEmbedding (f = 1/theta^(arange(0, D/2, 2) / (D/2)), "
        "cos/sin = cat(x*f, x*f, y*f, y*f)) applied by apply_multidimensional_rope: dims "
        "[0, D/2) rotate by the column x, [D/2, D) by the row y, rotate-half within each block",
        "pairing": "half_split_per_axis",
        "patch_order": "row-major (Gemma4ImageProcessor: meshgrid(arange(W), arange(H), "
        "indexing='xy'), positions (x, y)); rows padded to max_patches (position -1, masked "
        "out of attention) are not in the table",
        "grid": f"the processor sizes each image: pass grid_height = height // patch_size, "
        f"grid_width = width // patch_size ({DEFAULT_GRID}x{DEFAULT_GRID} unless given)",
    }
    return _entry(data, notes)


def pixtral(view: ConfigView) -> Entry:
    """Pixtral's tower (`PixtralVisionRotaryEmbedding`; Mistral 3 and Llava-Pixtral use it)."""
    head_dim = _head_dim(view, ("hidden_size",), ("num_attention_heads",))
    grid = _grid(view) or fail(view.key("image_size"), "required key missing", None)
    data = {
        "style": "pixtral",
        "head_dim": head_dim,
        "rope_theta": _theta(view, 10000.0),
        "grid_height": grid[0],
        "grid_width": grid[1],
    }
    notes = {
        "transformers": "PixtralVisionRotaryEmbedding (f = 1/theta^(arange(0, D, 2) / D); "
        "cos/sin = cat(h*f[0::2], w*f[1::2]) twice) applied by apply_rotary_pos_emb "
        "(rotate-half)",
        "pairing": "half_split",
        "patch_order": "row-major over each image's patches (PixtralVisionModel.forward's "
        "meshgrid); images of a batch are concatenated, each with its own grid",
        "grid": "the largest grid (image_size // patch_size per side); pass grid_height = "
        "height // patch_size, grid_width = width // patch_size for an image",
        "class_token": "none",
    }
    return _entry(data, notes)


def llama4(view: ConfigView) -> Entry:
    """Llama 4's tower (`Llama4VisionRotaryEmbedding`): a square grid and the class token."""
    head_dim = _int(view, "hidden_size") // _int(view, "num_attention_heads")
    grid = _grid(view) or fail(view.key("image_size"), "required key missing", None)
    if grid[0] != grid[1]:
        fail(view.key("image_size"), "Llama 4 builds a square patch grid", view.get("image_size"))
    data = {
        "style": "llama4",
        "head_dim": head_dim,
        "rope_theta": _theta(view, 10000.0),
        "grid_height": grid[0],
        "grid_width": grid[1],
    }
    notes = {
        "transformers": "Llama4VisionRotaryEmbedding._compute_freqs_ci: freqs_ci = "
        "complex(cos, sin) (S*S + 1, D/2), multiplied into complex pairs (2i, 2i+1) by "
        "vision_apply_rotary_emb",
        "pairing": "interleaved",
        "patch_order": "row-major over the image_size // patch_size square (x = column, y = row, "
        "angles (x+1)*f then (y+1)*f)",
        "class_token": "the last row (the tower appends the class embedding after the patches): "
        "angle 0, cos 1, sin 0",
    }
    return _entry(data, notes)


def dinov3(view: ConfigView) -> Entry:
    """DINOv3 ViT (`DINOv3ViTRopePositionEmbedding`) at inference."""
    return _dinov3(view, "DINOv3ViTRopePositionEmbedding", "")


def eomt_dinov3(view: ConfigView) -> Entry:
    """EoMT on a DINOv3 backbone (`EomtDinov3RotaryEmbedding`: DINOv3's rotary, its theta in
    rope_parameters, default 100) at inference. Its `num_queries` query tokens, prepended in the
    last `num_blocks` layers, join the unrotated prefix (`apply_rotary_pos_emb` rotates the last
    H*W tokens only)."""
    params = view.data.get("rope_parameters")
    rope_type = params.get("rope_type", "default") if isinstance(params, Mapping) else "default"
    if rope_type != "default":
        # EomtDinov3RotaryEmbedding raises ValueError for any other type
        fail(view.key("rope_parameters.rope_type"), "EoMT-DINOv3 builds only 'default'", rope_type)
    queries = view.data.get("num_queries", 200)
    blocks = view.data.get("num_blocks", 4)
    return _dinov3(
        view,
        "EomtDinov3RotaryEmbedding",
        f" and, in the last num_blocks={blocks} layers, the num_queries={queries} query tokens",
    )


def _dinov3(view: ConfigView, rotary: str, queries: str) -> Entry:
    head_dim = _int(view, "hidden_size") // _int(view, "num_attention_heads")
    grid = _grid(view) or fail(view.key("image_size"), "required key missing", None)
    registers = view.data.get("num_register_tokens", 0)
    data = {
        "style": "dinov3",
        "head_dim": head_dim,
        "rope_theta": _theta(view, 100.0),
        "grid_height": grid[0],
        "grid_width": grid[1],
    }
    notes = {
        "transformers": f"{rotary}: patch centres normalised to [-1, 1], "
        "angles 2*pi*[y, x]*f, cos/sin = tile(., 2); apply_rotary_pos_emb (rotate-half)",
        "pairing": "half_split",
        "patch_order": "row-major over the patches",
        "class_token": f"the class token, num_register_tokens={registers} register tokens"
        f"{queries} come first and are not rotated (apply_rotary_pos_emb splits them off)",
        "augmentation": "pos_embed_shift / jitter / rescale apply in training only: not served",
        "grid": "image_size // patch_size; the tower computes the table per input (height // "
        "patch_size, width // patch_size): pass grid_height, grid_width",
    }
    return _entry(data, notes)


TOWERS: dict[str, tuple[tuple[str, ...], Reader]] = {
    **{
        t: (("vision_config",), qwen)
        for t in (
            "qwen2_vl",
            "qwen2_5_vl",
            "qwen3_vl",
            "qwen3_vl_moe",
            "qwen3_5",
            "qwen3_5_moe",
            "qwen4_exp",
            "glm4v",
            "glm4v_moe",
            "glm5_next",
            "glm_ocr",
            "ernie4_5_vl_moe",
            "cohere_compass",
            "dots3_note",
            "exaone4_5",
            "lfm3_vl",
            "qwen2_5_omni_thinker",
        )
    },
    "qwen2_5_omni": (("thinker_config", "vision_config"), qwen),
    "qwen3_omni_moe": (("thinker_config", "vision_config"), qwen),
    "minimax_m3_vl": (("vision_config",), minimax_m3),
    "gemma4": (("vision_config",), gemma4),
    "llama4": (("vision_config",), llama4),
    "pixtral": ((), pixtral),
    "dinov3_vit": ((), dinov3),
    "eomt_dinov3": ((), eomt_dinov3),
    "llama4_vision_model": ((), llama4),
    "gemma4_vision": ((), gemma4),
}
"""Top-level model_type -> where its vision config is and how it maps. Any composite config whose
`vision_config.model_type` is "pixtral" (Mistral 3, Llava-Pixtral) maps through `pixtral`."""

VISION_ONLY = frozenset(
    {"pixtral", "dinov3_vit", "eomt_dinov3", "llama4_vision_model", "gemma4_vision"}
)
"""Model types whose config is the vision tower itself: no text tables."""


def not_served(config: Mapping[str, Any]) -> str | None:
    """Why the vision tower of `config` has no `vision_rope` entry, when its rotary is refused."""
    name = UNSERVED.get(str(config.get("model_type")))
    return None if name is None else f"the vision tower's rotary ({name}): {REFUSED_CLASSES[name]}"


def vision_entries(config: Mapping[str, Any], *, required: bool = False) -> list[Entry]:
    """The `vision_rope:vision` entry of `config` (empty when its tower has no rotary; with
    `required`, a refused tower is an error naming `model_type`)."""
    model_type = str(config.get("model_type"))
    why = not_served(config)
    if why is not None and required:
        fail("model_type", why, model_type)
    found = TOWERS.get(model_type)
    vision = config.get("vision_config")
    if found is None and isinstance(vision, Mapping) and vision.get("model_type") == "pixtral":
        found = (("vision_config",), pixtral)
    if found is None:
        if required:
            fail(
                "kind",
                f"model_type {model_type!r} has no vision tower with rotary positions (mapped: "
                f"{sorted(TOWERS)} and configs whose vision_config is pixtral)",
                "vision_rope",
            )
        return []
    path, reader = found
    data: Any = config
    for part in path:
        data = data.get(part) if isinstance(data, Mapping) else None
    if not isinstance(data, Mapping):
        if not required:
            return []  # a text-only config of a multimodal family (Gemma 4's default)
        fail(".".join(path), "required: the vision tower's config", None)
    prefix = "".join(f"{p}." for p in path)
    return [reader(ConfigView(data, prefix, model_type, None))]


def no_text(view: ConfigView) -> list[Entry]:
    """A vision-only config (`VISION_ONLY`): its tables are the vision entries."""
    return []
