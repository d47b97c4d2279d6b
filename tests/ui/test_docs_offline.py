"""`/docs` (Swagger UI) and `/redoc` (ReDoc) render in headless Chromium with the network cut
off: every request to anything but the server on 127.0.0.1 is aborted (Playwright's route
abort), none is even tried, and each page still shows every operation of the served OpenAPI
document, with no failed request, no console error and no uncaught exception (but ReDoc's logo,
which the pages' Content-Security-Policy refuses)."""

from __future__ import annotations

import urllib.parse

import httpx
import pytest
from playwright.sync_api import Route

from tests.conftest import ServerHandle
from tests.ui.conftest import Watched

pytestmark = pytest.mark.xdist_group("ui")

REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


def cut_off(w: Watched) -> list[str]:
    """Abort every request that leaves 127.0.0.1; returns the list the aborted URLs go to."""
    outside: list[str] = []

    def gate(route: Route) -> None:
        host = urllib.parse.urlsplit(route.request.url).hostname
        if host == "127.0.0.1" or route.request.url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort("internetdisconnected")

    w.page.route("**/*", gate)
    return outside


def operations(client: httpx.Client) -> list[tuple[str, str]]:
    """(METHOD, path) of every operation the server documents."""
    paths = client.get("/openapi.json").json()["paths"]
    return [(m.upper(), p) for p, item in paths.items() for m in item if m != "parameters"]


def test_swagger_ui_offline(server: ServerHandle, client: httpx.Client, watched: Watched) -> None:
    outside = cut_off(watched)
    expected = operations(client)
    page = watched.page
    page.goto(f"{server.url}/docs")
    blocks = page.locator(".opblock")
    blocks.first.wait_for()
    assert blocks.count() == len(expected)
    shown = {
        (
            b.locator(".opblock-summary-method").inner_text().strip(),
            b.locator(".opblock-summary-path").get_attribute("data-path"),
        )
        for b in blocks.all()
    }
    assert shown == set(expected)
    assert page.locator(".info .title").inner_text().startswith("posenc")
    assert outside == []
    assert watched.problems == []


def test_redoc_offline(server: ServerHandle, client: httpx.Client, watched: Watched) -> None:
    outside = cut_off(watched)
    expected = operations(client)
    page = watched.page
    page.goto(f"{server.url}/redoc")
    # ReDoc draws one section per operation, id "operation/<operationId>"
    sections = page.locator("[data-section-id^='operation/']")
    sections.first.wait_for()
    assert sections.count() == len(expected)
    ids = {
        f"operation/{op['operationId']}"
        for item in client.get("/openapi.json").json()["paths"].values()
        for op in item.values()
        if isinstance(op, dict) and "operationId" in op
    }
    assert {s.get_attribute("data-section-id") for s in sections.all()} == ids
    assert outside == []
    # redoc 2 always draws its sidebar logo from its CDN: the page's Content-Security-Policy
    # refuses it in the browser (nothing leaves); that refusal is the only problem
    refused = [p for p in watched.problems if REDOC_LOGO in p]
    assert [p for p in watched.problems if REDOC_LOGO not in p] == []
    assert any("Content Security Policy" in p for p in refused), refused
