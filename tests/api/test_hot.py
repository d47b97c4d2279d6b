"""`HotRoutes` (api/hot.py): the hot routes answer exactly as FastAPI's dispatch would.

Two real servers on loopback, one with the dispatcher (the default) and one without
(`hot_routes=False`: every route through FastAPI), get the same requests; status, headers
(but `date`) and bodies must be equal, errors included. The metrics of the dispatched routes
carry their route templates, and routes the dispatcher cannot serve as FastAPI would are refused
when the app is built.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch
from fastapi import APIRouter, Depends, Request
from fastapi.routing import APIRoute
from safetensors.torch import save as safetensors_save
from starlette.responses import Response

from posenc.api.hot import HotRoutes, hot_routes
from posenc.encodings import content_key, parse_spec
from posenc.encodings.weights import table_key
from tests.api.metrics_util import scrape, value
from tests.conftest import ServerHandle, start_server

ROPE = {"kind": "rope", "head_dim": 64, "max_positions": 64}
INFER = {
    "inputs": [{"name": "position_ids", "shape": [4], "datatype": "INT64", "data": [3, 4, 5, 6]}],
    "parameters": {"spec": ROPE},
}
INFER_SCATTERED = {
    "inputs": [{"name": "position_ids", "shape": [3], "datatype": "INT64", "data": [9, 2, 9]}],
    "parameters": {"spec": ROPE},
    "outputs": [{"name": "cos", "parameters": {"binary_data": True}}, {"name": "sin"}],
}


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[ServerHandle, ServerHandle]]:
    with (
        start_server(device="cpu", max_body_bytes=4096) as hot,
        start_server(device="cpu", max_body_bytes=4096, hot_routes=False) as plain,
    ):
        yield hot, plain


def _key(server: ServerHandle) -> str:
    with server.client() as c:
        return c.post("/v1/tables", json=ROPE).headers["x-posenc-key"]


REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    ("GET", "/v1/tables/{key}", {}),
    ("GET", "/v1/tables/{key}", {"headers": {"If-None-Match": '"{key}"'}}),
    ("GET", "/v1/tables/{key}?format=json", {}),
    ("GET", "/v1/tables/{key}?format=raw&tensor=sin&rows=2:9", {}),
    ("GET", "/v1/tables/{key}?format=raw&tensor=cos", {"headers": {"Range": "bytes=8-99"}}),
    ("GET", "/v1/tables/{key}?format=raw&tensor=cos", {"headers": {"Range": "bytes=99999-"}}),
    ("GET", "/v1/tables/{key}?format=npy", {}),
    ("GET", "/v1/tables/{key}?format=nope", {}),
    ("GET", "/v1/tables/{key}?rows=9:2", {}),
    ("GET", "/v1/tables/" + "0" * 64, {}),
    ("HEAD", "/v1/tables/{key}", {}),
    ("PUT", "/v1/tables/{key}", {}),
    ("POST", "/v1/tables", {"json": ROPE}),
    ("POST", "/v1/tables?format=npz", {"json": ROPE}),
    ("POST", "/v1/tables", {"json": {**ROPE, "head_dim": -2}}),
    ("POST", "/v1/tables", {"json": {**ROPE, "max_positions": 1 << 40}}),
    ("POST", "/v1/tables", {"content": b"{not json"}),
    ("POST", "/v1/tables", {"content": b"[" + b"1," * 4000 + b"1]"}),
    ("POST", "/v1/tables", {"json": {"kind": "alibi", "num_heads": 12}}),
    ("POST", "/v2/models/rope/infer", {"json": INFER}),
    ("POST", "/v2/models/rope/versions/1/infer", {"json": INFER_SCATTERED}),
    ("POST", "/v2/models/rope/versions/7/infer", {"json": INFER}),
    ("POST", "/v2/models/nope/infer", {"json": INFER}),
    ("POST", "/v2/models/rope/infer", {"content": b"{"}),
    ("POST", "/v2/models/alibi/infer", {"json": {"inputs": [], "parameters": {"num_heads": 8}}}),
    ("GET", "/v2/models/rope/infer", {}),
]


def _exchange(server: ServerHandle, key: str, method: str, path: str, kw: dict[str, Any]):
    kw = dict(kw)
    if "headers" in kw:
        kw["headers"] = {k: v.replace("{key}", key) for k, v in kw["headers"].items()}
    with server.client() as c:
        r = c.request(method, path.replace("{key}", key), **kw)
    headers = sorted((k, v) for k, v in r.headers.items() if k != "date")
    return r.status_code, headers, r.content


@pytest.mark.parametrize(("method", "path", "kw"), REQUESTS, ids=lambda v: str(v)[:60])
def test_hot_routes_answer_as_fastapi_does(
    servers: tuple[ServerHandle, ServerHandle], method: str, path: str, kw: dict[str, Any]
) -> None:
    hot, plain = servers
    key = _key(hot)
    assert key == _key(plain)
    got = _exchange(hot, key, method, path, kw)
    want = _exchange(plain, key, method, path, kw)
    assert got == want
    status = got[0]
    if path.startswith("/v1/tables/{key}") and method == "GET" and "?" not in path:
        assert status in (200, 304)


BIAS_TABLE = torch.randn(38, 4, generator=torch.Generator().manual_seed(60))
BEIT = {"kind": "relative_index", "scheme": "beit", "window_size": [4, 3]}
"""A key-only relative_index spec: its bias table (38, 4) is uploaded to both servers first."""
BY_KEY = {
    **BEIT,
    "relative_position_bias_table_key": table_key(BIAS_TABLE),
    "relative_position_bias_table_shape": [38, 4],
}
UNKNOWN = {**BY_KEY, "relative_position_bias_table_key": "d" * 64}
TABLE_REQUESTS: list[tuple[str, str, dict[str, Any], int]] = [
    ("POST", "/v1/tables", {"json": BY_KEY}, 200),
    ("POST", "/v1/tables?format=json&tensor=bias", {"json": BY_KEY}, 200),
    ("GET", "/v1/tables/{key}", {}, 200),
    ("POST", "/v1/tables", {"json": UNKNOWN}, 404),
    (
        "POST",
        "/v1/tables",
        {"json": {**BY_KEY, "relative_position_bias_table_shape": [38, 5]}},
        422,
    ),
    ("POST", "/v2/models/relative_index/infer", {"json": {"parameters": {"spec": BY_KEY}}}, 200),
    ("POST", "/v2/models/relative_index/infer", {"json": {"parameters": {"spec": UNKNOWN}}}, 404),
]


def test_uploaded_tables_are_bound_as_fastapi_binds_them(
    servers: tuple[ServerHandle, ServerHandle],
) -> None:
    """Key-only specs (memoised once per JSON body for every server in the process) are bound
    from each server's own table store on the hot path exactly as through FastAPI."""
    body = safetensors_save({"relative_position_bias_table": BIAS_TABLE})
    for server in servers:
        with server.client() as c:
            r = c.post("/v1/uploads", content=body)
            assert r.status_code == 201, r.text
    hot, plain = servers
    key = content_key(parse_spec(BY_KEY))
    for method, path, kw, status in TABLE_REQUESTS:
        got = _exchange(hot, key, method, path, kw)
        assert got == _exchange(plain, key, method, path, kw), (method, path)
        assert got[0] == status, (method, path, got[2][:300])
        if status == 404:
            assert b"unknown_table" in got[2] or b"/v1/uploads" in got[2]


def test_only_the_default_server_dispatches(servers: tuple[ServerHandle, ServerHandle]) -> None:
    hot, plain = servers
    assert [m.cls for m in hot.app.user_middleware].count(HotRoutes) == 1
    assert HotRoutes not in [m.cls for m in plain.app.user_middleware]


def test_dispatched_routes_are_counted_under_their_templates(
    servers: tuple[ServerHandle, ServerHandle],
) -> None:
    hot, _ = servers
    key = _key(hot)
    with hot.client() as c:
        before = scrape(c)
        assert c.get(f"/v1/tables/{key}").status_code == 200
        assert c.post("/v2/models/rope/versions/1/infer", json=INFER).status_code == 200
        assert c.get("/v1/tables/" + "f" * 64).status_code == 404
        after = scrape(c)

    def delta(route: str, method: str, status: str) -> float:
        labels = {"method": method, "route": route, "status": status}
        name = "posenc_http_requests_total"
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("/v1/tables/{key}", "GET", "200") == 1
    assert delta("/v1/tables/{key}", "GET", "404") == 1
    assert delta("/v2/models/{model}/versions/{version}/infer", "POST", "200") == 1


def test_the_app_dispatches_every_hot_route() -> None:
    from posenc.api.deps import oip_context
    from posenc.api.routes import tables
    from posenc.api.routes.oip import build_router

    _, models = build_router(oip_context)
    found = hot_routes(tables.router, models)
    # the routes called once per table fetch or decode step, marked `@hot` on themselves
    assert {(m, r.path) for r in found for m in r.methods} == {
        ("GET", "/v1/tables/{key}"),
        ("POST", "/v1/tables"),
        ("POST", "/v2/models/{model}/infer"),
        ("POST", "/v2/models/{model}/versions/{version}/infer"),
    }
    assert hot_routes(tables.router) == found[:2]


async def _ok(request: Request) -> Response:
    return Response(b"ok")


def _route(endpoint: Any, path: str = "/x/{name}", **kw: Any) -> APIRoute:
    router = APIRouter()
    router.add_api_route(path, endpoint, methods=["GET"], **kw)
    route = router.routes[-1]
    assert isinstance(route, APIRoute)
    return route


async def _dep() -> int:
    return 1


async def _with_name(request: Request, name: str) -> Response:
    return Response(name.encode())


def _sync(request: Request) -> Response:
    return Response(b"")


async def _query(request: Request, limit: int) -> Response:
    return Response(b"")


@pytest.mark.parametrize(
    ("route", "message"),
    [
        (lambda: _route(_ok, dependencies=[Depends(_dep)]), "dependencies"),
        (lambda: _route(_sync), "async def"),
        (lambda: _route(_query), r"\(request, <path parameters>\)"),
        (lambda: _route(_with_name, "/x/{name:int}"), "plain strings"),
    ],
)
def test_routes_fastapi_must_serve_are_refused(route: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HotRoutes(_ok, [route()])


def test_path_parameters_reach_the_endpoint() -> None:
    hot = HotRoutes(_ok, [_route(_with_name)])
    scope = {"type": "http", "method": "GET", "path": "/x/abc", "root_path": "", "headers": []}
    found = hot.match(scope)
    assert found is not None
    route, arguments, params = found
    assert (route.path, arguments, params) == ("/x/{name}", ("name",), {"name": "abc"})
    assert hot.match({**scope, "method": "POST"}) is None
    assert hot.match({**scope, "path": "/y/abc"}) is None


def test_client_errors_never_surface_as_500(servers: tuple[ServerHandle, ServerHandle]) -> None:
    hot, _ = servers
    with httpx.Client(base_url=hot.url) as c:
        r = c.post("/v1/tables", content=b'{"kind": "rope", "head_dim": "x"}')
        assert r.status_code == 422
        assert r.json()["error_type"]
        assert "head_dim" in r.text
