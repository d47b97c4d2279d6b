"""Every profile is what its consumer's own code reads (issue 29), proven with that code.

The consumer x model matrix: each cell feeds the table posenc serves (`POST /v1/resolve` on a
config.json, then the table's URL, through the real server) to the consumer's own function, and
compares with what the reference computes:

- profile `hf`: the model's own apply function (transformers 5.24, as installed) fed posenc's
  table, against the same function fed the model's own `*RotaryEmbedding` output, within 2 float32
  ulps. The model types are read from the installed transformers: every one whose attention calls
  `apply_rotary_pos_emb_interleave` (multi-head latent attention with interleaved pairs: the module
  emits `cat(c, c)`, the apply reads `cos[..., :d/2]`), GPT-J (half-width `(sin, cos)`, its apply
  repeats them), and Cohere and Llama (`repeat_interleave` and `cat(c, c)` modules) as controls.
- profile `trtllm` on MLA models: TensorRT-LLM's own reference for its MLA kernel's table,
  `RopeEmbeddingUtils.create_sinusoidal_positions_yarn(..., duplicate_data=True)`, transcribed
  below (TensorRT-LLM is CUDA only) from NVIDIA/TensorRT-LLM `tensorrt_llm/functional.py`
  (`TRTLLM_SOURCE`), against the (P, d, 2) table posenc serves.
- profiles whose consumer reads one dtype (FlashInfer, TensorRT-LLM, torchtune) refuse another.
- profile `torchtune` and torchtune's full-width cache: torchtune 0.6.1's own rotary modules
  (installed from the suite's lock) with their `cache` replaced by the served table, against
  transformers' module plus apply on the same heads (through torchtune's q/k permutation).
"""

from __future__ import annotations

import functools
import inspect
import io
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.conftest import ServerHandle
from tests.encodings.hf_config import rope_sweep as sweep
from tests.tolerances import served_as_reference

SEQ = 40
"""Positions compared (0..SEQ-1)."""

MAX_ULPS = 2.0
"""The consumer's output from posenc's table against the reference, in float32 ulps."""

INTERLEAVE_APPLY = "apply_rotary_pos_emb_interleave"

TRTLLM_SOURCE = (
    "NVIDIA/TensorRT-LLM tensorrt_llm/functional.py "
    "RopeEmbeddingUtils.create_sinusoidal_positions_yarn (duplicate_data=True), "
    "snapshot 0071496dc625910229bf433821453636ef3770eb"
)
"""Where the transcribed TensorRT-LLM reference comes from (pinned source commit)."""


def _modeling_source(model_type: str) -> str:
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    module = model_type_to_module_name(model_type)
    path = sweep._models_root().joinpath(*module.split(".")) / (
        f"modeling_{module.split('.')[-1]}.py"
    )
    return path.read_text(encoding="utf-8") if path.exists() else ""


@functools.cache
def interleave_model_types() -> tuple[str, ...]:
    """Every model type of the installed transformers whose (text) attention calls
    `apply_rotary_pos_emb_interleave`: its modeling module defines and calls the function
    (source scan) and its text config is multi-head latent attention (`qk_rope_head_dim`; the
    module's audio and vision encoders are not)."""
    found = []
    for mt in sweep.rotary_model_types():
        src = _modeling_source(mt)
        if not (
            re.search(rf"^def {INTERLEAVE_APPLY}\(", src, re.M)
            and re.search(rf"=\s*{INTERLEAVE_APPLY}\(", src)
        ):
            continue
        text = sweep._text_config(sweep.load_config(_case(mt)))
        if getattr(text, "qk_rope_head_dim", None):
            found.append(mt)
    return tuple(found)


def _ulps(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| in float32 ulps of the larger magnitude (inf on a shape mismatch)."""
    if got.shape != want.shape:
        return math.inf
    spacing = torch.finfo(torch.float32).eps * torch.maximum(got.abs(), want.abs())
    diff = (got.double() - want.double()).abs()
    return float((diff / spacing.double().clamp_min(2.0**-149)).max()) if got.numel() else 0.0


@functools.cache
def _case(model_type: str) -> dict[str, Any]:
    """The sweep's config.json for the model type's class defaults, with `rope_interleave` on
    where the config has that switch (the attention then calls the interleave apply)."""
    data = sweep.case_config(model_type, "default", "v5")
    part = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
    assert isinstance(part, dict)
    if "rope_interleave" in part:
        part["rope_interleave"] = True
    return data


def _module_tables(
    data: dict[str, Any],
) -> tuple[Any, dict[str | None, tuple[torch.Tensor, torch.Tensor]]]:
    """(modeling module, {layer type: (cos, sin)}) of the model's own text rotary module's
    forward over positions 0..SEQ-1, as it returns them (GPT-J returns (sin, cos): read by
    name), per softmax-attention layer type when the forward takes one (else {None: ...})."""
    config = sweep.load_config(data)
    text = sweep._text_config(config)
    module = sweep._modeling_module(text)
    cls = sweep._text_rotary_class(module, text)
    with sweep._quiet():
        rotary = cls(config=text)
    types = getattr(text, "layer_types", None)
    wanted: list[str | None] = [None]
    if "layer_type" in inspect.signature(rotary.forward).parameters and isinstance(types, list):
        wanted = [t for t in dict.fromkeys(types) if not any(w in t for w in sweep.NOT_SOFTMAX)]
    swapped = bool(re.search(r"return sin, cos\b", inspect.getsource(cls.forward)))
    tables = {}
    for layer_type in wanted:
        kwargs = {} if layer_type is None else {"layer_type": layer_type}
        with torch.no_grad():
            first, second = rotary(torch.zeros(1, SEQ, 2), torch.arange(SEQ)[None], **kwargs)
        tables[layer_type] = (second, first) if swapped else (first, second)
    return module, tables


def _served(
    client: httpx.Client, data: dict[str, Any], device: str | None = None, **fields: Any
) -> dict[str, Any]:
    """The one rope table `/v1/resolve` answers for `data` (with request `fields`), fetched from
    its URL (`device="cpu"`: the reference bytes, whatever the server's device): {"spec",
    "notes", tensors...}."""
    response = client.post("/v1/resolve", json={"hf_config": data, "max_positions": SEQ, **fields})
    assert response.status_code == 200, response.text
    items = [item for item in response.json()["specs"] if item["kind"] == "rope"]
    assert len(items) == 1, items
    params = {"format": "npz", **({"device": device} if device else {})}
    got = client.get(items[0]["url"], params=params)
    assert got.status_code == 200, got.text
    arrays = np.load(io.BytesIO(got.content))
    tensors = {name: torch.from_numpy(arrays[name].copy()) for name in arrays.files}
    return {"spec": items[0]["spec"], "notes": items[0]["notes"], **tensors}


def _qk(width: int, seq: int = SEQ) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(29)
    return (
        torch.randn(1, 2, seq, width, generator=generator),
        torch.randn(1, 2, seq, width, generator=generator),
    )


def _apply(
    fn: Callable[..., Any], cos: torch.Tensor, sin: torch.Tensor, width: int
) -> torch.Tensor:
    """The model's apply function on fixed q/k of `width` channels with this cos/sin, as its
    attention calls it: (q, k, cos, sin) in (B, H, S, D), or GPT-J's (tensor, sin, cos) in
    (B, S, H, D); the rotated q and k stacked."""
    names = list(inspect.signature(fn).parameters)
    q, k = _qk(width)
    with torch.no_grad():
        if names[1] == "sin":  # GPT-J: apply_rotary_pos_emb(tensor, sin, cos), (B, S, H, D)
            out = [fn(t.transpose(1, 2), sin[None], cos[None]).transpose(1, 2) for t in (q, k)]
        else:
            out = list(fn(q, k, cos[None], sin[None])[:2])
    return torch.stack(out)


HF_CONTROLS = (
    "gptj",
    "gpt_oss",
    "openai_privacy_filter",
    "glm",
    "glm4",
    "ernie4_5",
    "helium",
    "moonshine_streaming",
    "pe_video_encoder",
    "cohere",
    "llama",
)
"""Beside the interleave models, every module layout the pairing alone does not give: GPT-J's,
GPT-OSS's and the privacy filter's half width; GLM's, ERNIE 4.5's, Helium's, Moonshine
streaming's and PE video's cat(c, c) beside interleaved pairs (their apply repeat_interleaves
the first half); Cohere's repeat_interleave and Llama's cat(c, c) as controls."""


def _attention_apply(model_type: str, module: Any) -> Callable[..., Any]:
    if model_type in interleave_model_types():
        return getattr(module, INTERLEAVE_APPLY)  # type: ignore[no-any-return]
    return module.apply_rotary_pos_emb  # type: ignore[no-any-return]


def test_interleave_models_come_from_transformers() -> None:
    """The matrix's MLA rows are every model type whose attention calls the interleave apply
    (12 modeling files in transformers 5.24), DeepSeek-V3 and the issue's others among them."""
    types = set(interleave_model_types())
    assert {
        "deepseek_v3",
        "deepseek_v32",
        "glm4_moe_lite",
        "longcat_flash",
        "mistral4",
    } <= types, types
    assert "cohere" not in types
    assert "llama" not in types
    # Every modeling file that defines and calls it has a model type in the matrix.
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    calling = {
        path.parent.name
        for path in sweep._models_root().glob("*/modeling_*.py")
        if re.search(rf"^def {INTERLEAVE_APPLY}\(", text := path.read_text(encoding="utf-8"), re.M)
        and re.search(rf"=\s*{INTERLEAVE_APPLY}\(", text)
    }
    covered = {model_type_to_module_name(t).split(".")[-1] for t in types}
    assert calling == covered, calling ^ covered
    assert len(calling) >= 12, calling


@pytest.mark.parametrize("model_type", [*interleave_model_types(), *HF_CONTROLS])
def test_hf_profile_is_what_the_model_apply_reads(
    server: ServerHandle, client: httpx.Client, model_type: str
) -> None:
    """Profile `hf`: the model's own apply function fed posenc's served cos/sin equals it fed
    the model's rotary module output (within 2 fp32 ulps; bit-equal here); the layout is the
    module's own (same shape). A GPU server's tables are held within `tolerances.GPU_ULPS` of the
    module's elementwise (an ulp of cos moves a near-zero rotated value by many of its own ulps,
    so the apply is fed the module's arrangement of the CPU values there)."""
    data = _case(model_type)
    module, tables = _module_tables(data)
    fn = _attention_apply(model_type, module)
    for layer_type, (cos_m, sin_m) in tables.items():
        served = _served(client, data, **({} if layer_type is None else {"layer_type": layer_type}))
        cos_p, sin_p = served["cos"], served["sin"]
        assert cos_p.shape == cos_m.shape[-2:], (layer_type, cos_p.shape, cos_m.shape)
        width = int(served["spec"]["rotary_dim"])
        want = _apply(fn, cos_m[0], sin_m[0], width)
        if server.device.type != "cpu":
            assert served_as_reference(cos_p, cos_m[0], server.device), (model_type, layer_type)
            assert served_as_reference(sin_p, sin_m[0], server.device), (model_type, layer_type)
            cos_p, sin_p = cos_m[0], sin_m[0]
        got = _apply(fn, cos_p, sin_p, width)
        ulps = _ulps(got, want)
        assert ulps <= MAX_ULPS, f"{model_type} {layer_type}: {ulps} ulps"
    if model_type in interleave_model_types():
        # The pairing stays interleaved (the checkpoint's), the full-width table is cat(c, c).
        assert served["notes"]["pairing"] == "interleaved", served["notes"]
        assert served["spec"]["interleaved"] is True
        assert served["spec"]["full_layout"] == "cat"
        # The other arrangement, fed to the same apply, is far off: the cell can fail.
        half = cos_p.shape[-1] // 2
        wrong = _apply(
            fn,
            cos_p[:, :half].repeat_interleave(2, -1),
            sin_p[:, :half].repeat_interleave(2, -1),
            width,
        )
        assert _ulps(wrong, want) > 1e3


def test_hf_profile_is_every_module_output(server: ServerHandle, client: httpx.Client) -> None:
    """Profile `hf` (what `/v1/resolve` serves by default) equals the model's own rotary module
    output, shape and values, for every model type of the installed transformers that posenc
    resolves and whose text module returns cos/sin (complex freqs_cis and composite models with
    no single text rotary class are left to the sweep). Bit for bit from a CPU server; within
    `tolerances.GPU_ULPS` from a GPU server."""
    checked, differ = [], []
    for model_type in sweep.rotary_model_types():
        try:
            data = _case(model_type)
            _, tables = _module_tables(data)
            body = json.dumps({"hf_config": data, "max_positions": SEQ}, allow_nan=False)
        except Exception:  # no single text rotary module returning (cos, sin), or a config
            continue  # that is no JSON (inf): the sweep's
        response = client.post("/v1/resolve", content=body)
        if response.status_code != 200:
            continue  # refused: nothing served
        for layer_type, (cos_m, _) in tables.items():
            fields = {} if layer_type is None else {"layer_type": layer_type}
            try:
                served = _served(client, data, **fields)
            except AssertionError:
                continue  # no table for this layer type (a NoPE type)
            if served["cos"].shape != cos_m.shape[-2:] or not served_as_reference(
                served["cos"], cos_m[0], server.device
            ):
                differ.append(f"{model_type} {layer_type}: {tuple(served['cos'].shape)}")
            checked.append(model_type)
    assert not differ, differ
    assert len(set(checked)) > 200, len(set(checked))
    assert {"deepseek_v3", "gptj", "gpt_oss", "glm", "cohere", "llama"} <= set(checked)


@functools.cache
def polar_model_types() -> tuple[str, ...]:
    """Every model type of the installed transformers whose text rotary module emits complex
    `freqs_cis` (`torch.polar` in its forward) for its own `apply_rotary_emb`: DeepSeek-V2 and
    Llama 4 in transformers 5.24 (a vision config sharing the modeling file is not one: the
    module is built for its text config class only)."""
    found = []
    for model_type in sweep.rotary_model_types():
        if "torch.polar(" not in _modeling_source(model_type):
            continue
        text = sweep._text_config(sweep.load_config(_case(model_type)))
        module = sweep._modeling_module(text)
        cls = sweep._text_rotary_class(module, text)
        takes = inspect.signature(cls.__init__).parameters["config"].annotation
        takes_name = takes if isinstance(takes, str) else getattr(takes, "__name__", "")
        if "torch.polar(" in inspect.getsource(cls.forward) and takes_name == type(text).__name__:
            found.append(model_type)
    return tuple(found)


def _apply_complex(fn: Callable[..., Any], freqs_cis: torch.Tensor, width: int) -> torch.Tensor:
    """The model's `apply_rotary_emb(xq, xk, freqs_cis)` on fixed q/k of `width` channels, in
    the head layout its attention passes: (B, H, S, D) where it broadcasts
    `freqs_cis.unsqueeze(1)` (DeepSeek-V2), (B, S, H, D) where `freqs_cis[:, :, None, :]`
    (Llama 4); the rotated q and k stacked in (B, H, S, D)."""
    source = inspect.getsource(fn)
    heads_first = "freqs_cis.unsqueeze(1)" in source
    assert heads_first or "freqs_cis[:, :, None, :]" in source, source
    q, k = _qk(width)
    with torch.no_grad():
        if heads_first:
            out = fn(q, k, freqs_cis[None])
            return torch.stack(out[:2])
        out = fn(q.transpose(1, 2), k.transpose(1, 2), freqs_cis[None])
        return torch.stack([t.transpose(1, 2) for t in out[:2]])


def test_polar_models_come_from_transformers() -> None:
    assert {"deepseek_v2", "llama4", "llama4_text"} <= set(polar_model_types())


@pytest.mark.parametrize("model_type", polar_model_types())
def test_hf_profile_is_the_complex_freqs_cis(
    server: ServerHandle, client: httpx.Client, model_type: str
) -> None:
    """Profile `hf` on DeepSeek-V2 and Llama 4 (complex `freqs_cis`): posenc serves
    `pairs` (P, d/2, 2), the module's `torch.view_as_real(freqs_cis)` bit for bit from a CPU
    server; the model's own `apply_rotary_emb` fed `torch.view_as_complex(pairs)` equals it fed
    the module's output within 2 fp32 ulps (the cell can fail: cos and sin in each other's
    roles are far off)."""
    data = _case(model_type)
    config = sweep.load_config(data)
    text = sweep._text_config(config)
    module = sweep._modeling_module(text)
    with sweep._quiet():
        rotary = sweep._text_rotary_class(module, text)(config=text)
    with torch.no_grad():
        freqs_cis = rotary(torch.zeros(1, SEQ, 2), torch.arange(SEQ)[None])[0]
    assert freqs_cis.is_complex(), freqs_cis.dtype
    served = _served(client, data)
    assert served["spec"]["packing"] == "pairs"
    assert served["spec"]["width"] == "half"
    assert served["notes"]["pairing"] == "interleaved"
    assert "view_as_complex" in served["notes"]["transformers_layout"]
    pairs = served["pairs"]
    assert tuple(pairs.shape) == (SEQ, freqs_cis.shape[-1], 2), pairs.shape
    module_pairs = torch.view_as_real(freqs_cis)
    if server.device.type == "cpu":
        assert torch.equal(pairs, module_pairs)
    else:
        assert served_as_reference(pairs, module_pairs, server.device), model_type
        pairs = module_pairs
    width = 2 * pairs.shape[1]
    want = _apply_complex(module.apply_rotary_emb, freqs_cis, width)
    got = _apply_complex(module.apply_rotary_emb, torch.view_as_complex(pairs.contiguous()), width)
    assert _ulps(got, want) <= MAX_ULPS, _ulps(got, want)
    swapped = torch.complex(pairs[..., 1].contiguous(), pairs[..., 0].contiguous())
    assert _ulps(_apply_complex(module.apply_rotary_emb, swapped, width), want) > 1e3


INDEXER_CALL = re.compile(r"^class (\w+Indexer)\(.*?(?=^class |\Z)", re.M | re.S)


def test_indexer_pairing_note_matches_transformers(client: httpx.Client) -> None:
    """DeepSeek-V3.2 and AXK2: the lightning indexer rotates the same table with half-split
    pairs (`apply_rotary_pos_emb`), the MLA attention with interleaved ones; the notes say so
    for exactly the model types whose indexer calls the half-split apply."""
    half_split_indexers = set()
    for model_type in interleave_model_types():
        for body in INDEXER_CALL.finditer(_modeling_source(model_type)):
            if re.search(r"=\s*apply_rotary_pos_emb\(q_rot", body.group(0)):
                half_split_indexers.add(model_type)
    assert {"deepseek_v32", "axk2"} <= half_split_indexers
    for model_type in interleave_model_types():
        response = client.post(
            "/v1/resolve", json={"hf_config": _case(model_type), "max_positions": SEQ}
        )
        assert response.status_code == 200, response.text
        for item in response.json()["specs"]:
            notes = item["notes"]
            assert (notes.get("indexer_pairing") == "half_split") == (
                model_type in half_split_indexers
            ), (model_type, notes)


# ---------------------------------------------------------------------------------------------
# TensorRT-LLM's MLA table


def trtllm_yarn_reference(
    num_pos: int,
    dim: int,
    base: float,
    scaling_factor: float,
    original_max_position_embeddings: int,
    beta_fast: float,
    beta_slow: float,
    mscale: float,
    mscale_all_dim: float,
) -> np.ndarray:
    """TensorRT-LLM's `RopeEmbeddingUtils.create_sinusoidal_positions_yarn(...,
    duplicate_data=True, dtype=torch.float32)` (`TRTLLM_SOURCE`), its pure-torch body
    transcribed: the (1, P * d * 2) float32 array its MLA kernel reads as (P, d, 2) float2."""
    dtype = torch.float32

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original_max_position_embeddings / (rotations * 2 * math.pi))) / (
            2 * math.log(base)
        )

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)

    def get_mscale(scale: float, m: float) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=dtype) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=dtype) / dim)
    freq_extra = 1.0 / pos_freqs
    freq_inter = 1.0 / (scaling_factor * pos_freqs)
    mask = 1 - ramp
    inv_freq = freq_inter * (1 - mask) + freq_extra * mask
    t = torch.arange(num_pos, dtype=dtype)
    sinusoid = torch.einsum("i,j -> ij", t, inv_freq).unsqueeze(-1)
    factor = float(get_mscale(scaling_factor, mscale) / get_mscale(scaling_factor, mscale_all_dim))
    emb = torch.cat((sinusoid, sinusoid), dim=-2)  # duplicate_data=True
    concat = torch.cat((torch.cos(emb) * factor, torch.sin(emb) * factor), dim=-1)
    return concat.reshape((1, -1)).to(dtype).numpy()


DEEPSEEK_V3_YARN = {
    "rope_type": "yarn",
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "rope_theta": 10000.0,
}
"""DeepSeek-V3's released rope parameters (config.json of deepseek-ai/DeepSeek-V3)."""


@pytest.mark.parametrize("model_type", ["deepseek_v3", "glm4_moe_lite"])
def test_trtllm_mla_table_is_trtllm_reference(client: httpx.Client, model_type: str) -> None:
    """Profile `trtllm` on an MLA config serves the duplicated (P, d, 2) table TensorRT-LLM's MLA
    kernel reads, equal to TensorRT-LLM's own builder within 2 fp32 ulps; a non-MLA config keeps
    the attention plugin's (P, d/2, 2)."""
    data = _case(model_type)
    part = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
    assert isinstance(part, dict)
    part["rope_parameters"] = dict(DEEPSEEK_V3_YARN)
    d = int(part["qk_rope_head_dim"])
    served = _served(client, data, profile="trtllm")
    pairs = served["pairs"]
    assert tuple(pairs.shape) == (SEQ, d, 2), pairs.shape
    ref = trtllm_yarn_reference(
        SEQ, d, 10000.0, 40.0, 4096, 32.0, 1.0, mscale=1.0, mscale_all_dim=1.0
    )
    want = torch.from_numpy(ref.reshape(SEQ, d, 2))
    assert _ulps(pairs, want) <= MAX_ULPS, _ulps(pairs, want)
    # The attention plugin's layout for a Llama config: (P, d/2, 2).
    llama = _served(client, _case("llama"), profile="trtllm")
    assert tuple(llama["pairs"].shape) == (SEQ, llama["spec"]["rotary_dim"] // 2, 2)


# ---------------------------------------------------------------------------------------------
# vLLM's LongRoPE buffer

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
PHI35 = "microsoft__Phi-3.5-mini-instruct.json"
"""Phi-3.5-mini's released config.json (tests/data/configs): LongRoPE, original length 4096."""


def test_vllm_profile_refuses_longrope(client: httpx.Client) -> None:
    """Profile `vllm` on a LongRoPE config is a 422 at `profile` naming vLLM's
    `long_short_cos_sin_cache` (vLLM 0.33 reads cat(short rows, long rows) at pos + original
    length when max_model_len exceeds it: no single table is that buffer); the recipe it names
    (two `cos_sin` tables without a profile, short and long) gives the rows vLLM reads, equal to
    transformers' Phi3RotaryEmbedding on each side of the switch, within 2 fp32 ulps."""
    data = json.loads((CONFIGS / PHI35).read_text(encoding="utf-8"))
    response = client.post(
        "/v1/resolve", json={"hf_config": data, "max_positions": SEQ, "profile": "vllm"}
    )
    assert response.status_code == 422, response.text
    assert "long_short_cos_sin_cache" in response.text
    spec: dict[str, Any] = {"kind": "rope", "head_dim": 96, "max_positions": SEQ}
    spec["rope_scaling"] = {
        "rope_type": "longrope",
        "short_factor": [1.0] * 48,
        "long_factor": [2.0] * 48,
        "original_max_position_embeddings": 4096,
        "factor": 32.0,
    }
    response = client.post("/v1/tables", json={**spec, "profile": "vllm"})
    assert response.status_code == 422, response.text
    assert [d["field"] for d in response.json()["detail"]] == ["profile"], response.text
    assert client.post("/v1/tables", json={**spec, "packing": "cos_sin"}).status_code == 200
    original = int(data["original_max_position_embeddings"])
    text = sweep._text_config(sweep.load_config(data))
    with sweep._quiet():
        rotary = sweep._text_rotary_class(sweep._modeling_module(text), text)(config=text)
    for seq_len in (original, original + 1):  # vLLM's short rows, and its long rows (pos + orig)
        served = _served(client, data, packing="cos_sin", width="half", seq_len=seq_len)
        # transformers picks the factors by max(position_ids) + 1: one position at seq_len - 1.
        positions = torch.cat((torch.arange(SEQ), torch.tensor([seq_len - 1])))
        with torch.no_grad():
            cos, sin = rotary(torch.zeros(1, SEQ + 1, 2), positions[None])
        half = cos.shape[-1] // 2
        want = torch.cat((cos[0, :SEQ, :half], sin[0, :SEQ, :half]), dim=-1)
        assert _ulps(served["cos_sin"], want) <= MAX_ULPS, (seq_len, _ulps(served["cos_sin"], want))


# ---------------------------------------------------------------------------------------------
# dtypes a consumer does not read


@pytest.mark.parametrize(
    ("profile", "dtype", "rule"),
    [
        ("flashinfer", "bfloat16", "cos_sin_cache should be float32"),
        ("flashinfer", "float16", "cos_sin_cache should be float32"),
        ("trtllm", "bfloat16", "float2"),
        ("trtllm", "float16", "float2"),
        ("torchtune", "float16", "float32"),
        ("torchtune", "bfloat16", "float32"),
    ],
)
def test_profile_refuses_a_dtype_its_consumer_does_not_read(
    client: httpx.Client, profile: str, dtype: str, rule: str
) -> None:
    """A dtype contradicting the profile's consumer is a 422 naming `dtype` and the consumer's
    rule, on /v1/tables and on /v1/resolve; the consumer's own dtype is served."""
    spec = {"kind": "rope", "head_dim": 64, "max_positions": 16, "profile": profile}
    response = client.post("/v1/tables", json={**spec, "dtype": dtype})
    assert response.status_code == 422, response.text
    body = response.json()
    assert [d["field"] for d in body["detail"]] == ["dtype"], body
    assert rule in response.text, body
    assert f"profile {profile!r}" in response.text, body
    response = client.post(
        "/v1/resolve",
        json={"hf_config": _case("llama"), "max_positions": 16, "profile": profile, "dtype": dtype},
    )
    assert response.status_code == 422, response.text
    assert rule in response.text, response.text
    assert client.post("/v1/tables", json={**spec, "dtype": "float32"}).status_code == 200


def test_torchtune_on_half_split_llama_keeps_its_pairing(client: httpx.Client) -> None:
    """Profile `torchtune` on Llama (half split): the served spec says `interleaved: false` as
    the notes' pairing does, a note says torchtune needs permuted q/k weights, and the table's
    bytes and key are those of the same spec asked for by hand with the pairing stated."""
    data = _case("llama")
    served = _served(client, data, profile="torchtune")
    assert served["notes"]["pairing"] == "half_split"
    assert served["spec"]["interleaved"] is False, served["spec"]
    assert "permuted" in served["notes"]["torchtune"]
    gptj = _served(client, _case("gptj"), profile="torchtune")
    assert gptj["spec"]["interleaved"] is True
    assert "torchtune" not in gptj["notes"]
    by_hand = client.post("/v1/tables", json=served["spec"], params={"format": "npz"})
    assert by_hand.status_code == 200, by_hand.text
    assert torch.equal(
        torch.from_numpy(np.load(io.BytesIO(by_hand.content))["pairs"]), served["pairs"]
    )


# ---------------------------------------------------------------------------------------------
# torchtune (in the suite's lock: torchtune 0.6.1 with torchao 0.15.0): its own rotary modules

LLAMA31_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_theta": 500000.0,
}
"""Llama 3.1's released rope parameters (config.json of meta-llama/Llama-3.1-8B)."""


def _torchtune_module(name: str, d: int, base: float) -> torch.nn.Module:
    """torchtune's own rotary module for a matrix row, built for (d, SEQ, base) as torchtune's
    model builders build it (`torchtune/models/<model>/_component_builders.py`):
    `RotaryPositionalEmbeddings` (torchtune/modules/position_embeddings.py), `Llama3ScaledRoPE`
    with Llama 3.1's constants (torchtune/models/llama3_1/_position_embeddings.py),
    `Qwen2RotaryPositionalEmbeddings` (torchtune/models/qwen2/_positional_embeddings.py),
    `Phi3RotaryPositionalEmbeddings` (torchtune/models/phi3/_position_embeddings.py)."""
    from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE
    from torchtune.models.phi3._position_embeddings import Phi3RotaryPositionalEmbeddings
    from torchtune.models.qwen2._positional_embeddings import Qwen2RotaryPositionalEmbeddings
    from torchtune.modules import RotaryPositionalEmbeddings

    if name == "llama3":
        return Llama3ScaledRoPE(  # type: ignore[no-any-return]
            dim=d,
            max_seq_len=SEQ,
            base=base,  # type: ignore[arg-type]
            scale_factor=8,
            low_freq_factor=1,
            high_freq_factor=4,
            old_context_len=8192,
        )
    cls = {
        "rope": RotaryPositionalEmbeddings,
        "qwen2": Qwen2RotaryPositionalEmbeddings,
        "phi3": Phi3RotaryPositionalEmbeddings,
    }[name]
    return cls(dim=d, max_seq_len=SEQ, base=base)  # type: ignore[no-any-return]


TORCHTUNE_ROWS = {
    "llama": ("rope", None, {"profile": "torchtune"}),
    "llama31": ("llama3", LLAMA31_ROPE, {"profile": "torchtune"}),
    "qwen2": ("qwen2", None, {"packing": "cos_sin", "width": "full", "dtype": "float32"}),
    "phi3": ("phi3", None, {"packing": "cos_sin", "width": "full", "dtype": "float32"}),
}
"""Matrix rows: model (config of the model type, with these rope parameters) -> torchtune's
module and the request fields that serve its cache: profile `torchtune`'s (P, d/2, 2) pairs for
`RotaryPositionalEmbeddings` and `Llama3ScaledRoPE`, the full-width `cos_sin` (P, 2d) for the
Qwen2 and Phi-3 modules."""


def _to_pairs(x: torch.Tensor) -> torch.Tensor:
    """A half-split head (x1 | x2) as torchtune reads it, (2i, 2i+1) = (x1[i], x2[i]): what
    torchtune's checkpoint conversion does to a half-split q/k (its `_permute`)."""
    half = x.shape[-1] // 2
    return torch.stack((x[..., :half], x[..., half:]), dim=-1).flatten(-2)


def _from_pairs(x: torch.Tensor) -> torch.Tensor:
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


@pytest.mark.filterwarnings("ignore::DeprecationWarning:torchao")
@pytest.mark.parametrize("row", list(TORCHTUNE_ROWS))
def test_torchtune_modules_read_the_served_tables(
    server: ServerHandle, client: httpx.Client, row: str
) -> None:
    """torchtune's own rotary module with its `cache` buffer replaced by the table posenc
    serves (a config resolved by the server) equals transformers' rotary module plus
    `apply_rotary_pos_emb` on the same heads within 2 fp32 ulps (the pair modules through the
    q/k permutation torchtune's checkpoint conversion applies, as `notes.torchtune` says), and
    the served table is the module's own cache. A GPU server's table is held within
    `tolerances.GPU_ULPS` of its reference bytes (`?device=cpu`) elementwise, and the module is
    fed those (an ulp of cos moves a near-zero rotated value by thousands of its own ulps: 2,555
    on the H200)."""
    name, rope, fields = TORCHTUNE_ROWS[row]
    data = _case("llama" if row == "llama31" else row)
    if rope is not None:
        data["rope_parameters"] = dict(rope)
    served = _served(client, data, **fields)
    table = served["pairs" if "profile" in fields else "cos_sin"]
    if server.device.type != "cpu":
        reference = _served(client, data, device="cpu", **fields)
        cpu_table = reference["pairs" if "profile" in fields else "cos_sin"]
        assert served_as_reference(table, cpu_table, server.device), row
        table = cpu_table
    d, base = int(served["spec"]["rotary_dim"]), float(served["spec"]["rope_theta"])
    module = _torchtune_module(name, d, base)
    hf_module, tables = _module_tables(data)
    cos_m, sin_m = tables[None]
    want = _apply(hf_module.apply_rotary_pos_emb, cos_m[0], sin_m[0], d).transpose(2, 3)
    heads = torch.stack(_qk(d)).transpose(2, 3)  # (q|k, B, S, H, D) as torchtune takes x
    pairs = "profile" in fields
    if pairs:
        assert "permuted" in served["notes"]["torchtune"], served["notes"]
    with torch.no_grad():
        own = torch.stack([module(_to_pairs(x) if pairs else x) for x in heads])
        module.cache = table
        got = torch.stack([module(_to_pairs(x) if pairs else x) for x in heads])
    if pairs:
        got, own = _from_pairs(got), _from_pairs(own)
    assert _ulps(got, want) <= MAX_ULPS, _ulps(got, want)
    assert _ulps(own, want) <= MAX_ULPS, _ulps(own, want)
