"""`/docs` and `/redoc` served offline (`posenc.api.routes.docs`): every URL the pages name is on
this server (under `root_path` behind a proxy), the bundles are `fastapi-offline`'s files with
strong ETags, 304 and HEAD, and `protect_docs_and_metrics` guards pages and bundles alike.
Through httpx on a real server; tests/ui/test_docs_offline.py renders them in Chromium with
the network cut off."""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib import resources

import httpx
import pytest

from tests.conftest import ServerHandle, start_server

KEY = "k-docs"
URL_ATTRIBUTE = re.compile(r"""(?:src|href|spec-url)\s*=\s*["']([^"']+)["']|url:\s*'([^']+)'""")
PAGES = ("/docs", "/redoc")


def referenced(html: str) -> list[str]:
    """Every URL a page names: `src`, `href`, ReDoc's `spec-url`, Swagger UI's `url:`."""
    return [a or b for a, b in URL_ATTRIBUTE.findall(html)]


def package_file(name: str) -> bytes:
    return (resources.files("fastapi_offline") / "static" / name).read_bytes()


@pytest.fixture(scope="module")
def proxied() -> Iterator[ServerHandle]:
    """Behind a proxy's /posenc prefix, with keys guarding the documentation too."""
    with start_server(root_path="/posenc", api_keys=[KEY], protect_docs_and_metrics=True) as handle:
        yield handle


@pytest.mark.parametrize("page", PAGES)
def test_pages_name_only_local_urls(client: httpx.Client, page: str) -> None:
    response = client.get(page)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    urls = referenced(html)
    assert "/openapi.json" in urls
    assert len(urls) >= 3  # the document, the bundle(s), the favicon
    for url in urls:
        assert url.startswith("/"), url
        assert not url.startswith("//"), url
    # nothing absolute anywhere in the page (a font, a CDN, a validator), and the browser told
    # to fetch from this server only
    assert "://" not in html
    policy = response.headers["content-security-policy"]
    assert "default-src 'self'" in policy
    assert "img-src 'self' data:" in policy
    assert "://" not in policy
    for url in urls:
        if url != "/openapi.json":
            assert client.get(url).status_code == 200, url


def test_bundles_are_the_packages_files_with_validators(client: httpx.Client) -> None:
    html = client.get("/docs").text + client.get("/redoc").text
    names = {u.rsplit("/", 1)[1] for u in referenced(html) if u.startswith("/docs/assets/")}
    assert names == {"swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png"}
    for name in sorted(names):
        path = f"/docs/assets/{name}"
        got = client.get(path)
        assert got.status_code == 200
        assert got.content == package_file(name)
        etag = got.headers["etag"]
        assert got.headers["cache-control"] == "no-cache"
        assert got.headers["x-content-type-options"] == "nosniff"
        head = client.head(path)
        assert head.status_code == 200
        assert head.content == b""
        assert head.headers["content-length"] == str(len(got.content))
        assert head.headers["etag"] == etag
        again = client.get(path, headers={"If-None-Match": etag})
        assert again.status_code == 304
        assert again.content == b""
        assert client.head(path, headers={"If-None-Match": etag}).status_code == 304
    assert (
        client.get("/docs/assets/swagger-ui-bundle.js")
        .headers["content-type"]
        .startswith("text/javascript")
    )
    for page in PAGES:
        etag = client.get(page).headers["etag"]
        assert client.get(page, headers={"If-None-Match": etag}).status_code == 304


def test_unknown_asset_is_a_404(client: httpx.Client) -> None:
    response = client.get("/docs/assets/swagger-initializer.js")
    assert response.status_code == 404
    assert response.json()["error_type"] == "not_found"
    assert client.get("/docs/assets/..%2Fcore.py").status_code == 404
    # FastAPI's own CDN pages are gone, not shadowed
    assert client.get("/docs/oauth2-redirect").status_code == 404


def test_root_path_and_keys(proxied: ServerHandle) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    with proxied.client() as c:
        for page in PAGES:
            assert c.get(page).status_code == 401
            html = c.get(page, headers=auth).text
            urls = referenced(html)
            assert "/posenc/openapi.json" in urls
            for url in urls:
                assert url.startswith("/posenc/"), url
                # the proxy strips its prefix before the request reaches the server
                path = url.removeprefix("/posenc")
                assert c.get(path).status_code == 401, path
                assert c.get(path, headers=auth).status_code == 200, path
