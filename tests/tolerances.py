"""One tolerance table for comparing posenc tables with other consumers (field guide section 0).

Bit-exact comparisons (the reference precision against transformers on CPU) use `torch.equal`;
these tolerances are for comparisons against implementations with another op order or libm.
"""

import torch

# absolute tolerance for O(1) values, per dtype: about 2 ulp at 1.0
ATOL = {
    "float64": 1e-12,
    "float32": 2.4e-7,
    "float16": 2e-3,
    "bfloat16": 1.6e-2,
}

# A table served by a GPU server against the reference computed on the CPU: CUDA's cos/sin/exp
# may differ from the CPU's libm by an ulp (docs/service.md), and tests/runtime/test_gpu_drift.py
# holds GPU tables within this many float32 ulps of the CPU's at every position.
GPU_ULPS = 2


def served_as_reference(got: torch.Tensor, want: torch.Tensor, device: torch.device) -> bool:
    """Whether a table served by a server on `device` is the CPU reference `want`: bit-equal
    (`torch.equal`) from a CPU server, the claim the README makes; from a GPU server the same
    dtype and shape and within `GPU_ULPS` ulps of max(1, |want|) elementwise."""
    if device.type == "cpu":
        return torch.equal(got, want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    eps = torch.finfo(want.dtype).eps
    bound = GPU_ULPS * eps * want.double().abs().clamp_min(1.0)
    return bool(((got.double() - want.double()).abs() <= bound).all())
