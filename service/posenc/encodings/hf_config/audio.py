"""Speech encoders' relative sinusoids (Transformer-XL style: one row per relative distance,
descending), served as `sinusoidal` tables with `position_step` -1: Parakeet and Nemotron ASR
(`parakeet` convention), the ESPnet conformers of FastSpeech2-Conformer, wav2vec2-Conformer and
SeamlessM4T's speech encoder (`espnet`), Gemma 4's audio encoder (`tensor2tensor`).

Sources (transformers 5.24): `models/parakeet/modeling_parakeet.py`
(`ParakeetEncoderRelPositionalEncoding.forward`: distances L-1..-(L-1) of an input of L frames),
`models/nemotron_asr_streaming/modeling_nemotron_asr_streaming.py` (the same module),
`models/fastspeech2_conformer/modeling_fastspeech2_conformer.py`
(`FastSpeech2ConformerRelPositionalEncoding.extend_pos_enc`, max_len 5000),
`models/wav2vec2_conformer/modeling_wav2vec2_conformer.py` and
`models/seamless_m4t/modeling_seamless_m4t.py` (`*ConformerRelPositionalEmbedding.extend_pe`,
max_len = max_source_positions), `models/gemma4/modeling_gemma4.py`
(`Gemma4AudioRelPositionalEncoding`: distances context_size // 2 .. 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc.encodings.config_values import fail
from posenc.encodings.errors import ConfigError
from posenc.encodings.hf_config.view import ConfigView, Entry

ESPNET_MAX_LEN = 5000
"""FastSpeech2ConformerRelPositionalEncoding.max_len (a constant of the module, not a key)."""

PARAKEET_ENCODERS: dict[str, str] = {
    "parakeet_encoder": "ParakeetEncoderRelPositionalEncoding",
    "nemotron_asr_streaming_encoder": "NemotronAsrStreamingEncoderRelPositionalEncoding",
}
"""Encoder model_type -> its relative-position module (the same math)."""

PARAKEET_MODELS: dict[str, str] = {
    "parakeet_ctc": "parakeet_encoder",
    "parakeet_rnnt": "parakeet_encoder",
    "parakeet_tdt": "parakeet_encoder",
    "nemotron_asr_streaming": "nemotron_asr_streaming_encoder",
}
"""Composite model_type -> the model_type of its `encoder_config` (the class default)."""

_RELATIVE_USE = (
    "row r is the relative distance position_offset - r (query minus key, descending); an input "
    "of L <= {length} frames reads the middle 2L - 1 rows, r = {length} - L .. {length} + L - 2 "
    "(distances L-1..-(L-1)); for other lengths pass position_offset=L-1, max_positions=2L-1"
)


def _relative(
    dim: int, length: int, convention: str, role: str | None, notes: dict[str, Any]
) -> Entry:
    """A descending table of the distances length-1 .. -(length-1) (2 * length - 1 rows)."""
    data = {
        "kind": "sinusoidal",
        "dim": dim,
        "max_positions": 2 * length - 1,
        "position_offset": length - 1,
        "position_step": -1,
        "convention": convention,
    }
    return Entry("sinusoidal", role, data, {**notes, "rows": _RELATIVE_USE.format(length=length)})


def _sub_view(view: ConfigView, key: str, model_type: str) -> ConfigView:
    """The sub-config `key` of a composite (its model_type read from it, else `model_type`)."""
    sub = view.data.get(key)
    if not isinstance(sub, Mapping):
        fail(view.key(key), "required: the encoder's config", sub)
    return ConfigView(sub, view.key(f"{key}."), str(sub.get("model_type") or model_type), None)


def parakeet(view: ConfigView) -> list[Entry]:
    """Parakeet (CTC, RNN-T, TDT, the bare encoder) and Nemotron ASR streaming:
    `<Encoder>RelPositionalEncoding.forward` of an input of L frames, distances L-1..-(L-1),
    inv_freq = 1.0 / (10000 ** (arange(0, hidden_size, 2) / hidden_size)) in float32, interleaved
    [sin, cos] (the `parakeet` convention), L = max_position_embeddings by default."""
    encoder = view
    if view.model_type in PARAKEET_MODELS:
        encoder = _sub_view(view, "encoder_config", PARAKEET_MODELS[view.model_type])
    module = PARAKEET_ENCODERS.get(encoder.model_type, PARAKEET_ENCODERS["parakeet_encoder"])
    length = int(encoder.number("max_position_embeddings"))
    notes = {
        "transformers": f"{module}(config)(hidden_states): (B, 2L - 1, hidden_size), cast to the "
        "activations' dtype; each layer projects it by its learned relative_k_proj and adds "
        "bias_u / bias_v (checkpoint weights), then _rel_shift",
        "length": f"L = max_position_embeddings = {length} (the longest input "
        + (
            "the encoder accepts: longer raises)"
            if encoder.model_type == "nemotron_asr_streaming_encoder"
            else "the config names; the module itself takes any length)"
        ),
    }
    return [_relative(int(encoder.number("hidden_size")), length, "parakeet", None, notes)]


def fastspeech2_conformer(view: ConfigView) -> list[Entry]:
    """FastSpeech2-Conformer (and its with-HiFi-GAN wrapper, `model_config`): the encoder's and
    the decoder's `FastSpeech2ConformerRelPositionalEncoding(config, module_config)`, one buffer
    of the distances 4999..-4999 (max_len 5000, hidden_size wide; `espnet` convention)."""
    model = view
    if view.model_type == "fastspeech2_conformer_with_hifigan":
        model = _sub_view(view, "model_config", "fastspeech2_conformer")
    notes = {
        "transformers": "FastSpeech2ConformerRelPositionalEncoding.pos_enc (extend_pos_enc over "
        f"max_len {ESPNET_MAX_LEN}; inputs longer than that rebuild it with the same rows around "
        "its centre); forward slices the centre 2L - 1 rows; the encoder and the decoder build "
        "the same table; the attention projects it by its learned linear_pos and adds "
        "pos_bias_u / pos_bias_v (checkpoint weights)",
    }
    dim = int(model.number("hidden_size"))
    return [_relative(dim, ESPNET_MAX_LEN, "espnet", None, notes)]


def conformer_relative(view: ConfigView, role: str | None, module: str) -> Entry:
    """wav2vec2-Conformer / SeamlessM4T speech encoder with position_embeddings_type
    'relative': `<Model>ConformerRelPositionalEmbedding.pe`, the distances max_source_positions-1
    .. -(max_source_positions-1), hidden_size wide (`espnet` convention)."""
    length = int(view.number("max_source_positions"))
    notes = {
        "transformers": f"{module}.pe (extend_pe over max_source_positions = {length}; longer "
        "inputs rebuild it with the same rows around its centre); forward slices the centre "
        "2L - 1 rows; each layer projects it by its learned linear_pos and adds pos_bias_u / "
        "pos_bias_v (checkpoint weights)",
    }
    return _relative(int(view.number("hidden_size")), length, "espnet", role, notes)


def wav2vec2_conformer(view: ConfigView) -> list[Entry]:
    """wav2vec2-Conformer: the relative sinusoids of position_embeddings_type 'relative' (the
    class default); its convolutional positions (pos_conv_embed, every type) are listed unserved
    (`unmapped.LEFT_OUT`). 'rotary' and None are refused naming the key."""
    kind = view.get("position_embeddings_type")
    if kind != "relative":
        fail(
            view.key("position_embeddings_type"),
            f"{kind!r}: "
            + (
                "Wav2Vec2ConformerRotaryPositionalEmbedding (rotary over hidden_size // "
                "num_attention_heads with rotary_embedding_base, applied by the conformer's own "
                "self-attention) is not mapped"
                if kind == "rotary"
                else "no position table: only the convolutional positions (pos_conv_embed: "
                "checkpoint weights), not a formula"
            )
            + "; 'relative' serves its relative sinusoids",
            kind,
        )
    return [conformer_relative(view, None, "Wav2Vec2ConformerRelPositionalEmbedding")]


def gemma4(config: Mapping[str, Any]) -> list[Entry]:
    """Gemma 4's parts outside `text_config` this module maps: the audio encoder's table
    (`sinusoidal:audio`) when the config has an `audio_config` (the E2B / E4B checkpoints); a
    key it lacks lists the part unserved instead of failing the text model's tables."""
    audio = config.get("audio_config")
    if not isinstance(audio, Mapping):
        return []
    view = ConfigView(audio, "audio_config.", "gemma4_audio", None)
    try:
        (entry,) = gemma4_audio(view)
    except ConfigError as err:
        return [Entry("sinusoidal", "audio", {}, {}, problem=err.problems[0])]
    return [Entry(entry.family, "audio", entry.data, entry.notes)]


def gemma4_audio(view: ConfigView) -> list[Entry]:
    """Gemma 4's audio encoder: `Gemma4AudioRelPositionalEncoding.forward`, the distances
    context_size // 2 .. 0 (context_size = attention_chunk_size + attention_context_left - 1 +
    attention_context_right), tensor2tensor's timescales exp(k * -ln(10000) / (K - 1)) and
    [sin | cos] (the `tensor2tensor` convention)."""
    chunk = int(view.number("attention_chunk_size"))
    left = int(view.number("attention_context_left"))
    right = int(view.number("attention_context_right"))
    context = chunk + left - 1 + right
    rows = context // 2 + 1
    data = {
        "kind": "sinusoidal",
        "dim": int(view.number("hidden_size")),
        "max_positions": rows,
        "position_offset": context // 2,
        "position_step": -1,
        "convention": "tensor2tensor",
    }
    notes = {
        "transformers": "Gemma4AudioRelPositionalEncoding(config)(hidden_states): (1, "
        f"context_size // 2 + 1 = {rows}, hidden_size), context_size = attention_chunk_size + "
        f"attention_context_left - 1 + attention_context_right = {context}; cast to the "
        "activations' dtype; Gemma4AudioAttention projects it by its learned relative_k_proj",
        "rows": f"row r is the relative distance {context // 2} - r (descending to 0)",
    }
    return [Entry("sinusoidal", None, data, notes)]
