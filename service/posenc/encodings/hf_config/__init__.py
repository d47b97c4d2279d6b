"""Mapping transformers `config.json` contents to specs: every position table a model needs.

`resolve_hf_config(config)` reads a config dict (the file's JSON, no hub access, no transformers
import) and returns one `NamedSpec` per distinct table, with the facts a runtime must know beside
the table in `notes`; `resolve_hf_parts(config)` (what `/v1/resolve` calls) returns the tables it
can serve and, per part it cannot, an `Unserved` (part, reason, config key). The rules reproduce
transformers 5.x (`modeling_rope_utils.py`, `RotaryEmbeddingConfigMixin.standardize_rope_params`,
each model's config class and modeling code):

| config                                        | spec                                            |
|-----------------------------------------------|-------------------------------------------------|
| v4 `rope_scaling` {`type`/`rope_type`, ...}   | `rope`; rope_type picks the scaling variant     |
| + top-level rope_theta, partial_rotary_factor | (`type` is accepted for `rope_type`)            |
| v5 `rope_parameters` {rope_theta, ...}        | the same spec (equal content keys)              |
| v5 nested {"sliding_attention": {..}, ...}    | one `rope:<layer_type>` per distinct table      |
| Gemma 3 v4 (`rope_local_base_freq`)           | sliding: default RoPE; full: `rope_scaling`     |
| `head_dim`, else hidden_size // heads         | head_dim; rotary dim from partial_rotary_factor |
| GPT-NeoX `rotary_pct`, `rotary_emb_base`      | partial rotary (default 0.25), base             |
| GPT-J / CodeGen `rotary_dim`                  | rotary_dim, base 10000, interleaved pairs       |
| MLA `qk_rope_head_dim`, `rope_interleave`     | head_dim = qk_rope_head_dim, interleaved pairs  |
| `original_max_position_embeddings`            | top-level wins (Phi-3), then the rope dict's,   |
| (llama3 / yarn / longrope)                    | then max_position_embeddings                    |
| longrope or yarn without factor               | factor = max_position_embeddings / original     |
| dynamic                                       | DynamicScaling(max_position_embeddings=...)     |
| HunYuan "dynamic" with `alpha`                | `ntk_alpha` (fixed, not length dependent)       |
| Phi-3 "su" / "yarn"                           | `longrope` (Phi3Config's legacy names)          |
| Gemma 4 `proportional`, per-layer head_dim    | `proportional`, head_dim of that layer type     |
| M-RoPE text models (Qwen2/2.5/3-VL, GLM-4V,   | `rope` (the 1-D table every axis reads) with    |
| ERNIE-4.5-VL, Omni thinkers) `mrope_section`, | notes.mrope: section, layout, pair_axes         |
| v4 `{"type": "mrope"}`                        | (`mrope.py`; position ids: `mrope_index`)       |
| HunYuan-VL `mrope_section` / `xdrope_section` | notes.mrope: layout channel_chunks, per-channel |
| (A axes, chunks of 2*s[k] channels)           | channel_axes over the full width               |
| BLOOM `n_head`                                | `alibi` slopes                                  |
| Falcon `alibi: true`                          | `alibi`, slope_scale 1/sqrt(head_dim),          |
|                                               | slope_rounding and bias_rounding bfloat16 (its  |
|                                               | build_alibi_tensor; bias='row_constant' gives   |
|                                               | FalconModel's own bias)                         |
| MPT `attn_config.alibi`, `alibi_bias_max`     | `alibi`, alibi_bias_max                         |
| Baichuan 13B (hidden 5120, 40 heads)          | `alibi` (the 7B variants are RoPE)              |
| T5, mT5, UMT5, LongT5, SwitchTransformers,    | `t5_bias:encoder` (bidirectional) and           |
| Pop2Piano `relative_attention_num_buckets`,   | `t5_bias:decoder` (causal); key_length from     |
| `relative_attention_max_distance`             | n_positions, else 512 (override per request)    |
| LongT5 `encoder_attention_type`               | as T5; notes.local_window; transient-global's   |
|                                               | side bias listed unserved                       |
| MPNet                                         | `t5_bias` (32 buckets, 128: the call's default) |
| ProphetNet `num_buckets`,                     | `t5_bias:decoder` (main stream, causal); predict|
| `relative_max_distance`                       | streams, learned positions listed unserved      |
| LayoutLMv2/v3 `rel_pos_bins`, `max_rel_pos`   | `t5_bias` (bidirectional); the 2-D spatial bias |
|                                               | and learned positions listed unserved           |
| Whisper `max_source_positions`, `d_model`     | `sinusoidal:encoder` (decoder is learned)       |
| Marian `max_position_embeddings`, `d_model`   | `sinusoidal` (marian convention, both stacks)   |
| Pegasus                                       | `sinusoidal` (marian convention, both stacks)   |
| M2M100, NLLB-MoE, XGLM `pad_token_id`         | `sinusoidal` (fairseq, padding_idx, offset 2);  |
|                                               | notes.first_row: pad + 1, XGLM's always 2       |
| XLM, FlauBERT `sinusoidal_embeddings`,        | `sinusoidal` (vaswani, float64, extra_sin);     |
| DistilBERT `sinusoidal_pos_embds`             | false (the default) is refused: learned         |
| VideoMAE `num_frames`, `tubelet_size`, patch  | `sinusoidal:encoder` / `:decoder` (vaswani,     |
| grid, `hidden_size`, `decoder_hidden_size`    | float64): get_sinusoid_encoding_table           |
| Speech2Text `max_source/target_positions`     | `sinusoidal:encoder` / `:decoder` (fairseq)     |
| FSMT; TrOCR (`use_learned_position_embeddings | `sinusoidal` (fairseq, max_position_embeddings  |
| false`)                                       | + pad + 1 rows)                                 |
| MusicGen (Melody) decoder `hidden_size`       | `sinusoidal:decoder` (tensor2tensor, cos_sin)   |
| Kosmos-2 text model `embed_dim`               | `sinusoidal` (fairseq, padding_idx, offset 2)   |
| Time Series Transformer, Informer, Autoformer | `sinusoidal` (marian convention, context_length |
|                                               | + prediction_length rows)                       |
| ViT `image_size`, `patch_size`, `hidden_size` | `learned` (hf_vit; the table by `table_key`)    |
| Swin `window_size`                            | `relative_index` (swin window)                  |
| + `use_absolute_embeddings`                   | + `learned` (timm bicubic, no antialias)        |
| BEiT / data2vec-vision relative position bias | `relative_index` (beit scheme: class token)     |
| (`use_[shared_]relative_position_bias`)       |                                                 |
| + `use_absolute_position_embeddings`          | + `learned` (hf_vit; the table by `table_key`)  |
| ViTMAE `hidden_size`, `decoder_hidden_size`   | `sinusoidal_2d:encoder` / `:decoder` (mae)      |
| DETR, conditional / Deformable DETR, Table    | `sinusoidal_2d` (detr, d_model // 2 features,   |
| Transformer `d_model`; the request's height,  | normalize; offset -0.5 in Deformable DETR)      |
| width, valid_height, valid_width              |                                                 |
| Vision towers with rotary positions (Qwen2-VL | + `vision_rope:vision` beside the text tables   |
| family, GLM-4V, MiniMax-M3-VL, Llama 4,       | (`vision_rope.TOWERS`); Pixtral and DINOv3 ViT  |
| Mistral 3 / Llava-Pixtral, Qwen Omni)         | configs are vision-only                         |
| Mask2Former `feature_size`, `hidden_dim`;     | `sinusoidal_2d` (detr, normalize, all valid):   |
| OneFormer `conv_dim`, `hidden_dim`; MaskFormer| `:pixel_decoder` / `:transformer_decoder` where |
| `decoder_config.d_model`                      | the widths differ                               |
| Grounding DINO (MM) `d_model`,                | `sinusoidal_2d` (detr, temperature); text_config|
| `positional_embedding_temperature`            | and text positions listed as unserved           |
| DAB-DETR `hidden_size`, `temperature_height`, | `sinusoidal_2d` (detr, temperature_h/_w; F =    |
| `temperature_width`                           | hidden_size / 2 a power of two)                 |
| RT-DETR (v2), D-FINE, DEIMv2, PP-DocLayout    | `sinusoidal_2d` (timm, interleave_sin_cos,      |
| `encoder_hidden_dim`, `positional_encoding_   | float64; the request's grid_height, grid_width) |
| temperature`; OmDet-Turbo (float32, columns)  | (OmDet-Turbo: reverse_coord, float32)           |
| granite_docling `vision_config`               | `sinusoidal_2d:coarse` / `:fine` (mae, no cls)  |
| CLAP `audio_config.window_size`               | `relative_index` (swin window)                  |
| PEGASUS-X, TIPSv2 text                        | `sinusoidal` (tensor2tensor, sin_cos)           |
| Kosmos-2.5 text; SeamlessM4T (v2) text and    | `sinusoidal` (fairseq, padding_idx, offset 2);  |
| text-to-unit stacks                           | `:text` / `:t2u_decoder`                        |
| Pix2Struct text `relative_attention_*`        | `t5_bias:decoder` (causal)                      |
| SpeechT5 pre-nets `max_speech_positions`,     | `sinusoidal:<pre-net>`: fairseq (speech encoder,|
| `max_text_positions`, `pad_token_id`          | text decoder), vaswani (x alpha: the others)    |
| SpeechT5 `encoder_max_relative_position`      | `relative_index:encoder` (speecht5 scheme)      |
| RT-DETR family, Mask2Former, ... `backbone_   | listed unserved only when the backbone has      |
| config`                                       | position tables (Swin, timm), not ResNet/HGNetV2|

Vision configs (transformers `modeling_vit.py`, `modeling_swin.py`, `modeling_beit.py`,
`modeling_data2vec_vision.py`, `modeling_vit_mae.py`): the patch grid is `image_size //
patch_size` per axis (ints or [h, w] pairs). A learned absolute table is checkpoint weights that no
config carries: its spec names `table_shape` and needs the uploaded table's `table_key` (or an
inline `table`) as an override; without one the mapping raises `ConfigError` naming `table_key`.
`new_grid` (learned) and `window_size` (relative_index) overrides give other resolutions.

Modules: `view.py` (the config view and the unvalidated `Entry`), `rope.py` (transformers' generic
RoPE reading; each variant's keys map in its own `rope/variants/<rope_type>.py` `from_hf`),
`text.py` (ALiBi, T5, sinusoidal and learned text models), `mrope.py` (multimodal RoPE),
`classes.py` (transformers' config classes: aliases and class defaults, as data),
`vision.py`, `vision_rope.py` (the vision towers' rotary entries; every vision rotary module of
transformers served or refused), `unmapped.py` (the
non-rotary models refused, each with its reason; `LEFT_OUT`, the parts of composite configs
served no table, listed as `Unserved` and noted as `not_served`; `COMPOSITES`, the mappers of
parts outside `text_config`), `models.py` (per-model
facts: `MAPPERS` from `model_type` to its mapper, `MODEL_DEFAULTS`) and `resolve.py`.

Multimodal configs are read through their `text_config`. `max_positions` defaults to
`max_position_embeddings` (or the model's alias for it). Keys are read through the config
class's `attribute_map` and missing keys take its class defaults (`classes.py`: generated from
transformers by `make models-data`; `MODEL_DEFAULTS` beside it), each default applied listed in
`notes["defaults_applied"]`; a class without rope parameters lends its defaults only where
`MODEL_DEFAULTS` lists it; anything that
cannot be mapped (learned absolute positions of text models, unknown rope types, unknown models
without position fields, missing required keys) raises `ConfigError` naming the key and its
value.
"""

from posenc.encodings.hf_config.models import (
    INTERLEAVED_MODELS,
    MAPPERS,
    MLA_INTERLEAVE_DEFAULT,
    MODEL_DEFAULTS,
    NTK_ALPHA_MODELS,
    TEXT_MODEL_TYPES,
)
from posenc.encodings.hf_config.resolve import (
    NamedSpec,
    Resolution,
    Unserved,
    from_hf_config,
    resolve_hf_config,
    resolve_hf_parts,
)
from posenc.encodings.hf_config.rope import ROPE_KEYS, ROPE_TYPES, SCALAR_ROPE_KEYS
from posenc.encodings.hf_config.text import LEARNED_MODELS, SLOPES_NOTE, T5_MODELS
from posenc.encodings.hf_config.vision import BEIT_MODELS

__all__ = [
    "BEIT_MODELS",
    "INTERLEAVED_MODELS",
    "LEARNED_MODELS",
    "MAPPERS",
    "MLA_INTERLEAVE_DEFAULT",
    "MODEL_DEFAULTS",
    "NTK_ALPHA_MODELS",
    "ROPE_KEYS",
    "ROPE_TYPES",
    "SCALAR_ROPE_KEYS",
    "SLOPES_NOTE",
    "T5_MODELS",
    "TEXT_MODEL_TYPES",
    "NamedSpec",
    "Resolution",
    "Unserved",
    "from_hf_config",
    "resolve_hf_config",
    "resolve_hf_parts",
]
