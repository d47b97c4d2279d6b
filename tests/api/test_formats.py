"""The format records (`serving/formats.py`) against a live server: every format is served by
`?format=` and by each of its media types and aliases in `Accept`, with its own media type, the
tensors it carries and its headers; every upload format is taken by `?format=`, by each of its
media types in `Content-Type` and by its magic bytes alone; the OpenAPI document lists exactly
the records' names and media types."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import save as safetensors_save

from posenc.api.serving.formats import FORMATS, UPLOADS, Format

SPEC = {"kind": "sinusoidal", "dim": 8, "max_positions": 6, "base": 321.0}
TABLE = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7


@pytest.fixture(scope="module")
def key(client: httpx.Client) -> str:
    r = client.post("/v1/tables", json=SPEC)
    assert r.status_code == 200
    return str(r.headers["x-posenc-key"])


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=list(FORMATS))
def test_every_format_by_name_and_by_each_media_type(
    client: httpx.Client, key: str, fmt: Format
) -> None:
    by_name = client.get(f"/v1/tables/{key}", params={"format": fmt.name})
    assert by_name.status_code == 200, by_name.text
    assert by_name.headers["content-type"] == fmt.media_type
    assert by_name.headers["content-disposition"].endswith(f'.{fmt.suffix}"')
    assert ("x-posenc-tensor" in by_name.headers) is fmt.single
    assert ("x-posenc-dtype" in by_name.headers) is (fmt.headers is not None)
    assert (by_name.headers.get("accept-ranges") == "bytes") is fmt.ranges
    for media in fmt.media_types:
        negotiated = client.get(f"/v1/tables/{key}", headers={"Accept": media})
        assert negotiated.status_code == 200, media
        assert negotiated.headers["content-type"] == fmt.media_type, media
        assert negotiated.headers["vary"] == "Accept"
        assert negotiated.content == by_name.content, media


def _upload_body(fmt: Format) -> bytes:
    if fmt.name == "npy":
        buf = io.BytesIO()
        np.save(buf, TABLE.numpy(), allow_pickle=False)
        return buf.getvalue()
    assert fmt.name == "safetensors", "a new upload format needs its body here"
    return safetensors_save({"table": TABLE})


@pytest.mark.parametrize("fmt", UPLOADS.values(), ids=list(UPLOADS))
def test_every_upload_format_by_name_media_type_and_magic(
    client: httpx.Client, fmt: Format
) -> None:
    body = _upload_body(fmt)
    keys = set()
    for params, headers in (
        ({"format": fmt.name}, {"Content-Type": "application/octet-stream"}),
        *(({}, {"Content-Type": media}) for media in fmt.media_types),
        ({}, {"Content-Type": "application/octet-stream"}),  # the magic bytes decide
    ):
        r = client.post("/v1/uploads", content=body, params=params, headers=headers)
        assert r.status_code == 201, (params, headers, r.text)
        assert r.json()["shape"] == [3, 4]
        keys.add(r.json()["table_key"])
    assert len(keys) == 1


def test_openapi_lists_the_records(client: httpx.Client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    table = paths["/v1/tables/{key}"]["get"]
    formats = next(p for p in table["parameters"] if p["name"] == "format")
    assert formats["schema"]["enum"] == list(FORMATS)
    assert set(table["responses"]["200"]["content"]) == {f.media_type for f in FORMATS.values()}
    ranged = {f.media_type for f in FORMATS.values() if f.ranges}
    assert ranged <= set(table["responses"]["206"]["content"])
    upload = paths["/v1/uploads"]["post"]
    fields = next(p for p in upload["parameters"] if p["name"] == "format")
    assert fields["schema"]["enum"] == sorted(UPLOADS)
    assert {f.media_type for f in UPLOADS.values()} <= set(upload["requestBody"]["content"])
