"""1-D sinusoidal position tables (Vaswani et al. 2017, "Attention Is All You Need", section 3.5).

One parameter space covers the published variants; each `convention` is a named point in it and
every field can also be set directly (explicit fields override the convention):

    K      = dim // 2                                  frequencies (pairs)
    den    = K - freq_shift                            0 for Vaswani, 1 for tensor2tensor/fairseq
    inv[k] = base ** (-k / den)                        k in [0, K)
    angle  = scale * (position * inv[k])
    row    = layout of sin(angle) and cos(angle)       interleaved / sin_cos / cos_sin

| convention       | shift | layout      | odd dim   | compute | reference                      |
|------------------|------:|-------------|-----------|---------|--------------------------------|
| vaswani          | 0     | interleaved | error     | float32 | paper 3.5, PyTorch tutorial    |
| tensor2tensor    | 1     | sin_cos     | zero_pad  | float32 | t2t `get_timing_signal_1d`     |
| fairseq          | 1     | sin_cos     | zero_pad  | float32 | fairseq `get_embedding`, pad 1 |
| whisper          | 1     | sin_cos     | error     | float32 | HF whisper `sinusoids`         |
| marian           | 0     | sin_cos     | extra_sin | float64 | HF Marian `create_weight`      |
| diffusers        | 1     | sin_cos     | zero_pad  | float32 | `get_timestep_embedding`       |
| guided_diffusion | 0     | cos_sin     | zero_pad  | float32 | `nn.timestep_embedding`        |
| espnet           | 0     | interleaved | error     | float32 | ESPnet `RelPositionalEncoding` |
| ctrl             | 0     | sin_cos     | extra_sin | f32 pow | HF CTRL `positional_encoding`  |
| transformer_xl   | 0     | sin_cos     | error     | f32 pow | HF XLNet `positional_embedding`|
| parakeet         | 0     | interleaved | error     | f32 pow | HF Parakeet rel. positions     |

All use base 10000, scale 1, position_offset 0; only fairseq sets padding_idx (1). `espnet` is
the vaswani point under the name of its relative-position users (transformers'
`FastSpeech2ConformerRelPositionalEncoding`, `Wav2Vec2ConformerRelPositionalEmbedding`,
`SeamlessM4TConformerRelPositionalEmbedding`: `exp(2k * -(ln 10000 / dim))`, sin at even columns).

`frequencies` picks the float32 rule for the inverse frequencies: `exp` (the default; fairseq's
`exp(k * -(ln(base) / den))`) or `pow` (`1 / base ** (k / den)`, transformers' RoPE init order,
which `ctrl` (`1 / torch.pow(10000, 2 * (i // 2) / d)`), `transformer_xl` (XLNet's
`1 / torch.pow(10000, arange(0, d, 2) / d)`) and `parakeet` (`1.0 / (10000 ** (arange(0, d, 2) /
d))`) use; the two differ by an ulp on some frequencies). `position_step` -1 lays the rows out
descending, positions `position_offset - r`: the relative distances of Transformer-XL style
encoders, whose row r is the distance L - 1 - r (`parakeet`, `espnet`: offset L - 1 and 2L - 1
rows for an input of L; XLNet: offset klen, klen + qlen rows).

`standardize: "patchtst"` then centres the whole table on its mean and divides it by 10 times its
(unbiased) standard deviation, as PatchTST's `PatchTSTPositionalEncoding._init_pe` does to its
espnet table (the reductions run on the CPU, in the reference's order).

Rows are positions `position_offset + r` for r < max_positions, or the explicit (possibly
fractional) `positions` (diffusers timesteps). `padding_idx` is a position id whose row is all
zero (fairseq, and transformers' M2M100/Speech2Text/FSMT, whose table rows are indexed by position
id: row 0 is an ordinary position-0 row, row padding_idx=1 is zero, real tokens start at id 2). To
reproduce transformers' `M2M100SinusoidalPositionalEmbedding.weights` in full, use the fairseq
convention with `max_positions = max_position_embeddings + 2` (its `offset`); to get only the rows
real tokens use, set `position_offset = 2` and `max_positions = max_position_embeddings`.

Odd `dim`: `zero_pad` appends one zero column (fairseq, tensor2tensor, diffusers); `error`
rejects it (Whisper raises, the PyTorch tutorial fails); `extra_sin` is Marian/XLM's rule:
frequencies `base ** (-2k/dim)` (den = dim/2: an unset freq_shift defaults to the convention's
minus 0.5 for odd dims), ceil(dim/2) sin columns and floor(dim/2) cos columns.

Numerics (field guide section 0 and 4): `compute_dtype` float32 reproduces transformers' fp32 op
order (fairseq/Whisper `get_embedding`): `inv = exp(k * -(ln(base) / den))` with the scalar rounded
to fp32, `angle = position_f32 * inv`, then `sin`/`cos`; bit-identical to transformers on CPU.
`compute_dtype` float64 reproduces Marian/XLM's numpy order `position / base ** (k / den)` in
float64 and rounds once; it is also the "exact" mode of every other convention. The table is cast
to `dtype` last.

Output: `embedding` (P, dim), P = max_positions or len(positions).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from functools import partial
from typing import Annotated, Any, Literal, NoReturn, Self

import torch
from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from posenc.encodings import fused
from posenc.encodings.base import DTYPES, SpecBase, TensorInfo, register_family
from posenc.encodings.memory import empty, to_device

MAX_DIM = 65536
MAX_POSITIONS = 1 << 24
MAX_EXPLICIT_POSITIONS = 65536
MAX_POSITION_VALUE = 2.0**31

Convention = Literal[
    "vaswani",
    "tensor2tensor",
    "fairseq",
    "whisper",
    "marian",
    "diffusers",
    "guided_diffusion",
    "espnet",
    "ctrl",
    "transformer_xl",
    "parakeet",
]
Layout = Literal["interleaved", "sin_cos", "cos_sin"]
OddDim = Literal["error", "zero_pad", "extra_sin"]
ComputeDtype = Literal["float32", "float64"]
Frequencies = Literal["exp", "pow"]
FloatDtype = Literal["float32", "float16", "bfloat16"]

_COMMON: dict[str, Any] = {
    "base": 10000.0,
    "scale": 1.0,
    "position_offset": 0,
    "padding_idx": None,
    "dtype": "float32",
    "frequencies": "exp",
}

CONVENTIONS: dict[str, dict[str, Any]] = {
    # Paper 3.5 and the PyTorch tutorial: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos.
    "vaswani": {
        **_COMMON,
        "freq_shift": 0.0,
        "layout": "interleaved",
        "odd_dim": "error",
        "compute_dtype": "float32",
    },
    # tensor2tensor get_timing_signal_1d: log increment ln(max/min) / max(K - 1, 1), concat, pad.
    "tensor2tensor": {
        **_COMMON,
        "freq_shift": 1.0,
        "layout": "sin_cos",
        "odd_dim": "zero_pad",
        "compute_dtype": "float32",
    },
    # fairseq SinusoidalPositionalEmbedding.get_embedding (also M2M100, Speech2Text, FSMT).
    "fairseq": {
        **_COMMON,
        "freq_shift": 1.0,
        "layout": "sin_cos",
        "odd_dim": "zero_pad",
        "compute_dtype": "float32",
        "padding_idx": 1,
    },
    # Whisper `sinusoids(length, channels, max_timescale=10000)`: raises on odd channels.
    "whisper": {
        **_COMMON,
        "freq_shift": 1.0,
        "layout": "sin_cos",
        "odd_dim": "error",
        "compute_dtype": "float32",
    },
    # Marian create_weight: XLM's float64 numpy table, not interleaved ([sin | cos]).
    "marian": {
        **_COMMON,
        "freq_shift": 0.0,
        "layout": "sin_cos",
        "odd_dim": "extra_sin",
        "compute_dtype": "float64",
    },
    # diffusers get_timestep_embedding defaults: flip_sin_to_cos=False, downscale_freq_shift=1.
    "diffusers": {
        **_COMMON,
        "freq_shift": 1.0,
        "layout": "sin_cos",
        "odd_dim": "zero_pad",
        "compute_dtype": "float32",
    },
    # guided-diffusion timestep_embedding: freqs exp(-ln(max_period) k / half), cat([cos, sin]).
    "guided_diffusion": {
        **_COMMON,
        "freq_shift": 0.0,
        "layout": "cos_sin",
        "odd_dim": "zero_pad",
        "compute_dtype": "float32",
    },
    # ESPnet RelPositionalEncoding (transformers' FastSpeech2-Conformer, wav2vec2-Conformer and
    # SeamlessM4T conformer copies): div_term = exp(arange(0, d, 2) * -(ln 10000 / d)), pe[:, 0::2]
    # = sin, pe[:, 1::2] = cos (the vaswani point; its rows are relative distances, descending).
    "espnet": {
        **_COMMON,
        "freq_shift": 0.0,
        "layout": "interleaved",
        "odd_dim": "error",
        "compute_dtype": "float32",
    },
    # CTRL positional_encoding: angle_rates = 1 / torch.pow(10000, 2 * (i // 2) / d) per column
    # i, cat([sin(even columns), cos(odd columns)]): an odd d has one more sin column.
    "ctrl": {
        **_COMMON,
        "freq_shift": 0.0,
        "layout": "sin_cos",
        "odd_dim": "extra_sin",
        "compute_dtype": "float32",
        "frequencies": "pow",
    },
    # Transformer-XL / XLNet positional_embedding: inv_freq = 1 / torch.pow(10000, arange(0, d,
    # 2) / d), cat([sin, cos]) of the relative distances (descending rows).
    "transformer_xl": {
        **_COMMON,
        "freq_shift": 0.0,
        "layout": "sin_cos",
        "odd_dim": "error",
        "compute_dtype": "float32",
        "frequencies": "pow",
    },
    # Parakeet / Nemotron ASR EncoderRelPositionalEncoding: inv_freq = 1.0 / (10000 ** (arange(0,
    # d, 2) / d)), stack([sin, cos], -1) flattened (interleaved) of the distances L-1..-(L-1).
    "parakeet": {
        **_COMMON,
        "freq_shift": 0.0,
        "layout": "interleaved",
        "odd_dim": "error",
        "compute_dtype": "float32",
        "frequencies": "pow",
    },
}


def raise_field_errors(title: str, problems: list[tuple[str, str, Any]]) -> NoReturn:
    """Raise one pydantic error per (field, message, value), located at that field.

    A model validator's `ValueError` has no location; raising `ValidationError` with explicit
    locations makes `validate_as` report `FieldProblem(field=...)` for cross-field checks too.
    """
    raise ValidationError.from_exception_data(
        title,
        [
            InitErrorDetails(
                type=PydanticCustomError("value_error", "{message}", {"message": message}),
                loc=(name,),
                input=value,
            )
            for name, message, value in problems
        ],
    )


_CONVENTION_FIELDS = (
    "base",
    "freq_shift",
    "layout",
    "position_offset",
    "padding_idx",
    "odd_dim",
    "compute_dtype",
    "scale",
    "dtype",
    "frequencies",
)


class SinusoidalSpec(SpecBase):
    """Fixed 1-D sinusoidal position table `embedding` (P, dim); see the module docstring.

    Fields left `None` take the value of `convention` (default "vaswani"); `canonical()` fills
    them all and drops `convention`, so a convention and its explicit spelling share one key.
    """

    kind: Literal["sinusoidal"] = "sinusoidal"
    dim: Annotated[int, Field(ge=2, le=MAX_DIM)]
    max_positions: Annotated[int | None, Field(ge=1, le=MAX_POSITIONS)] = None
    positions: Annotated[
        list[Annotated[float, Field(ge=-MAX_POSITION_VALUE, le=MAX_POSITION_VALUE)]] | None,
        Field(min_length=1, max_length=MAX_EXPLICIT_POSITIONS),
    ] = None
    convention: Convention | None = None
    base: Annotated[float | None, Field(gt=0.0)] = None
    freq_shift: float | None = None
    layout: Layout | None = None
    position_offset: Annotated[int | None, Field(ge=0, le=int(MAX_POSITION_VALUE))] = None
    padding_idx: Annotated[int | None, Field(ge=0, le=int(MAX_POSITION_VALUE))] = None
    odd_dim: OddDim | None = None
    compute_dtype: ComputeDtype | None = None
    scale: float | None = None
    dtype: FloatDtype | None = None
    frequencies: Frequencies | None = None
    position_step: Literal[1, -1] | None = None
    standardize: Literal["patchtst"] | None = None

    def _get(self, name: str) -> Any:
        value = getattr(self, name)
        if value is not None or (name == "padding_idx" and name in self.model_fields_set):
            # An explicit `padding_idx: null` switches fairseq's padding row off.
            return value
        default = CONVENTIONS[self.convention or "vaswani"][name]
        if name == "freq_shift" and self.dim % 2 and self._get("odd_dim") == "extra_sin":
            # Marian/XLM's exponent is 2k / dim, not k / (dim // 2): den = dim / 2 = K + 0.5.
            return default - 0.5
        return default

    @model_validator(mode="after")
    def _check(self) -> Self:
        problems: list[tuple[str, str, Any]] = []
        if (self.max_positions is None) == (self.positions is None):
            problems.append(
                (
                    "max_positions",
                    "give exactly one of max_positions (rows offset..offset+P-1) or positions",
                    self.max_positions,
                )
            )
        if self.positions is not None and self.position_offset not in (None, 0):
            problems.append(
                (
                    "position_offset",
                    "applies to max_positions rows only; shift the explicit positions instead",
                    self.position_offset,
                )
            )
        if self.positions is not None and self.position_step not in (None, 1):
            problems.append(
                (
                    "position_step",
                    "applies to max_positions rows only; order the explicit positions instead",
                    self.position_step,
                )
            )
        if self.max_positions is not None:
            offset = self._get("position_offset") or 0
            if self.position_step == -1 and offset - (self.max_positions - 1) < -MAX_POSITION_VALUE:
                problems.append(
                    (
                        "position_offset",
                        f"position_offset - (max_positions - 1) must be >= "
                        f"{-int(MAX_POSITION_VALUE)}",
                        offset,
                    )
                )
            elif self.position_step != -1 and offset + self.max_positions - 1 > MAX_POSITION_VALUE:
                problems.append(
                    (
                        "position_offset",
                        f"position_offset + max_positions - 1 must be <= {int(MAX_POSITION_VALUE)}",
                        offset,
                    )
                )
        if self.dim % 2 and self._get("odd_dim") == "error":
            problems.append(
                (
                    "dim",
                    f"must be even under odd_dim='error' (convention "
                    f"{self.convention or 'vaswani'!r}); set odd_dim to 'zero_pad' or 'extra_sin'",
                    self.dim,
                )
            )
        elif self.num_frequencies() >= 2 and not self.denominator() > 0:
            problems.append(
                (
                    "freq_shift",
                    f"must be < dim // 2 = {self.dim // 2} (the frequency denominator "
                    "dim // 2 - freq_shift must be positive)",
                    self._get("freq_shift"),
                )
            )
        if problems:
            raise_field_errors("SinusoidalSpec", problems)
        return self

    def denominator(self) -> float:
        """den: the exponent denominator `K - freq_shift` (K = dim // 2)."""
        return self.dim // 2 - float(self._get("freq_shift"))

    def num_frequencies(self) -> int:
        """Distinct frequencies: K = dim // 2, plus one sin-only frequency under `extra_sin`."""
        return self.dim // 2 + int(self.dim % 2 == 1 and self._get("odd_dim") == "extra_sin")

    def num_rows(self) -> int:
        """P: the number of table rows."""
        return len(self.positions) if self.positions is not None else int(self.max_positions or 0)

    def canonical(self) -> Self:
        values = {name: self._get(name) for name in _CONVENTION_FIELDS}
        values["base"] = float(values["base"])
        values["scale"] = float(values["scale"])
        values["freq_shift"] = float(values["freq_shift"])
        if self.num_frequencies() == 1:
            # One frequency, k = 0: inv = 1 whatever the base and denominator.
            values["base"], values["freq_shift"] = 10000.0, 0.0
        if self.dim % 2 == 0:
            values["odd_dim"] = None
        if values["compute_dtype"] == "float64" or self.num_frequencies() == 1:
            # float64 is Marian's order (`position / base ** (k / den)`) under either rule.
            values["frequencies"] = "exp"
        positions = self.positions
        max_positions = self.max_positions
        step = -1 if self.position_step == -1 and (max_positions or 0) > 1 else 1
        if positions is not None:
            if values["compute_dtype"] == "float32":
                # The reference converts timesteps with `.float()`: equal fp32 values, equal tables.
                positions = array("f", positions).tolist()
            first = positions[0]
            consecutive = all(p == first + i for i, p in enumerate(positions))
            if first >= 0 and first.is_integer() and consecutive:
                values["position_offset"] = int(first)
                max_positions, positions = len(positions), None
            else:
                values["position_offset"] = 0
        pad = values["padding_idx"]
        if pad is not None:
            if positions is not None:
                covered = any(p == pad for p in positions)
            else:
                offset = values["position_offset"]
                covered = 0 <= (pad - offset) * step < int(max_positions or 0)
            if not covered:
                values["padding_idx"] = None
        # The defaults are left out of the canonical form (the keys of specs without them).
        if values["frequencies"] == "exp":
            values["frequencies"] = None
        return self.model_copy(
            update={
                **values,
                "max_positions": max_positions,
                "positions": positions,
                "convention": None,
                "position_step": None if step == 1 else step,
            }
        )

    def outputs(self) -> dict[str, TensorInfo]:
        return {
            "embedding": TensorInfo(
                (self.num_rows(), self.dim), str(self._get("dtype")), row_axis=0
            )
        }

    def cache_precision(self) -> str:
        """This family's precision is its compute dtype (float32 or float64)."""
        return str(self._get("compute_dtype"))


def sinusoidal_angles(spec: SinusoidalSpec, device: torch.device) -> torch.Tensor:
    """Angles (P, n) for a canonical spec, n = `num_frequencies()`, in its compute dtype.

    float32 follows fairseq/Whisper `get_embedding`: `exp(k * -(ln(base) / den))` with the scalar
    computed in Python float and rounded to fp32, then `position.float() * inv`; with
    `frequencies: pow`, `inv = 1.0 / (base ** (k.float() / den))` (CTRL, XLNet, Parakeet: the
    RoPE init order). float64 follows
    Marian/XLM `create_weight`: `position / base ** (k / den)`. `scale` multiplies the angle as in
    diffusers (`emb = scale * emb`).
    """
    n = spec.num_frequencies()
    den = spec.denominator()
    base = float(spec.base or 10000.0)
    scale = float(1.0 if spec.scale is None else spec.scale)
    # The frequencies (n,) are computed on the CPU and moved: CUDA's pow/exp differ by an ulp on
    # some elements, which the angles multiply by the position (rope.compute.rope_inv_freq).
    if spec.compute_dtype == "float64":
        k = torch.arange(n, dtype=torch.int64)
        dt = torch.float64
        exponent = k.to(dt) / den if n > 1 else k.to(dt)
        pos = _positions(spec, dt, device)
        angles = pos[:, None] / to_device(base**exponent, device)[None, :]
    else:
        inv = to_device(float32_inv_freq(spec), device)
        pos = _positions(spec, torch.float32, device)
        angles = pos[:, None] * inv[None, :]
    if scale != 1.0:
        angles = scale * angles
    return angles


def float32_inv_freq(spec: SinusoidalSpec) -> torch.Tensor:
    """The float32 frequencies (n,) of a canonical spec with `compute_dtype` float32, on the CPU:
    fairseq/Whisper's `exp(k * -(ln(base) / den))` (the scalar in Python float, rounded to fp32),
    or with `frequencies: pow` transformers' RoPE init order `1.0 / (base ** (k.float() / den))`
    (k / den rounds the same real number as 2k / d: den = d / 2 for freq_shift 0)."""
    n = spec.num_frequencies()
    den = spec.denominator()
    base = float(spec.base or 10000.0)
    k = torch.arange(n, dtype=torch.int64)
    dt = torch.float32
    if spec.frequencies == "pow":
        return 1.0 / (base ** (k.to(dt) / den)) if n > 1 else torch.ones(1, dtype=dt)
    step = -(math.log(base) / den) if n > 1 else 0.0
    return torch.exp(k.to(dt) * step)


FusedLaunch = tuple[torch.Tensor, Callable[[torch.Tensor], dict[str, torch.Tensor] | None]]
"""`fused_launch`'s float32 frequencies (n,) on the CPU, and the kernel launch that takes them
on the device (`fused.run` with the spec's plan and arguments)."""


def fused_launch(spec: SinusoidalSpec, device: torch.device) -> FusedLaunch | None:
    """What `fused_table` launches for a canonical spec: its frequencies and its launch; None
    where the fused path does not apply (not CUDA, no triton, disabled, float64 compute, explicit
    positions, PatchTST standardisation, an odd interleaved table's extra sin)."""
    if spec.compute_dtype != "float32" or spec.positions is not None:
        return None
    if spec.standardize is not None or not fused.usable(device):
        return None
    plan = fused.sinusoidal_plan(
        n=spec.num_frequencies(),
        dim=spec.dim,
        rows=spec.num_rows(),
        layout=str(spec.layout),
        dtype=str(spec.dtype),
    )
    if plan is None:
        return None
    launch = partial(
        fused.run,
        plan,
        pos_start=int(spec.position_offset or 0),
        pos_step=-1 if spec.position_step == -1 else 1,
        angle_scale=float(1.0 if spec.scale is None else spec.scale),
    )
    return float32_inv_freq(spec), launch


def fused_table(spec: SinusoidalSpec, device: torch.device) -> torch.Tensor | None:
    """`arrange(spec, sinusoidal_angles(spec, device))` cast to the spec dtype, from one fused
    kernel launch (`posenc.encodings.fused`), bit for bit; padding rows are left to the caller.
    None where the fused path does not apply (`fused_launch`)."""
    found = fused_launch(spec, device)
    if found is None:
        return None
    inv, launch = found
    outputs = launch(fused.resident(inv, device))
    if outputs is None:
        return None
    table = outputs["embedding"]
    n = spec.num_frequencies()
    if n + spec.dim // 2 < spec.dim:  # odd dim under zero_pad: the last column
        table[:, n + spec.dim // 2 :] = 0.0
    return table


def _positions(spec: SinusoidalSpec, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if spec.positions is not None:
        return torch.tensor(spec.positions, dtype=torch.float64, device=device).to(dtype)
    start = int(spec.position_offset or 0)
    rows = int(spec.max_positions or 0)
    if spec.position_step == -1:
        stop = start - rows
        return torch.arange(start, stop, -1, dtype=torch.int64, device=device).to(dtype)
    return torch.arange(start, start + rows, dtype=torch.int64, device=device).to(dtype)


def arrange(spec: SinusoidalSpec, angles: torch.Tensor) -> torch.Tensor:
    """Lay sin/cos of `angles` (P, n) out as (P, dim) per layout and odd-dim rule, uncast.

    sin and cos are written straight into their columns of the table (no intermediate tables,
    no concatenation): sin of every angle (the extra frequency of `extra_sin` included), cos of
    the first dim // 2.
    """
    half = spec.dim // 2
    rows, n = angles.shape
    table = empty((rows, spec.dim), angles.dtype, angles.device)
    extra = n - half
    if spec.layout == "interleaved":
        torch.sin(angles[:, :half], out=table[:, 0 : 2 * half : 2])
        torch.cos(angles[:, :half], out=table[:, 1 : 2 * half : 2])
        if extra:
            torch.sin(angles[:, half:], out=table[:, 2 * half : 2 * half + extra])
    elif spec.layout == "cos_sin":
        torch.cos(angles[:, :half], out=table[:, :half])
        torch.sin(angles, out=table[:, half : half + n])
    else:
        torch.sin(angles, out=table[:, :n])
        torch.cos(angles[:, :half], out=table[:, n : n + half])
    if n + half < spec.dim:  # odd dim under zero_pad: the last column
        table[:, n + half :] = 0.0
    return table


def _zero_padding_rows(spec: SinusoidalSpec, table: torch.Tensor) -> None:
    """Zero the rows whose position is `padding_idx` (fairseq), in place."""
    if spec.positions is None:
        # canonical specs keep padding_idx only when it falls among the rows' positions
        step = -1 if spec.position_step == -1 else 1
        table[(int(spec.padding_idx or 0) - int(spec.position_offset or 0)) * step] = 0.0
        return
    pos = _positions(spec, torch.float64, table.device)
    table.masked_fill_(pos.eq(int(spec.padding_idx or 0))[:, None], 0.0)


def _patchtst_standardized(table: torch.Tensor) -> torch.Tensor:
    """PatchTST `PatchTSTPositionalEncoding._init_pe` ('sincos'): `t = t - t.mean(); t = t /
    (t.std() * 10)` over the whole table (torch's unbiased std), on the CPU: the reductions'
    summation order is the CPU kernels' there, which the reference's table is built with."""
    cpu = table.cpu()
    centred = cpu - cpu.mean()
    return (centred / (centred.std() * 10)).to(table.device)


@register_family(
    "sinusoidal",
    SinusoidalSpec,
    "1-D sinusoidal tables: Vaswani, tensor2tensor, fairseq/M2M100, Whisper, Marian, diffusers",
)
def compute_sinusoidal(
    spec: SinusoidalSpec, device: torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """`embedding` (P, dim) for a canonical spec; facts: frequency count and denominator."""
    fast = fused_table(spec, device)
    table = arrange(spec, sinusoidal_angles(spec, device)) if fast is None else fast
    if spec.padding_idx is not None:
        _zero_padding_rows(spec, table)
    if spec.standardize == "patchtst":
        table = _patchtst_standardized(table)
    embedding = table.to(DTYPES[str(spec.dtype)])
    facts = {"num_frequencies": spec.num_frequencies(), "freq_denominator": spec.denominator()}
    return {"embedding": embedding}, facts
