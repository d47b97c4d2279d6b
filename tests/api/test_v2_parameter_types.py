"""/v2 request parameters of the wrong JSON type get a 400 (gRPC INVALID_ARGUMENT), never a 500.

Every model's parameter names are read from the server itself (`GET /v2/models/{m}/config`: every
property of its spec schema, nested ones included, and the model's own extra parameters), then
each is set, one at a time on a request the server otherwise answers 200, to lists, objects and
nested values: as flat JSON values and inside the `spec` object over HTTP, as the JSON strings
protocol parameters carry over gRPC. An outside probe found `sinusoidal_2d`'s `style` used as a
dict key before any type check (`TypeError: unhashable type: 'list'`, HTTP 500).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException

from posenc.api.oip import MODELS
from tests.conftest import ServerHandle

Inputs = list[tuple[str, list[int]]]

BASELINES: dict[str, tuple[Inputs, dict[str, Any]]] = {
    "rope": ([("position_ids", [0, 1])], {"head_dim": 8, "max_positions": 16}),
    "alibi": ([("query_positions", [0, 1]), ("key_positions", [0, 1])], {"num_heads": 4}),
    "sinusoidal": ([("position_ids", [0, 1])], {"dim": 8}),
    "sinusoidal_2d": (
        [("grid", [4, 4])],
        {"style": "detr", "num_pos_feats": 8, "height": 4, "width": 4},
    ),
    "t5_bias": ([("query_positions", [0, 1]), ("key_positions", [0, 1])], {}),
    "xpos": ([("position_ids", [0, 1])], {"head_dim": 8, "max_positions": 16}),
    "vision_rope": ([("grid", [4, 4])], {"style": "pixtral", "head_dim": 16}),
    "normalized": ([], {"mode": "by_last", "lengths": [3, 5]}),
    "learned": ([], {"method": "linear_1d", "new_length": 3, "table": [[0.0, 1.0], [2.0, 3.0]]}),
    "relative_index": ([], {"scheme": "swin", "window_size": [2, 2]}),
}
"""A request each model answers 200: its inputs (INT64, rank 1) and parameters."""

SPEC_LANGUAGE = ("hf_config", "preset", "part", "layer_type")
"""The keys of the spec language (`api/specs.py`: a config or a preset plus overrides), which no
spec schema lists."""

NON_SCALARS: list[Any] = [[], {}, [[]], [1, 2], {"a": 1}, [{}], {"a": []}]
"""JSON values that are no scalar: empty, flat and nested lists and objects."""


def test_baselines_cover_every_model() -> None:
    assert set(BASELINES) == set(MODELS)


def _body(inputs: Inputs, parameters: dict[str, Any]) -> dict[str, Any]:
    tensors = [
        {"name": name, "shape": [len(data)], "datatype": "INT64", "data": data}
        for name, data in inputs
    ]
    return {"inputs": tensors, "parameters": parameters}


def _flat(parameters: dict[str, Any]) -> dict[str, Any]:
    """Parameters as gRPC carries them: lists and objects as JSON strings."""
    return {k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in parameters.items()}


def _names(schema: Any) -> set[str]:
    """Every property name anywhere in a JSON schema (nested models and `$defs` included)."""
    if isinstance(schema, list):
        return set().union(*map(_names, schema)) if schema else set()
    if not isinstance(schema, dict):
        return set()
    own = set(schema.get("properties", {})) if isinstance(schema.get("properties"), dict) else set()
    return own.union(*map(_names, schema.values()))


def parameter_names(client: httpx.Client, model: str) -> list[str]:
    """The parameters a model takes, from its config document: its spec schema's properties and
    its own parameters (`mrope_section`...; the descriptive entries have spaces), plus the spec
    language's keys."""
    config = client.get(f"/v2/models/{model}/config").json()
    own = {name for name in config["parameters"] if " " not in name and name != "spec"}
    names = _names(config["posenc"]["spec_schema"]) | own | set(SPEC_LANGUAGE)
    return sorted(names - {"kind"})


@pytest.fixture(scope="module")
def triton_grpc(server: ServerHandle) -> Iterator[tgrpc.InferenceServerClient]:
    client = tgrpc.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.mark.parametrize("model", sorted(BASELINES))
def test_non_scalar_parameters_are_refused_over_http(client: httpx.Client, model: str) -> None:
    inputs, params = BASELINES[model]
    base = client.post(f"/v2/models/{model}/infer", json=_body(inputs, params))
    assert base.status_code == 200, base.text[:500]
    names = parameter_names(client, model)
    assert len(names) > len(SPEC_LANGUAGE), names
    failures = []
    for name in names:
        for value in NON_SCALARS:
            for where, parameters in (
                ("flat", {**params, name: value}),
                ("spec", {"spec": {**params, name: value}}),
                ("flat JSON string", _flat({**params, name: value})),
            ):
                r = client.post(f"/v2/models/{model}/infer", json=_body(inputs, parameters))
                if r.status_code >= 500 or (r.status_code != 200 and "error" not in r.json()):
                    failures.append((where, name, value, r.status_code, r.text[:200]))
    assert not failures, failures[:10]
    assert client.get("/v2/health/ready").status_code == 200


@pytest.mark.parametrize("model", sorted(BASELINES))
def test_non_scalar_parameters_are_refused_over_grpc(
    client: httpx.Client, triton_grpc: tgrpc.InferenceServerClient, model: str
) -> None:
    inputs, params = BASELINES[model]
    tensors = []
    for name, data in inputs:
        item = tgrpc.InferInput(name, [len(data)], "INT64")
        item.set_data_from_numpy(np.asarray(data, np.int64))
        tensors.append(item)
    triton_grpc.infer(model, tensors, parameters=_flat(params))
    failures = []
    for name in parameter_names(client, model):
        for value in NON_SCALARS:
            try:
                triton_grpc.infer(model, tensors, parameters=_flat({**params, name: value}))
            except InferenceServerException as exc:
                if exc.status() not in ("StatusCode.INVALID_ARGUMENT", "StatusCode.NOT_FOUND"):
                    failures.append((name, value, exc.status(), exc.message()))
    assert not failures, failures[:10]
    assert triton_grpc.is_server_ready()


@pytest.mark.parametrize("style", [*NON_SCALARS, "[]", '{"a": 1}', "detrr"])
def test_sinusoidal_2d_style_names_the_valid_styles(
    client: httpx.Client, triton_grpc: tgrpc.InferenceServerClient, style: Any
) -> None:
    inputs, params = BASELINES["sinusoidal_2d"]
    want = "style must be one of ['detr', 'mae', 'timm'], got "
    r = client.post(
        "/v2/models/sinusoidal_2d/infer", json=_body(inputs, {**params, "style": style})
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith(want), r.text
    spec = {"spec": {**params, "kind": "sinusoidal_2d", "style": style}}
    r = client.post("/v2/models/sinusoidal_2d/infer", json=_body(inputs, spec))
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith(want), r.text
    grid = tgrpc.InferInput("grid", [2], "INT64")
    grid.set_data_from_numpy(np.array([4, 4], np.int64))
    with pytest.raises(InferenceServerException) as info:
        triton_grpc.infer("sinusoidal_2d", [grid], parameters=_flat({**params, "style": style}))
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert str(info.value.message()).startswith(want)


@pytest.mark.parametrize("model", sorted(BASELINES))
def test_an_unknown_flat_parameter_is_named_at_the_top_level(
    client: httpx.Client, triton_grpc: tgrpc.InferenceServerClient, model: str
) -> None:
    """A flat parameter that is no field of the model's spec and close to none is refused by
    its own name, `<model> spec: bogus: unknown field`, by every model over both protocols: rope
    put it into `rope_scaling` and said `rope_scaling.bogus` (misspelt scaling keys, `factr`,
    still are named there, with the suggestion)."""
    inputs, params = BASELINES[model]
    want = f"invalid {model} spec: bogus: unknown field (got 1)"
    r = client.post(f"/v2/models/{model}/infer", json=_body(inputs, {**params, "bogus": 1}))
    assert r.status_code == 400, r.text
    assert want in r.json()["error"], r.text
    tensors = []
    for name, data in inputs:
        item = tgrpc.InferInput(name, [len(data)], "INT64")
        item.set_data_from_numpy(np.asarray(data, np.int64))
        tensors.append(item)
    with pytest.raises(InferenceServerException) as info:
        triton_grpc.infer(model, tensors, parameters=_flat({**params, "bogus": 1}))
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert str(info.value.message()) == r.json()["error"]
