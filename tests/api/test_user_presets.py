"""User presets (`posenc serve --presets-dir`, `POSENC_PRESETS_DIR`): a directory of model
config.json files served as presets beside the built-in ones, on a real server and through the
`posenc` entry point.

The oracle is the curated presets: each config.json of `tests/data/configs` whose model a
single-table built-in preset transcribes (checked against transformers by the catalog's tests)
must become a user preset with that preset's very table (same content key); a config with several
tables (Gemma 3) gets the parts `POST /v1/resolve` names. Names clashing with a built-in preset,
files that are not configs and configs that map to no table stop `posenc serve` with one line
and exit 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as http

from posenc.presets import builtin_presets
from tests.api.v2client import make_input, url
from tests.conftest import ServerHandle, start_server

CONFIGS = Path(__file__).parent.parent / "data" / "configs"
EXE = Path(sys.executable).with_name("posenc")
GEMMA = CONFIGS / "google__gemma-3-4b-it.json"


def transcribed() -> dict[str, Path]:
    """Built-in single-table preset name -> the config.json of its model in tests/data/configs."""
    found = {}
    for name, preset in builtin_presets().items():
        path = CONFIGS / (preset.model.replace("/", "__") + ".json")
        if path.is_file() and len(preset.parts) == 1:
            found[name] = path
    return found


@pytest.fixture(scope="module")
def presets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`mine-<built-in name>.json` for each transcribed model; `gemma-4b/config.json`."""
    directory = tmp_path_factory.mktemp("presets")
    for name, path in transcribed().items():
        shutil.copy(path, directory / f"mine-{name}.json")
    (directory / "gemma-4b").mkdir()
    shutil.copy(GEMMA, directory / "gemma-4b" / "config.json")
    (directory / "README.txt").write_text("not a preset", encoding="utf-8")
    (directory / "empty").mkdir()  # a folder without config.json is not a preset
    return directory


@pytest.fixture(scope="module")
def served(presets_dir: Path) -> Iterator[ServerHandle]:
    with start_server(
        presets_dir=str(presets_dir), warm_presets=["gemma-4b", "mine-llama-3.1-8b"]
    ) as handle:
        yield handle


def test_transcribed_models_are_enough() -> None:
    assert {"llama-3.1-8b", "qwen3-8b", "mpt-7b", "deepseek-v3"} <= set(transcribed())


def test_catalog_lists_user_presets_with_the_built_in_tables(served: ServerHandle) -> None:
    with served.client() as c:
        listed = {p["name"]: p for p in c.get("/v1/presets").json()["presets"]}
        assert set(builtin_presets()) < set(listed)
        for name in transcribed():
            mine = c.get(f"/v1/presets/mine-{name}").json()
            builtin = c.get(f"/v1/presets/{name}").json()
            assert [p["key"] for p in mine["parts"]] == [p["key"] for p in builtin["parts"]], name
        gemma = c.get("/v1/presets/gemma-4b").json()
        resolved = c.post("/v1/resolve", json=json.loads(GEMMA.read_text())).json()
    expected = {s["name"].partition(":")[2]: s["key"] for s in resolved["specs"]}
    assert {p["name"]: p["key"] for p in gemma["parts"]} == expected
    assert set(expected) == {"sliding_attention", "full_attention"}
    assert "README" not in listed
    assert "empty" not in listed


def test_user_presets_are_warmed(served: ServerHandle) -> None:
    assert served.state.lifecycle.warm_errors == []
    cache = served.state.cache
    assert cache is not None
    for name in ("gemma-4b", "mine-llama-3.1-8b"):
        for part in served.state.presets[name].parts:
            assert cache.peek(cache.key_for(part.spec, part.key)) is not None, (name, part.name)


def test_a_user_preset_name_works_wherever_a_preset_does(served: ServerHandle) -> None:
    with served.client() as c:
        mine = c.post("/v1/tables", json={"preset": "mine-llama-3.1-8b", "max_positions": 64})
        builtin = c.post("/v1/tables", json={"preset": "llama-3.1-8b", "max_positions": 64})
        assert mine.status_code == 200, mine.text
        assert mine.content == builtin.content
        assert mine.headers["x-posenc-key"] == builtin.headers["x-posenc-key"]
        part = c.get("/v1/presets/gemma-4b/full_attention/table", params={"rows": "0:8"})
        assert part.status_code == 200
        ambiguous = c.post("/v1/tables", json={"preset": "gemma-4b"})
        assert ambiguous.json()["error_type"] == "ambiguous_config"
        typo = c.post("/v1/tables", json={"preset": "gemma-4bb", "part": "full_attention"})
        assert "did you mean 'gemma-4b'" in typo.json()["error"]
        onnx = c.post("/v1/onnx", json={"preset": "gemma-4b", "part": "sliding_attention"})
        assert onnx.status_code == 200, onnx.text
    client = http.InferenceServerClient(url(served))
    try:
        ids = np.array([0, 5, 31], np.int64)
        answers = [
            client.infer(
                "rope", [make_input("position_ids", ids)], parameters={"spec": json.dumps(spec)}
            ).as_numpy("cos")
            for spec in (
                {"preset": "gemma-4b", "part": "full_attention"},
                {"hf_config": json.loads(GEMMA.read_text()), "layer_type": "full_attention"},
            )
        ]
    finally:
        client.close()
    assert answers[0] is not None
    assert np.array_equal(answers[0], answers[1])


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EXE), "serve", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": str(EXE.parent), "COLUMNS": "100"},
    )


@pytest.mark.parametrize(
    ("files", "named"),
    [
        ({"llama-3.1-8b.json": GEMMA.read_text()}, "is the name of a built-in preset"),
        ({"broken.json": "{not json"}, "broken.json: not a readable JSON file"),
        ({"list.json": "[1, 2]"}, "a config.json is a JSON object, not list"),
        ({"nothing.json": '{"model_type": "no-such-model"}'}, "nothing.json: "),
        ({"bad name.json": GEMMA.read_text()}, "is not a preset name"),
    ],
)
def test_a_preset_that_cannot_be_served_stops_serve_with_one_line(
    tmp_path: Path, files: dict[str, str], named: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    result = _serve("--presets-dir", str(tmp_path))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        "posenc: configuration error: --presets-dir (POSENC_PRESETS_DIR): "
    ), lines[0]
    assert named in lines[0]
    assert "Traceback" not in result.stderr


def test_warm_presets_names_user_presets(tmp_path: Path) -> None:
    shutil.copy(GEMMA, tmp_path / "gemma-4b.json")
    result = _serve("--presets-dir", str(tmp_path), "--warm-presets", "gemma-4bb")
    assert result.returncode == 2, result.stderr
    assert "did you mean 'gemma-4b'?" in result.stderr
    missing = _serve("--presets-dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 2
    assert "not a directory" in missing.stderr


def test_served_presets_of_a_server_without_a_directory(client: httpx.Client) -> None:
    listed = [p["name"] for p in client.get("/v1/presets").json()["presets"]]
    assert listed == list(builtin_presets())


def test_openapi_names_each_apps_own_presets(served: ServerHandle, client: httpx.Client) -> None:
    def preset_enum(c: httpx.Client) -> list[str]:
        schemas = c.get("/openapi.json").json()["components"]["schemas"]
        names: list[str] = schemas["SpecFromPreset"]["properties"]["preset"]["enum"]
        return names

    with served.client() as c:
        assert {"gemma-4b", "mine-llama-3.1-8b"} <= set(preset_enum(c))
    assert preset_enum(client) == sorted(builtin_presets())
