"""CoPE reference against the two published codes, transcribed below as golden functions:
facebookresearch/RAM `projects/cope/src/cope/context_position.py` (`ContextPosSelfAttn.forward`
with the default flags and with `--cope-nodiv`) and the paper's listing (`CoPE`, `SelfAttn`),
bit for bit; plus the properties of positions and interpolation. The RAM code is no package (nothing
to install or vendor from PyPI): `ram_forward` was compared line by line with that file at commit
5420e201 (the `key_cope` of its forward is `key` with `cope_sep_key` off)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.encodings.cope import (
    VARIANTS,
    cope_attention,
    cope_logits,
    cope_positions,
    interpolated_position_logits,
)

# --- RAM context_position.py, ContextPosSelfAttn.forward (golden, transcribed) -------------------


def ram_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    val: torch.Tensor,
    pos_emb: torch.Tensor,
    npos: int,
    attn_mask: torch.Tensor | None,
    nodiv: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention logits, output); cope_sep_key / cope_val_gates off, pos_emb (1, d, npos)."""
    head_dim = query.shape[-1]
    gate_logits = torch.bmm(query, key.transpose(-1, -2))
    gates = torch.sigmoid(gate_logits / math.sqrt(head_dim))
    if attn_mask is not None:
        gates = gates * attn_mask
    positions = gates.flip(-1).cumsum(dim=-1).flip(-1)
    positions = positions.clamp(max=npos - 1)
    pos_logits_fixed = torch.matmul(query, pos_emb)
    positions_ceil = positions.ceil().long()
    positions_floor = positions.floor().long()
    pos_logits_ceil = pos_logits_fixed.gather(-1, positions_ceil)
    pos_logits_floor = pos_logits_fixed.gather(-1, positions_floor)
    pos_ceil_weight = positions - positions_floor
    pos_logits = pos_logits_ceil * pos_ceil_weight + pos_logits_floor * (1 - pos_ceil_weight)
    attn_logits = gate_logits
    if nodiv:
        attn_logits /= math.sqrt(head_dim)
        attn_logits += pos_logits
    else:
        attn_logits += pos_logits
        attn_logits /= math.sqrt(head_dim)
    if attn_mask is not None:
        attn_logits += attn_mask.log()
    attn = torch.softmax(attn_logits, dim=-1)
    return attn_logits, torch.bmm(attn, val)


# --- the paper's listing (golden, transcribed) --------------------------------------------------


def paper_cope(
    query: torch.Tensor, attn_logits: torch.Tensor, pos_emb: torch.Tensor, npos_max: int
) -> torch.Tensor:
    gates = torch.sigmoid(attn_logits)
    pos = gates.flip(-1).cumsum(dim=-1).flip(-1)
    pos = pos.clamp(max=npos_max - 1)
    pos_ceil = pos.ceil().long()
    pos_floor = pos.floor().long()
    logits_int = torch.matmul(query, pos_emb)
    logits_ceil = logits_int.gather(-1, pos_ceil)
    logits_floor = logits_int.gather(-1, pos_floor)
    w = pos - pos_floor
    return logits_ceil * w + logits_floor * (1 - w)


def paper_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    val: torch.Tensor,
    pos_emb: torch.Tensor,
    npos_max: int,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    head_dim = query.shape[-1]
    attn_logits = torch.bmm(query, key.transpose(-1, -2))
    attn_logits = attn_logits / math.sqrt(head_dim)
    attn_logits += mask.log()
    attn_logits += paper_cope(query, attn_logits, pos_emb, npos_max)
    attn = torch.softmax(attn_logits, dim=-1)
    return attn_logits, torch.bmm(attn, val)


# --- tests --------------------------------------------------------------------------------------


def inputs(
    b: int, length: int, d: int, npos: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, length, d, generator=gen) for _ in range(3))
    pos_emb = torch.randn(1, d, npos, generator=gen)
    return q, k, v, pos_emb


def causal(length: int) -> torch.Tensor:
    return torch.ones(length, length).tril()[None]


@pytest.mark.parametrize(("length", "d", "npos"), [(8, 16, 9), (17, 8, 5), (1, 4, 2), (32, 64, 33)])
@pytest.mark.parametrize("masked", [True, False])
def test_repo_variant_is_bit_exact(length: int, d: int, npos: int, masked: bool) -> None:
    q, k, v, pos_emb = inputs(3, length, d, npos, seed=length)
    mask = causal(length).expand(3, -1, -1) if masked else None
    ref_logits, ref_out = ram_forward(q, k, v, pos_emb, npos, mask)
    ours = cope_logits(q, k, pos_emb, npos, "repo", mask)
    assert torch.equal(ours, ref_logits)
    assert torch.equal(cope_attention(q, k, v, pos_emb, npos, "repo", mask), ref_out)


@pytest.mark.parametrize(("length", "d", "npos"), [(8, 16, 9), (17, 8, 5), (32, 64, 33)])
def test_paper_variant_is_bit_exact_and_equals_repo_nodiv(length: int, d: int, npos: int) -> None:
    q, k, v, pos_emb = inputs(2, length, d, npos, seed=d)
    mask = causal(length).expand(2, -1, -1)
    ref_logits, ref_out = paper_forward(q, k, v, pos_emb, npos, mask)
    ours = cope_logits(q, k, pos_emb, npos, "paper", mask)
    assert torch.equal(ours, ref_logits)
    assert torch.equal(cope_attention(q, k, v, pos_emb, npos, "paper", mask), ref_out)
    nodiv_logits, _ = ram_forward(q, k, v, pos_emb, npos, mask, nodiv=True)
    assert torch.equal(ours, nodiv_logits)


def test_the_variants_differ_by_the_scale_of_the_position_term() -> None:
    q, k, _, pos_emb = inputs(1, 12, 16, 13, seed=5)
    mask = causal(12)
    plain = torch.matmul(q, k.transpose(-1, -2)) / 4.0 + mask.log()
    e_repo = (cope_logits(q, k, pos_emb, 13, "repo", mask) - plain)[mask.bool()]
    e_paper = (cope_logits(q, k, pos_emb, 13, "paper", mask) - plain)[mask.bool()]
    assert torch.allclose(e_paper, 4.0 * e_repo, atol=1e-4)


def test_zero_embedding_is_plain_attention_and_bool_masks_work() -> None:
    q, k, _, _ = inputs(2, 6, 8, 7, seed=1)
    zero = torch.zeros(8, 7)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    plain = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(8)
    for variant in VARIANTS:
        out = cope_logits(q, k, zero, 7, variant, mask)
        assert torch.allclose(out[:, mask], plain[:, mask], atol=1e-6)
        assert torch.all(out[:, ~mask] == float("-inf"))


def test_saturated_gates_count_tokens() -> None:
    """Gates of 1 make positions the plain relative distance i - j + 1 (clamped): e is then the
    integer-position logit itself."""
    gates = torch.ones(1, 5, 5).tril()
    pos = cope_positions(gates, npos_max=4)
    want = (torch.arange(5)[:, None] - torch.arange(5)[None, :] + 1).clamp(0, 3).float()
    assert torch.equal(pos[0], want * torch.ones(5, 5).tril())
    q = torch.randn(1, 5, 3)
    pos_emb = torch.randn(3, 4)
    e = interpolated_position_logits(q, pos_emb, pos)
    z = q @ pos_emb
    assert torch.equal(e, z.gather(-1, pos.long()))


def test_bad_arguments() -> None:
    q, k, _, pos_emb = inputs(1, 4, 8, 5, seed=0)
    with pytest.raises(ValueError, match="npos_max"):
        cope_logits(q, k, pos_emb, 6)
    with pytest.raises(ValueError, match="variant"):
        cope_logits(q, k, pos_emb, 5, "both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="share d"):
        cope_logits(q, k[..., :4], pos_emb, 5)
    with pytest.raises(ValueError, match="pos_emb"):
        cope_logits(q, k, pos_emb[:, :4], 5)


@settings(max_examples=50, deadline=None)
@given(
    length=st.integers(1, 24),
    npos=st.integers(1, 30),
    seed=st.integers(0, 2**16),
    variant=st.sampled_from(VARIANTS),
)
def test_positions_bounded_monotone_and_interpolation_between_neighbours(
    length: int, npos: int, seed: int, variant: str
) -> None:
    q, k, _, pos_emb = inputs(2, length, 8, npos, seed)
    gates = torch.sigmoid(q @ k.transpose(-1, -2) / math.sqrt(8)) * causal(length)
    pos = cope_positions(gates, npos)
    assert torch.all(pos >= 0)
    assert torch.all(pos <= npos - 1)
    assert torch.all(pos[..., :-1] >= pos[..., 1:])  # counting back from the query
    e = interpolated_position_logits(q, pos_emb, pos)
    z = q @ pos_emb
    lo = torch.minimum(z.gather(-1, pos.floor().long()), z.gather(-1, pos.ceil().long()))
    hi = torch.maximum(z.gather(-1, pos.floor().long()), z.gather(-1, pos.ceil().long()))
    assert torch.all(e >= lo - 1e-5)
    assert torch.all(e <= hi + 1e-5)
    out = cope_logits(q, k, pos_emb, npos, variant, causal(length))  # type: ignore[arg-type]
    assert torch.all(torch.isfinite(out[:, causal(length)[0].bool()]))
