"""Every M-RoPE model type transformers knows: posenc's `/v1/resolve` is exact on (3, N) position
ids or rejects (issue 18).

One test per model type enumerated from the installed transformers (`mrope_sweep`): the resolved
table, gathered per `notes["mrope"]["pair_axes"]` and widened per `pairing`, must equal the
model's own rotary module's cos/sin bit for bit, its `apply_rotary_pos_emb` must give equal q and
k, and posenc's declared pairing must reproduce the model's q.k; or the config must be rejected
naming a key. A type transformers cannot build is skipped with the reason.
"""

from __future__ import annotations

import pytest

from posenc.encodings.hf_config.mrope import MROPE_MODELS
from tests.encodings.hf_config import mrope_sweep
from tests.encodings.hf_config import rope_sweep as sweep

CASES = mrope_sweep.cases()
TYPES = mrope_sweep.mrope_model_types()


def test_enumeration_comes_from_transformers() -> None:
    """The M-RoPE types are read from the installed transformers; the mapped ones are among them
    and every released checkpoint is a known type."""
    assert {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "ernie4_5_vl_moe"} <= set(TYPES)
    assert set(MROPE_MODELS) - {"qwen2_5_omni_thinker", "qwen3_omni_moe_thinker"} <= set(TYPES)
    assert {case[0] for case in CASES} == set(TYPES)
    assert not [t for t in TYPES if "vision" in t or "audio" in t], "a sub-config is enumerated"
    ids = {sweep.case_id(case) for case in CASES}
    assert set(sweep.committed_outcomes()["mrope"]) == ids, "make models-doc"


@pytest.mark.parametrize("model_type", TYPES)
def test_mrope_resolve_is_exact_or_rejected(model_type: str) -> None:
    verdicts = {case: mrope_sweep.run_case(*case) for case in CASES if case[0] == model_type}
    wrong = [
        f"{'/'.join(case)}: {verdict.line()}"
        for case, verdict in verdicts.items()
        if verdict.outcome not in ("exact", "rejected", "unbuildable")
    ]
    assert not wrong, "accepted and different:\n" + "\n".join(wrong)
    # the ratchet: a verified case stays verified, and every outcome is the committed one
    problems = sweep.ratchet("mrope", verdicts)
    assert not problems, "against docs/models-outcomes.json:\n" + "\n".join(problems)
    if all(v.outcome == "unbuildable" for v in verdicts.values()):
        reason = next(iter(verdicts.values())).line()
        pytest.skip(f"unbuildable in transformers {sweep.transformers_version()}: {reason}")


@pytest.mark.parametrize("name", sorted(mrope_sweep.RELEASED))
def test_released_checkpoints_are_exact(name: str) -> None:
    """Released config.json files of Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4.1V, ERNIE-4.5-VL and
    Qwen2.5-Omni resolve with their M-RoPE notes, exact against the model."""
    verdict = mrope_sweep.judge(mrope_sweep.RELEASED[name])
    assert verdict.outcome == "exact", verdict.line()


@pytest.mark.parametrize(
    "section", [[16, 24, 24], [24, 20, 20], [8, 12, 12], [11, 11, 10], [22, 22, 20]]
)
def test_pair_axes_match_the_v2_gather(section: list[int]) -> None:
    """notes.mrope.pair_axes is the axis map the /v2 rope model gathers with
    (`runtime.rows.mrope_pair_axes`), for every layout."""
    from posenc.encodings.hf_config.mrope import pair_axes
    from posenc.runtime.rows import mrope_pair_axes

    layouts = ["chunked", "interleaved"] + (["ernie"] if section[0] == section[1] else [])
    for layout in layouts:
        want = mrope_pair_axes(section, layout).tolist()
        assert pair_axes(layout, section, sum(section)) == want


@pytest.mark.parametrize("pairs", [4, 16, 32])
def test_row_column_pair_axes_match_the_v2_gather(pairs: int) -> None:
    """NeoMME's row_column layout: notes.mrope.pair_axes (even pairs row, odd pairs column) is
    the /v2 gather's axis map for its two-axis section [pairs/2, pairs/2]."""
    from posenc.encodings.hf_config.mrope import pair_axes, row_column_section
    from posenc.runtime.rows import mrope_pair_axes

    section = row_column_section("rope_parameters.full_attention", pairs)
    assert section == [pairs // 2, pairs // 2]
    want = mrope_pair_axes(section, "row_column").tolist()
    assert pair_axes("row_column", section, pairs) == want == [0, 1] * (pairs // 2)


def test_dynamic_ntk_takes_the_largest_position_id() -> None:
    """notes.mrope.seq_len: a dynamic NTK M-RoPE table built for seq_len = max(position_ids) + 1
    is the model's (its dynamic_rope_update reads the (3, N) ids), bit for bit."""
    import copy

    import torch

    from posenc.api.specs import resolve_config
    from posenc.encodings import compute

    data = {
        "model_type": "qwen2_vl",
        "hidden_size": 256,
        "num_attention_heads": 2,
        "max_position_embeddings": 32,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "dynamic", "factor": 2.0, "mrope_section": [16, 24, 24]},
    }
    ids = mrope_sweep.positions()
    longest = int(ids.max()) + 1
    assert longest > ids.shape[1] > 32  # past the original length, unlike the token count
    ref = mrope_sweep.reference(data, ids)
    body = {"hf_config": copy.deepcopy(data), "max_positions": 128, "seq_len": longest}
    (entry,) = resolve_config(body)
    assert "max(position_ids) + 1" in entry.notes["mrope"]["seq_len"]
    half = entry.spec.canonical().model_copy(
        update={"width": "half", "packing": "separate", "dtype": "float32"}
    )
    table = compute(half, device="cpu").tensors
    axes = entry.notes["mrope"]["pair_axes"]
    cos = mrope_sweep.widen(mrope_sweep.gather(table["cos"], ids, axes), "half_split")
    sin = mrope_sweep.widen(mrope_sweep.gather(table["sin"], ids, axes), "half_split")
    assert torch.equal(cos, ref["cos"])
    assert torch.equal(sin, ref["sin"])


@pytest.mark.parametrize("section", [[16, 16, 16, 16], [16, 24, 24], [3, 0, 5], [8]])
def test_channel_axes_match_the_v2_gather(section: list[int]) -> None:
    """HunYuan-VL: notes.mrope.channel_axes is the per-channel map the /v2 rope model gathers
    with (`runtime.rows.mrope_channel_axes`), and both are HunYuanVLRotaryEmbedding's own
    recomposition of a tensor whose every channel holds its axis number."""
    import torch
    from transformers.models.hunyuan_vl.modeling_hunyuan_vl import HunYuanVLRotaryEmbedding

    from posenc.encodings.hf_config.mrope import channel_axes
    from posenc.runtime.rows import mrope_channel_axes

    axes = len(section)
    freq = torch.arange(axes, dtype=torch.float32)[:, None].expand(axes, sum(section))
    module = HunYuanVLRotaryEmbedding.__new__(HunYuanVLRotaryEmbedding)
    module.mrope_section = section
    want = module.recomposition_frequencies(freq).to(torch.int64).tolist()
    assert channel_axes(section) == mrope_channel_axes(section).tolist() == want
