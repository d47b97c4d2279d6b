"""/v2 through tritonclient.http.aio (aiohttp): health, metadata, infer for every model with
binary and JSON outputs equal to the tables, concurrent requests, errors with our message."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.http as http
import tritonclient.http.aio as aio
from tritonclient.utils import InferenceServerException

from tests.api.v2client import as_torch, assert_equal, make_input, outputs, spec_param, table, url
from tests.conftest import ServerHandle

# model -> (parameters, inputs, outputs, expected(table) -> {output: tensor})
Case = tuple[dict[str, Any], list[tuple[str, np.ndarray[Any, Any]]], list[str], Any]
Q, K = np.array([3, 9], np.int64), np.array([0, 4, 9], np.int64)
W = np.arange(64, dtype=np.float32).reshape(32, 2) / 64
CASES: dict[str, Case] = {
    "rope": (
        {"head_dim": 32, "max_positions": 64},
        [("position_ids", np.array([[1, 63], [2, 0]], np.int64))],
        ["cos", "sin"],
        lambda t: {n: t[n][torch.tensor([[1, 63], [2, 0]])] for n in ("cos", "sin")},
    ),
    "alibi": (
        {"num_heads": 4, "bias": "symmetric", "query_length": 10, "key_length": 10},
        [("query_positions", Q), ("key_positions", K)],
        ["bias", "slopes"],
        lambda t: {"bias": t["bias"][:, Q][:, :, K], "slopes": t["slopes"]},
    ),
    "sinusoidal": (
        {"dim": 16, "max_positions": 32},
        [("position_ids", np.array([31, 0, 5], np.int64))],
        ["embedding"],
        lambda t: {"embedding": t["embedding"][torch.tensor([31, 0, 5])]},
    ),
    "sinusoidal_2d": (
        {"style": "timm", "dim": 16, "grid_height": 3, "grid_width": 5},
        [],
        ["embedding"],
        lambda t: {"embedding": t["embedding"]},
    ),
    "t5_bias": (
        {"query_length": 10, "key_length": 10, "relative_attention_bias": W.tolist()},
        [("query_positions", Q), ("key_positions", K)],
        ["buckets", "bias"],
        lambda t: {"buckets": t["buckets"][Q][:, K], "bias": t["bias"][:, Q][:, :, K]},
    ),
}


async def _infer_all(base: str, binary: bool) -> dict[str, dict[str, torch.Tensor]]:
    async with aio.InferenceServerClient(base) as client:
        assert await client.is_server_live()
        assert await client.is_server_ready()
        assert (await client.get_server_metadata())["name"] == "posenc"
        results: dict[str, dict[str, torch.Tensor]] = {}
        for model, (params, inputs, names, _) in CASES.items():
            assert await client.is_model_ready(model)
            assert (await client.get_model_metadata(model))["name"] == model
            assert (await client.get_model_config(model))["name"] == model
            result = await client.infer(
                model,
                [make_input(n, a, binary) for n, a in inputs],
                outputs=outputs(names, binary),
                parameters=spec_param(params),
                request_id=f"aio-{model}",
            )
            assert result.get_response()["id"] == f"aio-{model}"
            results[model] = {n: as_torch(result, n) for n in names}
        return results


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_aio_every_model(server: ServerHandle, binary: bool) -> None:
    results = asyncio.run(_infer_all(url(server), binary))
    for model, (params, _, names, expected) in CASES.items():
        want = expected(table(server, {"kind": model, **params}))
        for name in names:
            assert_equal(results[model][name], want[name])


async def _concurrent(base: str) -> list[http.InferResult]:
    async with aio.InferenceServerClient(base, conn_limit=16) as client:
        params = {"head_dim": 64, "max_positions": 2048, "rope_theta": 123456.0}
        calls = [
            client.infer(
                "rope",
                [make_input("position_ids", np.array([i, 2047 - i], np.int64))],
                parameters=params,
            )
            for i in range(32)
        ]
        return list(await asyncio.gather(*calls))


def test_aio_concurrent_decode_steps(server: ServerHandle) -> None:
    results = asyncio.run(_concurrent(url(server)))
    want = table(server, {"kind": "rope", "head_dim": 64, "max_positions": 2048,
                          "rope_theta": 123456.0})  # fmt: skip
    sources = [r.get_response()["parameters"]["posenc_source"] for r in results]
    assert sources.count("miss") == 1, sources  # one computation however many ask at once
    for i, result in enumerate(results):
        assert_equal(as_torch(result, "cos"), want["cos"][torch.tensor([i, 2047 - i])])
    with server.client() as client:
        metrics = client.get("/metrics").text
    assert 'posenc_v2_infer_total{model="rope",source="miss"}' in metrics
    assert 'route="/v2/models/{model}/infer"' in metrics


async def _errors(base: str) -> list[InferenceServerException]:
    errors = []
    async with aio.InferenceServerClient(base) as client:
        pos = [make_input("position_ids", np.array([1], np.int64))]
        for call in (
            client.infer("nope", pos),
            client.infer("rope", pos, parameters={"head_dim": 3, "max_positions": 4}),
            client.get_model_metadata("nope"),
        ):
            try:
                await call
            except InferenceServerException as exc:
                errors.append(exc)
    return errors


def test_aio_errors_carry_our_message(server: ServerHandle) -> None:
    not_found, bad_spec, no_meta = asyncio.run(_errors(url(server)))
    assert not_found.status() == "404"
    assert "unknown model 'nope'" in not_found.message()
    assert bad_spec.status() == "400"
    assert "invalid rope spec" in bad_spec.message()
    assert no_meta.status() == "404"
