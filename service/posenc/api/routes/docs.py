"""`/docs` (Swagger UI) and `/redoc` (ReDoc): the OpenAPI document's pages, served offline.

FastAPI's own pages load Swagger UI and ReDoc from a CDN (and a favicon from fastapi's site), so
on a host without the internet they are blank. Here the bundles come from the `fastapi-offline`
package (`fastapi_offline/static`: swagger-ui-dist 5's `swagger-ui-bundle.js` and
`swagger-ui.css`, redoc 2's `redoc.standalone.js`, a favicon; docs/dependencies.md says why that
package), read once per process and served by this module:

- `GET /docs`, `GET /redoc`: the pages (FastAPI's `get_swagger_ui_html` and `get_redoc_html`),
  every URL in them on this server, under the proxy's prefix (`root_path`): the document
  (`/openapi.json`), the bundles, the favicon; no Google fonts, no validator badge;
- `GET /docs/assets/{name}`: one of `ASSETS` (404 `not_found` for any other name).

Each answer is an `Asset` (`serving/assets.py`: strong ETag, 304, `no-cache`; HEAD through
`HeadRequests`); the pages carry a Content-Security-Policy of `'self'`
(`content_security_policy`), so the browser fetches nothing from anywhere else. With
`protect_docs_and_metrics` they need a key like `/openapi.json` (`auth.DOCS_PREFIXES`: `/docs`
and `/redoc`, the bundles included).
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import Response

import posenc
from posenc.api.error_types import NOT_FOUND
from posenc.api.errors import ApiError
from posenc.api.serving.assets import Asset, send_asset

router = APIRouter(tags=["docs"], include_in_schema=False)

ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}
"""The files of `fastapi_offline/static` served under `/docs/assets/` and their media types."""
ASSET_PREFIX = "/docs/assets/"
SWAGGER_UI_PARAMETERS = {
    "dom_id": "#swagger-ui",
    "layout": "BaseLayout",
    "deepLinking": True,
    "showExtensions": True,
    "showCommonExtensions": True,
    # Swagger UI's default sends the document to validator.swagger.io for a badge
    "validatorUrl": None,
}
"""FastAPI's defaults (`swagger_ui_default_parameters`) without the online validator."""


INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def content_security_policy(html: str) -> str:
    """The pages' Content-Security-Policy: everything from this server only (`'self'`), the
    page's own inline scripts by their sha256. The browser then sends nothing elsewhere, not
    even ReDoc's sidebar logo (an `<img>` of cdn.redoc.ly that redoc 2 always draws, hidden when
    it fails to load). Inline styles are allowed: both bundles style their elements with them
    (ReDoc through styled-components)."""
    scripts = ["'self'"] + [
        f"'sha256-{base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()}'"
        for script in INLINE_SCRIPT.findall(html)
    ]
    return (
        f"default-src 'self'; script-src {' '.join(scripts)}; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; worker-src 'self' blob:; object-src 'none'; base-uri 'none'; "
        "frame-ancestors 'none'"
    )


def _page(request: Request, html: str) -> Response:
    headers = {"Content-Security-Policy": content_security_policy(html)}
    return send_asset(request, Asset.of(html.encode(), "text/html; charset=utf-8"), headers)


@cache
def _bundle(name: str) -> Asset:
    """One file of `fastapi_offline/static`, read once per process."""
    data = (resources.files("fastapi_offline") / "static" / name).read_bytes()
    return Asset.of(data, ASSETS[name])


def _prefix(request: Request) -> str:
    """The proxy's prefix (`root_path`) without a trailing slash."""
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/")


@router.get("/docs")
async def swagger_ui(request: Request) -> Response:
    """Swagger UI over `/openapi.json`, its bundles served here."""
    root = _prefix(request)
    page = get_swagger_ui_html(
        openapi_url=f"{root}/openapi.json",
        title=f"posenc {posenc.__version__} - Swagger UI",
        swagger_js_url=f"{root}{ASSET_PREFIX}swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSET_PREFIX}swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSET_PREFIX}favicon.png",
        swagger_ui_parameters=SWAGGER_UI_PARAMETERS,
    )
    return _page(request, bytes(page.body).decode())


@router.get("/redoc")
async def redoc(request: Request) -> Response:
    """ReDoc over `/openapi.json`, its bundle served here."""
    root = _prefix(request)
    page = get_redoc_html(
        openapi_url=f"{root}/openapi.json",
        title=f"posenc {posenc.__version__} - ReDoc",
        redoc_js_url=f"{root}{ASSET_PREFIX}redoc.standalone.js",
        redoc_favicon_url=f"{root}{ASSET_PREFIX}favicon.png",
        with_google_fonts=False,
    )
    return _page(request, bytes(page.body).decode())


@router.get(ASSET_PREFIX + "{name}")
async def asset(request: Request, name: str) -> Response:
    """One of `ASSETS`; 404 `not_found` otherwise."""
    if name not in ASSETS:
        raise ApiError(
            NOT_FOUND,
            f"the API documentation has no file {name!r}",
            [{"field": "name", "message": f"one of {', '.join(ASSETS)}", "value": name}],
        )
    return send_asset(request, _bundle(name))
