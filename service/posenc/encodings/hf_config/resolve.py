"""`resolve_hf_config`: the model's entries validated as specs, grouped into distinct tables,
filtered by family and layer type, with the caller's overrides applied; `resolve_hf_parts`: the
same, serving what can be served and listing the parts that cannot (`Unserved`) with the reason
(what `/v1/resolve` answers)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from posenc.encodings.base import FAMILIES, SpecBase, content_key, validate_as
from posenc.encodings.config_values import fail
from posenc.encodings.errors import ConfigError, FieldProblem, SpecError
from posenc.encodings.hf_config.models import entries as model_entries
from posenc.encodings.hf_config.models import text_view
from posenc.encodings.hf_config.rope import profile_notes
from posenc.encodings.hf_config.unmapped import COMPOSITES, left_out
from posenc.encodings.hf_config.view import Entry
from posenc.encodings.hf_config.vision_rope import not_served, vision_entries


@dataclass(frozen=True)
class NamedSpec:
    """One table a model needs: `name` is the family or "family:role" ("rope",
    "rope:sliding_attention", "t5_bias:decoder", "sinusoidal:encoder"), `spec` the validated spec,
    `notes` what a runtime must know beside the table (scales, switch points, pairing, ...)."""

    name: str
    spec: SpecBase
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Unserved:
    """A part of the model that gets no table: `part` (the table's name, or the sub-model:
    "vision_config", "text_config", "text_encoder"), `reason` (what is missing, or the encoding
    posenc cannot express) and `config_key` (the config.json key the part comes from, or the
    request field that would serve it, such as `table_key`)."""

    part: str
    reason: str
    config_key: str

    def problem(self) -> FieldProblem:
        """The part as a `ConfigError` problem (field = `config_key`)."""
        return FieldProblem(self.config_key, f"{self.part}: {self.reason}", None)


@dataclass(frozen=True)
class Resolution:
    """What `resolve_hf_parts` returns: the tables served (`specs`, as `resolve_hf_config`
    returns them) and the parts that get none (`unserved`, in config order)."""

    specs: list[NamedSpec]
    unserved: list[Unserved]


def _apply_overrides(entry: Entry, overrides: Mapping[str, Any]) -> dict[str, Any]:
    fields = FAMILIES[entry.family].spec_type.model_fields
    data = dict(entry.data)
    for name, value in overrides.items():
        if name not in fields or name == "kind":
            continue
        if name in ("rotary_dim", "partial_rotary_factor"):
            data.pop("rotary_dim", None)
            data.pop("partial_rotary_factor", None)
        data[name] = value
    # What this model's consumer under the requested profile reads (Entry.profiles); no
    # profile is profile `hf`, the model's own module and apply function.
    profile = str(data.get("profile") or "hf")
    for name, value in (entry.profiles or {}).get(profile, {}).items():
        if name not in overrides:
            data[name] = value
    return data


def _unbuildable(entry: Entry, data: Mapping[str, Any]) -> FieldProblem | None:
    """Why the entry's table cannot be built from this config and request, or None: the mapper's
    `problem`, or the checkpoint table a learned entry needs and the request does not give."""
    if entry.problem is not None:
        return entry.problem
    if entry.weights is not None and data.get("table") is None and data.get("table_key") is None:
        return FieldProblem(
            "table_key",
            f"learned absolute positions: config.json does not carry the checkpoint's "
            f"{entry.weights} (table_shape {data.get('table_shape')}); upload it (POST "
            "/v1/uploads) and pass table_key=..., or pass table=... inline",
            None,
        )
    return None


def _validate(entry: Entry, data: Mapping[str, Any]) -> SpecBase:
    family = FAMILIES[entry.family]
    what = entry.family if entry.role is None else f"{entry.family}:{entry.role}"
    problem = _unbuildable(entry, data)
    if problem is not None:
        raise ConfigError("cannot map config", [problem])
    try:
        return validate_as(family.spec_type, data, what)
    except SpecError as err:
        problems = [
            FieldProblem(
                "max_position_embeddings",
                "missing from the config: pass max_positions=... for the rows wanted",
                None,
            )
            if p.field == "max_positions" and p.message == "Field required"
            else _config_problem(p, entry.config_keys or {})
            for p in err.problems
        ]
        raise ConfigError(f"config maps to an invalid {what} spec", problems) from None


def _config_problem(problem: FieldProblem, config_keys: Mapping[str, str]) -> FieldProblem:
    """The problem with its spec field path rewritten to the config key it came from."""
    head, dot, rest = problem.field.partition(".")
    key = config_keys.get(head)
    if key is None:
        return problem
    return FieldProblem(f"{key}{dot}{rest}", problem.message, problem.value)


@dataclass
class _Group:
    family: str
    role: str | None
    spec: SpecBase
    notes: dict[str, Any]
    layer_types: list[str] = field(default_factory=list)


def resolve_hf_config(
    config: Mapping[str, Any],
    /,
    *,
    kind: str | None = None,
    layer_type: str | None = None,
    **overrides: Any,
) -> list[NamedSpec]:
    """Every position table a transformers model needs, from its config.json contents; a table
    that cannot be built fails the whole config (`resolve_hf_parts` serves the others).

    Args:
        config: the config dict (v4 `rope_scaling` or v5 `rope_parameters` shape; multimodal
            configs are read through `text_config`).
        kind: keep only this family ("rope", "alibi", "t5_bias", "sinusoidal",
            "relative_index", "learned", "sinusoidal_2d", "vision_rope"); other tables are not
            validated.
        layer_type: keep only specs used by this layer type ("sliding_attention",
            "full_attention") or role ("encoder", "decoder").
        overrides: spec fields applied to every produced spec whose family has the field
            (`max_positions`, `dtype`, `profile`, `precision`, `seq_len`, `interleaved`,
            `key_length`, `table_key`, `new_grid`, `window_size`, ...).

    Returns:
        One `NamedSpec` per distinct table, in config order: name "family" when the model needs
        one table of that family, "family:role" per layer type or role otherwise.

    Raises:
        ConfigError: naming the key that cannot be mapped, or an override no produced spec takes.
    """
    return _resolve(config, kind, layer_type, overrides, partial=False).specs


def resolve_hf_parts(
    config: Mapping[str, Any],
    /,
    *,
    kind: str | None = None,
    layer_type: str | None = None,
    **overrides: Any,
) -> Resolution:
    """`resolve_hf_config`, serving what can be served: a table that cannot be built (a learned
    table without `table_key`, a mapper's problem), a composite model's part posenc does not map
    (`unmapped.LEFT_OUT`) and a refused `text_config` beside mapped parts (`unmapped.COMPOSITES`)
    are listed in `unserved` instead of failing the config.

    Raises:
        ConfigError: when nothing at all can be served (every unserved part as a problem), and
            for everything `resolve_hf_config` raises besides unbuildable tables.
    """
    return _resolve(config, kind, layer_type, overrides, partial=True)


def _composite_entries(
    config: Mapping[str, Any], partial: bool, unserved: list[Unserved], others: bool
) -> list[Entry]:
    """The text model's entries, plus those of a composite model's other parts; a refused text
    side is an unserved part when `partial` and the model has other parts (`COMPOSITES`, or
    `others`: a served vision tower)."""
    view = text_view(config)
    composite = COMPOSITES.get(str(config.get("model_type")))
    if composite is None and not others:
        return model_entries(view)
    try:
        entries = model_entries(view)
    except ConfigError as err:
        if not partial:
            raise
        entries = []
        part = "text_config" if "text_config" in config else "text"
        unserved.extend(Unserved(part, p.message, p.field) for p in err.problems)
    return entries + ([] if composite is None else composite(config))


def _resolve(
    config: Mapping[str, Any],
    kind: str | None,
    layer_type: str | None,
    overrides: Mapping[str, Any],
    *,
    partial: bool,
) -> Resolution:
    if not isinstance(config, Mapping):
        raise ConfigError(
            "a config must be a JSON object",
            [FieldProblem("(config)", "expected an object", type(config).__name__)],
        )
    view = text_view(config)
    groups: dict[str, _Group] = {}
    unserved: list[Unserved] = []
    # vision towers' rotary tables (`vision_rope:vision`) follow the text ones; asked for alone,
    # the text side is not mapped (it may be refused while the tower is served)
    required = kind == "vision_rope"
    vision_unserved: list[Unserved] = []
    vision = _vision_entries(config, required, partial, vision_unserved)
    text = [] if required else _composite_entries(config, partial, unserved, bool(vision))
    entries = text + vision
    unserved.extend(vision_unserved)
    for entry in entries:
        if kind is not None and entry.family != kind:
            continue  # not validated: a table not asked for cannot fail the request
        data = _apply_overrides(entry, overrides)
        problem = _unbuildable(entry, data) if partial else None
        if problem is not None:
            name = entry.family if entry.role is None else f"{entry.family}:{entry.role}"
            if layer_type is None or entry.role in (None, layer_type):
                unserved.append(Unserved(name, problem.message, problem.field))
            continue
        spec = _validate(entry, data)
        key = content_key(spec)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(entry.family, entry.role, spec, dict(entry.notes))
        if entry.family == "rope" and entry.role is not None:
            group.layer_types.append(entry.role)
    per_family: dict[str, int] = {}
    for group in groups.values():
        per_family[group.family] = per_family.get(group.family, 0) + 1
    result: list[NamedSpec] = []
    declared = view.data.get("layer_types")
    left_out = _left_out(config)
    for group in groups.values():
        role = group.role
        if group.family == "rope":
            role = "+".join(group.layer_types) if per_family["rope"] > 1 else None
        name = group.family if role is None else f"{group.family}:{role}"
        notes = dict(group.notes)
        notes.update(profile_notes(getattr(group.spec, "profile", None), notes))
        if group.layer_types:
            notes["layer_types"] = list(group.layer_types)
        if left_out:
            notes["not_served"] = "; ".join(u.reason for u in left_out)
        if kind is not None and group.family != kind:
            continue
        if layer_type is not None and not _serves(group, layer_type, declared):
            continue
        result.append(NamedSpec(name=name, spec=group.spec, notes=notes))
    if not result and unserved:
        raise ConfigError("nothing in this config can be served", [u.problem() for u in unserved])
    if not result:
        families = sorted({e.family for e in entries})
        if kind is not None and kind not in families:
            fail("kind", f"the config has no {kind!r} table; it has {families}", kind)
        roles = sorted({r for g in groups.values() for r in (*g.layer_types, g.role) if r})
        fail("layer_type", f"no table for this layer type; known: {roles}", layer_type)
    _check_overrides(result, overrides)
    unserved.extend(left_out)
    return Resolution(result, unserved)


def _left_out(config: Mapping[str, Any]) -> list[Unserved]:
    """The parts of `config` posenc leaves out by design (`unmapped.left_out`: `LEFT_OUT` and a
    backbone with position tables; a refused vision rotary): listed in `unserved` and, on every
    table, in `notes["not_served"]`."""
    parts = [Unserved(*part) for part in left_out(config)]
    if (tower := not_served(config)) is not None:
        parts.append(Unserved("vision_rope:vision", tower, "vision_config"))
    return parts


def _vision_entries(
    config: Mapping[str, Any], required: bool, partial: bool, unserved: list[Unserved]
) -> list[Entry]:
    """`vision_entries`; a tower whose config cannot be mapped is an unserved part when
    `partial` and the tower was not asked for alone."""
    try:
        return vision_entries(config, required=required)
    except ConfigError as err:
        if not partial or required:
            raise
        unserved.extend(Unserved("vision_rope:vision", p.message, p.field) for p in err.problems)
        return []


def _serves(group: _Group, layer_type: str, declared: Any) -> bool:
    if group.layer_types:
        return layer_type in group.layer_types
    if group.role is not None:
        return group.role == layer_type
    # One table for every layer: it serves any declared layer type (or any, if none declared).
    return not isinstance(declared, list) or layer_type in declared


def _check_overrides(result: list[NamedSpec], overrides: Mapping[str, Any]) -> None:
    for name in overrides:
        if name == "kind" or not any(
            name in FAMILIES[n.spec.kind].spec_type.model_fields for n in result
        ):
            kinds = sorted({n.spec.kind for n in result})
            fail(name, f"no produced spec ({kinds}) has this field", overrides[name])


def from_hf_config(config: Mapping[str, Any], /, **overrides: Any) -> list[SpecBase]:
    """The specs of `resolve_hf_config(config, **overrides)`, without names and notes."""
    return [n.spec for n in resolve_hf_config(config, **overrides)]
