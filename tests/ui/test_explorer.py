"""The explorer page (`/ui`) in headless Chromium against the real server: a preset and a pasted
Gemma 3 config resolved into their tables, the plots drawn from previews, a zoom whose values are
the API's, a difference heatmap, a download equal byte for byte to the API's answer, a table file
checked against the exact table, an ONNX model's baked caches diagnosed (`POST /v1/check/onnx`);
with no console error and no failed request.

`POSENC_UI_SCREENSHOTS=docs/img` makes the test save the README's screenshots there.
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from safetensors.numpy import save as safetensors_save

from tests.client import blocks
from tests.conftest import ServerHandle, start_server
from tests.ui.conftest import Watched

pytestmark = pytest.mark.xdist_group("ui")

CONFIGS = Path(__file__).parent.parent / "data" / "configs"
SHOTS = os.environ.get("POSENC_UI_SCREENSHOTS")


def shot(w: Watched, name: str, selector: str | None = None) -> None:
    """Save a screenshot for the README when asked to (POSENC_UI_SCREENSHOTS)."""
    if not SHOTS:
        return
    path = Path(SHOTS) / f"explorer-{name}.png"
    if selector:
        w.page.locator(selector).screenshot(path=str(path))
    else:
        w.page.screenshot(path=str(path), full_page=False)


def open_preset(w: Watched, url: str, preset: str) -> None:
    """Open the page and show a preset's tables."""
    w.page.goto(f"{url}/ui")
    w.page.locator(f"select[name=preset] option[value='{preset}']").wait_for(state="attached")
    w.page.select_option("select[name=preset]", preset)
    w.page.locator("#preset-form button").click()
    w.idle()


def no_error_shown(w: Watched) -> None:
    assert w.page.locator("#error").is_hidden(), w.page.locator("#error").inner_text()


def test_preset_plots_zoom_compare_download(
    server: ServerHandle, client: httpx.Client, watched: Watched
) -> None:
    page = watched.page
    page.goto(f"{server.url}/ui")
    page.locator("select[name=preset] option[value='llama-3.1-8b']").wait_for(state="attached")
    assert page.locator("#server-version").inner_text().startswith("posenc ")

    page.select_option("select[name=preset]", "llama-3.1-8b")
    page.locator("#preset-form button").click()
    watched.idle()
    no_error_shown(watched)
    preset = client.get("/v1/presets/llama-3.1-8b").json()
    key = preset["parts"][0]["key"]
    card = page.locator(f".card[data-key='{key}']")
    assert "(131072, 128)" in card.inner_text()
    assert "pairing: half split" in card.inner_text()
    # the 131072-position table arrives as a preview of 512 blocks of 256 positions, all 128
    # dimensions: each pixel is its block's mean (pooled on the server), not one row of it, so a
    # column turning faster than 256 positions is not aliased: dimension 0 (one radian per
    # position) averages to about 0 over its first block, where its row 0 reads 1
    heat = page.locator(".plot").filter(has_text="cos/sin by position")
    assert "each pixel is the mean of a block of 256 × 1 elements" in heat.inner_text()
    assert heat.locator("canvas").count() == 1
    first_block = np.load(
        io.BytesIO(
            client.get(
                f"/v1/tables/{key}", params={"format": "npy", "tensor": "cos", "rows": "0:256"}
            ).content
        )
    )
    heat.locator("canvas").focus()  # the cursor starts at the first block, dimension 0
    shown = re.fullmatch(r"position 0, dimension 0: (\S+)", heat.locator(".readout").inner_text())
    assert shown, heat.locator(".readout").inner_text()
    assert float(shown.group(1)) == pytest.approx(first_block[:, 0].mean(), rel=1e-4, abs=1e-6)
    assert abs(float(shown.group(1))) < 0.05
    # cos has both signs: the colour bar runs -1..1 with 0 at its middle
    assert heat.locator("canvas").get_attribute("data-scale") == "-1,0,1"
    assert "Colour scale -1 to 1, 0 at its middle." in heat.inner_text()
    # Llama 3.1: pairs 0..28 unscaled, 29..34 on the ramp, 35..63 divided by 8 (field guide)
    wave = page.locator(".plot").filter(has_text="Wavelength per dimension")
    assert "on the ramp: pairs 29–34" in wave.inner_text()
    assert wave.locator("svg text", has_text="ramp").count() >= 1
    assert wave.locator("svg text", has_text="original context").count() == 1
    shot(watched, "rope", "#plots")

    # zoom to positions 1000..1064: every row, and the keyboard cursor reads the API's values
    heat.locator("input[name=row_start]").fill("1000")
    heat.locator("input[name=row_end]").fill("1064")
    heat.get_by_role("button", name="Show").click()
    watched.idle()
    assert "every element" in heat.locator("figcaption").inner_text()
    canvas = heat.locator("canvas")
    canvas.focus()
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowRight")
    readout = heat.locator(".readout").inner_text()
    exact = client.get(
        f"/v1/tables/{key}", params={"format": "json", "tensor": "cos", "rows": "1001:1002"}
    ).json()["tensors"]["cos"]["data"][0][1]
    match = re.fullmatch(r"position 1001, dimension 1: (\S+)", readout)
    assert match, readout
    assert float(match.group(1)) == pytest.approx(exact, rel=1e-4)

    # the model against itself without its scaling: the difference heatmap
    compare = page.locator(".plot").filter(has_text="Two configs compared")
    compare.locator("input[name=compare_end]").fill("16384")
    compare.get_by_role("button", name="Show difference").click()
    watched.idle()
    no_error_shown(watched)
    assert compare.locator("canvas").count() == 1
    assert "minus the same without its scaling" in compare.inner_text()
    # pooled on the server per block of 32 positions: each pixel the block's largest
    # |difference| (of the element-wise difference, not of two pooled tables)
    assert "largest |difference| of a block of 32 × 1 elements" in compare.inner_text()
    plain = {k: v for k, v in preset["parts"][0]["spec"].items() if k != "rope_scaling"}

    def npy(response: httpx.Response) -> np.ndarray:
        assert response.status_code == 200, response.text
        return np.load(io.BytesIO(response.content)).astype(np.float64)

    rows = {"format": "npy", "tensor": "cos", "rows": "0:16384"}
    diff = npy(client.get(f"/v1/tables/{key}", params=rows)) - npy(
        client.post("/v1/tables", params=rows, json=plain)
    )
    block_worst = np.abs(diff).reshape(512, 32, 128).max(axis=(1, 2))
    first = int(np.flatnonzero(block_worst)[0]) * 32
    summary = compare.locator(".difference-summary").inner_text()
    assert f"first differ in positions {first}–{first + 31}" in summary, summary
    compare.locator("canvas").first.focus()
    got = re.fullmatch(
        r"position 0, dimension 0: (\S+)", compare.locator(".readout").first.inner_text()
    )
    assert got, compare.locator(".readout").first.inner_text()
    assert float(got.group(1)) == pytest.approx(np.abs(diff[:32, 0]).max(), rel=1e-4, abs=1e-12)
    shot(watched, "compare", ".plot:has-text('Two configs compared')")

    # a download through the page is byte for byte the API's answer
    with page.expect_download() as download:
        card.get_by_role("link", name="cos.npy").click()
    got = Path(download.value.path()).read_bytes()
    want = client.get(f"/v1/tables/{key}", params={"format": "npy", "tensor": "cos"})
    assert want.status_code == 200
    assert got == want.content
    # named after the model, the table and the tensor (not the server's content key)
    assert download.value.suggested_filename == "llama-3.1-8b_rope_cos.npy"
    assert watched.problems == []


def test_gemma_config_layer_types_and_check(
    server: ServerHandle, client: httpx.Client, watched: Watched
) -> None:
    page = watched.page
    page.goto(f"{server.url}/ui")
    config = (CONFIGS / "google__gemma-3-4b-it.json").read_text()
    page.fill("textarea[name=config]", config)
    page.fill("input[name=max_positions]", "8192")
    page.locator("#config-form button[type=submit]").click()
    watched.idle()
    no_error_shown(watched)
    resolved = client.post(
        "/v1/resolve", json={"hf_config": json.loads(config), "max_positions": 8192}
    ).json()["specs"]
    names = [s["name"] for s in resolved]
    assert set(names) == {"rope:sliding_attention", "rope:full_attention"}
    cards = page.locator(".card")
    assert cards.count() == 2
    for spec in resolved:
        card = page.locator(f".card[data-key='{spec['key']}']")
        assert spec["name"] in card.locator("h3").inner_text()
        assert "(8192, 256)" in card.inner_text()
        curl, python = (card.locator("pre").nth(i).text_content() for i in (1, 2))
        assert curl is not None
        assert python is not None
        assert f"curl -s {server.url}/v1/tables -o" in curl
        # by the URL the server handed out, which any replica answers
        assert f"{server.url}{spec['url']}?format=safetensors" in curl
        assert f'client.table_by_key("{spec["url"]}")' in python
    full = next(s for s in resolved if s["name"] == "rope:full_attention")
    page.locator(f".card[data-key='{full['key']}'] .plot-button").click()
    watched.idle()
    wave = page.locator(".plot").filter(has_text="Wavelength per dimension")
    assert "scaled by 8 (no ramp)" in wave.inner_text()  # Gemma 3's global layers: linear x8
    shot(watched, "gemma", "#tables")

    # check: the exact rows pass, a table off by 1e-3 from position 100 on is caught there
    rows = client.get(
        f"/v1/tables/{full['key']}", params={"format": "npy", "tensor": "cos", "rows": "0:256"}
    )
    table = np.load(io.BytesIO(rows.content))
    drifted = np.where(np.arange(256)[:, None] >= 100, table + 1e-3, table).astype(np.float32)
    for name, values, verdict in (
        ("exact.safetensors", table, "match"),
        ("exact.npy", table, "match"),
        ("drifted.npy", drifted, "departs"),
    ):
        if name.endswith(".npy"):
            buf = io.BytesIO()
            np.save(buf, values)
            data = buf.getvalue()
        else:  # a runtime's file: several tensors, the right one found by name
            data = safetensors_save({"cos": values, "sin": np.zeros_like(values)})
        page.locator("#check-file").set_input_files(
            files=[{"name": name, "mimeType": "application/octet-stream", "buffer": data}]
        )
        watched.idle()
        result = page.locator(f"#check-result [data-verdict='{verdict}']")
        assert result.count() == 1, page.locator("#check-result").inner_text()
    assert "Departs from position 100" in result.inner_text()
    shot(watched, "check", "#check")
    no_error_shown(watched)
    assert watched.problems == []


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        ("bloom-560m", ["Slopes per head (16 heads)", "Bias per head", "head 0"]),
        ("t5-base", ["bucket map", "Bucket by relative position"]),
        ("whisper-large-v3", ["heatmap"]),
    ],
)
def test_other_families_plot(
    server: ServerHandle, watched: Watched, preset: str, expected: list[str]
) -> None:
    page = watched.page
    open_preset(watched, server.url, preset)
    no_error_shown(watched)
    text = page.locator("#plot-area").inner_text()
    for needle in expected:
        assert needle in text
    assert page.locator("#plot-area canvas, #plot-area svg").count() >= 1
    assert watched.problems == []


def test_vision_config_shows_the_2d_grid(server: ServerHandle, watched: Watched) -> None:
    page = watched.page
    page.goto(f"{server.url}/ui")
    page.fill("textarea[name=config]", (CONFIGS / "facebook__vit-mae-base.json").read_text())
    page.locator("#config-form button[type=submit]").click()
    watched.idle()
    no_error_shown(watched)
    assert page.locator(".card").count() == 2  # the encoder's and the decoder's tables
    grid = page.locator(".plot").filter(has_text="2-D grid")
    assert "over the 14 × 14 grid" in grid.inner_text()
    assert "after 1 class-token row" in grid.inner_text()
    assert grid.locator("canvas").count() == 8
    assert watched.problems == []


def test_parts_not_served_are_listed(server: ServerHandle, watched: Watched) -> None:
    """Swin with absolute embeddings: the window index is served, the checkpoint's learned table
    (not in config.json) is listed with its reason and the field that would serve it."""
    page = watched.page
    page.goto(f"{server.url}/ui")
    config = {"model_type": "swin", "use_absolute_embeddings": True, "image_size": 32}
    page.fill("textarea[name=config]", json.dumps(config))
    page.locator("#config-form button[type=submit]").click()
    watched.idle()
    no_error_shown(watched)
    assert page.locator(".card").count() == 1
    listed = page.locator("#tables-intro .unserved li")
    assert listed.count() == 1
    text = listed.inner_text()
    assert text.startswith("learned (table_key): learned absolute positions"), text
    assert watched.problems == []


def test_with_api_keys_the_page_sends_the_typed_key(watched: Watched) -> None:
    api_key = "explorer-key-0123456789"
    with start_server(api_keys=[api_key]) as srv, srv.client() as c:
        page = watched.page
        page.goto(f"{srv.url}/ui")  # the page itself is open
        watched.idle()
        assert "API key" in page.locator("#error").inner_text()
        # its first /v1 call was refused, and that was all that went wrong
        assert any("401" in p for p in watched.problems)
        assert [p for p in watched.problems if "401" not in p] == []
        watched.problems.clear()
        page.fill("input[name=api_key]", api_key)
        page.locator("#key-form button").click()
        page.locator("select[name=preset] option[value='bloom-560m']").wait_for(state="attached")
        page.select_option("select[name=preset]", "bloom-560m")
        page.locator("#preset-form button").click()
        watched.idle()
        no_error_shown(watched)
        card = page.locator(".card").first
        assert 'Authorization: Bearer $POSENC_API_KEY"' in (
            card.locator("pre").nth(1).text_content() or ""
        )
        # a link cannot carry the header: the page fetches with it and saves the bytes
        with page.expect_download() as download:
            card.get_by_role("link", name="slopes.npy").click()
        key = card.get_attribute("data-key")
        want = c.get(
            f"/v1/tables/{key}",
            params={"format": "npy", "tensor": "slopes"},
            headers={"Authorization": f"Bearer {api_key}"},
        )
        assert want.status_code == 200
        assert Path(download.value.path()).read_bytes() == want.content
        assert watched.problems == []


def test_t5_bias_per_head_from_pasted_weights(server: ServerHandle, watched: Watched) -> None:
    page = watched.page
    open_preset(watched, server.url, "t5-base")
    weights = (np.arange(32 * 4, dtype=np.float64).reshape(32, 4) / 10).tolist()  # (buckets, H)
    page.fill("textarea[name=relative_attention_bias]", json.dumps(weights))
    page.get_by_role("button", name="Show the bias").click()
    watched.idle()
    no_error_shown(watched)
    bias = page.locator(".plot").filter(has_text="Bias per head: heatmap").last
    assert bias.locator("select[name=axis_0] option").count() == 4  # one per head
    assert "bias (4, 512, 512) float32" in bias.inner_text()
    assert watched.problems == []


def test_keys_the_server_forgot_are_answered_by_their_urls(watched: Watched) -> None:
    # A server remembering one resolved key (as if the other had been resolved on another
    # replica): Gemma 3's two tables and the unscaled comparison cannot all be known at once,
    # yet the page fetches each table by the URL the server handed out (`/v1/tables/{key}.{spec}`,
    # the spec riding in it), which the server answers without knowing the key: no 404 at all.
    with start_server(known_keys=1) as srv:
        page = watched.page
        page.goto(f"{srv.url}/ui")
        page.fill("textarea[name=config]", (CONFIGS / "google__gemma-3-4b-it.json").read_text())
        page.fill("input[name=max_positions]", "2048")
        page.locator("#config-form button[type=submit]").click()
        watched.idle()
        no_error_shown(watched)  # the first table's plots: its key was forgotten at once
        assert "No scaling" in page.locator("#plot-area").inner_text()
        page.locator(".plot-button").nth(1).click()
        watched.idle()
        no_error_shown(watched)
        assert "scaled by 8 (no ramp)" in page.locator("#plot-area").inner_text()
        assert (
            page.locator(".plot").filter(has_text="cos/sin by position").locator("canvas").count()
            == 1
        )
        assert watched.problems == []  # no 404: nothing re-posted


def test_onnx_model_checked_against_the_preset(
    server: ServerHandle, client: httpx.Client, watched: Watched, tmp_path: Path
) -> None:
    # A model baking Llama 3.1's theta without its llama3 scaling (what onnxruntime-genai's
    # builder bakes when it drops a model's scaling), chosen with the check pane's file input
    # against the Llama 3.1 preset: both caches diagnosed, and where they depart drawn.
    spec = {"kind": "rope", "head_dim": 128, "rope_theta": 500000.0, "max_positions": 512,
            "profile": "ort_gqa"}  # fmt: skip
    default = np.load(io.BytesIO(client.post("/v1/tables?format=npz", json=spec).content))
    path = tmp_path / "builder-model.onnx"
    onnx.save(blocks.baked_gqa_block(128, 4, 2, default["cos"], default["sin"]), path)
    page = watched.page
    open_preset(watched, server.url, "llama-3.1-8b")
    page.locator("#check-file").set_input_files(str(path))
    watched.idle()
    no_error_shown(watched)
    result = page.locator("#check-result")
    assert result.locator("[data-verdict='repair']").count() == 2, result.inner_text()
    text = result.inner_text()
    assert "builder-model.onnx against rope" in text
    assert text.count("the config's llama3 scaling is missing") == 2
    assert "(512, 64) float32; 512 rows compared" in text
    assert re.search(r"first departs\s+position 1, column (29|3\d)", text), text
    heat = result.locator("canvas")
    assert heat.count() == 2
    # keyboard: the departure map takes focus and reads out the value under its cursor
    heat.first.focus()
    page.keyboard.press("ArrowDown")
    assert "position" in result.locator(".readout").first.inner_text()
    shot(watched, "check-onnx", "#check")

    # dropped on the drop zone: a model baking the exact Llama 3.1 caches is exact
    preset = client.get("/v1/presets/llama-3.1-8b").json()["parts"][0]["spec"]
    exact = np.load(io.BytesIO(client.post(
        "/v1/tables?format=npz", json={**spec, "rope_scaling": preset["rope_scaling"]}
    ).content))  # fmt: skip
    data = blocks.baked_gqa_block(128, 4, 2, exact["cos"], exact["sin"]).SerializeToString()
    transfer = page.evaluate_handle(
        "([bytes, name]) => { const t = new DataTransfer();"
        " t.items.add(new File([new Uint8Array(bytes)], name)); return t; }",
        [list(data), "plugged.onnx"],
    )
    page.dispatch_event("#drop", "drop", {"dataTransfer": transfer})
    watched.idle()
    no_error_shown(watched)
    assert result.locator("[data-verdict='exact']").count() == 2, result.inner_text()
    assert "plugged.onnx against rope" in result.inner_text()
    assert result.locator("canvas").count() == 0  # nothing departs: no map
    assert watched.problems == []


def test_multimodal_config_shows_text_and_vision_rotary(
    server: ServerHandle, client: httpx.Client, watched: Watched
) -> None:
    """Qwen2.5-VL's released config: the M-RoPE text table (its sections in the notes) and the
    vision tower's rotary table (`vision_rope:vision`) are both listed and the tower's plots
    from the preview route."""
    from tests.encodings.hf_config.mrope_sweep import RELEASED

    config = RELEASED["Qwen/Qwen2.5-VL-7B-Instruct"]
    page = watched.page
    page.goto(f"{server.url}/ui")
    page.fill("textarea[name=config]", json.dumps(config))
    page.fill("input[name=max_positions]", "1024")
    page.locator("#config-form button[type=submit]").click()
    watched.idle()
    no_error_shown(watched)
    resolved = client.post("/v1/resolve", json={"hf_config": config, "max_positions": 1024}).json()[
        "specs"
    ]
    assert [s["name"] for s in resolved] == ["rope", "vision_rope:vision"]
    assert page.locator(".card").count() == 2
    text, vision = (page.locator(f".card[data-key='{s['key']}']") for s in resolved)
    assert "mrope" in text.inner_text()
    assert "vision_rope:vision" in vision.locator("h3").inner_text()
    vision.locator(".plot-button").click()
    watched.idle()
    area = page.locator("#plot-area")
    assert "vision_rope:vision" in area.inner_text()
    assert area.locator("canvas, svg").count() >= 1
    assert watched.problems == []


def test_check_pane_outcomes_diagnosis_and_errors_beside_it(
    server: ServerHandle, client: httpx.Client, watched: Watched, tmp_path: Path
) -> None:
    """Issue 28 in the explorer: a table file holding Llama 3.1's cos/sin without the llama3
    scaling gets the server's diagnosis (the same check as a model's); an ONNX model whose
    caches are graph inputs is "not checkable" with its reason, never a pass; a file that cannot
    be read and a body the server refuses are reported in the check pane itself, in full."""
    page = watched.page
    open_preset(watched, server.url, "llama-3.1-8b")
    preset = client.get("/v1/presets/llama-3.1-8b").json()["parts"][0]["spec"]
    default = {**preset, "rope_scaling": {"rope_type": "default"}, "max_positions": 512}
    answer = client.post("/v1/tables?format=npz", json=default)
    assert answer.status_code == 200, answer.text
    unscaled = np.load(io.BytesIO(answer.content))
    data = safetensors_save({"cos": unscaled["cos"], "sin": unscaled["sin"]})
    page.locator("#check-file").set_input_files(
        files=[{"name": "runtime.safetensors", "mimeType": "application/octet-stream",
                "buffer": data}]
    )  # fmt: skip
    watched.idle()
    no_error_shown(watched)
    diagnosis = page.locator("#check-result .table-diagnosis")
    assert diagnosis.locator("[data-outcome='repair']").count() == 1, diagnosis.inner_text()
    assert diagnosis.locator("[data-verdict='repair']").count() == 2
    assert diagnosis.inner_text().count("the config's llama3 scaling is missing") == 2
    assert page.locator("#check-result [data-verdict='departs']").count() == 1  # the JS compare

    # an ONNX model reading its caches from graph inputs: not checkable, with the reason
    rotary = blocks.rotary_block(128, 4, 2)  # RotaryEmbedding-23, caches as graph inputs
    path = tmp_path / "graph-input-caches.onnx"
    onnx.save(rotary, path)
    page.locator("#check-file").set_input_files(str(path))
    watched.idle()
    no_error_shown(watched)
    result = page.locator("#check-result")
    assert result.locator("[data-outcome='not_checkable']").count() == 1, result.inner_text()
    assert result.locator("[data-verdict='not_checkable']").count() == 1
    assert "graph input" in result.inner_text()
    assert "exits 9" in result.inner_text()
    shot(watched, "check-unchecked", "#check")

    # errors beside the pane: a file that is no table, and a model the server refuses
    page.locator("#check-file").set_input_files(
        files=[{"name": "notes.safetensors", "mimeType": "application/octet-stream",
                "buffer": b"not a table at all"}]
    )  # fmt: skip
    watched.idle()
    error = page.locator("#check-result [data-check-error]")
    assert error.count() == 1
    assert "notes.safetensors is neither .npy nor .safetensors" in error.inner_text()
    page.locator("#check-file").set_input_files(
        files=[{"name": "broken.onnx", "mimeType": "application/octet-stream",
                "buffer": b"\x08\x0a" + b"\xff" * 40}]
    )  # fmt: skip
    watched.idle()
    error = page.locator("#check-result [data-check-error]")
    assert error.count() == 1
    assert "not an ONNX model" in error.inner_text()
    refused = [p for p in watched.problems if "400" in p]
    assert refused, watched.problems
    assert [p for p in watched.problems if "400" not in p] == []
