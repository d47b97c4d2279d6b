"""The error contract: every bad input is a 4xx `{"error", "error_type", "detail"}`, never a 500."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.xdist_group("errors")

ROPE = {"kind": "rope", "head_dim": 64, "max_positions": 16}
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0] * 32,
    "long_factor": [2.0] * 32,
    "original_max_position_embeddings": 8,
    "factor": 4.0,
}


def rope(**changes: Any) -> dict[str, Any]:
    return {**ROPE, **changes}


RAW_BODIES: dict[str, tuple[bytes, str]] = {
    "malformed": (b'{"kind": "rope", ', "invalid_json"),
    "not_json": (b"head_dim=64", "invalid_json"),
    "empty": (b"", "invalid_json"),
    "array": (b"[1, 2]", "invalid_json"),
    "null": (b"null", "invalid_json"),
    "string": (b'"rope"', "invalid_json"),
    "nan_literal": (
        b'{"kind":"rope","head_dim":64,"max_positions":16,"rope_theta":NaN}',
        "invalid_json",
    ),
    "infinity_literal": (
        b'{"kind":"rope","head_dim":64,"max_positions":16,"rope_theta":Infinity}',
        "invalid_json",
    ),
    "minus_infinity": (
        b'{"kind":"rope","head_dim":64,"max_positions":16,"rope_theta":-Infinity}',
        "invalid_json",
    ),
    "overflowing_float": (
        b'{"kind":"rope","head_dim":64,"max_positions":16,"rope_theta":1e999}',
        "",
    ),
    "huge_integer": (
        b'{"kind":"rope","head_dim":64,"max_positions":100000000000000000000000000000}',
        "",
    ),
    "deep_nesting": (b"[" * 5000 + b"]" * 5000, "invalid_json"),
    "not_utf8": (b'{"kind": "\xff\xfe"}', "invalid_json"),
    "duplicate_braces": (b"{}}", "invalid_json"),
}


@pytest.mark.parametrize("case", sorted(RAW_BODIES))
def test_malformed_bodies(client: httpx.Client, case: str) -> None:
    body, error_type = RAW_BODIES[case]
    r = client.post("/v1/tables", content=body, headers={"Content-Type": "application/json"})
    check_contract(r)
    if error_type:
        assert r.json()["error_type"] == error_type


BAD_SPECS: dict[str, tuple[dict[str, Any], str, str]] = {
    # wrong types
    "head_dim_string": (rope(head_dim="abc"), "invalid_spec", "head_dim"),
    "head_dim_float": (rope(head_dim=64.5), "invalid_spec", "head_dim"),
    "max_positions_list": (rope(max_positions=[16]), "invalid_spec", "max_positions"),
    "theta_string": (rope(rope_theta="fast"), "invalid_spec", "rope_theta"),
    "scaling_string": (rope(rope_scaling="linear"), "invalid_spec", "rope_scaling"),
    "dtype_number": (rope(dtype=3), "invalid_spec", "dtype"),
    "kind_number": ({**ROPE, "kind": 5}, "unknown_kind", "kind"),
    "kind_null": ({**ROPE, "kind": None}, "invalid_spec", "kind"),
    "alibi_heads_object": ({"kind": "alibi", "num_heads": {"n": 8}}, "invalid_spec", "num_heads"),
    # NaN and infinities spelled as strings get past JSON, not past the spec
    "theta_nan_string": (rope(rope_theta="NaN"), "invalid_spec", "rope_theta"),
    "theta_inf_string": (rope(rope_theta="inf"), "invalid_spec", "rope_theta"),
    "factor_inf_string": (
        rope(rope_scaling={"rope_type": "linear", "factor": "Infinity"}),
        "invalid_spec",
        "rope_scaling",
    ),
    # negative, zero and huge sizes
    "head_dim_negative": (rope(head_dim=-64), "invalid_spec", "head_dim"),
    "head_dim_zero": (rope(head_dim=0), "invalid_spec", "head_dim"),
    "head_dim_huge": (rope(head_dim=1 << 40), "invalid_spec", "head_dim"),
    "positions_zero": (rope(max_positions=0), "invalid_spec", "max_positions"),
    "positions_negative": (rope(max_positions=-5), "invalid_spec", "max_positions"),
    "positions_huge": (rope(max_positions=1 << 62), "invalid_spec", "max_positions"),
    "theta_zero": (rope(rope_theta=0), "invalid_spec", "rope_theta"),
    "theta_negative": (rope(rope_theta=-10000.0), "invalid_spec", "rope_theta"),
    "alibi_zero_heads": ({"kind": "alibi", "num_heads": 0}, "invalid_spec", "num_heads"),
    "alibi_huge_heads": ({"kind": "alibi", "num_heads": 10**9}, "invalid_spec", "num_heads"),
    "t5_zero_length": ({"kind": "t5_bias", "key_length": 0}, "invalid_spec", "key_length"),
    "sinusoidal_negative_dim": (
        {"kind": "sinusoidal", "dim": -8, "max_positions": 4},
        "invalid_spec",
        "dim",
    ),
    # odd dims where even is required
    "head_dim_odd": (rope(head_dim=63), "invalid_spec", "head_dim"),
    "rotary_dim_odd": (rope(rotary_dim=7), "invalid_spec", ""),
    "partial_rotary_odd": (rope(head_dim=10, partial_rotary_factor=0.5), "invalid_spec", ""),
    "whisper_odd_dim": (
        {"kind": "sinusoidal", "dim": 7, "max_positions": 4, "convention": "whisper"},
        "invalid_spec",
        "",
    ),
    # unknown kinds, rope types and fields
    "unknown_kind": ({**ROPE, "kind": "no_such_family"}, "unknown_kind", "kind"),
    "missing_kind": ({"head_dim": 64, "max_positions": 16}, "invalid_spec", "kind"),
    "unknown_rope_type": (
        rope(rope_scaling={"rope_type": "ntk-by-parts", "factor": 2.0}),
        "invalid_spec",
        "rope_scaling",
    ),
    "unknown_field": (rope(theta=10000.0), "invalid_spec", "theta"),
    "unknown_scaling_field": (
        rope(rope_scaling={"rope_type": "linear", "factor": 2.0, "alpha": 1}),
        "invalid_spec",
        "rope_scaling",
    ),
    "missing_required": ({"kind": "rope", "head_dim": 64}, "invalid_spec", "max_positions"),
    # inconsistent lengths and combinations
    "longrope_lengths_differ": (
        rope(rope_scaling={**LONGROPE, "long_factor": [2.0] * 31}),
        "invalid_spec",
        "",
    ),
    "longrope_wrong_count": (
        rope(head_dim=32, rope_scaling=LONGROPE),
        "invalid_spec",
        "",
    ),
    "rotary_dim_over_head_dim": (rope(rotary_dim=128), "invalid_spec", ""),
    "rotary_dim_and_factor": (
        rope(rotary_dim=32, partial_rotary_factor=0.5),
        "invalid_spec",
        "",
    ),
    "alibi_tp_not_dividing": (
        {"kind": "alibi", "num_heads": 12, "tp_size": 5},
        "invalid_spec",
        "tp_size",
    ),
    "t5_weights_rows": (
        {"kind": "t5_bias", "key_length": 4, "relative_attention_bias": [[0.1, 0.2]] * 3},
        "invalid_spec",
        "relative_attention_bias",
    ),
    "vllm_cos_sin_needs_half_width": (
        rope(profile="vllm", packing="cos_sin", width="full"),
        "invalid_spec",
        "",
    ),
    # configs
    "hf_config_not_object": ({"hf_config": [1, 2]}, "unsupported_config", "hf_config"),
    "hf_config_unmappable": (
        {"hf_config": {"model_type": "bert", "hidden_size": 64, "num_attention_heads": 4}},
        "unsupported_config",
        "",
    ),
    "hf_config_kind_number": (
        {"hf_config": {"model_type": "llama"}, "kind": 5},
        "invalid_spec",
        "kind",
    ),
    "hf_config_layer_type_list": (
        {"hf_config": {"model_type": "llama"}, "layer_type": ["full_attention"]},
        "invalid_spec",
        "layer_type",
    ),
    "hf_config_bad_values": (
        {
            "hf_config": {
                "model_type": "llama",
                "hidden_size": "big",
                "num_attention_heads": 0,
                "max_position_embeddings": -1,
            }
        },
        "",
        "",
    ),
    "hf_config_bad_override": (
        {
            "hf_config": {
                "model_type": "llama",
                "hidden_size": 64,
                "num_attention_heads": 4,
                "max_position_embeddings": 16,
            },
            "max_positions": "many",
        },
        "",
        "",
    ),
}


def check_contract(r: httpx.Response) -> dict[str, Any]:
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert r.headers["content-type"] == "application/json"
    body: dict[str, Any] = r.json()
    assert set(body) == {"error", "error_type", "detail"}
    assert isinstance(body["error"], str)
    assert body["error"]
    assert isinstance(body["error_type"], str)
    assert body["error_type"]
    return body


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_specs(client: httpx.Client, case: str) -> None:
    spec, error_type, field = BAD_SPECS[case]
    for path in ("/v1/tables", "/v1/resolve") if "hf_config" in spec else ("/v1/tables",):
        r = client.post(path, content=json.dumps(spec))
        body = check_contract(r)
        if error_type:
            assert body["error_type"] == error_type, body
        if body["error_type"] in ("invalid_spec", "unknown_kind", "unsupported_config"):
            assert r.status_code == 422
            assert isinstance(body["detail"], list), body
            assert body["detail"], body
            assert all({"field", "message", "value"} <= set(p) for p in body["detail"])
            if field:
                assert any(p["field"].startswith(field) for p in body["detail"]), body


@pytest.mark.parametrize(
    ("params", "error_type"),
    [
        ({"format": "xml"}, "unknown_format"),
        ({"format": "npy"}, "tensor_required"),
        ({"format": "raw"}, "tensor_required"),
        ({"tensor": "tan"}, "unknown_tensor"),
        ({"rows": "x"}, "invalid_rows"),
    ],
)
def test_bad_query_parameters(
    client: httpx.Client, params: dict[str, str], error_type: str
) -> None:
    body = check_contract(client.post("/v1/tables", json=ROPE, params=params))
    assert body["error_type"] == error_type


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "suggestion"),
    [
        ("POST", "/v1/tables", {"preset": "llamma-3.1-8b"}, 404, "'llama-3.1-8b'"),
        ("GET", "/v1/presets/llama-3.1-8c", None, 404, "'llama-3.1-8b'"),
        ("POST", "/v1/tables", {"kind": "ropee", "head_dim": 8}, 422, "'rope'"),
        (
            "POST",
            "/v1/tables",
            {"kind": "rope", "head_dim": 8, "max_positions": 4, "rope_thetaa": 1.0},
            422,
            "'rope_theta'",
        ),
        (
            "POST",
            "/v1/tables",
            {
                "kind": "rope",
                "head_dim": 8,
                "max_positions": 4,
                "rope_scaling": {"rope_type": "linear", "factor": 2.0, "factorr": 2.0},
            },
            422,
            "'factor'",
        ),
        (
            "POST",
            "/v1/resolve",
            {"hf_config": {"model_type": "llamma", "hidden_size": 64, "num_attention_heads": 2}},
            422,
            "'llama'",
        ),
    ],
    ids=["preset", "preset-route", "kind", "field", "nested-field", "model_type"],
)
def test_a_misspelt_name_gets_a_suggestion(
    client: httpx.Client,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    status: int,
    suggestion: str,
) -> None:
    """A preset, kind, spec field (nested too) or model_type one typo away from a known one:
    the error says `did you mean` the closest (difflib), and names nothing for a word far from
    all of them."""
    response = client.request(method, path, json=body)
    assert response.status_code == status, response.text
    assert f"did you mean {suggestion}?" in response.json()["error"]
    far = client.post("/v1/tables", json={"kind": "zzzzzz", "head_dim": 8})
    assert far.status_code == 422
    assert "did you mean" not in far.json()["error"]
    # a known model_type refused for having no table suggests nothing (not itself)
    known = client.post("/v1/resolve", json={"hf_config": {"model_type": "chameleon_vqgan"}})
    assert known.status_code == 422, known.text
    assert "(ChameleonVQVAEConfig, transformers" in known.json()["error"]
    assert "has no rope parameters" in known.json()["error"]
    assert "did you mean" not in known.json()["error"]


def test_unknown_routes_and_methods(client: httpx.Client) -> None:
    assert check_contract(client.get("/v1/nothing"))["error_type"] == "not_found"
    body = check_contract(client.delete("/v1/tables"))
    assert body["error_type"] == "method_not_allowed"
    assert check_contract(client.get("/v1/presets/gpt-5"))["error_type"] == "unknown_preset"
    body = check_contract(client.get("/v1/presets/gemma-3-27b/global"))
    assert body["error_type"] == "unknown_preset_part"
    assert "full_attention" in body["error"]


def test_no_server_errors_were_counted(client: httpx.Client) -> None:
    text = client.get("/metrics").text
    server_errors = [
        line
        for line in text.splitlines()
        if line.startswith("posenc_http_requests_total") and 'status="5' in line
    ]
    assert server_errors == []
