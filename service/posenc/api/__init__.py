"""posenc.api: the FastAPI service (`create_app`), its settings and the uvicorn runner."""

from posenc.api.app import create_app
from posenc.api.settings import Settings

__all__ = ["Settings", "create_app"]
