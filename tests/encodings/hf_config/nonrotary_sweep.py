"""Support of test_nonrotary_sweep.py: every model type of the locked transformers whose modeling
code uses a non-rotary family posenc has (`MARKERS`), the variants released checkpoints use
(`VARIANTS`), and per model type the model's own code each resolved table is compared with
(`REFERENCES`).

`python -m tests.encodings.hf_config.nonrotary_sweep --write-docs` runs every case (`verdict`) and
writes its section of `docs/models.md` (`make models-doc` runs it after the RoPE sweep's).

Sources: transformers' `models/<name>/modeling_*.py` (scanned for the markers) and
`CONFIG_MAPPING_NAMES` (model_type -> module), the reference functions and modules named below.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import json
import math
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig
from transformers.models.auto.configuration_auto import (
    CONFIG_MAPPING,
    CONFIG_MAPPING_NAMES,
    model_type_to_module_name,
)

from posenc.encodings import ConfigError, compute, parse_spec
from posenc.encodings.hf_config import NamedSpec, resolve_hf_parts
from tests.encodings.hf_config.released_nonrotary import RELEASED

MARKERS: dict[str, tuple[str, ...]] = {
    "alibi": ("build_alibi_tensor",),
    "t5_bias": (
        "relative_attention_num_buckets",
        "position_bias_num_buckets",  # CPM-Ant
        "compute_relative_buckets",  # ProphetNet
        "rel_pos_bins",  # LayoutLMv2/v3 (and PP-DocLayout V2's reading order): T5 buckets
    ),
    "sinusoidal": (
        "SinusoidalPositionalEmbedding",
        "def sinusoids",
        "def get_sinusoid_encoding_table",  # VideoMAE
        "def create_sinusoidal_embeddings",  # XLM, FlauBERT, DistilBERT (behind a flag)
        "def angle_defn",  # CTRL's positional_encoding
        "def relative_positional_encoding",  # XLNet (Transformer-XL relative sinusoids)
        "EncoderRelPositionalEncoding",  # Parakeet, Nemotron ASR
        "ConformerRelPositionalEncoding",  # FastSpeech2-Conformer
        "class PatchTSTPositionalEncoding",  # normalised sincos
        "ConformerRelPositionalEmbedding",  # wav2vec2-Conformer, SeamlessM4T (ESPnet)
        "class Gemma4AudioRelPositionalEncoding",  # Gemma 4's audio encoder
    ),
    "sinusoidal_2d": (
        "SinePositionEmbedding",
        "build_2d_sincos_position_embedding",
        "build_2d_sinusoidal_position_embedding",
    ),
    "relative_index": (
        "relative_position_index",
        "attention_bias_idxs",
        "RelativePositionalEncoding",  # SpeechT5's clipped pe_k index
    ),
}
"""family -> strings whose presence in a modeling file marks a model using that family."""

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    # tiiuae/falcon-rw-1b, falcon-rw-7b: alibi=true (tests/data/configs/tiiuae__falcon-rw-1b.json;
    # falcon+rw-7b in released_nonrotary).
    "falcon+alibi": ("falcon", {"alibi": True}),
    # google/long-t5-tglobal-*: the transient-global encoder (a second, global-block bias).
    "longt5+transient-global": ("longt5", {"encoder_attention_type": "transient-global"}),
    # XGLM reads row position + 2 whatever its padding index: a padding index other than 1.
    "xglm+pad_token_id": ("xglm", {"pad_token_id": 0}),
    # google-t5/t5-small's config.json carries n_positions=512 (tests/data/configs).
    "t5+n_positions": ("t5", {"n_positions": 512}),
    # The absolute-embedding flag at the class defaults (224 px, window 7): a hand-made variant,
    # not a release (microsoft/swin-tiny-patch4-window7-224 sets use_absolute_embeddings false,
    # tests/data/configs).
    "swin+absolute": ("swin", {"use_absolute_embeddings": True}),
    # BEiT / data2vec-vision checkpoints: relative position bias per layer
    # (microsoft/beit-base-patch16-224's config.json, tests/data/configs).
    "beit+relative": ("beit", {"use_relative_position_bias": True}),
    "data2vec-vision+relative": ("data2vec-vision", {"use_relative_position_bias": True}),
    # Two table widths: pixel decoder (feature_size // 2) and transformer decoder (hidden_dim // 2).
    "mask2former+feature_size": ("mask2former", {"feature_size": 128}),
    # apple/aimv2-large-patch14-native: the 2-D sin-cos table instead of learned positions.
    "aimv2_vision_model+native": ("aimv2_vision_model", {"is_native": True}),
    "aimv2+native": ("aimv2", {"vision_config": {"is_native": True}}),
    # The sinusoid flags of XLM, FlauBERT and DistilBERT (learned positions by default).
    "xlm+sinusoidal_embeddings": ("xlm", {"sinusoidal_embeddings": True}),
    "flaubert+sinusoidal_embeddings": ("flaubert", {"sinusoidal_embeddings": True}),
    "distilbert+sinusoidal_pos_embds": ("distilbert", {"sinusoidal_pos_embds": True}),
    # MCG-NJU/videomae-*: 16 frames, tubelet 2, 224 px, patch 16 (the class defaults); an odd
    # width and a rectangular frame as a hand-made config might have them.
    "videomae+size": (
        "videomae",
        {
            "image_size": [160, 224],
            "num_frames": 8,
            "hidden_size": 99,
            "num_attention_heads": 9,
            "decoder_hidden_size": 385,
            "decoder_num_attention_heads": 5,
        },
    ),
    # google/gemma-4-E2B, -E4B: an audio encoder (audio_config; the class default is None).
    "gemma4+audio": ("gemma4", {"audio_config": {"model_type": "gemma4_audio"}}),
    # ibm-granite/granite-timeseries-patchtst sizes (context 512, patches of 12 every 12), with the
    # class token on (its extra first row).
    "patchtst+size": (
        "patchtst",
        {"context_length": 512, "patch_length": 12, "patch_stride": 12, "use_cls_token": True},
    ),
    # Released sizes whose tables differ from the class default's (head counts, widths,
    # windows, grids): each checkpoint's config.json values and their source in
    # released_nonrotary.RELEASED.
    **{case: (r.model_type, r.config) for case, r in RELEASED.items()},
    # Time-series checkpoints set prediction_length (the class default is None).
    **{
        f"{t}+prediction_length": (t, {"prediction_length": 24})
        for t in ("time_series_transformer", "informer", "autoformer")
    },
}
"""case name -> (model_type, config keys that released checkpoints set)."""

ALTERNATIVES: dict[str, str] = {
    "falcon": "rope",  # alibi=False (the class default): rotary
    "swin+absolute": "learned",  # the learned table next to the index
    # The text sub-config of a multimodal model: its 2-D table is the vision tower's.
    "granite_docling_text": "rope",
    # Gemma 4: the text model's rotary, the vision tower's 2-D rotary (issue 17's sweeps).
    **dict.fromkeys(("gemma4", "gemma4+audio", "gemma4_text"), "rope"),
    "gemma4_vision": "vision_rope",
}
"""case -> a family the config chooses instead of (or beside) the marked one."""

NOT_SERVED: dict[str, dict[str, str]] = {
    **{
        t: {"t5_bias:spatial": "bounding-box", "learned:positions": "layout embeddings"}
        for t in ("layoutlmv2", "layoutlmv3")
    },
    "prophetnet": {
        "t5_bias:predict_streams": "predict streams",
        "learned:positions": "ProphetNetPositionalEmbeddings",
    },
    "longt5+transient-global": {"t5_bias:encoder_global": "compute_side_bias"},
    "udop": {
        "t5_bias:encoder_horizontal": "RelativePositionBiasHorizontal",
        "t5_bias:encoder_vertical": "RelativePositionBiasVertical",
    },
    # The checkpoint's learned table is not in config.json: the window index is served.
    "swin+absolute": {"learned": "table_key"},
    "granite_docling": {"vision_config": "learned position_embedding"},
    "granite_docling_vision": {"position_embedding": "learned position_embedding"},
    "kosmos-2": {"vision_config": "vision model"},
    "sam2": {"prompt_encoder_config": "random Fourier", "backbone_config": "Hiera"},
    "sam2_vision_model": {"backbone_config": "Hiera"},
    "sam3_vision_model": {"backbone_config": "Sam3ViTEmbeddings.position_embeddings"},
    "edgetam": {"prompt_encoder_config": "random Fourier"},
    "kosmos-2.5": {"vision_config": "row/column"},
    "pix2struct": {"vision_config": "row/column"},
    "tipsv2": {"vision_config": "learned positions"},
    "clap": {"text_config": "learned absolute position embeddings"},
    "aimv2+native": {"text_config": "learned absolute position embeddings"},
    "speecht5": {"speech_encoder_conv_positions": "pos_conv_embed"},
    "wav2vec2-conformer": {"conv_positions": "pos_conv_embed"},
    "seamless_m4t_v2": {"speech_encoder": "distance_embedding"},
    "omdet-turbo": {
        "text_config": "learned absolute position embeddings",
        "backbone_config": "timm backbone 'swin_tiny_patch4_window7_224'",
    },
    "musicgen": {"text_encoder": "text encoder"},
    "musicgen_melody": {"text_encoder": "text encoder"},
    **{
        t: {"backbone_config": "backbone"}
        for t in ("mask2former", "mask2former+feature_size", "maskformer", "oneformer")
    },
    # RT-DETR's ResNet and D-FINE's HGNetV2 backbones have no position table: nothing left out.
    "pp_doclayout_v2": {"reading_order_config": "rel_pos_bins"},
    **{
        t: {
            "text_config": "learned absolute position embeddings",
            "text_positions": "phrase boundaries",
            "backbone_config": "swin backbone",
        }
        for t in ("grounding-dino", "mm-grounding-dino")
    },
}
"""Composite cases served in part -> {unserved part: what its reason must name}; each table's
`not_served` note names the parts `unmapped.left_out` lists."""

UNSERVED_FAMILIES: dict[str, dict[str, str]] = {
    # The Swin backbone's window index (modeling_maskformer_swin.py; Grounding DINO's modeling
    # file names its buffers relative_position_index in the keys it ignores).
    **{
        t: {"backbone_config": "relative_index"}
        for t in ("maskformer", "grounding-dino", "mm-grounding-dino")
    },
    # The reading-order model's LayoutLMv3-style rel_pos_bins.
    "pp_doclayout_v2": {"reading_order_config": "t5_bias"},
}
"""case -> {unserved part without a family prefix: the marked family it is}: an unserved part
named "family:role" accounts for its family by name."""

EXCLUDED: dict[str, dict[str, str]] = {
    "falcon": {
        "alibi": "alibi false (the class default): rotary positions; falcon+alibi serves it"
    },
    "granite_docling_text": {
        "sinusoidal_2d": "the text sub-config alone: the 2-D tables are the vision connector's "
        "(granite_docling, granite_docling_vision serve them)"
    },
    **{
        t: {
            "sinusoidal": "Gemma4AudioRelPositionalEncoding is the audio encoder's "
            "(modeling_gemma4.py): this config has none (gemma4_audio, gemma4+audio serve it)"
        }
        for t in ("gemma4", "gemma4_text", "gemma4_vision")
    },
    "maskformer-swin": {
        "sinusoidal_2d": "MaskFormer's pixel-decoder sine table (modeling_maskformer.py): this "
        "config is the Swin backbone alone (maskformer serves the table)"
    },
}
"""case -> {marked family: why this config has no such table}: a marked family a served case
neither serves nor lists in `unserved` (the marker is code of another model type in the same
modeling directory, or of a sub-model this config does not hold)."""


def unaccounted(case: str, served: set[str], unserved_parts: list[str]) -> set[str]:
    """The marked families of `case` that its resolution neither serves, nor lists in `unserved`,
    nor `EXCLUDED` documents."""
    model_type = cases()[case][0]
    listed = {part.partition(":")[0] for part in unserved_parts}
    listed |= {UNSERVED_FAMILIES.get(case, {}).get(part, "") for part in unserved_parts}
    return set(families(model_type)) - served - listed - set(EXCLUDED.get(case, {}))


_PADDED = {"height": 13, "width": 17, "valid_height": 11, "valid_width": 14}
REQUEST: dict[str, dict[str, int]] = {
    **{
        t: _PADDED
        for t in (
            "detr",
            "conditional_detr",
            "deformable_detr",
            "table-transformer",
            "grounding-dino",
            "mm-grounding-dino",
        )
    },
    "dab-detr": _PADDED,
    # RT-DETR's AIFI table: a grid, no mask.
    **{
        t: {"grid_height": 13, "grid_width": 17}
        for t in (
            "rt_detr",
            "rt_detr_v2",
            "d_fine",
            "deimv2",
            "pp_doclayout_v2",
            "pp_doclayout_v3",
            "pp_doclayout_v4",
            "omdet-turbo",
        )
    },
    # The Mask2Former family masks nothing: every position of the feature map is valid.
    **{t: {"height": 13, "width": 17} for t in ("mask2former", "maskformer", "oneformer")},
}
"""model_type -> the request fields its tables need beside config.json (a feature map's size)."""

DEFAULT_REFUSALS: dict[str, str] = {
    "xlm": "sinusoidal_embeddings",
    "flaubert": "sinusoidal_embeddings",
    "distilbert": "sinusoidal_pos_embds",
    "aimv2_vision_model": "is_native",
    "trocr": "use_learned_position_embeddings",
    "beit": "use_relative_position_bias",
    "data2vec-vision": "use_relative_position_bias",
    "time_series_transformer": "prediction_length",
    "informer": "prediction_length",
    "autoformer": "prediction_length",
}
"""Cases of mapped model types whose config is refused -> the field the refusal must name (the
default config chooses no table, or lacks a value checkpoints set)."""

ROTARY: dict[str, str] = {
    "roformer": "RoFormerSinusoidalPositionalEmbedding feeds rotary embeddings: issue 17's RoPE "
    "sweep",
}
"""Marked model types whose sinusoids are rotary: the RoPE side's, left out of this sweep."""


@functools.cache
def marked_modules() -> dict[str, frozenset[str]]:
    """module name -> the families its modeling files mark."""
    root = Path(transformers.__file__).parent / "models"
    found: dict[str, set[str]] = {}
    for path in sorted(root.glob("*/modeling_*.py")):
        text = path.read_text()
        for family, markers in MARKERS.items():
            if any(m in text for m in markers):
                found.setdefault(path.parent.name, set()).add(family)
    return {k: frozenset(v) for k, v in found.items()}


def cases() -> dict[str, tuple[str, dict[str, Any]]]:
    """case name -> (model_type, extra config keys): every marked model type, then `VARIANTS`."""
    modules = marked_modules()
    out: dict[str, tuple[str, dict[str, Any]]] = {
        t: (t, {})
        for t in sorted(CONFIG_MAPPING_NAMES)
        if model_type_to_module_name(t) in modules and t not in ROTARY
    }
    out.update(VARIANTS)
    return out


def families(model_type: str) -> frozenset[str]:
    return marked_modules()[model_type_to_module_name(model_type)]


def hf_config(model_type: str, extra: dict[str, Any]) -> Any:
    """transformers' default config object of `model_type` with `extra` keys."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoConfig.for_model(model_type, **extra)


def _rebuilt(model_type: str, cfg: Any, changes: dict[str, Any]) -> Any:
    """`cfg` again with `changes` (sizes that do not touch the position tables, to build the
    model cheaply)."""
    keys = {
        k: v for k, v in cfg.to_dict().items() if k not in ("model_type", "transformers_version")
    }
    return hf_config(model_type, keys | changes)


def _modeling(model_type: str) -> Any:
    """The modeling module beside the model type's configuration module."""
    config_module = CONFIG_MAPPING[model_type].__module__
    return importlib.import_module(config_module.replace(".configuration_", ".modeling_"))


# ---------------------------------------------------------------------------------------------
# The model's own code, per family: each returns (ours, theirs) for one resolved table.

Pair = tuple[torch.Tensor, torch.Tensor]


def _alibi(model_type: str, cfg: Any, named: NamedSpec) -> Pair:
    ours = compute(named.spec).tensors["slopes"]
    mod = _modeling(model_type)
    mask = torch.ones(1, 2, dtype=torch.long)
    if model_type == "bloom":
        return ours, mod.build_alibi_tensor(mask, cfg.n_head, torch.float32)[:, 0, 1]
    if model_type == "falcon":
        # FalconModel.forward: causal_mask + alibi / sqrt(head_dim): the slopes (alibi at key
        # position 1) and the bias the resolved spec gives with bias="row_constant" over 2048 keys.
        heads = cfg.num_attention_heads
        root = math.sqrt(cfg.hidden_size // heads)
        slopes = mod.build_alibi_tensor(mask, heads, torch.float32)[:, 0, 1] / root
        keys = torch.ones(1, 2048, dtype=torch.long)
        bias = mod.build_alibi_tensor(keys, heads, torch.float32)[:, 0, :] / root
        fields = {
            "bias": "row_constant",
            "query_length": 1,
            "key_length": 2048,
            "masked_value": "none",
        }
        table = compute(parse_spec({**named.spec.model_dump(), **fields})).tensors["bias"][:, 0, :]
        return torch.cat([ours, table.flatten()]), torch.cat([slopes, bias.flatten()])
    if model_type == "mpt":
        # MptModel builds with alibi_bias_max=8 whatever the config says: slope * [-1, 0].
        return ours, -mod.build_mpt_alibi_tensor(cfg.n_heads, 2, alibi_bias_max=8)[:, 0, 0]
    raise AssertionError(f"{model_type}: resolved an alibi table no reference checks")


def _t5_buckets(model_type: str, cfg: Any, named: NamedSpec) -> Pair:
    ours = compute(named.spec).tensors["buckets"]
    q, k = ours.shape
    offset = named.spec.model_dump()["query_offset"]
    rel = torch.arange(k)[None, :] - torch.arange(offset, offset + q)[:, None]
    mod = _modeling(model_type)
    if model_type in ("pix2struct", "pix2struct_text_model"):
        # Pix2StructTextAttention.compute_bias: causal buckets of its own configuration.
        text = getattr(cfg, "text_config", cfg)
        module = mod.Pix2StructTextAttention(text, has_relative_attention_bias=True, layer_idx=0)
        theirs = module._relative_position_bucket(
            rel,
            bidirectional=False,
            num_buckets=module.relative_attention_num_buckets,
            max_distance=module.relative_attention_max_distance,
        )
        return ours, theirs
    if model_type in ("layoutlmv2", "layoutlmv3"):
        # The encoder's own 1-D lookup with rel_pos_bias.weight[h, b] = b: it returns the bucket.
        encoder_cls = "LayoutLMv2Encoder" if model_type == "layoutlmv2" else "LayoutLMv3Encoder"
        encoder = getattr(mod, encoder_cls)(_rebuilt(model_type, cfg, {"num_hidden_layers": 1}))
        with torch.no_grad():
            bins = torch.arange(cfg.rel_pos_bins, dtype=torch.float32)
            encoder.rel_pos_bias.weight.copy_(bins.expand_as(encoder.rel_pos_bias.weight))
            positions = torch.arange(k)[None]
            lookup = (
                encoder._calculate_1d_position_embeddings
                if model_type == "layoutlmv2"
                else encoder._cal_1d_pos_emb
            )
            theirs = lookup(positions)[0, 0]
        return ours, theirs.to(torch.int64)
    if model_type == "udop" and named.name == "t5_bias:encoder":
        # UdopStack.relative_bias's 1-D module, built by create_relative_bias from the config:
        # its own buckets over key - query sequence positions.
        (one_d,) = [b for b in mod.create_relative_bias(cfg) if type(b).__name__.endswith("1D")]
        theirs = one_d.get_bucket(attention_mask=torch.ones(1, k, dtype=torch.long))[0]
        return ours, theirs[offset : offset + q]
    if model_type == "prophetnet":
        # The decoder's main stream: compute_all_stream_relative_buckets on position ids 1..K.
        positions = torch.arange(1, k + 1)[None]
        main, _ = mod.compute_all_stream_relative_buckets(
            cfg.num_buckets, cfg.relative_max_distance, positions
        )
        return ours, main[0]
    if model_type == "mpnet":
        # MPNetEncoder.compute_position_bias(x): relative_position_bucket with its defaults.
        return ours, mod.MPNetEncoder.relative_position_bucket(rel)
    attention = next(
        getattr(mod, n)
        for n in sorted(dir(mod))
        if n.endswith("Attention") and hasattr(getattr(mod, n), "_relative_position_bucket")
    )
    # The attention module built as the model builds it: its own buckets, distance, direction.
    cfg.is_decoder = named.name.partition(":")[2] == "decoder"
    module = attention(cfg, has_relative_attention_bias=True)
    if "bidirectional" not in inspect.signature(module._relative_position_bucket).parameters:
        return ours, module._relative_position_bucket(rel)  # UMT5: reads its own attributes
    theirs = module._relative_position_bucket(
        rel,
        bidirectional=not module.is_decoder,
        num_buckets=module.relative_attention_num_buckets,
        max_distance=module.relative_attention_max_distance,
    )
    return ours, theirs


@functools.lru_cache(maxsize=2)
def _videomae_tables(config_json: str) -> dict[str, torch.Tensor]:
    """VideoMAEForPreTraining as built from the config (a JSON string: the cache's key): the
    encoder's and the decoder's fixed tables, {"encoder", "decoder"}. Built once for both roles
    of a case: its constructor computes both tables (`get_sinusoid_encoding_table`, a Python
    loop over every row and column: seconds at VideoMAE-large's width)."""
    small = {"num_hidden_layers": 1, "decoder_num_hidden_layers": 1}
    keys = {
        k: v
        for k, v in json.loads(config_json).items()
        if k not in ("model_type", "transformers_version")
    }
    model = _modeling("videomae").VideoMAEForPreTraining(hf_config("videomae", keys | small))
    encoder = model.videomae.embeddings.position_embeddings
    return {"encoder": encoder[0], "decoder": model.position_embeddings[0]}


def _sinusoidal(model_type: str, cfg: Any, named: NamedSpec) -> Pair:
    ours = compute(named.spec).tensors["embedding"]
    mod = _modeling(model_type)
    role = named.name.partition(":")[2]
    theirs: torch.Tensor
    if model_type == "whisper":
        theirs = mod.sinusoids(cfg.max_source_positions, cfg.d_model)
    elif model_type in ("marian", "pegasus"):
        cls = getattr(mod, f"{model_type.capitalize()}SinusoidalPositionalEmbedding")
        theirs = cls(cfg.max_position_embeddings, cfg.d_model, cfg.pad_token_id).create_weight()
    elif model_type in ("m2m_100", "xglm", "nllb-moe"):
        cls = {
            "m2m_100": "M2M100SinusoidalPositionalEmbedding",
            "xglm": "XGLMSinusoidalPositionalEmbedding",
            "nllb-moe": "NllbMoeSinusoidalPositionalEmbedding",
        }[model_type]
        module = getattr(mod, cls)(cfg.max_position_embeddings, cfg.d_model, cfg.pad_token_id)
        theirs = module.weights
    elif model_type == "speech_to_text":
        rows = cfg.max_source_positions if role == "encoder" else cfg.max_target_positions
        module = mod.Speech2TextSinusoidalPositionalEmbedding(rows, cfg.d_model, cfg.pad_token_id)
        theirs = module.weights
    elif model_type.startswith("musicgen"):
        dec = getattr(cfg, "decoder", cfg)
        cls = next(
            getattr(mod, n) for n in sorted(dir(mod)) if n.endswith("SinusoidalPositionalEmbedding")
        )
        theirs = cls(dec.max_position_embeddings, dec.hidden_size).weights
    elif model_type in ("time_series_transformer", "informer", "autoformer"):
        cls = next(
            getattr(mod, n) for n in sorted(dir(mod)) if n.endswith("SinusoidalPositionalEmbedding")
        )
        rows = cfg.context_length + cfg.prediction_length
        theirs = cls(rows, cfg.d_model).create_weight()
    elif model_type in ("kosmos-2", "kosmos_2_text_model"):
        text = getattr(cfg, "text_config", cfg)
        module = mod.Kosmos2TextSinusoidalPositionalEmbedding(
            text.max_position_embeddings, text.embed_dim, text.pad_token_id
        )
        theirs = module.weights
    elif model_type in ("kosmos-2.5", "kosmos_2_5_text_model"):
        text = getattr(cfg, "text_config", cfg)
        module = mod.Kosmos2_5TextSinusoidalPositionalEmbedding(
            text.max_position_embeddings, text.embed_dim, text.pad_token_id
        )
        theirs = module.weights
    elif model_type == "pegasus_x":
        rows = cfg.max_position_embeddings
        module = mod.PegasusXSinusoidalPositionalEmbedding(cfg.d_model)
        theirs = module(torch.zeros(1, rows, cfg.d_model))[0]
    elif model_type in ("tipsv2", "tipsv2_text_model"):
        text = getattr(cfg, "text_config", cfg)
        theirs = mod.Tipsv2SinusoidalPositionalEmbedding(text).weights
    elif model_type == "wav2vec2-conformer" or role == "speech_encoder":
        # <Model>ConformerRelPositionalEmbedding(config).pe: the module's whole buffer.
        cls = next(
            getattr(mod, n)
            for n in sorted(dir(mod))
            if n.endswith("ConformerRelPositionalEmbedding")
        )
        theirs = cls(cfg).pe[0]
    elif model_type in ("seamless_m4t", "seamless_m4t_v2"):
        cls = next(
            getattr(mod, n) for n in sorted(dir(mod)) if n.endswith("SinusoidalPositionalEmbedding")
        )
        if role == "text":
            module = cls(cfg.max_position_embeddings, cfg.hidden_size, cfg.pad_token_id)
        else:
            t2u_rows, t2u_pad = cfg.t2u_max_position_embeddings, cfg.t2u_pad_token_id
            module = cls(t2u_rows, cfg.hidden_size, t2u_pad)
        theirs = module.weights
    elif model_type == "speecht5":
        # The pre-nets' modules as SpeechT5 builds them (alpha left out: a checkpoint scalar).
        pad, dim = cfg.pad_token_id, cfg.hidden_size
        rows = cfg.max_speech_positions if role.startswith("speech") else cfg.max_text_positions
        if role in ("speech_decoder_prenet", "text_encoder_prenet"):
            theirs = mod.SpeechT5ScaledPositionalEncoding(0.0, dim, rows).pe[0]
        else:
            theirs = mod.SpeechT5SinusoidalPositionalEmbedding(rows + pad + 1, dim, pad).weights
    elif model_type in ("xlm", "flaubert", "distilbert"):
        # The model as built (one layer, a small vocabulary): _init_weights writes the table.
        small = {"vocab_size": 32, "n_layers": 1}
        torch.manual_seed(0)
        model_cls = {
            "xlm": "XLMModel",
            "flaubert": "FlaubertModel",
            "distilbert": "DistilBertModel",
        }
        model = getattr(mod, model_cls[model_type])(_rebuilt(model_type, cfg, small))
        embeddings = model.embeddings if model_type == "distilbert" else model
        theirs = embeddings.position_embeddings.weight.detach()
    elif model_type == "videomae":
        tables = _videomae_tables(json.dumps(cfg.to_dict(), sort_keys=True))
        theirs = tables["encoder" if role == "encoder" else "decoder"]
    elif model_type == "ctrl":
        theirs = mod.positional_encoding(cfg.n_positions, cfg.n_embd, torch.float)
    elif model_type == "xlnet":
        # XLNetModel.relative_positional_encoding(qlen, klen) without memory, batch axis dropped.
        qlen = named.spec.model_dump()["position_offset"]
        model = mod.XLNetModel(_rebuilt(model_type, cfg, {"n_layer": 1, "vocab_size": 32}))
        theirs = model.relative_positional_encoding(qlen, qlen)[:, 0]
    elif model_type in PARAKEET:
        # <Encoder>RelPositionalEncoding(encoder config) on an input of L frames.
        encoder = getattr(cfg, "encoder_config", cfg)
        module = getattr(mod, PARAKEET[model_type])(encoder)
        length = encoder.max_position_embeddings
        theirs = module(torch.zeros(1, length, 1))[0]
    elif model_type in ("fastspeech2_conformer", "fastspeech2_conformer_with_hifigan"):
        model_cfg = getattr(cfg, "model_config", cfg)
        module = mod.FastSpeech2ConformerRelPositionalEncoding(model_cfg, model_cfg.encoder_config)
        theirs = module.pos_enc[0]
    elif model_type in ("gemma4", "gemma4_audio"):
        audio = getattr(cfg, "audio_config", None) or cfg
        theirs = mod.Gemma4AudioRelPositionalEncoding(audio)(torch.zeros(1, 1, 1))[0]
    elif model_type == "patchtst":
        patches = (max(cfg.context_length, cfg.patch_length) - cfg.patch_length) // (
            cfg.patch_stride
        ) + 1
        theirs = mod.PatchTSTPositionalEncoding(cfg, patches).position_enc.detach()
    elif model_type == "fsmt":
        pad = cfg.pad_token_id
        rows = cfg.max_position_embeddings + pad + 1
        theirs = mod.SinusoidalPositionalEmbedding.get_embedding(rows, cfg.d_model, pad)
    elif model_type == "trocr":
        pad = cfg.pad_token_id
        rows = cfg.max_position_embeddings + pad + 1
        theirs = mod.TrOCRSinusoidalPositionalEmbedding(rows, cfg.hidden_size, pad).weights
    else:
        raise AssertionError(f"{model_type}: resolved a sinusoidal table no reference checks")
    return ours, theirs


PARAKEET: dict[str, str] = {
    **dict.fromkeys(
        ("parakeet_encoder", "parakeet_ctc", "parakeet_rnnt", "parakeet_tdt"),
        "ParakeetEncoderRelPositionalEncoding",
    ),
    **dict.fromkeys(
        ("nemotron_asr_streaming", "nemotron_asr_streaming_encoder"),
        "NemotronAsrStreamingEncoderRelPositionalEncoding",
    ),
}
"""Parakeet-family model types -> their relative-position module."""


def _relative_index(model_type: str, cfg: Any, named: NamedSpec) -> Pair:
    ours = compute(named.spec).tensors["index"]
    mod = _modeling(model_type)
    if model_type == "swin":
        window = (cfg.window_size, cfg.window_size)
        bias = mod.SwinRelativePositionBias(cfg.num_heads[0], window)
        return ours.reshape(-1), bias.relative_position_index
    if model_type in ("clap", "clap_audio_model"):
        audio = getattr(cfg, "audio_config", cfg)
        heads = audio.num_attention_heads[0]
        attention = mod.ClapAudioSelfAttention(audio, heads * 2, heads, audio.window_size)
        return ours, attention.relative_position_index
    if model_type in ("donut-swin", "maskformer-swin"):
        cls = (
            "DonutSwinSelfAttention"
            if model_type == "donut-swin"
            else "MaskFormerSwinSelfAttention"
        )
        heads = cfg.num_heads[0]
        attention = getattr(mod, cls)(cfg, heads * 2, heads, cfg.window_size)
        return ours, attention.relative_position_index
    if model_type == "beit":
        bias = mod.BeitRelativePositionBias(cfg)
        return ours, bias.generate_relative_position_index(bias.window_size)
    if model_type == "data2vec-vision":
        grid = (cfg.image_size // cfg.patch_size,) * 2
        bias = mod.Data2VecVisionRelativePositionBias(cfg, window_size=grid)
        return ours, bias.generate_relative_position_index(grid)
    if model_type in ("swinv2", "swin2sr"):
        # The model as built (one layer per stage): every self-attention's index and coords table
        # of this window, as one exact float64 vector (int64 index values, float32 coordinates).
        small = {"depths": [1] * len(cfg.depths)} if model_type == "swinv2" else {"depths": [1]}
        cls = "Swinv2Model" if model_type == "swinv2" else "Swin2SRModel"
        model = getattr(mod, cls)(_rebuilt(model_type, cfg, small))
        tables = compute(named.spec).tensors
        mine = torch.cat([ours.double().flatten(), tables["coords"].double().flatten()])
        built = [
            torch.cat(
                [
                    m.relative_position_index.double().flatten(),
                    m.relative_coords_table.double().flatten(),
                ]
            )
            for m in model.modules()
            if hasattr(m, "relative_coords_table") and m.relative_position_index.shape == ours.shape
        ]
        assert built, named.name
        assert all(torch.equal(b, built[0]) for b in built), named.name
        return mine, built[0]
    if model_type == "levit":
        # LevitEncoder as built: every attention_bias_idxs of the index's shape (all equal).
        encoder = mod.LevitEncoder(_rebuilt(model_type, cfg, {}))
        built = [
            m.attention_bias_idxs for m in encoder.modules() if hasattr(m, "attention_bias_idxs")
        ]
        same_shape = [b for b in built if b.shape == ours.shape]
        assert same_shape, named.name
        assert all(torch.equal(b, same_shape[0]) for b in same_shape), named.name
        return ours, same_shape[0]
    if model_type == "speecht5":
        # SpeechT5RelativePositionalEncoding itself, its pe_k rows holding their own numbers: the
        # output is the index each (query, key) pair reads.
        k = cfg.encoder_max_relative_position
        module = mod.SpeechT5RelativePositionalEncoding(1, k)
        with torch.no_grad():
            module.pe_k.weight.copy_(torch.arange(2 * k, dtype=torch.float32)[:, None])
            length = ours.shape[1]
            read = module(torch.zeros(1, length, 1))[..., 0]
        return ours, read.to(torch.int64)
    raise AssertionError(f"{model_type}: resolved a relative index no reference checks")


def _sinusoidal_2d(model_type: str, cfg: Any, named: NamedSpec) -> Pair:
    ours = compute(named.spec).tensors["embedding"]
    if model_type in REQUEST:
        # The model's own module as the model builds it, on a padded pixel mask.
        size = REQUEST[model_type]
        mod = _modeling(model_type)
        if model_type == "omdet-turbo":
            # OmDetTurboHybridEncoder's static builder: (1, H*W, D), float32.
            build = mod.OmDetTurboHybridEncoder.build_2d_sincos_position_embedding
            dim, temperature = cfg.encoder_hidden_dim, cfg.positional_encoding_temperature
            height, width = size["grid_height"], size["grid_width"]
            return ours, build(width, height, dim, temperature)[0]
        if "grid_height" in size:
            # <Model>AIFILayer's module: (1, H*W, D) in the activations' dtype.
            cls = next(
                getattr(mod, n)
                for n in sorted(dir(mod))
                if n.endswith("SinePositionEmbedding") and "AIFI" not in n
            )
            module = cls(cfg.encoder_hidden_dim, cfg.positional_encoding_temperature)
            height, width = size["grid_height"], size["grid_width"]
            cpu = torch.device("cpu")
            return ours, module(width=width, height=height, device=cpu, dtype=torch.float32)[0]
        shape = torch.Size((1, 1, size["height"], size["width"]))
        if model_type in ("mask2former", "oneformer"):
            # <Model>PixelDecoder and <Model>TransformerModule build it without a mask.
            pixel = cfg.feature_size if model_type == "mask2former" else cfg.conv_dim
            feats = {"pixel_decoder": pixel // 2, "transformer_decoder": cfg.hidden_dim // 2}
            role = named.name.partition(":")[2] or "transformer_decoder"
            cls = getattr(mod, f"{type(cfg).__name__[: -len('Config')]}SinePositionEmbedding")
            module = cls(num_position_features=feats[role], normalize=True)
            return ours, module(shape, "cpu", torch.float32)[0]
        if model_type == "maskformer":
            hidden = cfg.decoder_config.hidden_size
            module = mod.MaskFormerSinePositionEmbedding(hidden // 2, normalize=True)
            return ours, module(shape, "cpu", torch.float32)[0]
        mask = torch.zeros(1, size["height"], size["width"], dtype=torch.long)
        mask[:, : size["valid_height"], : size["valid_width"]] = 1
        if model_type == "dab-detr":
            pixels = torch.zeros(1, 3, size["height"], size["width"])
            return ours, mod.DabDetrSinePositionEmbedding(cfg)(pixels, mask)[0]
        if model_type in ("grounding-dino", "mm-grounding-dino"):
            cls = next(
                getattr(mod, n)
                for n in sorted(dir(mod))
                if n.endswith("GroundingDinoSinePositionEmbedding")
            )
            pixels = torch.zeros(1, 3, size["height"], size["width"])
            return ours, cls(cfg)(pixels, mask)[0]
        if model_type == "table-transformer":
            module = mod.build_position_encoding(cfg)
            pixels = torch.zeros(1, 3, size["height"], size["width"])
            return ours, module(pixels, mask)[0]
        cls = next(
            getattr(mod, n) for n in sorted(dir(mod)) if n.endswith("DetrSinePositionEmbedding")
        )
        module = cls(cfg.d_model // 2, normalize=True)
        shape = torch.Size((1, cfg.d_model, size["height"], size["width"]))
        return ours, module(shape=shape, device="cpu", dtype=torch.float32, mask=mask)[0]
    if model_type in ("sam2", "sam2_vision_model", "edgetam", "edgetam_vision_model"):
        # <Model>VisionNeck's module on the level's feature map (no mask), float32.
        vision = getattr(cfg, "vision_config", cfg)
        mod = _modeling(model_type)
        cls = next(getattr(mod, n) for n in sorted(dir(mod)) if n.endswith("SinePositionEmbedding"))
        module = cls(num_position_features=vision.fpn_hidden_size // 2, normalize=True)
        height, width = vision.backbone_feature_sizes[int(named.name[-1])]
        shape = torch.Size((1, vision.fpn_hidden_size, height, width))
        return ours, module(shape, "cpu", torch.float32)[0]
    if model_type == "sam3_vision_model":
        # Sam3VisionNeck as built (a narrow backbone width: the tables do not read it) on the
        # ViT grid of an image_size input: its own fpn_position_encoding of the level.
        backbone = cfg.backbone_config
        side = backbone.image_size // backbone.patch_size
        narrow = {"backbone_config": backbone.to_dict() | {"hidden_size": 32}}
        neck = _modeling(model_type).Sam3VisionNeck(_rebuilt(model_type, cfg, narrow))
        with torch.no_grad():
            _, tables = neck(torch.zeros(1, 32, side, side))
        return ours, tables[int(named.name[-1])][0]
    if model_type in ("aimv2", "aimv2_vision_model"):
        # Aimv2VisionEmbeddings.forward on the config's image size: the builder, halves swapped.
        vision = getattr(cfg, "vision_config", cfg)
        grid = vision.image_size // vision.patch_size
        mod = _modeling(model_type)
        table = mod.build_2d_sinusoidal_position_embedding(grid, grid, vision.hidden_size)
        half = table.shape[-1] // 2
        return ours, torch.cat([table[..., half:], table[..., :half]], dim=-1)
    if model_type in ("granite_docling", "granite_docling_vision"):
        # GraniteDoclingConnectorPath(config, factor).pos_embed of the coarse or fine path.
        vision = getattr(cfg, "vision_config", cfg)
        factor = vision.scale_factor if named.name.endswith("coarse") else vision.scale_factor // 2
        grid = (vision.image_size // vision.patch_size) // factor
        mod = _modeling(model_type)
        return ours, mod.GraniteDoclingPositionEmbedding(vision.out_hidden_size, grid).pos_embed
    if model_type != "vit_mae":
        raise AssertionError(f"{model_type}: resolved a 2-D table no reference checks")
    mod = _modeling(model_type)
    cfg.decoder_num_hidden_layers = 1
    embeddings = mod.ViTMAEEmbeddings(cfg)
    embeddings.initialize_weights()
    if named.name.endswith("decoder"):
        decoder = mod.ViTMAEDecoder(cfg, num_patches=embeddings.patch_embeddings.num_patches)
        return ours, decoder.decoder_pos_embed.detach()[0]
    return ours, embeddings.position_embeddings.detach()[0]


REFERENCES: dict[str, Callable[[str, Any, NamedSpec], Pair]] = {
    "alibi": _alibi,
    "t5_bias": _t5_buckets,
    "sinusoidal": _sinusoidal,
    "relative_index": _relative_index,
    "sinusoidal_2d": _sinusoidal_2d,
}
"""family -> (model_type, transformers config, resolved table) -> (ours, the model's)."""

TOLERANCE: dict[str, float] = {"alibi": 1e-6}
"""Relative tolerance per family (BLOOM and MPT build float32 slopes with torch.pow; posenc
rounds float64 slopes once); every other family, and ALiBi with Falcon's bfloat16-rounded slopes
(`slope_rounding`), is compared bit for bit."""


def _rtol(spec: Any) -> float:
    """The relative tolerance a served spec is compared with (`TOLERANCE`; 0: `torch.equal`)."""
    if getattr(spec, "slope_rounding", None) is not None:
        return 0.0
    return TOLERANCE.get(spec.kind, 0.0)


# ---------------------------------------------------------------------------------------------
# docs/models.md: the non-rotary section

FAMILY_SOURCES: tuple[tuple[str, str, str], ...] = (
    (
        "`alibi`",
        "BLOOM, MPT, Falcon (`alibi: true`)",
        "`modeling_bloom.build_alibi_tensor`, "
        "`modeling_mpt.build_mpt_alibi_tensor`, `modeling_falcon.build_alibi_tensor` (bfloat16 "
        "slopes and products: `slope_rounding`, `bias_rounding`)",
    ),
    (
        "`t5_bias`",
        "T5, mT5, UMT5, LongT5, Switch, Pop2Piano, Pix2Struct, MPNet, ProphetNet, LayoutLMv2/v3",
        "`T5Attention._relative_position_bucket` and each model's copy "
        "(`compute_all_stream_relative_buckets`, `MPNetEncoder.relative_position_bucket`, the "
        "LayoutLM encoders' 1-D `rel_pos_bias` lookup)",
    ),
    (
        "`sinusoidal` fairseq / marian / whisper / vaswani",
        "M2M100, NLLB-MoE, XGLM, FSMT, "
        "Speech2Text, TrOCR, SpeechT5, SeamlessM4T text, Marian, PEGASUS(-X), time series, "
        "Whisper, MusicGen, Kosmos-2(.5), TIPSv2, XLM / FlauBERT / DistilBERT, VideoMAE",
        "each model's `*SinusoidalPositionalEmbedding` / `create_weight` / `sinusoids` / "
        "`create_sinusoidal_embeddings` / `get_sinusoid_encoding_table`",
    ),
    ("`sinusoidal` ctrl", "CTRL", "`modeling_ctrl.positional_encoding` (`frequencies: pow`)"),
    (
        "`sinusoidal` transformer_xl, descending rows",
        "XLNet",
        "`XLNetModel.relative_positional_encoding` (`position_step: -1`)",
    ),
    (
        "`sinusoidal` parakeet, descending rows",
        "Parakeet (encoder, CTC, RNN-T, TDT), Nemotron ASR streaming",
        "`ParakeetEncoderRelPositionalEncoding`, "
        "`NemotronAsrStreamingEncoderRelPositionalEncoding`",
    ),
    (
        "`sinusoidal` espnet, descending rows",
        "FastSpeech2-Conformer, wav2vec2-Conformer, SeamlessM4T speech encoder",
        "`FastSpeech2ConformerRelPositionalEncoding.pos_enc`, "
        "`Wav2Vec2ConformerRelPositionalEmbedding.pe`, "
        "`SeamlessM4TConformerRelPositionalEmbedding.pe`",
    ),
    (
        "`sinusoidal` tensor2tensor, descending rows",
        "Gemma 4 audio encoder",
        "`Gemma4AudioRelPositionalEncoding`",
    ),
    (
        "`sinusoidal` espnet, `standardize: patchtst`",
        "PatchTST",
        "`PatchTSTPositionalEncoding._init_pe` ('sincos')",
    ),
    (
        "`sinusoidal_2d` detr",
        "DETR family, Mask2Former, MaskFormer, OneFormer, DAB-DETR, "
        "Grounding DINO, RT-DETR family, OmDet-Turbo, SAM 2 / EdgeTAM / SAM 3 necks",
        "each model's `*SinePositionEmbedding` / `build_2d_sincos_position_embedding`",
    ),
    (
        "`sinusoidal_2d` mae / timm",
        "ViTMAE, AIMv2 (native), granite_docling",
        "`build_2d_sinusoidal_position_embedding`, `GraniteDoclingPositionEmbedding`",
    ),
    (
        "`relative_index` swin / beit",
        "Swin, Donut, MaskFormer-Swin, CLAP audio, BEiT, data2vec-vision",
        "`relative_position_index` of each model's window attention",
    ),
    (
        "`relative_index` levit",
        "LeViT",
        "`LevitAttention` / `LevitAttentionSubsample.attention_bias_idxs`",
    ),
    ("`relative_index` speecht5", "SpeechT5 encoder", "`SpeechT5RelativePositionalEncoding`"),
)
"""(posenc family and convention, the model types served with it, the reference code their
tables are compared with): docs/models.md's table of families and sources."""

DOCS = Path(__file__).resolve().parents[3] / "docs" / "models.md"
HEADING = "## Non-rotary model types"


def verdict(case: str) -> tuple[str, str, list[str]]:
    """(status, detail, served table names) of one case, resolved as /v1/resolve does and each
    table of a marked family compared with the model's own code: "exact" (every table equal),
    "partial" (equal, and parts listed as unserved), "refused" (the reason), "wrong" (a table
    that differs), or "other family" (the config chose a family the RoPE sweep checks)."""
    model_type, extra = cases()[case]
    cfg = hf_config(model_type, extra)
    try:
        resolution = resolve_hf_parts(cfg.to_dict(), **REQUEST.get(model_type, {}))
    except ConfigError as err:
        problem = err.problems[0]
        return "refused", f"`{problem.field}`: {problem.message}", []
    names = [n.name for n in resolution.specs]
    compared = 0
    for named in resolution.specs:
        if named.spec.kind not in families(model_type):
            continue  # e.g. Falcon's RoPE, granite_docling's text model: the RoPE sweep's
        ours, theirs = REFERENCES[named.spec.kind](model_type, cfg, named)
        rtol = _rtol(named.spec)
        same = ours.shape == theirs.shape and (
            torch.allclose(ours, theirs.to(ours.dtype), rtol=rtol, atol=0)
            if rtol
            else torch.equal(ours, theirs.to(ours.dtype))
        )
        if not same:
            return "wrong", f"{named.name} differs from the model's own code", names
        compared += 1
    unserved = "; ".join(f"`{u.part}`: {u.reason}" for u in resolution.unserved)
    if not compared:
        kinds = sorted({n.spec.kind for n in resolution.specs})
        return "other family", f"{kinds} (the RoPE sweep's); {unserved}".rstrip("; "), names
    return ("partial" if resolution.unserved else "exact"), unserved, names


def render(results: dict[str, tuple[str, str, list[str]]]) -> str:
    """The non-rotary section of docs/models.md, from `verdict` of every case."""
    from posenc.verified import VERIFIED_AGAINST

    version = VERIFIED_AGAINST["transformers"]
    counts: dict[str, int] = {}
    for status, _, _ in results.values():
        counts[status] = counts.get(status, 0) + 1
    order = ("exact", "partial", "other family", "refused", "wrong")
    lines = [
        HEADING,
        "",
        "Generated by `make models-doc` (`python -m tests.encodings.hf_config.nonrotary_sweep "
        "--write-docs`): do not edit by hand. Every model type of transformers "
        f"{version} whose modeling code uses ALiBi, T5 buckets, sinusoids, 2-D sine tables or "
        "relative indices (`nonrotary_sweep.MARKERS`), its default config and the variants "
        "released checkpoints use (`+`), resolved as `/v1/resolve` does (tables sized by the "
        "request get the sweep's `REQUEST` fields) and each table compared with the model's own "
        "code (`tests/encodings/hf_config/test_nonrotary_sweep.py`): `exact` is bit-equal "
        "(ALiBi slopes within 1e-6); `partial` is exact for what is served, the parts left out "
        "listed (`unserved`) with the reason; `refused` names the key and why; `other family` "
        "is a config that chose a RoPE table (the table above checks it). Every family a served "
        "case's modeling files mark is served, listed in `unserved`, or documented as absent "
        "from that config (`nonrotary_sweep.EXCLUDED`).",
        "",
        f"Cases: {len(results)}; "
        + ", ".join(f"{k} {counts[k]}" for k in order if k in counts)
        + ".",
        "",
        "Families and their sources:",
        "",
        "| posenc family | served for | compared with (transformers " + version + ") |",
        "|---|---|---|",
        *(f"| {family} | {models} | {source} |" for family, models, source in FAMILY_SOURCES),
        "",
        "Released variants (`+` rows of sizes released checkpoints use): the config.json values "
        "each row carries and where they were read (`released_nonrotary.RELEASED`; the Hub is "
        "not reachable from the test machines). `file` rows copy the config.json itself and "
        "resolve, posted raw, to the same tables as the row; `code` rows take the values the "
        "checkpoint's training or conversion code sets over the config class's defaults.",
        "",
        "| case | checkpoint | values from | source |",
        "|---|---|---|---|",
        *(
            f"| {case} | {row.checkpoint if row.verified else 'unverified'} | "
            f"{'file' if row.copy else 'code'} | {row.source} |"
            for case, row in sorted(RELEASED.items())
        ),
        "",
        "| case | families | served tables | status | reason / parts not served "
        "| verified against |",
        "|---|---|---|---|---|---|",
    ]
    for case in sorted(results):
        status, detail, names = results[case]
        marked = ", ".join(sorted(families(cases()[case][0])))
        served = ", ".join(f"`{n}`" for n in names) or "-"
        detail = detail.replace("|", "\\|").replace("\n", " ") or "-"
        lines.append(
            f"| {case} | {marked} | {served} | {status} | {detail} | transformers {version} |"
        )
    return "\n".join(lines) + "\n"


def write_docs(section: str) -> None:
    """Replace (or append) the non-rotary section of docs/models.md."""
    text = DOCS.read_text(encoding="utf-8") if DOCS.exists() else ""
    head, _, _ = text.partition("\n" + HEADING + "\n")
    DOCS.write_text(head.rstrip("\n") + "\n\n" + section, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the non-rotary sweep")
    parser.add_argument("--write-docs", action="store_true", help="write docs/models.md's section")
    parser.add_argument("cases", nargs="*", help="only these cases (default: all)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    chosen = args.cases or sorted(cases())
    results = {case: verdict(case) for case in chosen}
    if args.write_docs:
        write_docs(render(results))
    for case, (status, detail, names) in results.items():
        print(f"{case}: {status} {names} {detail[:160]}", file=sys.stderr)
    return 1 if any(status == "wrong" for status, _, _ in results.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
