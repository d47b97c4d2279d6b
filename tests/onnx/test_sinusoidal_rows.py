"""The sinusoidal embedding graph with descending rows (`position_step` -1, the relative
distances of Parakeet / ESPnet / XLNet tables) and with PatchTST's standardisation: verified in
onnxruntime against the core, and the table-mode gather reading row position_offset - id."""

from __future__ import annotations

import pytest
import torch

from posenc.encodings import compute, parse_spec
from posenc.onnx import UnsupportedExportError, export, verify
from tests.onnx.cases import run


@pytest.mark.parametrize("mode", ["table", "compute"])
@pytest.mark.parametrize("convention", ["parakeet", "espnet", "transformer_xl"])
def test_descending_rows_export_and_verify(mode: str, convention: str) -> None:
    spec = parse_spec(
        {
            "kind": "sinusoidal",
            "dim": 32,
            "max_positions": 19,
            "position_offset": 9,
            "position_step": -1,
            "convention": convention,
        }
    )
    model = export(spec, "embedding", mode=mode)
    verify(model, spec)
    table = compute(spec).tensors["embedding"]
    distances = torch.tensor([[9, 0, -9, 3]])
    got = run(model, {"position_ids": distances})["embedding"]
    expected = table[9 - distances[0]][None]
    if mode == "table":
        assert torch.equal(got, expected)
    else:
        torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)


def test_standardized_tables_export_as_tables_only() -> None:
    fields = {"kind": "sinusoidal", "dim": 16, "max_positions": 12, "convention": "espnet"}
    spec = parse_spec({**fields, "standardize": "patchtst"})
    verify(export(spec, "embedding", mode="table"), spec)
    with pytest.raises(UnsupportedExportError) as err:
        export(spec, "embedding", mode="compute")
    assert [p.field for p in err.value.problems] == ["mode"]
    assert "standardize" in err.value.problems[0].message
