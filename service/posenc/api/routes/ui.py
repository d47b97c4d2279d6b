"""`/ui`: the explorer, a static page that shows, compares, checks and downloads tables.

The page (`posenc/ui/`: `index.html`, `explorer.css` and the native ES modules `*.js`, `main.js`
first, shipped as package data) is plain HTML, CSS and JavaScript with no build step and no
third-party code: it calls the `/v1`
API from the browser (same origin, so the same API keys: the page sends the key typed into it as
`Authorization: Bearer`), and draws its plots itself on canvas and SVG. Nothing is fetched from
anywhere else (a Content-Security-Policy of `'self'` says so), so it works offline.

- `GET /ui`: the page; `GET /ui/{name}`: its assets (404 `not_found` for any other name).

The page and its assets are open, like the OpenAPI pages: they hold no data, and every table
they show comes through the `/v1` routes, which the `Gate` middleware guards. Each response is an
`Asset` (`serving/assets.py`): a strong ETag (sha256 of its bytes) and `Cache-Control: no-cache`,
so a reload revalidates with a 304 and a new release is picked up at once.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path

from fastapi import APIRouter, Request
from starlette.responses import Response

from posenc.api.error_types import NOT_FOUND
from posenc.api.errors import ApiError
from posenc.api.serving.assets import Asset, send_asset

router = APIRouter(tags=["ui"], include_in_schema=False)

_SUFFIX_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
MEDIA_TYPES = {
    f.name: _SUFFIX_TYPES[Path(f.name).suffix]
    for f in (resources.files("posenc") / "ui").iterdir()
    if Path(f.name).suffix in _SUFFIX_TYPES
}
"""Every file of the page (`posenc/ui/*.html, *.js, *.css`) and its media type: the only names
`/ui/{name}` serves."""
_ASSETS = ", ".join(sorted(n for n in MEDIA_TYPES if n != "index.html"))

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
}


@cache
def _asset(name: str) -> Asset:
    """One file of `posenc/ui`, read once per process."""
    return Asset.of((resources.files("posenc") / "ui" / name).read_bytes(), MEDIA_TYPES[name])


def _send(request: Request, name: str) -> Response:
    return send_asset(request, _asset(name), SECURITY_HEADERS)


@router.get("/ui")
async def page(request: Request) -> Response:
    """The explorer page."""
    return _send(request, "index.html")


@router.get("/ui/{name}")
async def asset(request: Request, name: str) -> Response:
    """One of the page's files (`MEDIA_TYPES`); 404 `not_found` otherwise."""
    if name not in MEDIA_TYPES or name == "index.html":
        raise ApiError(
            NOT_FOUND,
            f"the explorer has no file {name!r}",
            [{"field": "name", "message": f"one of {_ASSETS}", "value": name}],
        )
    return _send(request, name)
