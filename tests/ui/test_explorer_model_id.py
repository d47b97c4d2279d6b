"""The explorer's model-id field (issues 33 and 34) in Debian's Chromium against the real server,
whose Hugging Face cache holds the real configs of tests/data/configs (`tests.hub`, offline): an
id (and `@revision`) shows the tables /v1/resolve gives for the same config.json, the view's
permalink carries the id and reopens it, and a malformed or uncached id is refused beside the
form, naming the field."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.conftest import ServerHandle
from tests.hub import HubEnv, model_files
from tests.ui.conftest import Watched
from tests.ui.test_explorer import no_error_shown

pytestmark = pytest.mark.xdist_group("ui")

LLAMA = "meta-llama/Llama-3.1-8B"


def by_id(w: Watched, url: str, model_id: str, max_positions: int | None = None) -> None:
    w.page.goto(f"{url}/ui")
    w.page.fill("input[name=model_id]", model_id)
    if max_positions:
        w.page.fill("input[name=max_positions]", str(max_positions))
    w.page.locator("#config-form button[type=submit]").click()
    w.idle()


def card_keys(w: Watched) -> list[tuple[str | None, str | None]]:
    cards = w.page.locator(".card")
    return [
        (cards.nth(i).get_attribute("data-name"), cards.nth(i).get_attribute("data-key"))
        for i in range(cards.count())
    ]


def test_model_id_tables_and_permalink(
    server: ServerHandle, client: httpx.Client, watched: Watched, hub_env: HubEnv
) -> None:
    page = watched.page
    config = json.loads(model_files()["google/gemma-3-4b-it"]["main"].read_text())
    expected = client.post("/v1/resolve", json={"hf_config": config, "max_positions": 2048})
    assert expected.status_code == 200
    by_id(watched, server.url, "google/gemma-3-4b-it", 2048)
    no_error_shown(watched)
    assert card_keys(watched) == [(s["name"], s["key"]) for s in expected.json()["specs"]]
    commit = hub_env.cache.commits["google/gemma-3-4b-it"]["main"]
    assert f"google/gemma-3-4b-it at {commit[:12]}" in page.locator("#tables-intro").inner_text()
    assert page.locator("#plot-area canvas").count() >= 1
    view = parse_qs(urlsplit(page.url).fragment)
    assert view["model_id"] == ["google/gemma-3-4b-it"]
    assert view["max_positions"] == ["2048"]
    assert "config" not in view
    assert "preset" not in view
    page.locator(".plot-button").nth(1).click()
    watched.idle()
    link = page.url
    page.goto("about:blank")
    page.goto(link)
    watched.idle()
    no_error_shown(watched)
    assert page.locator("input[name=model_id]").input_value() == "google/gemma-3-4b-it"
    assert card_keys(watched) == [(s["name"], s["key"]) for s in expected.json()["specs"]]
    selected = page.locator(".card").nth(1).get_attribute("data-name")
    assert parse_qs(urlsplit(page.url).fragment)["table"] == [selected]
    # a revision: its own snapshot's tables, in the link as typed
    v5 = json.loads(model_files()[LLAMA]["v5"].read_text())
    by_id(watched, server.url, f"{LLAMA}@v5")
    no_error_shown(watched)
    specs = client.post("/v1/resolve", json={"hf_config": v5}).json()["specs"]
    assert card_keys(watched) == [(s["name"], s["key"]) for s in specs]
    assert parse_qs(urlsplit(page.url).fragment)["model_id"] == [f"{LLAMA}@v5"]
    # a preset afterwards drops the id from the link
    page.locator("select[name=preset] option[value='llama-3.1-8b']").wait_for(state="attached")
    page.select_option("select[name=preset]", "llama-3.1-8b")
    page.locator("#preset-form button").click()
    watched.idle()
    assert "model_id" not in parse_qs(urlsplit(page.url).fragment)
    assert watched.problems == []


def test_model_id_errors_beside_the_form(
    server: ServerHandle, watched: Watched, hub_env: HubEnv
) -> None:
    """A malformed id (422 invalid_model_id), one the server's offline cache lacks (404
    model_not_cached), and an id beside a pasted config: each said beside the form, naming
    `model_id`, with no table left on the page."""
    page = watched.page
    error = page.locator("#config-form + .error-near[role=alert]")
    by_id(watched, server.url, "llama")
    assert error.count() == 1
    assert "model_id" in error.inner_text()
    assert "ORG/NAME[@REVISION]" in error.inner_text()
    by_id(watched, server.url, "acme/not-cached")
    assert "acme/not-cached" in error.inner_text()
    assert "offline" in error.inner_text()
    assert page.locator(".card").count() == 0
    assert page.locator("#error").is_hidden()
    page.fill("textarea[name=config]", '{"model_type": "llama"}')
    page.locator("#config-form button[type=submit]").click()
    watched.idle()
    assert "not both" in error.inner_text()
    # the two refusals (and Chromium's console line for each), nothing else
    answers = [p for p in watched.problems if not p.startswith("console error: Failed to load")]
    assert sorted(p.split(":")[0] for p in answers) == ["404", "422"], watched.problems
    assert len(watched.problems) == 4, watched.problems
