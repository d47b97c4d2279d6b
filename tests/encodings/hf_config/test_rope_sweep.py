"""Every RoPE model type transformers knows: posenc's `/v1/resolve` is exact or rejects (issue 17).

One test per model type enumerated from the installed transformers, running each of its cases
(`rope_sweep.sweep_cases()`: config variants in the v5 and v4 config.json forms): the resolved
tables must equal the model's own rotation bit for bit (cos/sin per layer type) and in q.k after
the model's apply function, or the config must be rejected with an error naming the key posenc
cannot map. Accepted and different fails, listing every such case. A case transformers cannot
run as a whole tiny model is judged at its rotary module (`module_exact`). A model type posenc
answers must have a config verified exact (here or, for M-RoPE, by the M-RoPE sweep): none is
served unverified. Every layer the model rotates is judged, not one per layer type. A case whose
config.json the harness itself wrote wrong (`harness_failure`) fails. The ratchet: every case's
outcome must be the one committed in docs/models-outcomes.json (`make models-doc`), and a case
committed exact or module_exact that is anything else fails as lost coverage. A model type
transformers itself cannot build is skipped with its reason (the skip summary lists them);
every unbuildable case's reason is in docs/models.md. A few cases go end to end through the real
server (`POST /v1/resolve`, which must answer 200, then each table by its URL).
"""

from __future__ import annotations

import dataclasses
import io
import re
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from posenc.encodings import parse_spec
from tests.conftest import ServerHandle
from tests.encodings.hf_config import mrope_sweep
from tests.encodings.hf_config import rope_sweep as sweep
from tests.tolerances import served_as_reference

CASES = sweep.sweep_cases()
TYPES = sweep.rotary_model_types()

MROPE_TYPES = frozenset(mrope_sweep.mrope_model_types())

MODULE_ONLY = "Verified at the rotary module only"
"""The README paragraph listing the model types verified only as `module_exact`."""


def test_enumeration_comes_from_transformers() -> None:
    """The model types are read from the installed transformers, and every one gets cases."""
    types = sweep.rotary_model_types()
    assert len(types) > 100
    assert {"llama", "gemma3_text", "cohere", "deepseek_v3", "gpt_neox"} <= set(types)
    assert {case[0] for case in CASES} == set(types)
    assert all(mt in types for mt in sweep.CHECKPOINTS), "a checkpoint names an unknown type"
    # rotary classes of any name: CLVP's and the conformers' *RotaryPositionalEmbedding,
    # Sapiens2's *RopePositionEmbedding, V-JEPA 2's *RopeAttention
    assert {"clvp", "wav2vec2-conformer", "sapiens2", "vjepa2"} <= set(types)
    # and every type whose class-default config posenc answers with a rope table (LLaVA's
    # Llama text model, named by no rotary class of its own modeling module)
    served = set(sweep.served_model_types())
    assert {"llava", "llama"} <= served <= set(types)


def test_committed_outcomes_cover_the_sweep() -> None:
    """docs/models-outcomes.json (the ratchet) lists exactly the sweep's cases, for the locked
    transformers, and docs/models.md's counts are its counts (both come from one `make
    models-doc`)."""
    committed = sweep.committed_outcomes()
    assert committed["transformers"] == sweep.transformers_version()
    ids = {sweep.case_id(case) for case in CASES}
    missing = sorted(ids - set(committed["rope"]))
    extra = sorted(set(committed["rope"]) - ids)
    assert not missing, f"cases {missing[:20]} are not committed: make models-doc"
    assert not extra, f"committed cases {extra[:20]} are no longer swept: make models-doc"
    counts: dict[str, int] = {}
    for label in committed["rope"].values():
        outcome = label.split(",")[0]
        counts[outcome] = counts.get(outcome, 0) + 1
    line = f"Cases: {len(committed['rope'])}; " + ", ".join(
        f"{k} {counts[k]}" for k in sweep.OUTCOMES if k in counts
    )
    assert line + "." in sweep.DOCS.read_text(encoding="utf-8").splitlines(), line


def test_readme_lists_the_types_verified_at_the_rotary_module_only() -> None:
    """README's list of `module_exact`-only model types is the committed outcomes' list."""
    want = sweep.module_only_types(sweep.committed_outcomes()["rope"])
    readme = (sweep.REPO / "README.md").read_text(encoding="utf-8")
    start = readme.index(MODULE_ONLY)
    paragraph = readme[start : readme.index("\n\n", start)]
    assert f"({len(want)} model types)" in paragraph
    assert re.findall(r"`([^`]+)`", paragraph.split(":", 1)[1]) == want


@pytest.mark.parametrize("model_type", TYPES)
def test_resolve_is_exact_or_rejected(model_type: str) -> None:
    """Every case of one model type (one test per type: its cases share the memoised configs
    and models of one worker). A type none of whose cases transformers can build is skipped with
    the reason; the reason of each unbuildable case is in docs/models.md."""
    verdicts = {case: sweep.run_case(*case) for case in CASES if case[0] == model_type}
    wrong = [
        f"{'/'.join(case)}: {verdict.line()}"
        for case, verdict in verdicts.items()
        if verdict.outcome not in ("exact", "module_exact", "rejected", "unbuildable")
    ]
    assert not wrong, "accepted and different, or the harness's own failure:\n" + "\n".join(wrong)
    # the ratchet: a verified case stays verified, and every outcome is the committed one
    problems = sweep.ratchet("rope", verdicts)
    assert not problems, "against docs/models-outcomes.json:\n" + "\n".join(problems)
    # posenc answers a config the sweep cannot verify: some config of the type must be verified.
    # (a rope table served for a config.json transformers reads but cannot build a model of;
    # a config transformers cannot read at all, or an answer without a rope table, is no RoPE
    # claim: `rope_sweep._asked`)
    unproven = [
        case
        for case, v in verdicts.items()
        if v.facts.get("accepted") and v.facts.get("rope", True) and v.facts.get("loads", True)
    ]
    verified = any(v.outcome in ("exact", "module_exact") for v in verdicts.values())
    if unproven and not verified and model_type in MROPE_TYPES:
        # an M-RoPE type the M-RoPE sweep proves on (3, N) position ids (test_mrope_sweep.py)
        verified = any(
            mrope_sweep.run_case(*case).outcome == "exact"
            for case in mrope_sweep.cases()
            if case[0] == model_type
        )
    assert verified or not unproven, f"posenc serves {unproven}, none verified: verify or refuse"
    if all(v.outcome == "unbuildable" for v in verdicts.values()):
        reason = next(iter(verdicts.values())).line()
        pytest.skip(f"unbuildable in transformers {sweep.transformers_version()}: {reason}")


E2E = [
    ("llama", "llama3", "v4"),
    ("gemma3_text", "linear", "v4"),
    ("qwen2", "yarn", "v5"),
    ("gpt_neox", "rotary_pct", "v4"),
    ("cohere", "default", "v5"),
]


def _half(data: bytes, spec: Any, name: str) -> torch.Tensor:
    full = torch.from_numpy(np.load(io.BytesIO(data))[name].copy())
    if (
        spec.rope_scaling.rope_type != "proportional"
        and full.shape[-1] == spec.resolved_rotary_dim()
    ):
        half = spec.resolved_rotary_dim() // 2
        return full[..., 0::2] if spec.interleaved else full[..., :half]
    return full


@pytest.mark.parametrize(("model_type", "variant", "form"), E2E, ids=["/".join(c) for c in E2E])
def test_resolve_end_to_end(
    server: ServerHandle, client: httpx.Client, model_type: str, variant: str, form: str
) -> None:
    """The same verdict through the server: POST /v1/resolve, then GET every table's URL. A GPU
    server's tables are held within `tolerances.GPU_ULPS` of the CPU's, which are judged."""
    data = sweep.case_config(model_type, variant, form)
    ref = sweep.reference(data, sweep.SEQ)
    response = client.post("/v1/resolve", json={"hf_config": data, "max_positions": sweep.SEQ})
    assert response.status_code == 200, response.text
    tables = []
    for item in response.json()["specs"]:
        if item["kind"] != "rope":
            continue
        spec = parse_spec(item["spec"])
        got = client.get(item["url"], params={"format": "npz"})
        assert got.status_code == 200, got.text
        cos, sin = _half(got.content, spec, "cos"), _half(got.content, spec, "sin")
        tables.append(sweep._table(item["name"], item["notes"], spec, cos, sin))
    if server.device.type != "cpu":
        cpu = sweep.posenc_tables(data, sweep.SEQ)
        assert [t.name for t in cpu] == [t.name for t in tables]
        for served, computed in zip(tables, cpu, strict=True):
            assert served_as_reference(served.cos, computed.cos, server.device), served.name
            assert served_as_reference(served.sin, computed.sin, server.device), served.name
        tables = cpu
    verdict = sweep.judge(ref, tables)
    assert verdict.outcome == "exact", verdict.line()


def test_every_layer_is_judged() -> None:
    """Llama's reference with layer 2's recorded cos/sin halved (layers 0, 1 and 3 untouched) is
    judged wrong at layer 2: every rotating layer is compared, not one per layer type."""
    data = sweep.case_config("llama", "default", "v5")
    ref = sweep.reference(data, sweep.SEQ)
    tables = sweep.posenc_tables(data, sweep.SEQ)
    assert sweep.judge(ref, tables).outcome == "exact"
    assert sorted(ref.layers) == [0, 1, 2, 3]
    layer = ref.layers[2]
    assert layer.cos is not None
    assert layer.sin is not None
    halved = dataclasses.replace(layer, cos=layer.cos / 2, sin=layer.sin / 2)
    broken = dataclasses.replace(ref, layers={**ref.layers, 2: halved})
    verdict = sweep.judge(broken, tables)
    assert verdict.outcome == "wrong"
    assert verdict.reasons
    assert all(r.startswith("layer 2") for r in verdict.reasons), verdict


def test_rotary_module_verdict_can_fail() -> None:
    """The rotary-module path (`module_reference`, dbrx: no whole tiny model) judges posenc's
    tables exact, and the same tables under another pairing or direction wrong."""
    data = sweep.case_config("dbrx", "default", "v5")
    with pytest.raises(sweep.UnbuildableError):
        sweep.reference(data)
    ref = sweep.module_reference(data)
    assert ref.module_only
    tables = sweep.posenc_tables(data, sweep.SEQ)
    assert sweep.judge(ref, tables).outcome == "exact"
    for change in ({"pairing": "interleaved"}, {"sign": -1.0}):
        changed = [dataclasses.replace(t, **change) for t in tables]
        assert sweep.judge(ref, changed).outcome == "wrong", change


def test_reversed_notes_and_refusal_through_the_server(client: httpx.Client) -> None:
    """NanoChat's tables say it rotates the other way; PE's audio encoder (its own rotary module,
    issue 17) is served with interleaved pairs; Step3p5's 2-D axial vision rotary is a 422
    naming model_type."""
    data = sweep.case_config("nanochat", "default", "v5")
    response = client.post("/v1/resolve", json={"hf_config": data, "max_positions": 8})
    assert response.status_code == 200, response.text
    notes = [item["notes"] for item in response.json()["specs"] if item["kind"] == "rope"]
    assert notes
    assert all(n.get("rotation") == "reversed" for n in notes), notes
    data = sweep.case_config("pe_audio_encoder", "default", "v5")
    response = client.post("/v1/resolve", json={"hf_config": data, "max_positions": 8})
    assert response.status_code == 200, response.text
    specs = [parse_spec(item["spec"]) for item in response.json()["specs"]]
    assert specs
    assert all(spec.interleaved for spec in specs), specs
    data = sweep.case_config("step3p5_vision", "yarn", "v5")
    response = client.post("/v1/resolve", json={"hf_config": data, "max_positions": 8})
    assert response.status_code == 422, response.text
    body = response.json()
    assert [d["field"] for d in body["detail"]] == ["model_type"], body
    assert "Step3p7VisionRotaryEmbedding: axial RoPE" in response.text, body


def test_sapiens2_patch_rotary_is_refused(client: httpx.Client) -> None:
    """Sapiens2's 2-D patch rotary (Sapiens2RopePositionEmbedding, found by the widened class
    names) is a 422 naming model_type, with max_positions too, never a 1-D default table."""
    data = sweep.case_config("sapiens2", "default", "v5")
    response = client.post("/v1/resolve", json={"hf_config": data, "max_positions": 64})
    assert response.status_code == 422, response.text
    body = response.json()
    assert [d["field"] for d in body["detail"]] == ["model_type"], body
    assert "Sapiens2RopePositionEmbedding" in response.text, body
