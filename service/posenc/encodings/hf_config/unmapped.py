"""Model types whose modeling code uses a non-rotary position encoding posenc has (ALiBi, T5
buckets, sinusoids, 2-D sine tables, relative indices) but that `/v1/resolve` does not map from
config.json, each with the reason: `REFUSED` (model_type -> reason) and `refuse`, the mapper that
raises it on the `model_type` field.

Source: the transformers 5.24 modeling files named in each reason (found by the sweep in
tests/encodings/hf_config/test_nonrotary_sweep.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from posenc.encodings.config_values import fail
from posenc.encodings.hf_config import audio, vision
from posenc.encodings.hf_config.view import ConfigView, Entry

REFUSED: dict[str, str] = {
    # modeling_sam3.py / modeling_sam3_lite_text.py: only the vision neck's sine tables are
    # fixed by the config (sam3_vision_model serves them); the other parts' sines are of boxes.
    **{
        t: f"box-dependent sine: {m}.encode_boxes of each query's reference box (refined by "
        "every decoder layer from the input), not a fixed table"
        for t, m in {
            "sam3_detr_decoder": "Sam3SinePositionEmbedding",
            "sam3_lite_text_detr_decoder": "Sam3LiteTextSinePositionEmbedding",
        }.items()
    },
    **{
        t: f"box-dependent sine: the geometry encoder encodes each box prompt's centre with "
        f"{m}.encode_1d_positions of its continuous coordinates (beside the raw width and "
        "height), not a fixed table"
        for t, m in {
            "sam3_geometry_encoder": "Sam3SinePositionEmbedding",
            "sam3_lite_text_geometry_encoder": "Sam3LiteTextSinePositionEmbedding",
        }.items()
    },
    **{
        t: f"no position table of its own: {m} and its pixel decoder add no position encoding "
        "(the vision neck's sine tables, served for sam3_vision_model, enter upstream)"
        for t, m in {
            "sam3_mask_decoder": "Sam3MaskDecoder",
            "sam3_lite_text_mask_decoder": "Sam3LiteTextMaskDecoder",
        }.items()
    },
    **{
        t: f"no sine table of its own: {m} adds the vision_pos_embeds it is given (the vision "
        "neck's FPN sine tables, served for sam3_vision_model)"
        for t, m in {
            "sam3_detr_encoder": "Sam3DetrEncoder",
            "sam3_lite_text_detr_encoder": "Sam3LiteTextDetrEncoder",
        }.items()
    },
    **{
        t: f"random Fourier features ({m}PositionalEmbedding.positional_embedding: a Gaussian "
        "projection matrix in the checkpoint), not a formula"
        for t, m in {"sam2_prompt_encoder": "Sam2", "edgetam_prompt_encoder": "EdgeTam"}.items()
    },
    **{
        t: "no position table of its own: its image positions are the prompt encoder's random "
        "Fourier features (a Gaussian matrix in the checkpoint), not a formula"
        for t in ("sam2_mask_decoder", "edgetam_mask_decoder")
    },
    "sam2_hiera_det_model": "learned absolute positions (Sam2HieraDetModel pos_embed and "
    "pos_embed_window: checkpoint weights), not a formula",
    "sam3_lite_text_text_model": "SAM 3 Lite's text encoder: its positions are not mapped",
    "clap_text_model": "learned absolute position embeddings (RoBERTa-like; checkpoint "
    "weights), not a formula",
    "rt_detr_resnet": "a ResNet backbone: no position encoding (RT-DETR's sine tables are "
    "rt_detr's)",
    "data2vec-audio": "convolutional relative positions (Data2VecAudioPositionalConvLayer: "
    "checkpoint weights), not a formula",
    "data2vec-text": "learned absolute position embeddings (RoBERTa-like; checkpoint weights), "
    "not a formula",
    "aimv2_text_model": "learned absolute position embeddings (checkpoint weights), not a formula",
    # T5 buckets with extra parts (UDOP: text.udop serves the 1-D part).
    "pix2struct_vision_model": "learned row/column patch embeddings (row_embedder, "
    "column_embedder: checkpoint weights), not a formula",
    # Sinusoids inside models with other parts.
    "kosmos_2_vision_model": "learned absolute positions (CLIP vision; checkpoint weights)",
    "kosmos_2_5_vision_model": "learned row/column patch embeddings (checkpoint weights)",
    "speecht5_hifigan": "a vocoder: no position encoding",
    "fastspeech2_conformer_hifigan": "a vocoder: no position encoding",
    "cpmant": "T5 bidirectional buckets (position_bias_num_buckets, position_bias_max_distance) "
    "only between tokens of one segment: CpmAntSegmentPositionEmbedding gives pairs across "
    "segments (the prompt, the text and padding of every input) bucket num_buckets + "
    "query_segment * segment_types + key_segment, so the bucket table depends on the input; "
    "not served",
    "tipsv2_vision_model": "learned absolute positions (checkpoint weights)",
}
"""model_type -> why `/v1/resolve` serves no table for it."""


DEFAULT_BACKBONES: dict[str, str] = {
    **dict.fromkeys(("rt_detr", "rt_detr_v2"), "rt_detr_resnet"),
    **dict.fromkeys(
        ("d_fine", "deimv2", "pp_doclayout_v2", "pp_doclayout_v3", "pp_doclayout_v4"), "hgnet_v2"
    ),
    **dict.fromkeys(
        ("omdet-turbo", "mask2former", "maskformer", "oneformer", "grounding-dino",
         "mm-grounding-dino"),
        "swin",
    ),
}  # fmt: skip
"""Model types with a `backbone_config` -> the backbone's model_type when config.json omits it
(transformers 5.24 `sub_configs_defaults["backbone_config"]` of each config class)."""

NO_POSITION_BACKBONES = frozenset(
    {"resnet", "rt_detr_resnet", "hgnet_v2", "convnext", "convnextv2", "regnet"}
)
"""Convolutional backbones: no position table, nothing left out."""


def backbone_part(config: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(part, why, config key) of a composite's backbone that has position tables of its own
    (Swin: relative_index), or None when its backbone is convolutional (RT-DETR's ResNet, D-FINE's
    HGNetV2: nothing to serve) or the model has no backbone_config."""
    model_type = str(config.get("model_type"))
    if model_type not in DEFAULT_BACKBONES:
        return None
    backbone = config.get("backbone_config")
    if isinstance(backbone, Mapping):
        kind = str(backbone.get("model_type"))
        timm = backbone.get("backbone") if kind == "timm_backbone" else None
    elif config.get("use_timm_backbone") or isinstance(config.get("backbone"), str):
        kind, timm = "timm_backbone", config.get("backbone")
    else:
        kind, timm = DEFAULT_BACKBONES[model_type], None
    if kind == "timm_backbone":
        return (
            "backbone_config",
            f"the timm backbone {timm!r}'s position tables (if any) are not served: posenc does "
            "not map timm backbones (OmDet-Turbo's default: timm's Swin, relative_index)",
            "backbone_config",
        )
    if kind in NO_POSITION_BACKBONES:
        return None
    return (
        "backbone_config",
        f"the {kind} backbone's own position tables are not served with this config: resolve "
        "its backbone_config on its own",
        "backbone_config",
    )


LEFT_OUT: dict[str, tuple[tuple[str, str, str], ...]] = {
    **{
        t: (
            (
                part,
                "the vision encoder's learned position_embedding (checkpoint weights, resampled "
                "bicubically for other tile sizes) is not served; the connector's fixed sin-cos "
                "tables are",
                key,
            ),
        )
        for t, part, key in (
            ("granite_docling", "vision_config", "vision_config"),
            ("granite_docling_vision", "position_embedding", "image_size"),
        )
    },
    **{
        t: (
            (
                "prompt_encoder_config",
                "the prompt encoder's positions are random Fourier features "
                f"({m}PositionalEmbedding.positional_embedding: a Gaussian projection matrix in "
                "the "
                "checkpoint), not a formula",
                "prompt_encoder_config",
            ),
        )
        for t, m in (("sam2", "Sam2"), ("edgetam", "EdgeTam"))
    },
    "sam3_vision_model": (
        (
            "backbone_config",
            "the ViT backbone's positions are not served with the neck's sine tables: its "
            "learned absolute positions (Sam3ViTEmbeddings.position_embeddings over the "
            "pretrain_image_size grid, tiled to the input: checkpoint weights) are not a "
            "formula, and its axial rotary (Sam3ViTRotaryEmbedding) is the sam3_vit_model "
            "config's own",
            "backbone_config",
        ),
    ),
    "kosmos-2": (
        (
            "vision_config",
            "the vision model's learned positions (checkpoint weights) are not served; only the "
            "text model's table is",
            "vision_config",
        ),
    ),
    "kosmos-2.5": (
        (
            "vision_config",
            "the vision model's learned row/column patch embeddings (checkpoint weights) are not "
            "served; only the text model's table is",
            "vision_config",
        ),
    ),
    "seamless_m4t_v2": (
        (
            "speech_encoder",
            "the conformer speech encoder's relative_key positions (distance_embedding: learned "
            "checkpoint weights over left/right_max_position_embeddings) are not served",
            "position_embeddings_type",
        ),
    ),
    "wav2vec2-conformer": (
        (
            "conv_positions",
            "the encoder's convolutional positions (pos_conv_embed: checkpoint weights) are not "
            "served; only its relative sinusoids are",
            "num_conv_pos_embeddings",
        ),
    ),
    "speecht5": (
        (
            "speech_encoder_conv_positions",
            "the speech encoder pre-net's convolutional positions (pos_conv_embed: checkpoint "
            "weights) are not served",
            "num_conv_pos_embeddings",
        ),
    ),
    "pix2struct": (
        (
            "vision_config",
            "the vision encoder's learned row/column patch embeddings (row_embedder, "
            "column_embedder: checkpoint weights) are not served; only the text decoder's "
            "buckets are",
            "vision_config",
        ),
    ),
    "tipsv2": (
        (
            "vision_config",
            "the vision encoder's learned positions (checkpoint weights) are not served; only the "
            "text encoder's table is",
            "vision_config",
        ),
    ),
    **dict.fromkeys(
        ("musicgen", "musicgen_melody"),
        (
            (
                "text_encoder",
                "the text encoder's tables are not served: resolve its text_encoder config on its "
                "own (a T5 config: t5_bias)",
                "text_encoder",
            ),
        ),
    ),
    "pp_doclayout_v2": (
        (
            "reading_order_config",
            "the reading-order model's LayoutLMv3-style 1-D and 2-D relative position bins "
            "(rel_pos_bins, max_rel_pos over token order and boxes: a learned rel_pos_bias per "
            "bin) are not served",
            "reading_order_config.rel_pos_bins",
        ),
    ),
    **dict.fromkeys(
        ("grounding-dino", "mm-grounding-dino"),
        (
            (
                "text_positions",
                "the text tokens' sine embedding (encode_sinusoidal_position_embedding of "
                "text_position_ids, 2*pi-scaled) follows each prompt's phrase boundaries "
                "(position ids restart per phrase): not a fixed table",
                "text_config",
            ),
        ),
    ),
}
"""Composite model_type -> (part, why, config key) of each part `/v1/resolve` leaves out when it
serves the others: listed in `unserved`, and noted as `not_served` on every table it returns;
`left_out` adds the backbone where it has position tables (`backbone_part`)."""


SAM2_DEFAULT_BACKBONES: dict[str, tuple[str, str | None]] = {
    **dict.fromkeys(("sam2", "sam2_vision_model"), ("sam2_hiera_det_model", None)),
    # EdgeTamVisionConfig builds timm resnet50 (its default dict also carries a misspelt
    # "archirecture": "repvit_m1", which transformers does not read).
    **dict.fromkeys(("edgetam", "edgetam_vision_model"), ("timm_wrapper", "resnet50")),
}
"""SAM 2 / EdgeTAM model types -> (backbone model_type, timm architecture) when the vision
config omits `backbone_config` (transformers 5.24 `Sam2VisionConfig` / `EdgeTamVisionConfig`)."""

CONVOLUTIONAL_TIMM = ("resnet", "repvit")
"""timm architecture name prefixes without position tables (EdgeTAM's RepViT, ResNets)."""


def sam2_backbone_part(config: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(part, why, config key) of a SAM 2 / EdgeTAM vision backbone with positions of its own
    (Hiera's learned pos_embed), None for a convolutional timm backbone (EdgeTAM's)."""
    model_type = str(config.get("model_type"))
    if model_type not in SAM2_DEFAULT_BACKBONES:
        return None
    vision = config.get("vision_config", config)
    vision = vision if isinstance(vision, Mapping) else config
    backbone = vision.get("backbone_config")
    kind, arch = SAM2_DEFAULT_BACKBONES[model_type]
    if isinstance(backbone, Mapping):
        kind = str(backbone.get("model_type") or kind)
        arch = backbone.get("architecture", arch) if kind == "timm_wrapper" else None
    key = "vision_config.backbone_config" if vision is not config else "backbone_config"
    if kind == "sam2_hiera_det_model":
        why = (
            "the Hiera backbone's learned absolute positions (pos_embed and pos_embed_window: "
            "checkpoint weights) are not a formula; the neck's sine tables are served"
        )
        return ("backbone_config", why, key)
    if kind == "timm_wrapper" and str(arch).startswith(CONVOLUTIONAL_TIMM):
        return None
    return (
        "backbone_config",
        f"the {kind} backbone {arch or ''}'s position tables (if any) are not served".replace(
            " 's", "'s"
        ),
        key,
    )


def left_out(config: Mapping[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """`LEFT_OUT` of the config's model_type, then its backbone's part (`backbone_part`,
    `sam2_backbone_part`)."""
    parts = LEFT_OUT.get(str(config.get("model_type")), ())
    backbone = backbone_part(config) or sam2_backbone_part(config)
    return parts if backbone is None else (*parts, backbone)


COMPOSITES: dict[str, Callable[[Mapping[str, Any]], list[Entry]]] = {
    **dict.fromkeys(("grounding-dino", "mm-grounding-dino"), vision.grounding_dino),
    "clap": vision.clap_audio,
    "omdet-turbo": vision.omdet_turbo,
    "granite_docling": vision.granite_docling,
    "aimv2": vision.aimv2,
    "gemma4": audio.gemma4,
}
"""Composite model_type -> the mapper of its parts outside `text_config` (given the whole
config); a refused `text_config` is then an unserved part beside them."""


def refuse(view: ConfigView) -> list[Entry]:
    """Refuses a model type of `REFUSED`, naming its encoding and why it is not mapped."""
    fail(view.key("model_type"), REFUSED[view.model_type], view.model_type)
