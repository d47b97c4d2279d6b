"""The issue-9 graphs through `/v1/onnx` on the session server: CoPE (a graph-only kind, kept
without a table entry), xPos with its role, and the table families, built, verified and served
like the others (keys, immutable GET)."""

from __future__ import annotations

from typing import Any

import httpx
import onnx
import pytest
import torch

from posenc.encodings.cope import cope_logits
from posenc.onnx import ExportOptions, metadata, parse_export_spec, resolve
from tests.onnx.cases import BASE, assert_close, run
from tests.tolerances import ATOL

COPE = {"kind": "cope", "head_dim": 8, "npos_max": 5, "variant": "paper", "mask": "none"}


def post(client: httpx.Client, body: dict[str, Any]) -> httpx.Response:
    return client.post("/v1/onnx", json=body)


def model_of(response: httpx.Response) -> onnx.ModelProto:
    assert response.status_code == 200, response.text
    return onnx.load_from_string(response.content)


def test_cope_is_served_without_a_table(client: httpx.Client) -> None:
    first = post(client, {"spec": COPE})
    model = model_of(first)
    spec = parse_export_spec(COPE)
    key = resolve(spec, ExportOptions(graph="logits")).key
    assert first.headers["x-posenc-key"] == key == metadata(model)["export_key"]
    assert first.headers["x-posenc-graph"] == "cope/logits"
    assert post(client, {"spec": COPE}).headers["x-posenc-cache"] == "hit"
    again = client.get(first.headers["content-location"])
    assert again.status_code == 200
    assert again.content == first.content
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 6, 8, generator=gen), torch.randn(1, 2, 6, 8, generator=gen)
    emb = torch.randn(8, 5, generator=gen)
    out = run(model, {"q": q, "k": k, "pos_emb": emb})["logits"]
    assert_close(out, cope_logits(q, k, emb, 5, "paper"), 64 * ATOL["float32"] * 10)
    attention = model_of(post(client, {"spec": COPE, "graph": "attention", "opset": 23}))
    assert [o.name for o in attention.graph.output] == ["y"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"spec": {**COPE, "npos_max": 0}}, "npos_max"),
        ({"spec": COPE, "graph": "bias"}, "graph"),
        ({"spec": BASE[("xpos", "rotary")], "graph": "rotary"}, "role"),
        ({"spec": BASE[("xpos", "rotary")], "graph": "rotary", "role": "value"}, "role"),
    ],
)
def test_bad_requests_name_the_field(
    client: httpx.Client, body: dict[str, Any], field: str
) -> None:
    r = post(client, body)
    assert r.status_code == 422, r.text
    assert field in [p["field"] for p in r.json()["detail"]]


def test_xpos_roles_are_two_models(client: httpx.Client) -> None:
    spec = BASE[("xpos", "rotary")]
    query = post(client, {"spec": spec, "graph": "rotary", "role": "query"})
    key = post(client, {"spec": spec, "graph": "rotary", "role": "key"})
    assert query.headers["x-posenc-key"] != key.headers["x-posenc-key"]
    assert model_of(key).graph.output[0].name == "y"


@pytest.mark.parametrize(
    "kind_graph",
    [("relative_index", "bias"), ("normalized", "embedding"), ("learned", "embedding")],
)
def test_table_families_are_served(client: httpx.Client, kind_graph: tuple[str, str]) -> None:
    model = model_of(post(client, {"spec": BASE[kind_graph]}))
    assert metadata(model)["graph"] == "/".join(kind_graph)
