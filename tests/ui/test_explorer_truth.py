"""Issue 34: what the explorer draws and offers is what the tables hold. Each test drives the page
in Debian's Chromium against the real server and compares it with the API's own answers (the
table's shapes, the spec's scaling, the server's limits): LongRoPE's real length and per-pair
factors, a flat ratio drawn flat, colour bars centred on 0, errors beside their control with the
previous model's plots gone, no download of a table over the response limit, a permalink that
reopens the view, PNG/SVG/CSV export named after model, table and plot, an overlay of two models'
wavelengths, and a vision tower's grid fields with its rows labelled as patches.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import get_args

import httpx
import pytest

from posenc.encodings.rope.spec import Profile
from tests.conftest import ServerHandle, start_server
from tests.ui.conftest import Watched
from tests.ui.test_explorer import CONFIGS, no_error_shown, open_preset, shot

pytestmark = pytest.mark.xdist_group("ui")


def resolve(
    w: Watched, url: str, config: dict[str, object], max_positions: int | None = None
) -> None:
    w.page.goto(f"{url}/ui")
    w.page.fill("textarea[name=config]", json.dumps(config))
    if max_positions:
        w.page.fill("input[name=max_positions]", str(max_positions))
    w.page.locator("#config-form button[type=submit]").click()
    w.idle()


def test_longrope_length_factors_and_facts(
    server: ServerHandle, client: httpx.Client, watched: Watched
) -> None:
    """Phi-3.5's long table: its 131072 rows (not seq_len 4097), per-pair factors and no ramp
    (its scaling lists a factor per pair), and the server's `longrope_factors: long` as text."""
    page = watched.page
    open_preset(watched, server.url, "phi-3.5-mini")
    no_error_shown(watched)
    long = next(
        p for p in client.get("/v1/presets/phi-3.5-mini").json()["parts"] if p["name"] == "long"
    )
    rows = long["outputs"]["cos"]["shape"][0]
    assert rows == 131072
    assert long["spec"]["seq_len"] == 4097
    wave = page.locator(".plot").filter(has_text="Wavelength per dimension")
    text = wave.inner_text()
    assert (
        wave.locator("svg text.hline", has_text=f"table length ({rows} rows): {rows}").count() == 1
    )
    assert "4097 rows" not in text
    assert "The factors are the ones chosen for seq_len 4097; the table holds 131072 rows." in text
    assert "Per-pair factors (long_factor)" in text
    assert "no ramp" in text
    assert wave.locator("svg rect.band").count() == 0  # no ramp band anywhere
    assert "longrope_factors: long" in wave.locator(".meta-facts").inner_text()
    assert "-∞" not in page.locator("#plot-area").inner_text()
    shot(watched, "longrope", ".plot:has-text('Wavelength per dimension')")
    assert watched.problems == []


def test_a_constant_ratio_is_drawn_flat(server: ServerHandle, watched: Watched) -> None:
    """Linear scaling ×8: every pair's ratio is 8 up to float32 noise; the chart's axis spans
    the unscaled 1 to 8, so its ticks are distinct numbers (not five ticks all reading 8)."""
    config = {
        "model_type": "llama",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "max_position_embeddings": 2048,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    }
    resolve(watched, server.url, config)
    no_error_shown(watched)
    wave = watched.page.locator(".plot").filter(has_text="Wavelength per dimension")
    assert "scaled by 8 (no ramp)" in wave.inner_text()
    ratio = wave.locator("svg[aria-label='scaling per pair']")
    ticks = [t.strip() for t in ratio.locator("text.ytick").all_text_contents()]
    assert len(ticks) >= 3, ticks
    assert len(set(ticks)) == len(ticks), ticks
    assert max(float(t) for t in ticks) >= 8, ticks
    assert ratio.locator("text.hline", has_text="unscaled: 1").count() == 1
    assert watched.problems == []


@pytest.mark.parametrize("preset", ["whisper-large-v3", "gemma-3-1b"])
def test_colour_bar_is_centred_on_zero(server: ServerHandle, watched: Watched, preset: str) -> None:
    """A table with both signs (Whisper's sinusoids, Gemma 3's cos) is coloured on a scale
    symmetric about 0, whose middle reads 0."""
    open_preset(watched, server.url, preset)
    no_error_shown(watched)
    canvas = watched.page.locator("#plot-area .plot canvas").first
    lo, mid, hi = (float(v) for v in (canvas.get_attribute("data-scale") or "").split(","))
    assert mid == 0
    assert lo == -hi
    assert hi > 0
    assert watched.problems == []


def test_errors_beside_their_control_and_stale_plots_cleared(
    server: ServerHandle, client: httpx.Client, watched: Watched
) -> None:
    page = watched.page
    open_preset(watched, server.url, "llama-3.1-8b")
    assert page.locator("#plot-area canvas").count() >= 1
    # a config the server refuses: the error follows the config form, the banner stays hidden,
    # and the Llama tables and plots are gone (they are not this config's)
    page.fill("textarea[name=config]", json.dumps({"model_type": "llama", "head_dim": -4}))
    page.locator("#config-form button[type=submit]").click()
    watched.idle()
    error = page.locator("#config-form + .error-near[role=alert]")
    assert error.count() == 1
    # the server's message once, and every field it named (none cut off)
    refused = client.post("/v1/resolve", json={"model_type": "llama", "head_dim": -4}).json()
    text = error.inner_text()
    assert text.count(refused["error"]) == 1, text
    for detail in refused["detail"]:
        assert detail["field"] in text
    assert page.locator("#error").is_hidden()
    assert page.locator("#plots").is_hidden()
    assert page.locator("#tables").is_hidden()
    assert page.locator("#plot-area canvas, #plot-area svg, .card").count() == 0
    # no preset chosen: said beside the preset form; the config's error is gone
    page.select_option("select[name=preset]", "")
    page.locator("#preset-form button").click()
    assert "choose a model" in page.locator("#preset-form + .error-near").inner_text()
    assert page.locator(".error-near").count() == 1
    assert [p for p in watched.problems if "422" not in p] == []  # the refused config only


def test_no_download_of_a_table_over_the_response_limit(watched: Watched) -> None:
    """A server whose response limit is 4 MiB: Llama 3.1's 128 MiB table has no download links,
    and says why; Bloom's slopes (64 bytes) have theirs."""
    limit = 4 << 20
    with start_server(max_response_bytes=limit) as srv:
        page = watched.page
        open_preset(watched, srv.url, "llama-3.1-8b")
        card = page.locator(".card").first
        assert card.locator(".downloads a").count() == 0
        assert "over this server's response limit (4.0 MiB)" in card.inner_text()
        open_preset(watched, srv.url, "bloom-560m")
        assert page.locator(".card .downloads a").count() >= 2


def test_permalink_reopens_the_view_with_an_overlay(server: ServerHandle, watched: Watched) -> None:
    page = watched.page
    open_preset(watched, server.url, "llama-3.1-8b")
    heat = page.locator(".plot").filter(has_text="cos/sin by position")
    heat.locator("select[name=tensor]").select_option("sin")
    watched.idle()
    heat.locator("input[name=row_start]").fill("1000")
    heat.locator("input[name=row_end]").fill("1064")
    heat.get_by_role("button", name="Show").click()
    watched.idle()
    wave = page.locator(".plot").filter(has_text="Wavelength per dimension")
    wave.locator("select[name=overlay]").select_option("phi-3.5-mini")
    watched.idle()
    assert wave.locator("polyline[data-series='phi-3.5-mini long']").count() == 1
    link = page.url
    for part in (
        "preset=llama-3.1-8b",
        "table=rope",
        "tensor=sin",
        "rows=1000%3A1064",
        "overlay=phi-3.5-mini",
    ):
        assert part in link, link
    # the link, opened afresh, shows the same view
    page.goto("about:blank")
    page.goto(link)
    watched.idle()
    no_error_shown(watched)
    heat = page.locator(".plot").filter(has_text="cos/sin by position")
    assert heat.locator("select[name=tensor]").input_value() == "sin"
    assert heat.locator("input[name=row_start]").input_value() == "1000"
    assert heat.locator("input[name=row_end]").input_value() == "1064"
    assert "sin (131072, 128) float32, every element." in heat.inner_text()
    wave = page.locator(".plot").filter(has_text="Wavelength per dimension")
    assert wave.locator("polyline[data-series='phi-3.5-mini long']").count() == 1
    # a config's view: its JSON, max_positions and profile ride in the link too
    config = json.loads((CONFIGS / "google__gemma-3-4b-it.json").read_text())
    resolve(watched, server.url, config, 2048)
    page.select_option("select[name=profile]", "vllm")
    page.locator("#config-form button[type=submit]").click()
    watched.idle()
    page.locator(".plot-button").nth(1).click()
    watched.idle()
    link = page.url
    page.goto("about:blank")
    page.goto(link)
    watched.idle()
    no_error_shown(watched)
    assert page.locator("select[name=profile]").input_value() == "vllm"
    assert page.locator("input[name=max_positions]").input_value() == "2048"
    assert page.locator(".card.selected h3").inner_text().startswith("rope:full_attention")
    assert "cos_sin (2048, 256)" in page.locator(".card.selected").inner_text()
    assert watched.problems == []


def test_plots_export_png_svg_csv(server: ServerHandle, watched: Watched) -> None:
    page = watched.page
    open_preset(watched, server.url, "llama-3.1-8b")
    wave = page.locator(".plot").filter(has_text="Wavelength per dimension").locator("figure").first
    saved = {}
    for kind in ("png", "svg", "csv"):
        with page.expect_download() as download:
            wave.locator(f"button[data-export={kind}]").click()
        saved[kind] = (download.value.suggested_filename, Path(download.value.path()).read_bytes())
    assert saved["png"][0] == "llama-3.1-8b_rope_wavelengths.png"
    assert saved["png"][1].startswith(b"\x89PNG\r\n\x1a\n")
    assert saved["svg"][0] == "llama-3.1-8b_rope_wavelengths.svg"
    assert saved["svg"][1].startswith(b"<svg")
    assert b"wavelength per rotary pair" in saved["svg"][1]
    assert saved["csv"][0] == "llama-3.1-8b_rope_wavelengths.csv"
    rows = list(csv.reader(io.StringIO(saved["csv"][1].decode())))
    assert rows[0] == ["series", "rotary pair i", "wavelength (positions)"]
    assert len(rows) == 1 + 2 * 64  # this table's and the unscaled wavelengths, 64 pairs each
    heat = page.locator(".plot").filter(has_text="cos/sin by position").locator("figure").first
    with page.expect_download() as download:
        heat.locator("button[data-export=csv]").click()
    assert download.value.suggested_filename == "llama-3.1-8b_rope_cos_heatmap.csv"
    table = list(csv.reader(io.StringIO(Path(download.value.path()).read_text())))
    assert len(table) == 1 + 512
    assert len(table[0]) == 1 + 128
    with page.expect_download() as download:
        heat.locator("button[data-export=png]").click()
    assert Path(download.value.path()).read_bytes().startswith(b"\x89PNG")
    assert watched.problems == []


def test_vision_grid_fields_and_patch_rows(
    server: ServerHandle, client: httpx.Client, watched: Watched
) -> None:
    """Qwen2.5-VL's vision tower: grid height, width and frames set on the page give the table
    the API gives for them, its rows labelled as patches in the tower's merge/window order."""
    from tests.encodings.hf_config.mrope_sweep import RELEASED

    page = watched.page
    resolve(watched, server.url, RELEASED["Qwen/Qwen2.5-VL-7B-Instruct"], 1024)
    no_error_shown(watched)
    page.locator(".card").nth(1).locator(".plot-button").click()
    watched.idle()
    grid = page.locator(".plot").filter(has_text="Patch grid")
    assert (
        "256 rows: one per patch (merge-block, window order) of a 16 × 16 × 1 grid"
        in grid.inner_text()
    )
    grid.locator("input[name=grid_height]").fill("8")
    grid.locator("input[name=grid_width]").fill("12")
    grid.locator("input[name=frames]").fill("2")
    grid.get_by_role("button", name="Show this grid").click()
    watched.idle()
    no_error_shown(watched)
    resolved = client.post(
        "/v1/resolve",
        json={"hf_config": RELEASED["Qwen/Qwen2.5-VL-7B-Instruct"], "max_positions": 1024},
    ).json()
    spec = {**resolved["specs"][1]["spec"], "grid_height": 8, "grid_width": 12, "frames": 2}
    want = client.post("/v1/tables", params={"format": "json", "tensor": "cos"}, json=spec).json()
    shape = want["tensors"]["cos"]["shape"]
    assert shape[0] == 2 * 8 * 12
    heat = page.locator(".plot").filter(has_text="cos/sin by patch")
    assert f"cos ({shape[0]}, {shape[1]}) float32, every element." in heat.inner_text()
    heat.locator("canvas").focus()
    page.keyboard.press("ArrowDown")
    readout = heat.locator(".readout").inner_text()
    assert readout.startswith("patch (merge-block, window order) 1, dimension 0: ")
    assert float(readout.rsplit(": ", 1)[1]) == pytest.approx(
        want["tensors"]["cos"]["data"][1][0], rel=1e-4
    )
    assert (
        "of a 8 × 12 × 2 grid" in page.locator(".plot").filter(has_text="Patch grid").inner_text()
    )
    assert watched.problems == []


def test_profiles_come_from_the_server(
    server: ServerHandle, client: httpx.Client, watched: Watched
) -> None:
    """The profile <select> is /v1/kinds' `profiles`, whose names are the rope spec's."""
    profiles = client.get("/v1/kinds").json()["profiles"]
    assert [p["name"] for p in profiles] == list(get_args(Profile))
    page = watched.page
    page.goto(f"{server.url}/ui")
    watched.idle()
    options = page.locator("select[name=profile] option")
    assert options.all_inner_texts() == [p["label"] for p in profiles]
    # built from the server's records: each option names its consumer and source
    titles = [options.nth(i).get_attribute("title") for i in range(len(profiles))]
    assert titles == [f"{p['consumer']} ({p['source']})" for p in profiles]
    assert [options.nth(i).get_attribute("value") for i in range(1, len(profiles))] == [
        p["name"] for p in profiles[1:]
    ]
    assert watched.problems == []


def test_a_ten_million_position_table_is_explored_from_sampled_rows(
    server: ServerHandle, client: httpx.Client, watched: Watched
) -> None:
    """A 10M-context config (10 GiB of cos/sin, over the response limit): no download, but its
    heatmap draws rows computed at sampled positions by /v2 (equal to the API's rows there),
    and its wavelengths are drawn; nothing the page asks for is refused."""
    config = {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "rope_theta": 500000.0,
        "max_position_embeddings": 10485760,
    }
    resolve(watched, server.url, config)
    no_error_shown(watched)
    page = watched.page
    assert page.locator(".card .downloads a").count() == 0
    assert "over this server's response limit" in page.locator(".card").inner_text()
    heat = page.locator(".plot").filter(has_text="cos/sin by position")
    caption = heat.locator("figcaption").inner_text()
    assert (
        "rows are computed directly (POST /v2/models/rope/infer), one every 20480 positions"
        in caption
    )
    heat.locator("canvas").focus()
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowRight")
    readout = heat.locator(".readout").inner_text()
    assert readout.startswith("position 20480, dimension 1: "), readout
    spec = client.post("/v1/resolve", json=config).json()["specs"][0]["spec"]
    want = client.post(
        "/v2/models/rope/infer",
        json={
            "parameters": {"spec": json.dumps(spec)},
            "inputs": [
                {"name": "position_ids", "shape": [1], "datatype": "INT64", "data": [20480]}
            ],
        },
    ).json()
    cos = next(o for o in want["outputs"] if o["name"] == "cos")["data"]
    assert float(readout.rsplit(": ", 1)[1]) == pytest.approx(cos[1], rel=1e-4, abs=1e-7)
    wave = page.locator(".plot").filter(has_text="Wavelength per dimension")
    assert "table length (10485760 rows)" in wave.inner_text()
    assert watched.problems == []
