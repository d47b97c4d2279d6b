"""Accuracy of `precision: reference` vs `precision: exact` against float64 truth.

Truth is computed independently of posenc and torch, with numpy in x87 extended precision
(`np.longdouble`, 64-bit mantissa: `base ** -(2i/d)`, cosl/sinl): its own error is about
p * 1e-19 rad, below 1e-13 up to position 1e6, under an fp32 ulp of every value that matters.
posenc's rows come from the compute path itself (`rows`: variant inv_freq, half-width cos/sin,
layout, cast). docs/numerics.md quotes `error_table()`; regenerate it with

    .venv/bin/python -m tests.encodings.rope.numerics
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from posenc.encodings import parse_spec
from tests.encodings.rope.hf_models import LLAMA31_ROPE, rows

WINDOW = 4096
"""Positions per measurement: the WINDOW positions ending at the named one."""


@dataclass(frozen=True)
class Model:
    name: str
    head_dim: int
    rope_theta: float
    llama3: dict[str, Any] | None = None

    def spec(self, precision: str, dtype: str = "float32") -> Any:
        fields: dict[str, Any] = {
            "kind": "rope",
            "head_dim": self.head_dim,
            "rope_theta": self.rope_theta,
            "max_positions": 1,
            "width": "half",
            "precision": precision,
            "dtype": dtype,
        }
        if self.llama3:
            fields["rope_scaling"] = self.llama3
        return parse_spec(fields)

    def inv_freq(self) -> np.ndarray:
        """Extended-precision inverse frequencies (d/2,) (Meta `apply_scaling` for llama3)."""
        d = self.head_dim
        exps = np.arange(0, d, 2, dtype=np.longdouble) / np.longdouble(d)
        inv = np.longdouble(self.rope_theta) ** -exps
        if not self.llama3:
            return inv
        s = self.llama3
        factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        orig = s["original_max_position_embeddings"]
        wavelen = 2 * np.longdouble(math.pi) / inv
        smooth = (orig / wavelen - low) / (high - low)
        mid = (1 - smooth) * inv / factor + smooth * inv
        return np.where(
            wavelen < orig / high, inv, np.where(wavelen > orig / low, inv / factor, mid)
        )

    def truth(self, positions: np.ndarray) -> np.ndarray:
        """Extended-precision [cos; sin] (2N, d/2) at int `positions` (N,)."""
        angles = positions.astype(np.longdouble)[:, None] * self.inv_freq()[None, :]
        return np.concatenate([np.cos(angles), np.sin(angles)])


MODELS = [
    Model("Llama 2 (theta 1e4, d 128)", 128, 10000.0),
    Model("Llama 3.1 8B (theta 5e5, d 128, llama3)", 128, 500000.0, LLAMA31_ROPE),
]
POSITIONS = [2047, 32767, 131071, 1_000_000]


def window(last: int) -> np.ndarray:
    return np.arange(max(0, last - WINDOW + 1), last + 1, dtype=np.int64)


def measure(model: Model, last: int, precision: str, dtype: str = "float32") -> dict[str, float]:
    """Over cos and sin at the window ending at `last`: `max_abs` |table - truth|, and the
    fraction of entries `rounded` equal to truth rounded once to fp32 (fp32 tables only)."""
    positions = window(last)
    table = rows(model.spec(precision, dtype), torch.from_numpy(positions))
    got = torch.cat([table["cos"], table["sin"]]).float().numpy()
    truth = model.truth(positions)
    out = {"max_abs": float(np.abs(got.astype(np.longdouble) - truth).max())}
    if dtype == "float32":
        out["rounded"] = float((got == truth.astype(np.float32)).mean())
    return out


def error_table() -> str:
    """The markdown table in docs/numerics.md: max |error| vs float64 truth per precision."""
    lines = [
        "| model | positions | fp32 max abs err, reference | exact "
        "| fp32 correctly rounded, reference | exact "
        "| bf16 max abs err, reference | exact |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model in MODELS:
        for last in POSITIONS:
            lo = window(last)[0]
            ref, exact = measure(model, last, "reference"), measure(model, last, "exact")
            ref16 = measure(model, last, "reference", "bfloat16")
            exact16 = measure(model, last, "exact", "bfloat16")
            cells = [
                f"{ref['max_abs']:.2e}",
                f"{exact['max_abs']:.2e}",
                f"{100 * ref['rounded']:.2f}%",
                f"{100 * exact['rounded']:.4f}%",
                f"{ref16['max_abs']:.2e}",
                f"{exact16['max_abs']:.2e}",
            ]
            lines.append(f"| {model.name} | {lo}..{last} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(error_table())
