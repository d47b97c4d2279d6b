"""Every RoPE model type transformers knows: posenc's `/v1/resolve` is exact or rejects (issue 17).

One test per model type enumerated from the installed transformers, running each of its cases
(`rope_sweep.sweep_cases()`: config variants in the v5 and v4 config.json forms): the resolved
tables must equal the model's own rotation bit for bit (cos/sin per layer type) and in q.k after
the model's apply function, or the config must be rejected with an error naming the key posenc
cannot map. Accepted and different fails, listing every such case. A case transformers cannot
run as a whole tiny model is judged at its rotary module (`module_exact`). A model type posenc
answers must have a config verified exact (here or, for M-RoPE, by the M-RoPE sweep): none is
served unverified. A model type transformers itself cannot build is skipped with its
reason (the skip summary lists them); every unbuildable case's reason is in docs/models.md. A
few cases go end to end through the real server (`POST /v1/resolve`, then each table by its
URL).
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from posenc.encodings import parse_spec
from tests.encodings.hf_config import mrope_sweep
from tests.encodings.hf_config import rope_sweep as sweep

CASES = sweep.sweep_cases()
TYPES = sweep.rotary_model_types()

MROPE_TYPES = frozenset(mrope_sweep.mrope_model_types())


def test_enumeration_comes_from_transformers() -> None:
    """The model types are read from the installed transformers, and every one gets cases."""
    types = sweep.rotary_model_types()
    assert len(types) > 100
    assert {"llama", "gemma3_text", "cohere", "deepseek_v3", "gpt_neox"} <= set(types)
    assert {case[0] for case in CASES} == set(types)
    assert all(mt in types for mt in sweep.CHECKPOINTS), "a checkpoint names an unknown type"


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
    assert not wrong, "accepted and different:\n" + "\n".join(wrong)
    # posenc answers a config the sweep cannot verify: some config of the type must be verified.
    unproven = [case for case, v in verdicts.items() if v.facts.get("accepted")]
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
def test_resolve_end_to_end(client: httpx.Client, model_type: str, variant: str, form: str) -> None:
    """The same verdict through the server: POST /v1/resolve, then GET every table's URL."""
    data = sweep.case_config(model_type, variant, form)
    ref = sweep.reference(data, sweep.SEQ)
    response = client.post("/v1/resolve", json={"hf_config": data, "max_positions": sweep.SEQ})
    if response.status_code != 200:
        assert 400 <= response.status_code < 500, response.text
        body = response.json()
        fields = [d["field"] for d in body.get("detail") or []]
        keys = sweep._config_keys(data)
        assert any(f.split(".")[0] in keys or f in keys for f in fields), body
        return
    tables = []
    for item in response.json()["specs"]:
        if item["kind"] != "rope":
            continue
        spec = parse_spec(item["spec"])
        got = client.get(item["url"], params={"format": "npz"})
        assert got.status_code == 200, got.text
        cos, sin = _half(got.content, spec, "cos"), _half(got.content, spec, "sin")
        tables.append(sweep._table(item["name"], item["notes"], spec, cos, sin))
    verdict = sweep.judge(ref, tables)
    assert verdict.outcome == "exact", verdict.line()


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
