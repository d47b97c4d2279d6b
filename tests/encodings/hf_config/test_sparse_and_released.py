"""Every rotary model type of the installed transformers at its released shape and in its sparse
form, through the server (issue 30 items 1-2, issue 39 item 4; `released_sweep.py`).

Per model type (`rope_sweep.rotary_model_types()`), the config class's default config.json
(unshrunk: head_dim, heads, kv_channels, partial factors as the class defines them) and its
sparse form (every key transformers fills in the same way dropped) are POSTed to /v1/resolve,
each rope table fetched by its URL and compared with the model's own rotary module built from the
default config (cos/sin bit-equal, q.k after the model's apply function): exact, or refused
naming a config key. The sparse form must get the full form's answer (the same tables, bit for
bit, or a refusal too): transformers reads both files as one config. A type whose default config
or rotary module transformers cannot build is judged by that equality alone; one whose default
config transformers cannot build is skipped with the reason (the skip summary lists them).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import torch

from posenc.encodings.hf_config.models import ROTARY_PARTS
from tests.conftest import ServerHandle
from tests.encodings.hf_config import released_sweep as released
from tests.encodings.hf_config import rope_sweep as sweep

TYPES = sweep.rotary_model_types()


def _line(verdict: sweep.Verdict | list[sweep.Table]) -> str:
    if isinstance(verdict, sweep.Verdict):
        return verdict.line()
    return f"served {[t.name for t in verdict]}"


@pytest.mark.parametrize("model_type", TYPES)
def test_released_and_sparse_configs_are_exact_or_refused(
    server: ServerHandle, client: httpx.Client, model_type: str
) -> None:
    try:
        full = released.default_config(model_type)
    except sweep.UnbuildableError as err:
        pytest.skip(f"transformers {sweep.transformers_version()} cannot build it: {err}")
    try:
        ref: sweep.Reference | None = released.reference(model_type)
    except sweep.UnbuildableError:
        ref = None  # judged by the sparse == full equality below (and by the tiny sweep)
    answers = {"full": released.served(client, full, full, server.device)}
    sparse, dropped = released.sparse_config(model_type)
    answers["sparse"] = released.served(client, sparse, full, server.device)
    for form, answer in answers.items():
        if isinstance(answer, sweep.Verdict):
            assert answer.outcome == "rejected", f"{form}: {answer.line()}"
        elif model_type in ROTARY_PARTS:
            verdict = _judge_parts(model_type, full, answer)
            assert verdict.outcome == "exact", f"{form} (dropped {dropped}): {verdict.line()}"
        elif ref is not None:
            verdict = sweep.judge(ref, answer)
            assert verdict.outcome == "exact", f"{form} (dropped {dropped}): {verdict.line()}"
    full_answer, sparse_answer = answers["full"], answers["sparse"]
    if isinstance(full_answer, list) and isinstance(sparse_answer, list):
        assert released.same_tables(full_answer, sparse_answer), f"dropped {dropped}"
    else:
        why = f"full {_line(full_answer)}; sparse (dropped {dropped}) {_line(sparse_answer)}"
        assert isinstance(full_answer, sweep.Verdict), why
        assert isinstance(sparse_answer, sweep.Verdict), why


SPARSE_EXAMPLES = [
    # (model_type, the class's head_dim, rotary width)
    ("gemma", 256, 256),
    ("vaultgemma", 256, 256),
    ("qwen3_next", 256, 64),
    ("ernie4_5", 128, 128),
    ("minimax_m2", 128, 128),
    ("jetmoe", 128, 128),
    ("zamba2", 160, 160),
]


@pytest.mark.parametrize(("model_type", "head_dim", "width"), SPARSE_EXAMPLES)
def test_sparse_config_takes_the_class_defaults(
    server: ServerHandle, client: httpx.Client, model_type: str, head_dim: int, width: int
) -> None:
    """The issues' examples: without `head_dim` (or JetMoE's kv_channels; Zamba2 derives its
    attention_head_dim as 2 * hidden_size / heads), or the rope parameters holding a partial
    factor, the class's values apply, not hidden_size / heads; the tables are the model's rotary
    module's, and `notes.defaults_applied` lists what posenc filled in."""
    sparse, _ = released.sparse_config(model_type)
    # Zamba2's __post_init__ derives these when the file omits them: to_dict() writes them all
    derived = {"attention_head_dim", "kv_channels", "attention_hidden_size"}
    if model_type == "zamba2":
        sparse = {k: v for k, v in sparse.items() if k not in derived}
        assert released.read_alike(model_type, sparse)
    assert {"head_dim", *derived}.isdisjoint(sparse), sparse
    response = client.post("/v1/resolve", json={"hf_config": sparse, "max_positions": sweep.SEQ})
    assert response.status_code == 200, response.text
    (item,) = [s for s in response.json()["specs"] if s["kind"] == "rope"]
    assert item["spec"]["head_dim"] == head_dim
    assert item["spec"].get("rotary_dim", head_dim) == width
    applied = item["notes"]["defaults_applied"]
    assert set(applied) & {"head_dim", "kv_channels", "num_attention_heads"}, applied
    tables = released.served(client, sparse, sparse, server.device)
    assert isinstance(tables, list), tables
    verdict = sweep.judge(released.reference(model_type), tables)
    assert verdict.outcome == "exact", verdict.line()


def _part(model_type: str, full: dict[str, Any], key: str) -> dict[str, Any]:
    """Part `key` of a composite's config.json as its own config (its sub-config's model_type)."""
    return {"model_type": ROTARY_PARTS[model_type][key], **full[key]}


def _judge_parts(model_type: str, full: dict[str, Any], tables: list[sweep.Table]) -> sweep.Verdict:
    """A composite's served tables, part by part, against each part's own rotary module (built
    from that sub-config as transformers loads it) and its apply function."""
    reasons: list[str] = []
    for key in ROTARY_PARTS[model_type]:
        ref = sweep.module_reference(_part(model_type, full, key))
        verdict = sweep.judge(ref, sweep.part_tables(tables, key))
        reasons += [f"{key}: {r}" for r in verdict.reasons]
    return sweep.Verdict("wrong" if reasons else "exact", reasons)


@pytest.mark.parametrize("model_type", sorted(ROTARY_PARTS))
def test_composites_of_rotary_stacks_serve_each_part(
    server: ServerHandle, client: httpx.Client, model_type: str
) -> None:
    """Issue 30 item 4: a composite whose rotary stacks are sub-configs (Dia, T5Gemma (2), BLT,
    LASR-CTC, Nemotron-3 diarization) is served one table per part (and per layer type inside a
    part), named by the part's config key; every table belongs to a part, each part's tables
    are those of the part posted on its own, and equal the part's own rotary module bit for bit
    (q.k too, after its apply function)."""
    full = released.default_config(model_type)
    tables = released.served(client, full, full, server.device)
    assert isinstance(tables, list), tables
    keys = list(ROTARY_PARTS[model_type])
    for table in tables:
        roles = table.layer_types or []
        assert roles, table.name
        assert all(r.split(".")[0] in keys for r in roles), (table.name, roles)
    verdict = _judge_parts(model_type, full, tables)
    assert verdict.outcome == "exact", verdict.line()
    for key in keys:
        part = _part(model_type, full, key)
        alone = released.served(client, part, part, server.device)
        assert isinstance(alone, list), f"{key}: {alone}"
        mine = sweep.part_tables(tables, key)
        assert [t.cos.shape for t in mine] == [t.cos.shape for t in alone], key
        for a, b in zip(mine, alone, strict=True):
            assert torch.equal(a.cos, b.cos), key
            assert torch.equal(a.sin, b.sin), key
            assert (a.rotary_dim, a.pairing, a.sign) == (b.rotary_dim, b.pairing, b.sign), key


def test_composite_part_errors_name_the_key_inside_the_part(client: httpx.Client) -> None:
    """A part's config that cannot be mapped is a 422 naming the key inside the part: Dia's
    decoder with a llama3 dict without its band factors (transformers raises KeyError)."""
    full = released.default_config("dia")
    full["decoder_config"]["rope_parameters"] = {"rope_type": "llama3", "factor": 8.0}
    response = client.post("/v1/resolve", json={"hf_config": full, "max_positions": sweep.SEQ})
    assert response.status_code == 422, response.text
    fields = {p["field"] for p in response.json()["detail"]}
    assert {
        "decoder_config.rope_parameters.low_freq_factor",
        "decoder_config.rope_parameters.high_freq_factor",
    } <= fields, fields
