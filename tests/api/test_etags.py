"""Strong ETags per representation: `"<key>"` for the whole table as safetensors (what clients
revalidate), a distinct, stable tag for every other format, tensor and row range; If-None-Match
compared against the representation being served; `Vary: Accept` when Accept chose the format."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from posenc.api.serving.formats import negotiate
from posenc.api.serving.selection import parse_rows, select
from posenc.api.serving.table import representation_etag
from posenc.encodings import parse_spec

SPEC = {"kind": "rope", "head_dim": 32, "max_positions": 40, "rope_theta": 4321.0}
ONE_TENSOR = {"kind": "sinusoidal", "dim": 16, "max_positions": 30}


@pytest.fixture(scope="module")
def key(client: httpx.Client) -> str:
    r = client.post("/v1/tables", json=SPEC)
    assert r.status_code == 200
    return str(r.headers["x-posenc-key"])


def etag(client: httpx.Client, key: str, **params: Any) -> str:
    r = client.get(f"/v1/tables/{key}", params=params)
    assert r.status_code == 200, r.text
    return str(r.headers["etag"])


def test_default_representation_keeps_the_key(
    etag_for: Callable[[str], str], client: httpx.Client, key: str
) -> None:
    plain = etag_for(key)
    assert etag(client, key) == plain
    assert etag(client, key, format="safetensors") == plain
    assert etag(client, key, rows="0:40") == plain  # all rows is the whole table
    accepted = client.get(f"/v1/tables/{key}", headers={"Accept": "application/vnd.safetensors"})
    assert accepted.headers["etag"] == plain
    posted = client.post("/v1/tables", json=SPEC)
    assert posted.headers["etag"] == plain


def test_other_representations_have_distinct_stable_tags(
    etag_for: Callable[[str], str], client: httpx.Client, key: str
) -> None:
    variants: dict[str, dict[str, Any]] = {
        f"{key}.npz": {"format": "npz"},
        f"{key}.json": {"format": "json"},
        f"{key}.safetensors.cos": {"tensor": "cos"},
        f"{key}.npz.sin": {"format": "npz", "tensor": "sin"},
        f"{key}.npy.cos": {"format": "npy", "tensor": "cos"},
        f"{key}.raw.cos": {"format": "raw", "tensor": "cos"},
        f"{key}.raw.inv_freq": {"format": "raw", "tensor": "inv_freq"},
        f"{key}.safetensors.0-8": {"rows": "0:8"},
        f"{key}.safetensors.8-40": {"rows": "8:"},
        f"{key}.raw.cos.3-7": {"format": "raw", "tensor": "cos", "rows": "3:7"},
        f"{key}.json.sin.0-2": {"format": "json", "tensor": "sin", "rows": ":2"},
    }
    for want, params in variants.items():
        assert etag(client, key, **params) == etag_for(want), params
        assert etag(client, key, **params) == etag_for(want), params  # stable (a cache hit)
    posted = client.post("/v1/tables", json=SPEC, params={"format": "npz"})
    assert posted.headers["etag"] == etag_for(f"{key}.npz")


def test_the_tensor_is_named_only_when_it_is_not_the_whole_table(
    etag_for: Callable[[str], str], client: httpx.Client
) -> None:
    r = client.post("/v1/tables", json=ONE_TENSOR, params={"format": "npy"})
    key = r.headers["x-posenc-key"]
    assert r.headers["etag"] == etag_for(f"{key}.npy")
    assert etag(client, key, format="npy", tensor="embedding") == etag_for(f"{key}.npy")
    assert etag(client, key, tensor="embedding") == etag_for(key)


def test_if_none_match_validates_only_the_representation_served(
    etag_for: Callable[[str], str], client: httpx.Client, key: str
) -> None:
    url = f"/v1/tables/{key}"
    npz = {"format": "npz"}
    raw = {"format": "raw", "tensor": "cos", "rows": "0:4"}
    # the default tag does not validate another format, nor the other way round
    assert client.get(url, params=npz, headers={"If-None-Match": etag_for(key)}).status_code == 200
    r = client.get(url, headers={"If-None-Match": etag_for(f"{key}.npz")})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/vnd.safetensors"
    for params, tag in (
        (npz, etag_for(f"{key}.npz")),
        (raw, etag_for(f"{key}.raw.cos.0-4")),
        ({}, etag_for(key)),
    ):
        for header in (tag, f"W/{tag}", f'"x", {tag}', "*"):
            r = client.get(url, params=params, headers={"If-None-Match": header})
            assert r.status_code == 304, (params, header)
            assert r.headers["etag"] == tag
            assert r.content == b""
    other_rows = client.get(url, params={**raw, "rows": "0:5"}, headers={"If-None-Match": tag})
    assert other_rows.status_code == 200


def test_accept_chooses_and_varies(
    etag_for: Callable[[str], str], client: httpx.Client, key: str
) -> None:
    url = f"/v1/tables/{key}"
    r = client.get(url, headers={"Accept": "application/x-npz"})
    assert r.headers["etag"] == etag_for(f"{key}.npz")
    assert r.headers["vary"] == "Accept"
    not_modified = client.get(
        url, headers={"Accept": "application/x-npz", "If-None-Match": etag_for(f"{key}.npz")}
    )
    assert not_modified.status_code == 304
    assert not_modified.headers["vary"] == "Accept"
    # the default was negotiated too (no format=): a shared cache must key it on Accept
    assert client.get(url).headers["vary"] == "Accept"
    # format= decides alone: Accept plays no part
    fixed = client.get(url, params={"format": "npz"}, headers={"Accept": "application/json"})
    assert fixed.headers["etag"] == etag_for(f"{key}.npz")
    assert "vary" not in fixed.headers


def test_preset_tables_use_the_same_tags(
    etag_for: Callable[[str], str], client: httpx.Client
) -> None:
    url = "/v1/presets/t5-base/encoder/table"
    whole = client.get(url)
    key = whole.headers["x-posenc-key"]
    assert whole.headers["etag"] == etag_for(key)
    rows = client.get(url, params={"rows": "0:4", "format": "npz"})
    assert rows.headers["etag"] == etag_for(f"{key}.npz.0-4")
    again = client.get(url, params={"rows": "0:4", "format": "npz"},
                       headers={"If-None-Match": rows.headers["etag"]})  # fmt: skip
    assert again.status_code == 304


def test_tables_built_off_the_cpu_name_their_device() -> None:
    # what a GPU replica sends (values may differ from the CPU reference by an ulp, and the
    # safetensors metadata names the device): never the CPU replica's tag
    spec = parse_spec(SPEC).canonical()
    outputs = spec.outputs()
    names = tuple(outputs)
    key = "k" * 64

    def tag(fmt: str | None, tensor: str | None, rows: str | None, device: str) -> str:
        f = negotiate(fmt, None)
        return representation_etag(
            key, f, select("rope", outputs, f, tensor, parse_rows(rows)), names, device
        )

    assert tag(None, None, None, "cpu") == f'"{key}"'
    assert tag(None, None, None, "cuda:0") == f'"{key}@cuda:0"'
    assert tag("raw", "cos", "3:7", "cuda:1") == f'"{key}.raw.cos.3-7@cuda:1"'
    assert tag("npz", None, None, "cuda:0") != tag("npz", None, None, "cpu")
