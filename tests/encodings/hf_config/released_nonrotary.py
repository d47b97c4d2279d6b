"""Released checkpoints of the non-rotary sweep (`nonrotary_sweep.VARIANTS`: the `+size` rows and
TrOCR's sinusoidal decoder):
per case the checkpoint it stands for, the config.json values a public source shows for it, and
that source (issue 31: every released row checked against the real file, or marked unverified).

The Hugging Face Hub is not reachable from the test machines, so each row names where its values
were read: a real config.json vendored in tests/data/configs (downloaded from the Hub), a copy of
the checkpoint's config.json on the Hub or GitHub (a fine-tune or quantisation whose
`_name_or_path` is the checkpoint, or a printout of the Hub snapshot), or the code that produced
the checkpoint (its training script, the original repository's model definition, or
transformers' conversion script). `config` holds the values as that source spells them (BLOOM
176B's `n_embed` / `num_attention_heads`, Falcon-RW's `n_head` / `n_layer`), only keys the source
states. A row no source confirms has `verified=False` and its `checkpoint` names what it
resembles, not a release; the docs and the report list it as unverified.

`test_nonrotary_sweep.py::test_a_released_config_resolves_as_its_sweep_row` resolves each
`config` as a user's config.json (`resolve_hf_parts` of the raw mapping) and requires the same
tables as the sweep's row (transformers' config object built from the same keys), whose tables
the sweep compares with the model's own code.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "configs"


@dataclasses.dataclass(frozen=True)
class Released:
    """One released checkpoint: `model_type`, the `checkpoint` id, the `source` its values were
    read from, the config.json `config` values (as spelled there), `copy` (True: the values are
    read from the config.json file itself, or a copy of it; False: from the code or docs that
    set them, the file being the config class's `save_pretrained` output with these values over
    its defaults), `verified` (False: no source confirms the values)."""

    model_type: str
    checkpoint: str
    source: str
    config: dict[str, Any]
    copy: bool = True
    verified: bool = True


def vendored(name: str) -> dict[str, Any]:
    """The config.json of tests/data/configs/`name`.json (a real Hub file), without the keys
    `AutoConfig.for_model` takes apart (`model_type`, `transformers_version`)."""
    data: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text(encoding="utf-8"))
    return {k: v for k, v in data.items() if k not in ("model_type", "transformers_version")}


_VENDORED = "tests/data/configs/{}.json (the Hub's config.json)"

RELEASED: dict[str, Released] = {
    "bloom+176b": Released(
        "bloom",
        "bigscience/bloom",
        "huggingface.co/joaoalvarenga/bloom-8bit/blob/main/config.json (_name_or_path "
        "bigscience/bloom: the file as released, n_embed / num_attention_heads spelling); "
        "github.com/bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm "
        "(NHIDDEN=14336, NLAYERS=70, NHEADS=112, alibi)",
        {
            "n_embed": 14336,
            "n_layer": 70,
            "num_attention_heads": 112,
            "pretraining_tp": 4,
            "slow_but_exact": False,
            "masked_softmax_fusion": True,
            "attention_softmax_in_fp32": True,
            "apply_residual_connection_post_layernorm": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "vocab_size": 250880,
        },
    ),
    "bloom+7b1": Released(
        "bloom",
        "bigscience/bloom-7b1",
        "huggingface.co/iproskurina/bloom-7b1-GPTQ-4bit-g128/blob/045583d/config.json and "
        "huggingface.co/izhx/udever-bloom-7b1 config.json (_name_or_path bigscience/bloom-7b1); "
        "github.com/bigscience-workshop/bigscience train/tr11-176B-ml/smaller_models/"
        "tr11f-6B3-ml.slurm (the 7b1 run, first named 6B3: NLAYERS=30, NHIDDEN=4096, NHEADS=32)",
        {
            "hidden_size": 4096,
            "n_head": 32,
            "n_layer": 30,
            "n_inner": None,
            "offset_alibi": 100,
            "pad_token_id": 3,
            "pretraining_tp": 1,
            "slow_but_exact": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "unk_token_id": 0,
            "vocab_size": 250880,
        },
    ),
    "bloom+560m": Released(
        "bloom",
        "bigscience/bloom-560m",
        _VENDORED.format("bigscience__bloom-560m"),
        vendored("bigscience__bloom-560m"),
    ),
    "mpt+7b": Released(
        "mpt", "mosaicml/mpt-7b", _VENDORED.format("mosaicml__mpt-7b"), vendored("mosaicml__mpt-7b")
    ),
    # mosaicml/mpt-30b's own config.json was not reachable: its chat fine-tune (same 30B
    # geometry) as released at its first commit.
    "mpt+30b": Released(
        "mpt",
        "mosaicml/mpt-30b-chat",
        "huggingface.co/mosaicml/mpt-30b-chat/blame/437d912b723f762097b83a361bc5f2c70adc0a58/"
        "config.json (the repository's own file; later commits set max_seq_len 8192)",
        {
            "attn_config": {
                "alibi": True,
                "alibi_bias_max": 8,
                "attn_impl": "torch",
                "attn_pdrop": 0,
                "attn_type": "multihead_attention",
                "attn_uses_sequence_id": True,
                # 6 in the file: transformers 5.24's MptAttentionConfig (a strict dataclass)
                # refuses the int for its float field, as it would refuse the file itself.
                "clip_qkv": 6.0,
                "prefix_lm": False,
                "qk_ln": False,
                "softmax_scale": None,
            },
            "d_model": 7168,
            "emb_pdrop": 0,
            "embedding_fraction": 1.0,
            "expansion_ratio": 4,
            "learned_pos_emb": True,
            "logit_scale": None,
            "max_seq_len": 2048,
            "n_heads": 64,
            "n_layers": 48,
            "no_bias": True,
            "norm_type": "low_precision_layernorm",
            "resid_pdrop": 0,
            "use_cache": False,
            "vocab_size": 50432,
        },
    ),
    "falcon+rw-7b": Released(
        "falcon",
        "tiiuae/falcon-rw-7b",
        "huggingface.co/yuanzhoulvpi/chinese_falcon_7b_chat/blob/main/config.json (a fine-tune "
        "whose _name_or_path is falcon-rw-7b: the values of its RefinedWebModel config.json), "
        "spelled as the in-library conversion of its sibling tests/data/configs/"
        "tiiuae__falcon-rw-1b.json (model_type falcon, num_attention_heads, num_hidden_layers: "
        "transformers 5.24's FalconConfig has no n_head / n_layer alias)",
        {
            "alibi": True,
            "apply_residual_connection_post_layernorm": False,
            "attention_dropout": 0.0,
            "bias": True,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_dropout": 0.0,
            "hidden_size": 4096,
            "initializer_range": 0.02,
            "layer_norm_epsilon": 1e-05,
            "multi_query": False,
            "new_decoder_architecture": False,
            "num_attention_heads": 64,
            "num_hidden_layers": 36,
            "parallel_attn": False,
            "use_cache": True,
            "vocab_size": 65024,
        },
    ),
    "whisper+tiny": Released(
        "whisper",
        "openai/whisper-tiny",
        _VENDORED.format("openai__whisper-tiny"),
        vendored("openai__whisper-tiny"),
    ),
    "whisper+large-v3": Released(
        "whisper",
        "openai/whisper-large-v3",
        "github.com/Xianchao-Wu/distil-whisper training/run_pseudo_labelling.py (a printout of "
        "openai/whisper-large-v3's config.json, Hub snapshot "
        "06f233fe06e710322aca913c1bc4249a0d71fce1)",
        {
            "d_model": 1280,
            "decoder_attention_heads": 20,
            "decoder_ffn_dim": 5120,
            "decoder_layers": 32,
            "encoder_attention_heads": 20,
            "encoder_ffn_dim": 5120,
            "encoder_layers": 32,
            "max_source_positions": 1500,
            "max_target_positions": 448,
            "num_hidden_layers": 32,
            "num_mel_bins": 128,
            "pad_token_id": 50256,
            "scale_embedding": False,
            "vocab_size": 51866,
        },
    ),
    "xlnet+base": Released(
        "xlnet",
        "xlnet/xlnet-base-cased",
        "github.com/zihangdai/xlnet README.md (XLNet-Base, Cased: 12-layer, 768-hidden, "
        "12-heads; d_inner is not stated there and is left at the class default)",
        {"d_model": 768, "n_head": 12, "n_layer": 12},
        copy=False,
    ),
    "swin+window12": Released(
        "swin",
        "microsoft/swin-base-patch4-window12-384",
        "github.com/huggingface/pytorch-image-models timm/models/swin_transformer.py "
        "swin_base_patch4_window12_384 (the converted checkpoint: patch 4, window 12, embed 128, "
        "depths (2, 2, 18, 2), heads (4, 8, 16, 32), 384 px); transformers "
        "convert_swin_timm_to_pytorch.py get_swin_config (base sizes, image size from the name)",
        {
            "image_size": 384,
            "patch_size": 4,
            "window_size": 12,
            "embed_dim": 128,
            "depths": [2, 2, 18, 2],
            "num_heads": [4, 8, 16, 32],
        },
        copy=False,
    ),
    "beit+large": Released(
        "beit",
        "microsoft/beit-large-patch16-512",
        "github.com/huggingface/transformers src/transformers/models/beit/"
        "convert_beit_unilm_to_pytorch.py (beit_large_patch16_512_pt22k_ft22kto1k: 'to1k' sets "
        "use_relative_position_bias and image_size 512; 'large' sets 1024 / 4096 / 24 / 16)",
        {
            "use_relative_position_bias": True,
            "image_size": 512,
            "patch_size": 16,
            "hidden_size": 1024,
            "num_attention_heads": 16,
            "num_hidden_layers": 24,
            "intermediate_size": 4096,
        },
        copy=False,
    ),
    "vit_mae+large": Released(
        "vit_mae",
        "facebook/vit-mae-large",
        "github.com/huggingface/transformers src/transformers/models/vit_mae/"
        "convert_vit_mae_to_pytorch.py ('large': 1024 / 4096 / 24 layers / 16 heads)",
        {
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
        },
        copy=False,
    ),
    "vit_mae+huge": Released(
        "vit_mae",
        "facebook/vit-mae-huge",
        "github.com/huggingface/transformers src/transformers/models/vit_mae/"
        "convert_vit_mae_to_pytorch.py ('huge': patch 14, 1280 / 5120 / 32 layers / 16 heads)",
        {
            "patch_size": 14,
            "hidden_size": 1280,
            "intermediate_size": 5120,
            "num_hidden_layers": 32,
            "num_attention_heads": 16,
        },
        copy=False,
    ),
    "marian+opus-mt": Released(
        "marian",
        "Helsinki-NLP/opus-mt-en-de",
        _VENDORED.format("Helsinki-NLP__opus-mt-en-de"),
        vendored("Helsinki-NLP__opus-mt-en-de"),
    ),
    "donut-swin+base": Released(
        "donut-swin",
        "naver-clova-ix/donut-base (encoder)",
        "github.com/clovaai/donut donut/model.py DonutConfig defaults (input_size [2560, 1920], "
        "window_size 10, encoder_layer [2, 2, 14, 2]); github.com/huggingface/transformers "
        "src/transformers/models/donut/convert_donut_to_pytorch.py get_configs (image_size = "
        "input_size, patch 4, embed 128, heads [4, 8, 16, 32])",
        {
            "image_size": [2560, 1920],
            "patch_size": 4,
            "window_size": 10,
            "embed_dim": 128,
            "depths": [2, 2, 14, 2],
            "num_heads": [4, 8, 16, 32],
        },
        copy=False,
    ),
    "pegasus_x+base": Released(
        "pegasus_x",
        "google/pegasus-x-base",
        "github.com/google-research/pegasus pegasus/flax/configs/pegasus_x_base.py over "
        "pegasus_base.py (emb_dim 768, 12 + 12 layers, 12 heads, mlp 3072, 128 global tokens, "
        "blocks of 512, max input 16384)",
        {
            "d_model": 768,
            "encoder_layers": 12,
            "decoder_layers": 12,
            "encoder_attention_heads": 12,
            "decoder_attention_heads": 12,
            "encoder_ffn_dim": 3072,
            "decoder_ffn_dim": 3072,
            "num_global_tokens": 128,
            "block_size": 512,
            "stagger_local_blocks": True,
            "max_position_embeddings": 16384,
        },
        copy=False,
    ),
    "musicgen_decoder+large": Released(
        "musicgen_decoder",
        "facebook/musicgen-large (decoder)",
        "github.com/facebookresearch/audiocraft config/model/lm/model_scale/large.yaml (dim 2048, "
        "num_heads 32, num_layers 48); github.com/huggingface/transformers "
        "src/transformers/models/musicgen/convert_musicgen_transformers.py "
        "decoder_config_from_checkpoint (ffn_dim = 4 * hidden_size)",
        {
            "hidden_size": 2048,
            "num_attention_heads": 32,
            "num_hidden_layers": 48,
            "ffn_dim": 8192,
        },
        copy=False,
    ),
    "videomae+large": Released(
        "videomae",
        "MCG-NJU/videomae-large",
        "github.com/huggingface/transformers src/transformers/models/videomae/"
        "convert_videomae_to_pytorch.py set_architecture_configs ('large': 1024 / 16 / 4096, "
        "decoder 512 / 8 / 2048)",
        {
            "hidden_size": 1024,
            "num_attention_heads": 16,
            "intermediate_size": 4096,
            "decoder_hidden_size": 512,
            "decoder_num_attention_heads": 8,
            "decoder_intermediate_size": 2048,
        },
        copy=False,
    ),
    # The sinusoidal TrOCR decoders are large-printed and the stage-1 checkpoints (the base
    # handwritten / printed ones learn their positions), with 1024 positions.
    "trocr+sinusoidal": Released(
        "trocr",
        "microsoft/trocr-large-printed (decoder)",
        "github.com/huggingface/transformers src/transformers/models/trocr/"
        "convert_trocr_unilm_to_pytorch.py ('large-printed' or 'stage1' in the checkpoint: "
        "sinusoidal positions, max_position_embeddings 1024, scale_embedding, no "
        "layernorm_embedding, relu, untied embeddings; TrOCRConfig's defaults otherwise)",
        {
            "use_learned_position_embeddings": False,
            "max_position_embeddings": 1024,
            "scale_embedding": True,
            "layernorm_embedding": False,
            "activation_function": "relu",
            "tie_word_embeddings": False,
        },
        copy=False,
    ),
    "swinv2+window16": Released(
        "swinv2",
        "microsoft/swinv2-base-patch4-window12to16-192to256-22kto1k-ft",
        "github.com/huggingface/transformers src/transformers/models/swinv2/"
        "convert_swinv2_timm_to_pytorch.py get_swinv2_config ('base': 128, (2, 2, 18, 2), "
        "(4, 8, 16, 32); window 16 at 256 px; 'to' in the name: pretrained_window_sizes "
        "(12, 12, 12, 6))",
        {
            "image_size": 256,
            "window_size": 16,
            "pretrained_window_sizes": [12, 12, 12, 6],
            "embed_dim": 128,
            "depths": [2, 2, 18, 2],
            "num_heads": [4, 8, 16, 32],
        },
        copy=False,
    ),
}
"""case -> the released checkpoint it stands for, its config.json values and their source."""
