"""The generated config-class data (`service/posenc/encodings/hf_config/transformers_classes.json`,
issue 30 item 1): it is what the installed transformers says, and resolve reads configs through
it (JetMoE's and Zamba2's `head_dim` aliases at their released shapes)."""

from __future__ import annotations

import json

import httpx
import pytest

from posenc.encodings.hf_config import MAPPERS, MODEL_DEFAULTS
from posenc.encodings.hf_config.classes import config_class, transformers_version
from posenc.encodings.hf_config.models import Gemma4Rope, LayerTypeRope
from tests.encodings.hf_config import class_data, released_sweep
from tests.encodings.hf_config import rope_sweep as sweep


def test_committed_file_is_what_transformers_generates() -> None:
    """`make models-data` rewrites the file; a transformers upgrade (or a hand edit) that changes
    any class's aliases or defaults fails here until it is regenerated."""
    committed = class_data.DATA.read_text(encoding="utf-8")
    generated = class_data.render(class_data.generate())
    assert json.loads(committed) == json.loads(generated), (
        "transformers_classes.json differs from the installed transformers: run make models-data"
    )
    assert committed == generated


def test_data_covers_every_config_class() -> None:
    """Every model_type of CONFIG_MAPPING is in the file with its class, aliases and defaults."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    assert transformers_version() == transformers.__version__
    for model_type in CONFIG_MAPPING_NAMES:
        cls = CONFIG_MAPPING[model_type]
        facts = config_class(model_type)
        assert facts is not None, model_type
        assert facts.name == cls.__name__
        assert dict(facts.attribute_map) == dict(cls.attribute_map), model_type
    jetmoe = config_class("jetmoe")
    assert jetmoe is not None
    assert jetmoe.attribute_map["head_dim"] == "kv_channels"
    assert jetmoe.defaults["kv_channels"] == 128


def test_hand_defaults_agree_with_the_classes() -> None:
    """`MODEL_DEFAULTS` (hand-listed keys beside the generated data) never contradicts a class
    default the data holds."""
    for model_type, hand in MODEL_DEFAULTS.items():
        facts = config_class(model_type)
        if facts is None:
            continue
        for key, value in hand.items():
            if key in facts.defaults:
                assert facts.defaults[key] == value, (model_type, key, value)


def _rope_specs(client: httpx.Client, data: dict[str, object]) -> list[dict[str, object]]:
    response = client.post("/v1/resolve", json={"hf_config": data, "max_positions": sweep.SEQ})
    assert response.status_code == 200, response.text
    return [s for s in response.json()["specs"] if s["kind"] == "rope"]


@pytest.mark.parametrize(("model_type", "head_dim"), [("jetmoe", 128), ("zamba2", 160)])
def test_alias_head_dim_at_the_released_shape(
    client: httpx.Client, model_type: str, head_dim: int
) -> None:
    """JetMoE (`head_dim` -> `kv_channels`) and Zamba2 (`head_dim` -> `attention_head_dim`) at
    their default config.json, and sparse (the alias target omitted): the rotary width is the
    model's (128, 160, not hidden_size / heads) and the tables are its rotary module's."""
    ref = released_sweep.reference(model_type)
    width = sweep.model_facts(ref)["layers"]["all"]
    assert ref.layers[0].cos is not None
    assert int(ref.layers[0].cos.shape[-1]) == head_dim, width
    sparse, dropped = released_sweep.sparse_config(model_type)
    for data in (released_sweep.default_config(model_type), sparse):
        specs = _rope_specs(client, data)
        assert [s["spec"]["head_dim"] for s in specs] == [head_dim]  # type: ignore[index]
        assert sweep.judge(ref, sweep.posenc_tables(data, sweep.SEQ)).outcome == "exact"
    assert "kv_channels" in dropped or model_type != "jetmoe"


def test_per_layer_type_bases_agree_with_the_classes() -> None:
    """The bases a family's mapper fills per layer type (`LayerTypeRope.theta_defaults`,
    Gemma 4's `LAYER_THETA`) are its config class's: `default_theta` per "global" / "local"
    layer, else its one default base, else its default rope parameters per layer type."""
    names = {"global": "full_attention", "local": "sliding_attention"}
    checked = 0
    for model_type, mapper in MAPPERS.items():
        if isinstance(mapper, LayerTypeRope):
            hand = dict(mapper.theta_defaults)
        elif isinstance(mapper, Gemma4Rope):
            hand = dict(mapper.LAYER_THETA)
        else:
            continue
        facts = config_class(model_type)
        assert facts is not None, model_type
        by_type = facts.defaults.get("rope_theta_by_layer_type")
        params = facts.defaults.get("rope_parameters") or {}
        for layer_type, theta in hand.items():
            if by_type is not None:
                want = {names.get(k, k): v for k, v in by_type.items()}[layer_type]
            elif isinstance(params.get(layer_type), dict):
                want = params[layer_type]["rope_theta"]
            elif "rope_theta" in facts.defaults:
                want = facts.defaults["rope_theta"]
            else:
                continue  # a class without rope parameters of its own (T5Gemma 2's encoder)
            assert theta == want, (model_type, layer_type, theta, want)
            checked += 1
    assert checked >= 10


def test_models_doc_names_the_alias_table() -> None:
    """docs/models.md names the alias table's file, generator and release and lists every alias
    of a key resolve reads, as the doc generator (`make models-doc`) writes them from the
    committed data file: a regenerated data file with a stale doc fails here."""
    block = "\n".join(sweep.alias_lines())
    assert block in sweep.DOCS.read_text(encoding="utf-8"), "docs/models.md: run make models-doc"
    assert "| `head_dim` | `kv_channels` | `jetmoe` |" in block
