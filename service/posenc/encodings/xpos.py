"""xPos: rotary embedding with an exponential decay, separate query and key tables (Sun et al.
2022, "A Length-Extrapolatable Transformer", arXiv:2212.10554; reference: microsoft/torchscale
`torchscale/component/xpos_relative_position.py`, `XPOS`).

With head dim d, pairs i in [0, d/2), rows at positions n = position_offset + r (r < P):

    zeta[i]   = (2i + gamma*d) / ((1 + gamma)*d)        torchscale: (arange(0, d, 2) + 0.4d) / 1.4d
    s[n, i]   = zeta[i] ** ((n - c) / scale_base)       query scale; the key scale is 1 / s
    theta[i]  = 1 / base ** (i / (d/2))                 torchscale `fixed_pos_embedding`
    cos, sin  = cos(n * theta[i]), sin(n * theta[i])    angles at the uncentred position n

so q_n . k_m after rotation carries zeta ** ((n - m) / scale_base): the centre c cancels in every
query-key product and only bounds the magnitudes (|n - c| / scale_base * |ln zeta[0]| must stay
inside the output dtype's range, checked at validation). Defaults gamma 0.4, scale_base 512,
base 10000 (torchscale's constants).

Centring (`centre`): torchscale's `XPOS.forward(x, offset)` builds positions
`arange(min_pos, max_pos)` with `min_pos = -(length + offset) // 2` (Python floor division of the
negated total, i.e. -ceil(T/2), T = length + offset) and keeps the last `length` rows, so the
exponent of absolute position n is `n - ceil(T / 2)`: `"torchscale"` uses c = ceil(T / 2) with
T = position_offset + max_positions (the end of this table; a decoding step with a KV cache of S
keys is `position_offset = S - 1, max_positions = 1`, the same T as the keys, as torchscale's
`MultiheadAttention` calls it). `"floor_half"` is c = floor(T / 2) (rotary-embedding-torch's
`get_scale`: `t - len(t) // 2`); `"none"` is c = 0 (the paper's equations); an integer fixes c.
The canonical form holds the integer. A runtime that grows its sequence can keep one fixed c for
all steps: the scores are unchanged, only the range guard depends on it.

Outputs (`packing`):
- `premultiplied` (default): `cos_q = cos * s`, `sin_q = sin * s`, `cos_k = cos * (1/s)`,
  `sin_k = sin * (1/s)`, each (P, w): torchscale's `apply_rotary_pos_emb(x, sin, cos, scale)`
  multiplies exactly so (`t * scale`, `1 / scale` for keys). Any RoPE kernel that computes
  `x * cos + rotate(x) * sin` from caches (ONNX RotaryEmbedding with the q and k caches, a
  flash-attn style kernel) then applies xPos unchanged: pass the `_q` tables for queries and the
  `_k` tables for keys.
- `factored`: `cos`, `sin`, `scale_q = s`, `scale_k = 1/s`, each (P, w), for kernels that take
  the scale separately.

Layout as in RoPE: `width` full is (P, d) with each pair's value repeated, interleaved
`[a0, a0, a1, a1, ...]` (torchscale's `duplicate_interleave` with `rotate_every_two`, the default)
or `[a0, a1, ..., a0, a1, ...]` when `interleaved` is false (rotate-half kernels); `width` half is
(P, d/2), one column per pair (ONNX RotaryEmbedding caches, with its `interleaved` attribute set
from `interleaved`).

Precision: `reference` runs torchscale's fp32 ops in its order (bit-identical on CPU); `exact` runs
the same formulas in float64 and rounds once to `dtype`.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, NoReturn, Self

import torch
from pydantic import Field, model_validator

from posenc.encodings.base import DTYPES, SpecBase, TensorInfo, register_family
from posenc.encodings.errors import FieldProblem, SpecError
from posenc.encodings.rounding import cast

MAX_HEAD_DIM = 8192
MAX_POSITIONS = 1 << 24

Centre = Literal["torchscale", "floor_half", "none"]
Packing = Literal["premultiplied", "factored"]
Width = Literal["half", "full"]
FloatDtype = Literal["float32", "float16", "bfloat16"]
Precision = Literal["reference", "exact"]

OUTPUT_NAMES: dict[str, tuple[str, ...]] = {
    "premultiplied": ("cos_q", "sin_q", "cos_k", "sin_k"),
    "factored": ("cos", "sin", "scale_q", "scale_k"),
}


def log_range(dtype: str) -> float:
    """Largest |ln v| with v a normal number of `dtype`: min(ln max, -ln tiny)."""
    info = torch.finfo(DTYPES[dtype])
    return min(math.log(info.max), -math.log(info.tiny))


def _bad(field: str, message: str, value: Any) -> NoReturn:
    raise SpecError("invalid xpos spec", [FieldProblem(field, message, value)])


class XposSpec(SpecBase):
    """xPos query and key tables (P, w) for positions position_offset .. position_offset+P-1;
    see the module docstring for the formulas, the centring conventions and the outputs."""

    kind: Literal["xpos"] = "xpos"
    head_dim: Annotated[int, Field(ge=2, le=MAX_HEAD_DIM)]
    max_positions: Annotated[int, Field(ge=1, le=MAX_POSITIONS)]
    position_offset: Annotated[int, Field(ge=0, lt=MAX_POSITIONS)] = 0
    scale_base: Annotated[float, Field(gt=0.0)] = 512.0
    gamma: Annotated[float, Field(gt=0.0, le=1e6)] = 0.4
    base: Annotated[float, Field(gt=1.0)] = 10000.0
    centre: Centre | Annotated[int, Field(ge=-MAX_POSITIONS, le=2 * MAX_POSITIONS)] = "torchscale"
    packing: Packing = "premultiplied"
    width: Width = "full"
    interleaved: bool = True
    dtype: FloatDtype = "float32"
    precision: Precision = "reference"

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.head_dim % 2:
            _bad("head_dim", "must be even (xPos rotates pairs)", self.head_dim)
        if self.position_offset + self.max_positions > MAX_POSITIONS:
            _bad(
                "position_offset",
                f"position_offset + max_positions must be <= {MAX_POSITIONS}",
                self.position_offset,
            )
        peak = self.max_log_scale()
        limit = log_range(self.dtype)
        if peak > limit:
            wider = " or dtype float32" if peak <= log_range("float32") else ""
            _bad(
                "max_positions",
                f"the decay overflows {self.dtype}: |n - centre| up to {self._farthest()} gives "
                f"|ln scale| = {peak:.4g} > {limit:.4g} (centre={self.resolved_centre()}, "
                f"scale_base={self.scale_base:g}); use fewer positions, a larger scale_base, "
                f"a centre inside the rows{wider}",
                self.max_positions,
            )
        return self

    def resolved_centre(self) -> int:
        """c: the position whose scale is 1 (module docstring)."""
        if isinstance(self.centre, int):
            return self.centre
        total = self.position_offset + self.max_positions
        if self.centre == "torchscale":
            return -((-total) // 2)
        if self.centre == "floor_half":
            return total // 2
        return 0

    def _farthest(self) -> int:
        """max |n - c| over the rows."""
        c = self.resolved_centre()
        first, last = self.position_offset, self.position_offset + self.max_positions - 1
        return max(abs(first - c), abs(last - c))

    def max_log_scale(self) -> float:
        """max |ln s| over the table: the farthest row from the centre at pair 0 (smallest zeta)."""
        return self.log_scale_at(self._farthest())

    def log_scale_at(self, distance: int) -> float:
        """max |ln s| over the pairs of a position `distance` = |n - c| from the centre (pair 0,
        the smallest zeta); rows outside the table must keep it within `log_range(dtype)`."""
        zeta0 = self.gamma / (1.0 + self.gamma)
        return distance / self.scale_base * -math.log(zeta0)

    def canonical(self) -> Self:
        return self.model_copy(
            update={
                "centre": self.resolved_centre(),
                "scale_base": float(self.scale_base),
                "gamma": float(self.gamma),
                "base": float(self.base),
            }
        )

    def outputs(self) -> dict[str, TensorInfo]:
        w = self.head_dim if self.width == "full" else self.head_dim // 2
        info = TensorInfo((self.max_positions, w), self.dtype, row_axis=0)
        return dict.fromkeys(OUTPUT_NAMES[self.packing], info)

    def cache_precision(self) -> str:
        return self.precision


def xpos_half_rows(
    spec: XposSpec, positions: torch.Tensor, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cos, sin, s) half-width (N, d/2) for int64 absolute `positions` n (N,), in the compute
    dtype (fp32 or fp64), uncast; the spec's centre c (`resolved_centre`), whatever the positions.

    fp32 follows torchscale `XPOS.forward`: `zeta = (arange(0, d, 2) + gamma*d) / ((1 + gamma)*d)`,
    `s = zeta ** ((n - c).float() / scale_base)`, `theta = 1.0 / (base ** (arange(d/2) / (d/2)))`
    (`fixed_pos_embedding`), angles `einsum("i,j->ij", n.float(), theta)`. Every op is
    elementwise along n (a row depends on its own position only), so the rows of any positions
    are the rows of a table holding them with the same c, bit for bit (`xpos_half_tables` is this
    function over the table's positions).
    """
    d = spec.head_dim
    half = d // 2
    dt = torch.float64 if spec.precision == "exact" else torch.float32
    c = spec.resolved_centre()
    n = positions.to(device=device, dtype=torch.int64)
    zeta = (torch.arange(0, d, 2, device=device).to(dt) + spec.gamma * d) / ((1.0 + spec.gamma) * d)
    exponent = (n - c).to(dt).div(spec.scale_base)
    s = zeta ** exponent[:, None]
    # theta (d/2,) on the CPU, then moved: CUDA's pow differs by an ulp, which angles multiply
    theta = (1.0 / (spec.base ** (torch.arange(0, half).to(dt) / half))).to(n.device)
    angles = torch.einsum("i , j -> i j", n.to(dt), theta)
    return torch.cos(angles), torch.sin(angles), s


def xpos_half_tables(
    spec: XposSpec, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cos, sin, s) half-width (P, d/2) for the table's positions position_offset .. +P-1, in
    the compute dtype (fp32 or fp64), uncast (`xpos_half_rows`)."""
    start = spec.position_offset
    n = torch.arange(start, start + spec.max_positions, dtype=torch.int64, device=device)
    return xpos_half_rows(spec, n, device)


def _arrange(spec: XposSpec, t: torch.Tensor) -> torch.Tensor:
    if spec.width == "half":
        out = t
    elif spec.interleaved:
        out = t.repeat_interleave(2, dim=-1)
    else:
        out = torch.cat((t, t), dim=-1)
    return cast(out, DTYPES[spec.dtype])


def _pack(
    spec: XposSpec, cos: torch.Tensor, sin: torch.Tensor, s: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The four outputs (N, w) per `packing`, laid out per `width`/`interleaved`, cast once."""
    s_k = 1 / s
    if spec.packing == "premultiplied":
        parts = (cos * s, sin * s, cos * s_k, sin * s_k)
    else:
        parts = (cos, sin, s, s_k)
    return {
        name: _arrange(spec, t) for name, t in zip(OUTPUT_NAMES[spec.packing], parts, strict=True)
    }


def xpos_rows(
    spec: XposSpec, positions: torch.Tensor, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """The outputs of `compute_xpos` (names per `packing`), each (N, w) in the spec's dtype, for
    int64 absolute `positions` n (N,) that need not lie in the table: row k equals the table's row
    of position positions[k] bit for bit for any spec with the same c and fields (same ops in the
    same order, one rounding to `dtype`). The caller bounds |n - c| (`XposSpec.log_scale_at`).

    Checked on CPU for head_dim >= 4 (torch's CPU `pow` runs the columns of each row in the same
    SIMD/scalar split whatever the rows); with head_dim 2 (one column) it vectorises along the
    positions instead, so a row's last bit may depend on its place, in tables as well."""
    return _pack(spec, *xpos_half_rows(spec, positions, device))


@register_family("xpos", XposSpec, "xPos decaying rotary tables, separate query and key scales")
def compute_xpos(
    spec: XposSpec, device: torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Four (P, w) tables per `packing` (module docstring); facts: the centre and max |ln s|."""
    tensors = _pack(spec, *xpos_half_tables(spec, device))
    facts: dict[str, Any] = {
        "centre": spec.resolved_centre(),
        "max_log_scale": spec.max_log_scale(),
    }
    return tensors, facts
