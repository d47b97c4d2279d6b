"""The keywords the client's convenience methods take (`RopeOptions`, `AlibiOptions`,
`SinusoidalOptions`, `T5BiasOptions`, `OnnxOptions`: each declared once, here, and spelled out in
the clients' signatures with `typing.Unpack`), and the spec builders that turn those keywords into
the server's spec JSON (`rope_spec`, `family_spec`, `onnx_body`, `load_config`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from posenc_client._hub import hub_config_path, parse_model_id

JSON = dict[str, Any]


class RopeScalingOptions(TypedDict, total=False):
    """The keys of transformers' `rope_scaling` / `rope_parameters` that the `rope` spec's
    `rope_scaling` field holds; `rope()` takes them flat, as a config.json writes them, and moves
    them there. Which keys a `rope_type` reads is the server's business (`GET /v1/kinds`)."""

    rope_type: str | None
    factor: float | None
    low_freq_factor: float | None
    high_freq_factor: float | None
    original_max_position_embeddings: int | None
    beta_fast: float | None
    beta_slow: float | None
    mscale: float | None
    mscale_all_dim: float | None
    attention_factor: float | None
    truncate: bool | None
    short_factor: Sequence[float] | None
    long_factor: Sequence[float] | None
    alpha: float | None


ROPE_SCALING_KEYS: frozenset[str] = RopeScalingOptions.__optional_keys__
"""Keys of transformers' `rope_scaling` / `rope_parameters` that the `rope_scaling` spec field
holds (those of `RopeScalingOptions`); `rope()` moves them there when given flat, as a
config.json writes them."""

LENGTH_SCALED_TYPES: frozenset[str] = frozenset({"dynamic", "longrope"})
"""rope_types whose `rope_scaling` holds the model's `max_position_embeddings` (their scaling
depends on it); tests/client/test_rope_scaling_keys.py ties this to the server's registry."""


class RopeOptions(RopeScalingOptions, total=False):
    """The keywords of `Client.rope` / `AsyncClient.rope` after `head_dim` and `max_positions`,
    named as in transformers' configs (None: the server's default): the flat scaling keys it
    inherits from `RopeScalingOptions`, and `type`, transformers' old alias of `rope_type`."""

    rope_theta: float | None
    partial_rotary_factor: float | None
    rotary_dim: int | None
    rope_scaling: Mapping[str, Any] | None
    rope_parameters: Mapping[str, Any] | None
    max_position_embeddings: int | None
    type: str | None
    seq_len: int | None
    profile: str | None
    width: str | None
    interleaved: bool | None
    full_layout: str | None
    packing: str | None
    dtype: str | None
    precision: str | None


class AlibiOptions(TypedDict, total=False):
    """The keywords of `Client.alibi` / `AsyncClient.alibi` after `num_heads` (the `alibi` spec's
    fields; None: the server's default)."""

    bias: str | None
    query_length: int | None
    key_length: int | None
    query_offset: int | None
    masked_value: str | None
    alibi_bias_max: float | None
    slope_scale: float | None
    slope_rounding: str | None
    bias_rounding: str | None
    interpolation_factor: float | None
    tp_size: int | None
    tp_rank: int | None
    dtype: str | None


class SinusoidalOptions(TypedDict, total=False):
    """The keywords of `Client.sinusoidal` / `AsyncClient.sinusoidal` after `dim` and
    `max_positions` (the `sinusoidal` spec's fields; None: the convention's or server's
    default)."""

    convention: str | None
    positions: Sequence[float] | None
    base: float | None
    freq_shift: float | None
    layout: str | None
    position_offset: int | None
    padding_idx: int | None
    odd_dim: str | None
    compute_dtype: str | None
    scale: float | None
    dtype: str | None
    frequencies: str | None
    position_step: int | None
    standardize: str | None


class T5BiasOptions(TypedDict, total=False):
    """The keywords of `Client.t5_bias` / `AsyncClient.t5_bias` besides `query_length` (the
    `t5_bias` spec's fields; None: the server's default). `relative_attention_bias` is the
    checkpoint's (num_buckets, H) weight, for the (H, Q, K) `bias`."""

    key_length: int | None
    query_offset: int | None
    num_buckets: int | None
    max_distance: int | None
    bidirectional: bool | None
    relative_attention_bias: Sequence[Sequence[float]] | None
    dtype: str | None


class OnnxOptions(TypedDict, total=False):
    """The export options of `Client.onnx` / `AsyncClient.onnx` besides `graph` (unset or
    empty: the server's default)."""

    opset: int | None
    mode: str | None
    op: str | None
    num_heads: int | None
    inputs: str | None


def _drop_none(fields: Mapping[str, Any]) -> JSON:
    return {k: v for k, v in fields.items() if v is not None}


def rope_spec(**fields: Any) -> JSON:
    """A `rope` spec from transformers-style keywords (None values are dropped).

    Scaling keys (`rope_type` or its alias `type`, `factor`, `low_freq_factor`, ...) go into
    `rope_scaling`; `rope_parameters` (transformers 5) is split into `rope_theta`,
    `partial_rotary_factor` and `rope_scaling`; a flat `max_position_embeddings` becomes the
    default `max_positions` and, for `dynamic` and `longrope`, also `rope_scaling`'s own field.
    Everything else is a spec field (`head_dim`, `profile`, `dtype`, `width`, ...).
    """
    data = _drop_none(fields)
    scaling = dict(data.pop("rope_scaling", None) or {})
    parameters = dict(data.pop("rope_parameters", None) or {})
    for name in ("rope_theta", "partial_rotary_factor"):
        if name in parameters:
            data.setdefault(name, parameters.pop(name))
    scaling.update(parameters)
    for name in sorted(ROPE_SCALING_KEYS | {"type"}):
        if name in data:
            scaling[name] = data.pop(name)
    if "type" in scaling:
        scaling.setdefault("rope_type", scaling.pop("type"))
        scaling.pop("type", None)
    max_position_embeddings = data.pop("max_position_embeddings", None)
    if max_position_embeddings is not None:
        data.setdefault("max_positions", max_position_embeddings)
        if scaling.get("rope_type") in LENGTH_SCALED_TYPES:
            scaling.setdefault("max_position_embeddings", max_position_embeddings)
    spec: JSON = {"kind": "rope", **data}
    if scaling:
        spec["rope_scaling"] = scaling
    return spec


def family_spec(kind: str, **fields: Any) -> JSON:
    """`{"kind": kind, **fields}` without the None values."""
    return {"kind": kind, **_drop_none(fields)}


def onnx_body(spec: Mapping[str, Any], graph: str, options: OnnxOptions) -> JSON:
    """The POST /v1/onnx body: the spec and the export options that are set. An option
    `OnnxOptions` does not name is a TypeError, as for any unexpected keyword argument."""
    unknown = sorted(options.keys() - OnnxOptions.__optional_keys__)
    if unknown:
        raise TypeError(f"onnx() got unexpected keyword arguments {unknown}")
    return {"spec": dict(spec), "graph": graph, **{k: v for k, v in options.items() if v}}


def load_config(
    config: str | os.PathLike[str] | Mapping[str, Any], *, offline: bool = False
) -> JSON:
    """A transformers config: a dict, a config.json path, a folder holding config.json, or a
    Hugging Face model id `ORG/NAME[@REVISION]` (`_hub`: an existing file or folder of that name
    wins, as in `from_pretrained`; `offline`: the Hub cache only). Raises `OSError`/`ValueError`
    for a file that cannot be read, `ModelIdError` for a model id."""
    if isinstance(config, Mapping):
        return dict(config)
    path = os.fspath(config)
    model_id = None if os.path.exists(path) else parse_model_id(path)
    if model_id is not None:
        path = hub_config_path(model_id, offline=offline)
    elif os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a config.json holds a JSON object, got {type(data).__name__}")
    return data
