"""Which reference releases the tables are proven equal to, said by the server in three places:
`GET /v1/version`, the Open Inference Protocol server metadata (`GET /v2`, read by tritonclient)
and every safetensors table's metadata. All three are `posenc.verified.VERIFIED_AGAINST`, which
tests/requirements/test_lock.py ties to the lock."""

from __future__ import annotations

import httpx
import tritonclient.http as triton_http

import posenc
from posenc.verified import VERIFIED_AGAINST, verified_against_text
from tests.api.wire import safetensors_metadata
from tests.conftest import ServerHandle


def test_version_route(client: httpx.Client) -> None:
    r = client.get("/v1/version")
    assert r.status_code == 200
    assert r.json() == {"posenc": posenc.__version__, "verified_against": dict(VERIFIED_AGAINST)}
    assert r.json()["verified_against"]["transformers"]


def test_server_metadata_through_tritonclient(server: ServerHandle) -> None:
    with triton_http.InferenceServerClient(server.url.removeprefix("http://")) as triton:
        meta = triton.get_server_metadata()
    assert meta["verified_against"] == dict(VERIFIED_AGAINST)
    assert meta["name"] == "posenc"


def test_every_safetensors_table_names_them(client: httpx.Client) -> None:
    for spec in (
        {"kind": "rope", "head_dim": 8, "max_positions": 4},
        {"kind": "alibi", "num_heads": 4},
    ):
        r = client.post("/v1/tables", json=spec)
        assert r.status_code == 200
        assert safetensors_metadata(r.content)["verified_against"] == verified_against_text()
