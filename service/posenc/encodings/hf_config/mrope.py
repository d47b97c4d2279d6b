"""Multimodal RoPE (M-RoPE) text models: the 1-D table plus the per-pair axis map.

Every M-RoPE text rotary module of transformers 5.24 computes `freqs = position_ids[a] * inv_freq`
for each of three position axes a (0 temporal, 1 height, 2 width; `position_ids` (3, B, N)), takes
cos/sin of each and then picks, for every frequency pair i, the value of one axis
(`recomposition_frequencies`). Pair i of axis a is therefore row `position_ids[a, n]`, column i
of the model's ordinary 1-D table: posenc serves that table (the `rope` spec) and states the axis
of each pair (`notes["mrope"]["pair_axes"]`), which is all a runtime needs:

    cos[n, i] = table_cos[position_ids[pair_axes[i], n], i]   (then widened as `pairing` says)

Layouts (`MROPE_MODELS`, read from each model's `recomposition_frequencies`):

- chunked (Qwen2-VL, Qwen2.5-VL, Qwen2.5-Omni, PaddleOCR-VL; GLM-4V, GLM-4.1V-MoE, GLM-Image,
  GLM-OCR with interleaved pairs): consecutive runs of mrope_section[k] pairs read axis k
  (`m[i % 3]` of the split); the sections sum to d/2.
- interleaved (Qwen3-VL (+MoE), Qwen3.5 (+MoE), Qwen4-Exp, Qwen3-Omni-MoE, Cosmos3-Edge, HY-V4-VL
  with interleaved pairs): pair
  i reads axis 1 if i % 3 == 1 and i < 3*s[1], axis 2 if i % 3 == 2 and i < 3*s[2], else axis 0
  (the layout [THWTHW..TT]).
- ernie (ERNIE-4.5-VL): pairs below s[0]+s[1] alternate height (even i) and width (odd i); the
  last s[2] pairs read the temporal axis.
- row_column (NeoMME, `NeoMMERotaryEmbedding`): two position axes (0 row, 1 column), position ids
  (2, N); pair i reads axis i % 2 ("row0-col0-row1-col1", `mrope_section` [d/4, d/4] in its own
  words). The section is the module's, not a config key.
- channel_chunks (HunYuan-VL, `HunYuanVLRotaryEmbedding`): len(mrope_section) position axes
  (HunyuanOCR's four: position, width, height, image index; its config class's three: width,
  height, image index), ids (A, N); `recomposition_frequencies` splits the FULL width
  `cat(freqs, freqs)` into chunks of 2 * mrope_section[k] channels, chunk k reading axis k. The
  two channels c and c + d/2 of a rotate_half pair may read different axes, so no per-pair map
  serves it: the notes carry `channel_axes` (length d, the axis of every channel of the
  full-width half-split table) instead of `pair_axes`:

      cos[n, c] = full_cos[position_ids[channel_axes[c], n], c]

  The config has no default section (the module's `len(None)` fails): a missing one is refused.
  Its "xdrope" rope type is "dynamic" and "dynamic" with an `alpha` is the fixed NTK-alpha base
  (`HunYuanVLTextConfig.convert_rope_params_to_dict`, the module's `ntk_alpha`); the legacy
  `xdrope_section` is `mrope_section`.

Per layer type (NeoMME; Cohere Compass, `CohereCompassRotaryEmbedding`: the interleaved layout
with each layer type's own `mrope_section`, default [24, 20, 20]): the rotary module keeps one
inverse frequency (rope_theta, rope_type, partial width) per layer type and recomposes each
alike, so each `rope:<layer type>` table carries its own `notes["mrope"]`. `notes["mrope"]["axes"]`
names the position axes in order (three, or NeoMME's two): `pair_axes` index into them.

ERNIE-4.5-VL pre-permutes its inverse frequencies (`inv_freq_3d`: the even then the odd pairs of
the first s[0]+s[1]) and undoes it by stacking h and w back: pair i keeps frequency inv_freq[i],
so the table is the plain one; it needs s[0] == s[1] and s[2] > 0, and its config class rejects
any rope_type but "default". Pairing (half split with `cat(c, c)` or interleaved with
`repeat_interleave`) is each family's own `apply_rotary_pos_emb`, as for every RoPE model.

`mrope_section` comes from the rope parameters (v5 `rope_parameters`, v4 `rope_scaling`, where
Qwen2-VL spells the type `{"type": "mrope"}` for the default RoPE), else the rotary module's
default. A section the model itself cannot apply (chunked sections not summing to d/2, ERNIE's
unequal h/w sections) is refused naming `mrope_section`.

The position ids of text, image and video tokens are `posenc.encodings.mrope_index` (the
`get_rope_index` rule of each model, `POST /v1/mrope/position_ids`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from posenc.encodings.config_values import fail
from posenc.encodings.hf_config.rope import RopeModel
from posenc.encodings.hf_config.view import ConfigView, Entry

MROPE_KEYS = ("mrope_section", "mrope_interleaved")
"""Rope-parameter keys of M-RoPE models; `mrope_interleaved` is informational in transformers 5
(the layout is the modeling code's, not the key's)."""


@dataclass(frozen=True)
class MRopeFacts:
    """One M-RoPE family: `layout` ("chunked", "interleaved", "ernie", "row_column",
    "channel_chunks": axes named by the section's length, `channel_axis_names`), the rotary
    module's default `mrope_section` (empty for "row_column": the module's own split), the
    `get_rope_index` rule of `mrope_index` (None: not served), the position `axes` in order, and
    `per_layer_type` (rope parameters, hence tables and sections, per layer type), and
    `pops_flat_keys` (the config class drops a flat rope_theta / rope_type saved beside them)."""

    layout: str
    default_section: tuple[int, ...]
    rule: str | None
    axes: tuple[str, ...] = ("temporal", "height", "width")
    per_layer_type: bool = False
    pops_flat_keys: bool = False


_QWEN2 = MRopeFacts("chunked", (16, 24, 24), "qwen2_vl")
_GLM = MRopeFacts("chunked", (8, 12, 12), "qwen3_vl")
_QWEN3 = MRopeFacts("interleaved", (24, 20, 20), "qwen3_vl")
_QWEN35 = MRopeFacts("interleaved", (11, 11, 10), "qwen3_vl")

MROPE_MODELS: dict[str, MRopeFacts] = {
    # transformers 5.24 modeling_<model>.py: `<Model>RotaryEmbedding.recomposition_frequencies`
    # and `get_rope_index` (whose body glm4v, glm4v_moe, glm_ocr, qwen3_5 and qwen3_vl share).
    **dict.fromkeys(("qwen2_vl", "qwen2_vl_text", "paddleocr_vl", "paddleocr_vl_text"), _QWEN2),
    **dict.fromkeys(
        ("qwen2_5_vl", "qwen2_5_vl_text"), MRopeFacts("chunked", (16, 24, 24), "qwen2_5_vl")
    ),
    **dict.fromkeys(
        ("qwen2_5_omni", "qwen2_5_omni_thinker", "qwen2_5_omni_text"),
        MRopeFacts("chunked", (16, 24, 24), "qwen2_5_omni"),
    ),
    **dict.fromkeys(
        ("qwen2_5_omni_talker",),
        MRopeFacts("chunked", (16, 24, 24), None),
    ),
    **dict.fromkeys(
        ("glm4v", "glm4v_text", "glm4v_moe", "glm4v_moe_text", "glm_ocr", "glm_ocr_text"), _GLM
    ),
    **dict.fromkeys(("glm_image", "glm_image_text"), MRopeFacts("chunked", (8, 12, 12), None)),
    **dict.fromkeys(("qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text"), _QWEN3),
    **dict.fromkeys(("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"), _QWEN35),
    **dict.fromkeys(("qwen4_exp", "qwen4_exp_text"), _QWEN35),
    **dict.fromkeys(
        (
            "qwen3_omni_moe_thinker",
            "qwen3_omni_moe_text",
            "qwen3_omni_moe_talker_text",
            "cosmos3_edge",
            "cosmos3_edge_text",
        ),
        MRopeFacts("interleaved", (24, 20, 20), None),
    ),
    # HY-V4-VL: Qwen3-VL's interleaved THW layout over the qk_rope_head_dim frequencies; its
    # module emits cat(c, c) whose first half its apply_rotary_pos_emb repeat_interleaves
    # (pairs (2i, 2i+1), GLM style); its get_rope_index is not served
    **dict.fromkeys(("hy_v4_vl", "hy_v4_vl_text"), MRopeFacts("interleaved", (24, 20, 20), None)),
    **dict.fromkeys(
        ("ernie4_5_vl_moe", "ernie4_5_vl_moe_text"),
        MRopeFacts("ernie", (22, 22, 20), "ernie4_5_vl"),
    ),
    # Cohere Compass: Qwen3-VL's interleaved THW layout, a section per layer type
    **dict.fromkeys(
        ("cohere_compass", "cohere_compass_text"),
        MRopeFacts("interleaved", (24, 20, 20), None, per_layer_type=True, pops_flat_keys=True),
    ),
    # NeoMME: two axes (row, column), even pairs row and odd pairs column, per layer type
    "neomme": MRopeFacts("row_column", (), None, axes=("row", "column"), per_layer_type=True),
    # HunYuan-VL: chunks of 2 * mrope_section[k] channels of the full width read axis k
    **dict.fromkeys(("hunyuan_vl", "hunyuan_vl_text"), MRopeFacts("channel_chunks", (), None)),
}
"""model_type -> its M-RoPE facts (the composite type, for flat v4 config.json files, and the
text config's type)."""

OMNI_THINKERS = {"qwen2_5_omni": "qwen2_5_omni_thinker", "qwen3_omni_moe": "qwen3_omni_moe_thinker"}
"""Omni configs whose language model is `thinker_config.text_config` (the talker and the speech
parts are not served)."""


def pair_axes(layout: str, section: list[int], pairs: int) -> list[int]:
    """The position axis (0 temporal, 1 height, 2 width; "row_column": 0 row, 1 column) each of
    `pairs` frequency pairs reads.

    Args:
        layout: "chunked", "interleaved", "ernie" or "row_column" (see the module table).
        section: the `mrope_section` pair counts per axis (validated by the caller).
        pairs: rotary_dim // 2, the table's half width.

    Returns:
        A list of `pairs` axis indices.
    """
    if layout == "chunked":
        return [k % 3 for k, count in enumerate(section) for _ in range(count)]
    if layout == "row_column":
        return [i % 2 for i in range(pairs)]
    if layout == "interleaved":
        axes = [0] * pairs
        for axis in (1, 2):
            for i in range(axis, min(section[axis] * 3, pairs), 3):
                axes[i] = axis
        return axes
    hw = section[0] + section[1]
    return [(1 if i % 2 == 0 else 2) if i < hw else 0 for i in range(pairs)]


def channel_axes(section: list[int]) -> list[int]:
    """The position axis of each of the 2 * sum(section) channels of the full-width (half-split,
    `cat(c, c)`) table under HunYuan-VL's recomposition: chunk k of 2 * section[k] channels
    reads axis k (`HunYuanVLRotaryEmbedding.recomposition_frequencies`, `m[i % len(section)]`
    over `len(section)` chunks)."""
    return [k for k, count in enumerate(section) for _ in range(2 * count)]


def channel_axis_names(count: int) -> tuple[str, ...]:
    """HunYuan-VL's axis names (`HunYuanVLTextConfig` docstring: (width, height, image_index)
    for three axes, (position, width, height, image_index) for four); `axis<k>` otherwise."""
    if count == 3:
        return ("width", "height", "image_index")
    if count == 4:
        return ("position", "width", "height", "image_index")
    return tuple(f"axis{k}" for k in range(count))


def read_section(value: Any, key: str, layout: str, pairs: int) -> list[int]:
    """`mrope_section` checked against what the model's own recomposition can apply."""
    if layout == "channel_chunks":
        if (
            not isinstance(value, (list, tuple))
            or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        ):
            fail(key, "must be non-negative integers (frequency pairs per position axis)", value)
        if sum(value) != pairs:
            fail(
                key,
                f"sums to {sum(value)}, but HunYuanVLTextConfig requires head_dim / 2 = {pairs} "
                "(its chunks of 2 * mrope_section[k] channels split the full head)",
                value,
            )
        return [int(v) for v in value]
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        fail(key, "must be three non-negative integers (T, H, W frequency pairs)", value)
    section = [int(v) for v in value]
    if layout != "interleaved" and sum(section) != pairs:
        fail(
            key,
            f"sums to {sum(section)}, but the rotary width has {pairs} frequency pairs "
            "(rotary_dim / 2): the model's recomposition splits exactly that many",
            value,
        )
    if layout == "ernie" and (section[0] != section[1] or section[2] == 0):
        fail(
            key,
            "ERNIE-4.5-VL interleaves equal height and width sections and needs a temporal one: "
            "[s, s, t] with t > 0",
            value,
        )
    return section


@dataclass(frozen=True)
class MRopeModel(RopeModel):
    """A text model with M-RoPE: transformers' generic RoPE reading (the 1-D table), the
    `mrope_section` keys taken out of the rope parameters, and `notes["mrope"]` added."""

    facts: MRopeFacts = _QWEN2

    def rename(self, rope_type: str, params: Mapping[str, Any]) -> str:
        if self.facts.layout == "channel_chunks":
            # HunYuanVLTextConfig.convert_rope_params_to_dict: "xdrope" is "dynamic";
            # HunYuanVLRotaryEmbedding: "dynamic" with an alpha is the fixed NTK-alpha base.
            rope_type = "dynamic" if rope_type == "xdrope" else rope_type
            rope_type = super().rename(rope_type, params)
            return "ntk_alpha" if rope_type == "dynamic" and params.get("alpha") else rope_type
        # Qwen2VLTextConfig.convert_rope_params_to_dict: "mrope" is the default RoPE.
        return "default" if rope_type == "mrope" else super().rename(rope_type, params)

    def layers(self, view: ConfigView) -> tuple[str, dict[str | None, dict[str, Any] | None]]:
        key, layers = super().layers(per_layer_view(view, self.facts))
        drop = (
            (*MROPE_KEYS, "xdrope_section") if self.facts.layout == "channel_chunks" else MROPE_KEYS
        )
        return key, {
            t: None if p is None else {k: v for k, v in p.items() if k not in drop}
            for t, p in layers.items()
        }

    def entries(self, view: ConfigView) -> list[Entry]:
        key, raw_layers = RopeModel.layers(self, per_layer_view(view, self.facts))
        nested = list(raw_layers) != [None]
        if nested and not self.facts.per_layer_type:
            fail(key, "M-RoPE with rope parameters per layer type is not mapped", None)
        if self.facts.per_layer_type and not nested:
            fail(
                key,
                f"flat or empty, while model_type {view.model_type!r}'s rotary module reads "
                "rope_parameters[layer_type] (one inverse frequency and mrope_section per layer "
                "type; transformers raises KeyError): nest them by layer type",
                None,
            )
        if self.facts.per_layer_type:
            _, filled = self.layers(view)
            missing = [t for t in self.declared_layer_types(view) if t not in filled]
            if missing:
                fail(
                    key,
                    f"has no rope parameters for layer type(s) {sorted(set(missing))} of "
                    "layer_types: the rotary module reads rope_parameters[layer_type] for each "
                    "(transformers raises KeyError)",
                    None,
                )
        entries = super().entries(view)
        layout = self.facts.layout
        for entry in entries:
            layer_key = key if entry.role is None else f"{key}.{entry.role}"
            raw = (raw_layers.get(entry.role) or {}).get("mrope_section")
            pairs = int(entry.data.get("rotary_dim", entry.data["head_dim"])) // 2
            if layout == "channel_chunks":
                raw = hunyuan_section(raw_layers.get(entry.role) or {}, layer_key)
                section = read_section(raw, f"{layer_key}.mrope_section", layout, pairs)
            elif layout == "row_column":
                section = row_column_section(layer_key, pairs)
            else:
                given = list(self.facts.default_section) if raw is None else raw
                section = read_section(given, f"{layer_key}.mrope_section", layout, pairs)
            if layout == "ernie" and entry.notes.get("rope_type") != "default":
                fail(
                    f"{key}.rope_type",
                    "ERNIE-4.5-VL's rotary module accepts only the default RoPE",
                    entry.notes.get("rope_type"),
                )
            if (
                layout == "channel_chunks"
                and entry.notes.get("rope_type") == "ntk_alpha"
                and not view.has("head_dim")
            ):
                fail(
                    view.key("head_dim"),
                    "required with the NTK-alpha rope (HunYuanVLRotaryEmbedding."
                    "compute_ntk_alpha_rope_parameters reads config.head_dim, which "
                    "HunYuanVLTextConfig leaves None: transformers raises TypeError)",
                    None,
                )
            entry.notes["mrope"] = mrope_notes(self.facts, section, pairs, raw is None)
            if entry.notes.get("rope_type") == "dynamic":
                # dynamic_rope_update: seq_len = max(position_ids) + 1 over the axes.
                entry.notes["mrope"]["seq_len"] = (
                    "dynamic NTK: transformers takes seq_len = max(position_ids) + 1 over the "
                    f"{len(entry.notes['mrope']['axes'])} axes (N + mrope_position_deltas), "
                    "not the token count N: pass that as seq_len"
                )
            # An odd head size is the config's: name the key a spec error comes from.
            size = view.key("head_dim" if view.has("head_dim") else "hidden_size")
            entry.config_keys = {"rotary_dim": size, "head_dim": size, **(entry.config_keys or {})}
        return entries


def per_layer_view(view: ConfigView, facts: MRopeFacts) -> ConfigView:
    """The view whose `rope_parameters` drop the flat `rope_theta` / `rope_type` saved beside
    per-layer-type dicts, as `CohereCompassTextConfig.convert_rope_params_to_dict` pops them
    (released hub files carry such dangling keys); the view itself otherwise."""
    params = view.data.get("rope_parameters")
    if not facts.pops_flat_keys or not isinstance(params, Mapping):
        return view
    if not any(isinstance(v, Mapping) for v in params.values()):
        return view
    dangling = {"rope_theta", "rope_type"} & set(params)
    if not dangling:
        return view
    data = {**view.data, "rope_parameters": {k: v for k, v in params.items() if k not in dangling}}
    cleaned = ConfigView(
        data,
        view.prefix,
        view.model_type,
        view.defaults if view.has_class_defaults else None,
        view.aliases,
    )
    cleaned.applied = view.applied
    return cleaned


def row_column_section(key: str, pairs: int) -> list[int]:
    """NeoMME's split of `pairs` frequency pairs over (row, column): even pairs read the row,
    odd pairs the column (`NeoMMERotaryEmbedding.recomposition_frequencies` takes
    `freq[0][..., 0::2]` and `freq[1][..., 1::2]` and stacks them back pair by pair). Its config
    class requires a rotary width that is a multiple of four (`_validate_rotary_dims`): with an
    odd pair count the two strided halves differ in length and the stack fails."""
    if pairs % 2:
        fail(
            key.rsplit(".", 1)[0] + ".partial_rotary_factor" if "." in key else key,
            f"gives a rotary width of {2 * pairs} channels, not a multiple of 4: NeoMME's "
            "config class refuses it (its row and column pairs alternate)",
            None,
        )
    return [pairs // 2, pairs // 2]


def hunyuan_section(params: Mapping[str, Any], key: str) -> Any:
    """HunYuan-VL's `mrope_section` (or its legacy `xdrope_section`, which
    `HunYuanVLTextConfig._normalize_mrope_section_alias` moves there; both and different: its
    ValueError). None is refused: `HunYuanVLRotaryEmbedding.forward` expands the position ids
    over `len(mrope_section)` axes (TypeError on None), the config class has no default."""
    section, legacy = params.get("mrope_section"), params.get("xdrope_section")
    if section is not None and legacy is not None and list(section) != list(legacy):
        fail(f"{key}.xdrope_section", f"differs from mrope_section {section}", legacy)
    section = legacy if section is None else section
    if section is None:
        fail(
            f"{key}.mrope_section",
            "required: HunYuanVLRotaryEmbedding expands the position ids over "
            "len(mrope_section) axes and has no default section (transformers raises TypeError)",
            None,
        )
    return section


def mrope_notes(facts: MRopeFacts, section: list[int], pairs: int, default: bool) -> dict[str, Any]:
    """What a runtime needs beside the 1-D table to apply the model's M-RoPE."""
    if facts.layout == "channel_chunks":
        names = channel_axis_names(len(section))
        return {
            "mrope_section": section,
            "section_source": "config",
            "layout": facts.layout,
            "axes": list(names),
            "channel_axes": channel_axes(section),
            "apply": f"position_ids ({len(names)}, N) = {', '.join(names)}; full-width (d = "
            f"{2 * pairs}, cat(c, c)) cos[n, c] = table_cos_full[position_ids[channel_axes[c], "
            "n], c] for channel c (sin alike): the two channels of a rotate_half pair may read "
            "different axes; text-only tokens have equal ids on every axis: the table's rows",
            "position_ids": "this model's get_rope_index is not served",
            "v2_parameters": {"mrope_section": section, "mrope_layout": "channel_chunks"},
        }
    axes = len(facts.axes)
    source = "the rotary module's default" if default else "config"
    if facts.layout == "row_column":
        source = "the rotary module (NeoMMERotaryEmbedding: even pairs row, odd pairs column)"
    notes: dict[str, Any] = {
        "mrope_section": section,
        "section_source": source,
        "layout": facts.layout,
        "axes": list(facts.axes),
        "pair_axes": pair_axes(facts.layout, section, pairs),
        "apply": f"position_ids ({axes}, N) = {', '.join(facts.axes)}; cos[n, i] = "
        "table_cos[position_ids[pair_axes[i], n], i] for pair i (sin alike), then widened as "
        f"`pairing` says; text-only tokens have {axes} equal ids: the table's rows",
        "position_ids": (
            f"POST /v1/mrope/position_ids (rule {facts.rule!r}: transformers' get_rope_index)"
            if facts.rule is not None
            else "this model's get_rope_index is not served"
        ),
    }
    if facts.layout == "row_column":
        notes["v2_parameters"] = {"mrope_section": section, "mrope_layout": "row_column"}
    elif facts.layout == "ernie":
        notes["v2_parameters"] = {"mrope_section": section, "mrope_layout": "ernie"}
    else:
        notes["v2_parameters"] = {
            "mrope_section": section,
            "mrope_interleaved": facts.layout == "interleaved",
        }
    return notes
