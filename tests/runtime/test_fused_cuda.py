"""The fused CUDA path gives the torch CUDA path's tables bit for bit (issue 36; needs CUDA and
triton, skipped without either, like tests/runtime/test_gpu_drift.py).

For every case of tests/runtime/fused_cases.py (real configs' RoPE tables in every layout and
dtype, at reference and at exact precision (float64 compute; `fused.FLOAT64`, on by default), the
configs' sinusoidal tables and every convention): `compute(spec, "cuda")` with the fused kernel
equals `compute` with it turned off (`fused.ENABLED`), tensor by tensor, dtype and shape, and
stays within test_gpu_drift.py's bound of the CPU table (2 float32 ulp at 1.0 times the table's
scale; for bf16/fp16 one rounding of the output dtype more). The configs' tables are also compared
at their own length (up to 262144 positions), where angles are largest.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from posenc.encodings import compute, fused, parse_spec
from posenc.encodings.rope import RopeSpec, rope_inv_freq, tables
from posenc.encodings.rope.compute import fused_tables
from posenc.encodings.sinusoidal import SinusoidalSpec, fused_table
from tests.runtime.fused_cases import config_specs, rope_cases, sinusoidal_cases

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        not torch.cuda.is_available() or fused.kernels() is None, reason="needs triton"
    ),
]

CUDA = torch.device("cuda")
ULP_AT_ONE = 2.0**-23
"""As test_gpu_drift.py: float32's spacing just below 1.0 is 2**-24, its bound 2 of them."""

HERE = torch.cuda.is_available()
"""The cases are built only where they run (tests/encodings/test_fused_plan.py checks the same
lists on every machine)."""
ROPE = rope_cases(max_positions=2048) if HERE else []
EXACT = rope_cases(max_positions=2048, precision="exact") if HERE else []
"""Exact precision (float64 compute): fused while `fused.FLOAT64` is on (its default; these tests
turn it on for themselves, so they check the kernel whatever the default)."""
SINUSOIDAL = sinusoidal_cases(max_positions=2048) if HERE else []


@pytest.fixture
def fused_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused, "ENABLED", True)


def both_paths(spec: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, torch.Tensor], ...]:
    """(fused, torch) tables of `spec` on the GPU."""
    monkeypatch.setattr(fused, "ENABLED", True)
    fast = compute(spec, CUDA).tensors
    monkeypatch.setattr(fused, "ENABLED", False)
    slow = compute(spec, CUDA).tensors
    monkeypatch.setattr(fused, "ENABLED", True)
    return fast, slow


def assert_same_bits(fast: dict[str, torch.Tensor], slow: dict[str, torch.Tensor]) -> None:
    assert list(fast) == list(slow)
    for name, table in slow.items():
        assert fast[name].dtype == table.dtype, name
        assert fast[name].shape == table.shape, name
        assert fast[name].is_contiguous(), name
        assert torch.equal(fast[name], table), f"{name}: {int((fast[name] != table).sum())} differ"


def assert_near_cpu(gpu: dict[str, torch.Tensor], spec: Any) -> None:
    cpu = compute(spec, "cpu").tensors
    assert set(cpu) == set(gpu)
    for name, table in cpu.items():
        if not table.is_floating_point():
            assert torch.equal(table, gpu[name].cpu())
            continue
        scale = max(1.0, float(table.abs().max()))
        bound = 2 * ULP_AT_ONE * scale
        if table.dtype in (torch.bfloat16, torch.float16):
            bound += torch.finfo(table.dtype).eps * scale
        worst = float((table.to(CUDA).double() - gpu[name].double()).abs().max())
        assert worst <= bound, f"{name}: {worst:.3g} > {bound:.3g}"


@pytest.mark.parametrize("case", [c[1] for c in ROPE + EXACT], ids=[c[0] for c in ROPE + EXACT])
def test_rope_fused_is_the_torch_cuda_path_bit_for_bit(
    case: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = parse_spec(case)
    canon = spec.canonical()
    assert isinstance(canon, RopeSpec)
    inv, scaling, _ = rope_inv_freq(canon, CUDA)
    monkeypatch.setattr(fused, "ENABLED", True)
    monkeypatch.setattr(fused, "FLOAT64", True)
    direct = fused_tables(canon, inv, scaling)
    assert direct is not None, f"every layout is fused; {fused.FAILED}"
    assert_same_bits(
        direct, tables(canon, inv, scaling, torch.arange(canon.max_positions, device=CUDA))
    )
    fast, slow = both_paths(spec, monkeypatch)
    assert_same_bits(fast, slow)
    assert_near_cpu(fast, spec)


@pytest.mark.parametrize("case", [c[1] for c in SINUSOIDAL], ids=[c[0] for c in SINUSOIDAL])
def test_sinusoidal_fused_is_the_torch_cuda_path_bit_for_bit(
    case: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = parse_spec(case)
    canon = spec.canonical()
    assert isinstance(canon, SinusoidalSpec)
    monkeypatch.setattr(fused, "ENABLED", True)
    maps = canon.compute_dtype == "float32" and not (
        canon.layout == "interleaved" and canon.num_frequencies() > canon.dim // 2
    )
    assert (fused_table(canon, CUDA) is not None) == maps
    fast, slow = both_paths(spec, monkeypatch)
    assert_same_bits(fast, slow)
    assert_near_cpu(fast, spec)


LONG = (
    [
        *config_specs("rope"),
        *[(f"{name}-exact", {**case, "precision": "exact"}) for name, case in config_specs("rope")],
        *config_specs("sinusoidal"),
    ]
    if HERE
    else []
)


@pytest.mark.parametrize("case", [c[1] for c in LONG], ids=[c[0] for c in LONG])
def test_config_tables_at_their_own_length(
    case: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The configs' own lengths (131072 positions for Llama 3.1, 262144 for Hunyuan), float32
    and, for RoPE, exact precision (float64 compute, `fused.FLOAT64` on)."""
    spec = parse_spec(case)
    monkeypatch.setattr(fused, "FLOAT64", True)
    fast, slow = both_paths(spec, monkeypatch)
    assert_same_bits(fast, slow)
    assert_near_cpu(fast, spec)


def _kernels_run(spec: Any) -> set[str]:
    compute(spec, CUDA)  # compiled and warm
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        compute(spec, CUDA)
        torch.cuda.synchronize()
    return {e.name for e in prof.events()}


def test_the_flag_switches_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = parse_spec({"kind": "rope", "head_dim": 128, "max_positions": 4096})
    monkeypatch.setattr(fused, "ENABLED", True)
    assert any("_trig_kernel" in name for name in _kernels_run(spec))
    monkeypatch.setattr(fused, "ENABLED", False)
    assert not any("_trig_kernel" in name for name in _kernels_run(spec))


def test_polar_and_exact_with_the_flag_off_stay_on_torch(
    fused_on: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Polar trig always; exact precision when `fused.FLOAT64` is turned off."""
    for extra, float64 in (({"precision": "exact"}, False), ({"trig": "polar"}, True)):
        monkeypatch.setattr(fused, "FLOAT64", float64)
        spec = parse_spec({"kind": "rope", "head_dim": 64, "max_positions": 64, **extra})
        canon = spec.canonical()
        assert isinstance(canon, RopeSpec)
        inv, scaling, _ = rope_inv_freq(canon, CUDA)
        assert fused_tables(canon, inv, scaling) is None


def test_exact_precision_takes_the_kernel_by_default(fused_on: None) -> None:
    spec = parse_spec(
        {"kind": "rope", "head_dim": 128, "max_positions": 4096, "precision": "exact"}
    )
    assert fused.FLOAT64
    assert any("_trig_kernel" in name for name in _kernels_run(spec))


def test_frequency_vectors_stay_resident_per_content(monkeypatch: pytest.MonkeyPatch) -> None:
    """`fused.resident`: one device copy per vector's bits, reused by later calls, a new one for
    other bits, the least recently used dropped past `RESIDENT_ENTRIES`, larger vectors copied
    each time; and Whisper tables at lengths sharing one resident vector are the torch path's,
    bit for bit."""
    base = torch.arange(512, dtype=torch.float32) * 0.5
    first = fused.resident(base, CUDA)
    assert fused.resident(base.clone(), CUDA).data_ptr() == first.data_ptr()
    here = torch.device("cuda", torch.cuda.current_device())  # "cuda" is the current device
    assert fused.resident(base, here).data_ptr() == first.data_ptr()
    other = fused.resident(base + 1.0, CUDA)
    assert other.data_ptr() != first.data_ptr()
    assert torch.equal(first.cpu(), base)
    assert torch.equal(other.cpu(), base + 1.0)
    for k in range(fused.RESIDENT_ENTRIES):
        fused.resident(torch.full((4,), float(k)), CUDA)
    assert len(fused._RESIDENT) == fused.RESIDENT_ENTRIES
    again = fused.resident(base, CUDA)  # dropped: copied anew (`first` still holds the old one)
    assert again.data_ptr() != first.data_ptr()
    assert torch.equal(again.cpu(), base)
    big = torch.zeros(fused.RESIDENT_MAX_BYTES // 4 + 1)
    big_once, big_twice = fused.resident(big, CUDA), fused.resident(big, CUDA)
    assert big_once.data_ptr() != big_twice.data_ptr()
    for rows in (448, 1500, 1500):
        spec = parse_spec(
            {"kind": "sinusoidal", "dim": 1024, "convention": "whisper", "max_positions": rows}
        )
        fast, slow = both_paths(spec, monkeypatch)
        assert_same_bits(fast, slow)


def test_a_kernel_writing_other_bits_is_caught_by_its_first_launch_probe(
    fused_on: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fused.run` probes each kernel variant against torch's ops on its first launch: a kernel
    that writes one bit otherwise turns the fused path off, and the table comes from torch."""
    module = fused.kernels()
    assert module is not None
    real = module.launch

    def off_by_one_bit(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        args[1].view(torch.int32).view(-1)[-1] ^= 1  # the last cos element

    spec = parse_spec({"kind": "rope", "head_dim": 128, "max_positions": 4096})
    monkeypatch.setattr(fused, "ENABLED", False)
    want = compute(spec, CUDA).tensors
    monkeypatch.setattr(fused, "ENABLED", True)
    monkeypatch.setattr(fused, "FAILED", [])
    monkeypatch.setattr(fused, "_VERDICTS", set())
    monkeypatch.setattr(module, "launch", off_by_one_bit)
    got = compute(spec, CUDA).tensors
    assert fused.FAILED, "the probe did not catch the changed bit"
    assert "cos 1 of" in fused.FAILED[0]
    assert not fused.usable(CUDA)
    assert_same_bits(got, want)


def test_frequency_copies_queued_behind_work_arrive_intact(fused_on: None) -> None:
    """The non-blocking copies from pinned memory: specs computed back to back while the stream
    is busy (their pinned blocks freed at once on the host) each get their own frequencies."""
    busy = torch.randn(4096, 4096, device=CUDA)
    specs = [
        parse_spec(
            {"kind": "rope", "head_dim": 128, "rope_theta": 10000.0 + 997 * i, "max_positions": 256}
        )
        for i in range(48)
    ]
    outs = []
    for spec in specs:
        busy = busy @ busy / 4096.0  # keeps the stream ahead of the host
        outs.append(compute(spec, CUDA).tensors)
    torch.cuda.synchronize()
    for spec, out in zip(specs, outs, strict=True):
        cpu = compute(spec, "cpu").tensors
        assert torch.equal(out["inv_freq"].cpu(), cpu["inv_freq"])
        assert_near_cpu(out, spec)
