"""learned/embedding: rows of the resampled table for every method, bit-identical to the core;
positions outside the table fail; a spec whose table is not bound is refused."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from posenc.encodings import SpecError, compute, parse_spec
from posenc.encodings.weights import table_key
from posenc.onnx import export, verify
from tests.onnx.cases import run

TABLE = torch.randn(1 + 16, 8, generator=torch.Generator().manual_seed(0))
METHODS: dict[str, dict[str, Any]] = {
    "timm": {"method": "timm", "new_grid": [3, 6]},
    "timm bilinear": {"method": "timm", "new_grid": [6, 6], "interpolation": "bilinear"},
    "hf_vit": {"method": "hf_vit", "new_grid": [5, 5]},
    "dinov2_legacy": {"method": "dinov2_legacy", "new_grid": [6, 2]},
    "linear_1d": {"method": "linear_1d", "new_length": 40, "num_prefix_tokens": 2},
}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_rows_equal_the_resampled_table(method: str, dtype: str) -> None:
    spec = parse_spec(
        {"kind": "learned", "table": TABLE.tolist(), **METHODS[method], "dtype": dtype}
    )
    model = export(spec, "embedding", opset=23)
    verify(model, spec)
    table = compute(spec).tensors["embedding"]
    rows = torch.arange(table.shape[0])
    out = run(model, {"position_ids": torch.stack((rows, rows.flip(0)))})["embedding"]
    assert torch.equal(out, torch.stack((table, table.flip(0))))


def test_rows_outside_the_table_fail() -> None:
    spec = parse_spec({"kind": "learned", "table": TABLE.tolist(), **METHODS["hf_vit"]})
    model = export(spec, "embedding")
    with pytest.raises(Exception, match=r"position_ids must lie in \[0, 26\)"):
        run(model, {"position_ids": torch.tensor([[0, 26]])})


def test_an_unbound_table_key_is_refused() -> None:
    spec = parse_spec(
        {
            "kind": "learned",
            "table_key": table_key(TABLE),
            "table_shape": [17, 8],
            **METHODS["timm"],
        }
    )
    with pytest.raises(SpecError) as info:
        export(spec, "embedding")
    assert info.value.error_type == "unknown_table"
