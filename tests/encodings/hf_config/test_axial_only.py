"""Axial-only rotary (issue 30 item 4): every config class of the installed transformers whose
`default_rope_type` is "axial" (the vision towers, MLCD, the SAM 2 / SAM 3 video and ViT towers)
builds its rotary module only for axial RoPE (`ValueError: ... supports only axial rope` for any
other rope_type, where the config loads at all); a config.json of such a class naming another
rope_type (YaRN here) is refused by posenc, naming `rope_parameters.rope_type`, never answered
with a 1-D table. The classes and the modules' refusal are read from transformers, not listed
here.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from posenc.encodings import SpecError
from tests.encodings.hf_config import released_sweep as released
from tests.encodings.hf_config import rope_sweep as sweep

YARN = {
    "rope_type": "yarn",
    "factor": 2.0,
    "original_max_position_embeddings": 1024,
    "rope_theta": 10000.0,
}


def _axial_types() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    return sorted(
        t
        for t in CONFIG_MAPPING_NAMES
        if getattr(CONFIG_MAPPING[t], "default_rope_type", "default") == "axial"
    )


TYPES = _axial_types()


def _axial_only_classes(config: Any) -> list[type]:
    """The rotary classes of the config's modeling module that refuse a non-axial rope_type."""
    module = sweep._modeling_module(config)
    return [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__ and "supports only axial rope" in sweep.source(cls)
    ]


def test_the_axial_classes_come_from_transformers() -> None:
    assert len(TYPES) > 20
    assert {"mlcd", "sam2_video", "sam3_vit_model", "qwen2_vl_vision"} <= set(TYPES)


@pytest.mark.parametrize("model_type", TYPES)
def test_another_rope_type_is_refused_as_transformers_refuses_it(model_type: str) -> None:
    try:
        data = released.default_config(model_type)
    except sweep.UnbuildableError as err:
        pytest.skip(f"transformers cannot build its default config: {err}")
    if "rope_parameters" not in data:
        # GLM-Image's vision config inherits default_rope_type but has no rotary of its own
        pytest.skip("the class carries no rope parameters (no rotary of its own)")
    data["rope_parameters"] = dict(YARN)
    classes = _axial_only_classes(sweep.load_config(released.default_config(model_type)))
    try:
        config = sweep.load_config(data)
    except Exception:
        config = None  # transformers refuses the file already (YaRN's validation)
    if config is not None and classes:
        raised = []
        for cls in classes:
            try:
                cls(config=config)
            except ValueError as err:
                raised.append(str(err))
            except Exception:
                continue  # a class built from another sub-config of the model
        assert any("supports only axial rope" in r for r in raised), (model_type, raised)
    with pytest.raises(SpecError) as refused:
        sweep.posenc_tables(data, sweep.SEQ)
    fields = [p.field for p in refused.value.problems]
    # posenc names the rope_type, or refuses the tower earlier for another reason (a model_type
    # it does not map, or no max_position_embeddings for rows)
    assert {"rope_parameters.rope_type", "model_type", "max_positions"} & set(fields), fields
