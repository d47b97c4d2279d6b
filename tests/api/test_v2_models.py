"""/v2 inference values through tritonclient.http: every model, binary and JSON outputs, rows
equal (bit for bit) to the whole table of the same spec from `posenc.encodings.compute` or `/v1`,
whether gathered from the cached table or computed for the asked positions; MRoPE against
transformers' Qwen2-VL and Qwen3-VL rotary modules."""

from __future__ import annotations

import json
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from tests.api.v2client import (
    as_torch,
    assert_equal,
    make_input,
    outputs,
    spec_param,
    table,
    url,
    v1_table,
)
from tests.conftest import ServerHandle

BINARY = [pytest.param(True, id="binary"), pytest.param(False, id="json")]
rng = np.random.default_rng(0)


@pytest.fixture(scope="module")
def triton(server: ServerHandle) -> http.InferenceServerClient:
    return http.InferenceServerClient(url(server))


def ids(array: list[Any] | np.ndarray[Any, Any], dtype: Any = np.int64) -> np.ndarray[Any, Any]:
    return np.asarray(array, dtype=dtype)


# --- rope -------------------------------------------------------------------------------------

ROPE_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 128},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    "longrope": {
        "rope_type": "longrope",
        "original_max_position_embeddings": 128,
        "max_position_embeddings": 512,
        "short_factor": json.dumps([1.0 + i / 16 for i in range(16)]),
        "long_factor": json.dumps([2.0 + i for i in range(16)]),
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "ntk_alpha": {"rope_type": "ntk_alpha", "alpha": 4.0},
}


def rope_spec(flat: dict[str, Any], max_positions: int) -> dict[str, Any]:
    """The /v1 spec of flat rope parameters (scaling keys nested, JSON strings decoded)."""
    top = {"head_dim", "rope_theta", "seq_len", "dtype", "profile", "precision"}
    spec: dict[str, Any] = {"kind": "rope", "max_positions": max_positions}
    scaling: dict[str, Any] = {}
    for key, value in flat.items():
        value = json.loads(value) if isinstance(value, str) and value.startswith("[") else value
        (spec if key in top else scaling)[key] = value
    if scaling:
        spec["rope_scaling"] = scaling
    return spec


@pytest.mark.parametrize("variant", sorted(ROPE_VARIANTS))
def test_rope_variants_cached_and_computed_rows(
    triton: http.InferenceServerClient, server: ServerHandle, variant: str
) -> None:
    flat = {"head_dim": 32, "rope_theta": 10000.0, "seq_len": 200, **ROPE_VARIANTS[variant]}
    params = {**flat, "max_positions": 200}
    whole = table(server, rope_spec(flat, 1001))
    inside = ids([[0, 5, 199], [17, 17, 3]])
    mixed = ids([[0, 5, 199], [250, 7, 1000]])
    for pos, source in ((inside, {"hit", "miss", "coalesced"}), (mixed, {"computed"})):
        result = triton.infer("rope", [make_input("position_ids", pos)], parameters=params)
        assert result.get_response()["parameters"]["posenc_source"] in source
        index = torch.from_numpy(pos)
        for name in ("cos", "sin"):
            assert_equal(as_torch(result, name), whole[name][index])


@pytest.mark.parametrize("binary", BINARY)
def test_rope_matches_v1(
    triton: http.InferenceServerClient, server: ServerHandle, binary: bool
) -> None:
    spec = {
        "kind": "rope",
        "head_dim": 128,
        "rope_theta": 500000.0,
        "max_positions": 4096,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    v1 = v1_table(server, spec)
    pos = ids([4095, 0, 1, 2048], np.int32)
    result = triton.infer(
        "rope",
        [make_input("position_ids", pos, binary=binary)],
        outputs=outputs(["cos", "sin", "inv_freq"], binary),
        parameters=spec_param(spec),
        request_id="llama-3.1",
    )
    assert result.get_response()["id"] == "llama-3.1"
    index = torch.from_numpy(pos.astype(np.int64))
    assert_equal(as_torch(result, "cos"), v1["cos"][index])
    assert_equal(as_torch(result, "sin"), v1["sin"][index])
    assert_equal(as_torch(result, "inv_freq"), v1["inv_freq"])
    output = result.get_output("cos")
    assert ("data" in output) != binary


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        ({"dtype": "bfloat16"}, ["cos", "sin"]),
        ({"dtype": "float16", "profile": "onnx"}, ["cos", "sin"]),
        ({"profile": "vllm"}, ["cos_sin"]),
        ({"profile": "torchtune"}, ["pairs"]),
        ({"interleaved": True, "precision": "exact"}, ["cos", "sin"]),
    ],
)
def test_rope_layouts_and_dtypes(
    triton: http.InferenceServerClient,
    server: ServerHandle,
    extra: dict[str, Any],
    names: list[str],
) -> None:
    spec = {"kind": "rope", "head_dim": 64, "max_positions": 100, **extra}
    whole = table(server, {**spec, "max_positions": 300})
    pos = ids([[3, 99], [150, 299]])
    result = triton.infer("rope", [make_input("position_ids", pos)], parameters=spec_param(spec))
    assert [o["name"] for o in result.get_response()["outputs"]] == names
    for name in names:
        assert_equal(as_torch(result, name), whole[name][torch.from_numpy(pos)])


def qwen_vl(interleaved: bool) -> torch.nn.Module:
    if interleaved:
        from transformers import Qwen3VLTextConfig
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

        config = Qwen3VLTextConfig(
            hidden_size=256,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=128,
            rope_parameters={"rope_type": "default", "mrope_section": [24, 20, 20],
                             "mrope_interleaved": True, "rope_theta": 5000000.0},
        )  # fmt: skip
        return Qwen3VLTextRotaryEmbedding(config)
    from transformers import Qwen2VLTextConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding

    config = Qwen2VLTextConfig(
        hidden_size=256,
        num_attention_heads=2,
        num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24],
                         "rope_theta": 1000000.0},
    )  # fmt: skip
    return Qwen2VLRotaryEmbedding(config)


@pytest.mark.parametrize("interleaved", [False, True], ids=["qwen2_vl", "qwen3_vl"])
@pytest.mark.parametrize("max_positions", [64, 4096], ids=["computed", "cached"])
def test_mrope_matches_transformers(
    triton: http.InferenceServerClient, server: ServerHandle, interleaved: bool, max_positions: int
) -> None:
    reference = qwen_vl(interleaved)
    section = [24, 20, 20] if interleaved else [16, 24, 24]
    theta = 5000000.0 if interleaved else 1000000.0
    # a text run, then an image grid (t fixed, h and w varying), then text again
    t = np.r_[np.arange(10), np.full(12, 10), np.arange(14, 20)]
    h = np.r_[np.arange(10), 10 + np.repeat(np.arange(3), 4), np.arange(14, 20)]
    w = np.r_[np.arange(10), 10 + np.tile(np.arange(4), 3), np.arange(14, 20)]
    pos = ids(np.stack([np.stack([t, h, w]), np.stack([t, h, w]) + 500]).transpose(1, 0, 2))
    want_cos, want_sin = reference(torch.zeros(1), torch.from_numpy(pos))
    if interleaved:
        params: dict[str, Any] = {
            "spec": json.dumps(
                {"head_dim": 128, "rope_theta": theta, "max_positions": max_positions,
                 "rope_scaling": {"rope_type": "default", "mrope_section": section,
                                  "mrope_interleaved": True}}
            )
        }  # fmt: skip
    else:
        params = {"head_dim": 128, "rope_theta": theta, "max_positions": max_positions,
                  "mrope_section": json.dumps(section)}  # fmt: skip
    result = triton.infer("rope", [make_input("position_ids", pos)], parameters=params)
    got_cos, got_sin = as_torch(result, "cos"), as_torch(result, "sin")
    assert got_cos.shape == (2, pos.shape[2], 128)
    if server.device.type == "cpu":
        assert_equal(got_cos, want_cos)
        assert_equal(got_sin, want_sin)
    else:
        torch.testing.assert_close(got_cos, want_cos, atol=2.4e-7, rtol=0)
        torch.testing.assert_close(got_sin, want_sin, atol=2.4e-7, rtol=0)
    # text-only ids (no leading 3) are the plain table, as transformers expands them
    text = ids([[1, 2, 3]])
    plain = triton.infer("rope", [make_input("position_ids", text)], parameters=params)
    want, _ = reference(torch.zeros(1), torch.from_numpy(text))
    torch.testing.assert_close(as_torch(plain, "cos"), want, atol=2.4e-7, rtol=0)


def test_mrope_config_spelling_and_errors(triton: http.InferenceServerClient) -> None:
    spec = {"head_dim": 64, "max_positions": 32,
            "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]}}  # fmt: skip
    pos = make_input("position_ids", np.zeros((3, 1, 4), np.int64))
    result = triton.infer("rope", [pos], parameters={"spec": json.dumps(spec)})
    assert result.as_numpy("cos").shape == (1, 4, 64)
    assert "chunked [8, 12, 12]" in result.get_response()["parameters"]["posenc_mrope"]
    with pytest.raises(InferenceServerException, match="sum to rotary_dim/2 = 32"):
        triton.infer("rope", [pos], parameters={"head_dim": 64, "max_positions": 32,
                                                "mrope_section": "8,8,8"})  # fmt: skip


# --- alibi ------------------------------------------------------------------------------------


@pytest.mark.parametrize("binary", BINARY)
def test_alibi_slopes_only(
    triton: http.InferenceServerClient, server: ServerHandle, binary: bool
) -> None:
    result = triton.infer("alibi", [], outputs=outputs(["slopes"], binary),
                          parameters={"num_heads": 12})  # fmt: skip
    want = table(server, {"kind": "alibi", "num_heads": 12})["slopes"]
    assert_equal(as_torch(result, "slopes"), want)
    default = triton.infer("alibi", [], parameters={"num_heads": 12, "alibi_bias_max": 16.0})
    assert [o["name"] for o in default.get_response()["outputs"]] == ["slopes"]


@pytest.mark.parametrize("form", ["causal", "symmetric", "row_constant"])
@pytest.mark.parametrize("binary", BINARY)
def test_alibi_bias_block(
    triton: http.InferenceServerClient, server: ServerHandle, form: str, binary: bool
) -> None:
    q, k = ids([100, 37, 38]), ids(np.arange(0, 121, 3))
    inputs = [make_input("query_positions", q, binary), make_input("key_positions", k, binary)]
    params = {"num_heads": 6, "bias": form}
    result = triton.infer("alibi", inputs, outputs=outputs(["bias", "slopes"], binary),
                          parameters=params)  # fmt: skip
    assert result.get_response()["parameters"]["posenc_source"] == "computed"
    whole = table(server, {"kind": "alibi", **params, "query_length": 101, "key_length": 121})
    want = whole["bias"][:, torch.from_numpy(q)][:, :, torch.from_numpy(k)]
    assert_equal(as_torch(result, "bias"), want)
    assert_equal(as_torch(result, "slopes"), whole["slopes"])


def test_alibi_table_rows_and_forms(
    triton: http.InferenceServerClient, server: ServerHandle
) -> None:
    spec = {"kind": "alibi", "num_heads": 8, "bias": "mpt", "key_length": 64,
            "query_length": 16, "query_offset": 48, "dtype": "bfloat16"}  # fmt: skip
    whole = table(server, spec)
    q, k = ids([63, 48, 50]), ids([0, 63, 10])
    inputs = [make_input("query_positions", q), make_input("key_positions", k)]
    for _ in range(2):
        result = triton.infer("alibi", inputs, parameters=spec_param(spec))
        assert result.get_response()["parameters"]["posenc_source"] in {"hit", "miss"}
        want = whole["bias"][:, torch.from_numpy(q - 48)][:, :, torch.from_numpy(k)]
        assert_equal(as_torch(result, "bias"), want)
    # queries outside the table: mpt is computed against the table's key length
    outside = [make_input("query_positions", ids([5, 60])), make_input("key_positions", k)]
    result = triton.infer("alibi", outside, parameters=spec_param(spec))
    ref = table(server, {**spec, "query_offset": 0, "query_length": 64})
    want = ref["bias"][:, torch.tensor([5, 60])][:, :, torch.from_numpy(k)]
    assert_equal(as_torch(result, "bias"), want)
    far = [make_input("query_positions", ids([1])), make_input("key_positions", ids([64]))]
    with pytest.raises(InferenceServerException, match="below key_length=64"):
        triton.infer("alibi", far, parameters=spec_param(spec))
    bottom = {"num_heads": 8, "bias": "bottom_right", "key_length": 8, "query_length": 4}
    with pytest.raises(InferenceServerException, match="inside it"):
        triton.infer("alibi", far, parameters=bottom)


def test_alibi_masks_travel_as_binary_only(triton: http.InferenceServerClient) -> None:
    inputs = [make_input("query_positions", ids([0])), make_input("key_positions", ids([0, 1]))]
    params = {"num_heads": 4, "masked_value": "-inf"}
    with pytest.raises(InferenceServerException, match="non-finite"):
        triton.infer("alibi", inputs, outputs=outputs(["bias"], False), parameters=params)
    result = triton.infer("alibi", inputs, parameters=params)
    assert np.isneginf(result.as_numpy("bias")[:, 0, 1]).all()
    with pytest.raises(InferenceServerException, match="both query_positions and key_positions"):
        triton.infer("alibi", inputs[:1], parameters=params)


# --- t5_bias ----------------------------------------------------------------------------------


@pytest.mark.parametrize("binary", BINARY)
@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_and_bias_from_input_weights(
    triton: http.InferenceServerClient, server: ServerHandle, binary: bool, bidirectional: bool
) -> None:
    weights = rng.standard_normal((32, 4)).astype(np.float32)
    q, k = ids([0, 300, 7]), ids(np.arange(0, 400, 9))
    inputs = [
        make_input("query_positions", q, binary),
        make_input("key_positions", k, binary),
        make_input("relative_attention_bias", weights, binary),
    ]
    params = {"bidirectional": bidirectional}
    result = triton.infer("t5_bias", inputs, outputs=outputs(["buckets", "bias"], binary),
                          parameters=params)  # fmt: skip
    whole = table(
        server,
        {"kind": "t5_bias", **params, "query_length": 301, "key_length": 400,
         "relative_attention_bias": weights.tolist()},
    )  # fmt: skip
    qi, ki = torch.from_numpy(q), torch.from_numpy(k)
    assert_equal(as_torch(result, "buckets"), whole["buckets"][qi][:, ki])
    assert_equal(as_torch(result, "bias"), whole["bias"][:, qi][:, :, ki])


def test_t5_table_rows_bf16(triton: http.InferenceServerClient, server: ServerHandle) -> None:
    weights = rng.standard_normal((32, 3)).astype(ml_dtypes.bfloat16)
    spec = {"kind": "t5_bias", "query_length": 64, "key_length": 64, "dtype": "bfloat16",
            "relative_attention_bias": weights.astype(np.float32).tolist()}  # fmt: skip
    whole = table(server, spec)
    q, k = ids([63, 0]), ids([0, 1, 63])
    inputs = [make_input("query_positions", q), make_input("key_positions", k)]
    result = triton.infer("t5_bias", inputs, parameters=spec_param(spec))
    assert result.get_response()["parameters"]["posenc_source"] in {"hit", "miss"}
    assert result.get_output("bias")["datatype"] == "BF16"
    qi, ki = torch.from_numpy(q), torch.from_numpy(k)
    assert_equal(as_torch(result, "bias"), whole["bias"][:, qi][:, :, ki])
    # the same weights as a BF16 input tensor, positions outside any table
    spec_no_w = {"dtype": "bfloat16"}
    inputs.append(make_input("relative_attention_bias", weights))
    computed = triton.infer("t5_bias", inputs, parameters=spec_no_w)
    assert computed.get_response()["parameters"]["posenc_source"] == "computed"
    assert_equal(as_torch(computed, "bias"), whole["bias"][:, qi][:, :, ki])
    with pytest.raises(InferenceServerException, match="given both"):
        triton.infer("t5_bias", inputs, parameters=spec_param(spec))
    with pytest.raises(InferenceServerException, match="needs relative_attention_bias"):
        triton.infer("t5_bias", inputs[:2], outputs=outputs(["bias"], True), parameters={})


# --- sinusoidal -------------------------------------------------------------------------------


@pytest.mark.parametrize("binary", BINARY)
def test_sinusoidal_rows(
    triton: http.InferenceServerClient, server: ServerHandle, binary: bool
) -> None:
    spec = {"kind": "sinusoidal", "dim": 48, "convention": "fairseq", "max_positions": 100}
    whole = table(server, {**spec, "max_positions": 2000})
    for pos, source in ((ids([[2, 3], [1, 99]]), "miss"), (ids([[2, 1999], [1, 99]]), "computed")):
        result = triton.infer(
            "sinusoidal",
            [make_input("position_ids", pos, binary)],
            outputs=outputs(["embedding"], binary),
            parameters=spec_param(spec),
        )
        assert result.get_response()["parameters"]["posenc_source"] in {source, "hit"}
        got = as_torch(result, "embedding")
        assert_equal(got, whole["embedding"][torch.from_numpy(pos)])
        assert not got[1, 0].any()  # fairseq's padding row (position id 1) is zero


def test_sinusoidal_fractional_timesteps(
    triton: http.InferenceServerClient, server: ServerHandle
) -> None:
    steps = ids([999.0, 0.5, 0.5, 12.25], np.float32)
    params = {"dim": 64, "convention": "diffusers", "dtype": "float16"}
    result = triton.infer("sinusoidal", [make_input("position_ids", steps)], parameters=params)
    want = table(server, {"kind": "sinusoidal", **params, "positions": steps.tolist()})
    assert_equal(as_torch(result, "embedding"), want["embedding"])


# --- sinusoidal_2d ----------------------------------------------------------------------------


@pytest.mark.parametrize("binary", BINARY)
def test_sinusoidal_2d_detr_batch(
    triton: http.InferenceServerClient, server: ServerHandle, binary: bool
) -> None:
    params = {"style": "detr", "num_pos_feats": 16, "normalize": True}
    valid = ids([[20, 30], [15, 25]])
    inputs = [make_input("grid", ids([20, 30]), binary), make_input("valid", valid, binary)]
    result = triton.infer("sinusoidal_2d", inputs, outputs=outputs(["embedding"], binary),
                          parameters=params)  # fmt: skip
    got = as_torch(result, "embedding")
    assert got.shape == (2, 32, 20, 30)
    for b, (vh, vw) in enumerate(valid.tolist()):
        spec = {"kind": "sinusoidal_2d", **params, "height": 20, "width": 30,
                "valid_height": vh, "valid_width": vw}  # fmt: skip
        assert_equal(got[b], table(server, spec)["embedding"])


@pytest.mark.parametrize(
    "params",
    [
        {"style": "mae", "dim": 64, "cls_token": True},
        {"style": "timm", "dim": 32, "reverse_coord": True, "dtype": "bfloat16"},
    ],
)
def test_sinusoidal_2d_grids(
    triton: http.InferenceServerClient, server: ServerHandle, params: dict[str, Any]
) -> None:
    result = triton.infer("sinusoidal_2d", [make_input("grid", ids([7, 9], np.int32))],
                          parameters=params)  # fmt: skip
    spec = {"kind": "sinusoidal_2d", **params, "grid_height": 7, "grid_width": 9}
    assert_equal(as_torch(result, "embedding"), v1_table(server, spec)["embedding"])


# --- whole-table models (families without position inputs) ------------------------------------


@pytest.mark.parametrize("binary", BINARY)
def test_whole_table_model(
    triton: http.InferenceServerClient, server: ServerHandle, binary: bool
) -> None:
    spec = {"kind": "normalized", "mode": "by_last", "lengths": [3, 5]}
    result = triton.infer("normalized", [], outputs=outputs(["embedding"], binary),
                          parameters=spec_param(spec))  # fmt: skip
    assert_equal(as_torch(result, "embedding"), v1_table(server, spec)["embedding"])
    with pytest.raises(InferenceServerException, match="has no output 'nope'"):
        triton.infer("normalized", [], outputs=outputs(["nope"], True), parameters=spec_param(spec))


def test_scattered_positions_are_computed_at_the_pairs_only(
    triton: http.InferenceServerClient,
) -> None:
    """Positions whose bounding block (20001 x 20001) is far over the response limit: the
    entries at the asked pairs are computed, not the block (once refused as "span a block"):
    T5's buckets are transformers' `_relative_position_bucket` of key - query there, ALiBi's
    causal bias 0 on the diagonal and masked (float32's minimum) after the query."""
    from transformers.models.t5.modeling_t5 import T5Attention

    q, k = ids([0, 20000]), ids([3, 20000])
    far = [make_input("query_positions", q), make_input("key_positions", k)]
    buckets = as_torch(triton.infer("t5_bias", far), "buckets")
    rel = torch.from_numpy(k)[None, :] - torch.from_numpy(q)[:, None]
    want = T5Attention._relative_position_bucket(rel, True, 32, 128)
    assert_equal(buckets, want)
    bias = as_torch(triton.infer("alibi", far, parameters={"num_heads": 1}), "bias")
    masked = torch.finfo(torch.float32).min
    assert bias.tolist() == [[[masked, masked], [-19997 * 0.00390625, 0.0]]]


def test_alibi_falcon_bias_rounding_block(triton: http.InferenceServerClient) -> None:
    """Issue 31: a block of Falcon's bias (bias_rounding) computed for arbitrary key positions is
    FalconModel's own: build_alibi_tensor / sqrt(head_dim) gathered at those keys, future keys
    masked as FalconModel's causal mask does."""
    import math

    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    params = {"num_heads": 32, "bias": "row_constant", "slope_scale": 1 / math.sqrt(64),
              "slope_rounding": "bfloat16", "bias_rounding": "bfloat16"}  # fmt: skip
    q, k = ids([2047, 2040]), ids(np.arange(0, 2048, 7))
    inputs = [make_input("query_positions", q), make_input("key_positions", k)]
    result = triton.infer("alibi", inputs, parameters=params)
    row = build_alibi_tensor(torch.ones(1, 2048, dtype=torch.long), 32, torch.float32)[:, 0, :] / 8
    want = row[:, None, torch.from_numpy(k)].expand(32, 2, -1).clone()
    future = torch.from_numpy(k)[None, :] > torch.from_numpy(q)[:, None]  # causal: masked
    want[:, future] = torch.finfo(torch.float32).min
    assert_equal(as_torch(result, "bias"), want)
