"""Compute time of every family and RoPE variant against transformers computing the same table.

    python -m bench.compute [--quick] [--rounds 5] [--no-plot] [--gpu-only]

CPU section: for each case, posenc's `compute(spec, "cpu")` (the public entry point: canonical
form, content key, the family's compute) and transformers building the same table from the same
configuration, in one process, alternating rounds (the side that goes first rotates), medians
kept. Each measurement repeats the call until it lasts 20 ms. The ratio is transformers' time /
posenc's: above 1, posenc is faster. Every case also checks the two tables against each other
(`torch.equal`, or the largest relative difference where the slopes differ by design: posenc
rounds the float64 reference slopes once, BLOOM and MPT compute them with fp32 `pow`).

Transformers' side, per family:

- rope/<variant>: the model's rotary module forward for positions 0..P-1 (Llama for default,
  linear, dynamic and llama3; Qwen2 yarn; Phi-3.5 longrope; Gemma 4 proportional; HunYuan
  ntk_alpha), configs from `tests/encodings/rope/hf_models.py`;
- alibi: BLOOM `build_alibi_tensor` (112 heads), MPT `build_mpt_alibi_tensor` (32 heads), both
  (H, 1, K);
- t5_bias: `T5Attention.compute_bias(Q, K)` with t5-base's shape (12 heads, 32 buckets);
- sinusoidal: Whisper `sinusoids`, M2M100 `get_embedding` (padding row), Marian `create_weight`;
- sinusoidal_2d: DETR `build_sine_position_embedding` (its lru_cache bypassed), ViTMAE
  `build_2d_sinusoidal_position_embedding` plus ViTMAE's half rotation;
- relative_index: Swin `SwinRelativePositionBias._create_relative_position_index` (the method
  `__init__` stores as the `relative_position_index` buffer) for windows 7, 12, 24, and with a
  bias table that method plus the module's forward (the gather); BEiT
  `BeitRelativePositionBias.generate_relative_position_index` (its lru_cache bypassed) for
  windows 14 and 24, and with a bias table that function plus `BeitRelativePositionBias.forward`;
- learned: ViT `ViTEmbeddings.interpolate_pos_encoding` resampling vit-base's (197, 768) table
  (random, seeded) from 14x14 to 24x24 (224 -> 384 pixels) and 32x32 (512), the same tensor
  inline in posenc's `hf_vit` spec.

Both sides run single-threaded by default (`--threads`) and with glibc's mmap threshold fixed
(the bench re-executes itself with `MALLOC_MMAP_THRESHOLD_=131072`): every large allocation is
fresh pages, as a table entering the cache is, and timings do not depend on what ran before.

GPU section (only when CUDA is available; otherwise it prints why it is skipped): the device's
copy bandwidth measured in the same run (`dst.copy_(src)` of 1 GiB fp32, bytes written per second)
and, for tables of 4 K to 1 M positions (and T5 buckets of 1024 to 4096 squared), bytes written
per second by `compute(spec, "cuda")` as a fraction of it: per synchronised call (wall time, the
host's work included) and per call on the device (CUDA events, kernels and copies only), for the
fused Triton kernel (issue 36, where the table takes it) and for torch's ops (the fused path off).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bench._common import (
    FIXED_MALLOC,
    IMG_DIR,
    alternate,
    header,
    load,
    mib,
    ms,
    pyplot,
    reexec_with,
    save,
    table,
    time_call,
)
from posenc.encodings import SpecBase, compute, fused, parse_spec
from posenc.encodings.rope import RopeSpec, rope_inv_freq
from posenc.encodings.rope.compute import fused_tables
from posenc.encodings.sinusoidal import SinusoidalSpec, fused_table

Tensors = dict[str, torch.Tensor]
Reference = Callable[[], Callable[[], Tensors]]
"""Setup (untimed: builds the module) -> the timed call, returning tensors named as posenc's."""

ROPE_SIZES = (4096, 32768, 131072)
MIN_SECONDS = 0.02
"""Each measurement repeats the call until it lasts this long."""


@dataclass(frozen=True)
class Case:
    family: str
    reference: str
    size: str
    spec: dict[str, Any]
    build: Reference
    exact: bool = True
    """False where the tables differ by design (ALiBi slopes): the largest relative difference
    is reported instead of bit-equality."""


def _quiet_transformers() -> None:
    from transformers.utils import logging

    logging.set_verbosity_error()


def rope_cases(sizes: tuple[int, ...]) -> list[Case]:
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import (
        HunYuanDenseV1RotaryEmbedding,
    )
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    from tests.encodings.rope import hf_models as hf

    def forward(
        make: Callable[[], torch.nn.Module], p: int, **kwargs: Any
    ) -> Callable[[], Callable[[], Tensors]]:
        def setup() -> Callable[[], Tensors]:
            module = make()
            x = torch.zeros(1, dtype=torch.float32)
            positions = torch.arange(p)[None]

            def run() -> Tensors:
                with torch.no_grad():
                    cos, sin = module(x, positions, **kwargs)
                return {"cos": cos[0], "sin": sin[0]}

            return run

        return setup

    dynamic = {"rope_type": "dynamic", "factor": 2.0}
    linear = {"rope_type": "linear", "factor": 8.0}
    variants: list[tuple[str, str, Callable[[int], torch.nn.Module], dict[str, Any], Any]] = [
        (
            "default",
            "LlamaRotaryEmbedding (Llama 2, d 128)",
            lambda p: LlamaRotaryEmbedding(hf.llama(128, {"rope_type": "default"}, 1e4, p)),
            {"head_dim": 128, "rope_theta": 1e4},
            {},
        ),
        (
            "linear",
            "LlamaRotaryEmbedding (linear x8, d 128)",
            lambda p: LlamaRotaryEmbedding(hf.llama(128, linear, 1e6, p)),
            {"head_dim": 128, "rope_theta": 1e6, "rope_scaling": linear},
            {},
        ),
        (
            "dynamic",
            "LlamaRotaryEmbedding (dynamic x2 over 2048, d 128)",
            lambda p: LlamaRotaryEmbedding(hf.llama(128, dynamic, 1e4, 2048)),
            {
                "head_dim": 128,
                "rope_theta": 1e4,
                "rope_scaling": {**dynamic, "max_position_embeddings": 2048},
            },
            {},
        ),
        (
            "yarn",
            "Qwen2RotaryEmbedding (Qwen2.5 yarn x4, d 128)",
            lambda p: Qwen2RotaryEmbedding(hf.qwen2_yarn()),
            {"head_dim": 128, "rope_theta": 1e6, "rope_scaling": hf.QWEN_YARN_ROPE},
            {},
        ),
        (
            "longrope",
            "Phi3RotaryEmbedding (Phi-3.5 mini, d 96)",
            lambda p: Phi3RotaryEmbedding(hf.phi35_mini()),
            {
                "head_dim": 96,
                "rope_theta": 1e4,
                "rope_scaling": {
                    "rope_type": "longrope",
                    "short_factor": hf.PHI35_SHORT_FACTOR,
                    "long_factor": hf.PHI35_LONG_FACTOR,
                    "original_max_position_embeddings": hf.PHI35_ORIG,
                    "max_position_embeddings": hf.PHI35_MAX,
                },
            },
            {},
        ),
        (
            "llama3",
            "LlamaRotaryEmbedding (Llama 3.1, d 128)",
            lambda p: LlamaRotaryEmbedding(hf.llama(128, hf.LLAMA31_ROPE, 5e5, 131072)),
            {"head_dim": 128, "rope_theta": 5e5, "rope_scaling": hf.LLAMA31_ROPE},
            {},
        ),
        (
            "proportional",
            "Gemma4TextRotaryEmbedding (full layers, d 512)",
            lambda p: Gemma4TextRotaryEmbedding(hf.gemma4_text()),
            {
                "head_dim": 512,
                "rope_theta": 1e6,
                "rope_scaling": {"rope_type": "proportional", "partial_rotary_factor": 0.25},
            },
            {"layer_type": "full_attention"},
        ),
        (
            "ntk_alpha",
            "HunYuanDenseV1RotaryEmbedding (alpha 1000, d 128)",
            lambda p: HunYuanDenseV1RotaryEmbedding(hf.hunyuan_dense()),
            {"head_dim": 128, "rope_scaling": {"rope_type": "ntk_alpha", "alpha": 1000.0}},
            {},
        ),
    ]
    cases = []
    for p in sizes:
        for name, ref, make, spec, kwargs in variants:
            cases.append(
                Case(
                    f"rope/{name}",
                    ref,
                    f"{p:,} positions",
                    {"kind": "rope", "max_positions": p, **spec},
                    forward(lambda make=make, p=p: make(p), p, **kwargs),
                )
            )
    return cases


def alibi_cases(sizes: tuple[int, ...]) -> list[Case]:
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    cases = []
    for k in sizes:

        def bloom(k: int = k) -> Callable[[], Tensors]:
            mask = torch.ones(1, k, dtype=torch.long)
            return lambda: {"bias": build_alibi_tensor(mask, 112, torch.float32)}

        def mpt(k: int = k) -> Callable[[], Tensors]:
            return lambda: {"bias": build_mpt_alibi_tensor(32, k)}

        # one query row at the last position: nothing is masked, (H, 1, K) as the builders give
        row = {"kind": "alibi", "query_length": 1, "key_length": k, "query_offset": k - 1}
        cases.append(
            Case(
                "alibi",
                "BLOOM build_alibi_tensor (112 heads)",
                f"(112, 1, {k:,})",
                {**row, "num_heads": 112, "bias": "row_constant"},
                bloom,
                exact=False,
            )
        )
        cases.append(
            Case(
                "alibi",
                "MPT build_mpt_alibi_tensor (32 heads)",
                f"(32, 1, {k:,})",
                {**row, "num_heads": 32, "bias": "mpt"},
                mpt,
                exact=False,
            )
        )
    return cases


def t5_cases(sizes: tuple[int, ...]) -> list[Case]:
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    config = T5Config(d_model=768, d_kv=64, num_heads=12, is_decoder=False)
    torch.manual_seed(0)
    module = T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
    weights = module.relative_attention_bias.weight.detach().tolist()
    cases = []
    for n in sizes:

        def setup(n: int = n) -> Callable[[], Tensors]:
            def run() -> Tensors:
                with torch.no_grad():
                    return {"bias": module.compute_bias(n, n)[0]}

            return run

        spec = {"kind": "t5_bias", "query_length": n, "key_length": n}
        cases.append(
            Case(
                "t5_bias",
                "T5Attention.compute_bias (t5-base: 12 heads, 32 buckets)",
                f"(12, {n:,}, {n:,})",
                {**spec, "relative_attention_bias": weights},
                setup,
            )
        )
    return cases


def sinusoidal_cases(quick: bool) -> list[Case]:
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding
    from transformers.models.whisper.modeling_whisper import sinusoids

    cases = []
    for p in (1500, 32768):
        cases.append(
            Case(
                "sinusoidal",
                "Whisper sinusoids (large-v3, 1280)",
                f"({p:,}, 1280)",
                {"kind": "sinusoidal", "dim": 1280, "max_positions": p, "convention": "whisper"},
                lambda p=p: lambda: {"embedding": sinusoids(p, 1280)},
            )
        )
    for p in (1026, 32770):
        cases.append(
            Case(
                "sinusoidal",
                "M2M100 get_embedding (1024, padding_idx 1)",
                f"({p:,}, 1024)",
                {"kind": "sinusoidal", "dim": 1024, "max_positions": p, "convention": "fairseq"},
                lambda p=p: (
                    lambda: {
                        "embedding": M2M100SinusoidalPositionalEmbedding.get_embedding(p, 1024, 1)
                    }
                ),
            )
        )
    for p in (512,) if quick else (512, 1024):

        def marian(p: int = p) -> Callable[[], Tensors]:
            module = MarianSinusoidalPositionalEmbedding(p, 512)
            return lambda: {"embedding": module.create_weight()}

        cases.append(
            Case(
                "sinusoidal",
                "Marian create_weight (opus-mt, 512)",
                f"({p:,}, 512)",
                {"kind": "sinusoidal", "dim": 512, "max_positions": p, "convention": "marian"},
                marian,
            )
        )
    return cases


def sinusoidal_2d_cases() -> list[Case]:
    from transformers.models.detr.modeling_detr import DetrSinePositionEmbedding
    from transformers.models.vit_mae.modeling_vit_mae import (
        build_2d_sinusoidal_position_embedding,
    )

    # the builder is wrapped in an lru_cache: time the computation, not a cache hit
    detr_build = DetrSinePositionEmbedding.build_sine_position_embedding.__wrapped__
    cases = []
    for h, w in ((25, 34), (100, 136), (200, 272)):

        def detr(h: int = h, w: int = w) -> Callable[[], Tensors]:
            shape = torch.Size((1, 3, h, w))
            return lambda: {
                "embedding": detr_build(shape, "cpu", torch.float32, 128, True, 2 * torch.pi)[0]
            }

        cases.append(
            Case(
                "sinusoidal_2d",
                "DETR build_sine_position_embedding (128 feats, normalize)",
                f"(256, {h}, {w})",
                {
                    "kind": "sinusoidal_2d",
                    "style": "detr",
                    "num_pos_feats": 128,
                    "height": h,
                    "width": w,
                    "normalize": True,
                },
                detr,
            )
        )
    for grid, dim in ((14, 768), (32, 1024), (64, 1024)):

        def mae(grid: int = grid, dim: int = dim) -> Callable[[], Tensors]:
            half = dim // 2

            def run() -> Tensors:
                ref = build_2d_sinusoidal_position_embedding(grid, grid, dim, cls_token=True)
                # ViTMAEEmbeddings.initialize_weights: MAE's order (x block first)
                return {"embedding": torch.cat([ref[:, half:], ref[:, :half]], dim=1)}

            return run

        cases.append(
            Case(
                "sinusoidal_2d",
                "ViTMAE build_2d_sinusoidal_position_embedding (+cls)",
                f"({grid * grid + 1:,}, {dim})",
                {
                    "kind": "sinusoidal_2d",
                    "style": "mae",
                    "dim": dim,
                    "grid_height": grid,
                    "grid_width": grid,
                    "cls_token": True,
                },
                mae,
            )
        )
    return cases


def relative_index_cases(quick: bool) -> list[Case]:
    from transformers import BeitConfig
    from transformers.models.beit.modeling_beit import BeitRelativePositionBias
    from transformers.models.swin.modeling_swin import SwinRelativePositionBias

    cases = []
    # Swin: __init__ stores `_create_relative_position_index().view(-1)` as the buffer; the
    # method is timed, its (N, N) result compared (the buffer is a view of it).
    for w in (7,) if quick else (7, 12, 24):

        def swin_index(w: int = w) -> Callable[[], Tensors]:
            module = SwinRelativePositionBias(1, (w, w))
            return lambda: {"index": module._create_relative_position_index()}

        n = w * w
        cases.append(
            Case(
                "relative_index",
                f"Swin _create_relative_position_index (window {w})",
                f"({n:,}, {n:,}) int64",
                {"kind": "relative_index", "scheme": "swin", "window_size": [w, w]},
                swin_index,
            )
        )
    # Swin with a bias table: the index as __init__ builds it, then forward's gather (which
    # reads the buffer): both tables built by transformers' code.
    for w, heads, model in (
        ((7, 3, "Swin-T stage 1"),)
        if quick
        else (
            (7, 3, "Swin-T stage 1"),
            (12, 4, "Swin-B 384 stage 1"),
        )
    ):
        torch.manual_seed(0)
        swin = SwinRelativePositionBias(heads, (w, w))
        with torch.no_grad():
            swin.relative_position_bias_table.normal_()

        def swin_bias(module: SwinRelativePositionBias = swin) -> Callable[[], Tensors]:
            def run() -> Tensors:
                with torch.no_grad():
                    index = module._create_relative_position_index()
                    return {"index": index, "bias": module()[0]}

            return run

        n = w * w
        cases.append(
            Case(
                "relative_index",
                f"Swin index + SwinRelativePositionBias.forward ({model}, {heads} heads)",
                f"({heads}, {n:,}, {n:,}) + index",
                {
                    "kind": "relative_index",
                    "scheme": "swin",
                    "window_size": [w, w],
                    "relative_position_bias_table": (
                        swin.relative_position_bias_table.detach().tolist()
                    ),
                },
                swin_bias,
            )
        )
    # BEiT: the builder is wrapped in an lru_cache: time the computation, not a cache hit
    beit_index = BeitRelativePositionBias.generate_relative_position_index.__wrapped__
    for w in (14,) if quick else (14, 24):

        def beit(w: int = w) -> Callable[[], Tensors]:
            return lambda: {"index": beit_index((w, w))}

        n = w * w + 1
        cases.append(
            Case(
                "relative_index",
                f"BEiT generate_relative_position_index (window {w}, +cls)",
                f"({n:,}, {n:,}) int64",
                {"kind": "relative_index", "scheme": "beit", "window_size": [w, w]},
                beit,
            )
        )
    # BEiT with a bias table: the index (uncached), then forward (its bilinear resize of the
    # table to the same size, an exact identity, and the gather; the index inside forward is an
    # lru_cache hit, the index having been built just before).
    for w, heads, model in (
        ((14, 12, "beit-base 224"),)
        if quick
        else (
            (14, 12, "beit-base 224"),
            (24, 16, "beit-large 384"),
        )
    ):
        torch.manual_seed(0)
        config = BeitConfig(image_size=16 * w, patch_size=16, num_attention_heads=heads)
        beit = BeitRelativePositionBias(config)
        with torch.no_grad():
            beit.relative_position_bias_table.normal_()

        def beit_bias(module: BeitRelativePositionBias = beit, w: int = w) -> Callable[[], Tensors]:
            def run() -> Tensors:
                with torch.no_grad():
                    index = beit_index((w, w))
                    return {"index": index, "bias": module((w, w))[0]}

            return run

        n = w * w + 1
        cases.append(
            Case(
                "relative_index",
                f"BEiT index + BeitRelativePositionBias.forward ({model}, {heads} heads)",
                f"({heads}, {n:,}, {n:,}) + index",
                {
                    "kind": "relative_index",
                    "scheme": "beit",
                    "window_size": [w, w],
                    "relative_position_bias_table": (
                        beit.relative_position_bias_table.detach().tolist()
                    ),
                },
                beit_bias,
            )
        )
    return cases


def learned_cases(quick: bool) -> list[Case]:
    from transformers import ViTConfig
    from transformers.models.vit.modeling_vit import ViTEmbeddings

    # vit-base-patch16-224: a (1, 197, 768) table, random but seeded; posenc gets the same
    # float32 values inline (tolist() round-trips float32 exactly).
    torch.manual_seed(0)
    module = ViTEmbeddings(ViTConfig(image_size=224, patch_size=16, hidden_size=768))
    with torch.no_grad():
        module.position_embeddings.normal_()
    table = module.position_embeddings.detach()[0].tolist()
    cases = []
    for side in (24,) if quick else (24, 32):

        def vit(side: int = side) -> Callable[[], Tensors]:
            # the model's patch embeddings: only their shape is read
            embeddings = torch.zeros(1, 1 + side * side, 768)

            def run() -> Tensors:
                with torch.no_grad():
                    return {
                        "embedding": module.interpolate_pos_encoding(
                            embeddings, 16 * side, 16 * side
                        )[0]
                    }

            return run

        cases.append(
            Case(
                "learned",
                f"ViTEmbeddings.interpolate_pos_encoding (197x768 -> {side}x{side})",
                f"({1 + side * side:,}, 768)",
                {
                    "kind": "learned",
                    "method": "hf_vit",
                    "table": table,
                    "new_grid": [side, side],
                },
                vit,
            )
        )
    return cases


def compare(ours: Tensors, ref: Tensors, exact: bool) -> str:
    """'bit-identical', or the largest relative difference (or 'DIFFERENT' with shapes)."""
    worst = 0.0
    for name, theirs in ref.items():
        mine = ours[name]
        if mine.shape != theirs.shape or mine.dtype != theirs.dtype:
            return (
                f"DIFFERENT ({name}: {tuple(mine.shape)} {mine.dtype} vs "
                f"{tuple(theirs.shape)} {theirs.dtype})"
            )
        if torch.equal(mine, theirs):
            continue
        if exact:
            return f"DIFFERENT ({name})"
        diff = (mine.double() - theirs.double()).abs() / theirs.double().abs().clamp_min(1e-30)
        worst = max(worst, float(diff.max()))
    return "bit-identical" if worst == 0.0 else f"rel. diff <= {worst:.1e} (slopes)"


@dataclass
class Result:
    case: Case
    nbytes: int
    posenc: float
    transformers: float
    same: str
    spread: float
    """Largest relative spread of posenc's samples around their median (noise indicator)."""


def run_cpu(cases: list[Case], rounds: int) -> list[Result]:
    results = []
    for case in cases:
        spec: SpecBase = parse_spec(case.spec)
        ref = case.build()
        ours_out = compute(spec, "cpu").tensors
        same = compare(ours_out, ref(), case.exact)
        nbytes = sum(t.numel() * t.element_size() for t in ours_out.values())
        del ours_out
        (mine, theirs), samples = alternate(
            [
                lambda spec=spec: time_call(lambda: compute(spec, "cpu"), MIN_SECONDS),
                lambda ref=ref: time_call(ref, MIN_SECONDS),
            ],
            rounds,
        )
        spread = max(abs(s - mine) / mine for s in samples[0])
        result = Result(case, nbytes, mine, theirs, same, spread)
        results.append(result)
        print(
            f"  {case.family:14s} {case.size:22s} posenc {ms(mine):>8s} ms  transformers "
            f"{ms(theirs):>8s} ms  x{theirs / mine:5.2f}  {same}",
            file=sys.stderr,
            flush=True,
        )
    return results


def cpu_markdown(results: list[Result]) -> str:
    rows = [
        [
            f"{r.case.family}",
            r.case.reference,
            r.case.size,
            mib(r.nbytes),
            ms(r.posenc),
            ms(r.transformers),
            f"**{r.transformers / r.posenc:.2f}**",
            r.same,
        ]
        for r in results
    ]
    columns = [
        "family",
        "transformers side",
        "table",
        "posenc output",
        "posenc ms",
        "transformers ms",
        "ratio (tf / posenc)",
        "same table",
    ]
    return table(columns, rows, "lllrrrrl")


def plot_cpu(results: list[Result], out_dir: Path | None) -> None:
    plt: Any = pyplot()
    if plt is None or not results:
        return
    labels = [f"{r.case.family} {r.case.size}" for r in results]
    ratios = [r.transformers / r.posenc for r in results]
    fig, ax = plt.subplots(figsize=(8, 0.22 * len(results) + 1.2))
    colors = ["tab:green" if x >= 1 else "tab:red" for x in ratios]
    ax.barh(range(len(results)), ratios, color=colors)
    ax.set_yticks(range(len(results)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("transformers time / posenc time (log; > 1: posenc faster)")
    ax.set_title("CPU compute: posenc vs transformers, same table")
    save(fig, "compute_cpu.png", out_dir)
    plt.close(fig)


# --- GPU ----------------------------------------------------------------------------------------


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Bytes written per second by `dst.copy_(src)` on `device` (median of 5 after a warm-up)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize(device)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    del src, dst
    torch.cuda.empty_cache()
    return nbytes / statistics.median(times)


GPU_POSITIONS = (4096, 16384, 65536, 262144, 1048576)
GPU_SPECS: dict[str, dict[str, Any]] = {
    "rope/default (d 128, cos+sin fp32)": {"kind": "rope", "head_dim": 128},
    "rope/llama3 (d 128, cos+sin fp32)": {
        "kind": "rope",
        "head_dim": 128,
        "rope_theta": 5e5,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    "rope/yarn exact (fp64 -> fp32)": {
        "kind": "rope",
        "head_dim": 128,
        "precision": "exact",
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
        },
    },
    "sinusoidal (whisper, 1024)": {"kind": "sinusoidal", "dim": 1024, "convention": "whisper"},
}


GPU_T5 = (1024, 2048, 4096)
"""T5 bucket tables (query x key positions) timed on the device as well."""

EVENT_CALLS = 10
"""Calls per CUDA-event measurement (device time per call: their span / EVENT_CALLS)."""


def takes_fused(spec: SpecBase, device: torch.device) -> bool:
    """Whether `compute(spec, device)` takes the fused kernel (posenc.encodings.fused)."""
    canon = spec.canonical()
    if not fused.usable(device):
        return False
    if isinstance(canon, RopeSpec):
        inv, scaling, _ = rope_inv_freq(canon, device)
        return fused_tables(canon, inv, scaling) is not None
    if isinstance(canon, SinusoidalSpec):
        return fused_table(canon, device) is not None
    return False


def wall_seconds(spec: SpecBase, device: torch.device, rounds: int) -> float:
    """Median wall time of one synchronised `compute(spec, device)` (host work included)."""

    def once() -> float:
        start = time.perf_counter()
        compute(spec, device)
        torch.cuda.synchronize(device)
        return time.perf_counter() - start

    once()
    return statistics.median(once() for _ in range(rounds))


def device_seconds(fn: Callable[[], object]) -> float:
    """Device time of one call of `fn` (CUDA work on the current device): CUDA events around
    EVENT_CALLS calls queued behind a spin kernel (`torch.cuda._sleep`), so the host's launches
    run ahead and the span holds the calls' kernels and copies back to back, not the host's
    gaps between them."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(20_000_000)  # ~10 ms of a ~2 GHz SM: longer than queuing the calls
    start.record()
    for _ in range(EVENT_CALLS):
        fn()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / 1e3 / EVENT_CALLS


def run_gpu(rounds: int) -> str:
    if not torch.cuda.is_available():
        return (
            "GPU section skipped: torch.cuda.is_available() is False on this machine "
            f"(torch {torch.__version__}); run `python -m bench.compute` where CUDA exists."
        )
    device = torch.device("cuda", 0)
    bandwidth = copy_bandwidth(device)
    was = fused.ENABLED
    rows = []
    specs = [
        (name, parse_spec({**base, "max_positions": p}), p)
        for name, base in GPU_SPECS.items()
        for p in GPU_POSITIONS
    ] + [
        (
            "t5_bias buckets (q = k)",
            parse_spec({"kind": "t5_bias", "query_length": n, "key_length": n}),
            n,
        )
        for n in GPU_T5
    ]
    try:
        for name, spec, p in specs:
            fused.ENABLED = True
            out = compute(spec, device)
            nbytes = sum(t.numel() * t.element_size() for t in out.tensors.values())
            del out
            fast = takes_fused(spec, device)
            timings = []
            for enabled in (True, False) if fast else (False,):
                fused.ENABLED = enabled
                timings.append(
                    (
                        wall_seconds(spec, device, rounds),
                        device_seconds(partial(compute, spec, device)),
                    )
                )
            torch.cuda.empty_cache()
            wall, dev = timings[0]
            torch_wall, torch_dev = timings[-1]
            rows.append(
                [
                    name,
                    f"{p:,}",
                    mib(nbytes),
                    "fused" if fast else "torch",
                    ms(wall),
                    ms(dev),
                    f"{nbytes / dev / 1e9:,.1f}",
                    f"**{nbytes / dev / bandwidth:.0%}**",
                    f"{nbytes / wall / bandwidth:.0%}",
                    ms(torch_dev) if fast else "=",
                    f"{nbytes / torch_dev / bandwidth:.0%}" if fast else "=",
                    ms(torch_wall) if fast else "=",
                ]
            )
    finally:
        fused.ENABLED = was
    columns = [
        "table",
        "positions",
        "bytes",
        "path",
        "wall ms",
        "device ms",
        "GB/s (device)",
        "of copy bw (device)",
        "of copy bw (wall)",
        "torch path device ms",
        "torch of copy bw (device)",
        "torch path wall ms",
    ]
    return (
        f"device: {torch.cuda.get_device_name(device)}; copy bandwidth (1 GiB fp32 "
        f"`copy_`, bytes written per second): {bandwidth / 1e9:,.0f} GB/s; fused kernel "
        f"(triton) {'available' if fused.usable(device) else 'NOT available'}\n\n"
        "wall: one synchronised `compute` (median); device: CUDA events around "
        f"{EVENT_CALLS} calls queued behind a spin kernel (kernels and copies only); path: the "
        "fused Triton kernel or torch's ops (`POSENC_FUSED_KERNELS`); the torch columns are "
        "the same table with the fused path off ('=': the same path)\n\n"
        + table(columns, rows, "lrrlrrrrrrrr")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only, 3 rounds")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (medians)")
    parser.add_argument("--no-plot", action="store_true", help="do not write docs/img PNGs")
    parser.add_argument("--gpu-only", action="store_true", help="the GPU section only")
    parser.add_argument("--only", help="run only cases whose family starts with this")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads for both sides (0: torch's default). 1 by default: on a "
        "shared, oversubscribed CPU, OpenMP's spinning threads make multi-threaded timings "
        "5-20x noisier",
    )
    parser.add_argument(
        "--thp",
        action="store_true",
        help="run with THP_MEM_ALLOC_ENABLE=1: torch backs large CPU tensors with transparent "
        "huge pages (fewer page faults for fresh tables)",
    )
    args = parser.parse_args(argv)
    reexec_with(
        "bench.compute", {**FIXED_MALLOC, **({"THP_MEM_ALLOC_ENABLE": "1"} if args.thp else {})}
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    before = load()
    _quiet_transformers()
    rounds = 3 if args.quick else args.rounds
    out_dir = None if args.no_plot else IMG_DIR
    cpu: list[Result] = []
    if not args.gpu_only:
        cases = (
            rope_cases((4096,) if args.quick else ROPE_SIZES)
            + alibi_cases((4096,) if args.quick else (4096, 32768, 131072))
            + t5_cases((512,) if args.quick else (512, 1024, 2048))
            + sinusoidal_cases(args.quick)
            + sinusoidal_2d_cases()
            + relative_index_cases(args.quick)
            + learned_cases(args.quick)
        )
        if args.only:
            cases = [c for c in cases if c.family.startswith(args.only)]
        cpu = run_cpu(cases, rounds)
    gpu = run_gpu(rounds)
    command = "python -m bench.compute" + (" --quick" if args.quick else "")
    command += f" --threads {args.threads}" if args.threads != 1 else ""
    command += " --thp" if args.thp else ""
    command += " --gpu-only" if args.gpu_only else ""
    print(header(command, before))
    print()
    if cpu:
        print(f"CPU: median of {rounds} alternating rounds (each >= 20 ms of repeated calls)")
        print()
        print(cpu_markdown(cpu))
        print()
        slower = [r for r in cpu if r.transformers < r.posenc]
        print(
            f"posenc at least as fast as transformers in {len(cpu) - len(slower)} of {len(cpu)} "
            "cases"
            + (
                ": slower in " + ", ".join(f"{r.case.family} {r.case.size}" for r in slower)
                if slower
                else ""
            )
        )
        print()
        plot_cpu(cpu, out_dir)
    print(gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
