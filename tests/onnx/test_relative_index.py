"""relative_index/bias: the embedded Swin/BEiT/Shaw/SpeechT5 index and the bias gathered from the
learned table (in the spec or as an input) equal the core bit for bit; Shaw/SpeechT5 in mode
compute at lengths other than the spec's (query/key positions or KV-cache lengths); a table named
by key exports once bound from the table store."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from posenc.encodings import SpecError, compute, parse_spec
from posenc.encodings.weights import TableStore, resolve_tables
from posenc.onnx import export, verify
from tests.onnx.cases import run

WINDOWS: dict[str, dict[str, Any]] = {
    "swin 2x3": {"scheme": "swin", "window_size": [2, 3]},
    "swin 7": {"scheme": "swin", "window_size": 7},
    "beit 3x2": {"scheme": "beit", "window_size": [3, 2]},
    "shaw": {"scheme": "shaw", "max_relative_position": 3, "query_length": 4, "key_length": 9},
    "speecht5": {"scheme": "speecht5", "max_relative_position": 2, "key_length": 6},
}


def _table(fields: dict[str, Any], heads: int) -> torch.Tensor:
    rows = parse_spec({"kind": "relative_index", **fields}).num_relative_distance()
    return torch.randn(rows, heads, generator=torch.Generator().manual_seed(rows))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", sorted(WINDOWS))
def test_table_mode_equals_the_core(case: str, dtype: str) -> None:
    fields = WINDOWS[case]
    weights = _table(fields, heads=3)
    spec = parse_spec(
        {
            "kind": "relative_index",
            **fields,
            "relative_position_bias_table": weights.tolist(),
            "dtype": dtype,
        }
    )
    model = export(spec, "bias")
    assert [i.name for i in model.graph.input] == []  # the window is fixed, the table embedded
    core = compute(spec).tensors
    out = run(model, {})
    assert torch.equal(out["index"], core["index"])
    assert torch.equal(out["bias"], core["bias"][None])
    if dtype == "float32":
        # the table as an input (the consumer model's parameter): timm's gather
        as_input = parse_spec({"kind": "relative_index", **fields})
        fed = run(export(as_input, "bias"), {"relative_position_bias_table": weights})
        index = core["index"]
        timm = weights[index.view(-1)].view(*index.shape, -1).permute(2, 0, 1).contiguous()
        assert torch.equal(fed["bias"], timm.unsqueeze(0))


@pytest.mark.parametrize("scheme", ["shaw", "speecht5"])
def test_compute_mode_serves_any_length(scheme: str) -> None:
    spec = parse_spec(
        {"kind": "relative_index", "scheme": scheme, "max_relative_position": 4, "key_length": 5}
    )
    weights = _table({"scheme": scheme, "max_relative_position": 4, "key_length": 5}, heads=2)
    by_positions = export(spec, "bias", mode="compute")
    by_lengths = export(spec, "bias", mode="compute", inputs="lengths", opset=23)
    verify(by_positions, spec)
    for q, k in [(1, 1), (3, 40), (40, 40), (1, 300)]:
        offset = k - q  # queries are the last keys (tensor2tensor's alignment)
        case = parse_spec(
            {
                "kind": "relative_index",
                "scheme": scheme,
                "max_relative_position": 4,
                "query_length": q,
                "key_length": k,
                "query_offset": offset,
                "relative_position_bias_table": weights.tolist(),
            }
        )
        core = compute(case).tensors
        feeds = {
            "query_positions": torch.arange(offset, k),
            "key_positions": torch.arange(k),
            "relative_position_bias_table": weights,
        }
        out = run(by_positions, feeds)
        assert torch.equal(out["index"], core["index"])
        assert torch.equal(out["bias"], core["bias"][None])
        cached = run(
            by_lengths,
            {
                "past_length": torch.tensor(offset),
                "query_length": torch.tensor(q),
                "relative_position_bias_table": weights,
            },
        )
        assert torch.equal(cached["bias"], core["bias"][None])


@pytest.mark.parametrize("case", ["beit 3x2", "shaw"])
def test_a_table_by_key_is_embedded_once_bound(case: str) -> None:
    """A key-only spec bound from the table store exports the same graph as its inline twin; one
    never bound is refused with unknown_table naming the key field."""
    fields = WINDOWS[case]
    weights = _table(fields, heads=2)
    store = TableStore()
    key = store.put(weights)
    named = parse_spec(
        {
            "kind": "relative_index",
            **fields,
            "relative_position_bias_table_key": key,
            "relative_position_bias_table_shape": list(weights.shape),
        }
    )
    with pytest.raises(SpecError) as info:
        export(named, "bias")
    assert info.value.error_type == "unknown_table"
    assert info.value.problems[0].field == "relative_position_bias_table_key"
    bound = resolve_tables(named, store)
    model = export(bound, "bias")
    verify(model, bound)
    assert [i.name for i in model.graph.input] == []
    inline = parse_spec(
        {"kind": "relative_index", **fields, "relative_position_bias_table": weights.tolist()}
    )
    assert model.SerializeToString() == export(inline, "bias").SerializeToString()
    core = compute(inline).tensors
    out = run(model, {})
    assert torch.equal(out["index"], core["index"])
    assert torch.equal(out["bias"], core["bias"][None])
    if fields["scheme"] == "shaw":
        by_positions = export(bound, "bias", mode="compute")
        verify(by_positions, bound)
        feeds = {"query_positions": torch.arange(4), "key_positions": torch.arange(9)}
        assert torch.equal(run(by_positions, feeds)["bias"], core["bias"][None])
