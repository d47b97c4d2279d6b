"""The cases of the fused CUDA path's tests (issue 36): real configs, every layout and dtype.

RoPE: every rope table the config.json files of tests/data/configs resolve to (default, linear,
llama3, yarn, longrope, dynamic, ntk_alpha: the published values), plus Gemma 4's proportional
table from transformers' own `Gemma4TextConfig` defaults, each in every width / packing /
full-width arrangement (`LAYOUTS`) and output dtype. Sinusoidal: the tables those configs
resolve to (Whisper, Marian, M2M100) and every convention of the family at an even and an odd
dim (where the convention takes one), in every output dtype.
"""

from __future__ import annotations

import functools
from typing import Any, get_args

from posenc.encodings import SpecError, parse_spec
from posenc.encodings.hf_config import from_hf_config
from posenc.encodings.sinusoidal import Convention
from tests.encodings.hf_config.support import CONFIGS, RESOLVE_OVERRIDES, load
from tests.encodings.rope.hf_models import gemma4_text

DTYPES = ("float32", "bfloat16", "float16")

LAYOUTS: list[dict[str, Any]] = [
    {"width": "half", "packing": "separate", "interleaved": False},
    {"width": "half", "packing": "separate", "interleaved": True},
    {"width": "full", "packing": "separate", "interleaved": False},
    {"width": "full", "packing": "separate", "interleaved": True},
    {"width": "full", "packing": "separate", "interleaved": True, "full_layout": "cat"},
    {
        "width": "full",
        "packing": "separate",
        "interleaved": False,
        "full_layout": "repeat_interleave",
    },
    {"width": "half", "packing": "cos_sin", "interleaved": False},
    {"width": "full", "packing": "cos_sin", "interleaved": False},
    {"width": "full", "packing": "cos_sin", "interleaved": True},
    {"width": "half", "packing": "pairs", "interleaved": True},
    {"width": "full", "packing": "pairs", "interleaved": False},
    {"width": "full", "packing": "pairs", "interleaved": True},
]
"""Every arrangement `rope.compute.layout` produces (`interleaved` changes the full-width copy)."""


def _plain(spec: Any) -> dict[str, Any]:
    data: dict[str, Any] = spec.canonical().model_dump(mode="python", exclude_none=True)
    return data


@functools.cache
def config_specs(kind: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    """(config file, canonical spec dict) of every `kind` table the test configs resolve to."""
    found = []
    for path in sorted(CONFIGS.glob("*.json")):
        specs = from_hf_config(load(path.name), **RESOLVE_OVERRIDES.get(path.name, {}))
        for i, spec in enumerate(specs):
            if spec.kind == kind:
                found.append((f"{path.stem}-{i}", _plain(spec)))
    if kind == "rope":
        for i, spec in enumerate(from_hf_config(gemma4_text().to_dict())):
            found.append((f"gemma4-{i}", _plain(spec)))
    return tuple(found)


def rope_cases(
    max_positions: int, precision: str = "reference"
) -> list[tuple[str, dict[str, Any]]]:
    """Every config's rope spec at `max_positions` (at most its own), in every layout and dtype;
    the layout fields replace the config's (its pairing included), `profile` dropped; at
    `precision` (exact: float64 compute, labels ending in `-exact`)."""
    cases = []
    suffix = [] if precision == "reference" else [precision]
    for name, spec in config_specs("rope"):
        base = {k: v for k, v in spec.items() if k not in ("profile", "full_layout")}
        base["max_positions"] = min(int(base["max_positions"]), max_positions)
        base["precision"] = precision
        for layout in LAYOUTS:
            for dtype in DTYPES:
                label = "-".join([name, *(str(v) for v in layout.values()), dtype, *suffix])
                cases.append((label, {**base, **layout, "dtype": dtype}))
    return cases


def sinusoidal_cases(max_positions: int) -> list[tuple[str, dict[str, Any]]]:
    """The configs' sinusoidal specs and every convention at dim 1024 and 1025, in every dtype."""
    bases = [(name, spec) for name, spec in config_specs("sinusoidal")]
    for convention in get_args(Convention):
        for dim in (1024, 1025):
            data = {"kind": "sinusoidal", "convention": convention, "dim": dim}
            try:
                parse_spec({**data, "max_positions": max_positions})
            except SpecError:  # a convention that refuses an odd dim
                continue
            bases.append((f"{convention}-{dim}", data))
    cases = []
    for name, spec in bases:
        for dtype in DTYPES:
            data = {**spec, "max_positions": max_positions, "dtype": dtype}
            data.pop("positions", None)
            cases.append((f"{name}-{dtype}", data))
    return cases
