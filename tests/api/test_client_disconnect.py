"""A client that leaves before its request body has arrived is an INFO line in the server's log,
never an ERROR traceback, on every route that reads a body; the server keeps answering.

The routes are read from the server's own OpenAPI document (every POST, PUT and PATCH), so a new
body-reading route is covered without editing this file. The server is `posenc serve` in a
subprocess (`start_server_process`): its stderr is the log an operator reads, uvicorn's own
`Exception in ASGI application` included (an outside probe found that on `/v1/uploads`, and
`unhandled error in /v2` with a traceback on `/v2/models/rope/infer`).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import ProcessHandle, start_server_process
from tests.waiting import PATIENCE, wait_for

DISCONNECTED = "client disconnected before its request body arrived"
PATH_VALUES = {"model": "rope", "version": "1"}
"""Values for the path parameters of the body-reading routes (`/v2/models/{model}/...`)."""


@pytest.fixture(scope="module")
def serve() -> Iterator[ProcessHandle]:
    handle = start_server_process("--device", "cpu")
    try:
        yield handle
    finally:
        handle.stop()


def body_routes(client: httpx.Client) -> list[str]:
    """Every path with a POST, PUT or PATCH in the server's OpenAPI document, its path
    parameters filled in (`PATH_VALUES`)."""
    paths = client.get("/openapi.json").json()["paths"]
    found = []
    for path, operations in sorted(paths.items()):
        if {"post", "put", "patch"} & set(operations):
            found.append(re.sub(r"\{(\w+)\}", lambda m: PATH_VALUES[m.group(1)], path))
    return found


def disconnects(serve: ProcessHandle) -> int:
    """How many disconnect lines the server has logged."""
    return sum(DISCONNECTED in line for line in serve.lines)


def test_a_client_gone_mid_body_is_an_info_line_on_every_route(serve: ProcessHandle) -> None:
    with httpx.Client(base_url=serve.url, timeout=PATIENCE) as client:
        routes = body_routes(client)
        assert {"/v1/uploads", "/v2/models/rope/infer"} <= set(routes), routes
        # /v1/check/onnx reads its body once `?key=` names a rope table the server knows
        made = client.post("/v1/tables", json={"kind": "rope", "head_dim": 8, "max_positions": 4})
        assert made.status_code == 200, made.text
        query = {"/v1/check/onnx": f"?key={made.headers['x-posenc-key']}"}
        host, port = serve.url.removeprefix("http://").split(":")
        for count, path in enumerate(routes, 1):
            target = path + query.get(path, "")
            with socket.create_connection((host, int(port)), timeout=PATIENCE) as sock:
                # 1000 bytes declared (under every body cap), 2 sent, then gone
                head = f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
                sock.sendall(head.encode() + b"{}")
            logged = wait_for(lambda: disconnects(serve) == count)  # noqa: B023 (waited here)
            assert logged, (path, "".join(serve.lines[-20:]))
        assert client.get("/v2/health/ready").status_code == 200
        assert client.post("/v1/tables", json={"kind": "alibi", "num_heads": 4}).status_code == 200
    errors = [ln for ln in serve.lines if " ERROR " in ln or "Traceback" in ln]
    assert errors == [], "".join(serve.lines[-40:])
    assert disconnects(serve) == len(routes)
    lines = [ln for ln in serve.lines if DISCONNECTED in ln]
    assert all(" INFO " in ln for ln in lines), lines
