"""Issue 34's "Done when", preset by preset: on Llama 3.1, Phi-3.5, Gemma 3, Qwen2.5-VL (its
released config: there is no preset), BLOOM, T5 and Whisper, in Debian's Chromium against the real
server, the points that hold for every model: every download link is named after the model, table
and tensor; the view's permalink reopens the same table; every heatmap pools (says so) when its
tensor is larger than a preview and draws every element otherwise; every colour bar over values
of both signs is symmetric about 0; every plot has its PNG and CSV export, named after model and
table; nothing on the page fails. The points particular to one model are tested beside it
(test_explorer.py, test_explorer_truth.py, test_explorer_sampled.py)."""

from __future__ import annotations

import math
import re

import httpx
import pytest

from tests.conftest import ServerHandle
from tests.ui.conftest import Watched
from tests.ui.test_explorer import no_error_shown, open_preset
from tests.ui.test_explorer_truth import resolve

pytestmark = pytest.mark.xdist_group("ui")

PREVIEW_POINTS = 65536
MODELS = [
    "llama-3.1-8b",
    "phi-3.5-mini",
    "gemma-3-1b",
    "qwen2.5-vl",
    "bloom-560m",
    "t5-base",
    "whisper-large-v3",
]
CAPTION = re.compile(r"^(\w+) \(([\d, ]+)\) (\w+)")


def safe(text: str) -> str:
    """A file name part as the page writes it (dom.js `safeName`)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def open_model(w: Watched, url: str, model: str) -> str:
    """Show the model's tables; its slug (what file names start with)."""
    if model == "qwen2.5-vl":
        from tests.encodings.hf_config.mrope_sweep import RELEASED

        resolve(w, url, RELEASED["Qwen/Qwen2.5-VL-7B-Instruct"], 1024)
        return "qwen2_5_vl"
    open_preset(w, url, model)
    return model


@pytest.mark.parametrize("model", MODELS)
def test_each_model_named_downloads_permalink_pooled_heatmaps_centred_scales_exports(
    server: ServerHandle, client: httpx.Client, watched: Watched, model: str
) -> None:
    page = watched.page
    slug = open_model(watched, server.url, model)
    no_error_shown(watched)
    cards = page.locator(".card")
    assert cards.count() >= 1
    for i in range(cards.count()):
        card = cards.nth(i)
        table = safe(card.get_attribute("data-name") or "")
        links = card.locator(".downloads a")
        assert links.count() >= 1, card.inner_text()
        for j in range(links.count()):
            name = links.nth(j).get_attribute("download") or ""
            assert re.fullmatch(rf"{re.escape(slug)}_{re.escape(table)}(_\w+)?\.\w+", name), name

    # the selected table's plots: every heatmap pools when its tensor is over a preview
    plots = page.locator("#plot-area")
    plotted = page.locator(".card.selected").get_attribute("data-name")
    figures = plots.locator("figure:has(canvas[data-scale])")
    previews = 0
    for i in range(figures.count()):
        caption = figures.nth(i).locator("figcaption").inner_text()
        found = CAPTION.match(caption)
        if not found:  # a heatmap of a difference or a check: not a table's preview
            continue
        previews += 1
        size = math.prod(int(n) for n in found.group(2).split(","))
        if size > PREVIEW_POINTS:
            assert "each pixel is the mean of a block of" in caption, caption
        else:
            assert "every element" in caption, caption
    assert previews >= 1
    # colour bars over both signs read 0 at their middle, symmetric
    for canvas in plots.locator("canvas[data-scale]").all():
        lo, mid, hi = (float(v) for v in (canvas.get_attribute("data-scale") or "").split(","))
        if lo < 0 < hi:
            assert (mid, lo) == (0.0, -hi)
    # every plot exports PNG and CSV, named after the model and the table
    exported = plots.locator("figure:has(button[data-export=csv])")
    assert exported.count() >= 1
    with page.expect_download() as download:
        exported.first.locator("button[data-export=csv]").click()
    assert download.value.suggested_filename.startswith(f"{slug}_{safe(plotted or '')}_")
    assert download.value.suggested_filename.endswith(".csv")
    for figure in exported.all():
        assert figure.locator("button[data-export=png]").count() == 1

    # the permalink reopens the same table of the same model
    link = page.url
    assert "#" in link
    page.goto("about:blank")
    page.goto(link)
    watched.idle()
    no_error_shown(watched)
    assert page.locator(".card.selected").get_attribute("data-name") == plotted
    assert page.locator("#plot-area").inner_text().startswith(f"Plots of {plotted}")
    assert watched.problems == []
