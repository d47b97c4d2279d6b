"""Row selection helpers: gathers equal plain indexing; MRoPE pair axes equal transformers'
Qwen2-VL / Qwen3-VL recomposition."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from posenc.runtime.rows import (
    gather_block,
    gather_rows,
    gather_sections,
    lookup_bias,
    mrope_pair_axes,
    row_index,
    unique_rows,
)


def test_unique_rows_and_gather() -> None:
    pos = torch.tensor([[5, 1], [5, 9]])
    uniq, inverse = unique_rows(pos)
    assert uniq.tolist() == [1, 5, 9]
    assert torch.equal(uniq[inverse], pos)
    table = torch.randn(10, 3, 2)
    assert torch.equal(gather_rows(table, pos), table[pos])
    assert gather_rows(table, torch.zeros(0, 4, dtype=torch.int64)).shape == (0, 4, 3, 2)


def test_row_index() -> None:
    assert row_index(torch.tensor([2, 4]), 2, 3) is not None
    assert row_index(torch.tensor([2, 5]), 2, 3) is None
    assert row_index(torch.tensor([1]), 2, 3) is None
    got = row_index(torch.tensor([3.0, 2.0]), 2, 3)
    assert got is not None
    assert got.tolist() == [1, 0]
    assert row_index(torch.tensor([2.5]), 2, 3) is None


def test_gather_sections_and_block() -> None:
    table = torch.randn(20, 6)
    index = torch.randint(0, 20, (3, 2, 4))
    axes = torch.tensor([0, 1, 2, 2, 1, 0])
    got = gather_sections(table, index, axes)
    want = torch.stack([table[index[axes[c]], c] for c in range(6)], dim=-1)
    assert torch.equal(got, want)
    bias = torch.randn(4, 10, 12)
    rows, cols = torch.tensor([7, 5]), torch.tensor([0, 11, 3])
    assert torch.equal(gather_block(bias, rows, cols, 1, 5), bias[:, rows - 5][:, :, cols])


def _recompose(cls: type, section: list[int]) -> list[int]:
    """transformers' recomposition applied to a frequency tensor whose values are the axes."""
    half = sum(section)
    freq = torch.arange(3, dtype=torch.float32)[:, None, None, None].expand(3, 1, 1, half).clone()
    out = cls.recomposition_frequencies(SimpleNamespace(mrope_section=section), freq)
    return [int(v) for v in out[0, 0, :half]]


@pytest.mark.parametrize("section", [[16, 24, 24], [24, 20, 20], [2, 1, 1], [4, 0, 4]])
def test_mrope_axes_match_transformers(section: list[int]) -> None:
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    assert mrope_pair_axes(section, "chunked").tolist() == _recompose(
        Qwen2VLRotaryEmbedding, section
    )
    assert mrope_pair_axes(section, "interleaved").tolist() == _recompose(
        Qwen3VLTextRotaryEmbedding, section
    )


@pytest.mark.parametrize("section", [[22, 22, 20], [2, 2, 1], [8, 8, 16]])
def test_mrope_ernie_axes_match_transformers(section: list[int]) -> None:
    """ERNIE-4.5-VL: the recomposed (repeat_interleave'd) pairs of axis-valued frequencies taken
    through its inverse-frequency pre-permutation: pair i of the output holds inv_freq[i]."""
    from transformers.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe import (
        Ernie4_5_VLMoeTextRotaryEmbedding as Ernie,
    )

    half = sum(section)
    freq = torch.arange(3, dtype=torch.float32)[:, None, None, None].expand(3, 1, 1, half).clone()
    out = Ernie.recomposition_frequencies(SimpleNamespace(mrope_section=section), freq)[0, 0, 0::2]
    # the same recomposition of the pair indices shows which inv_freq pair each output holds
    hw = section[0] + section[1]
    index = torch.cat([torch.arange(hw)[0::2], torch.arange(hw)[1::2], torch.arange(hw, half)])
    order = Ernie.recomposition_frequencies(
        SimpleNamespace(mrope_section=section), index.float().expand(3, 1, 1, half).clone()
    )[0, 0, 0::2]
    assert order.tolist() == list(range(half))
    assert mrope_pair_axes(section, "ernie").tolist() == [int(v) for v in out]


def test_lookup_bias() -> None:
    weights = torch.randn(8, 3)
    buckets = torch.randint(0, 8, (4, 5))
    got = lookup_bias(weights, buckets, torch.bfloat16)
    assert torch.equal(got, weights.t()[:, buckets].to(torch.bfloat16))
