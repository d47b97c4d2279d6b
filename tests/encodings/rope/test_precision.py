"""`precision: exact` (float64, rounded once) against `precision: reference` (transformers' fp32
op order), both measured against extended-precision truth (tests/encodings/rope/numerics.py).

Numbers behind docs/numerics.md: fp32 angles lose absolute accuracy as positions grow (an fp32
angle near 1e6 rad has an ulp of 0.0625), so the reference table is off by up to 6e-2 there;
the exact table stays within half an fp32 ulp (2^-25 for values in [0.5, 1)).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc.encodings import parse_spec
from tests.encodings.rope.hf_models import LLAMA31_ROPE, rows
from tests.encodings.rope.numerics import MODELS, measure, window
from tests.tolerances import ATOL

HALF_ULP_AT_1 = 2.0**-25  # half an fp32 ulp of values in [0.5, 1)
LLAMA2, LLAMA31 = MODELS

pytestmark = pytest.mark.skipif(
    np.finfo(np.longdouble).nmant < 63, reason="truth needs x87 extended precision"
)


@pytest.mark.parametrize("last", [131071, 1_000_000])
def test_exact_is_measurably_closer_to_truth_than_reference(last: int) -> None:
    reference = measure(LLAMA2, last, "reference")
    exact = measure(LLAMA2, last, "exact")
    # float64 noise (p * 2^-52 rad) on top of the half-ulp rounding
    assert exact["max_abs"] <= HALF_ULP_AT_1 + last * 2.0**-50
    assert reference["max_abs"] > 5e-3
    assert reference["max_abs"] > 1e5 * exact["max_abs"]
    assert exact["rounded"] > 0.999
    assert reference["rounded"] < 0.05


def test_exact_fp32_is_truth_rounded_once() -> None:
    """Every entry within half an ulp of the truth, up to float64's own error in the angle."""
    last = 1_000_000
    positions = window(last)
    table = rows(LLAMA31.spec("exact"), torch.from_numpy(positions))
    got = torch.cat([table["cos"], table["sin"]]).numpy()
    truth = LLAMA31.truth(positions)
    half_ulp = np.spacing(np.abs(truth).astype(np.float32)).astype(np.longdouble) / 2
    excess = np.abs(got.astype(np.longdouble) - truth) - half_ulp
    assert float(excess.max()) <= last * 2.0**-50


def test_reference_error_grows_with_position() -> None:
    errors = [measure(LLAMA31, last, "reference")["max_abs"] for last in (2047, 131071, 1_000_000)]
    assert errors == sorted(errors)
    assert errors[0] < 2e-4 < 5e-3 < errors[1] < 2e-2 < errors[2]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_exact_low_precision_rounds_once(dtype: str) -> None:
    """float64 -> bf16/fp16 in one rounding: each value is the nearest representable one. torch's
    own float64 -> bf16/fp16 cast goes through fp32 (two roundings) and misses some."""
    spec = parse_spec(
        {
            "kind": "rope",
            "head_dim": 128,
            "rope_theta": 500000.0,
            "max_positions": 1,
            "precision": "exact",
            "dtype": dtype,
            "rope_scaling": LLAMA31_ROPE,
        }
    )
    positions = torch.arange(0, 8192 * 997, 997)  # 8192 rows spread up to ~8e6
    table = rows(spec, positions)
    wide = rows(spec, positions, cast=False)  # float64, half width, A applied
    target = getattr(torch, dtype)
    for name in ("cos", "sin"):
        x = torch.cat((wide[name], wide[name]), dim=-1)  # the hf layout, full width
        y = table[name]
        assert y.dtype == target
        bits = y.view(torch.int16).to(torch.int32)
        err = (y.double() - x).abs()
        for step in (-1, 1):  # both neighbours in magnitude (the sign bit is separate)
            neighbour = (bits + step).to(torch.int16).view(target).double()
            other = (neighbour - x).abs().nan_to_num(float("inf"))
            assert bool((err <= other).all()), (name, step)
        naive = x.to(target)
        assert not torch.equal(naive, y), "no double-rounding case in the sample: widen it"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_cos_sin_bounded_and_pythagorean_at_large_positions(dtype: str) -> None:
    """cos^2 + sin^2 = A^2 and |cos|, |sin| <= A at positions up to ~1e6, both precisions."""
    yarn = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096}
    positions = torch.arange(1_000_000 - 2048, 1_000_000)
    for precision in ("reference", "exact"):
        spec = parse_spec(
            {
                "kind": "rope",
                "head_dim": 64,
                "max_positions": 1,
                "precision": precision,
                "dtype": dtype,
                "rope_scaling": yarn,
            }
        )
        table = rows(spec, positions)
        a = float(torch.tensor(0.1 * np.log(40.0) + 1.0, dtype=torch.float32))
        if precision == "exact":
            a = 0.1 * float(np.log(40.0)) + 1.0
        bound = torch.tensor(a, dtype=torch.float64).to(getattr(torch, dtype)).double()
        c, s = table["cos"].double(), table["sin"].double()
        assert bool((c.abs() <= bound).all())
        assert bool((s.abs() <= bound).all())
        assert float((c * c + s * s - a * a).abs().max()) <= ATOL[dtype] * a * a
