"""Request body caps declared on the routes themselves: `@body_cap("max_upload_bytes")` on an
endpoint names the `Settings` field holding its cap (larger than `max_body_bytes`, which every
other route gets); `body_limits` turns the marked routes of the app into the
`Gate` middleware's (path pattern, cap) list, from each route's own path."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.responses import Response

from posenc.api.middleware import RouteLimit
from posenc.api.settings import Settings

E = TypeVar("E", bound=Callable[..., Awaitable[Response]])

CAP = "__posenc_body_cap__"
"""The attribute `body_cap` sets on an endpoint: the name of its `Settings` cap field."""


def body_cap(setting: str) -> Callable[[E], E]:
    """Mark an endpoint's request bodies as capped by the `Settings` field `setting`."""
    if setting not in Settings.model_fields:
        raise ValueError(f"body_cap names {setting!r}, not a settings field")

    def mark(endpoint: E) -> E:
        setattr(endpoint, CAP, setting)
        return endpoint

    return mark


def body_limits(settings: Settings, routers: Iterable[APIRouter]) -> list[RouteLimit]:
    """(path pattern, cap) of every route whose endpoint is marked `body_cap`: the route's own
    path regex, with or without a trailing slash (which FastAPI redirects)."""
    limits: list[RouteLimit] = []
    for router in routers:
        for route in router.routes:
            setting = getattr(getattr(route, "endpoint", None), CAP, None)
            if isinstance(route, APIRoute) and setting is not None:
                path = route.path_regex.pattern.removeprefix("^").removesuffix("$")
                limits.append(
                    (re.compile(path.removesuffix("/") + "/?"), getattr(settings, setting))
                )
    return limits
