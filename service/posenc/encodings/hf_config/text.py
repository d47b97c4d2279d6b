"""Text models without RoPE: ALiBi (BLOOM, Falcon, MPT, Baichuan 13B), T5 relative buckets, the
sinusoidal tables of Whisper, Marian and M2M100, and the learned absolute positions no formula
gives.

Sources: transformers `modeling_bloom.py` (`build_alibi_tensor`), `modeling_falcon.py`,
`modeling_mpt.py` (`build_mpt_alibi_tensor`), Baichuan's remote code, `modeling_t5.py`
(`T5Attention.compute_bias`), `modeling_whisper.py` (`sinusoids`), `modeling_marian.py`,
`modeling_m2m_100.py`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from posenc.encodings.config_values import check_number, fail
from posenc.encodings.errors import FieldProblem
from posenc.encodings.hf_config import audio
from posenc.encodings.hf_config.rope import GENERIC_ROPE
from posenc.encodings.hf_config.view import ConfigView, Entry, head_dim

LEARNED_MODELS = frozenset(
    {
        "gpt2",
        "gpt_neo",
        "gpt_bigcode",
        "opt",
        "bert",
        "roberta",
        "xlm-roberta",
        "electra",
        "albert",
        "bart",
        "mbart",
        "biogpt",
        "clip_text_model",
    }
)
"""Text models with learned absolute position embeddings: checkpoint weights, not a formula
(vision models with learned tables map to `learned` specs that take the uploaded table)."""

T5_MODELS = frozenset({"t5", "mt5", "umt5", "longt5", "switch_transformers", "pop2piano"})
"""Models whose attention is T5's (`compute_bias` with `_relative_position_bucket`)."""

MUSICGEN_MODELS = frozenset(
    {"musicgen", "musicgen_decoder", "musicgen_melody", "musicgen_melody_decoder"}
)

TIME_SERIES_MODELS = frozenset({"time_series_transformer", "informer", "autoformer"})

T5_DEFAULT_KEY_LENGTH = 512
"""key_length of a T5-family table when the config has no n_positions (T5's pre-training length;
the bucket table needs only some length: a request's key_length replaces it)."""

SLOPES_NOTE = "serve slopes; full bias only for runtimes without an ALiBi input"


def learned_positions(view: ConfigView) -> list[Entry]:
    """Learned absolute positions of a text model: no table to serve."""
    fail(
        view.key("model_type"),
        "learned absolute position embeddings are checkpoint weights, not a formula",
        view.model_type,
    )


XLM_SINUSOIDS: dict[str, tuple[str, str, str]] = {
    "xlm": ("sinusoidal_embeddings", "emb_dim", "XLMPreTrainedModel"),
    "flaubert": ("sinusoidal_embeddings", "emb_dim", "FlaubertPreTrainedModel"),
    "distilbert": ("sinusoidal_pos_embds", "dim", "DistilBertPreTrainedModel"),
}
"""model_type -> (the flag that picks the sinusoids, the width key, the class whose
`_init_weights` writes them): XLM, FlauBERT and DistilBERT's `create_sinusoidal_embeddings`."""


def xlm_sinusoids(view: ConfigView) -> list[Entry]:
    """XLM, FlauBERT, DistilBERT with their sinusoid flag set: `create_sinusoidal_embeddings(
    max_position_embeddings, dim, out=position_embeddings.weight)`, numpy float64
    `pos / 10000 ** (2 * (j // 2) / dim)`, sin at even columns and cos at odd ones, rounded once to
    float32 (posenc's vaswani convention in float64; an odd dim's last column is a sin). Without
    the flag (the class default) the positions are learned: refused."""
    flag, width, owner = XLM_SINUSOIDS[view.model_type]
    if not view.get(flag, False):
        fail(
            view.key(flag),
            "false (the class default): learned absolute position embeddings (checkpoint "
            "weights), not a formula; true gives create_sinusoidal_embeddings' table",
            view.get(flag, False),
        )
    data = {
        "kind": "sinusoidal",
        "dim": int(view.number(width)),
        "max_positions": int(view.number("max_position_embeddings")),
        "convention": "vaswani",
        "compute_dtype": "float64",
        "odd_dim": "extra_sin",
    }
    notes = {
        "transformers": f"{owner}._init_weights: create_sinusoidal_embeddings("
        f"max_position_embeddings, {width}) copied into position_embeddings.weight; position "
        "ids 0..n-1 (cache length added when decoding)",
        "checkpoint": "a checkpoint's position_embeddings.weight is loaded over it: this is its "
        "table when training kept the sinusoids frozen (the original XLM and DistilBERT code "
        "set requires_grad=False on them)",
    }
    return [Entry("sinusoidal", None, data, notes)]


def ctrl(view: ConfigView) -> list[Entry]:
    """CTRL: `positional_encoding(n_positions, n_embd, torch.float)`, [sin | cos] of pos *
    1 / torch.pow(10000, 2 * (i // 2) / n_embd) in float32 (the `ctrl` convention)."""
    data = {
        "kind": "sinusoidal",
        "dim": int(view.number("n_embd")),
        "max_positions": int(view.number("n_positions")),
        "convention": "ctrl",
    }
    notes = {
        "transformers": "CTRLModel.pos_encoding = positional_encoding(n_positions, n_embd, "
        "torch.float), cast to the activations' dtype and indexed by position ids; the model "
        "adds it to the token embeddings scaled by sqrt(n_embd)",
    }
    return [Entry("sinusoidal", None, data, notes)]


XLNET_DEFAULT_LENGTH = 512
"""qlen of an XLNet table when the request names none (XLNet's pre-training sequence length)."""


def xlnet(view: ConfigView) -> list[Entry]:
    """XLNet: `XLNetModel.relative_positional_encoding(qlen, klen)`, [sin | cos] of the distances
    klen .. -qlen + 1 ('bi', the class default) or klen .. 0 ('uni'), inv_freq = 1 /
    torch.pow(10000, arange(0, d_model, 2) / d_model) in float32 (the `transformer_xl`
    convention), for qlen = klen = 512 (no memory). `bi_data` (two batch halves, the second
    with negated distances) and `clamp_len` > 0 (clamped distances) are refused naming the key."""
    attn = view.get("attn_type", "bi")
    if attn not in ("bi", "uni"):
        fail(view.key("attn_type"), "must be 'bi' or 'uni' (XLNet raises otherwise)", attn)
    if view.get("bi_data", False):
        fail(
            view.key("bi_data"),
            "true: the batch's second half reads the distances negated (-klen .. qlen - 1, "
            "ascending), a second table per half; not mapped",
            True,
        )
    clamp = view.get("clamp_len", -1)
    if clamp is not None and clamp > 0:
        fail(
            view.key("clamp_len"),
            "> 0: the distances are clamped to +-clamp_len (rows repeat); not mapped",
            clamp,
        )
    length = XLNET_DEFAULT_LENGTH
    rows = 2 * length if attn == "bi" else length + 1
    data = {
        "kind": "sinusoidal",
        "dim": int(view.number("d_model")),
        "max_positions": rows,
        "position_offset": length,
        "position_step": -1,
        "convention": "transformer_xl",
    }
    end = "-qlen + 1" if attn == "bi" else "0"
    notes = {
        "transformers": f"XLNetModel.relative_positional_encoding(qlen, klen): attn_type {attn!r}, "
        f"the distances klen .. {end} (descending), cast to the activations' dtype; each layer "
        "projects it by its learned r (and r_r_bias / r_w_bias), then rel_shift",
        "rows": f"qlen = klen = {length}, no memory; for qlen tokens after mlen memory tokens "
        "(klen = mlen + qlen) pass position_offset=klen and max_positions="
        + ("klen + qlen" if attn == "bi" else "klen + 1"),
    }
    return [Entry("sinusoidal", None, data, notes)]


def falcon(view: ConfigView) -> list[Entry]:
    """Falcon / RefinedWeb: ALiBi when `alibi` is set, else rotary (transformers' generic RoPE)."""
    if view.get("alibi"):
        return falcon_alibi(view)
    return GENERIC_ROPE(view)


def _alibi_entry(view: ConfigView, num_heads: int, notes: dict[str, Any], **fields: Any) -> Entry:
    data = {"kind": "alibi", "num_heads": num_heads, **fields}
    return Entry("alibi", None, data, {"serve": SLOPES_NOTE, **notes})


def bloom(view: ConfigView) -> list[Entry]:
    heads = int(view.number("n_head", "num_attention_heads"))
    notes = {
        "bias_form": "row_constant",
        "transformers": "build_alibi_tensor: slopes * key position (cumsum of the attention "
        "mask - 1), added before the 1/sqrt(head_dim)-scaled scores",
    }
    return [_alibi_entry(view, heads, notes)]


def falcon_alibi(view: ConfigView) -> list[Entry]:
    heads = int(view.number("num_attention_heads", "n_head"))
    width = head_dim(view)
    notes = {
        "bias_form": "row_constant",
        "slope_scale": f"1/sqrt(head_dim={width})",
        "transformers": "FalconModel adds build_alibi_tensor(...) / sqrt(head_dim) to the mask; "
        "its slopes are rounded to bfloat16 before the multiply (slope_rounding): up to 2^-9 "
        "relative from the paper's slopes",
        "bias_rounding": "bfloat16: build_alibi_tensor also rounds slope * key position to "
        "bfloat16 before the / sqrt(head_dim); ask for bias='row_constant' (with key_length) to "
        "get FalconModel's own float32 bias, bit for bit. A kernel multiplying the served float32 "
        "slopes by positions itself does not round the product: up to 2^-9 relative from "
        "Falcon's (0.97 at key 2047)",
        "eager_attention": "transformers' eager FalconAttention adds the alibi twice ((scores + "
        "alibi) / sqrt(head_dim) plus the mask that already holds alibi / sqrt(head_dim)); the "
        "sdpa path (the default) adds it once: the bias here",
    }
    fields = {
        "slope_scale": 1.0 / math.sqrt(width),
        "slope_rounding": "bfloat16",
        "bias_rounding": "bfloat16",
    }
    return [_alibi_entry(view, heads, notes, **fields)]


def mpt(view: ConfigView) -> list[Entry]:
    attn = view.data.get("attn_config") or {}
    if not isinstance(attn, Mapping):
        fail(view.key("attn_config"), "must be an object", attn)
    if attn.get("alibi") is False:
        fail(
            view.key("attn_config.alibi"),
            "false: MPT then uses learned absolute position embeddings (checkpoint weights)",
            False,
        )
    heads = int(view.number("n_heads", "num_attention_heads"))
    bias_max = attn.get("alibi_bias_max")
    fields: dict[str, Any] = {}
    notes: dict[str, Any] = {
        "bias_form": "mpt",
        "transformers": "build_mpt_alibi_tensor(num_heads, max_seq_len): slopes * (j - (L-1))",
    }
    if bias_max is not None:
        fields["alibi_bias_max"] = float(
            check_number(view.key("attn_config.alibi_bias_max"), bias_max)
        )
        if fields["alibi_bias_max"] != 8.0:
            notes["transformers_bias_max"] = (
                "transformers' MptModel always builds the bias with alibi_bias_max=8"
            )
    return [_alibi_entry(view, heads, notes, **fields)]


def baichuan(view: ConfigView) -> list[Entry]:
    """Baichuan-13B / Baichuan2-13B (hidden 5120, 40 heads) use ALiBi; the 7B models use RoPE.
    The remote code, not config.json, makes the choice; the size is the only signal."""
    hidden = view.number("hidden_size")
    heads = int(view.number("num_attention_heads"))
    if hidden == 5120 and heads == 40:
        notes = {
            "bias_form": "row_constant",
            "variant": "Baichuan 13B (ALiBi); chosen from hidden_size=5120, 40 heads",
        }
        return [_alibi_entry(view, heads, notes)]
    entries = GENERIC_ROPE.entries(view)
    for entry in entries:
        entry.notes["variant"] = "Baichuan 7B (RoPE); chosen from hidden_size, num_attention_heads"
    return entries


def t5(view: ConfigView) -> list[Entry]:
    buckets = int(view.number("relative_attention_num_buckets"))
    distance = int(view.number("relative_attention_max_distance"))
    heads = view.number("num_heads", "num_attention_heads", required=False)
    base: dict[str, Any] = {
        "kind": "t5_bias",
        "num_buckets": buckets,
        "max_distance": distance,
    }
    length = view.number("n_positions", required=False)
    base["key_length"] = int(T5_DEFAULT_KEY_LENGTH if length is None else length)
    notes: dict[str, Any] = {
        "bias": "the (num_buckets, num_heads) relative_attention_bias weights are in the "
        "checkpoint; pass them as relative_attention_bias to get the bias table",
        "scaling": "T5 adds the bias to unscaled scores (no 1/sqrt(d))",
    }
    if heads is not None:
        notes["num_heads"] = int(heads)
    notes["key_length"] = (
        f"no n_positions in the config: {T5_DEFAULT_KEY_LENGTH}; override key_length per request"
        if length is None
        else f"from n_positions={int(length)}; override key_length per request"
    )
    if view.model_type == "umt5":
        notes["per_layer"] = "UMT5: every layer has its own relative_attention_bias weights"
    encoder_notes = dict(notes)
    if view.model_type == "longt5":
        encoder_notes.update(_longt5_encoder_notes(view))
    entries = [
        Entry("t5_bias", "encoder", {**base, "bidirectional": True}, encoder_notes),
        Entry("t5_bias", "decoder", {**base, "bidirectional": False}, dict(notes)),
    ]
    if view.model_type == "longt5" and _longt5_attention(view) == "transient-global":
        entries.insert(1, _longt5_global(view, base))
    if view.data.get("is_encoder_decoder") is False:
        entries = entries[:-1] if not view.data.get("is_decoder") else entries[-1:]
    return entries


def _longt5_attention(view: ConfigView) -> str:
    return str(view.get("encoder_attention_type", "local"))


def _longt5_encoder_notes(view: ConfigView) -> dict[str, Any]:
    """LongT5's encoder attends within a local window (`LongT5LocalAttention`,
    `LongT5TransientGlobalAttention`): the buckets are T5's, the keys a query sees are not all."""
    radius = int(view.get("local_radius", 127))
    kind = _longt5_attention(view)
    return {
        "local_window": f"encoder_attention_type={kind!r}: each query attends only the keys within "
        f"local_radius={radius} of it (|i - j| <= {radius}: blocks of local_radius + 1 = "
        f"{radius + 1} tokens, each seeing its own and the two neighbouring blocks, masked by "
        "_get_local_attention_mask); the entries of this table farther apart are never used",
    }


def _longt5_global(view: ConfigView, base: dict[str, Any]) -> Entry:
    """LongT5 transient-global's second bias: listed, not served (its rows are global blocks)."""
    block = int(view.get("global_block_size", 16))
    problem = FieldProblem(
        "encoder_attention_type",
        "transient-global's side bias (LongT5TransientGlobalAttention.compute_side_bias: "
        "global_relative_attention_bias, checkpoint weights, over T5 buckets of global block g "
        f"minus the token's block i // global_block_size={block}, with the last partial block's "
        "tokens assigned to the block before and a -1e10 mask against padded blocks) is not "
        "served: its buckets depend on the input length's block split, not on a (query, key) "
        "position grid",
        "transient-global",
    )
    return Entry("t5_bias", "encoder_global", dict(base), {}, problem=problem)


UDOP_BIAS_DEFAULTS: dict[str, tuple[int, int]] = {"1d": (1, 128)}
"""`modeling_udop.RelativePositionBias1D`'s (scaling_factor, max_distance) defaults (its
relative_attention_num_buckets default is the base class's 32)."""


def udop(view: ConfigView) -> list[Entry]:
    """UDOP (`modeling_udop.UdopStack`): the encoder adds one position bias to every layer, the
    sum of `create_relative_bias(config)` over `relative_bias_args` (the class default
    `[{"type": "1d"}, {"type": "horizontal"}, {"type": "vertical"}]`); its "1d" part is T5's
    bidirectional bucketing (`UdopAttention._relative_position_bucket`) of key - query sequence
    positions, served; "horizontal" / "vertical" bucket the differences of each token's
    bounding-box x / y centres (scaled by 100): box-dependent, listed unserved. The decoder's
    layer 0 computes T5's causal buckets (`UdopAttention.compute_bias`, the config's
    relative_attention_num_buckets / relative_attention_max_distance), shared by its layers."""
    args = view.get("relative_bias_args")
    if args is None:
        args = [{"type": "1d"}, {"type": "horizontal"}, {"type": "vertical"}]
    key = view.key("relative_bias_args")
    if not isinstance(args, list) or not all(
        isinstance(a, Mapping) and isinstance(a.get("type"), str) for a in args
    ):
        fail(key, "must be a list of objects with a type ('1d', 'horizontal', 'vertical')", args)
    heads = view.number("num_heads", "num_attention_heads", required=False)
    notes: dict[str, Any] = {
        "bias": "the (num_buckets, num_heads) relative_attention_bias weights of each bias "
        "module are in the checkpoint; pass them as relative_attention_bias to get the bias "
        "table",
        "scaling": "UDOP adds the bias to unscaled scores (no 1/sqrt(d)), as T5",
        "key_length": f"{T5_DEFAULT_KEY_LENGTH} (UDOP has no n_positions); override key_length "
        "per request",
    }
    if heads is not None:
        notes["num_heads"] = int(heads)
    entries: list[Entry] = []
    ones = [i for i, a in enumerate(args) if a["type"] == "1d"]
    if len(ones) > 1:
        fail(key, "more than one '1d' bias (their sum is not one bucket table); not mapped", args)
    for i, arg in enumerate(args):
        kind = arg["type"]
        where = f"{key}[{i}]"
        if kind != "1d":
            problem = FieldProblem(
                where,
                f"UDOP's {kind} layout bias (RelativePositionBias{kind.capitalize()}: T5 "
                f"buckets of the differences of each token's bounding-box "
                f"{'x' if kind == 'horizontal' else 'y'} centre, scaled by "
                f"{arg.get('scaling_factor', 100)}) depends on each input's boxes: no fixed "
                "table; not served",
                kind,
            )
            entries.append(Entry("t5_bias", f"encoder_{kind}", {}, {}, problem=problem))
            continue
        scaling, distance = UDOP_BIAS_DEFAULTS["1d"]
        if arg.get("scaling_factor", scaling) != 1:
            fail(f"{where}.scaling_factor", "UDOP's 1d bias raises for a scaling_factor not 1", arg)
        if arg.get("prefix_bucket", False):
            fail(
                f"{where}.prefix_bucket",
                "true: two extra buckets for the prefix tokens, found from each input's "
                "bounding boxes (bbox y < 0): box-dependent; not mapped",
                True,
            )
        encoder = {
            "kind": "t5_bias",
            "num_buckets": int(arg.get("relative_attention_num_buckets", 32)),
            "max_distance": int(arg.get("max_distance", distance)),
            "bidirectional": bool(arg.get("bidirectional", True)),
            "key_length": T5_DEFAULT_KEY_LENGTH,
        }
        encoder_notes = {
            **notes,
            "transformers": "UdopStack.relative_bias (RelativePositionBias1D, relative_bias_args"
            f"[{i}]): one bias for every encoder layer, summed with the box biases",
        }
        entries.append(Entry("t5_bias", "encoder", encoder, encoder_notes))
    decoder = {
        "kind": "t5_bias",
        "num_buckets": int(view.number("relative_attention_num_buckets")),
        "max_distance": int(view.number("relative_attention_max_distance")),
        "bidirectional": False,
        "key_length": T5_DEFAULT_KEY_LENGTH,
    }
    decoder_notes = {**notes, "transformers": "UdopAttention.compute_bias of decoder layer 0"}
    return [*entries, Entry("t5_bias", "decoder", decoder, decoder_notes)]


def layoutlm(view: ConfigView) -> list[Entry]:
    """LayoutLMv2 / LayoutLMv3 1-D relative bias (`modeling_layoutlmv2.relative_position_bucket`,
    `LayoutLMv3Encoder.relative_position_bucket` over position_ids[key] - position_ids[query]):
    T5's bidirectional buckets with rel_pos_bins buckets up to max_rel_pos; the 2-D spatial bias
    (bounding boxes) and the learned absolute positions are listed unserved."""
    if not view.get("has_relative_attention_bias", True):
        fail(
            view.key("has_relative_attention_bias"),
            "false: no 1-D relative bias; the positions are learned absolute embeddings (and "
            "box-dependent 2-D terms): nothing posenc can serve",
            False,
        )
    bins = int(view.number("rel_pos_bins"))
    distance = int(view.number("max_rel_pos"))
    length = int(view.number("max_position_embeddings"))
    v3 = view.model_type == "layoutlmv3"
    data = {
        "kind": "t5_bias",
        "num_buckets": bins,
        "max_distance": distance,
        "bidirectional": True,
        "key_length": length,
    }
    owner = (
        "LayoutLMv3Encoder._cal_1d_pos_emb"
        if v3
        else ("LayoutLMv2Encoder._calculate_1d_position_embeddings")
    )
    notes: dict[str, Any] = {
        "transformers": f"{owner}: rel_pos_bias.weight.t()[bucket], shared by every layer",
        "bias": "the (num_attention_heads, rel_pos_bins) rel_pos_bias.weight is in the checkpoint: "
        "pass its transpose (rel_pos_bins, num_attention_heads) as relative_attention_bias",
        "key_length": f"from max_position_embeddings={length}; override key_length per request",
    }
    if v3:
        heads = int(view.number("num_attention_heads"))
        width = int(view.number("hidden_size")) // heads
        notes["scaling"] = (
            f"LayoutLMv3 divides the bias by sqrt(hidden_size // num_attention_heads) = "
            f"sqrt({width}) before adding it (_compute_position_bias)"
        )
    else:
        notes["scaling"] = "LayoutLMv2 adds the bias to the 1/sqrt(head_dim)-scaled scores as is"
    entries = [Entry("t5_bias", None, data, notes)]
    if view.get("has_spatial_attention_bias", True):
        spatial = FieldProblem(
            "has_spatial_attention_bias",
            "the 2-D spatial bias (buckets of bounding-box x and y differences, rel_2d_pos_bins "
            "up to max_rel_2d_pos, learned rel_pos_x_bias / rel_pos_y_bias) depends on each "
            "input's boxes: no fixed table; not served",
            True,
        )
        entries.append(Entry("t5_bias", "spatial", dict(data), {}, problem=spatial))
    learned = FieldProblem(
        "max_position_embeddings",
        "learned absolute positions (1-D position_embeddings and the 2-D x/y/h/w layout "
        "embeddings of the boxes: checkpoint weights) are not served",
        length,
    )
    entries.append(Entry("learned", "positions", {}, {}, problem=learned))
    return entries


def prophetnet(view: ConfigView) -> list[Entry]:
    """ProphetNet's decoder main stream (`modeling_prophetnet.compute_all_stream_relative_buckets`):
    T5's causal buckets of key - query (num_buckets, relative_max_distance); the ngram predict
    streams' buckets and the learned absolute positions are listed unserved."""
    buckets = int(view.number("num_buckets"))
    distance = int(view.number("relative_max_distance"))
    length = int(view.number("max_position_embeddings"))
    data = {
        "kind": "t5_bias",
        "num_buckets": buckets,
        "max_distance": distance,
        "bidirectional": False,
        "key_length": length,
    }
    notes = {
        "transformers": "ProphetNetNgramSelfAttention.get_main_relative_pos_embeddings gathers "
        "compute_all_stream_relative_buckets(num_buckets, relative_max_distance, position_ids)[0]",
        "bias": "the bias per bucket is relative_pos_embeddings(hidden_states): a learned Linear "
        "of each query's hidden state into num_buckets x heads, not a fixed weight table; pass "
        "no relative_attention_bias, gather that projection at these buckets",
        "key_length": f"from max_position_embeddings={length}; override key_length per request",
    }
    ngram = int(view.number("ngram", required=False) or 2)
    predict = FieldProblem(
        "ngram",
        f"the {ngram} predict streams' buckets (compute_all_stream_relative_buckets(...)[1]: each "
        "query against the keys [position - 1 | position] of the main and its own stream, "
        "laid out as (L, 2L)) are not served",
        ngram,
    )
    learned = FieldProblem(
        "max_position_embeddings",
        "learned absolute positions (ProphetNetPositionalEmbeddings of the encoder and the "
        "decoder: checkpoint weights) are not served",
        length,
    )
    return [
        Entry("t5_bias", "decoder", data, notes),
        Entry("t5_bias", "predict_streams", dict(data), {}, problem=predict),
        Entry("learned", "positions", {}, {}, problem=learned),
    ]


def whisper(view: ConfigView) -> list[Entry]:
    dim = int(view.number("d_model"))
    rows = int(view.number("max_source_positions"))
    data = {"kind": "sinusoidal", "dim": dim, "max_positions": rows, "convention": "whisper"}
    notes = {
        "decoder": "Whisper's decoder positions are learned (max_target_positions="
        f"{view.get('max_target_positions')} rows of checkpoint weights): no formula",
        "transformers": "WhisperEncoder.embed_positions = sinusoids(max_source_positions, d_model)",
    }
    return [Entry("sinusoidal", "encoder", data, notes)]


def marian(view: ConfigView) -> list[Entry]:
    if view.data.get("static_position_embeddings") is False:
        fail(
            view.key("static_position_embeddings"),
            "false: learned position embeddings are checkpoint weights, not a formula",
            False,
        )
    dim = int(view.number("d_model"))
    rows = int(view.number("max_position_embeddings"))
    data = {"kind": "sinusoidal", "dim": dim, "max_positions": rows, "convention": "marian"}
    notes = {
        "shared": "encoder and decoder use the same static table "
        "(MarianSinusoidalPositionalEmbedding)",
        "rows": "position ids 0..max_position_embeddings-1 (decoding offsets by the cache length)",
    }
    return [Entry("sinusoidal", None, data, notes)]


def m2m100(view: ConfigView) -> list[Entry]:
    dim = int(view.number("d_model"))
    rows = int(view.number("max_position_embeddings"))
    pad = int(view.number("pad_token_id"))
    data = {
        "kind": "sinusoidal",
        "dim": dim,
        "max_positions": rows + 2,
        "convention": "fairseq",
        "padding_idx": pad,
    }
    notes = {
        "offset": 2,
        "rows": f"position ids: tokens use padding_idx+1={pad + 1}.. (create_position_ids_from_"
        "input_ids); the padding row is zero; max_position_embeddings + 2 rows",
        "first_row": pad + 1,
        "shared": "encoder and decoder use the same table (M2M100SinusoidalPositionalEmbedding)",
    }
    return [Entry("sinusoidal", None, data, notes)]


def mpnet(view: ConfigView) -> list[Entry]:
    """MPNet (`modeling_mpnet.MPNetEncoder.compute_position_bias`): T5's bidirectional buckets with
    the call's defaults num_buckets=32, max_distance=128, whatever the config says."""
    heads = view.number("num_attention_heads", required=False)
    data = {
        "kind": "t5_bias",
        "num_buckets": 32,
        "max_distance": 128,
        "bidirectional": True,
        "key_length": int(view.number("max_position_embeddings", required=False) or 512),
    }
    rows = int(view.number("relative_attention_num_buckets", required=False) or 32)
    if rows < 32:
        fail(
            view.key("relative_attention_num_buckets"),
            "below 32: MPNetEncoder.compute_position_bias always makes 32 buckets, so the "
            f"{rows}-row relative_attention_bias embedding cannot be indexed by them",
            rows,
        )
    notes = {
        "bias": "the relative_attention_bias weights are in the checkpoint "
        f"({rows} rows = relative_attention_num_buckets, num_attention_heads); the buckets are "
        "0..31 whatever that says: pass its first 32 rows (relative_attention_bias.weight[:32], "
        "the num_buckets=32 rows /v1/tables takes) as relative_attention_bias for the bias table"
        + ("; the other rows are never read" if rows > 32 else ""),
        "transformers": "MPNetEncoder.compute_position_bias(hidden_states) uses its defaults "
        "num_buckets=32, max_distance=128 (relative_attention_num_buckets sizes only the weights)",
        "num_heads": None if heads is None else int(heads),
    }
    return [Entry("t5_bias", None, data, notes)]


def _fairseq(
    view: ConfigView, rows: int, pad: int, role: str | None, source: str, dim: int | None = None
) -> Entry:
    """A fairseq table `get_embedding(rows, dim, padding_idx)` (rows counts the module's offset
    of 2 when it adds one; dim: d_model unless given)."""
    data = {
        "kind": "sinusoidal",
        "dim": int(view.number("d_model", "hidden_size")) if dim is None else dim,
        "max_positions": rows,
        "convention": "fairseq",
        "padding_idx": pad,
    }
    notes = {
        "rows": f"position ids: tokens use padding_idx+1={pad + 1}.. (create_position_ids_from_"
        "input_ids); the padding row is zero",
        "first_row": pad + 1,
        "transformers": source,
    }
    return Entry("sinusoidal", role, data, notes)


def xglm(view: ConfigView) -> list[Entry]:
    """XGLM (`XGLMSinusoidalPositionalEmbedding(max_position_embeddings, d_model, pad_token_id)`):
    the fairseq table of max_position_embeddings + 2 rows with row pad_token_id zeroed, read at
    row position + 2 (`forward`: `position_ids + self.offset`) whatever pad_token_id, unlike
    M2M100's padding_idx + 1 + position."""
    rows = int(view.number("max_position_embeddings"))
    pad = int(view.number("pad_token_id"))
    source = "XGLMSinusoidalPositionalEmbedding(max_position_embeddings, d_model, pad_token_id) "
    source += "(+ 2 rows); XGLMModel adds weights[position_ids + 2]"
    entry = _fairseq(view, rows + 2, pad, None, source)
    zeroed = (
        f"row pad_token_id={pad} is zero in the model's table too: position {pad - 2} reads it"
        if pad >= 2
        else f"row pad_token_id={pad} is zero; no position reads it"
    )
    entry.notes.update(
        {
            "rows": "position p (0-based, the cache length included) reads row p + 2 whatever "
            f"pad_token_id (XGLMSinusoidalPositionalEmbedding.forward); {zeroed}",
            "first_row": 2,
        }
    )
    return [entry]


def fairseq_sinusoids(view: ConfigView) -> list[Entry]:
    """NLLB-MoE (`NllbMoeSinusoidalPositionalEmbedding`, M2M100's module): one fairseq table of
    max_position_embeddings + 2 rows, padding row pad_token_id, tokens at padding_idx + 1 +
    position."""
    rows = int(view.number("max_position_embeddings"))
    pad = int(view.number("pad_token_id"))
    source = f"{view.model_type}: <Model>SinusoidalPositionalEmbedding(max_position_embeddings, "
    source += "d_model, pad_token_id) (+ 2 rows), shared by encoder and decoder"
    return [_fairseq(view, rows + 2, pad, None, source)]


def speech_to_text(view: ConfigView) -> list[Entry]:
    """Speech2Text (`Speech2TextSinusoidalPositionalEmbedding`): encoder table of
    max_source_positions, decoder table of max_target_positions (+ 2 rows each)."""
    pad = int(view.number("pad_token_id"))
    return [
        _fairseq(
            view,
            int(view.number(f"max_{side}_positions")) + 2,
            pad,
            role,
            f"Speech2Text{role.capitalize()}.embed_positions(max_{side}_positions, d_model, "
            "pad_token_id)",
        )
        for role, side in (("encoder", "source"), ("decoder", "target"))
    ]


def trocr(view: ConfigView) -> list[Entry]:
    """TrOCR decoder (`TrOCRSinusoidalPositionalEmbedding(max_position_embeddings + padding_idx + 1,
    hidden_size, padding_idx)`) unless `use_learned_position_embeddings`."""
    if view.get("use_learned_position_embeddings", True):
        fail(
            view.key("use_learned_position_embeddings"),
            "true (the class default): TrOCR then uses learned positions (checkpoint weights)",
            view.get("use_learned_position_embeddings", True),
        )
    pad = int(view.number("pad_token_id"))
    rows = int(view.number("max_position_embeddings")) + pad + 1
    source = "TrOCRDecoder.embed_positions(max_position_embeddings + pad + 1, hidden_size, pad): "
    source += "exactly that many rows (no extra offset rows)"
    return [_fairseq(view, rows, pad, None, source)]


def fsmt(view: ConfigView) -> list[Entry]:
    """FSMT (`modeling_fsmt.SinusoidalPositionalEmbedding(max_position_embeddings + pad + 1,
    d_model, pad)`): the same fairseq table in the encoder and the decoder."""
    pad = int(view.number("pad_token_id"))
    rows = int(view.number("max_position_embeddings")) + pad + 1
    source = "FSMTEncoder and FSMTDecoder.embed_positions(max_position_embeddings + pad + 1, "
    source += "d_model, pad): one table, shared"
    return [_fairseq(view, rows, pad, None, source)]


def musicgen(view: ConfigView) -> list[Entry]:
    """MusicGen / MusicGen Melody decoders (`MusicgenSinusoidalPositionalEmbedding(
    max_position_embeddings, hidden_size)`): tensor2tensor's table with cos before sin, no padding
    row; a composite config is read through its `decoder`."""
    decoder = view.data.get("decoder")
    if isinstance(decoder, Mapping):
        view = ConfigView(decoder, view.key("decoder."), f"{view.model_type}_decoder", None)
    data = {
        "kind": "sinusoidal",
        "dim": int(view.number("hidden_size")),
        "max_positions": int(view.number("max_position_embeddings")),
        "convention": "tensor2tensor",
        "layout": "cos_sin",
    }
    notes = {
        "transformers": "get_embedding: [cos | sin] of p * exp(-k ln(10000) / (dim/2 - 1)); "
        "the decoder adds rows at the positions cache_length.. of each codebook stream",
    }
    return [Entry("sinusoidal", "decoder", data, notes)]


def time_series(view: ConfigView) -> list[Entry]:
    """Time Series Transformer, Informer, Autoformer (`<Model>SinusoidalPositionalEmbedding(
    context_length + prediction_length, d_model)`, `create_weight`): Marian's table, one per stack,
    the same in both."""
    # The config class sets context_length = context_length or prediction_length.
    prediction = int(view.number("prediction_length"))
    rows = int(view.number("context_length", "prediction_length")) + prediction
    data = {
        "kind": "sinusoidal",
        "dim": int(view.number("d_model")),
        "max_positions": rows,
        "convention": "marian",
    }
    notes = {
        "rows": "context_length + prediction_length time steps",
        "shared": "encoder and decoder build the same static table",
    }
    return [Entry("sinusoidal", None, data, notes)]


def patchtst(view: ConfigView) -> list[Entry]:
    """PatchTST with positional_encoding_type 'sincos' (the class default):
    `PatchTSTPositionalEncoding._init_pe(config, num_patches)`, the espnet table of d_model over
    num_patches rows (+ 1 with use_cls_token, row 0 then the class token's), standardised over
    the whole table (`standardize: "patchtst"`); num_patches = (max(context_length,
    patch_length) - patch_length) // patch_stride + 1 (`PatchTSTPatchify`). 'random' is a
    learned table: refused."""
    kind = view.get("positional_encoding_type", "sincos")
    if kind != "sincos":
        fail(
            view.key("positional_encoding_type"),
            f"{kind!r}: a randomly initialised, trained table (checkpoint weights), not a "
            "formula; 'sincos' serves its fixed table",
            kind,
        )
    context = int(view.number("context_length"))
    patch = int(view.number("patch_length"))
    stride = int(view.number("patch_stride"))
    patches = (max(context, patch) - patch) // stride + 1
    cls = bool(view.get("use_cls_token", False))
    data = {
        "kind": "sinusoidal",
        "dim": int(view.number("d_model")),
        "max_positions": patches + int(cls),
        "convention": "espnet",
        "standardize": "patchtst",
    }
    notes = {
        "transformers": "PatchTSTPositionalEncoding.position_enc (_init_pe, 'sincos'): a "
        "parameter with requires_grad=False, saved in checkpoints with these values",
        "rows": f"num_patches = {patches}"
        + (
            "; use_cls_token: row 0 is added to the class token, rows 1.. to the patches"
            if cls
            else ""
        ),
    }
    return [Entry("sinusoidal", None, data, notes)]


def kosmos2_text(view: ConfigView) -> list[Entry]:
    """Kosmos-2's text model (`Kosmos2TextSinusoidalPositionalEmbedding(max_position_embeddings,
    embed_dim, pad_token_id)`, M2M100's module): the fairseq table, offset 2."""
    rows = int(view.number("max_position_embeddings"))
    pad = int(view.number("pad_token_id"))
    source = "Kosmos2TextTransformer.embed_positions"
    return [_fairseq(view, rows + 2, pad, None, source, int(view.number("embed_dim")))]


def pegasus(view: ConfigView) -> list[Entry]:
    """Pegasus (`PegasusSinusoidalPositionalEmbedding.create_weight`): Marian's table (sin half,
    cos half, exponent 2(j//2)/dim) of max_position_embeddings rows, shared by both stacks."""
    dim = int(view.number("d_model"))
    rows = int(view.number("max_position_embeddings"))
    data = {"kind": "sinusoidal", "dim": dim, "max_positions": rows, "convention": "marian"}
    notes = {
        "shared": "encoder and decoder use the same static table",
        "rows": "position ids 0..max_position_embeddings-1 (decoding offsets by the cache length)",
    }
    return [Entry("sinusoidal", None, data, notes)]


def pegasus_x(view: ConfigView) -> list[Entry]:
    """PEGASUS-X (`PegasusXSinusoidalPositionalEmbedding(d_model)`): tensor2tensor's table
    [sin | cos] of p * exp(-k ln(10000) / (d_model/2 - 1)), computed per call for positions
    cache_length..; served as max_position_embeddings rows, shared by encoder and decoder."""
    data = {
        "kind": "sinusoidal",
        "dim": int(view.number("d_model")),
        "max_positions": int(view.number("max_position_embeddings")),
        "convention": "tensor2tensor",
        "layout": "sin_cos",
    }
    notes = {
        "transformers": "PegasusXEncoder and PegasusXDecoder.embed_positions: computed on the fly "
        "for the positions used (no row limit); the encoder's global tokens get none",
        "shared": "encoder and decoder use the same formula",
    }
    return [Entry("sinusoidal", None, data, notes)]


def tipsv2_text(view: ConfigView) -> list[Entry]:
    """TIPSv2's text encoder (`Tipsv2SinusoidalPositionalEmbedding(config)`): tensor2tensor's
    table [sin | cos] of max_position_embeddings rows at hidden_size, no padding row."""
    data = {
        "kind": "sinusoidal",
        "dim": int(view.number("hidden_size")),
        "max_positions": int(view.number("max_position_embeddings")),
        "convention": "tensor2tensor",
        "layout": "sin_cos",
    }
    notes = {"transformers": "Tipsv2TextEmbeddings.position_embedding.weights"}
    return [Entry("sinusoidal", None, data, notes)]


def pix2struct_text(view: ConfigView) -> list[Entry]:
    """Pix2Struct's text decoder (`Pix2StructTextAttention.compute_bias`): T5's causal buckets
    (bidirectional=False) with relative_attention_num_buckets, relative_attention_max_distance."""
    data = {
        "kind": "t5_bias",
        "num_buckets": int(view.number("relative_attention_num_buckets")),
        "max_distance": int(view.number("relative_attention_max_distance")),
        "bidirectional": False,
        "key_length": T5_DEFAULT_KEY_LENGTH,
    }
    heads = view.number("num_heads", required=False)
    notes: dict[str, Any] = {
        "bias": "the (num_buckets, num_heads) relative_attention_bias weights are in the "
        "checkpoint; pass them as relative_attention_bias to get the bias table",
        "scaling": "Pix2Struct adds the bias to unscaled scores (no 1/sqrt(d))",
        "key_length": f"{T5_DEFAULT_KEY_LENGTH}; override key_length per request",
    }
    if heads is not None:
        notes["num_heads"] = int(heads)
    return [Entry("t5_bias", "decoder", data, notes)]


def seamless_m4t(view: ConfigView) -> list[Entry]:
    """SeamlessM4T (v1 and v2) text and text-to-unit stacks (`SeamlessM4T[v2]
    SinusoidalPositionalEmbedding`, M2M100's fairseq module): the text encoder and decoder share
    one table (max_position_embeddings + 2 rows, hidden_size, pad_token_id), the text-to-unit
    decoder has its own (t2u_max_position_embeddings + 2 rows, t2u_pad_token_id); v1's speech
    encoder adds its relative sinusoids (`_seamless_speech_encoder`), v2's learned relative_key
    positions are listed unserved (`unmapped.LEFT_OUT`)."""
    prefix = "SeamlessM4Tv2" if view.model_type.endswith("v2") else "SeamlessM4T"
    speech = [] if prefix.endswith("v2") else _seamless_speech_encoder(view)
    text = _fairseq(
        view,
        int(view.number("max_position_embeddings")) + 2,
        int(view.number("pad_token_id")),
        "text",
        f"{prefix}Encoder and {prefix}Decoder.embed_positions(max_position_embeddings, "
        "hidden_size, pad_token_id) (+ 2 rows): one table",
    )
    t2u_source = (
        f"{prefix}TextToUnit decoder's embed_positions(t2u_max_position_embeddings, hidden_size, "
        "t2u_pad_token_id) (+ 2 rows); its encoder adds none"
    )
    if prefix.endswith("v2"):
        t2u_source += "; embed_char_positions is the same table"
    t2u = _fairseq(
        view,
        int(view.number("t2u_max_position_embeddings")) + 2,
        int(view.number("t2u_pad_token_id")),
        "t2u_decoder",
        t2u_source,
    )
    return [text, t2u, *speech]


def _seamless_speech_encoder(view: ConfigView) -> list[Entry]:
    """SeamlessM4T (v1)'s conformer speech encoder: 'relative' (the class default) is ESPnet's
    relative sinusoids (`audio.conformer_relative`); 'rotary' is listed unserved; None has no
    positions."""
    kind = view.get("position_embeddings_type")
    if kind == "relative":
        module = "SeamlessM4TConformerRelPositionalEmbedding"
        return [audio.conformer_relative(view, "speech_encoder", module)]
    if kind == "rotary":
        problem = FieldProblem(
            view.key("position_embeddings_type"),
            "'rotary': the conformer speech encoder's "
            "SeamlessM4TConformerRotaryPositionalEmbedding "
            "(hidden_size // speech_encoder_attention_heads wide, rotary_embedding_base, applied "
            "by its own self-attention) is not mapped",
            kind,
        )
        return [Entry("rope", "speech_encoder", {}, {}, problem=problem)]
    return []


def speecht5(view: ConfigView) -> list[Entry]:
    """SpeechT5's pre-nets: fairseq tables (`SpeechT5SinusoidalPositionalEmbedding(max_* +
    pad_token_id + 1, hidden_size, pad_token_id)`, + 2 offset rows) in the speech encoder and
    text decoder pre-nets, and the paper's interleaved table (`SpeechT5ScaledPositionalEncoding(
    hidden_size, max_*)`, exp(2k * -(ln 10000 / dim))) in the speech decoder and text encoder
    pre-nets, which scale it by a learned `alpha`; the encoder's relative positions and the
    convolutional positions are listed unserved (`unmapped.LEFT_OUT`)."""
    pad = int(view.number("pad_token_id"))
    dim = int(view.number("hidden_size"))
    speech = int(view.number("max_speech_positions"))
    text_rows = int(view.number("max_text_positions"))
    entries = [
        _fairseq(
            view,
            speech + pad + 1 + 2,
            pad,
            "speech_encoder_prenet",
            "SpeechT5SpeechEncoderPrenet.pos_sinusoidal_embed(max_speech_positions + pad + 1, "
            "hidden_size, pad) (+ 2 rows), indexed by the padding mask's position ids",
            dim,
        ),
        _fairseq(
            view,
            text_rows + pad + 1 + 2,
            pad,
            "text_decoder_prenet",
            "SpeechT5TextDecoderPrenet.embed_positions(max_text_positions + pad + 1, hidden_size, "
            "pad) (+ 2 rows)",
            dim,
        ),
    ]
    for role, rows, source in (
        ("speech_decoder_prenet", speech, "SpeechT5SpeechDecoderPrenet"),
        ("text_encoder_prenet", text_rows, "SpeechT5TextEncoderPrenet"),
    ):
        data = {"kind": "sinusoidal", "dim": dim, "max_positions": rows, "convention": "vaswani"}
        notes = {
            "transformers": f"{source}.encode_positions: SpeechT5ScaledPositionalEncoding("
            f"hidden_size, {rows}).pe, interleaved [sin, cos]",
            "alpha": "the model adds alpha * this table; alpha is a learned scalar of the "
            "checkpoint (encode_positions.alpha)",
        }
        entries.append(Entry("sinusoidal", role, data, notes))
    entries.append(_speecht5_relative(view))
    return entries


def _speecht5_relative(view: ConfigView) -> Entry:
    """SpeechT5's encoder relative positions (`SpeechT5RelativePositionalEncoding(hidden_size //
    encoder_attention_heads, encoder_max_relative_position)`): the index of the pe_k row each
    (query, key) pair reads, `clip(i - j, -k, k - 1) + k` (posenc's speecht5 scheme)."""
    k = int(view.number("encoder_max_relative_position"))
    heads = int(view.number("encoder_attention_heads"))
    dim = int(view.number("hidden_size")) // heads
    data = {
        "kind": "relative_index",
        "scheme": "speecht5",
        "max_relative_position": k,
        "key_length": T5_DEFAULT_KEY_LENGTH,
    }
    notes = {
        "transformers": "SpeechT5Encoder.embed_positions(hidden_states): pe_k(index), pe_k an "
        f"Embedding(2 * encoder_max_relative_position = {2 * k}, hidden_size // "
        f"encoder_attention_heads = {dim}) of the checkpoint; SpeechT5Attention adds "
        "query . pe_k[index] to the scores (one vector per index row, shared by the heads)",
        "weights": "pe_k rows are key vectors, not per-head scalars: take the index and gather "
        "the checkpoint's encoder.embed_positions.pe_k.weight yourself (a bias table does not "
        "apply)",
        "key_length": f"{T5_DEFAULT_KEY_LENGTH}; the encoder's length is the input's: override "
        "key_length per request (the index is Toeplitz, any length extends this pattern)",
    }
    return Entry("relative_index", "encoder", data, notes)
