"""One tolerance table for comparing posenc tables with other consumers (field guide section 0).

Bit-exact comparisons (the reference precision against transformers on CPU) use `torch.equal`;
these tolerances are for comparisons against implementations with another op order or libm.
"""

# absolute tolerance for O(1) values, per dtype: about 2 ulp at 1.0
ATOL = {
    "float64": 1e-12,
    "float32": 2.4e-7,
    "float16": 2e-3,
    "bfloat16": 1.6e-2,
}
