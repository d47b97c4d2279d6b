"""Prepared answers (api/serving/prepared.py): a repeated cache hit answered from headers and a
body built once is the answer the slow path gives.

Two real servers on loopback, one with prepared answers (the default) and one without
(`prepared_answers=False`: every request through `serve_table`), get the same requests three
times (the first builds, the later ones are answered from what was prepared); status, headers
(but `date`) and bodies must be equal each time, and the prepared server must have kept the
shapes it should (so the comparison is of the fast path, not of the slow one twice). Conditional
and range requests after a prepared answer, eviction, a key the index forgot, HEAD, the cache's
hit counter and the in-flight budget are compared the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ServerHandle, start_server

ROPE = {"kind": "rope", "head_dim": 64, "max_positions": 64}
ALIBI = {"kind": "alibi", "num_heads": 12}


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[ServerHandle, ServerHandle]]:
    with (
        start_server(device="cpu") as fast,
        start_server(device="cpu", prepared_answers=False) as slow,
    ):
        yield fast, slow


def _url(server: ServerHandle) -> tuple[str, str]:
    """(content key, stable URL) of ROPE on `server` (its keys spelt in another order than the
    requests below: a shape of its own)."""
    with server.client() as c:
        r = c.post("/v1/tables", json=dict(reversed(ROPE.items())))
    assert r.status_code == 200, r.text
    return r.headers["x-posenc-key"], r.headers["content-location"]


def _exchange(
    server: ServerHandle, method: str, path: str, kw: dict[str, Any]
) -> tuple[int, list[tuple[str, str]], bytes]:
    key, url = _url(server)
    kw = dict(kw)
    if "headers" in kw:
        kw["headers"] = {k: v.replace("{key}", key) for k, v in kw["headers"].items()}
    with server.client() as c:
        r = c.request(method, path.replace("{key}", key).replace("{url}", url), **kw)
    headers = sorted((k, v) for k, v in r.headers.items() if k != "date")
    return r.status_code, headers, r.content


# (method, path, request keywords, whether the answer is prepared)
REQUESTS: list[tuple[str, str, dict[str, Any], bool]] = [
    ("GET", "/v1/tables/{key}", {}, True),
    ("GET", "{url}", {}, True),
    ("GET", "/v1/tables/{key}?format=json", {}, True),
    ("GET", "/v1/tables/{key}?format=raw&tensor=cos", {}, True),
    ("GET", "/v1/tables/{key}?format=npy&tensor=sin", {}, True),
    ("GET", "/v1/tables/{key}", {"headers": {"Accept": "application/json"}}, True),
    ("GET", "/v1/tables/{key}", {"headers": {"Accept": "application/x-npz"}}, True),
    ("GET", "/v1/tables/{key}?device=cpu", {}, True),
    ("HEAD", "/v1/tables/{key}", {}, True),
    ("HEAD", "{url}?format=npz", {}, True),
    ("POST", "/v1/tables", {"json": ROPE}, True),
    ("POST", "/v1/tables?format=json", {"json": ROPE}, True),
    ("POST", "/v1/tables", {"json": ALIBI}, True),
    ("POST", "/v1/tables", {"json": ALIBI, "headers": {"Accept": "application/json"}}, True),
    # per request: row slices, conditionals, ranges, errors
    ("GET", "/v1/tables/{key}?format=raw&tensor=sin&rows=2:9", {}, False),
    ("GET", "/v1/tables/{key}", {"headers": {"If-None-Match": '"{key}"'}}, False),
    ("GET", "/v1/tables/{key}", {"headers": {"If-None-Match": '"other"'}}, False),
    ("GET", "/v1/tables/{key}?format=raw&tensor=cos", {"headers": {"Range": "bytes=8-99"}}, False),
    ("GET", "/v1/tables/{key}?format=raw&tensor=cos", {"headers": {"Range": "bytes=9999-"}}, False),
    ("GET", "/v1/tables/{key}?format=nope", {}, False),
    ("GET", "/v1/tables/{key}?device=cuda", {}, False),
    ("POST", "/v1/tables", {"json": {**ROPE, "head_dim": -2}}, False),
    ("POST", "/v1/tables", {"content": b"{not json"}, False),
]


@pytest.mark.parametrize(("method", "path", "kw", "prepared"), REQUESTS, ids=lambda v: str(v)[:50])
def test_prepared_answers_are_the_slow_paths(
    servers: tuple[ServerHandle, ServerHandle],
    method: str,
    path: str,
    kw: dict[str, Any],
    prepared: bool,
) -> None:
    fast, slow = servers
    fast.state.prepared._shapes.clear()
    _url(fast)
    before = set(fast.state.prepared._shapes)
    for _ in range(3):
        got = _exchange(fast, method, path, kw)
        assert got == _exchange(slow, method, path, kw)
    assert bool(set(fast.state.prepared._shapes) - before) == prepared
    assert len(slow.state.prepared) == 0
    if prepared:
        assert dict(got[1])["x-posenc-cache"] == "hit"


def test_a_prepared_hit_counts_a_hit_and_holds_no_charge(
    servers: tuple[ServerHandle, ServerHandle],
) -> None:
    for server in servers:
        key, _ = _url(server)
        cache = server.state.require_cache()
        with server.client() as c:
            c.get(f"/v1/tables/{key}")
            hits = cache.stats.hits
            for _ in range(5):
                assert c.get(f"/v1/tables/{key}").headers["x-posenc-cache"] == "hit"
        assert cache.stats.hits == hits + 5
        budget = server.state.budget
        assert budget is not None
        assert budget.held == 0


def _sequence(server: ServerHandle, first: dict[str, Any], second: dict[str, Any]) -> list[Any]:
    """Prepare `first`'s answer, evict it by computing `second`, ask for `first` again."""
    out = []
    with server.client() as c:
        for body in (first, first, first, second, first):
            r = c.post("/v1/tables", json=body)
            key = r.headers["x-posenc-key"]
            g = c.get(f"/v1/tables/{key}")
            out.append((r.status_code, r.headers["x-posenc-cache"], r.content == g.content))
            out.append((g.status_code, g.headers["x-posenc-cache"], len(g.content)))
    return out


def test_an_evicted_entry_takes_its_prepared_answers_with_it() -> None:
    """A cache holding one small table: the evicted table is computed again (`miss`), not
    answered from what was prepared from it."""
    a = {"kind": "rope", "head_dim": 64, "max_positions": 100}
    b = {"kind": "rope", "head_dim": 64, "max_positions": 101}
    answers = []
    for prepared in (True, False):
        with start_server(device="cpu", cache_bytes=150_000, prepared_answers=prepared) as s:
            answers.append(_sequence(s, a, b))
    assert answers[0] == answers[1]
    assert answers[0][-2][1] == "miss"


def test_a_bare_key_the_index_forgot_is_refused_as_before() -> None:
    """`GET /v1/tables/{key}` of a key the index no longer holds answers 404 `unknown_key`
    though its table is resident and its answer prepared; the URL carrying the spec still
    answers (and the key is remembered again)."""
    a = {"kind": "rope", "head_dim": 64, "max_positions": 100}
    b = {"kind": "rope", "head_dim": 64, "max_positions": 101}
    results = []
    for prepared in (True, False):
        with (
            start_server(device="cpu", known_keys=1, prepared_answers=prepared) as s,
            s.client() as c,
        ):
            r = c.post("/v1/tables", json=a)
            key, url = r.headers["x-posenc-key"], r.headers["content-location"]
            seen = [c.get(f"/v1/tables/{key}").status_code for _ in range(2)]
            seen += [c.get(url).status_code for _ in range(2)]
            c.post("/v1/tables", json=b)  # the index forgets a's key
            gone = c.get(f"/v1/tables/{key}")
            seen += [gone.status_code, gone.json()["error_type"]]
            seen += [c.get(url).status_code, c.get(f"/v1/tables/{key}").status_code]
            results.append(seen)
    assert results[0] == results[1] == [200, 200, 200, 200, 404, "unknown_key", 200, 200]


def test_headers_added_by_outer_middlewares_are_added_once() -> None:
    """CORS adds its headers to the start message's list in place: a prepared answer's own
    lines are never changed by it (the tenth answer's headers are the second's)."""
    origin = "https://a.example"
    with start_server(device="cpu", cors_origins=[origin]) as s, s.client() as c:
        key = c.post("/v1/tables", json=ROPE).headers["x-posenc-key"]
        answers = [c.get(f"/v1/tables/{key}", headers={"Origin": origin}) for _ in range(10)]
    assert answers[1].headers["access-control-allow-origin"] == origin
    lists = [sorted((k, v) for k, v in r.headers.multi_items() if k != "date") for r in answers]
    assert all(headers == lists[1] for headers in lists[1:])
    assert len(s.state.prepared) >= 1
