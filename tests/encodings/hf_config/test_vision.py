"""Vision mappings against transformers: Swin's `relative_position_index` buffers of a
`SwinModel`, BEiT's `generate_relative_position_index` and bias, ViT's learned table through
`ViTEmbeddings.interpolate_pos_encoding`, and ViTMAE's fixed sin-cos tables (bit for bit)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import AutoConfig

from posenc.encodings import ConfigError, compute, content_key
from posenc.encodings.hf_config import resolve_hf_config
from tests.encodings.hf_config.support import _problem_fields, hf_config, load


def _quiet(build: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build()


def test_swin_index_equals_every_buffer_of_a_swin_model() -> None:
    """SwinModel built from the published config (embed_dim shrunk to 6: the index depends on
    window_size only): every block's relative_position_index buffer is our (N, N) index."""
    from transformers import SwinModel

    config = load("microsoft__swin-tiny-patch4-window7-224.json")
    (named,) = resolve_hf_config(config)
    index = compute(named.spec).tensors["index"]
    assert index.shape == (49, 49)
    torch.manual_seed(0)
    model = _quiet(lambda: SwinModel(hf_config({**config, "embed_dim": 6})))
    buffers = [b for n, b in model.named_buffers() if n.endswith("relative_position_index")]
    assert len(buffers) == sum(config["depths"])
    for buffer in buffers:
        assert buffer.dtype == index.dtype
        assert torch.equal(buffer, index.reshape(-1))
    assert named.notes["num_heads_per_stage"] == [3, 6, 12, 24]


def test_swin_bias_equals_relative_position_bias_forward() -> None:
    from transformers.models.swin.modeling_swin import SwinRelativePositionBias

    config = load("microsoft__swin-tiny-patch4-window7-224.json")
    torch.manual_seed(0)
    module = SwinRelativePositionBias(3, (7, 7))
    with torch.no_grad():
        module.relative_position_bias_table.normal_()
        hf = module()[0]
    table = module.relative_position_bias_table.detach().tolist()
    (named,) = resolve_hf_config(config, relative_position_bias_table=table)
    assert torch.equal(compute(named.spec).tensors["bias"], hf)


def test_swin_absolute_embeddings_resample_as_swin_embeddings() -> None:
    from transformers.models.swin.modeling_swin import SwinEmbeddings

    config = {
        **load("microsoft__swin-tiny-patch4-window7-224.json"),
        "use_absolute_embeddings": True,
        "embed_dim": 8,
    }
    with pytest.raises(ConfigError) as info:
        resolve_hf_config(config)
    assert _problem_fields(info.value) == ["table_key"]
    torch.manual_seed(0)
    module = SwinEmbeddings(hf_config(config))
    with torch.no_grad():
        module.position_embeddings.normal_()
    table = module.position_embeddings.detach()[0]
    for height, width in ((224, 224), (160, 160), (320, 256)):
        new_grid = [height // 4, width // 4]
        (named,) = resolve_hf_config(
            config, kind="learned", table=table.tolist(), new_grid=new_grid
        )
        assert named.spec.model_dump()["num_prefix_tokens"] == 0
        embeddings = torch.zeros(1, new_grid[0] * new_grid[1], 8)
        with torch.no_grad():
            hf = module.interpolate_pos_encoding(embeddings, height, width)[0]
        assert torch.equal(compute(named.spec).tensors["embedding"], hf), (height, width)


def test_beit_index_and_bias_equal_beit_relative_position_bias() -> None:
    from transformers.models.beit.modeling_beit import BeitRelativePositionBias

    config = load("microsoft__beit-base-patch16-224.json")
    (bare,) = resolve_hf_config(config)
    index = compute(bare.spec).tensors["index"]
    hf_index = BeitRelativePositionBias.generate_relative_position_index((14, 14))
    assert index.shape == (197, 197)
    assert torch.equal(index, hf_index)
    torch.manual_seed(0)
    module = _quiet(lambda: BeitRelativePositionBias(hf_config(config)))
    with torch.no_grad():
        module.relative_position_bias_table.normal_()
        hf = module((14, 14))[0]
    table = module.relative_position_bias_table.detach().tolist()
    (named,) = resolve_hf_config(config, relative_position_bias_table=table)
    assert torch.equal(compute(named.spec).tensors["bias"], hf)
    # the checkpoint's table uploaded to a TableStore and named by key: the same spec key and bias
    from posenc.encodings.weights import TableStore, resolve_tables

    store = TableStore()
    key = store.put(module.relative_position_bias_table.detach())
    (by_key,) = resolve_hf_config(
        config,
        relative_position_bias_table_key=key,
        relative_position_bias_table_shape=[732, 12],
    )
    assert content_key(by_key.spec) == content_key(named.spec)
    assert torch.equal(compute(resolve_tables(by_key.spec, store)).tensors["bias"], hf)


def test_data2vec_vision_shared_bias_on_a_non_square_grid() -> None:
    """data2vec-vision as transformers serialises it, shared bias, 224x160 images (a 14x10 patch
    grid, so height and width cannot be swapped unnoticed)."""
    from transformers import Data2VecVisionModel

    config = _quiet(
        lambda: AutoConfig.for_model(
            "data2vec-vision",
            use_shared_relative_position_bias=True,
            image_size=[224, 160],
            hidden_size=8,
            num_attention_heads=2,
            intermediate_size=8,
            num_hidden_layers=1,
        ).to_dict()
    )
    (named,) = resolve_hf_config(config)
    assert named.spec.model_dump()["window_size"] == [14, 10]
    assert "shared" in named.notes["bias"]
    model = _quiet(lambda: Data2VecVisionModel(hf_config(config)))
    bias = model.encoder.relative_position_bias
    assert tuple(bias.window_size) == (14, 10)
    hf_index = bias.generate_relative_position_index(tuple(bias.window_size))
    assert torch.equal(compute(named.spec).tensors["index"], hf_index)


def test_beit_absolute_embeddings_need_the_uploaded_table() -> None:
    config = {
        **load("microsoft__beit-base-patch16-224.json"),
        "use_absolute_position_embeddings": True,
    }
    with pytest.raises(ConfigError) as info:
        resolve_hf_config(config)
    assert _problem_fields(info.value) == ["table_key"]
    assert "embeddings.position_embeddings" in info.value.problems[0].message
    (index,) = resolve_hf_config(config, kind="relative_index")
    assert index.name == "relative_index"
    names = [n.name for n in resolve_hf_config(config, table_key="1" * 64)]
    assert names == ["relative_index", "learned"]
    # A 14x10 grid: the learned table cannot be resampled, the index still resolves.
    wide = {**config, "image_size": [224, 160]}
    with pytest.raises(ConfigError) as info:
        resolve_hf_config(wide, table_key="1" * 64)
    assert _problem_fields(info.value) == ["image_size"]
    (index,) = resolve_hf_config(wide, kind="relative_index")
    assert index.spec.model_dump()["window_size"] == [14, 10]


@pytest.mark.parametrize(("height", "width"), [(224, 224), (384, 384), (320, 240), (160, 160)])
def test_vit_learned_table_equals_interpolate_pos_encoding(height: int, width: int) -> None:
    """The table uploaded to a TableStore, bound by key, resampled to the model's grid: exactly
    what ViTEmbeddings adds with interpolate_pos_encoding=True."""
    from transformers.models.vit.modeling_vit import ViTEmbeddings

    from posenc.encodings.weights import TableStore, resolve_tables

    config = load("google__vit-base-patch16-224-in21k.json")
    torch.manual_seed(0)
    module = _quiet(lambda: ViTEmbeddings(hf_config(config)))
    store = TableStore()
    key = store.put(module.position_embeddings.detach())
    new_grid = [height // 16, width // 16]
    (named,) = resolve_hf_config(config, table_key=key, new_grid=new_grid)
    assert named.name == "learned"
    spec = resolve_tables(named.spec, store)
    embeddings = torch.zeros(1, 1 + new_grid[0] * new_grid[1], 768)
    with torch.no_grad():
        hf = module.interpolate_pos_encoding(embeddings, height, width)[0]
    assert torch.equal(compute(spec).tensors["embedding"], hf)


def test_vit_mae_tables_equal_initialize_weights() -> None:
    from transformers.models.vit_mae.modeling_vit_mae import ViTMAEDecoder, ViTMAEEmbeddings

    config = load("facebook__vit-mae-base.json")
    cfg = hf_config({**config, "decoder_num_hidden_layers": 1})
    torch.manual_seed(0)
    embeddings = ViTMAEEmbeddings(cfg)
    embeddings.initialize_weights()
    decoder = ViTMAEDecoder(cfg, num_patches=embeddings.patch_embeddings.num_patches)
    hf = {
        "sinusoidal_2d:encoder": embeddings.position_embeddings.detach()[0],
        "sinusoidal_2d:decoder": decoder.decoder_pos_embed.detach()[0],
    }
    resolved = resolve_hf_config(config)
    assert [n.name for n in resolved] == list(hf)
    for named in resolved:
        ours = compute(named.spec).tensors["embedding"]
        assert ours.dtype == hf[named.name].dtype == torch.float32
        assert torch.equal(ours, hf[named.name]), named.name


def test_vit_mae_equal_widths_share_one_table() -> None:
    config = {**load("facebook__vit-mae-base.json"), "decoder_hidden_size": 768}
    (named,) = resolve_hf_config(config)
    assert named.name == "sinusoidal_2d"
    assert resolve_hf_config(config, layer_type="decoder") == [named]
