"""`trig: "polar"`: cos/sin as transformers' complex freqs_cis builds them (DeepSeek-V2, Llama 4).

`torch.polar(1, angle)` differs from `torch.cos`/`torch.sin` of the same fp32 angles by up to
2 ulp in many entries, so those models are bit-exact only through this path. The models
themselves are compared in tests/encodings/hf_config/test_rope_sweep.py (bit-equal cos/sin and
q.k after their own rotation) and in tests/encodings/hf_config/test_rope.py (DeepSeek-V2's
freqs_cis, `torch.equal`); here, as self-consistency (the angles come from posenc's own
`inv_freq`, not from a model): the table is exactly torch.polar's parts in every layout,
the spec refuses `exact` precision with it, its content key differs only when it is set, and
the ONNX exporters embed it as a table only.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from posenc.encodings import SpecError, compute, content_key, parse_spec
from posenc.onnx import UnsupportedExportError, export

BASE: dict[str, Any] = {
    "kind": "rope",
    "head_dim": 64,
    "rope_theta": 10000.0,
    "max_positions": 4096,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
    },
}


def _polar_half(spec_data: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Self-consistency, not a reference: transformers' DeepseekV2RotaryEmbedding.forward
    (polar(1, freqs) * attention_scaling) transcribed, fed posenc's own `inv_freq` and
    `attention_scaling`."""
    table = compute(parse_spec({**spec_data, "width": "half"}))
    angles = torch.arange(spec_data["max_positions"]).float()[:, None] * table.tensors["inv_freq"]
    freqs_cis = torch.polar(torch.ones_like(angles), angles) * table.meta["attention_scaling"]
    return freqs_cis.real, freqs_cis.imag


@pytest.mark.parametrize(
    "layout",
    [
        {"width": "half"},
        {"width": "full"},
        {"width": "full", "interleaved": True},
        {"packing": "cos_sin"},
        {"packing": "pairs"},
        {"width": "half", "dtype": "bfloat16"},
    ],
)
def test_polar_tables_are_torch_polar_parts(layout: dict[str, Any]) -> None:
    data = {**BASE, "trig": "polar", **layout}
    cos, sin = _polar_half(data)
    tensors = compute(parse_spec(data)).tensors
    dtype = getattr(torch, layout.get("dtype", "float32"))
    half = cos.shape[-1]
    if "cos_sin" in tensors:
        got_cos, got_sin = tensors["cos_sin"][:, :half], tensors["cos_sin"][:, half:]
    elif "pairs" in tensors:
        got_cos, got_sin = tensors["pairs"][..., 0], tensors["pairs"][..., 1]
    elif layout.get("interleaved"):
        got_cos, got_sin = tensors["cos"][:, 0::2], tensors["sin"][:, 0::2]
    else:
        got_cos, got_sin = tensors["cos"][:, :half], tensors["sin"][:, :half]
    assert torch.equal(got_cos, cos.to(dtype))
    assert torch.equal(got_sin, sin.to(dtype))


def test_polar_differs_from_cos_sin_and_from_the_plain_key() -> None:
    plain = compute(parse_spec({**BASE, "width": "half"})).tensors
    polar = compute(parse_spec({**BASE, "width": "half", "trig": "polar"})).tensors
    assert not torch.equal(plain["cos"], polar["cos"])
    assert torch.equal(plain["inv_freq"], polar["inv_freq"])
    assert content_key(parse_spec(BASE)) != content_key(parse_spec({**BASE, "trig": "polar"}))
    assert "trig" not in parse_spec(BASE).canonical().model_dump(exclude_none=True)


def test_polar_needs_reference_precision() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({**BASE, "trig": "polar", "precision": "exact"})
    assert [p.field for p in info.value.problems] == ["trig"]


def test_polar_exports_as_a_table_only() -> None:
    spec = parse_spec({**BASE, "max_positions": 64, "trig": "polar"})
    export(spec, "cos_sin", mode="table")
    with pytest.raises(UnsupportedExportError) as info:
        export(spec, "cos_sin", mode="compute")
    assert [p.field for p in info.value.problems] == ["mode"]
