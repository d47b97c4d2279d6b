"""The GPU-server comparison of tests/tolerances.py: exact on a CPU server, GPU_ULPS on a GPU's."""

import torch

from tests.tolerances import GPU_ULPS, served_as_reference


def test_cpu_server_tables_must_be_bit_equal_and_gpu_tables_within_the_ulp_bound() -> None:
    want = torch.linspace(-1, 1, 101)
    one_ulp = torch.nextafter(want, torch.full_like(want, 2.0))
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert served_as_reference(want.clone(), want, cpu)
    assert not served_as_reference(one_ulp, want, cpu)
    assert served_as_reference(one_ulp, want, cuda)
    far = want + (GPU_ULPS + 1) * torch.finfo(torch.float32).eps
    assert not served_as_reference(far, want, cuda)
    assert not served_as_reference(want.to(torch.float64), want, cuda)
    assert not served_as_reference(want[:-1], want, cuda)
