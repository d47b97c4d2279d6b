"""/v2 `xpos` model through tritonclient.http: rows for position ids equal (bit for bit) the rows of
the whole table of the same spec from `posenc.encodings.compute` (cached path), and, for positions
outside the table or a table too large for the cache, the rows of a larger table computed with the
same integer centre (computed path); both packings and widths, rotate-half, bf16, exact; metadata,
config and 400s naming the input or parameter."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from posenc.api.oip.models import MODELS, POSITION_MODELS
from posenc.encodings import parse_spec
from posenc.encodings.xpos import OUTPUT_NAMES, XposSpec
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
CACHED = {"hit", "miss", "coalesced"}
LAYOUTS = [
    pytest.param({}, id="premultiplied-full"),
    pytest.param({"packing": "factored", "width": "half"}, id="factored-half"),
    pytest.param({"packing": "factored", "interleaved": False}, id="factored-rotate-half"),
    pytest.param({"width": "half", "dtype": "bfloat16"}, id="premultiplied-half-bf16"),
    pytest.param({"precision": "exact", "interleaved": False}, id="exact-rotate-half"),
    pytest.param(
        {"precision": "exact", "dtype": "bfloat16", "packing": "factored"}, id="exact-bf16"
    ),
]


@pytest.fixture(scope="module")
def triton(server: ServerHandle) -> http.InferenceServerClient:
    return http.InferenceServerClient(url(server))


def ids(array: Any, dtype: Any = np.int64) -> np.ndarray[Any, Any]:
    return np.asarray(array, dtype=dtype)


def centre(spec: dict[str, Any]) -> int:
    parsed = parse_spec(spec)
    assert isinstance(parsed, XposSpec)
    return parsed.resolved_centre()


def infer(
    triton: http.InferenceServerClient,
    pos: np.ndarray[Any, Any],
    params: dict[str, Any],
    names: list[str] | None = None,
    binary: bool = True,
) -> http.InferResult:
    return triton.infer(
        "xpos",
        [make_input("position_ids", pos, binary)],
        outputs=None if names is None else outputs(names, binary),
        parameters=params,
    )


def source(result: http.InferResult) -> str:
    return str(result.get_response()["parameters"]["posenc_source"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rows_inside_the_table_are_its_rows(
    triton: http.InferenceServerClient, server: ServerHandle, layout: dict[str, Any]
) -> None:
    spec = {"kind": "xpos", "head_dim": 64, "max_positions": 128, "position_offset": 16, **layout}
    whole = table(server, spec)
    names = list(OUTPUT_NAMES[spec.get("packing", "premultiplied")])
    w = 32 if spec.get("width") == "half" else 64
    for pos in (ids([[16, 20, 143], [100, 100, 17]]), ids(np.arange(40, 72)[None, :])):
        result = infer(triton, pos, spec_param(spec))
        assert source(result) in CACHED
        assert [o["name"] for o in result.get_response()["outputs"]] == names
        for name in names:
            got = as_torch(result, name)
            assert got.shape == (*pos.shape, w)
            assert_equal(got, whole[name][torch_index(pos) - 16])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rows_outside_the_table_are_computed_with_its_centre(
    triton: http.InferenceServerClient, server: ServerHandle, layout: dict[str, Any]
) -> None:
    spec = {"kind": "xpos", "head_dim": 64, "max_positions": 64, "position_offset": 100, **layout}
    c = centre(spec)
    assert c == 82  # ceil(164 / 2)
    # one table from 0 to past every position asked, with the same integer centre
    wider = table(server, {**spec, "position_offset": 0, "max_positions": 600, "centre": c})
    names = list(OUTPUT_NAMES[spec.get("packing", "premultiplied")])
    cases = [
        ids([[0, 5, 99], [100, 163, 164]]),  # below position_offset, inside, past the end
        ids([[599, 300], [300, 120]]),  # beyond max_positions, repeated
        ids([[82]]),  # the centre alone: s = 1
    ]
    for pos in cases:
        result = infer(triton, pos, spec_param(spec))
        assert source(result) == "computed"
        for name in names:
            assert_equal(as_torch(result, name), wider[name][torch_index(pos)])
    if spec.get("packing") == "factored" and spec.get("dtype", "float32") == "float32":
        one = infer(triton, ids([[c]]), spec_param(spec), ["scale_q"])
        assert as_torch(one, "scale_q").eq(1).all()


@pytest.mark.parametrize("binary", BINARY)
def test_flat_parameters_int32_and_output_selection(
    triton: http.InferenceServerClient, server: ServerHandle, binary: bool
) -> None:
    params = {"head_dim": 16, "max_positions": 32, "packing": "factored", "centre": "floor_half"}
    v1 = v1_table(server, {"kind": "xpos", **params})
    pos = ids([[3, 31, 0, 7]], np.int32)
    result = infer(triton, pos, params, ["scale_k", "cos"], binary)
    response = result.get_response()
    assert [o["name"] for o in response["outputs"]] == ["scale_k", "cos"]
    assert ("data" in result.get_output("cos")) != binary
    index = torch_index(pos)
    assert_equal(as_torch(result, "scale_k"), v1["scale_k"][index])
    assert_equal(as_torch(result, "cos"), v1["cos"][index])
    echoed = json.loads(response["parameters"]["posenc_spec"])
    assert echoed["centre"] == 16
    assert response["parameters"]["posenc_key"]


def test_table_too_large_for_the_cache_is_computed(
    triton: http.InferenceServerClient, server: ServerHandle
) -> None:
    # 4 x 6000 x 8192 fp32 = 750 MiB > the test server's 512 MiB cache: rows are computed
    spec = {"kind": "xpos", "head_dim": 8192, "max_positions": 6000, "scale_base": 4096.0}
    c = centre(spec)
    pos = ids([[0, 2999], [5999, 3000]])
    result = infer(triton, pos, spec_param(spec))
    assert source(result) == "computed"
    # small tables holding the positions asked, with the same centre
    for start, rows, picks in ((0, 1, [(0, 0)]), (2999, 2, [(0, 1), (1, 1)]), (5999, 1, [(1, 0)])):
        part = table(server, {**spec, "position_offset": start, "max_positions": rows, "centre": c})
        for name in OUTPUT_NAMES["premultiplied"]:
            got = as_torch(result, name)
            assert got.shape == (2, 2, 8192)
            for i, j in picks:
                assert_equal(got[i, j], part[name][int(pos[i, j]) - start])


def test_model_is_listed_with_metadata_and_config(triton: http.InferenceServerClient) -> None:
    assert "xpos" in POSITION_MODELS
    assert MODELS["xpos"] is POSITION_MODELS["xpos"]
    meta = triton.get_model_metadata("xpos")
    assert meta["name"] == "xpos"
    assert meta["versions"] == ["1"]
    assert [i["name"] for i in meta["inputs"]] == ["position_ids"]
    assert meta["inputs"][0]["datatype"] == "INT64"
    assert [o["name"] for o in meta["outputs"]] == [
        *OUTPUT_NAMES["premultiplied"],
        *OUTPUT_NAMES["factored"],
    ]
    assert triton.is_model_ready("xpos")
    config = triton.get_model_config("xpos")
    assert config["input"][0]["datatypes"] == ["INT64", "INT32"]
    assert {o["name"] for o in config["output"]} == {o["name"] for o in meta["outputs"]}
    assert config["posenc"]["spec_schema"]["title"] == "XposSpec"
    assert any("centre" in note for note in config["posenc"]["notes"])


GOOD = {"head_dim": 16, "max_positions": 64}


@pytest.mark.parametrize(
    ("inputs", "parameters", "needle"),
    [
        ([], GOOD, "input 'position_ids' is required"),
        ([("position_ids", ids([1.0, 2.0], np.float32))], GOOD, "'position_ids' must be one of"),
        ([("position_ids", ids([-1]))], GOOD, "'position_ids': positions must be in [0, 16777216)"),
        ([("position_ids", ids([1 << 24]))], GOOD, "got 16777216"),
        ([("position_ids", ids(5))], GOOD, "'position_ids' must have rank 1 or more"),
        ([("position_ids", ids([1])), ("x", ids([1]))], GOOD, "no input 'x'"),
        ([("position_ids", ids([1]))], {"head_dim": 15, "max_positions": 8}, "head_dim"),
        ([("position_ids", ids([1]))], {"head_dim": 16}, "max_positions"),
        ([("position_ids", ids([1]))], {**GOOD, "packing": "pairs"}, "packing"),
        ([("position_ids", ids([1]))], {**GOOD, "bogus": 1}, "bogus"),
        ([("position_ids", ids([1]))], {"spec": json.dumps({"kind": "rope"})}, "kind"),
        # far from the centre: the decay would leave float16's normal range
        ([("position_ids", ids([5, 20000]))], {**GOOD, "dtype": "float16"}, "position 20000"),
    ],
)  # fmt: skip
def test_bad_requests_are_400_naming_the_field(
    triton: http.InferenceServerClient,
    inputs: list[tuple[str, np.ndarray[Any, Any]]],
    parameters: dict[str, Any],
    needle: str,
) -> None:
    with pytest.raises(InferenceServerException) as err:
        triton.infer("xpos", [make_input(n, a) for n, a in inputs], parameters=parameters)
    assert err.value.status() == "400"
    assert needle in err.value.message()


def test_output_of_the_other_packing_is_400(triton: http.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as err:
        infer(triton, ids([1]), GOOD, ["scale_q"])
    assert err.value.status() == "400"
    assert "'scale_q' is not available" in err.value.message()
    assert "premultiplied" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        infer(triton, ids([1]), GOOD, ["nope"])
    assert "no output 'nope'" in err.value.message()


def torch_index(pos: np.ndarray[Any, Any]) -> torch.Tensor:
    return torch.from_numpy(pos.astype(np.int64))
