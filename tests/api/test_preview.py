"""`GET /v1/tables/{key}/preview` (strided samples for the explorer) and the `/ui` page's routes,
through httpx against the real server."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

import posenc
from posenc.encodings import compute, parse_spec
from posenc.runtime.rows import preview_steps
from tests.conftest import ServerHandle, start_server

ROPE = {"kind": "rope", "head_dim": 64, "max_positions": 3000, "rope_theta": 500000.0}


def key_of(client: httpx.Client, spec: dict[str, Any]) -> str:
    """POST `spec` (asking for a few rows only) and return its content key."""
    response = client.post("/v1/tables", params={"format": "json", "rows": "0:1"}, json=spec)
    assert response.status_code == 200, response.text
    return response.headers["X-Posenc-Key"]


def exact(server: ServerHandle, spec: dict[str, Any], tensor: str) -> torch.Tensor:
    return compute(parse_spec(spec), server.device).tensors[tensor].cpu()


def assert_error(response: httpx.Response, status: int, error_type: str, field: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type", "detail"}
    assert body["error_type"] == error_type
    assert any(d.get("field") == field for d in body["detail"]), body


@pytest.mark.parametrize(
    ("shape", "max_points", "steps"),
    [
        ((131072, 128), 65536, (256, 1)),
        ((3000, 64), 65536, (4, 1)),
        ((100, 64), 65536, (1, 1)),
        ((32, 8192, 8192), 65536, (1, 256, 128)),
        ((7,), 3, (4,)),
        ((5, 5), 1, (5, 5)),
    ],
)
def test_preview_steps_fit_the_budget(
    shape: tuple[int, ...], max_points: int, steps: tuple[int, ...]
) -> None:
    got = preview_steps(shape, max_points)
    assert got == steps
    assert math.prod(-(-n // s) for n, s in zip(shape, got, strict=True)) <= max_points


def test_preview_is_a_strided_sample_of_the_exact_table(
    server: ServerHandle, client: httpx.Client
) -> None:
    key = key_of(client, ROPE)
    table = exact(server, ROPE, "cos")
    response = client.get(f"/v1/tables/{key}/preview", params={"tensor": "cos", "max_points": 4096})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["shape"] == [3000, 64]
    assert body["row_axis"] == 0
    assert body["dtype"] == "float32"
    steps = [a["step"] for a in body["axes"]]
    counts = [a["count"] for a in body["axes"]]
    assert math.prod(counts) == len(body["data"]) <= 4096
    want = table[:: steps[0], :: steps[1]]
    assert list(want.shape) == counts
    assert torch.equal(torch.tensor(body["data"], dtype=torch.float32).reshape(want.shape), want)
    assert response.headers["Cache-Control"].endswith("immutable")
    again = client.get(
        f"/v1/tables/{key}/preview",
        params={"tensor": "cos", "max_points": 4096},
        headers={"If-None-Match": response.headers["ETag"]},
    )
    assert again.status_code == 304


@pytest.mark.parametrize(("tensor", "rows"), [("cos", None), ("sin", "7:2999")])
def test_pooled_preview_holds_each_blocks_min_max_mean(
    server: ServerHandle, client: httpx.Client, tensor: str, rows: str | None
) -> None:
    """`pool=block`: beside the strided sample, each sampled element's block (the elements it
    stands for, the last block along an axis shorter) as min, max and mean, computed here from
    the exact table block by block."""
    key = key_of(client, ROPE)
    params = {"tensor": tensor, "max_points": 1000, "pool": "block"}
    if rows:
        params["rows"] = rows
    body = client.get(f"/v1/tables/{key}/preview", params=params).json()
    full = exact(server, ROPE, tensor).double().numpy()
    first, last = (int(v) for v in rows.split(":")) if rows else (0, full.shape[0])
    full = full[first:last]
    (r_step, c_step) = (a["step"] for a in body["axes"])
    (r_count, c_count) = (a["count"] for a in body["axes"])
    assert r_step > 1
    assert full.shape[0] % r_step != 0  # a shorter last block is part of the test
    pooled = {name: np.asarray(v).reshape(r_count, c_count) for name, v in body["pooled"].items()}
    for i in range(r_count):
        for j in range(c_count):
            block = full[i * r_step : (i + 1) * r_step, j * c_step : (j + 1) * c_step]
            assert pooled["min"][i, j] == block.min()
            assert pooled["max"][i, j] == block.max()
            assert pooled["mean"][i, j] == pytest.approx(block.mean(), rel=1e-12, abs=1e-15)
    assert np.float32(body["data"][0]) == np.float32(full[0, 0])  # the sample: the first row
    bad = client.get(f"/v1/tables/{key}/preview", params={"tensor": "cos", "pool": "max"})
    assert_error(bad, 400, "invalid_pool", "pool")


LLAMA3 = {
    **ROPE,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}


@pytest.mark.parametrize(("tensor", "rows"), [("cos", None), ("sin", "7:2999")])
def test_difference_preview_pools_the_element_wise_difference(
    server: ServerHandle, client: httpx.Client, tensor: str, rows: str | None
) -> None:
    """`minus=<other table>`: the sample and every block's min, max, mean and max |.| are of
    the element-wise difference of the two exact tables (numpy, block by block), not the
    difference of two pooled tables (which the test shows would differ)."""
    key, plain = key_of(client, LLAMA3), key_of(client, ROPE)
    params = {"tensor": tensor, "max_points": 1000, "pool": "block", "minus": plain}
    if rows:
        params["rows"] = rows
    response = client.get(f"/v1/tables/{key}/preview", params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["dtype"], body["minus"]) == ("float64", plain)
    a = exact(server, LLAMA3, tensor).double().numpy()
    b = exact(server, ROPE, tensor).double().numpy()
    first, last = (int(v) for v in rows.split(":")) if rows else (0, a.shape[0])
    diff = (a - b)[first:last]
    (r_step, c_step) = (x["step"] for x in body["axes"])
    (r_count, c_count) = (x["count"] for x in body["axes"])
    assert r_step > 1
    pooled = {name: np.asarray(v).reshape(r_count, c_count) for name, v in body["pooled"].items()}
    assert set(pooled) == {"min", "max", "mean", "maxabs"}
    pooled_apart = 0
    for i in range(r_count):
        for j in range(c_count):
            rs, cs = slice(i * r_step, (i + 1) * r_step), slice(j * c_step, (j + 1) * c_step)
            block = diff[rs, cs]
            assert pooled["min"][i, j] == block.min()
            assert pooled["max"][i, j] == block.max()
            assert pooled["maxabs"][i, j] == np.abs(block).max()
            assert pooled["mean"][i, j] == pytest.approx(block.mean(), rel=1e-9, abs=1e-15)
            # what subtracting the two tables' pooled maxima would have drawn instead
            wrong = a[first:last][rs, cs].max() - b[first:last][rs, cs].max()
            pooled_apart += abs(wrong) != np.abs(block).max()
    assert pooled_apart > 0
    sample = np.asarray(body["data"]).reshape(r_count, c_count)
    assert np.array_equal(sample, diff[::r_step, ::c_step])
    # the difference's first block, its ETag distinct from the table's own preview
    alone = client.get(f"/v1/tables/{key}/preview", params={"tensor": tensor, "pool": "block"})
    assert alone.headers["ETag"] != response.headers["ETag"]


def test_difference_preview_refuses_a_table_of_another_shape_or_kind(
    client: httpx.Client,
) -> None:
    key = key_of(client, ROPE)
    shorter = key_of(client, {**ROPE, "max_positions": 2999})
    alibi = key_of(client, {"kind": "alibi", "num_heads": 4, "bias": "causal", "key_length": 64})
    for other in (shorter, alibi):
        bad = client.get(f"/v1/tables/{key}/preview", params={"tensor": "cos", "minus": other})
        assert_error(bad, 400, "invalid_minus", "minus")
    unknown = client.get(f"/v1/tables/{key}/preview", params={"tensor": "cos", "minus": "0" * 64})
    assert unknown.status_code == 404
    assert unknown.json()["error_type"] == "unknown_key"


def test_preview_rows_zoom_into_a_range(server: ServerHandle, client: httpx.Client) -> None:
    key = key_of(client, ROPE)
    table = exact(server, ROPE, "sin")
    body = client.get(
        f"/v1/tables/{key}/preview", params={"tensor": "sin", "rows": "2000:2100"}
    ).json()
    assert body["axes"][0] == {"start": 2000, "step": 1, "count": 100}
    got = torch.tensor(body["data"], dtype=torch.float32).reshape(100, 64)
    assert torch.equal(got, table[2000:2100])


def test_preview_of_a_bias_slices_queries_and_keeps_heads(
    server: ServerHandle, client: httpx.Client
) -> None:
    spec = {"kind": "alibi", "num_heads": 12, "bias": "causal", "key_length": 300}
    key = key_of(client, spec)
    table = exact(server, spec, "bias")  # (12, 300, 300)
    body = client.get(
        f"/v1/tables/{key}/preview", params={"tensor": "bias", "rows": "100:300"}
    ).json()
    assert body["row_axis"] == 1
    steps = [a["step"] for a in body["axes"]]
    assert steps[0] == 1
    assert body["axes"][1]["start"] == 100
    want = table[:, 100:300][:: steps[0], :: steps[1], :: steps[2]]
    got = torch.tensor(body["data"], dtype=torch.float32).reshape(want.shape)
    assert torch.equal(got, want)


def test_preview_of_bfloat16_and_int_tables(server: ServerHandle, client: httpx.Client) -> None:
    bf16 = {**ROPE, "max_positions": 50, "dtype": "bfloat16"}
    body = client.get(f"/v1/tables/{key_of(client, bf16)}/preview", params={"tensor": "cos"})
    assert body.status_code == 200
    want = exact(server, bf16, "cos").float()
    assert body.json()["dtype"] == "bfloat16"
    assert torch.equal(torch.tensor(body.json()["data"]).reshape(want.shape), want)
    t5 = {"kind": "t5_bias", "query_length": 40, "key_length": 40}
    body = client.get(f"/v1/tables/{key_of(client, t5)}/preview").json()
    assert body["tensor"] == "buckets"
    assert torch.equal(torch.tensor(body["data"]).reshape(40, 40), exact(server, t5, "buckets"))


@pytest.mark.parametrize(
    ("params", "status", "error_type", "field"),
    [
        ({"tensor": "cos", "max_points": "0"}, 400, "invalid_max_points", "max_points"),
        ({"tensor": "cos", "max_points": "-5"}, 400, "invalid_max_points", "max_points"),
        ({"tensor": "cos", "max_points": "1e3"}, 400, "invalid_max_points", "max_points"),
        ({"tensor": "cos", "max_points": "9" * 40}, 400, "invalid_max_points", "max_points"),
        ({"tensor": "cos", "max_points": "100001"}, 400, "invalid_max_points", "max_points"),
        ({}, 400, "tensor_required", "tensor"),
        ({"tensor": "nope"}, 400, "unknown_tensor", "tensor"),
        ({"tensor": "cos", "rows": "10:5"}, 400, "invalid_rows", "rows"),
        ({"tensor": "cos", "rows": "0:3001"}, 400, "invalid_rows", "rows"),
        ({"tensor": "cos", "rows": "a:b"}, 400, "invalid_rows", "rows"),
        ({"tensor": "inv_freq", "rows": "0:10"}, 400, "rows_unsupported", "rows"),
    ],
)
def test_preview_rejects_bad_parameters(
    client: httpx.Client, params: dict[str, str], status: int, error_type: str, field: str
) -> None:
    key = key_of(client, ROPE)
    assert_error(client.get(f"/v1/tables/{key}/preview", params=params), status, error_type, field)


LLAMA = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
}


def test_preview_of_an_unknown_key(client: httpx.Client) -> None:
    response = client.get(f"/v1/tables/{'0' * 64}/preview", params={"tensor": "cos"})
    error_type = response.json()["error_type"]
    assert response.status_code == 404
    assert error_type == "unknown_key"


def test_preview_limits_are_checked_before_computing() -> None:
    with start_server(max_response_bytes=1 << 20, json_max_elements=1000) as srv, srv.client() as c:
        # 8192 x 128 float32 cos and sin: 8 MiB, over this server's 1 MiB; resolving only
        # names the key, nothing is computed
        resolved = c.post("/v1/resolve", json={"hf_config": LLAMA, "max_positions": 8192})
        assert resolved.status_code == 200, resolved.text
        big = resolved.json()["specs"][0]["key"]
        cache = srv.state.require_cache()
        before = cache.stats.computations
        response = c.get(f"/v1/tables/{big}/preview", params={"tensor": "cos", "max_points": 10})
        assert response.status_code == 413
        assert response.json()["error_type"] == "too_large"
        assert response.json()["detail"]["max_bytes"] == 1 << 20
        assert cache.stats.computations == before
        small = key_of(c, {**ROPE, "max_positions": 100})
        over = c.get(f"/v1/tables/{small}/preview", params={"tensor": "cos", "max_points": 1001})
        assert_error(over, 400, "invalid_max_points", "max_points")
        default = c.get(f"/v1/tables/{small}/preview", params={"tensor": "cos"}).json()
        assert 0 < len(default["data"]) <= 1000


def test_ui_page_and_assets_are_served(client: httpx.Client) -> None:
    page = client.get("/ui")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    for name, media in (("main.js", "text/javascript"), ("explorer.css", "text/css")):
        assert f'src="ui/{name}"' in page.text or f'href="ui/{name}"' in page.text
        asset = client.get(f"/ui/{name}")
        assert asset.status_code == 200
        assert asset.headers["content-type"].startswith(media)
        again = client.get(f"/ui/{name}", headers={"If-None-Match": asset.headers["ETag"]})
        assert again.status_code == 304
    # nothing but the page's own files: no other name, no path out of the package
    for path in ("/ui/index.htm", "/ui/..%2F__init__.py", "/ui/main.js.map"):
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.json()["error_type"] == "not_found"
    assert "/ui" not in client.get("/openapi.json").json()["paths"]


def test_ui_is_open_and_its_api_calls_need_the_key() -> None:
    with start_server(api_keys=["ui-key-0123456789"]) as srv, srv.client() as c:
        assert c.get("/ui").status_code == 200
        assert c.get("/ui/main.js").status_code == 200
        key = "0" * 64
        assert c.get(f"/v1/tables/{key}/preview").status_code == 401
        authed = c.get(
            f"/v1/tables/{key}/preview", headers={"Authorization": "Bearer ui-key-0123456789"}
        )
        assert authed.status_code == 404


def test_ui_modules_are_small_and_all_served(client: httpx.Client) -> None:
    """The explorer's native ES modules: none over 400 lines (issue 38), and every module one
    imports is a file `/ui/{name}` serves as JavaScript."""
    ui = Path(posenc.__file__).parent / "ui"
    modules = sorted(ui.glob("*.js"))
    assert "main.js" in {m.name for m in modules}
    for module in modules:
        text = module.read_text()
        assert len(text.splitlines()) <= 400, module.name
        for name in re.findall(r'from "\./([\w.-]+\.js)"', text):
            assert (ui / name).is_file(), (module.name, name)
            served = client.get(f"/ui/{name}")
            assert served.status_code == 200, name
            assert served.headers["content-type"].startswith("text/javascript")
