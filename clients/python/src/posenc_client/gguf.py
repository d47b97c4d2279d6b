"""llama.cpp's GGUF models: verify and plug the RoPE they carry (`posenc-client verify/plug
model.gguf --hf-config config.json`), with the `gguf` package (`pip install
'posenc-client[gguf]'`); no llama.cpp at run time.

llama.cpp computes RoPE itself, from the file's metadata and from per-pair frequency divisors
the converter bakes in as tensors. This module transcribes what it computes, at pinned commits:

- the loader (llama.cpp `src/llama-model.cpp` `load_hparams` and the per-arch loaders, read
  at ggml-org/llama.cpp@00342301d01add50835550e8a916f12097d94517; `src/llama-hparams.cpp` at
  @01b77b5793989e0a1508a2fe3757d4e743a7bbd1; `src/llama-context.cpp`'s YaRN attention factor
  and `src/models/deepseek2.cpp` as of llama.cpp PR 17945, [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]):
  `{arch}.rope.freq_base`
  (default 10000), `{arch}.rope.dimension_count` (default the head size),
  `{arch}.rope.scaling.type` (default "linear"; "none" forces freq_scale 1),
  `{arch}.rope.scaling.factor` (freq_scale = 1/factor), `.original_context_length` (default
  `{arch}.context_length`), `.attn_factor` (1); YaRN's betas (32, 1: the `.yarn_beta_*`,
  `.yarn_ext_factor` and `.yarn_attn_factor` keys are read by other architectures' loaders
  only), ext_factor (1 for "yarn", else 0) and attention factor
  (`get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) / (1 + 0.1 ln factor)`,
  times `.attn_factor`), DeepSeek-V2's `.yarn_log_multiplier` (divided by 0.1 on load, its
  `mscale^2` folded into the attention's kq_scale: `src/models/deepseek2.cpp`), Gemma 3's
  local layers (base 10000 and no scaling, fixed in its loader), the divisors `rope_freqs` (Llama
  3) and `rope_factors_long/short` (LongRoPE: long when the context is longer than the original
  one);
- ggml's RoPE (ggml-org/ggml@d99724f2b141fed9e1a9f402213506c081433465
  `src/ggml-cpu/ops.cpp` `ggml_compute_forward_rope_flt`, `ggml_rope_cache_init`,
  `rope_yarn`, `rope_yarn_ramp`; `src/ggml.c` `ggml_rope_yarn_corr_dims`): in float32,
  `theta_scale = powf(freq_base, -2/n_dims)`, `theta_i = p * theta_scale^i` by repeated
  multiplication, `theta_extrap = theta_i / freq_factors[i]`, `theta_interp = freq_scale *
  theta_extrap`, with YaRN's ramp over the correction dims (floor/ceil of
  `n_dims * ln(n_ctx_orig / (beta * 2 pi)) / (2 ln base)`) mixing the two and the magnitude
  `attn_factor * (1 + 0.1 ln(1 / freq_scale))`; cos/sin = `cosf(theta) * mscale`.

The converter's layout (llama.cpp `convert_hf_to_gguf.py` / `conversion/base.py`
`TextModel.set_gguf_parameters`, `LlamaModel.generate_extra_tensors`,
`Phi3MiniModel`, `DeepseekV2Model`, `Gemma3Model`) is what `plug` writes: the keys above and the
divisor tensors, with posenc's exact values.

`verify_gguf` compares the table llama.cpp computes from the file (`ggml_rope_table`, float32
op for op) with posenc's exact table (float64 rounded once) per element within `ggml_bound`,
the error ggml's own float32 arithmetic may make (its derivation is in docs/gguf.md), and
diagnoses a departure by the quantity llama.cpp derives (`RopeParams`) that differs from the
one the config needs, naming the key or tensor that sets it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from posenc_client._exceptions import IncompatibleModelError
from posenc_client._options import JSON
from posenc_client._tables import Tables

__all__ = [
    "ARCH_MODEL_TYPES",
    "GGUFModel",
    "GGUFReport",
    "RopeParams",
    "RopeSide",
    "check_structure",
    "exact_layout",
    "ggml_bound",
    "ggml_rope_table",
    "llama_params",
    "outcome",
    "plug_gguf",
    "read_gguf",
    "rope_sides",
    "verify_gguf",
]

F32 = np.float32
Array = npt.NDArray[Any]

U = 2.0**-24
"""The unit roundoff of float32."""

ARCH_MODEL_TYPES: dict[str, tuple[str, ...]] = {
    "llama": ("llama", "mistral"),
    "qwen2": ("qwen2",),
    "qwen3": ("qwen3",),
    "phi3": ("phi3",),
    "deepseek2": ("deepseek_v2", "deepseek_v3"),
    "gemma3": ("gemma3", "gemma3_text"),
}
"""The llama.cpp architectures posenc checks, and the transformers model types each converts."""

ROPE_FREQS = "rope_freqs.weight"
FACTORS_LONG = "rope_factors_long.weight"
FACTORS_SHORT = "rope_factors_short.weight"
ROPE_TENSORS = (ROPE_FREQS, FACTORS_LONG, FACTORS_SHORT)
DEFAULT_FREQ_BASE = 10000.0  # llama-model.cpp: rope_freq_base_train's default
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0  # llama_context_default_params
GEMMA3_SWA_BASE = 10000.0  # llama-model.cpp, LLM_ARCH_GEMMA3: rope_freq_base_train_swa
FACTOR_TENSORS = {"llama": (ROPE_FREQS, ROPE_FREQS), "phi3": (FACTORS_SHORT, FACTORS_LONG)}
"""The divisor tensors llama.cpp's loader creates per architecture (`create_tensor` of
LLM_TENSOR_ROPE_FREQS / ROPE_FACTORS_SHORT / ROPE_FACTORS_LONG), (short context, long context)."""
KEY_DEFAULTS: dict[str, Any] = {
    "rope.freq_base": DEFAULT_FREQ_BASE,
    "rope.scaling.attn_factor": 1.0,
    "rope.scaling.yarn_beta_fast": YARN_BETA_FAST,
    "rope.scaling.yarn_beta_slow": YARN_BETA_SLOW,
    "rope.scaling.yarn_log_multiplier": 0.0,
}
"""What llama.cpp takes for these keys when a file has none."""


def _f32(value: float | np.floating[Any]) -> float:
    return float(F32(value))


def _key(arch: str, name: str) -> str:
    return f"{arch}.{name}"


@dataclass(frozen=True)
class GGUFModel:
    """What posenc reads of a GGUF file: its architecture, every metadata value by key (arrays
    as lists) and the RoPE divisor tensors it holds (float32, as llama.cpp requires)."""

    path: str
    arch: str
    values: dict[str, Any]
    tensors: dict[str, Array]
    tensor_types: dict[str, str] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        """The value of `{arch}.name`, else `default`."""
        return self.values.get(_key(self.arch, name), default)


def read_gguf(path: str | os.PathLike[str]) -> GGUFModel:
    """Read a GGUF file's metadata and RoPE divisor tensors (`gguf.GGUFReader`, memory-mapped:
    the weights are not read)."""
    try:
        import gguf
    except ImportError as err:  # pragma: no cover - the extra is installed in the suite
        raise ImportError(f"needs gguf: pip install 'posenc-client[gguf]' ({err})") from err
    reader = gguf.GGUFReader(os.fspath(path), "r")
    values: dict[str, Any] = {}
    for name, reader_field in reader.fields.items():
        if name.startswith(("GGUF.", "tokenizer.")) or not reader_field.types:
            continue  # the vocabulary is no RoPE's (plug copies it from the file itself)
        values[name] = reader_field.contents()
    arch = values.get("general.architecture")
    if not isinstance(arch, str):
        raise IncompatibleModelError(f"{os.fspath(path)!r}: no general.architecture key")
    tensors: dict[str, Array] = {}
    types: dict[str, str] = {}
    for tensor in reader.tensors:
        if tensor.name in ROPE_TENSORS:
            types[tensor.name] = tensor.tensor_type.name
            tensors[tensor.name] = np.array(tensor.data, copy=True).reshape(-1)
    return GGUFModel(os.fspath(path), arch, values, tensors, types)


@dataclass(frozen=True)
class RopeParams:
    """What `ggml_rope_ext` receives for one layer type (float32 values as Python floats), and
    the attention's kq_scale multiplier where llama.cpp folds YaRN's mscale^2 into it
    (DeepSeek-V2). `sources` names the key or tensor each field comes from."""

    n_rot: int
    freq_base: float
    freq_scale: float
    ext_factor: float
    attn_factor: float
    beta_fast: float
    beta_slow: float
    n_ctx_orig: int
    freq_factors: Array | None = None
    kq_multiplier: float = 1.0
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def amplitude(self) -> float:
        """The magnitude ggml multiplies cos/sin by (`rope_yarn`'s mscale)."""
        m = F32(self.attn_factor)
        if self.ext_factor != 0.0:
            m = F32(m * F32(F32(1.0) + F32(0.1) * np.log(F32(1.0) / F32(self.freq_scale))))
        return float(m)


def _mscale(scale: float, mscale: float) -> float:
    """llama-context.cpp's `get_mscale` (float32)."""
    if scale <= 1.0:
        return 1.0
    return float(F32(F32(0.1) * F32(mscale) * np.log(F32(scale)) + F32(1.0)))


def _number(model: GGUFModel, name: str) -> float | None:
    value = model.get(name)
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        value = value[0]
    return float(value)


def llama_params(model: GGUFModel, *, sliding: bool = False, long: bool = False) -> RopeParams:
    """The RoPE parameters llama.cpp derives from `model` (module docstring), for the
    full-attention layers or, with `sliding`, Gemma 3's local ones; `long`: a context longer than
    the original one (LongRoPE's long factors)."""
    arch = model.arch
    src: dict[str, str] = {}
    n_head = _number(model, "attention.head_count")
    n_embd = _number(model, "embedding_length")
    head = _number(model, "attention.key_length")
    if head is None and n_head and n_embd:
        head = n_embd / n_head
    n_rot_value = _number(model, "rope.dimension_count")
    src["n_rot"] = _key(arch, "rope.dimension_count")
    n_rot = int(n_rot_value if n_rot_value is not None else (head or 0))
    base_key = "rope.freq_base"
    base = _number(model, base_key)
    freq_base = DEFAULT_FREQ_BASE if base is None else base
    if sliding:  # LLM_ARCH_GEMMA3: rope_freq_base_train_swa = 10000, no key read
        base_key = "(Gemma 3's local base, fixed at 10000 by llama.cpp)"
        freq_base = GEMMA3_SWA_BASE
    src["freq_base"] = base_key if sliding else _key(arch, base_key)
    scaling = str(model.get("rope.scaling.type", "linear"))
    factor = _number(model, "rope.scaling.factor")
    if factor is None:
        factor = _number(model, "rope.scale_linear")
    freq_scale = 1.0 if not factor else _f32(1.0 / F32(factor))
    if scaling == "none" or sliding:
        freq_scale = 1.0
    src["freq_scale"] = f"{_key(arch, 'rope.scaling.type')}, {_key(arch, 'rope.scaling.factor')}"
    # the yarn_ext_factor / yarn_attn_factor / yarn_beta_* keys are read by other
    # architectures' loaders only (grok, ...): these take llama_hparams' defaults
    ext = 1.0 if scaling == "yarn" and not sliding else 0.0
    src["ext_factor"] = _key(arch, "rope.scaling.type")
    rope_attn = _number(model, "rope.scaling.attn_factor")
    rope_attn = 1.0 if rope_attn is None else rope_attn
    log_mul = 0.0
    if arch == "deepseek2":
        stored = _number(model, "rope.scaling.yarn_log_multiplier")
        log_mul = 0.0 if stored is None else _f32(F32(stored) / F32(0.1))
    if ext != 0.0:
        scale = _f32(F32(1.0) / F32(freq_scale))
        if log_mul != 0.0:
            mscale = log_mul if (arch == "deepseek2" and log_mul != 1.0) else 1.0
            attn = _f32(F32(_mscale(scale, mscale)) / F32(_mscale(scale, log_mul)))
        else:
            attn = _mscale(scale, 1.0)
        attn = _f32(F32(attn) * (F32(1.0) / (F32(1.0) + F32(0.1) * np.log(F32(scale)))))
    else:
        attn = 1.0  # llama_hparams::yarn_attn_factor
    attn_factor = _f32(F32(attn) * F32(rope_attn))
    src["amplitude"] = _key(arch, "rope.scaling.attn_factor")
    n_ctx_train = _number(model, "context_length") or 0
    orig = _number(model, "rope.scaling.original_context_length")
    n_ctx_orig = int(orig if orig else n_ctx_train)
    src["n_ctx_orig"] = _key(arch, "rope.scaling.original_context_length")
    beta_fast, beta_slow = YARN_BETA_FAST, YARN_BETA_SLOW  # llama_hparams' defaults
    src["beta_fast"] = src["beta_slow"] = "(llama.cpp's fixed YaRN betas 32, 1)"
    factors: Array | None = None
    if not sliding and arch in FACTOR_TENSORS:
        name = FACTOR_TENSORS[arch][1 if long else 0]
        factors = model.tensors.get(name)
        src["freq_factors"] = name
    kq = 1.0
    if arch == "deepseek2" and ext != 0.0:
        # deepseek2.cpp: attn_factor_org = attn_factor * (1 + 0.1 ln(1/s)); mscale = attn_factor_org
        # * (1 + 0.1 log_mul ln(1/s)); kq_scale = mscale^2 / sqrt(n_embd_head_k)
        inv = np.log(F32(1.0) / F32(freq_scale))
        org = F32(F32(attn_factor) * F32(F32(1.0) + F32(0.1) * inv))
        ms = F32(org * F32(F32(1.0) + F32(0.1) * F32(log_mul) * inv))
        kq = float(F32(ms * ms))
        src["kq_multiplier"] = _key(arch, "rope.scaling.yarn_log_multiplier")
    return RopeParams(
        n_rot=n_rot,
        freq_base=_f32(freq_base),
        freq_scale=freq_scale,
        ext_factor=float(ext),
        attn_factor=attn_factor,
        beta_fast=_f32(beta_fast),
        beta_slow=_f32(beta_slow),
        n_ctx_orig=n_ctx_orig,
        freq_factors=None if factors is None else factors.astype(F32),
        kq_multiplier=kq,
        sources=src,
    )


def _corr_dims(p: RopeParams) -> tuple[np.float32, np.float32]:
    """ggml.c `ggml_rope_yarn_corr_dims` in float32."""

    def dim(n_rot: float) -> np.float32:
        ratio = F32(F32(p.n_ctx_orig) / F32(F32(n_rot) * F32(2) * F32(math.pi)))
        return F32(F32(p.n_rot) * np.log(ratio) / F32(F32(2) * np.log(F32(p.freq_base))))

    start = np.floor(dim(p.beta_fast))
    end = np.ceil(dim(p.beta_slow))
    return F32(max(0.0, start)), F32(min(p.n_rot - 1, end))


def ggml_rope_table(p: RopeParams, rows: int) -> tuple[Array, Array]:
    """The cos/sin table (rows, n_rot/2) ggml computes (`ggml_rope_cache_init` / `rope_yarn`),
    op for op in float32 (numpy's float32 cos/sin stand in for libm's cosf/sinf: both within
    the bound's trig term)."""
    half = p.n_rot // 2
    theta_scale = F32(np.power(F32(p.freq_base), F32(F32(-2.0) / F32(p.n_rot))))
    low, high = _corr_dims(p)
    scale = F32(p.freq_scale)
    ext = F32(p.ext_factor)
    mscale = F32(p.amplitude)
    theta = np.arange(rows, dtype=np.int64).astype(F32)
    cos = np.empty((rows, half), dtype=F32)
    sin = np.empty((rows, half), dtype=F32)
    ff = p.freq_factors
    for i in range(half):
        extrap = theta / F32(ff[i]) if ff is not None else theta
        interp = scale * extrap
        angle = interp
        if ext != 0:
            y = F32(F32(i - low) / F32(max(F32(0.001), F32(high - low))))
            mix = F32(F32(1) - F32(min(F32(1), max(F32(0), y)))) * ext
            angle = interp * F32(F32(1) - mix) + extrap * mix
        cos[:, i] = np.cos(angle) * mscale
        sin[:, i] = np.sin(angle) * mscale
        theta = theta * theta_scale
    return cos, sin


def ggml_bound(p: RopeParams, inv_freq: Array, amplitude: float, rows: int) -> Array:
    """Per element (rows, n_rot/2), how far ggml's float32 table may be from the exact one
    (angle p * inv_freq, magnitude `amplitude`) when the file's parameters are the exact ones:

        A * (|p * inv_freq_i| * eps_i + 24u),   eps_i = i * (eps_ts + u) + 16u,
        eps_ts = 2u + |ln base| * (2 / n_rot) * u,   u = 2^-24.

    eps_ts bounds theta_scale's relative error (powf within one ulp, the exponent -2/n_rot
    rounded once); the repeated multiplication adds it and one rounding per pair; 16u covers
    the divisor's float32 storage and division, freq_scale's storage and product and YaRN's
    mix; 24u the trig functions (within 2 ulp), the magnitude's float32 chain (logf, products)
    and the exact table's own rounding. docs/gguf.md derives it; the tests check ggml's
    arithmetic stays inside it and a departure of 1e-5 relative in one frequency does not."""
    half = p.n_rot // 2
    eps_ts = 2 * U + abs(math.log(p.freq_base)) * (2.0 / p.n_rot) * U
    eps = np.arange(half, dtype=np.float64) * (eps_ts + U) + 16 * U
    angle = np.arange(rows, dtype=np.float64)[:, None] * np.asarray(inv_freq, np.float64)[None, :]
    return abs(amplitude) * (np.abs(angle) * eps[None, :] + 24 * U)


@dataclass(frozen=True)
class RopeSide:
    """One table llama.cpp computes from the file, with posenc's exact one: the layer type
    (`full`, or `sliding` for Gemma 3's local layers), LongRoPE's side (`short`/`long`, else
    ""), the exact table (`cos`, `sin` (rows, n_rot/2), float64 `inv_freq`, its canonical
    spec and metadata: `attention_scaling`, `softmax_scale_multiplier`)."""

    name: str
    sliding: bool
    long: bool
    table: Tables

    @property
    def spec(self) -> JSON:
        return self.table.spec


@dataclass(frozen=True)
class GGUFReport:
    """One table of the file against posenc's: `rows` compared, `max_abs` error, `max_ratio`
    (largest error / bound: at most 1 when exact), `first` (row, pair) out of the bound,
    `verdict` (exact, repair, mismatch) and `diagnosis` (each wrong or missing key or tensor,
    with what the file gives and what the config needs)."""

    name: str
    rows: int
    max_abs: float
    max_ratio: float
    first: tuple[int, int] | None
    verdict: str
    diagnosis: tuple[str, ...] = ()

    def line(self) -> str:
        """A one-line summary for reports."""
        head = (
            f"{self.name}: {self.verdict} ({self.rows} rows, max abs {self.max_abs:.3g}, "
            f"{self.max_ratio:.3g} of ggml's float32 bound"
        )
        if self.first is not None:
            head += f", first out of bound at row {self.first[0]}, pair {self.first[1]}"
        head += ")"
        return head + "".join(f"\n    {d}" for d in self.diagnosis)


def outcome(reports: Sequence[GGUFReport]) -> str:
    """The whole file's verdict: mismatch if any table is, else repair if any is, else exact."""
    verdicts = {r.verdict for r in reports}
    for verdict in ("mismatch", "repair"):
        if verdict in verdicts:
            return verdict
    return "exact"


# --- the layout the converter writes, with posenc's exact values ----------------------------


@dataclass
class Layout:
    """The keys (name -> value, with its GGUF type) and divisor tensors that make llama.cpp
    compute posenc's tables (`exact_layout`)."""

    keys: dict[str, tuple[Any, str]] = field(default_factory=dict)
    tensors: dict[str, Array] = field(default_factory=dict)


def _divisors(p_base: float, n_rot: int, inv_freq: Array) -> Array:
    """freq_factors such that ggml's theta_base_i / factor_i is the exact frequency:
    base^(-2i/n) / inv_freq_i, in float64 rounded once to float32."""
    i = np.arange(n_rot // 2, dtype=np.float64)
    default = np.power(np.float64(p_base), -2.0 * i / n_rot)
    return (default / np.asarray(inv_freq, np.float64)).astype(F32)


def exact_layout(arch: str, sides: Sequence[RopeSide]) -> Layout:
    """The keys and tensors llama.cpp needs to compute `sides`' exact tables, as llama.cpp's
    converter lays them out. `IncompatibleModelError` when llama.cpp cannot compute a table of
    this config from any file (a rope_type it does not implement, YaRN without truncation)."""
    layout = Layout()

    def put(name: str, value: Any, kind: str) -> None:
        layout.keys[_key(arch, name)] = (value, kind)

    for side in sides:
        spec = side.spec
        scaling = dict(spec.get("rope_scaling") or {"rope_type": "default"})
        rope_type = str(scaling.get("rope_type", "default"))
        theta = float(spec["rope_theta"])
        n_rot = int(spec.get("rotary_dim") or spec["head_dim"])
        amp = float(side.table.meta.get("attention_scaling", 1.0))
        inv_freq = np.asarray(side.table["inv_freq"], np.float64)
        if side.sliding:
            if rope_type != "default" or theta != GEMMA3_SWA_BASE:
                raise IncompatibleModelError(
                    f"{side.name}: llama.cpp computes Gemma 3's local layers at base 10000 "
                    f"without scaling, whatever the file says (the config's rope_theta {theta:g}, "
                    f"rope_type {rope_type!r})"
                )
            continue
        put("rope.freq_base", theta, "float32")
        put("rope.dimension_count", n_rot, "uint32")
        factor = float(scaling.get("factor") or 1.0)
        if rope_type == "default":
            put("rope.scaling.type", "none", "string")
        elif rope_type == "linear":
            put("rope.scaling.type", "linear", "string")
            put("rope.scaling.factor", factor, "float32")
        elif rope_type == "yarn":
            if not scaling.get("truncate", True):
                raise IncompatibleModelError(
                    f"{side.name}: llama.cpp always rounds YaRN's correction range "
                    "(ggml_rope_yarn_corr_dims: floor/ceil); the config sets truncate=false"
                )
            betas = (float(scaling.get("beta_fast", 32.0)), float(scaling.get("beta_slow", 1.0)))
            if betas != (YARN_BETA_FAST, YARN_BETA_SLOW):
                raise IncompatibleModelError(
                    f"{side.name}: llama.cpp's {arch!r} takes YaRN's beta_fast, beta_slow as 32, "
                    f"1 whatever the file says; the config's are {betas[0]:g}, {betas[1]:g}"
                )
            f = factor
            put("rope.scaling.type", "yarn", "string")
            put("rope.scaling.factor", f, "float32")
            put(
                "rope.scaling.original_context_length",
                int(scaling["original_max_position_embeddings"]),
                "uint32",
            )
            if arch == "deepseek2":
                # amplitude = rope.scaling.attn_factor; kq multiplier = (A (1 + 0.1 L ln f))^2
                mult = float(side.table.meta.get("softmax_scale_multiplier", 1.0))
                log_mul = (math.sqrt(mult) / amp - 1.0) / (0.1 * math.log(f)) if f > 1 else 0.0
                put("rope.scaling.yarn_log_multiplier", 0.1 * log_mul, "float32")
                put("rope.scaling.attn_factor", amp, "float32")
            else:
                ratio = amp / _mscale(f, 1.0)
                put(
                    "rope.scaling.attn_factor", 1.0 if abs(ratio - 1) <= 8 * U else ratio, "float32"
                )
        elif rope_type in ("llama3", "longrope") and arch not in FACTOR_TENSORS:
            raise IncompatibleModelError(
                f"{side.name}: llama.cpp's {arch!r} reads no frequency divisors, which "
                f"rope_type {rope_type!r} needs"
            )
        elif rope_type == "llama3":
            put("rope.scaling.type", "none", "string")
            layout.tensors[ROPE_FREQS] = _divisors(theta, n_rot, inv_freq)
        elif rope_type == "longrope":
            put("rope.scaling.type", "longrope", "string")
            put(
                "rope.scaling.original_context_length",
                int(scaling["original_max_position_embeddings"]),
                "uint32",
            )
            put("rope.scaling.attn_factor", amp, "float32")
            name = FACTOR_TENSORS[arch][1 if side.long else 0]
            layout.tensors[name] = _divisors(theta, n_rot, inv_freq)
        else:
            raise IncompatibleModelError(
                f"{side.name}: llama.cpp does not implement rope_type {rope_type!r} "
                "(it knows none, linear, yarn, longrope and Llama 3's divisors)"
            )
    return layout


# --- structure: is this file that model? -----------------------------------------------------

_STRUCTURE = (
    ("block_count", ("num_hidden_layers", "n_layer", "num_layers")),
    ("embedding_length", ("hidden_size", "n_embd", "d_model")),
    ("attention.head_count", ("num_attention_heads", "n_head")),
    ("attention.head_count_kv", ("num_key_value_heads",)),
)


def _text_config(config: JSON) -> JSON:
    text = config.get("text_config")
    return dict(text) if isinstance(text, Mapping) else config


def check_structure(model: GGUFModel, config: JSON) -> None:
    """`IncompatibleModelError` (exit 6) when the file is not the config's model: an
    architecture posenc does not check or another model type, or another layer count, width or
    head count."""
    arch = model.arch
    if arch not in ARCH_MODEL_TYPES:
        raise IncompatibleModelError(
            f"{model.path}: general.architecture {arch!r} is not one posenc checks "
            f"({', '.join(sorted(ARCH_MODEL_TYPES))})"
        )
    text = _text_config(config)
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    if model_type and model_type not in ARCH_MODEL_TYPES[arch]:
        raise IncompatibleModelError(
            f"{model.path}: general.architecture {arch!r} is not the config's model_type "
            f"{model_type!r} (llama.cpp converts {arch!r} from "
            f"{', '.join(ARCH_MODEL_TYPES[arch])})"
        )
    for name, keys in _STRUCTURE:
        found = model.get(name)
        if isinstance(found, (list, tuple)):
            found = found[0] if found else None
        wanted = next((text[k] for k in keys if isinstance(text.get(k), int)), None)
        if found is None or wanted is None:
            continue
        if name == "attention.head_count_kv" and arch == "deepseek2":
            continue  # the MLA converter writes 1 (the latent's single head)
        if int(found) != int(wanted):
            raise IncompatibleModelError(
                f"{model.path} is not this config's model: {_key(arch, name)} = {found}, the "
                f"config's {keys[0]} = {wanted}"
            )


# --- verify ----------------------------------------------------------------------------------


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        head = ", ".join(f"{v:.6g}" for v in value[:4])
        return f"[{head}{', ...' if value.size > 4 else ''}] ({value.size} values)"
    if isinstance(value, float):
        return f"{value:.9g}"
    return repr(value)


def _same_divisors(a: Array, b: Array) -> bool:
    """Equal divisors up to float32 rounding of their computation (16u relative: the
    converter's float32 arithmetic), the share of the bound's 16u term they may take."""
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=16 * U, atol=0))


def _field_diffs(found: RopeParams, needed: RopeParams, side: RopeSide) -> list[str]:
    """The quantities llama.cpp derives differently from what the config needs, each naming
    the key or tensor that sets it."""
    out: list[str] = []
    rope_type = str((side.spec.get("rope_scaling") or {}).get("rope_type", "default"))
    checked = ["n_rot", "freq_base", "freq_scale", "ext_factor", "amplitude"]
    if needed.ext_factor != 0:
        checked += ["n_ctx_orig", "beta_fast", "beta_slow"]
    if rope_type == "longrope":
        checked.append("n_ctx_orig")
    for name in checked:
        a, b = getattr(found, name), getattr(needed, name)
        tolerance = 0 if isinstance(a, int) else 8 * U * max(abs(b), 1e-30)
        if abs(float(a) - float(b)) > tolerance:
            out.append(
                f"{found.sources.get(name, name)}: llama.cpp derives {name} = {_describe(a)}, "
                f"the config needs {_describe(b)}"
            )
    ff_a, ff_b = found.freq_factors, needed.freq_factors
    source = needed.sources.get("freq_factors") or found.sources.get("freq_factors", ROPE_FREQS)
    ones = np.ones(found.n_rot // 2, dtype=F32)
    a_vals = ones if ff_a is None else ff_a
    b_vals = ones if ff_b is None else ff_b
    if a_vals.shape != b_vals.shape:
        out.append(
            f"tensor {source}: {'missing' if ff_a is None else f'{a_vals.size} values'}, "
            f"the config needs {b_vals.size} divisors {_describe(b_vals)}"
        )
    elif not _same_divisors(a_vals, b_vals):
        what = "missing (all divisors 1)" if ff_a is None else f"holds {_describe(a_vals)}"
        out.append(f"tensor {source}: {what}, the config needs {_describe(b_vals)}")
    if abs(found.kq_multiplier - needed.kq_multiplier) > 32 * U * needed.kq_multiplier:
        out.append(
            f"{found.sources.get('kq_multiplier', 'kq_multiplier')}: llama.cpp multiplies the "
            f"attention scores by {found.kq_multiplier:.9g}, the config's softmax scale "
            f"multiplier is {needed.kq_multiplier:.9g}"
        )
    return out


def _default(model: GGUFModel, short: str) -> Any:
    """What llama.cpp takes for the key `{arch}.short` when the file has none."""
    if short == "rope.dimension_count":
        return llama_params(model).n_rot
    if short == "rope.freq_base_swa" and model.arch == "gemma3":
        return GEMMA3_SWA_BASE
    return KEY_DEFAULTS.get(short)


def _changes(model: GGUFModel, layout: Layout) -> Layout:
    """The part of `layout` the file does not already read as (a key absent where llama.cpp's
    default is the value; "none" for an absent scaling type without a factor; equal floats
    within float32 rounding)."""
    out = Layout()
    prefix = f"{model.arch}."
    for name, (value, kind) in layout.keys.items():
        short = name.removeprefix(prefix)
        current = model.values.get(name, _default(model, short))
        if short == "rope.scaling.type" and value in ("none", "longrope"):
            # absent ("linear") without a factor, "none" and "longrope" all give llama.cpp
            # freq_scale 1 and no YaRN (the divisors come with the architecture)
            has_factor = model.get("rope.scaling.factor") or model.get("rope.scale_linear")
            if (current in (None, "linear") and not has_factor) or current in ("none", "longrope"):
                current = value
        if isinstance(current, (list, tuple)) and current:
            current = current[0]
        same = current is not None and (
            abs(float(current) - float(value)) <= 4 * U * abs(float(value))
            if kind == "float32"
            else current == value
        )
        if not same:
            out.keys[name] = (value, kind)
    for name, array in layout.tensors.items():
        current = model.tensors.get(name)
        stored = model.tensor_types.get(name, "F32")
        if current is None or stored != "F32" or not _same_divisors(current, array):
            out.tensors[name] = array
    if layout.keys.get(f"{prefix}rope.scaling.type", ("", ""))[0] == "longrope" and model.get(
        "rope.scaling.factor"
    ) not in (None, 0, 1):
        out.keys[f"{prefix}rope.scaling.factor"] = (1.0, "float32")
    return out


def _apply(model: GGUFModel, layout: Layout) -> GGUFModel:
    """`model` with `layout`'s keys and tensors (what `plug_gguf` writes), in memory."""
    values = dict(model.values)
    values.update({name: value for name, (value, _) in layout.keys.items()})
    tensors = dict(model.tensors)
    tensors.update(layout.tensors)
    types = {**model.tensor_types, **dict.fromkeys(layout.tensors, "F32")}
    return replace(model, values=values, tensors=tensors, tensor_types=types)


def _check_side(model: GGUFModel, side: RopeSide, needed_model: GGUFModel) -> GGUFReport:
    found = llama_params(model, sliding=side.sliding, long=side.long)
    needed = llama_params(needed_model, sliding=side.sliding, long=side.long)
    exact_cos = np.asarray(side.table["cos"], np.float64)
    exact_sin = np.asarray(side.table["sin"], np.float64)
    rows, half = exact_cos.shape
    diagnosis = _field_diffs(found, needed, side)
    if found.n_rot != 2 * half:
        return GGUFReport(side.name, rows, math.inf, math.inf, (0, 0), "repair", tuple(diagnosis))
    if found.freq_factors is not None and found.freq_factors.size < half:
        diagnosis.append(
            f"tensor {found.sources.get('freq_factors')}: {found.freq_factors.size} values, "
            f"ggml reads n_rot/2 = {half}"
        )
        return GGUFReport(side.name, rows, math.inf, math.inf, (0, 0), "repair", tuple(diagnosis))
    source = found.sources.get("freq_factors")
    stored = model.tensor_types.get(source or "", "F32")
    if found.freq_factors is not None and stored != "F32":
        diagnosis.append(f"tensor {source} is {stored}: ggml's RoPE reads float32 divisors")
        return GGUFReport(side.name, rows, math.inf, math.inf, (0, 0), "repair", tuple(diagnosis))
    cos, sin = ggml_rope_table(found, rows)
    amp = float(side.table.meta.get("attention_scaling", 1.0))
    bound = ggml_bound(found, side.table["inv_freq"], amp, rows)
    err = np.maximum(np.abs(cos - exact_cos), np.abs(sin - exact_sin))
    ratio = err / bound
    outside = np.argwhere(err > bound)
    mult = float(side.table.meta.get("softmax_scale_multiplier", 1.0))
    kq_ok = abs(found.kq_multiplier - mult) <= 32 * U * mult
    first = (int(outside[0][0]), int(outside[0][1])) if outside.size else None
    exact = first is None and kq_ok
    if not kq_ok and not any("kq" in d or "yarn_log_multiplier" in d for d in diagnosis):
        diagnosis.append(
            f"llama.cpp multiplies the attention scores by {found.kq_multiplier:.9g}, the "
            f"config's softmax scale multiplier is {mult:.9g}"
        )
    if exact:
        verdict = "exact"
        diagnosis = []
    elif _within(needed, side, rows):
        verdict = "repair"
        if not diagnosis:
            diagnosis.append("the table differs though every key and tensor reads as needed")
    else:
        verdict = "mismatch"
        diagnosis.append(
            "llama.cpp does not compute this config's table from the file posenc would write "
            "either: its formula differs from the config's"
        )
    return GGUFReport(
        side.name,
        rows,
        float(err.max()) if err.size else 0.0,
        float(ratio.max()) if ratio.size else 0.0,
        first,
        verdict,
        tuple(diagnosis),
    )


def _within(params: RopeParams, side: RopeSide, rows: int) -> bool:
    """Whether ggml's table from `params` is within the bound of the exact one (and its kq
    multiplier within 32u of the config's softmax multiplier)."""
    cos, sin = ggml_rope_table(params, rows)
    amp = float(side.table.meta.get("attention_scaling", 1.0))
    bound = ggml_bound(params, side.table["inv_freq"], amp, rows)
    err = np.maximum(
        np.abs(cos - np.asarray(side.table["cos"], np.float64)),
        np.abs(sin - np.asarray(side.table["sin"], np.float64)),
    )
    mult = float(side.table.meta.get("softmax_scale_multiplier", 1.0))
    return bool((err <= bound).all()) and abs(params.kq_multiplier - mult) <= 32 * U * mult


TablesFor = Callable[[JSON], Tables]


def rope_sides(
    model: GGUFModel,
    config: JSON,
    resolved: Sequence[Any],
    table: TablesFor,
    *,
    rows: int | None = None,
    layer_type: str | None = None,
) -> list[RopeSide]:
    """The tables to compare: each of the config's rope tables (`resolved`, what
    `Client.resolve(config, kind="rope")` answers) at `rows` rows (default the file's
    `{arch}.context_length`), as posenc's exact half-width float32 table (`table(spec)`
    fetches one); LongRoPE's short and long sides; Gemma 3's local layers as `sliding`."""
    n_rows = rows or int(_number(model, "context_length") or 0)
    if n_rows <= 0:
        raise IncompatibleModelError(
            f"{model.path}: no {_key(model.arch, 'context_length')} key: pass --max-positions"
        )
    sides: list[RopeSide] = []
    for spec_info in resolved:
        name = str(spec_info.name)
        part = name.partition(":")[2]
        if layer_type is not None and part and part != layer_type:
            continue
        sliding = part == "sliding_attention"
        if sliding and model.arch != "gemma3":
            raise IncompatibleModelError(
                f"{model.path}: the config has sliding-attention RoPE ({name}) that llama.cpp's "
                f"{model.arch!r} does not compute apart"
            )
        spec = {k: v for k, v in dict(spec_info.spec).items() if k not in ("trig", "seq_len")}
        spec.update(
            precision="exact", width="half", packing="separate", dtype="float32",
            max_positions=n_rows,
        )  # fmt: skip
        spec.pop("full_layout", None)
        spec.pop("profile", None)
        scaling = dict(spec.get("rope_scaling") or {})
        if scaling.get("rope_type") == "longrope":
            switch = int(scaling["original_max_position_embeddings"])
            short = {**spec, "max_positions": min(n_rows, switch), "seq_len": switch}
            long_ = {**spec, "seq_len": max(n_rows, switch + 1)}
            sides.append(RopeSide(f"{name} (short)", False, False, table(short)))
            sides.append(RopeSide(f"{name} (long)", False, True, table(long_)))
        else:
            sides.append(RopeSide(name, sliding, False, table(spec)))
    if not sides:
        raise IncompatibleModelError("the config has no RoPE table to compare")
    return sides


def verify_gguf(model: GGUFModel, config: JSON, sides: Sequence[RopeSide]) -> list[GGUFReport]:
    """Each of `sides` against the table llama.cpp computes from `model`, changing nothing
    (module docstring). `IncompatibleModelError` when the file is not the config's model."""
    check_structure(model, config)
    needed = _apply(model, _changes(model, exact_layout(model.arch, sides)))
    return [_check_side(model, side, needed) for side in sides]


def plug_gguf(
    model: GGUFModel,
    config: JSON,
    sides: Sequence[RopeSide],
    output: str | os.PathLike[str],
) -> tuple[list[str], list[GGUFReport]]:
    """Write `model` to `output` with the keys and divisor tensors that make llama.cpp compute
    `sides`' exact tables (every other key and tensor copied unchanged), then verify the
    written file. Returns the keys and tensors written and the reports of the written file.
    `IncompatibleModelError` when the file is not the config's model or llama.cpp cannot
    compute the config's tables from any file."""
    import gguf

    check_structure(model, config)
    layout = _changes(model, exact_layout(model.arch, sides))
    changed = [*layout.keys, *layout.tensors]
    applied = _apply(model, layout)
    planned = [_check_side(applied, side, applied) for side in sides]
    if outcome(planned) != "exact":
        raise IncompatibleModelError(
            "llama.cpp would not compute this config's RoPE exactly even from the repaired "
            "file; nothing written: " + "; ".join(r.line() for r in planned if r.verdict != "exact")
        )
    reader = gguf.GGUFReader(model.path, "r")
    out_path = os.fspath(output)
    if os.path.abspath(out_path) == os.path.abspath(model.path):
        raise IncompatibleModelError("plug writes a new file: -o must not be the input")
    writer = gguf.GGUFWriter(out_path, model.arch, endianess=reader.endianess)
    kinds = {
        "float32": gguf.GGUFValueType.FLOAT32,
        "uint32": gguf.GGUFValueType.UINT32,
        "string": gguf.GGUFValueType.STRING,
    }
    for name, reader_field in reader.fields.items():
        if name == "general.architecture" or name.startswith("GGUF.") or name in layout.keys:
            continue
        main = reader_field.types[0]
        sub = reader_field.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, reader_field.contents(), main, sub_type=sub)
    for name, (value, kind) in layout.keys.items():
        writer.add_key_value(name, value, kinds[kind])
    for tensor in reader.tensors:
        if tensor.name in layout.tensors:
            continue
        writer.add_tensor_info(
            tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes,
            tensor.tensor_type,
        )  # fmt: skip
    for name, value in layout.tensors.items():
        writer.add_tensor_info(
            name, value.shape, value.dtype, value.nbytes, gguf.GGMLQuantizationType.F32
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        if tensor.name not in layout.tensors:
            writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    for value in layout.tensors.values():
        writer.write_tensor_data(value)
    writer.close()
    written = read_gguf(out_path)
    return changed, verify_gguf(written, config, sides)
