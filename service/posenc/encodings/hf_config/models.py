"""Per-model facts: the `MAPPERS` table from transformers `model_type` to the function that maps
that architecture family's config, with the facts where a family departs from transformers'
generic reading (`rope.RopeModel`): class defaults, pairing, layer types, NoPE layers, rotary
width, per-layer head_dim, a family's own rope_type names.

Sources: each family's transformers 5 config class (`configuration_<model>.py`: defaults and
`convert_rope_params_to_dict`) and modeling code (`modeling_<model>.py`: the rotary module).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from posenc.encodings.config_values import fail
from posenc.encodings.hf_config import text, unmapped, vision
from posenc.encodings.hf_config.rope import GENERIC_ROPE, RopeModel
from posenc.encodings.hf_config.view import ConfigView, Entry

Mapper = Callable[[ConfigView], list[Entry]]
"""Maps the config of one model family to its entries (one per table)."""

MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    # Class defaults of the transformers 5 config classes, used only for keys config.json omits.
    "llama": {"rope_theta": 10000.0, "max_position_embeddings": 2048},
    "mistral": {"rope_theta": 10000.0},
    "qwen2": {"rope_theta": 10000.0},
    "qwen3": {"rope_theta": 10000.0},
    "phi3": {"rope_theta": 10000.0, "original_max_position_embeddings": 4096},
    "gemma3_text": {
        "head_dim": 256,
        "hidden_size": 2304,
        "num_attention_heads": 8,
        "max_position_embeddings": 131072,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10000.0,
        "num_hidden_layers": 26,
        "sliding_window_pattern": 6,
    },
    "gemma4_text": {"head_dim": 256, "global_head_dim": 512, "max_position_embeddings": 131072},
    "gpt_neox": {"rotary_pct": 0.25, "rotary_emb_base": 10000.0},
    "gptj": {"rotary_dim": 64, "n_positions": 2048},
    "codegen": {"rotary_dim": 64, "n_positions": 2048},
    "deepseek_v2": {"rope_theta": 10000.0},
    "deepseek_v3": {"rope_theta": 10000.0},
    "gpt_oss": {"rope_theta": 150000.0, "head_dim": 64},
    "hunyuan_v1_dense": {"rope_theta": 10000.0},
    "hunyuan_v1_moe": {"rope_theta": 10000.0},
    "falcon": {"rope_theta": 10000.0, "alibi": False},
    "baichuan": {"rope_theta": 10000.0},
    "mpt": {"max_seq_len": 2048},
    "t5": {"relative_attention_num_buckets": 32, "relative_attention_max_distance": 128},
    "mt5": {"relative_attention_num_buckets": 32, "relative_attention_max_distance": 128},
    "umt5": {"relative_attention_num_buckets": 32, "relative_attention_max_distance": 128},
    "vit": {"image_size": 224, "patch_size": 16, "hidden_size": 768},
    "swin": {
        "image_size": 224,
        "patch_size": 4,
        "embed_dim": 96,
        "window_size": 7,
        "num_heads": [3, 6, 12, 24],
        "use_absolute_embeddings": False,
    },
    "beit": {
        "image_size": 224,
        "patch_size": 16,
        "hidden_size": 768,
        "num_attention_heads": 12,
        "use_absolute_position_embeddings": False,
        "use_relative_position_bias": False,
        "use_shared_relative_position_bias": False,
    },
    "data2vec-vision": {
        "image_size": 224,
        "patch_size": 16,
        "hidden_size": 768,
        "num_attention_heads": 12,
        "use_absolute_position_embeddings": False,
        "use_relative_position_bias": False,
        "use_shared_relative_position_bias": False,
    },
    "vit_mae": {
        "image_size": 224,
        "patch_size": 16,
        "hidden_size": 768,
        "decoder_hidden_size": 512,
    },
}

TEXT_MODEL_TYPES = {"gemma3": "gemma3_text", "gemma4": "gemma4_text"}
"""Multimodal model_type -> the model_type of its `text_config` when the latter omits it."""

INTERLEAVED_MODELS = frozenset({"gptj", "codegen"})
"""Checkpoints whose rotary pairs are (2i, 2i+1) (`rotate_every_two`)."""

MLA_INTERLEAVE_DEFAULT = {"deepseek_v2": True, "deepseek_v3": True, "minicpm3": False}
"""Pairing of multi-head latent attention models that may omit `rope_interleave`."""

NTK_ALPHA_MODELS = frozenset({"hunyuan_v1_dense", "hunyuan_v1_moe"})
"""Models whose "dynamic" rope_type with an `alpha` is fixed NTK-alpha scaling."""


class Gemma3Rope(RopeModel):
    """Gemma 3 (`Gemma3TextConfig`): v4 configs give `rope_local_base_freq` for the sliding layers
    and `rope_scaling` for the full ones; layer types follow `sliding_window_pattern`."""

    def layers(self, view: ConfigView) -> tuple[str, dict[str | None, dict[str, Any] | None]]:
        if view.has("rope_parameters"):
            return super().layers(view)
        # Gemma3TextConfig.convert_rope_params_to_dict: rope_scaling applies to full attention
        # only; sliding layers use rope_local_base_freq with the default RoPE.
        scaling = view.data.get("rope_scaling") or {}
        if not isinstance(scaling, Mapping):
            fail(view.key("rope_scaling"), "must be an object", scaling)
        full = {"rope_type": "default", **scaling}
        full.setdefault("rope_theta", view.get("rope_theta"))
        sliding = {"rope_type": "default", "rope_theta": view.get("rope_local_base_freq")}
        return view.key("rope_scaling"), {"sliding_attention": sliding, "full_attention": full}

    def declared_layer_types(self, view: ConfigView) -> list[str]:
        """config.layer_types, else every `sliding_window_pattern`-th layer full attention."""
        if isinstance(view.data.get("layer_types"), list):
            return super().declared_layer_types(view)
        pattern = int(view.number("sliding_window_pattern"))
        layers = int(view.number("num_hidden_layers"))
        return [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
        ]


class Gemma4Rope(RopeModel):
    """Gemma 4 (`Gemma4TextConfig`): full-attention layers use `global_head_dim` (unless
    `per_layer_config` says otherwise) and their own default base."""

    LAYER_THETA: ClassVar[dict[str, float]] = {
        "sliding_attention": 10000.0,
        "full_attention": 1_000_000.0,
    }

    def layer_head_dim(self, view: ConfigView, layer_type: str | None) -> int:
        if layer_type == "full_attention" and view.data.get("per_layer_config") is None:
            return int(view.number("global_head_dim"))
        return super().layer_head_dim(view, layer_type)

    def default_theta(self, view: ConfigView, layer_type: str | None) -> float:
        if layer_type is not None and layer_type in self.LAYER_THETA:
            return self.LAYER_THETA[layer_type]
        return super().default_theta(view, layer_type)


class GptNeoXRope(RopeModel):
    """GPT-NeoX (`GPTNeoXConfig`): the base is `rotary_emb_base` (never a top-level rope_theta),
    the rotary fraction `rotary_pct`."""

    def default_theta(self, view: ConfigView, layer_type: str | None) -> float:
        return float(view.number("rotary_emb_base"))

    def rotary_fraction(self, view: ConfigView) -> tuple[str, Any]:
        return view.key("rotary_pct"), view.number("rotary_pct")


class GptJRope(RopeModel):
    """GPT-J / CodeGen: `rotary_dim` channels with interleaved pairs; `create_sinusoidal_positions`
    hard-codes the base 10000."""

    def default_theta(self, view: ConfigView, layer_type: str | None) -> float:
        return 10000.0

    def rotary_dim(
        self, view: ConfigView, params: Mapping[str, Any], key: str, layer_head_dim: int
    ) -> int:
        return int(view.number("rotary_dim"))

    def interleaved(self, view: ConfigView) -> bool | None:
        return True

    def extra_notes(
        self, view: ConfigView, notes: Mapping[str, Any], interleaved: bool
    ) -> dict[str, Any]:
        layout = "embed_positions = cat(sin, cos) half width, repeat_interleave'd at apply time"
        return {"transformers_layout": layout, **super().extra_notes(view, notes, interleaved)}


class HunYuanRope(RopeModel):
    """HunYuan (`HunYuanDenseV1RotaryEmbedding`): "dynamic" with an `alpha` is a fixed NTK-alpha
    base, not length dependent."""

    def rename(self, rope_type: str, params: Mapping[str, Any]) -> str:
        rope_type = super().rename(rope_type, params)
        if rope_type == "dynamic" and params.get("alpha"):
            return "ntk_alpha"
        return rope_type


MAPPERS: dict[str, Mapper] = {
    # RoPE families whose config departs from transformers' generic reading.
    "gemma3_text": Gemma3Rope(),
    "gemma4_text": Gemma4Rope(),
    "gpt_neox": GptNeoXRope(),
    # Phi3Config.convert_rope_params_to_dict: its legacy names for LongRoPE.
    "phi3": RopeModel(rope_type_aliases={"su": "longrope", "yarn": "longrope"}),
    # GptOssConfig fills YaRN defaults when the config carries no rope parameters.
    "gpt_oss": RopeModel(
        default_parameters={
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        }
    ),
    **dict.fromkeys(INTERLEAVED_MODELS, GptJRope()),
    **dict.fromkeys(NTK_ALPHA_MODELS, HunYuanRope()),
    **{t: RopeModel(mla_interleave=v) for t, v in MLA_INTERLEAVE_DEFAULT.items()},
    # ALiBi (Falcon and Baichuan 7B fall back to RoPE).
    "bloom": text.bloom,
    "mpt": text.mpt,
    "falcon": text.falcon,
    "RefinedWeb": text.falcon,
    "RefinedWebModel": text.falcon,
    "baichuan": text.baichuan,
    # T5 relative buckets; sinusoidal tables.
    **dict.fromkeys(text.T5_MODELS, text.t5),
    "whisper": text.whisper,
    "marian": text.marian,
    "m2m_100": text.m2m100,
    # Learned absolute positions of text models: refused.
    **dict.fromkeys(text.LEARNED_MODELS, text.learned_positions),
    # Vision transformers.
    "vit": vision.vit,
    "swin": vision.swin,
    **dict.fromkeys(vision.BEIT_MODELS, vision.beit),
    "vit_mae": vision.vit_mae,
    # Non-rotary models of the nonrotary sweep (issue 24): mapped, then refused with the reason.
    "mpnet": text.mpnet,
    "pegasus": text.pegasus,
    "xglm": text.fairseq_sinusoids,
    "nllb-moe": text.fairseq_sinusoids,
    "speech_to_text": text.speech_to_text,
    "trocr": text.trocr,
    "fsmt": text.fsmt,
    **dict.fromkeys(text.MUSICGEN_MODELS, text.musicgen),
    **dict.fromkeys(text.TIME_SERIES_MODELS, text.time_series),
    "kosmos_2_text_model": text.kosmos2_text,
    **dict.fromkeys(vision.DETR_MODELS, vision.detr),
    "donut-swin": vision.swin_copy,
    "maskformer-swin": vision.swin_copy,
    **dict.fromkeys(unmapped.REFUSED, unmapped.refuse),
}
"""model_type -> its mapper; a model type not listed is read as transformers' generic RoPE
(`GENERIC_ROPE`), which refuses configs without any RoPE key unless `MODEL_DEFAULTS` knows the
class."""


def text_view(config: Mapping[str, Any]) -> ConfigView:
    """The language-model part of a config: `text_config` of multimodal configs, else the config."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        fail("model_type", "required: a transformers model_type string", model_type)
    text_config = config.get("text_config")
    if isinstance(text_config, Mapping):
        text_type = str(
            text_config.get("model_type") or TEXT_MODEL_TYPES.get(model_type, model_type)
        )
        return ConfigView(text_config, "text_config.", text_type, MODEL_DEFAULTS.get(text_type))
    return ConfigView(config, "", model_type, MODEL_DEFAULTS.get(model_type))


def entries(view: ConfigView) -> list[Entry]:
    """Every table the model needs, before validation, by its model_type's mapper."""
    return MAPPERS.get(view.model_type, GENERIC_ROPE)(view)
