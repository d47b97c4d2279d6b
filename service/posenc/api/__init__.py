"""posenc.api: the FastAPI service (`create_app`), its settings and the uvicorn runner.

`create_app` and `Settings` are imported when first asked for (PEP 562), so that a module of
the package that needs neither torch nor the app (`posenc.api.settings`: the `posenc serve`
command line and its configuration errors) loads without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from posenc.api.app import create_app
    from posenc.api.settings import Settings

__all__ = ["Settings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from posenc.api.app import create_app

        return create_app
    if name == "Settings":
        from posenc.api.settings import Settings

        return Settings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
