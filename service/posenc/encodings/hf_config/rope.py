"""RoPE from a config.json: transformers' generic reading of a model's rope parameters.

`RopeModel` reads what every RoPE model's config class shares (transformers 5
`RotaryEmbeddingConfigMixin.standardize_rope_params`, `modeling_rope_utils.py`): the v5
`rope_parameters` dict (flat, or nested per layer type, a null entry marking a NoPE layer type) or
the v4 `rope_scaling` plus top-level keys, `rope_theta`, `partial_rotary_factor`, head_dim, the
pairing of multi-head latent attention (`qk_rope_head_dim`, `rope_interleave`). Each method is one
fact a model family may state differently; `models.py` holds the families' overrides. The
variant's own `from_hf` (`rope/variants/<rope_type>.py`) maps its keys to `rope_scaling`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from posenc.encodings.config_values import check_number, fail
from posenc.encodings.errors import did_you_mean
from posenc.encodings.hf_config.classes import config_class, known_model_types
from posenc.encodings.hf_config.view import ConfigView, Entry, head_dim, max_positions
from posenc.encodings.rope.variants import VARIANTS, HfRopeParams

ROPE_TYPES = tuple(name for name, variant in VARIANTS.items() if variant.params.in_transformers)
"""rope_type values a config may name (transformers' ROPE_INIT_FUNCTIONS plus "default"): the
registered variants that transformers names."""

ROPE_KEYS = (
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "rotary_pct",
    "rotary_emb_base",
    "rotary_dim",
    "qk_rope_head_dim",
    "partial_rotary_factor",
)
"""Keys whose presence marks a RoPE model even when its model_type is not listed anywhere."""

SCALAR_ROPE_KEYS = frozenset({"rope_type", "type", "rope_theta", "factor", "partial_rotary_factor"})


def has_rope(view: ConfigView) -> bool:
    return any(view.has(k) for k in ROPE_KEYS)


def beside_parameters(view: ConfigView) -> None:
    """Refuse a non-empty `rope_scaling` beside a non-empty `rope_parameters`: transformers 5
    reads the pair differently by model (the mixin's `convert_rope_params_to_dict` replaces
    `rope_parameters` by `rope_scaling`, whose `rope_theta` then comes from the top level or the
    class default; the Gemma 3 family updates its full-attention parameters with it; ...), and
    reading either one alone was accepted and wrong (a v5 file given a model card's YaRN
    `rope_scaling` served unscaled)."""
    scaling = view.present("rope_scaling")
    params = view.present("rope_parameters")
    if scaling is None or params is None or not scaling[1] or not params[1]:
        return
    fail(
        view.key(scaling[0]),
        f"given beside {params[0]}: transformers reads the pair by model (rope_scaling in place "
        "of rope_parameters, dropping their rope_theta, or merged into one layer type's); put "
        "its keys into rope_parameters and drop rope_scaling",
        scaling[1],
    )


REVERSED_NOTE = (
    "the model rotates by -angle (its rotate_half is cat(x2, -x1)): the table is its rotary "
    "module's cos/sin; rotate x1*cos + x2*sin, x2*cos - x1*sin, or negate sin for a standard "
    "rotation (ONNX RotaryEmbedding, flash-attn, vLLM)"
)
"""Notes of a family with `reversed_rotation` (nanochat), beside `"rotation": "reversed"`."""


@dataclass(frozen=True)
class RopeModel:
    """How a model family's config carries RoPE; the defaults are transformers' generic reading.

    Data facts: `rope_type_aliases` (a family's own names for a rope_type), `default_parameters`
    (what the config class fills in when the file has no rope parameters), `mla_interleave` (the
    pairing of a multi-head latent attention family that may omit `rope_interleave`),
    `interleaved_pairs` (the family's `apply_rotary_pos_emb` rotates (2i, 2i+1) pairs),
    `module_emits` (what its rotary module returns where the pairing does not say it: "cat" for
    `cat(c, c)` beside interleaved pairs, "half" for half-width cos/sin; profile `hf` serves it),
    `nope` (which layers run attention without rotation: "full_attention" for the families
    whose full-attention layers skip RoPE when `sliding_window` is set, "no_rope_layers" for a 0
    in that per-layer list), `reversed_rotation` (the family's `rotate_half` is
    `cat(x2, -x1)`: it rotates by -angle, declared in the notes), `refusal` (why the family
    cannot be served exactly: every config of it is refused, naming the model_type).
    Behaviour that differs is a subclass overriding one method.
    """

    rope_type_aliases: Mapping[str, str] = field(default_factory=dict)
    default_parameters: Mapping[str, Any] | None = None
    mla_interleave: bool | None = None
    interleaved_pairs: bool = False
    module_emits: str | None = None
    nope: str | None = None
    reversed_rotation: bool = False
    refusal: str | None = None

    def __call__(self, view: ConfigView) -> list[Entry]:
        """The model's RoPE entries; a model type with neither known class defaults nor any RoPE
        key has no position encoding this package can tell."""
        if self.refusal is not None:
            fail(view.key("model_type"), self.refusal, view.model_type)
        if not view.has_class_defaults and not has_rope(view):
            fail(
                view.key("model_type"),
                "unknown model_type without rope/alibi/relative-bias/sinusoidal fields"
                + did_you_mean(view.model_type, known_model_types()),
                view.model_type,
            )
        beside_parameters(view)
        return self.entries(view)

    def entries(self, view: ConfigView) -> list[Entry]:
        """One `rope` entry per layer type with rope parameters (one entry when not nested)."""
        key, layers = self.layers(view)
        nested = list(layers) != [None]
        declared = self.declared_layer_types(view)
        if nested and declared:
            # Only layer types the model's layers use, in the order they first appear
            # (transformers builds one rotary table per type in set(config.layer_types)).
            layers = {t: layers[t] for t in dict.fromkeys(declared) if t in layers}
        refuse_unread_top_level(view, layers)
        length = max_positions(view)
        interleaved = self.interleaved(view)
        nope = self.nope_layers(view)
        if nested and declared:
            # A layer type whose rope parameters are null takes no rotation (Beam's full layers).
            null = {t for t, params in layers.items() if params is None}
            nope = sorted({*nope, *(i for i, t in enumerate(declared) if t in null)})
        entries: list[Entry] = []
        for layer_type, params in layers.items():
            layer_key = key if layer_type is None else f"{key}.{layer_type}"
            if params is None:
                continue  # a NoPE layer type (rope parameters saved as null)
            params = self.with_default_type(view, params, layer_key)
            rope_type = self.rope_type(params, layer_key)
            layer_head_dim = self.layer_head_dim(view, layer_type)
            theta = self.rope_theta(view, params, layer_key, layer_type)
            scaling, notes = VARIANTS[rope_type].from_hf(
                HfRopeParams(
                    params=params,
                    key=layer_key,
                    max_position_embeddings=length,
                    max_position_embeddings_key=view.key("max_position_embeddings"),
                    original_length=partial(
                        original_length, view, params, layer_key, nested, length
                    ),
                    nested=nested,
                )
            )
            data: dict[str, Any] = {
                "kind": "rope",
                "head_dim": layer_head_dim,
                "rope_theta": theta,
                "rope_scaling": scaling,
            }
            if length is not None:
                data["max_positions"] = length
            if not VARIANTS[rope_type].params.spans_head_dim:
                data["rotary_dim"] = self.rotary_dim(view, params, layer_key, layer_head_dim)
            # The pairing, always stated (a profile's default must not stand in for it), and the
            # layout the model's own rotary module emits, which profile `hf` serves.
            data["interleaved"] = bool(interleaved)
            data.update(self.module_layout(view, bool(interleaved)))
            notes = {
                "rope_type": rope_type,
                "pairing": "interleaved" if interleaved else "half_split",
                **notes,
            }
            notes.update(self.extra_notes(view, notes, bool(interleaved)))
            if self.reversed_rotation:
                notes["rotation"] = "reversed"
                notes["rotation_detail"] = REVERSED_NOTE
            if nope:
                notes["nope_layers"] = nope
                notes["nope"] = "these layer indices run attention without rotation (NoPE)"
            entries.append(
                Entry(
                    "rope",
                    layer_type,
                    data,
                    notes,
                    config_keys={"rope_scaling": layer_key},
                    profiles=self.profile_fields(view),
                )
            )
        if not entries:
            fail(key, "no layer type has rope parameters", None)
        if view.applied:
            for entry in entries:
                entry.notes["defaults_applied"] = dict(view.applied)
        return entries

    def with_default_type(
        self, view: ConfigView, params: dict[str, Any], key: str
    ) -> dict[str, Any]:
        """`params` with the class's `default_rope_type` when they name none (transformers'
        `standardize_rope_params`: the axial models' "default" is "axial")."""
        found = view.class_default("rope_type")
        if found is None:
            return params
        named = params.get("rope_type") or params.get("type")
        if named in (None, "default"):
            view.applied[f"{key}.rope_type"] = found[1]
            return {**params, "rope_type": found[1]}
        if found[1] == "axial" and named != "axial":
            # every rotary module of a class whose default_rope_type is axial (the vision towers,
            # MLCD, SAM 2 / SAM 3 video and ViT) raises `ValueError: ... supports only axial rope`
            fail(
                f"{key}.rope_type",
                f"model_type {view.model_type!r} defaults to axial RoPE (default_rope_type), "
                "and transformers' axial rotary modules raise ValueError 'supports only axial "
                f"rope' for {named!r}; axial is a 2-D rotary over patch rows and columns, not a "
                "1-D table",
                named,
            )
        return params

    def layers(self, view: ConfigView) -> tuple[str, dict[str | None, dict[str, Any] | None]]:
        """(key prefix, {layer_type or None: raw rope parameters}) from the v5 or v4 shape."""
        if view.has("rope_parameters"):
            name, params = "rope_parameters", view.data["rope_parameters"]
        elif view.has("rope_scaling"):
            name, params = "rope_scaling", view.data["rope_scaling"]
            scaling = view.data["rope_scaling"]
            flat = isinstance(scaling, Mapping) and any(k in SCALAR_ROPE_KEYS for k in scaling)
            if flat and "rope_scaling" in unread_top_level(view, "alone"):
                # (a rope_scaling nested by layer type is taken as rope_parameters)
                fail(
                    view.key("rope_scaling"),
                    f"not read by model_type {view.model_type!r}: {class_name(view)} does not "
                    "convert a flat v4 rope_scaling into rope parameters (Mellum's no-op "
                    "convert_rope_params_to_dict keeps it flat without rope_theta, and its "
                    "rotary module raises KeyError; ESM's rotary module reads rope_theta "
                    "only); give rope_parameters as the class keeps them",
                    view.data["rope_scaling"],
                )
        elif self.default_parameters is not None:
            name, params = "rope_parameters", dict(self.default_parameters)
        elif (found := view.class_default("rope_parameters")) is not None:
            # the config class's own (transformers fills them in when the file has none); the
            # file's top-level rope_theta / partial_rotary_factor go into them instead
            name, params = "rope_parameters", self.class_parameters(view, found[1])
        else:
            name, params = "rope_parameters", {}
        if not isinstance(params, Mapping):
            fail(view.key(name), "must be an object", params)
        nested = bool(params) and all(
            k not in SCALAR_ROPE_KEYS and (v is None or isinstance(v, Mapping))
            for k, v in params.items()
        )
        if nested:
            return view.key(name), {
                str(k): (None if v is None else dict(v)) for k, v in params.items()
            }
        if name == "rope_parameters" and params and view.has("rope_parameters"):
            self.refuse_flat(view, params)
        return view.key(name), {None: dict(params)}

    def refuse_flat(self, view: ConfigView, params: Mapping[str, Any]) -> None:
        """Refuse a file's flat `rope_parameters` where the config class keeps them per layer
        type (its default `rope_parameters` nested: Gemma 3 / 4, ModernBERT, MiMo-V2-Flash,
        LFM3, ...): the model's rotary module reads `rope_parameters[layer_type]`, so a flat
        dict fails there (`KeyError: 'full_attention'`, or the class's validation) or, in the
        Gemma 3 family, each layer type is filled from the class defaults and the flat keys go
        unread; one table from them would be accepted and wrong. (The v4 `rope_scaling` of a
        released Gemma 3 file is the family's own reading.)"""
        found = view.class_default("rope_parameters")
        default = found[1] if found is not None else None
        if not isinstance(default, Mapping) or not default:
            return
        if not all(
            k not in SCALAR_ROPE_KEYS and (v is None or isinstance(v, Mapping))
            for k, v in default.items()
        ):
            return
        fail(
            view.key("rope_parameters"),
            f"flat, while model_type {view.model_type!r} keeps rope parameters per layer type "
            f"({', '.join(map(str, default))}): transformers' rotary module reads "
            "rope_parameters[layer_type], so a flat dict fails there (KeyError or the config "
            "class's validation) or, in the Gemma 3 family, each layer type takes the class "
            "defaults and the flat keys go unread; nest them by layer type",
            dict(params),
        )

    def class_parameters(self, view: ConfigView, params: Any) -> Any:
        """The class's default rope parameters less the keys the file sets at its top level
        (they are read from there), recorded in `view.applied`."""
        if not isinstance(params, Mapping):
            return params
        unread = unread_top_level(view, "alone")
        top = {
            k
            for k in ("rope_theta", "partial_rotary_factor")
            if view.data.get(k) is not None and k not in unread
        }
        nested = all(v is None or isinstance(v, Mapping) for v in params.values())
        if nested:
            params = {
                k: None if v is None else {n: x for n, x in v.items() if n not in top}
                for k, v in params.items()
            }
        else:
            params = {n: x for n, x in params.items() if n not in top}
        view.applied[view.key("rope_parameters")] = params
        return params

    def declared_layer_types(self, view: ConfigView) -> list[str]:
        """config.layer_types, the type of each layer in order."""
        declared = view.data.get("layer_types")
        if isinstance(declared, list):
            return [str(t) for t in declared]
        return []

    def layer_head_dim(self, view: ConfigView, layer_type: str | None) -> int:
        """head_dim of one layer type: the `per_layer_config` override of its layers, if any;
        without a `per_layer_config` key, `global_head_dim` (the file's, else the class's) for
        the layer types the config class builds one for (`global_head_dim_layer_types` of the
        class data: Gemma 4, Gemma 4 Unified, DiffusionGemma, EmbeddingGemma 2, whose
        `__post_init__` does `per_layer_config = {full layers: {"head_dim": global_head_dim}}`
        when the file gives none, an explicit null included); else the model's head_dim."""
        global_types = view.defaults.get("global_head_dim_layer_types")
        if (
            layer_type is not None
            and "per_layer_config" not in view.data
            and isinstance(global_types, list)
            and layer_type in global_types
        ):
            return int(view.number("global_head_dim"))
        per_layer = view.data.get("per_layer_config")
        layer_types = view.data.get("layer_types")
        if (
            layer_type is not None
            and isinstance(per_layer, Mapping)
            and isinstance(layer_types, list)
        ):
            dims = {
                override.get("head_dim")
                for index, override in per_layer.items()
                if isinstance(override, Mapping)
                and str(index).isdigit()
                and int(index) < len(layer_types)
                and layer_types[int(index)] == layer_type
            }
            dims.discard(None)
            if len(dims) > 1:
                fail(
                    view.key("per_layer_config"),
                    f"layers of {layer_type} disagree on head_dim",
                    dims,
                )
            if dims:
                return int(check_number(view.key("per_layer_config"), dims.pop()))
        return head_dim(view)

    def rename(self, rope_type: str, params: Mapping[str, Any]) -> str:
        """The registered rope_type a config's name stands for (the family's aliases)."""
        return self.rope_type_aliases.get(rope_type, rope_type)

    def rope_type(self, params: Mapping[str, Any], key: str) -> str:
        """The variant of one rope parameter dict (`type` is v4's name for `rope_type`)."""
        raw = params.get("rope_type") or params.get("type") or "default"
        if not isinstance(raw, str):
            fail(f"{key}.rope_type", "must be a string", raw)
        rope_type = self.rename(raw, params)
        if rope_type in ("mrope", "3d") or params.get("mrope_section") is not None:
            fail(
                f"{key}.mrope_section",
                "multimodal RoPE (per-axis position ids) is not a 1-D table",
                params.get("mrope_section", raw),
            )
        if rope_type == "axial":
            fail(
                f"{key}.rope_type",
                "axial: a 2-D rotary over patch rows and columns (the config class's "
                "default_rope_type), not a 1-D table",
                raw,
            )
        if rope_type not in VARIANTS:
            fail(f"{key}.rope_type", f"unsupported rope_type; supported: {list(ROPE_TYPES)}", raw)
        return rope_type

    def rope_theta(
        self, view: ConfigView, params: Mapping[str, Any], key: str, layer_type: str | None
    ) -> float:
        """The base: the rope parameters' `rope_theta`, else the family's default."""
        if params.get("rope_theta") is not None:
            return float(check_number(f"{key}.rope_theta", params["rope_theta"]))
        return self.default_theta(view, layer_type)

    def default_theta(self, view: ConfigView, layer_type: str | None) -> float:
        """The top-level `rope_theta`, else the config class default."""
        value = view.get("rope_theta")
        if value is None:
            fail(
                view.key("rope_theta"),
                f"missing, and model_type {view.model_type!r} has no known default",
                None,
            )
        return float(check_number(view.key("rope_theta"), value))

    def rotary_dim(
        self, view: ConfigView, params: Mapping[str, Any], key: str, layer_head_dim: int
    ) -> int:
        """int(head_dim * partial_rotary_factor): the rope parameters' factor, else the
        top-level one, else the family's rotary fraction, else the class's `__post_init__`
        default (transformers' `convert_rope_params_to_dict` order); head_dim without any."""
        where = f"{key}.partial_rotary_factor"
        fraction = params.get("partial_rotary_factor")
        if fraction is None:
            where = view.key("partial_rotary_factor")
            fraction = view.data.get("partial_rotary_factor")
        if fraction is not None:
            self.refuse_unread_partial(view, params, key, where, fraction)
        if fraction is None:
            where, fraction = self.rotary_fraction(view)
        if fraction is None:
            # the factor the config class's `__post_init__` setdefaults into rope parameters
            # that name none (GLM's 0.5, Qwen3-Next's 0.25: `classes` data); recorded in
            # notes.defaults_applied
            found = view.class_default("partial_rotary_factor")
            if found is not None:
                where = view.key(found[0])
                fraction = found[1]
                view.applied[where] = fraction
        if fraction is None:
            return layer_head_dim
        fraction = check_number(where, fraction)
        if not 0 < fraction <= 1:
            fail(where, "must be in (0, 1]", fraction)
        dim = int(layer_head_dim * fraction)
        if dim % 2:
            fail(
                where,
                f"gives an odd rotary dim int({layer_head_dim} * {fraction}) = {dim}: "
                f"transformers' arange(0, {dim}, 2) / {dim} gives {(dim + 1) // 2} frequencies "
                f"over {dim + 1} rotated channels, which no even rotary_dim reproduces; not "
                "mapped",
                fraction,
            )
        return dim

    def refuse_unread_partial(
        self, view: ConfigView, params: Mapping[str, Any], key: str, where: str, fraction: Any
    ) -> None:
        """Refuse a file's partial_rotary_factor other than 1 with the default RoPE where the
        model's rotary module ignores it (`default_partial_unread` of the class data, probed from
        its `compute_default_rope_parameters`: Llama's, Mistral's, Qwen 3's, Gemma's `dim =
        head_dim`): transformers rotates the whole head, so neither the partial table asked for
        nor the full one is what the file means (the scaled rope types' init functions in
        `modeling_rope_utils` do read the factor)."""
        found = view.class_default("default_partial_unread")
        last = key.rsplit(".", 1)[-1]
        layer = "" if last in ("rope_parameters", "rope_scaling") else last
        if found is None or layer not in found[1]:
            return
        if self.rope_type(params, key) != "default":
            return
        if check_number(where, fraction) == 1:
            return
        fail(
            where,
            f"not read by model_type {view.model_type!r} with the default RoPE: its rotary "
            "module's compute_default_rope_parameters uses dim = head_dim and ignores "
            "partial_rotary_factor, so transformers rotates the whole head; leave it out (or "
            "1.0) for the model's table",
            fraction,
        )

    def rotary_fraction(self, view: ConfigView) -> tuple[str, Any]:
        """(config key, value) of a family's own rotary fraction key; value None without one."""
        return view.key("partial_rotary_factor"), None

    def interleaved(self, view: ConfigView) -> bool | None:
        """Pairing of the checkpoint: True for (2i, 2i+1) pairs, None for half split (profile's
        choice, False for the transformers profile)."""
        if self.interleaved_pairs:
            return True
        if view.known("qk_rope_head_dim"):
            if view.known("rope_interleave"):
                return bool(view.get("rope_interleave"))
            if self.mla_interleave is not None:
                return self.mla_interleave or None
            fail(
                view.key("rope_interleave"),
                f"model_type {view.model_type!r} uses qk_rope_head_dim but its pairing is unknown",
                None,
            )
        return None

    def module_layout(self, view: ConfigView, interleaved: bool) -> dict[str, Any]:
        """Spec fields for what the family's rotary module emits where the pairing alone does
        not say it (profile `hf` serves the module's output to the model's own apply function):
        multi-head latent attention with interleaved pairs emits `cat(c, c)`
        (`DeepseekV3RotaryEmbedding`) for `apply_rotary_pos_emb_interleave`, which reads
        `cos[..., :d/2]` and rotates (x[0::2], x[1::2]); otherwise nothing (`cat(c, c)` for half
        split, `repeat_interleave(c, 2)` for interleaved pairs, as Cohere's module builds it);
        `module_emits` states the others (GLM, ERNIE 4.5, Helium, ...: `cat(c, c)` whose first half
        their apply repeat_interleaves; OpenAI's privacy filter: half width)."""
        if self.module_emits == "half":
            return {"width": "half"}
        if interleaved and (self.module_emits == "cat" or view.has("qk_rope_head_dim")):
            return {"full_layout": "cat"}
        return {}

    def profile_fields(self, view: ConfigView) -> dict[str, dict[str, Any]] | None:
        """Fields a profile's consumer reads differently for this model (`Entry.profiles`):
        TensorRT-LLM's MLA kernel (`mlaKernels.cu`) reads the duplicated (P, d, 2) table that
        `RopeEmbeddingUtils.create_sinusoidal_positions_yarn(duplicate_data=True)` builds."""
        if view.has("qk_rope_head_dim"):
            return {"trtllm": {"width": "full"}}
        return None

    def nope_layers(self, view: ConfigView) -> list[int]:
        """Indices of the layers whose attention takes no rotation, by the family's `nope` rule:
        - "full_attention": full-attention layers never rotate (AFMoE, LARA-mini);
        - "full_attention_when_windowed": they do not when `sliding_window` is set (`if
          self.sliding_window is None or self.is_sliding`: EXAONE 4, Kolibri);
        - "windowed_only": only layers with a sliding window rotate (`self.sliding_window =
          config.sliding_window if sliding else None; if self.sliding_window is not None`:
          Cohere 2, Flint), so no layer does without `sliding_window`;
        - "no_rope_layers": the zeros of that per-layer list (SmolLM3);
        - "layer_rope_theta": its zeros (MuseGlimmer, MuseSpark: the modeling code rotates the
          other layers with the rope_parameters base, so other values must equal it)."""
        if self.nope in ("full_attention", "full_attention_when_windowed", "windowed_only"):
            windowed = view.get("sliding_window") is not None
            if self.nope == "full_attention_when_windowed" and not windowed:
                return []
            types = self.derived_layer_types(view)
            if types is None:
                fail(
                    view.key("layer_types"),
                    f"model_type {view.model_type!r} skips RoPE on some layers by their type: "
                    "layer_types must say which they are",
                    view.data.get("layer_types"),
                )
            nope = {"full_attention"}
            if self.nope == "windowed_only" and not windowed:
                nope.add("sliding_attention")
            return [i for i, t in enumerate(types) if t in nope]
        if self.nope == "layer_rope_theta":
            return self._layer_theta_nope(view)
        if self.nope == "no_rope_layers":
            flags = view.data.get("no_rope_layers")
            if not flags:
                # Llama4TextConfig / SmolLM3Config: a NoPE layer every no_rope_layer_interval.
                interval = int(view.number("no_rope_layer_interval"))
                layers = int(view.number("num_hidden_layers"))
                flags = [int((i + 1) % interval != 0) for i in range(layers)]
            if not isinstance(flags, list):
                fail(view.key("no_rope_layers"), "must be a list of 0/1 per layer", flags)
            return [i for i, use_rope in enumerate(flags) if not use_rope]
        return []

    def derived_layer_types(self, view: ConfigView) -> list[Any] | None:
        """config.layer_types as transformers has it: the file's list, else the one the config
        class's `__post_init__` derives (`layer_types_pattern` of the class data, measured from
        transformers: every p-th layer full attention, `"sliding_attention" if (i + 1) % p else
        "full_attention"`, p the file's `sliding_window_pattern` where the class reads it (Cohere
        2's `kwargs.pop("sliding_window_pattern", 4)`, EXAONE 4), else the class's; the last
        layer forced to full attention where the class does); None when neither says."""
        types = view.data.get("layer_types")
        if isinstance(types, list):
            return types
        rule = view.defaults.get("layer_types_pattern")
        if types is not None or not isinstance(rule, Mapping):
            return None
        pattern = rule["default"]
        if rule.get("key") and view.data.get(rule["key"]) is not None:
            pattern = view.data[rule["key"]]
            if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
                # (i + 1) % pattern: 0 divides by zero, a string ("LLLG") is not read as one
                fail(
                    view.key(rule["key"]),
                    "must be a positive integer (transformers derives layer_types from it: "
                    "every pattern-th layer full attention)",
                    pattern,
                )
        layers = int(view.number("num_hidden_layers"))
        derived = [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
        ]
        if rule.get("last_full") and derived:
            derived[-1] = "full_attention"
        return derived

    def _layer_theta_nope(self, view: ConfigView) -> list[int]:
        thetas = view.data.get("layer_rope_theta")
        if thetas is None:
            # The config class default: every 4th layer counted back from the last is NoPE.
            layers = int(view.number("num_hidden_layers"))
            return [i for i in range(layers) if (layers - 1 - i) % 4 == 0]
        if not isinstance(thetas, list):
            fail(view.key("layer_rope_theta"), "must be a list of per-layer bases", thetas)
        key, layers_params = self.layers(view)
        bases = {
            self.rope_theta(view, params, key, layer_type)
            for layer_type, params in layers_params.items()
            if params is not None
        }
        others = {float(check_number(view.key("layer_rope_theta"), t)) for t in thetas if t}
        if others - bases:
            fail(
                view.key("layer_rope_theta"),
                f"bases {sorted(others - bases)} differ from rope_parameters' {sorted(bases)}: "
                "transformers rotates with the latter; not mapped",
                thetas,
            )
        return [i for i, t in enumerate(thetas) if not t]

    def extra_notes(
        self, view: ConfigView, notes: Mapping[str, Any], interleaved: bool
    ) -> dict[str, Any]:
        """Notes beyond the variant's: multi-head latent attention's softmax scale."""
        if view.known("qk_rope_head_dim"):
            return mla_notes(view, notes, interleaved)
        return {}


STANDARDIZED_ORIGINAL = ("llama3", "yarn", "longrope")
"""The rope_types whose `original_max_position_embeddings` transformers'
`standardize_rope_params` fills in (`modeling_rope_utils.py`)."""


def unread_top_level(view: ConfigView, group: str) -> list[str]:
    """The top-level rope keys the model's config class does not read, `group` "alone" (the file
    has no rope_parameters) or "beside_parameters" (class data `unread_top_level`, probed from
    the class: a no-op `convert_rope_params_to_dict`, a default rope_parameters that already
    holds the key)."""
    found = view.class_default("unread_top_level")
    if found is None or not isinstance(found[1], Mapping):
        return []
    return [str(k) for k in found[1].get(group, [])]


def class_name(view: ConfigView) -> str:
    cls = config_class(view.model_type)
    return cls.name if cls is not None else view.model_type


def refuse_unread_top_level(
    view: ConfigView, layers: Mapping[str | None, Mapping[str, Any] | None]
) -> None:
    """Refuse a top-level rope_theta / partial_rotary_factor the config class does not read
    (`unread_top_level`: "beside_parameters" when the file has rope_parameters, "alone" when it
    has no rope_scaling either)
    unless it equals what the model uses in one of its layer types' rope parameters (`layers`,
    as the family reads them; a missing factor is 1.0: a v4 file's rope_theta of ModernBERT's
    full layers): Laguna's rope_theta 1e6 is served at the
    class default 5e5 by transformers, Apertus' at 12e6."""
    if view.has("rope_parameters"):
        group = "beside_parameters"
    elif view.has("rope_scaling"):
        return  # the v4 dict takes the top-level keys (`convert_rope_params_to_dict`)
    else:
        group = "alone"
    unread = unread_top_level(view, group)
    dicts = [params for params in layers.values() if params is not None]
    for name in ("rope_theta", "partial_rotary_factor"):
        value = view.data.get(name)
        if value is None or name not in unread:
            continue
        value = check_number(view.key(name), value)
        used = [d.get(name, 1.0 if name == "partial_rotary_factor" else None) for d in dicts]
        if any(u == value for u in used):
            continue  # a value the model uses anyway (a v4 file's base of its full layers)
        whose = "the file's" if group == "beside_parameters" else "the class's default"
        fail(
            view.key(name),
            f"not read by model_type {view.model_type!r}: {class_name(view)} takes it from "
            f"{whose} rope_parameters ({', '.join(sorted({repr(u) for u in used})) or 'none'}), "
            "never from the top level; give it inside rope_parameters",
            value,
        )


def original_length(
    view: ConfigView,
    params: Mapping[str, Any],
    key: str,
    nested: bool,
    max_position_embeddings: int | None,
) -> int:
    """transformers' `standardize_rope_params`: a top-level value wins (Phi-3), then the config
    class default (a class with the field), then the value in the rope parameters, then
    max_position_embeddings. It fills
    the value only for a rope_type (as the file spells it) of llama3, yarn or longrope: a family's
    legacy name renamed after it (Phi-3's "su", `Phi3Config.convert_rope_params_to_dict`) must
    carry its own value, else the config does not load (`KeyError: Missing required keys in
    rope_parameters for 'rope_type'='longrope'`); the rotary module standardizes again
    (`_compute_longrope_parameters`), now as longrope, so its table takes the same order."""
    raw = params.get("rope_type") or params.get("type") or "default"
    if raw not in STANDARDIZED_ORIGINAL and params.get("original_max_position_embeddings") is None:
        fail(
            f"{key}.original_max_position_embeddings",
            f"required key missing: rope_type {raw!r} is renamed only after transformers' "
            "standardize_rope_params, which fills original_max_position_embeddings (from "
            "the top level, the class default or max_position_embeddings) for "
            f"{', '.join(STANDARDIZED_ORIGINAL)} only, so transformers cannot load this "
            "config (KeyError: Missing required keys in rope_parameters)",
            None,
        )
    candidates: list[tuple[str, Any]] = []
    if not nested:
        candidates.append(
            (
                view.key("original_max_position_embeddings"),
                view.data.get("original_max_position_embeddings"),
            )
        )
    if not nested:
        # `if hasattr(self, "original_max_position_embeddings")`: a class with that field (Phi-3,
        # Phi-4-multimodal: 4096) overrides the rope parameters' own value with its default
        candidates.append(("(default)", view.defaults.get("original_max_position_embeddings")))
    candidates.append(
        (f"{key}.original_max_position_embeddings", params.get("original_max_position_embeddings"))
    )
    candidates.append((view.key("max_position_embeddings"), max_position_embeddings))
    for where, value in candidates:
        if value is not None:
            if where != f"{key}.original_max_position_embeddings" and not where.startswith(
                view.key("original_max_position_embeddings")
            ):
                # transformers' standardize_rope_params fills the dict's value in
                view.applied[f"{key}.original_max_position_embeddings"] = int(value)
            return int(check_number(where, value))
    fail(f"{key}.original_max_position_embeddings", "required key missing", None)


def mla_notes(view: ConfigView, notes: Mapping[str, Any], interleaved: bool) -> dict[str, Any]:
    """DeepSeek-style attention multiplies its softmax scale by get_mscale(f, mscale_all_dim)**2
    (`yarn_apply_mscale`, transformers#47435); no cos/sin table carries that factor."""
    nope = view.number("qk_nope_head_dim", required=False) or 0
    rope = int(view.get("qk_rope_head_dim"))
    base_scale = (int(nope) + rope) ** -0.5
    multiplier = float(notes.get("softmax_scale_multiplier", 1.0))
    return {
        "softmax_scale": base_scale * multiplier,
        "softmax_scale_note": (
            "attention scores use (qk_nope_head_dim + qk_rope_head_dim)**-0.5 times "
            "softmax_scale_multiplier; apply it in the attention kernel"
        ),
        "transformers_layout": (
            "the rotary module emits cat(c, c) at full width (profile hf serves it: "
            "full_layout 'cat'); apply_rotary_pos_emb_interleave reads cos[..., :d/2] and "
            "rotates the checkpoint's (2i, 2i+1) pairs, de-interleaving q/k into half split"
            if interleaved
            else "half split, cat(c, c)"
        ),
        **INDEXER_NOTES.get(view.model_type, {}),
    }


INDEXER_NOTES: dict[str, dict[str, str]] = {
    model_type: {
        "indexer_pairing": "half_split",
        "indexer": (
            f"the lightning indexer ({indexer}) rotates its rope part with apply_rotary_pos_emb, "
            "half-split pairs (x[..., :d/2], x[..., d/2:]), from this same table, while the MLA "
            "attention rotates interleaved pairs"
        ),
    }
    for model_type, indexer in (("deepseek_v32", "DeepseekV32Indexer"), ("axk2", "AXK2Indexer"))
}
"""DeepSeek-V3.2-style sparse attention whose indexer pairs channels unlike its attention (the
other indexers, GLM-MoE-DSA's, dots.3's, Mistral Large 4's, call apply_rotary_pos_emb_interleave
as their attention does): checked against the modeling files by tests/api/test_consumers.py."""


TORCHTUNE_NOTE = (
    "torchtune's RotaryPositionalEmbeddings rotates (2i, 2i+1) pairs: this half-split "
    "checkpoint's q/k projection rows must be permuted to interleaved order first (torchtune's "
    "checkpoint conversion does it, torchtune/models/convert_weights.py); the table is the same"
)


def profile_notes(profile: str | None, notes: Mapping[str, Any]) -> dict[str, Any]:
    """Notes a profile's consumer needs beside a rope table: torchtune on a half-split model
    expects permuted q/k weights."""
    if profile == "torchtune" and notes.get("pairing") == "half_split":
        return {"torchtune": TORCHTUNE_NOTE}
    return {}


GENERIC_ROPE = RopeModel()
"""transformers' generic reading: Llama, Mistral, Qwen and every model type not in `MAPPERS`."""
