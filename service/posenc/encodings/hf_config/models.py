"""Per-model facts: the `MAPPERS` table from transformers `model_type` to the function that maps
that architecture family's config, with the facts where a family departs from transformers'
generic reading (`rope.RopeModel`): class defaults, pairing, layer types, NoPE layers, rotary
width, per-layer head_dim, a family's own rope_type names.

Sources: each family's transformers 5 config class (`configuration_<model>.py`: defaults and
`convert_rope_params_to_dict`) and modeling code (`modeling_<model>.py`: the rotary module).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from posenc.encodings.config_values import check_number, fail
from posenc.encodings.hf_config import audio, mrope, text, unmapped, vision, vision_rope
from posenc.encodings.hf_config.classes import config_class, transformers_version
from posenc.encodings.hf_config.rope import GENERIC_ROPE, ROPE_KEYS, RopeModel
from posenc.encodings.hf_config.view import ConfigView, Entry, head_dim

Mapper = Callable[[ConfigView], list[Entry]]
"""Maps the config of one model family to its entries (one per table)."""

_BEIT_DEFAULTS: dict[str, Any] = {
    "image_size": 224,
    "patch_size": 16,
    "hidden_size": 768,
    "num_attention_heads": 12,
    "use_absolute_position_embeddings": False,
    "use_relative_position_bias": False,
    "use_shared_relative_position_bias": False,
}

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
    "gpt_neox": {"rotary_pct": 0.25, "rotary_emb_base": 10000.0},
    "gpt_neox_japanese": {"rotary_pct": 1.0, "rotary_emb_base": 10000.0},
    "gptj": {"rotary_dim": 64, "n_positions": 2048},
    "codegen": {"rotary_dim": 64, "n_positions": 2048},
    "deepseek_v2": {"rope_theta": 10000.0},
    "deepseek_v3": {"rope_theta": 10000.0},
    "gpt_oss": {"rope_theta": 150000.0, "head_dim": 64},
    "smollm3": {"no_rope_layer_interval": 4},
    "modernbert": {"global_rope_theta": 160000.0, "local_rope_theta": 10000.0},
    "modernbert-decoder": {"global_rope_theta": 160000.0, "local_rope_theta": 10000.0},
    "llama4_text": {"no_rope_layer_interval": 4},
    "hunyuan_v1_dense": {"rope_theta": 10000.0},
    "hunyuan_v1_moe": {"rope_theta": 10000.0},
    "falcon": {"rope_theta": 10000.0, "alibi": False},
    "baichuan": {"rope_theta": 10000.0},
    "mpt": {"max_seq_len": 2048},
    "clap_audio_model": {"window_size": 8},
    "aimv2_vision_model": {
        "image_size": 224,
        "patch_size": 14,
        "hidden_size": 1024,
        "is_native": False,
    },
    "granite_docling_vision": {
        "image_size": 512,
        "patch_size": 16,
        "out_hidden_size": 1024,
        "scale_factor": 4,
    },
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
    # Data2Vec-Vision's config class has BEiT's defaults
    "beit": _BEIT_DEFAULTS,
    "data2vec-vision": _BEIT_DEFAULTS,
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

MLA_INTERLEAVE_DEFAULT = {
    "deepseek_v2": True,
    "deepseek_v3": True,
    "minicpm3": False,
    "hy_v4": False,
}
"""Pairing of multi-head latent attention models that may omit `rope_interleave`."""

MLA_ALWAYS_INTERLEAVED = frozenset(
    {
        "axk2",
        "bailing_hybrid",
        "deepseek_v32",
        "glm_moe_dsa",
        "hy_v4_vl_text",
        "longcat_flash",
    }
)
"""Multi-head latent attention families whose attention always calls
`apply_rotary_pos_emb_interleave` (whatever `rope_interleave` says), measured by the RoPE sweep."""

NTK_ALPHA_MODELS = frozenset({"hunyuan_v1_dense", "hunyuan_v1_moe"})
"""Models whose "dynamic" rope_type with an `alpha` is fixed NTK-alpha scaling."""

INTERLEAVED_PAIRS = frozenset(
    {
        "cohere",
        "cohere2",
        "glm",
        "glm4",
        "glm_ocr_text",
        "ernie4_5",
        "ernie4_5_moe",
        "ernie4_5_vl_moe_text",
        "helium",
        "openai_privacy_filter",
        # Byte Latent Transformer parts (`BltRotaryEmbedding` repeat_interleaves, its
        # rotate_half pairs x[..., ::2] with x[..., 1::2]) and PE's video encoder.
        "blt_global_transformer",
        "blt_local_decoder",
        "blt_local_encoder",
        "blt_patcher",
        "pe_video_encoder",
        # PE's audio and audio-video encoders (`apply_rotary_pos_emb` multiplies (2i, 2i+1)
        # pairs by the 2x2 rotation of cos/sin's first half: `stack_freqs`).
        "pe_audio_encoder",
        "pe_audio_video_encoder",
        # Moonshine's rotate_half pairs x[..., 0::2] with x[..., 1::2].
        "moonshine",
        "moonshine_streaming",
    }
)
"""Families whose own `apply_rotary_pos_emb` rotates (2i, 2i+1) pairs (`rotate_half` on
`x[..., 0::2]` / `x[..., 1::2]` with `repeat_interleave`d cos/sin), measured by the RoPE sweep
(tests/encodings/hf_config/test_rope_sweep.py) against transformers 5.24."""

MODULE_EMITS = {
    **dict.fromkeys(
        (
            "ernie4_5",
            "ernie4_5_moe",
            "glm",
            "glm4",
            "helium",
            "moonshine",
            "moonshine_streaming",
            "pe_video_encoder",
        ),
        "cat",
    ),
    "openai_privacy_filter": "half",
}
"""Interleaved-pair families whose rotary module does not emit `repeat_interleave(c, 2)`: "cat"
(`cat(c, c)`; their apply takes `cos[..., :d/2].repeat_interleave(2)`), "half" (half-width
cos/sin). Profile `hf` serves what the module emits (`RopeModel.module_emits`); checked against
every interleaved model type's module by tests/api/test_consumers.py."""

NOPE_RULES = {
    "afmoe": "full_attention",
    "lara_mini": "full_attention",
    "exaone4": "full_attention_when_windowed",
    "exaone_moe": "full_attention_when_windowed",
    "kolibri1": "full_attention_when_windowed",
    "flint": "windowed_only",
    "smollm3": "no_rope_layers",
    "muse_glimmer_text": "layer_rope_theta",
    "muse_spark_text": "layer_rope_theta",
}
"""Families with NoPE layers by a rule of their modeling code (`RopeModel.nope_layers`); Cohere 2
("windowed_only") is below with its interleaved pairs. Beam marks them with null rope
parameters, which every family's reading turns into NoPE layers."""

REFUSED: dict[str, str] = {
    "step3p5_vision": "Step3p5's vision tower rotates patches by their 2-D grid position "
    "(Step3p7VisionRotaryEmbedding: axial RoPE, the only rope_type it builds, head_dim/4 "
    "frequencies for each of W and H): not a 1-D table; not mapped",
    "efficientloftr": "EfficientLoFTR rotates features by their 2-D position on the coarse "
    "feature map (EfficientLoFTRRotaryEmbedding: compute_embeddings alternates row and "
    "column angles (1-based cumsum indices times inv_freq) over hidden_size/2 channels of a "
    "grid sized by each input, cos/sin repeat_interleaved in pairs): not a 1-D table; "
    "not mapped",
    "sapiens2": "Sapiens2's backbone rotates patches by their 2-D center coordinates in [-1, 1] "
    "(Sapiens2RopePositionEmbedding: head_dim/4 frequencies of rope_theta for each of H and W, "
    "from the image's patch grid, not token positions): not a 1-D table; not mapped",
}
"""Families the RoPE sweep finds posenc cannot serve exactly yet: every config is refused (a 422
naming model_type) rather than answered with a wrong table."""


MROPE_INTERLEAVED_PAIRS = frozenset(
    t
    for t in mrope.MROPE_MODELS
    if t.startswith(("glm4v", "glm_image", "glm_ocr", "ernie4_5_vl_moe", "hy_v4_vl"))
)
"""M-RoPE families whose `apply_rotary_pos_emb` rotates (2i, 2i+1) pairs (`rotate_half_llm` /
`rotate_half_text` with `repeat_interleave`d cos/sin), measured by the M-RoPE sweep."""

MROPE_REFUSED: dict[str, str] = {}
"""M-RoPE families posenc does not map: refused naming model_type, never a plain 1-D table."""


ROTARY_PARTS: dict[str, dict[str, str]] = {
    "dia": {"encoder_config": "dia_encoder", "decoder_config": "dia_decoder"},
    "t5gemma": {"encoder": "t5_gemma_module", "decoder": "t5_gemma_module"},
    "t5gemma2": {"encoder": "t5gemma2_encoder", "decoder": "t5gemma2_decoder"},
    "lasr_ctc": {"encoder_config": "lasr_encoder"},
    "blt": {
        "patcher_config": "blt_patcher",
        "encoder_config": "blt_local_encoder",
        "global_config": "blt_global_transformer",
        "decoder_config": "blt_local_decoder",
    },
    "nemotron3_diarization": {"audio_config": "nemotron3_diarization_audio"},
}
"""Composite configs whose rotary stacks are sub-configs (encoder / decoder, BLT's four
transformers, an audio encoder): config key -> the part's model_type when its dict names none
(the composite class's sub-config class). Each part is read as transformers reads that sub-config
(its own class's aliases and defaults) and served as its own tables, named by the part's key
(`rope:encoder_config`, `rope:decoder.sliding_attention`, ...); never one stack's table for all."""


def rotary_parts(view: ConfigView) -> list[Entry]:
    """The tables of each part of a composite of `ROTARY_PARTS`, each entry's role the part's
    config key (`<key>.<layer type>` for a part with tables per layer type); errors name the
    key inside the part (`decoder_config.rope_parameters`)."""
    found: list[Entry] = []
    for key, default_type in ROTARY_PARTS[view.model_type].items():
        part = view.data.get(key)
        if not isinstance(part, Mapping):
            continue
        data = dict(part)
        if not isinstance(data.get("model_type"), str) or not data["model_type"]:
            data["model_type"] = default_type
        for entry in entries(text_view(data, view.key(f"{key}."))):
            entry.role = key if entry.role is None else f"{key}.{entry.role}"
            found.append(entry)
    if not found:
        fail(view.key(next(iter(ROTARY_PARTS[view.model_type]))), "required: the rotary stacks")
    return found


class V4Refused(RopeModel):
    """A family whose config class converts v4 keys per layer type on rules posenc does not
    know: only the v5 `rope_parameters` (one dict per layer type) is mapped, or a file with no
    rope keys at all (it gets the class's own rope parameters, `classes.py`)."""

    def layers(self, view: ConfigView) -> tuple[str, dict[str | None, dict[str, Any] | None]]:
        v4_keys = ("rope_scaling", "rope_theta", "partial_rotary_factor")
        if not view.has("rope_parameters") and (
            any(view.has(k) for k in v4_keys) or view.class_default("rope_parameters") is None
        ):
            fail(
                view.key("rope_parameters"),
                f"model_type {view.model_type!r} keeps rope parameters per layer type and "
                "converts v4 rope_scaling/rope_theta with its own class defaults: give "
                "rope_parameters (transformers 5 config.json)",
                None,
            )
        return super().layers(view)


def _v4_scaling(view: ConfigView) -> Mapping[str, Any]:
    """A v4 config.json's `rope_scaling` object (empty when absent), or a failure at its key."""
    scaling = view.data.get("rope_scaling") or {}
    if not isinstance(scaling, Mapping):
        fail(view.key("rope_scaling"), "must be an object", scaling)
    return scaling


class Gemma3Rope(RopeModel):
    """Gemma 3 (`Gemma3TextConfig`): v4 configs give `rope_local_base_freq` for the sliding layers
    and `rope_scaling` for the full ones; layer types follow `sliding_window_pattern`."""

    def layers(self, view: ConfigView) -> tuple[str, dict[str | None, dict[str, Any] | None]]:
        if view.has("rope_parameters"):
            return super().layers(view)
        # Gemma3TextConfig.convert_rope_params_to_dict: rope_scaling applies to full attention
        # only; sliding layers use rope_local_base_freq with the default RoPE.
        scaling = _v4_scaling(view)
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
    """Gemma 4 (`Gemma4TextConfig`): each layer type has its own default base (its
    full-attention layers' `global_head_dim` is read as in every class that derives
    `per_layer_config` from it: `RopeModel.layer_head_dim`)."""

    LAYER_THETA: ClassVar[dict[str, float]] = {
        "sliding_attention": 10000.0,
        "full_attention": 1_000_000.0,
    }

    def default_theta(self, view: ConfigView, layer_type: str | None) -> float:
        if layer_type is not None and layer_type in self.LAYER_THETA:
            return self.LAYER_THETA[layer_type]
        return super().default_theta(view, layer_type)


class GptNeoXRope(RopeModel):
    """GPT-NeoX and GPT-NeoX-Japanese (`GPTNeoXConfig`, `GPTNeoXJapaneseConfig`): the base is
    `rotary_emb_base` (never a top-level rope_theta), the rotary fraction `rotary_pct`; their
    `convert_rope_params_to_dict` setdefaults both into the rope parameters, so a file without
    rope parameters takes them there, not the class's default parameters (0.25 / 1.0, 10000)."""

    def class_parameters(self, view: ConfigView, params: Any) -> Any:
        if not isinstance(params, Mapping):
            return params
        params = {
            **params,
            "rope_theta": self.default_theta(view, None),
            "partial_rotary_factor": self.rotary_fraction(view)[1],
        }
        view.applied[view.key("rope_parameters")] = params
        return params

    def default_theta(self, view: ConfigView, layer_type: str | None) -> float:
        return float(view.number("rotary_emb_base"))

    def rotary_fraction(self, view: ConfigView) -> tuple[str, Any]:
        return view.key("rotary_pct"), view.number("rotary_pct")


class GptJRope(RopeModel):
    """GPT-J / CodeGen: `rotary_dim` channels with interleaved pairs; `create_sinusoidal_positions`
    hard-codes the base 10000. Their config classes have no rope parameters and their rotary
    modules read none (`modeling_gptj.py`, `modeling_codegen.py`), so a file's rope keys are
    refused: scaling or a base from them would not be what the model computes."""

    UNREAD = ("rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor")

    def entries(self, view: ConfigView) -> list[Entry]:
        for key in self.UNREAD:
            found = view.present(key)
            if found is not None:
                fail(
                    view.key(found[0]),
                    f"model_type {view.model_type!r} does not read it: its rotary module "
                    "(create_sinusoidal_positions) rotates rotary_dim channels with base 10000 "
                    "and no scaling",
                    found[1],
                )
        return super().entries(view)

    def default_theta(self, view: ConfigView, layer_type: str | None) -> float:
        return 10000.0

    def rotary_dim(
        self, view: ConfigView, params: Mapping[str, Any], key: str, layer_head_dim: int
    ) -> int:
        return int(view.number("rotary_dim"))

    def interleaved(self, view: ConfigView) -> bool | None:
        return True

    def module_layout(self, view: ConfigView, interleaved: bool) -> dict[str, Any]:
        # GPTJRotaryEmbedding returns half-width (sin, cos) and apply_rotary_pos_emb repeats them.
        return {"width": "half"}

    def extra_notes(
        self, view: ConfigView, notes: Mapping[str, Any], interleaved: bool
    ) -> dict[str, Any]:
        layout = (
            "embed_positions = cat(sin, cos) half width (profile hf serves it half width), "
            "repeat_interleave'd at apply time"
        )
        return {"transformers_layout": layout, **super().extra_notes(view, notes, interleaved)}


@dataclass(frozen=True)
class LayerTypeRope(RopeModel):
    """Families whose config class keeps one rope dict per layer type and converts a v4 file
    itself (`convert_rope_params_to_dict`): `rope_scaling` updates the `scaled` layer types, and
    each type's base is its own v4 key (`theta_keys`, None: none) or the class default
    (`theta_defaults`). Olmo 3 pops `rope_theta` for full attention before sliding attention
    reads it, so its sliding layers keep the class default."""

    theta_keys: Mapping[str, str | None] = field(default_factory=dict)
    theta_defaults: Mapping[str, float] = field(default_factory=dict)
    scaled: tuple[str, ...] = ("full_attention",)

    def layers(self, view: ConfigView) -> tuple[str, dict[str | None, dict[str, Any] | None]]:
        if view.has("rope_parameters"):
            return super().layers(view)
        scaling = _v4_scaling(view)
        layers: dict[str | None, dict[str, Any] | None] = {}
        for layer_type, default in self.theta_defaults.items():
            params: dict[str, Any] = {"rope_type": "default"}
            if layer_type in self.scaled:
                params.update(scaling)
            key = self.theta_keys.get(layer_type)
            value = view.data.get(key) if key is not None else None
            params.setdefault("rope_theta", default if value is None else value)
            layers[layer_type] = params
        return view.key("rope_scaling"), layers


@dataclass(frozen=True)
class RotaryDimRope(RopeModel):
    """MiniMax-M2 (`MiniMaxM2Config`): released checkpoints give partial RoPE as `rotary_dim`,
    read as partial_rotary_factor = rotary_dim / head_dim when no factor is given."""

    def rotary_fraction(self, view: ConfigView) -> tuple[str, Any]:
        if not view.has("rotary_dim"):
            return super().rotary_fraction(view)
        rotary = check_number(view.key("rotary_dim"), view.get("rotary_dim"))
        return view.key("rotary_dim"), rotary / head_dim(view)


@dataclass(frozen=True)
class Mistral4Rope(RopeModel):
    """Mistral 4 (`Mistral4RotaryEmbedding`): the rotary width is int(head_dim *
    partial_rotary_factor) of the model's head_dim, which must be qk_rope_head_dim. Rope
    parameters without `partial_rotary_factor` take the one `Mistral4Config.__post_init__`
    setdefaults, qk_rope_head_dim / head_dim (listed in `notes.defaults_applied`)."""

    default_source: ClassVar[str] = "Mistral4Config's default"

    def rotary_dim(
        self, view: ConfigView, params: Mapping[str, Any], key: str, layer_head_dim: int
    ) -> int:
        model_head_dim = int(view.number("head_dim"))
        where = f"{key}.partial_rotary_factor"
        fraction = self.given_fraction(view, params, where, layer_head_dim, model_head_dim)
        source = "given"
        if fraction is None:
            fraction = layer_head_dim / model_head_dim
            view.applied[where] = fraction
            source = f"{self.default_source}: qk_rope_head_dim / head_dim"
        dim = int(model_head_dim * fraction)
        if dim != layer_head_dim:
            fail(
                where,
                f"{source} {fraction} rotates int(head_dim {model_head_dim} * {fraction}) = "
                f"{dim} channels, not qk_rope_head_dim {layer_head_dim}",
                fraction,
            )
        return dim

    def given_fraction(
        self,
        view: ConfigView,
        params: Mapping[str, Any],
        where: str,
        layer_head_dim: int,
        model_head_dim: int,
    ) -> float | None:
        """The file's partial_rotary_factor (the rope parameters', else the top-level one)."""
        fraction = params.get("partial_rotary_factor", view.data.get("partial_rotary_factor"))
        return None if fraction is None else check_number(where, fraction)


@dataclass(frozen=True)
class Dots3NoteRope(Mistral4Rope, V4Refused):
    """dots.3 note (`Dots3NoteTextConfig`): Mistral 4's rotary width, rope parameters per layer
    type whose v4 conversion is not mapped (only v5 `rope_parameters`). Its
    `convert_rope_params_to_dict` sets every layer type's partial_rotary_factor to
    qk_rope_head_dim / head_dim whatever the file says: a file's other value is refused (it
    would go unread), a missing one takes that (listed in `notes.defaults_applied`)."""

    default_source: ClassVar[str] = "Dots3NoteTextConfig's"

    def given_fraction(
        self,
        view: ConfigView,
        params: Mapping[str, Any],
        where: str,
        layer_head_dim: int,
        model_head_dim: int,
    ) -> float | None:
        fraction = super().given_fraction(view, params, where, layer_head_dim, model_head_dim)
        derived = layer_head_dim / model_head_dim
        if fraction is not None and fraction != derived:
            fail(
                where,
                f"Dots3NoteTextConfig.convert_rope_params_to_dict replaces it with "
                f"qk_rope_head_dim / head_dim = {layer_head_dim} / {model_head_dim} = {derived} "
                f"(transformers rotates {int(model_head_dim * derived)} channels): the file's "
                f"{fraction} would go unread; give {derived} or leave it out",
                fraction,
            )
        return fraction


@dataclass(frozen=True)
class NeoMMERope(mrope.MRopeModel, V4Refused):
    """NeoMME (`NeoMMEConfig`, `NeoMMERotaryEmbedding`): two-axis (row, column) M-RoPE with one
    table per layer type (`mrope.py`, layout "row_column"); only v5 `rope_parameters` are mapped
    (V4Refused). `convert_rope_params_to_dict` fills each layer type of `layer_types` in them:
    rope_type "default", rope_theta (the file's top-level one, else `default_theta` of the
    type), partial_rotary_factor (`default_partial_rotary_factor` of the type); each one filled
    is listed in `notes.defaults_applied`."""

    THETA: ClassVar[Mapping[str, float]] = {
        "full_attention": 1_000_000.0,
        "sliding_attention": 10_000.0,
    }
    PARTIAL: ClassVar[Mapping[str, float]] = {"full_attention": 0.25, "sliding_attention": 1.0}

    def declared_layer_types(self, view: ConfigView) -> list[str]:
        """config.layer_types, else `NeoMMEConfig.__post_init__`'s: full attention every 6th
        layer and the last, sliding attention otherwise."""
        declared = super().declared_layer_types(view)
        if declared:
            return declared
        count = int(view.number("num_hidden_layers"))
        return [
            "full_attention" if (i + 1) % 6 == 0 or i == count - 1 else "sliding_attention"
            for i in range(count)
        ]

    def layers(self, view: ConfigView) -> tuple[str, dict[str | None, dict[str, Any] | None]]:
        key, layers = super().layers(view)
        if list(layers) == [None]:
            return key, layers  # flat: refused by MRopeModel.entries
        top = view.data.get("rope_theta")
        for layer_type in dict.fromkeys(self.declared_layer_types(view)):
            params = layers.get(layer_type, {})
            if params is None:
                fail(
                    f"{key}.{layer_type}",
                    "null: NeoMMEConfig.convert_rope_params_to_dict fills every layer type's "
                    "rope parameters (a null one fails there); NeoMME has no NoPE layers",
                    None,
                )
            filled = dict(params)
            defaults = {
                "rope_type": "default",
                "rope_theta": self.THETA.get(layer_type) if top is None else top,
                "partial_rotary_factor": self.PARTIAL.get(layer_type),
            }
            for name, value in defaults.items():
                if name not in filled and value is not None:
                    filled[name] = value
                    view.applied[f"{key}.{layer_type}.{name}"] = value
            layers[layer_type] = filled
        return key, layers


POLAR_LAYOUT = (
    "the rotary module emits complex freqs_cis (P, d/2) for apply_rotary_emb, which multiplies "
    "it into view_as_complex of the (2i, 2i+1) pairs; profile hf serves its view_as_real, "
    "pairs (P, d/2, 2) = stack(real, imag): torch.view_as_complex(pairs) is freqs_cis"
)


@dataclass(frozen=True)
class PolarRope(RopeModel):
    """DeepSeek-V2 and Llama 4 build `freqs_cis = torch.polar(1, freqs) * attention_scaling` and
    rotate complex pairs (2i, 2i+1): their tables are `trig: "polar"` (torch.polar's cos/sin,
    up to 2 ulp from torch.cos/torch.sin). Their rotary module emits the complex (P, d/2)
    `freqs_cis` their `apply_rotary_emb` reads; no wire dtype is complex, so profile `hf` serves
    its `torch.view_as_real`, `pairs` (P, d/2, 2) (`profile_fields`), which
    `torch.view_as_complex` turns back into `freqs_cis` without a copy
    (`modeling_deepseek_v2.py`, `modeling_llama4.py`; tests/api/test_consumers.py)."""

    def module_layout(self, view: ConfigView, interleaved: bool) -> dict[str, Any]:
        return {}  # complex freqs_cis: profile hf's layout is in profile_fields

    def profile_fields(self, view: ConfigView) -> dict[str, dict[str, Any]] | None:
        return {**(super().profile_fields(view) or {}), "hf": {"packing": "pairs"}}

    def extra_notes(
        self, view: ConfigView, notes: Mapping[str, Any], interleaved: bool
    ) -> dict[str, Any]:
        return {
            **super().extra_notes(view, notes, interleaved),
            "transformers_layout": POLAR_LAYOUT,
        }

    def entries(self, view: ConfigView) -> list[Entry]:
        entries = super().entries(view)
        for entry in entries:
            entry.data["trig"] = "polar"
            entry.notes["trig"] = "cos/sin as torch.polar(1, angle) (transformers' freqs_cis)"
        return entries


class PhimoeRope(RopeModel):
    """Phi-3.5-MoE (`PhimoeRotaryEmbedding.forward`): LongRoPE frequencies from the short factors
    at every length (it calls the init function without a sequence length), cos/sin scaled by
    `short_mscale` up to `original_max_position_embeddings` and `long_mscale` past it. One table
    serves every length when the two scales are equal (the released checkpoint: 1.2431...): the
    short factors on both sides and the scale as `attention_factor`; unequal scales are refused."""

    def layers(self, view: ConfigView) -> tuple[str, dict[str | None, dict[str, Any] | None]]:
        key, layers = super().layers(view)
        mapped: dict[str | None, dict[str, Any] | None] = {}
        for layer_type, params in layers.items():
            if params is None or self.rope_type(params, key) != "longrope":
                mapped[layer_type] = params
                continue
            where = key if layer_type is None else f"{key}.{layer_type}"
            short, long = params.get("short_mscale"), params.get("long_mscale")
            for name, value in (("short_mscale", short), ("long_mscale", long)):
                if value is None:
                    fail(f"{where}.{name}", "required: PhimoeRotaryEmbedding scales by it", None)
                check_number(f"{where}.{name}", value)
            if short != long:
                fail(
                    f"{where}.long_mscale",
                    f"differs from short_mscale ({short}): the scale switches at "
                    "original_max_position_embeddings while the frequencies do not; not mapped",
                    long,
                )
            rest = {k: v for k, v in params.items() if k not in ("short_mscale", "long_mscale")}
            mapped[layer_type] = {
                **rest,
                "long_factor": params.get("short_factor"),
                "attention_factor": short,
            }
        return key, mapped

    def entries(self, view: ConfigView) -> list[Entry]:
        entries = super().entries(view)
        for entry in entries:
            if entry.notes.get("rope_type") == "longrope":
                entry.notes.pop("longrope_switch_point", None)
                entry.notes["longrope"] = (
                    "PhimoeRotaryEmbedding: the short factors at every length, scaled by "
                    "short_mscale == long_mscale: one table, no switch"
                )
        return entries


class Cohere2MoeRope(RopeModel):
    """Cohere 2 MoE (`Cohere2MoeAttention`): interleaved pairs; a layer rotates when it has a
    sliding window, or when `force_rope` (a dense-MLP layer while
    `prefix_dense_sliding_window_pattern == 1`); every other layer is NoPE."""

    def layers(self, view: ConfigView) -> tuple[str, dict[str | None, dict[str, Any] | None]]:
        scaling = view.data.get("rope_scaling")
        if (
            not view.has("rope_parameters")
            and isinstance(scaling, Mapping)
            and (scaling.get("rope_type") or scaling.get("type") or "default") != "default"
        ):
            fail(
                view.key("rope_scaling"),
                "Cohere 2 MoE does not scale its sliding layers by a v4 rope_scaling: give "
                "rope_parameters (transformers 5 config.json)",
                scaling,
            )
        return super().layers(view)

    def nope_layers(self, view: ConfigView) -> list[int]:
        types = self._per_layer(view, "layer_types")
        mlp_types = self._per_layer(view, "mlp_layer_types")
        windowed = view.data.get("sliding_window") is not None
        pattern = view.data.get("prefix_dense_sliding_window_pattern")
        forced = 1 if pattern is None else pattern  # the config class default
        return [
            i
            for i, layer_type in enumerate(types)
            if not (windowed and layer_type == "sliding_attention")
            and not (i < len(mlp_types) and mlp_types[i] == "dense" and forced == 1)
        ]

    @staticmethod
    def _per_layer(view: ConfigView, name: str) -> list[Any]:
        value = view.data.get(name)
        if not isinstance(value, list):
            fail(view.key(name), "a list per layer: it decides which layers rotate", value)
        return value


V4_ATTENTION_ROPE = {
    "sliding_attention": "main",
    "compressed_sparse_attention": "compress",
    "heavily_compressed_attention": "compress",
}
"""DeepSeek-V4 (`DeepseekV4Attention.rope_layer_type`): the rope_parameters key each attention
layer type rotates with ("main" for sliding_attention, "compress" for the others)."""

V4_COMPRESS_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
V4_RATIO_TYPES = {
    0: "sliding_attention",
    4: "compressed_sparse_attention",
    128: "heavily_compressed_attention",
}


class DeepseekV4Rope(RopeModel):
    """DeepSeek-V4 (`DeepseekV4Config`, `DeepseekV4RotaryEmbedding`, `apply_rotary_pos_emb` of
    transformers 5.24's modeling_deepseek_v4.py): one 1-D table per rope_parameters key ("main",
    "compress"), int(head_dim * partial_rotary_factor) = qk_rope_head_dim rotary channels with
    (2i, 2i+1) pairs; the module emits half-width cos/sin (S, d/2) that apply_rotary_pos_emb
    repeat_interleaves. Each attention layer type is served the table of its rope key
    (`V4_ATTENTION_ROPE`), named by the layer types that take it. The table spans only the
    rotary channels (head_dim = rotary_dim = qk_rope_head_dim): the model rotates the TRAILING
    qk_rope_head_dim channels of each head_dim-wide head ([nope | rope]), which notes state
    (`rotary_channels: "trailing"`), with the compressors' position rule and the output's
    de-rotation by -sin."""

    def layers(self, view: ConfigView) -> tuple[str, dict[str | None, dict[str, Any] | None]]:
        params = view.data.get("rope_parameters")
        if isinstance(params, Mapping) and all(
            isinstance(params.get(k), Mapping) for k in ("main", "compress")
        ):
            # DeepseekV4Config.__post_init__ keeps the nested dicts, drops other keys
            key = view.key("rope_parameters")
            return key, {k: dict(params[k]) for k in ("main", "compress")}
        # DeepseekV4Config.__post_init__ from a flat or v4 file: main is the default RoPE at
        # rope_theta; compress is the flat keys (YaRN) at compress_rope_theta, with
        # attention_factor 1.0 for YaRN unless given; both at partial_rotary_factor.
        if view.has("rope_parameters"):
            fail(
                view.key("rope_parameters"),
                "DeepSeek-V4 keeps rope parameters per rope key: give rope_parameters.main and "
                "rope_parameters.compress (transformers 5 config.json), or the v4 rope_scaling "
                "with rope_theta / compress_rope_theta; a flat rope_parameters is not mapped",
                params,
            )
        name = "rope_scaling"
        flat = view.data.get(name) or {}
        if not isinstance(flat, Mapping):
            fail(view.key(name), "must be an object", flat)
        fraction = self._fraction(view)
        main = {
            "rope_type": "default",
            "rope_theta": self._number(view, "rope_theta", 10000.0),
            "partial_rotary_factor": fraction,
        }
        compress = {
            **{k: v for k, v in flat.items() if k not in ("main", "compress")},
            "rope_theta": self._number(view, "compress_rope_theta", 160000.0),
            "partial_rotary_factor": fraction,
        }
        if "type" in compress and "rope_type" not in compress:
            compress["rope_type"] = compress.pop("type")
        compress.setdefault("rope_type", "default")
        if compress["rope_type"] == "yarn" and "attention_factor" not in compress:
            compress["attention_factor"] = 1.0
            view.applied[f"{view.key(name)}.compress.attention_factor"] = 1.0
        return view.key(name), {"main": main, "compress": compress}

    @staticmethod
    def _number(view: ConfigView, name: str, default: float) -> Any:
        value = view.data.get(name)
        if value is None:
            view.applied[view.key(name)] = default
            return default
        return check_number(view.key(name), value)

    def _fraction(self, view: ConfigView) -> Any:
        """The file's partial_rotary_factor, else qk_rope_head_dim / head_dim (the legacy key),
        else the class's 64 / 512."""
        if view.data.get("partial_rotary_factor") is not None:
            return check_number(
                view.key("partial_rotary_factor"), view.data["partial_rotary_factor"]
            )
        if view.data.get("qk_rope_head_dim") is not None:
            rope = check_number(view.key("qk_rope_head_dim"), view.data["qk_rope_head_dim"])
            return rope / self._model_head_dim(view)
        view.applied[view.key("partial_rotary_factor")] = 64 / 512
        return 64 / 512

    @staticmethod
    def _model_head_dim(view: ConfigView) -> int:
        return int(view.number("head_dim"))

    def declared_layer_types(self, view: ConfigView) -> list[str]:
        """DeepseekV4Config.__post_init__: layer_types, else the legacy compress_ratios (0 / 4 /
        128 per layer), else two heavily compressed layers then CSA / HCA alternating; cut to
        num_hidden_layers."""
        count = int(view.number("num_hidden_layers"))
        declared = view.data.get("layer_types")
        ratios = view.data.get("compress_ratios")
        if declared is None and ratios is not None:
            if not isinstance(ratios, list) or any(r not in V4_RATIO_TYPES for r in ratios):
                fail(view.key("compress_ratios"), "a list of 0, 4 or 128 per layer", ratios)
            declared = [V4_RATIO_TYPES[r] for r in ratios]
        if declared is None:
            declared = ["heavily_compressed_attention"] * min(count, 2) + [
                "compressed_sparse_attention" if i % 2 else "heavily_compressed_attention"
                for i in range(max(count - 2, 0))
            ]
        if not isinstance(declared, list) or any(t not in V4_ATTENTION_ROPE for t in declared):
            fail(
                view.key("layer_types"),
                f"DeepSeek-V4 layer types are {sorted(V4_ATTENTION_ROPE)}",
                declared,
            )
        return [str(t) for t in declared[:count]]

    def compress_rates(self, view: ConfigView) -> dict[str, int]:
        """DeepseekV4Config.__post_init__: compress_rates, else the class's {CSA: 4, HCA: 128},
        the legacy compress_rate_csa / compress_rate_hca folded in."""
        given = view.data.get("compress_rates")
        if given is not None and not isinstance(given, Mapping):
            fail(view.key("compress_rates"), "must be an object", given)
        rates = dict(V4_COMPRESS_RATES) if given is None else dict(given)
        for legacy, layer_type in (
            ("compress_rate_csa", "compressed_sparse_attention"),
            ("compress_rate_hca", "heavily_compressed_attention"),
        ):
            if view.data.get(legacy) is not None:
                rates[layer_type] = view.data[legacy]
        return {
            t: int(check_number(f"{view.key('compress_rates')}.{t}", rates.get(t)))
            for t in V4_COMPRESS_RATES
        }

    def rotary_dim(
        self, view: ConfigView, params: Mapping[str, Any], key: str, layer_head_dim: int
    ) -> int:
        return layer_head_dim

    def layer_head_dim(self, view: ConfigView, layer_type: str | None) -> int:
        """int(head_dim * partial_rotary_factor) of the layer's rope key (1.0 when its dict
        names none: `compute_default_rope_parameters`, `_compute_yarn_parameters`)."""
        key, layers = self.layers(view)
        rope_key = V4_ATTENTION_ROPE[str(layer_type)]
        params = layers[rope_key] or {}
        where = f"{key}.{rope_key}.partial_rotary_factor"
        fraction = check_number(where, params.get("partial_rotary_factor", 1.0))
        if not 0 < fraction <= 1:
            fail(where, "must be in (0, 1]", fraction)
        dim = int(self._model_head_dim(view) * fraction)
        if dim % 2:
            fail(where, f"gives an odd rotary dim {dim}; not mapped", fraction)
        return dim

    def interleaved(self, view: ConfigView) -> bool | None:
        return True

    def module_layout(self, view: ConfigView, interleaved: bool) -> dict[str, Any]:
        return {"width": "half"}  # DeepseekV4RotaryEmbedding: freqs.cos(), no duplication

    def profile_fields(self, view: ConfigView) -> dict[str, dict[str, Any]] | None:
        return None

    def extra_notes(
        self, view: ConfigView, notes: Mapping[str, Any], interleaved: bool
    ) -> dict[str, Any]:
        return {}

    def entries(self, view: ConfigView) -> list[Entry]:
        key, _ = self.layers(view)
        declared = self.declared_layer_types(view)
        head = self._model_head_dim(view)
        rates = self.compress_rates(view)
        entries: list[Entry] = []
        for layer_type in dict.fromkeys(declared):
            rope_key = V4_ATTENTION_ROPE[layer_type]
            one = _V4OneKey(outer=self, rope_key=rope_key, layer_type=layer_type)
            for entry in one.entries(view):
                rotary = int(entry.data["head_dim"])
                # the same notes on every table (tables with equal specs are served as one)
                entry.notes.update(
                    {
                        "rope_keys": {t: f"{key}.{V4_ATTENTION_ROPE[t]}" for t in declared},
                        "attention_rope_keys": dict(V4_ATTENTION_ROPE),
                        "rotary_channels": "trailing",
                        "model_head_dim": head,
                        "rotary_channels_detail": (
                            f"rotate the TRAILING {rotary} channels x[..., {head - rotary}:"
                            f"{head}] of each {head}-channel head ([nope | rope]); the leading "
                            f"{head - rotary} pass through (apply_rotary_pos_emb)"
                        ),
                        "transformers_layout": (
                            "DeepseekV4RotaryEmbedding emits half-width cos/sin (S, d/2) "
                            "(profile hf serves them: width 'half'); apply_rotary_pos_emb "
                            "repeat_interleaves them and rotates (2i, 2i+1) pairs"
                        ),
                        "output_derotation": (
                            "the attention output's trailing rotary channels are rotated back "
                            "with (cos, -sin) of the layer's table at the query position "
                            "(K = V carries the rotation)"
                        ),
                        "compress_rates": dict(rates),
                        "compressed_positions": (
                            "compressed_sparse_attention / heavily_compressed_attention layers' "
                            "compressor rotates compressed KV entry i of a call with the "
                            "'compress' table at position i * compress_rates[layer type] + "
                            "first_window_position; first_window_position = the entries that "
                            "layer's compressor emitted before * its compress rate (0 without "
                            "a cache); a compressed_sparse_attention layer's lightning indexer "
                            "rotates its queries at the token positions and its compressed keys "
                            "by the same rule, with the 'compress' table"
                        ),
                    }
                )
                entries.append(entry)
        if not entries:
            fail(view.key("layer_types"), "no attention layer", declared)
        return entries


@dataclass(frozen=True)
class _V4OneKey(RopeModel):
    """One DeepSeek-V4 layer type's entry through the generic reading of its rope key's dict."""

    outer: DeepseekV4Rope = field(default_factory=DeepseekV4Rope)
    rope_key: str = "main"
    layer_type: str = "sliding_attention"

    def layers(self, view: ConfigView) -> tuple[str, dict[str | None, dict[str, Any] | None]]:
        key, layers = self.outer.layers(view)
        return key, {self.layer_type: layers[self.rope_key]}

    def declared_layer_types(self, view: ConfigView) -> list[str]:
        return []

    def layer_head_dim(self, view: ConfigView, layer_type: str | None) -> int:
        return self.outer.layer_head_dim(view, layer_type)

    def rotary_dim(
        self, view: ConfigView, params: Mapping[str, Any], key: str, layer_head_dim: int
    ) -> int:
        return layer_head_dim

    def rope_theta(
        self, view: ConfigView, params: Mapping[str, Any], key: str, layer_type: str | None
    ) -> float:
        if params.get("rope_theta") is None:
            fail(f"{key}.rope_theta", "required: DeepseekV4RotaryEmbedding reads it", None)
        return super().rope_theta(view, params, key, layer_type)

    def interleaved(self, view: ConfigView) -> bool | None:
        return True

    def module_layout(self, view: ConfigView, interleaved: bool) -> dict[str, Any]:
        return {"width": "half"}

    def profile_fields(self, view: ConfigView) -> dict[str, dict[str, Any]] | None:
        return None

    def extra_notes(
        self, view: ConfigView, notes: Mapping[str, Any], interleaved: bool
    ) -> dict[str, Any]:
        return {}


class HunYuanRope(RopeModel):
    """HunYuan (`HunYuanDenseV1RotaryEmbedding`): "dynamic" with an `alpha` is a fixed NTK-alpha
    base, not length dependent."""

    def rename(self, rope_type: str, params: Mapping[str, Any]) -> str:
        rope_type = super().rename(rope_type, params)
        if rope_type == "dynamic" and params.get("alpha"):
            return "ntk_alpha"
        return rope_type


MAPPERS: dict[str, Mapper] = {
    "deepseek_v4": DeepseekV4Rope(),
    # RoPE families whose config departs from transformers' generic reading.
    "gemma3_text": Gemma3Rope(),
    "gemma4_text": Gemma4Rope(),
    **dict.fromkeys(("gpt_neox", "gpt_neox_japanese"), GptNeoXRope()),
    # Phi3Config.convert_rope_params_to_dict: its legacy names for LongRoPE.
    "phi3": RopeModel(rope_type_aliases={"su": "longrope", "yarn": "longrope"}),
    # GptOssConfig fills YaRN defaults when the config carries no rope parameters; its rotary
    # module returns half-width cos/sin (its apply splits x in halves).
    "gpt_oss": RopeModel(
        module_emits="half",
        default_parameters={
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
    ),
    **dict.fromkeys(INTERLEAVED_MODELS, GptJRope()),
    **{
        t: RopeModel(interleaved_pairs=True, module_emits=MODULE_EMITS.get(t))
        for t in (INTERLEAVED_PAIRS | MLA_ALWAYS_INTERLEAVED) - {"cohere2"}
    },
    "cohere2": RopeModel(interleaved_pairs=True, nope="windowed_only"),
    # NanoChat: half split, rotate_half = cat(x2, -x1) (rotation by -angle), in the notes.
    "nanochat": RopeModel(reversed_rotation=True),
    **{t: RopeModel(nope=rule) for t, rule in NOPE_RULES.items()},
    # Per-layer-type rope dicts and their own v4 conversion.
    "olmo3": LayerTypeRope(
        theta_keys={"sliding_attention": None, "full_attention": "rope_theta"},
        theta_defaults={"sliding_attention": 500000.0, "full_attention": 500000.0},
    ),
    **dict.fromkeys(
        ("modernbert", "modernbert-decoder"),
        LayerTypeRope(
            theta_keys={
                "sliding_attention": "local_rope_theta",
                "full_attention": "global_rope_theta",
            },
            theta_defaults={"sliding_attention": 10000.0, "full_attention": 160000.0},
            scaled=("sliding_attention", "full_attention"),
        ),
    ),
    **dict.fromkeys(
        ("gemma3n_text", "t5gemma2_text", "t5gemma2_encoder", "t5gemma2_decoder"),
        LayerTypeRope(
            theta_keys={
                "sliding_attention": "rope_local_base_freq",
                "full_attention": "rope_theta",
            },
            theta_defaults={"sliding_attention": 10000.0, "full_attention": 1_000_000.0},
        ),
    ),
    # MiMo-V2-Flash ignores v4 rope keys (its convert_rope_params_to_dict returns them
    # untouched: the class's per-layer-type defaults apply); Dory fills per-layer-type
    # defaults before converting. Only their v5 rope_parameters are mapped.
    **dict.fromkeys(("embedding_gemma2_text", "beam", "mimo_v2_flash", "dory"), V4Refused()),
    "minimax_m2": RotaryDimRope(),
    "phimoe": PhimoeRope(),
    "cohere2_moe": Cohere2MoeRope(interleaved_pairs=True),
    # Mistral Large 4: always interleaved; NoPE layers are the zeros of no_rope_layers.
    "mistral_large4_text": RopeModel(interleaved_pairs=True, nope="no_rope_layers"),
    "mistral4": Mistral4Rope(),
    # dots.3 note: the same width rule, and its attention always calls
    # apply_rotary_pos_emb_interleave (rope_interleave is not a key of its config).
    "dots3_note_text": Dots3NoteRope(interleaved_pairs=True),
    **dict.fromkeys(NTK_ALPHA_MODELS, HunYuanRope()),
    **{t: RopeModel(mla_interleave=v) for t, v in MLA_INTERLEAVE_DEFAULT.items()},
    "deepseek_v2": PolarRope(mla_interleave=True),
    # Llama 4: complex pairs; a NoPE layer every no_rope_layer_interval-th (no_rope_layers).
    "llama4_text": PolarRope(interleaved_pairs=True, nope="no_rope_layers"),
    **{t: RopeModel(refusal=why) for t, why in REFUSED.items()},
    **dict.fromkeys(ROTARY_PARTS, rotary_parts),
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
    "videomae": vision.videomae,
    **dict.fromkeys(text.XLM_SINUSOIDS, text.xlm_sinusoids),
    # Non-rotary models of the nonrotary sweep (issue 24): mapped, then refused with the reason.
    "mpnet": text.mpnet,
    "prophetnet": text.prophetnet,
    **dict.fromkeys(("layoutlmv2", "layoutlmv3"), text.layoutlm),
    "udop": text.udop,
    "pegasus": text.pegasus,
    "xglm": text.xglm,
    "nllb-moe": text.fairseq_sinusoids,
    "speech_to_text": text.speech_to_text,
    "trocr": text.trocr,
    "fsmt": text.fsmt,
    **dict.fromkeys(text.MUSICGEN_MODELS, text.musicgen),
    **dict.fromkeys(text.TIME_SERIES_MODELS, text.time_series),
    **dict.fromkeys(("kosmos_2_text_model", "kosmos_2_5_text_model"), text.kosmos2_text),
    "pegasus_x": text.pegasus_x,
    "tipsv2_text_model": text.tipsv2_text,
    "pix2struct_text_model": text.pix2struct_text,
    **dict.fromkeys(("seamless_m4t", "seamless_m4t_v2"), text.seamless_m4t),
    "speecht5": text.speecht5,
    "ctrl": text.ctrl,
    "xlnet": text.xlnet,
    "patchtst": text.patchtst,
    **dict.fromkeys((*audio.PARAKEET_ENCODERS, *audio.PARAKEET_MODELS), audio.parakeet),
    **dict.fromkeys(
        ("fastspeech2_conformer", "fastspeech2_conformer_with_hifigan"), audio.fastspeech2_conformer
    ),
    "wav2vec2-conformer": audio.wav2vec2_conformer,
    "gemma4_audio": audio.gemma4_audio,
    **dict.fromkeys(vision.DETR_MODELS, vision.detr),
    **dict.fromkeys(("mask2former", "oneformer"), vision.mask2former),
    "maskformer": vision.maskformer,
    **dict.fromkeys(vision.RT_DETR_MODELS, vision.rt_detr),
    "dab-detr": vision.dab_detr,
    "granite_docling_vision": vision.granite_docling_vision,
    "aimv2_vision_model": vision.aimv2_vision,
    "donut-swin": vision.swin_copy,
    "levit": vision.levit,
    **dict.fromkeys(("swinv2", "swin2sr"), vision.swinv2),
    **dict.fromkeys(vision.SAM2_NECKS, vision.sam2_neck),
    "sam3_vision_model": vision.sam3_neck,
    "maskformer-swin": vision.swin_copy,
    # Vision-only towers with rotary positions: their tables are vision_rope entries.
    **dict.fromkeys(vision_rope.VISION_ONLY, vision_rope.no_text),
    "clap_audio_model": vision.swin_copy,
    **dict.fromkeys(unmapped.REFUSED, unmapped.refuse),
    # Multimodal RoPE text models (issue 18): the 1-D table plus notes["mrope"].
    **{
        t: mrope.MRopeModel(interleaved_pairs=t in MROPE_INTERLEAVED_PAIRS, facts=facts)
        for t, facts in mrope.MROPE_MODELS.items()
    },
    **{t: RopeModel(refusal=why) for t, why in MROPE_REFUSED.items()},
    "neomme": NeoMMERope(facts=mrope.MROPE_MODELS["neomme"]),
    **dict.fromkeys(mrope.OMNI_THINKERS, lambda view: omni_thinker(view)),
}
"""model_type -> its mapper; a model type not listed is read as transformers' generic RoPE
(`GENERIC_ROPE`), which refuses configs without any RoPE key unless `MODEL_DEFAULTS` knows the
class."""


def class_view(data: Mapping[str, Any], prefix: str, model_type: str) -> ConfigView:
    """`data` read as transformers reads a config of `model_type`: its class's `attribute_map`
    (`classes.config_class`, generated from transformers) and class defaults. A class with rope
    parameters takes its generated defaults over `MODEL_DEFAULTS` (which fills keys the data
    does not cover); any other class has defaults only when `MODEL_DEFAULTS` lists it (a model
    type is then known to have position fields), the hand-listed values winning."""
    cls = config_class(model_type)
    hand = MODEL_DEFAULTS.get(model_type)
    defaults: dict[str, Any] | None = None
    if cls is not None and cls.rotary:
        defaults = {**(hand or {}), **cls.defaults}
    elif hand is not None:
        defaults = {**(cls.defaults if cls is not None else {}), **hand}
    aliases = cls.attribute_map if cls is not None else None
    return ConfigView(data, prefix, model_type, defaults, aliases)


def text_view(config: Mapping[str, Any], prefix: str = "") -> ConfigView:
    """The language-model part of a config: `text_config` of multimodal configs, else the config
    (`prefix`: the config's own key path in the file, for a part of a composite)."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        fail(f"{prefix}model_type", "required: a transformers model_type string", model_type)
    text_config = config.get("text_config")
    if isinstance(text_config, Mapping):
        text_type = str(
            text_config.get("model_type") or TEXT_MODEL_TYPES.get(model_type, model_type)
        )
        composite = config_class(model_type)
        laid = {
            k: v
            for k, v in (composite.text_config_defaults if composite is not None else {}).items()
            if k not in text_config
        }
        view = class_view({**laid, **text_config}, f"{prefix}text_config.", text_type)
        # the composite class's own defaults for its text part (Voxtral's rope_theta)
        view.applied.update({view.key(k): v for k, v in laid.items()})
        return view
    return class_view(config, prefix, model_type)


def omni_thinker(view: ConfigView) -> list[Entry]:
    """Qwen2.5-Omni / Qwen3-Omni-MoE: the language model is `thinker_config.text_config` (the
    talker's and the audio/vision towers' positions are not served)."""
    thinker = view.data.get("thinker_config")
    text_config = thinker.get("text_config") if isinstance(thinker, Mapping) else None
    if not isinstance(text_config, Mapping):
        fail(view.key("thinker_config.text_config"), "required: the thinker's text config", None)
    default_type = mrope.OMNI_THINKERS[view.model_type]
    text_type = str(text_config.get("model_type") or default_type)
    inner = class_view(text_config, view.key("thinker_config.text_config."), text_type)
    return entries(inner)


def entries(view: ConfigView) -> list[Entry]:
    """Every table the model needs, before validation, by its model_type's mapper."""
    mapper = MAPPERS.get(view.model_type)
    if mapper is not None:
        return mapper(view)
    if not view.has_class_defaults and view.data.get("model_type") == view.model_type:
        not_rotary(view)
    return GENERIC_ROPE(view)


def not_rotary(view: ConfigView) -> None:
    """Refuse a model_type transformers knows whose config class declares no rope parameters
    (`classes.ConfigClass.rotary` False) and that no mapper or `MODEL_DEFAULTS` entry reads:
    its model does not read `rope_parameters`, `rope_theta` or `rope_scaling` (a vision tower
    such as GLM-Image's or HunYuan-VL's adds interpolated learned positions, RoFormer, CLVP and
    wav2vec2-BERT rotate by a fixed base, Moshi's depth decoder has none), so generic RoPE read
    from a hand-added key would be accepted and wrong. Source: the generated class data
    (`transformers_classes.json`) and each family's `modeling_<model>.py`.

    A `text_config` without its own model_type is read as generic RoPE as before (transformers
    builds the composite's default text class from it)."""
    cls = config_class(view.model_type)
    if cls is None:
        return
    named = f"model_type {view.model_type!r} ({cls.name}, transformers {transformers_version()})"
    found = next((f for k in ROPE_KEYS if (f := view.present(k)) is not None), None)
    if found is not None:
        fail(
            view.key(found[0]),
            f"{named} declares no rope parameters: its model does not read rope_parameters, "
            "rope_theta or rope_scaling, so a RoPE table built from this key would not be what "
            "it computes; its position encoding is not mapped",
            found[1],
        )
    fail(
        view.key("model_type"),
        f"{named} has no rope parameters and its position encoding (if any) is not mapped: "
        "no alibi, relative-bias or sinusoidal fields posenc reads",
        view.model_type,
    )
