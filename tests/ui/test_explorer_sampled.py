"""Issue 34: tables over the server's response limit, of every family the explorer samples, are
drawn from entries computed directly by `/v2` at sampled rows (and keys), said so beside the
heatmap, and equal, entry for entry, the whole table computed in-process. A server with a 1 MiB
limit puts T5's bucket map (2 MiB), Whisper's sinusoids (7.7 MiB) and BLOOM-176B's causal bias
over 112 heads (1.8 MiB) over it; the heatmap's CSV export carries the exact values drawn."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from playwright.sync_api import Locator

from posenc.encodings import compute, parse_spec
from tests.conftest import ServerHandle, start_server
from tests.ui.conftest import Watched
from tests.ui.test_explorer import no_error_shown, open_preset, shot

pytestmark = pytest.mark.xdist_group("ui")

LIMIT = 1 << 20


@pytest.fixture(scope="module")
def limited() -> Iterator[ServerHandle]:
    with start_server(max_response_bytes=LIMIT) as srv:
        yield srv


def exact(spec: dict[str, Any], tensor: str) -> np.ndarray[Any, Any]:
    """The whole table computed in-process (CPU), in its dtype (float32 or int64 here)."""
    return compute(parse_spec(spec), torch.device("cpu")).tensors[tensor].numpy()


def same(drawn_values: np.ndarray[Any, Any], want: np.ndarray[Any, Any]) -> bool:
    """Equal in the table's dtype: JSON carries a float32 as its shortest decimal, which reads
    back as that float32 exactly."""
    return np.array_equal(drawn_values.astype(want.dtype), want)


def drawn(w: Watched, figure: Locator) -> tuple[list[int], list[int], np.ndarray[Any, Any]]:
    """(row indices, column indices, values) of a heatmap, from its CSV export."""
    with w.page.expect_download() as download:
        figure.locator("button[data-export=csv]").click()
    rows = list(csv.reader(io.StringIO(Path(download.value.path()).read_text())))
    cols = [int(c) for c in rows[0][1:]]
    index = [int(r[0]) for r in rows[1:]]
    values = np.array([[float(v) for v in r[1:]] for r in rows[1:]])
    return index, cols, values


def assert_sampled(caption: str, kind: str, keys: bool) -> None:
    pattern = rf"rows are computed directly \(POST /v2/models/{kind}/infer\), one every \d+ \w+s"
    assert re.search(pattern + (r" and one key every \d+" if keys else r"\."), caption), caption
    assert "Rows are sampled, not pooled" in caption


def test_t5_buckets_over_the_limit_are_sampled_exactly(
    limited: ServerHandle, watched: Watched
) -> None:
    open_preset(watched, limited.url, "t5-base")
    no_error_shown(watched)
    with httpx.Client(base_url=limited.url) as client:
        spec = client.get("/v1/presets/t5-base").json()["parts"][0]["spec"]
    heat = watched.page.locator(".plot").filter(has_text="bucket map").locator("figure").first
    assert_sampled(heat.locator("figcaption").inner_text(), "t5_bias", keys=True)
    rows, cols, values = drawn(watched, heat)
    assert rows[1] - rows[0] > 1  # both axes sampled
    assert cols[1] - cols[0] > 1
    assert same(values, exact(spec, "buckets")[np.ix_(rows, cols)])
    # the bucket line of the middle query, from /v2 too
    line = watched.page.locator(".plot").filter(has_text="Bucket by relative position")
    assert line.locator("svg").count() == 1
    assert watched.problems == []


def test_whisper_sinusoids_over_the_limit_are_sampled_exactly(
    limited: ServerHandle, watched: Watched
) -> None:
    open_preset(watched, limited.url, "whisper-large-v3")
    no_error_shown(watched)
    with httpx.Client(base_url=limited.url) as client:
        spec = client.get("/v1/presets/whisper-large-v3").json()["parts"][0]["spec"]
    heat = watched.page.locator(".plot").filter(has_text="table: heatmap").locator("figure").first
    caption = heat.locator("figcaption").inner_text()
    assert_sampled(caption, "sinusoidal", keys=False)
    assert "one every 30 positions." in caption  # 1500 rows, 51 rows of 1280 in 65536 points
    shot(watched, "sampled", ".plot:has-text('table: heatmap')")
    rows, cols, values = drawn(watched, heat)
    assert cols == list(range(1280))
    assert same(values, exact(spec, "embedding")[rows])
    # zoomed in, every row: still computed by /v2, and exact
    heat_panel = watched.page.locator(".plot").filter(has_text="table: heatmap")
    heat_panel.locator("input[name=row_start]").fill("1000")
    heat_panel.locator("input[name=row_end]").fill("1040")
    heat_panel.get_by_role("button", name="Show").click()
    watched.idle()
    rows, _, values = drawn(watched, heat_panel.locator("figure").first)
    assert rows == list(range(1000, 1040))
    assert same(values, exact(spec, "embedding")[1000:1040])
    assert watched.problems == []


def test_bloom_causal_bias_over_the_limit_is_sampled_exactly(
    limited: ServerHandle, watched: Watched
) -> None:
    open_preset(watched, limited.url, "bloom")
    no_error_shown(watched)
    with httpx.Client(base_url=limited.url) as client:
        spec = client.get("/v1/presets/bloom").json()["parts"][0]["spec"]
    assert spec["num_heads"] == 112
    panel = watched.page.locator(".plot .plot").filter(has_text="Causal bias (64 × 64) per head")
    heat = panel.locator("figure").first
    assert_sampled(heat.locator("figcaption").inner_text(), "alibi", keys=True)
    causal = {**spec, "bias": "causal", "key_length": 64, "query_length": 64}
    whole = exact(causal, "bias")
    rows, cols, values = drawn(watched, heat)
    assert same(values, whole[0][np.ix_(rows, cols)])  # head 0
    panel.locator("select[name=axis_0]").select_option("111")
    rows, cols, values = drawn(watched, panel.locator("figure").first)
    assert same(values, whole[111][np.ix_(rows, cols)])
    assert watched.problems == []
