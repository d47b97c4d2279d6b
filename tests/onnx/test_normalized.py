"""normalized/embedding: every mode, with and without per-sample lengths, every dtype, equals the
core bit for bit, at the spec's lengths and at others given at run time."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from posenc.encodings import compute, parse_spec
from posenc.onnx import export, verify
from tests.onnx.cases import run

MODES: dict[str, dict[str, Any]] = {
    "raw": {"mode": "raw"},
    "by_last": {"mode": "by_last"},
    "by_length": {"mode": "by_length"},
    "by_max": {"mode": "by_max", "t_max": 7.3},
}


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_graph_equals_the_core_at_any_lengths(mode: str, dtype: str) -> None:
    fields = {"kind": "normalized", **MODES[mode], "dtype": dtype}
    masked = parse_spec({**fields, "lengths": [3, 1], "pad_value": -2.5})
    model = export(masked, "embedding", opset=23)
    verify(model, masked)
    for lengths in ([7, 1, 0, 13], [1], [2000, 3]):
        p = max(lengths) + 2
        core = compute(
            parse_spec({**fields, "lengths": lengths, "max_positions": p, "pad_value": -2.5})
        )
        feeds = {
            "position_ids": torch.arange(p).expand(len(lengths), p),
            "lengths": torch.tensor(lengths),
        }
        assert torch.equal(run(model, feeds)["embedding"], core.tensors["embedding"])
    plain = parse_spec({**fields, "max_positions": 11})
    out = run(export(plain, "embedding"), {"position_ids": torch.arange(11)[None]})
    assert torch.equal(out["embedding"], compute(plain).tensors["embedding"][None])


def test_positions_outside_the_length_are_padded() -> None:
    spec = parse_spec({"kind": "normalized", "mode": "by_last", "lengths": [4], "pad_value": 9.0})
    pos = torch.tensor([[-1, 0, 3, 4, 2]])
    out = run(export(spec, "embedding"), {"position_ids": pos, "lengths": torch.tensor([4])})
    assert torch.equal(out["embedding"], torch.tensor([[9.0, 0.0, 1.0, 9.0, 2 / 3]]))
    single = run(export(spec, "embedding"), {"position_ids": pos, "lengths": torch.tensor([1])})
    assert single["embedding"].tolist() == [[9.0, 0.0, 9.0, 9.0, 9.0]]  # T = 1: p / max(0, 1)
