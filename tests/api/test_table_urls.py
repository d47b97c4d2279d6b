"""Table URLs any replica answers (issue 35): `/v1/tables/{key}.{spec}`, the canonical spec in the
URL (base64url of its deflated canonical JSON), checked against the key.

The URL handed out by one server (`Content-Location`, `/v1/resolve`'s and the presets' `url`) is
answered by a fresh server that never saw the spec, with the same bytes, ETag and `Repr-Digest`;
a spec cannot pose as another key; a malformed URL is refused (4xx, the error contract naming the
URL's part) before anything is computed; and every spec the server resolves for the installed
transformers' model types (the RoPE and non-rotary sweeps' configs) fits in, and round-trips
through, its URL. The two-process and restart test is tests/deploy/test_replicas.py.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from posenc.presets import builtin_presets
from tests.api.wire import decode, spec_token, table_url_parts
from tests.conftest import ServerHandle, start_server
from tests.encodings.hf_config import nonrotary_sweep
from tests.encodings.hf_config import rope_sweep as sweep

SPECS: dict[str, dict[str, Any]] = {
    "rope_llama3": {
        "kind": "rope",
        "head_dim": 64,
        "rope_theta": 500000.0,
        "max_positions": 512,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    "alibi": {"kind": "alibi", "num_heads": 12},
    "sinusoidal": {"kind": "sinusoidal", "dim": 32, "max_positions": 128},
    "t5_bias": {"kind": "t5_bias", "num_buckets": 32, "max_distance": 128, "query_length": 16},
}

URL_LIMIT = 2048
"""Characters of a handed-out table URL at most, for every served spec: well inside the
smallest request-line limits on the way (nginx's default 8 KiB buffer, browsers, CDNs)."""


@pytest.fixture(scope="module")
def fresh() -> Iterator[ServerHandle]:
    """A second server (a replica) that resolved nothing: its key index holds the presets only."""
    with start_server(
        max_response_bytes=1 << 40, in_flight_bytes=1 << 41, json_max_elements=100_000
    ) as handle:
        yield handle


@pytest.fixture(scope="module")
def replica(fresh: ServerHandle) -> Iterator[httpx.Client]:
    with fresh.client() as c:
        yield c


def _etag(server: ServerHandle, key: str) -> str:
    """The default representation's ETag on `server` (`@device` off the CPU)."""
    return f'"{key}"' if server.device.type == "cpu" else f'"{key}@{server.device}"'


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize(
    "params",
    [{}, {"format": "npz"}, {"format": "json"}, {"format": "raw"}],
    ids=["safetensors", "npz", "json", "raw"],
)
def test_a_replica_that_never_saw_the_spec_answers_its_url(
    client: httpx.Client, replica: httpx.Client, name: str, params: dict[str, str]
) -> None:
    spec = SPECS[name]
    posted = client.post("/v1/tables", json=spec)
    assert posted.status_code == 200, posted.text
    key = posted.headers["x-posenc-key"]
    url = posted.headers["content-location"]
    assert table_url_parts(url)[0] == key
    if params.get("format") == "raw":
        params = {**params, "tensor": next(iter(decode(posted)))}
    here = client.get(url, params=params)
    there = replica.get(url, params=params)
    assert here.status_code == there.status_code == 200, there.text
    assert there.content == here.content
    for header in ("etag", "repr-digest", "content-type", "x-posenc-key", "cache-control"):
        assert there.headers[header] == here.headers[header], header
    assert there.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert there.headers["content-location"] == url  # every replica hands out the same URL
    if params.get("format") is None:
        assert there.content == posted.content  # the POST's bytes, too
    again = replica.get(url, params=params, headers={"If-None-Match": there.headers["etag"]})
    assert again.status_code == 304


def test_the_bare_key_stays_what_it_was(client: httpx.Client, fresh: ServerHandle) -> None:
    """`/v1/tables/{key}` keeps working where the key is known; a server that never resolved it
    answers 404 `unknown_key`, naming the URL form that any replica answers."""
    spec = {**SPECS["rope_llama3"], "max_positions": 96}
    posted = client.post("/v1/tables", json=spec)
    key = posted.headers["x-posenc-key"]
    assert client.get(f"/v1/tables/{key}").content == posted.content
    with fresh.client() as replica:
        unknown = replica.get(f"/v1/tables/{key}")
        assert unknown.status_code == 404
        assert unknown.json()["error_type"] == "unknown_key"
        assert "/v1/tables/{key}.{spec}" in unknown.json()["error"]
        assert replica.get(posted.headers["content-location"]).content == posted.content
        assert replica.get(f"/v1/tables/{key}").content == posted.content  # known now


def test_preview_by_url_on_a_replica(client: httpx.Client, replica: httpx.Client) -> None:
    spec = {**SPECS["rope_llama3"], "max_positions": 300}
    url = client.post("/v1/tables", json=spec).headers["content-location"]
    params = {"tensor": "cos", "max_points": 256}
    here = client.get(f"{url}/preview", params=params)
    there = replica.get(f"{url}/preview", params=params)
    assert here.status_code == there.status_code == 200, there.text
    assert there.json() == here.json()


def test_any_spelling_of_the_spec_with_the_key_is_accepted(
    client: httpx.Client, replica: httpx.Client
) -> None:
    """A client may build the URL from the spec it has (its own spelling, defaults left out):
    the server checks the canonical form's key, and answers the canonical URL's bytes."""
    spec = SPECS["sinusoidal"]
    posted = client.post("/v1/tables", json=spec)
    key = posted.headers["x-posenc-key"]
    _, canonical = table_url_parts(posted.headers["content-location"])
    assert canonical != spec  # the canonical form fills defaults in
    mine = replica.get(f"/v1/tables/{key}.{spec_token(spec)}")
    assert mine.status_code == 200, mine.text
    assert mine.content == posted.content
    assert mine.headers["etag"] == posted.headers["etag"]
    assert mine.headers["content-location"] == posted.headers["content-location"]


def test_a_spec_cannot_pose_as_another_key(client: httpx.Client, replica: httpx.Client) -> None:
    """The spec of one table under another table's key: 400 `key_mismatch` naming `spec`, on a
    server that knows the key and on one that does not."""
    alibi = client.post("/v1/tables", json=SPECS["alibi"])
    other = client.post("/v1/tables", json={**SPECS["alibi"], "num_heads": 16})
    key = alibi.headers["x-posenc-key"]
    _, forged_spec = table_url_parts(other.headers["content-location"])
    forged = f"/v1/tables/{key}.{spec_token(forged_spec)}"
    for c in (client, replica):
        for path in (forged, f"{forged}/preview?tensor=slopes"):
            r = c.get(path)
            assert r.status_code == 400, r.text
            body = r.json()
            assert body["error_type"] == "key_mismatch"
            assert body["detail"][0]["field"] == "spec"
            assert body["detail"][0]["value"] == other.headers["x-posenc-key"]


def _token(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _packed(value: Any) -> str:
    return _token(zlib.compress(json.dumps(value).encode()))


KEY = "0123456789abcdef" * 4
BOMB = zlib.compress(b" " * (1 << 20), 9)
GOOD = zlib.compress(json.dumps(SPECS["alibi"]).encode(), 9)

MALFORMED: dict[str, tuple[str, int, str, str]] = {
    # name: (path segment, status, error_type, field)
    "too_long": (f"{KEY}.{'A' * 4097}", 414, "invalid_table_url", "spec"),
    "bad_key": (f"{KEY.upper()}.{_token(GOOD)}", 400, "invalid_table_url", "key"),
    "short_key": (f"{KEY[:12]}.{_token(GOOD)}", 400, "invalid_table_url", "key"),
    "not_base64url": (f"{KEY}.ab+c", 400, "invalid_table_url", "spec"),
    "bad_padding": (f"{KEY}.A", 400, "invalid_table_url", "spec"),
    "not_zlib": (f"{KEY}.{_token(b'{}not zlib')}", 400, "invalid_table_url", "spec"),
    "deflate_bomb": (f"{KEY}.{_token(BOMB)}", 400, "invalid_table_url", "spec"),
    "truncated": (f"{KEY}.{_token(GOOD[:-5])}", 400, "invalid_table_url", "spec"),
    "trailing_bytes": (f"{KEY}.{_token(GOOD + b'xx')}", 400, "invalid_table_url", "spec"),
    "not_json": (f"{KEY}.{_token(zlib.compress(b'nope'))}", 400, "invalid_table_url", "spec"),
    "not_object": (f"{KEY}.{_token(zlib.compress(b'[1, 2]'))}", 400, "invalid_table_url", "spec"),
    "invalid_spec": (
        f"{KEY}.{_packed({'kind': 'alibi', 'num_heads': 0})}",
        422,
        "invalid_spec",
        "num_heads",
    ),
    "hf_config": (
        f"{KEY}.{_packed({'hf_config': {'model_type': 'llama'}})}",
        422,
        "invalid_spec",
        "",
    ),
    "good_spec_wrong_key": (f"{KEY}.{_token(GOOD)}", 400, "key_mismatch", "spec"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
@pytest.mark.parametrize("suffix", ["", "/preview"])
def test_malformed_urls_are_refused_naming_the_part(
    replica: httpx.Client, name: str, suffix: str
) -> None:
    segment, status, error_type, field = MALFORMED[name]
    r = replica.get(f"/v1/tables/{segment}{suffix}")
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error_type"] == error_type
    assert isinstance(body["error"], str)
    assert body["error"]
    if field:
        assert field in {d["field"] for d in body["detail"]}
    assert len(r.content) < 4096  # an error never echoes the whole URL


def _resolve_cases() -> list[tuple[str, dict[str, Any]]]:
    """Every config the RoPE and non-rotary sweeps resolve: each model type of the installed
    transformers with a rotary embedding (its class defaults and YaRN variant, the released
    checkpoints' RoPE facts; v5 form) and each non-rotary family's model types."""
    cases = []
    for model_type, variant, form in sweep.sweep_cases():
        if form != "v5":
            continue
        try:
            cases.append((f"{model_type}/{variant}", sweep.case_config(model_type, variant, form)))
        except sweep.UnbuildableError:
            continue
    for name, (model_type, extra) in sorted(nonrotary_sweep.cases().items()):
        cfg = nonrotary_sweep.hf_config(model_type, extra)
        cases.append((f"nonrotary/{name}", cfg.to_dict()))
    return cases


@pytest.mark.slow
def test_every_resolved_spec_round_trips_in_its_url(
    client: httpx.Client, fresh: ServerHandle, replica: httpx.Client
) -> None:
    """For every config the sweeps resolve and every preset: each handed-out URL carries the
    answer's canonical spec and key, stays under `URL_LIMIT`, and a replica that never saw the
    spec decodes and verifies it (a 304 to the table's ETag: nothing computed)."""
    entries: list[dict[str, Any]] = []
    resolved = 0
    for _, config in _resolve_cases():
        try:
            body = json.dumps(config, allow_nan=False)
        except ValueError:  # a default of inf (a config.json cannot carry it)
            continue
        r = client.post("/v1/resolve", content=body, headers={"Content-Type": "application/json"})
        if r.status_code != 200:
            continue
        resolved += 1
        entries += r.json()["specs"]
    for preset in builtin_presets():
        entries += client.get(f"/v1/presets/{preset}").json()["parts"]
    assert resolved > 100
    seen: set[str] = set()
    for entry in entries:
        url = entry["url"]
        if url in seen:
            continue
        seen.add(url)
        assert table_url_parts(url) == (entry["key"], entry["spec"]), url
        assert len(url) <= URL_LIMIT, (entry["key"], len(url))
        r = replica.get(url, headers={"If-None-Match": _etag(fresh, entry["key"])})
        assert r.status_code == 304, (entry.get("name"), r.text)
    assert len(seen) > 100
