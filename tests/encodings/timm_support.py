"""Importing timm's layer modules in the tests without timm's package init.

`import timm` pulls in torchvision, which has no CPU build here; the reference functions the tests
compare against (timm.layers.pos_embed*, pos_embed_rel) need only torch. Stub packages for `timm`
and `timm.layers` let those submodules import; everything imported is removed afterwards.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator

import pytest


def timm_layer(module: str) -> Iterator[types.ModuleType]:
    """Yield `timm.layers.<module>` (skip when timm is absent); for a module-scoped fixture."""
    found = importlib.util.find_spec("timm")
    if found is None or not found.submodule_search_locations:
        pytest.skip("timm is not installed")
    root = next(iter(found.submodule_search_locations))
    before = set(sys.modules)
    for name, path in (("timm", root), ("timm.layers", f"{root}/layers")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [path]
            sys.modules[name] = package
    try:
        yield importlib.import_module(f"timm.layers.{module}")
    finally:
        for name in set(sys.modules) - before:
            del sys.modules[name]
