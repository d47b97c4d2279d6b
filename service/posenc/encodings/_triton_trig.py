"""The one Triton kernel of the fused CUDA path (`posenc.encodings.fused`): angles to cos/sin
tables in one pass. The only module importing triton (untyped: mypy ignores its imports).

For row r (position `pos_start + r * pos_step`, int64 converted to the compute dtype with one
rounding, as `positions.to(inv.dtype)`) and frequency f < n_freq (`inv[f]`, computed on the CPU;
its dtype, float32 or float64, is the compute dtype): `ang = pos * inv[f]`, times `angle_scale`
when `has_angle_scale`; `cos = libdevice.cos(ang)` and `sin = libdevice.sin(ang)` (CUDA's
accurate `cosf`/`sinf`, or `cos`/`sin` in float64, what torch's CUDA `cos`/`sin` call;
`tl.cos`/`tl.sin` are approximations), times `out_scale` when `has_out_scale`; then cast to the
output dtype with round-to-nearest-even (torch's `.to`). The two scales arrive as float64 and are
rounded to the compute dtype once (as torch rounds a Python float multiplying a float32 tensor).
Each step is one operation with no additions, so no multiply-add can be contracted: the bits of
torch's ops on the same operands.

From float64 to bfloat16 or float16 the cast is `rounding.cast`'s: rounded to odd into
float32 first, then to nearest even, so the result is float64 rounded once.

cos of frequency f goes to column `f * cos_mul + cos_add` of the row (row `r * row_stride` of
`cos_ptr`), and again `cos_dup` further when `has_dup`; sin likewise into `sin_ptr`. cos is
stored for f < n_cos only (a sinusoidal table's extra sin frequency has no cos).
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

MAX_BLOCK_F = 256
"""Frequencies per program at most (a power of two)."""

NOT_SPECIALIZED = ["n_rows", "n_freq", "n_cos", "pos_start", "pos_step"]
"""Arguments Triton compiles no variant for (it specialises integers on divisibility by 16):
the table's length and frequency count vary per spec, and each variant is a compile (about a
second) on a server's first request for it. The row stride and column maps stay specialised:
they decide whether stores vectorise.
"""

ELEMENTS_PER_PROGRAM = 512
"""Angles per program (2 per thread at 8 warps), each stored as cos and sin, twice at full width.
Chosen by `bench.fused_tune` on an H200 (docs/gpu.md, fifth run): 512 x 8 wrote a 16 MiB RoPE
table at 96% of the copy bandwidth (device time per call), where the first shape, 2048 x 4,
wrote it at 50%; for the other RoPE tables swept (4-64 MiB, fp32 and bf16, full and half width)
it was the best shape or within 6 points of it. Whisper's 16 MiB sinusoids measured 33-52% at
every shape, varying between runs more than between shapes. Every shape's tables were bit for bit
the first shape's. Read at each launch, as `NUM_WARPS` is, so the bench can sweep both."""

NUM_WARPS = 8
"""Warps per program."""


@triton.jit  # type: ignore[untyped-decorator, unused-ignore]
def _to_out(x, out_ty: tl.constexpr):  # type: ignore[no-untyped-def, unused-ignore]
    """`x` cast to `out_ty` with one rounding: float64 to a 16-bit float goes through float32
    rounded to odd (Boldo & Melquiond 2008; `rounding.round_to_odd_fp32`, bit for bit):
    round to nearest, step back towards zero where that overshot, set the last bit if inexact."""
    if x.dtype == tl.float64 and out_ty != tl.float32 and out_ty != tl.float64:
        f = x.to(tl.float32)
        bits = f.to(tl.int32, bitcast=True)
        too_far = tl.abs(f.to(tl.float64)) > tl.abs(x)
        bits = tl.where(too_far, bits - 1, bits)  # sign and magnitude: one step towards zero
        inexact = bits.to(tl.float32, bitcast=True).to(tl.float64) != x
        x = (bits | inexact.to(tl.int32)).to(tl.float32, bitcast=True)
    return x.to(out_ty)


@triton.jit(do_not_specialize=NOT_SPECIALIZED)  # type: ignore[untyped-decorator, unused-ignore]
def _trig_kernel(  # type: ignore[no-untyped-def, unused-ignore]
    inv_ptr,
    cos_ptr,
    sin_ptr,
    n_rows,
    n_freq,
    n_cos,
    pos_start,
    pos_step,
    row_stride,
    cos_mul,
    cos_add,
    cos_dup,
    sin_mul,
    sin_add,
    sin_dup,
    angle_scale: tl.float64,
    out_scale: tl.float64,
    has_angle_scale: tl.constexpr,
    has_out_scale: tl.constexpr,
    has_dup: tl.constexpr,
    block_p: tl.constexpr,
    block_f: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * block_p + tl.arange(0, block_p).to(tl.int64)
    f = tl.program_id(1) * block_f + tl.arange(0, block_f)
    row_ok = rows < n_rows
    sin_ok = f < n_freq
    cos_ok = f < n_cos
    inv = tl.load(inv_ptr + f, mask=sin_ok, other=0.0)
    pos = (pos_start + rows * pos_step).to(inv_ptr.dtype.element_ty)
    ang = pos[:, None] * inv[None, :]
    if has_angle_scale:
        ang = ang * tl.cast(angle_scale, inv_ptr.dtype.element_ty)
    c = libdevice.cos(ang)
    s = libdevice.sin(ang)
    if has_out_scale:
        c = c * tl.cast(out_scale, inv_ptr.dtype.element_ty)
        s = s * tl.cast(out_scale, inv_ptr.dtype.element_ty)
    c = _to_out(c, cos_ptr.dtype.element_ty)
    s = _to_out(s, sin_ptr.dtype.element_ty)
    base = rows[:, None] * row_stride
    cos_at = base + (f * cos_mul + cos_add)[None, :]
    sin_at = base + (f * sin_mul + sin_add)[None, :]
    cos_mask = row_ok[:, None] & cos_ok[None, :]
    sin_mask = row_ok[:, None] & sin_ok[None, :]
    tl.store(cos_ptr + cos_at, c, mask=cos_mask)
    tl.store(sin_ptr + sin_at, s, mask=sin_mask)
    if has_dup:
        tl.store(cos_ptr + cos_at + cos_dup, c, mask=cos_mask)
        tl.store(sin_ptr + sin_at + sin_dup, s, mask=sin_mask)


def launch(
    inv: torch.Tensor,
    cos_out: torch.Tensor,
    sin_out: torch.Tensor,
    *,
    n_rows: int,
    n_cos: int,
    pos_start: int,
    pos_step: int,
    row_stride: int,
    cos_map: tuple[int, int, int],
    sin_map: tuple[int, int, int],
    angle_scale: float,
    out_scale: float,
) -> None:
    """Fill `cos_out`/`sin_out` (contiguous, on `inv`'s CUDA device; the same tensor when one
    table holds both) from `inv` (n_freq,), float32 or float64 (the compute dtype), on the current
    stream of that device. The maps are (mul, add, dup) column rules in elements; dup 0 means no
    duplicate."""
    n_freq = inv.numel()
    block_f = min(triton.next_power_of_2(n_freq), MAX_BLOCK_F)
    block_p = max(1, ELEMENTS_PER_PROGRAM // block_f)
    grid = (triton.cdiv(n_rows, block_p), triton.cdiv(n_freq, block_f))
    with torch.cuda.device(inv.device):
        _trig_kernel[grid](
            inv,
            cos_out,
            sin_out,
            n_rows,
            n_freq,
            n_cos,
            pos_start,
            pos_step,
            row_stride,
            cos_map[0],
            cos_map[1],
            cos_map[2],
            sin_map[0],
            sin_map[1],
            sin_map[2],
            angle_scale,
            out_scale,
            has_angle_scale=angle_scale != 1.0,
            has_out_scale=out_scale != 1.0,
            has_dup=cos_map[2] != 0 or sin_map[2] != 0,
            block_p=block_p,
            block_f=block_f,
            num_warps=NUM_WARPS,
        )
