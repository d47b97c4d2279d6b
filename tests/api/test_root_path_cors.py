"""A started server behind a proxy prefix (`root_path`) and with CORS origins (`cors_origins`),
and `GET /` redirecting to the explorer: through httpx on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import ServerHandle, start_server

ORIGIN = "https://notebook.example"
KEY = "k-root-path"


@pytest.fixture(scope="module")
def proxied() -> Iterator[ServerHandle]:
    """A server as a reverse proxy serving it under /posenc sees it: the proxy strips the prefix,
    uvicorn's root_path puts it back in the scope."""
    with start_server(root_path="/posenc/", cors_origins=[ORIGIN], api_keys=[KEY]) as handle:
        yield handle


def test_front_page_redirects_to_the_explorer(client: httpx.Client) -> None:
    response = client.get("/", follow_redirects=False)
    assert response.status_code == 307
    assert response.headers["location"] == "/ui"
    page = client.get("/", follow_redirects=True)
    assert page.status_code == 200
    assert page.url.path == "/ui"
    assert "text/html" in page.headers["content-type"]
    assert "/" not in client.get("/openapi.json").json()["paths"]


def test_no_cors_headers_without_origins(client: httpx.Client) -> None:
    response = client.get("/v2/health/live", headers={"Origin": ORIGIN})
    assert "access-control-allow-origin" not in response.headers
    preflight = client.options(
        "/v1/tables",
        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in preflight.headers


def test_root_path(proxied: ServerHandle) -> None:
    with proxied.client() as c:
        assert c.get("/", follow_redirects=False).headers["location"] == "/posenc/ui"
        assert c.get("/openapi.json").json()["servers"] == [{"url": "/posenc"}]
        assert "/posenc/openapi.json" in c.get("/docs").text
        # the key check still guards /v1 behind the prefix, and lets a key through
        assert c.get("/v1/presets").status_code == 401
        good = c.get("/v1/presets", headers={"Authorization": f"Bearer {KEY}"})
        assert good.status_code == 200
        assert c.get("/v2/health/ready").status_code == 200
        # a 405 still lists the route's methods
        wrong = c.delete("/v2/health/live")
        assert wrong.status_code == 405
        assert "GET" in wrong.headers["allow"]


def test_cors(proxied: ServerHandle) -> None:
    with proxied.client() as c:
        preflight = c.options(
            "/v1/tables",
            headers={
                "Origin": ORIGIN,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        # answered before the key check: a browser sends no credentials on a preflight
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        actual = c.get("/v1/presets", headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"})
        assert actual.status_code == 200
        assert actual.headers["access-control-allow-origin"] == ORIGIN
        assert "ETag" in actual.headers["access-control-expose-headers"]
        # an error answer carries the header too, so the page can read it
        refused = c.get("/v1/presets", headers={"Origin": ORIGIN})
        assert refused.status_code == 401
        assert refused.headers["access-control-allow-origin"] == ORIGIN
        other = c.options(
            "/v1/tables",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert other.status_code == 400
        assert "access-control-allow-origin" not in other.headers
        plain = c.get("/v2/health/live", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in plain.headers
