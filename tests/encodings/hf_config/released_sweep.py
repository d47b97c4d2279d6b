"""Support of test_sparse_and_released.py: every rotary model type of the installed transformers
at its DEFAULT configuration (the geometry released checkpoints use: head_dim, heads,
kv_channels, partial factors untouched) and in its SPARSE form (issue 30 item 2, issue 39 item 4).

- `default_config(model_type)`: the config class's defaults as config.json (`to_dict()`).
- `sparse_config(model_type)`: the same with every key whose value is the class default dropped,
  as a hand-edited or older file omits them (`head_dim`, `rope_parameters`, `rope_theta`, ...);
  a key is dropped only if transformers still reads the file as the full one (`from_dict(...)
  .to_dict()` equal), so both files mean the same model.
- `reference(model_type)`: the model's own text rotary module built from the default config and
  its attention's apply function on random q/k (`rope_sweep.module_reference`: the module alone
  is cheap at full size), the oracle both forms are judged against.

Verdicts (`rope_sweep.judge`): `exact` (cos/sin bit-equal per layer type, q.k equal after the
model's rotation), `rejected` (a 4xx naming a config key), `wrong` (accepted and different),
`unbuildable` (transformers cannot build the config or its rotary module: then posenc's answers
to the sparse and the full file must still be the same, since transformers reads them the same).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import io
import json
import math
from collections.abc import Mapping
from typing import Any

import httpx
import numpy as np
import torch

from posenc.encodings import compute, parse_spec
from tests.encodings.hf_config import rope_sweep as sweep
from tests.tolerances import served_as_reference

CPU = torch.device("cpu")


def _plain(data: Any) -> Any:
    return json.loads(json.dumps(data, default=str))


@functools.cache
def _default(model_type: str) -> dict[str, Any] | Exception:
    cls = sweep._config_class(model_type)
    try:
        with sweep._quiet():
            config = cls()
        data = _plain(config.to_dict())
    except Exception as err:
        return sweep.UnbuildableError(f"{cls.__name__}(): {type(err).__name__}: {str(err)[:160]}")
    for part in (data, data.get("text_config")):
        if isinstance(part, dict):
            part.pop("allow_global_per_layer_attribute_access", None)
            # posenc's JSON reader refuses Infinity / NaN (strict JSON): keys holding them
            # (Mamba's time_step_limit) are class defaults here, left out as a file may
            for key in [k for k, v in part.items() if not _finite(v)]:
                part.pop(key)
    return data


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def default_config(model_type: str) -> dict[str, Any]:
    """The class's default config.json (v5 `rope_parameters` form, as `save_pretrained` writes)."""
    result = _default(model_type)
    if isinstance(result, Exception):
        raise result
    return copy.deepcopy(result)


def _field_defaults(cls: type) -> dict[str, Any]:
    if not dataclasses.is_dataclass(cls):
        return {}
    return {
        f.name: f.default
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING and f.default is not None
    }


def _read(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """transformers' reading of a config.json (its `to_dict()`), None when it cannot load it."""
    try:
        return _plain(sweep.load_config(data).to_dict())
    except Exception:
        return None


def _drop(part: dict[str, Any], cls: type) -> list[str]:
    """Keys of `part` whose value equals `cls`'s field default, and `rope_parameters` (a file
    without it gets the class's own), dropped from `part`; returns them."""
    defaults = _field_defaults(cls)
    dropped = [
        k
        for k, v in part.items()
        if k in defaults and not isinstance(v, (dict, list)) and v == defaults[k]
    ]
    dropped += [k for k in ("rope_parameters", "rope_scaling") if k in part]
    for key in dropped:
        part.pop(key)
    return dropped


@functools.cache
def _sparse(model_type: str) -> tuple[dict[str, Any], tuple[str, ...]] | Exception:
    try:
        full = default_config(model_type)
    except sweep.UnbuildableError as err:
        return err
    target = _read(full)
    if target is None:
        return sweep.UnbuildableError("transformers cannot load its own default config.json")
    sparse = copy.deepcopy(full)
    removed = [(None, k, full[k]) for k in _drop(sparse, sweep._config_class(model_type))]
    text = sparse.get("text_config")
    if isinstance(text, dict) and isinstance(text.get("model_type"), str):
        text_cls = sweep._config_class(text["model_type"])
        removed += [("text_config", k, full["text_config"][k]) for k in _drop(text, text_cls)]
    # Put back, one at a time, what transformers does not fill in the same way.
    same = _read(sparse) == target
    for where, key, value in reversed(removed):
        if same:
            break
        part = sparse if where is None else sparse["text_config"]
        part[key] = copy.deepcopy(value)
        same = _read(sparse) == target
    if not same:
        return sweep.UnbuildableError("no sparse form reads as the default config")
    dropped = tuple(
        f"{where}.{key}" if where else key
        for where, key, _ in removed
        if key not in (sparse if where is None else sparse["text_config"])
    )
    return sparse, dropped


def sparse_config(model_type: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(the default config.json without the keys transformers fills in the same way, those keys)."""
    result = _sparse(model_type)
    if isinstance(result, Exception):
        raise result
    return copy.deepcopy(result[0]), result[1]


def read_alike(model_type: str, data: Mapping[str, Any]) -> bool:
    """transformers reads `data` as the type's default config.json."""
    return _read(data) == _read(default_config(model_type))


def reference(model_type: str, length: int = sweep.SEQ) -> sweep.Reference:
    """The default geometry's rotation: its text rotary module and apply function."""
    return sweep.module_reference(default_config(model_type), length)


def served(
    client: httpx.Client,
    data: Mapping[str, Any],
    keys: Mapping[str, Any],
    device: torch.device = CPU,
) -> sweep.Verdict | list[sweep.Table]:
    """posenc's answer through the server: POST /v1/resolve, then each resolved rope spec's
    table from POST /v1/tables at half width, float32, cos and sin apart (the arrangement the
    sweep compares; `rope_sweep.posenc_tables` asks the same of the library) as
    `list[Table]`; or the refusal's verdict: `rejected` when a problem names a key of `keys`
    (the full config: a sparse file's refusal may name a key it omits), model_type, or is one
    of hf_config's own refusals of a key it needs ("cannot map config"); a config with no rope
    table at all (a vision tower) is `rejected` too; anything else is `wrong`. From a server on
    a GPU (`device`), each table is held within `tolerances.GPU_ULPS` of the same spec computed
    on the CPU, and the CPU's table is what is returned (and judged bit for bit)."""
    response = client.post(
        "/v1/resolve", json={"hf_config": dict(data), "max_positions": sweep.SEQ}
    )
    if response.status_code != 200:
        if not 400 <= response.status_code < 500:
            return sweep.Verdict("wrong", [f"HTTP {response.status_code}: {response.text[:200]}"])
        answer = response.json()
        problems = answer.get("detail") or []
        fields = [str(d.get("field", "")) for d in problems]
        reason = str(answer.get("error", ""))
        known = sweep._config_keys(keys)
        named = [f for f in fields if any(f == k or f.startswith(k + ".") for k in known)]
        if reason.startswith("cannot map config"):
            named += [f for f in fields if f and not f.startswith("(")]
        if fields == ["max_positions"] and "no produced spec" in str(problems[0]["message"]):
            return sweep.Verdict("rejected", ["no rope table"], {"keys": []})
        if named:
            return sweep.Verdict("rejected", [reason], {"keys": named})
        return sweep.Verdict("wrong", [f"refused naming no config key: {fields}: {reason}"])
    tables = []
    for item in response.json()["specs"]:
        if item["kind"] != "rope":
            continue
        spec = parse_spec(item["spec"])
        half = {**item["spec"], "width": "half", "packing": "separate", "dtype": "float32"}
        got = client.post("/v1/tables", json=half, params={"format": "npz"})
        if got.status_code != 200:
            return sweep.Verdict("wrong", [f"{item['name']}: HTTP {got.status_code}: {got.text}"])
        arrays = np.load(io.BytesIO(got.content))
        cos, sin = (torch.from_numpy(arrays[n].copy()) for n in ("cos", "sin"))
        if device.type != "cpu":
            cpu = compute(parse_spec(half), "cpu").tensors
            if not (
                served_as_reference(cos, cpu["cos"], device)
                and served_as_reference(sin, cpu["sin"], device)
            ):
                return sweep.Verdict("wrong", [f"{item['name']}: the GPU's table is not the CPU's"])
            cos, sin = cpu["cos"], cpu["sin"]
        tables.append(sweep._table(item["name"], item["notes"], spec, cos, sin))
    if not tables:
        return sweep.Verdict("rejected", ["no rope table (other kinds served)"], {"keys": []})
    return tables


def assert_exact(
    client: httpx.Client,
    data: Mapping[str, Any],
    ref: sweep.Reference,
    device: torch.device = CPU,
    *,
    may_refuse: bool,
) -> None:
    """posenc's answer for `data` (`served`) is exact against `ref`, or, where `may_refuse`, a
    refusal naming a key (`rejected`)."""
    answer = served(client, data, data, device)
    if isinstance(answer, sweep.Verdict):
        assert may_refuse, answer.line()
        assert answer.outcome == "rejected", answer.line()
        return
    verdict = sweep.judge(ref, answer)
    assert verdict.outcome == "exact", verdict.line()


def same_tables(a: list[sweep.Table], b: list[sweep.Table]) -> bool:
    """Bit-equal tables with the same widths, pairing, direction and layer types."""
    return len(a) == len(b) and all(
        (x.rotary_dim, x.pairing, x.sign, x.layer_types)
        == (y.rotary_dim, y.pairing, y.sign, y.layer_types)
        and torch.equal(x.cos, y.cos)
        and torch.equal(x.sin, y.sin)
        for x, y in zip(a, b, strict=True)
    )
