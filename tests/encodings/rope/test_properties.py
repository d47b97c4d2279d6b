"""Property tests over the RoPE spec space (hypothesis).

- cos^2 + sin^2 = A^2 within the tolerance table, |cos|, |sin| <= A, for every variant, layout,
  dtype and precision;
- the canonical key does not depend on how a spec is spelled (field order, 1 vs 1.0, rotary_dim
  vs partial_rotary_factor, a profile vs its explicit fields, defaults written out, seq_len
  values that select the same table, no-op scalings);
- canonicalisation never changes a table (compute on the canonical form == the spec's table
  computed straight from its own fields), so equal keys mean equal tables, and a spec changed
  into a different table gets a different key.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posenc.encodings import canonical_dict, compute, content_key, parse_spec
from posenc.encodings.rope import PROFILES, RopeSpec, layout
from posenc.encodings.rope.profiles import CONSUMER_DTYPES
from posenc.encodings.rope.variants import VARIANTS, RopeInputs
from tests.tolerances import ATOL

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

HEAD_DIMS = [4, 6, 8, 10, 16, 30, 32, 64, 80, 96, 128, 256]
THETAS = st.one_of(
    st.sampled_from([10000.0, 500000.0, 1e6, 150000.0, 10000]),
    st.floats(1.5, 1e7, allow_nan=False),
)
FLOAT_FACTOR = st.floats(1.0, 64.0)
DTYPES = frozenset({"float32", "bfloat16", "float16"})


def _scalings(half: int) -> st.SearchStrategy[dict[str, Any]]:
    """rope_scaling dicts for rotary dim 2*half (every registered rope_type)."""
    factors = st.lists(st.floats(0.5, 100.0), min_size=half, max_size=half)
    strategies: dict[str, st.SearchStrategy[dict[str, Any]]] = {
        "default": st.just({"rope_type": "default"}),
        "linear": st.builds(lambda f: {"rope_type": "linear", "factor": f}, FLOAT_FACTOR),
        "dynamic": st.builds(
            lambda f, m: {"rope_type": "dynamic", "factor": f, "max_position_embeddings": m},
            st.floats(1.0, 8.0),
            st.integers(1, 64),
        ),
        "yarn": st.builds(
            lambda f, orig, betas, ms, ms_all, af, trunc: {
                "rope_type": "yarn",
                "factor": f,
                "original_max_position_embeddings": orig,
                "beta_fast": max(betas),
                "beta_slow": min(betas),
                **({"mscale": ms} if ms is not None else {}),
                **({"mscale_all_dim": ms_all} if ms_all is not None else {}),
                **({"attention_factor": af} if af is not None else {}),
                "truncate": trunc,
            },
            FLOAT_FACTOR,
            st.integers(16, 65536),
            st.tuples(st.floats(0.5, 64.0), st.floats(0.5, 64.0)),
            st.none() | st.sampled_from([0.0, 0.707, 1.0]),
            st.none() | st.sampled_from([0.0, 0.707, 1.0]),
            st.none() | st.floats(0.5, 2.0),
            st.booleans(),
        ),
        "longrope": st.builds(
            lambda short, long, orig, f: {
                "rope_type": "longrope",
                "short_factor": short,
                "long_factor": long,
                "original_max_position_embeddings": orig,
                **({"factor": f} if f is not None else {"max_position_embeddings": 32 * orig}),
            },
            factors,
            factors,
            st.integers(2, 64),
            st.none() | FLOAT_FACTOR,
        ),
        "llama3": st.builds(
            lambda f, low, gap, orig: {
                "rope_type": "llama3",
                "factor": f,
                "low_freq_factor": low,
                "high_freq_factor": low + gap,
                "original_max_position_embeddings": orig,
            },
            FLOAT_FACTOR,
            st.floats(0.5, 4.0),
            st.floats(0.25, 8.0),
            st.integers(64, 65536),
        ),
        "proportional": st.builds(
            lambda f, prf: {"rope_type": "proportional", "factor": f, "partial_rotary_factor": prf},
            st.floats(1.0, 8.0),
            st.sampled_from([0.0, 0.25, 0.5, 1.0]) | st.floats(0.0, 1.0),
        ),
        "ntk_alpha": st.builds(
            lambda a: {"rope_type": "ntk_alpha", "alpha": a},
            st.floats(0.5, 1e4) | st.just(1.0),
        ),
    }
    assert set(strategies) == set(VARIANTS)
    return st.one_of(*strategies.values())


@st.composite
def rope_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid RoPE spec as wire fields."""
    head_dim = draw(st.sampled_from(HEAD_DIMS))
    rotary = draw(st.sampled_from(list(range(4, head_dim + 1, 2))))
    scaling = draw(_scalings(rotary // 2))
    spec: dict[str, Any] = {
        "kind": "rope",
        "head_dim": head_dim,
        "rope_theta": draw(THETAS),
        "max_positions": draw(st.integers(1, 48)),
        "rope_scaling": scaling,
        "precision": draw(st.sampled_from(["reference", "exact"])),
    }
    if scaling["rope_type"] == "proportional":
        spec["rope_scaling"] = draw(_scalings(head_dim // 2).filter(_is_proportional))
    elif rotary != head_dim or draw(st.booleans()):
        spec["rotary_dim"] = rotary
    if draw(st.booleans()):
        spec["seq_len"] = draw(st.integers(1, 200))
    profile = draw(st.none() | st.sampled_from(sorted(PROFILES)))
    d = head_dim if scaling["rope_type"] == "proportional" else rotary
    if profile == "ort_gqa" and (d // 2) % 8:
        profile = "onnx"
    if profile == "vllm" and scaling["rope_type"] == "longrope":
        profile = "flashinfer"  # vLLM's LongRoPE buffer holds two tables (profiles.VLLM_LONGROPE)
    if profile:
        spec["profile"] = profile
    packing = draw(st.none() | st.sampled_from(["separate", "cos_sin", "pairs"]))
    if packing:
        spec["packing"] = packing
    resolved_packing = packing or PROFILES[profile or "hf"].packing
    if resolved_packing == "separate" and draw(st.booleans()):
        spec["width"] = draw(st.sampled_from(["half", "full"]))
    if draw(st.booleans()):
        spec["interleaved"] = draw(st.booleans())
    if draw(st.booleans()):
        # the dtypes the profile's consumer reads (CONSUMER_DTYPES refuses the others)
        dtypes = CONSUMER_DTYPES.get(profile or "", (DTYPES, ""))[0]
        spec["dtype"] = draw(st.sampled_from(sorted(dtypes)))
    return spec


def _is_proportional(s: dict[str, Any]) -> bool:
    return bool(s["rope_type"] == "proportional")


def cos_sin(tensors: dict[str, torch.Tensor], rotary: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (P, w) out of any layout."""
    if "cos_sin" in tensors:
        return tensors["cos_sin"][:, : rotary // 2], tensors["cos_sin"][:, rotary // 2 :]
    if "pairs" in tensors:
        return tensors["pairs"][..., 0], tensors["pairs"][..., 1]
    return tensors["cos"], tensors["sin"]


@SETTINGS
@given(rope_specs())
def test_pythagorean_and_bounded(fields: dict[str, Any]) -> None:
    spec = parse_spec(fields)
    table = compute(spec)
    canon = table.meta["spec"]
    dtype = canon["dtype"]
    big_a = table.meta["attention_scaling"]
    # The fp32 path multiplies by A rounded to fp32 (torch casts the scalar); exact by A itself.
    a = big_a if canon["precision"] == "exact" else float(torch.tensor(big_a, dtype=torch.float32))
    bound = torch.tensor(a, dtype=torch.float64).to(getattr(torch, dtype)).double()
    c, s = (t.double() for t in cos_sin(table.tensors, canon["rotary_dim"]))
    assert bool((c.abs() <= bound).all())
    assert bool((s.abs() <= bound).all())
    # ATOL is for O(1) values; cos^2 + sin^2 scales with a^2.
    assert float((c * c + s * s - a * a).abs().max()) <= ATOL[dtype] * a * a


def straight_table(spec: RopeSpec) -> dict[str, torch.Tensor]:
    """The table from the spec's own fields, without `canonical()` touching seq_len, rotary_dim
    or the scaling parameters (the layout fields are resolved through the canonical form)."""
    laid = spec.canonical()
    dim = spec.resolved_rotary_dim()
    dtype = torch.float64 if spec.precision == "exact" else torch.float32
    x = RopeInputs(
        dim,
        spec.head_dim,
        spec.rope_theta,
        spec.seq_len or spec.max_positions,
        dtype,
        torch.device("cpu"),
    )
    inv, a, _ = VARIANTS[spec.rope_scaling.rope_type].inv_freq(spec.rope_scaling, x)
    angles = torch.arange(spec.max_positions).to(dtype)[:, None] * inv[None, :]
    out = layout(laid, torch.cos(angles) * a, torch.sin(angles) * a)
    out["inv_freq"] = inv
    return out


def same_tables(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a
    )


@SETTINGS
@given(rope_specs())
def test_canonical_form_keeps_the_table(fields: dict[str, Any]) -> None:
    spec = parse_spec(fields)
    assert isinstance(spec, RopeSpec)
    assert same_tables(compute(spec).tensors, straight_table(spec))
    # The canonical form is a valid spec with the same key, and canonical() is idempotent.
    again = parse_spec(canonical_dict(spec))
    assert content_key(again) == content_key(spec)
    assert canonical_dict(again) == canonical_dict(spec)


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    return value


def _ints_for_integral_floats(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _ints_for_integral_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints_for_integral_floats(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


@st.composite
def respellings(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """A spec and an equal-valued spelling of it."""
    fields = draw(rope_specs())
    spec = parse_spec(fields)
    assert isinstance(spec, RopeSpec)
    other = dict(fields)
    how = draw(
        st.sampled_from(
            ["order", "ints", "partial", "explicit profile", "defaults", "seq_len", "canonical"]
        )
    )
    if how == "order":
        other = _shuffled(other, random.Random(draw(st.integers(0, 2**32))))
    elif how == "ints":
        other = _ints_for_integral_floats(other)
    elif how == "partial":
        d = spec.resolved_rotary_dim()
        prf = d / spec.head_dim
        if spec.rope_scaling.rope_type != "proportional" and int(spec.head_dim * prf) == d:
            other.pop("rotary_dim", None)
            other["partial_rotary_factor"] = prf
    elif how == "explicit profile":
        canon = spec.canonical()
        other.pop("profile", None)
        for name in ("interleaved", "width", "packing", "dtype"):
            other[name] = getattr(canon, name)
    elif how == "defaults":
        other.setdefault("precision", "reference")
        other.setdefault("rope_theta", 10000.0)
        if other["rope_scaling"]["rope_type"] == "yarn":
            other["rope_scaling"] = {"beta_fast": 32.0, "beta_slow": 1.0, **other["rope_scaling"]}
    elif how == "seq_len":
        scaling = spec.rope_scaling
        length = spec.seq_len or spec.max_positions
        if scaling.rope_type == "dynamic":
            mpe = scaling.max_position_embeddings  # type: ignore[union-attr]
            other["seq_len"] = draw(st.integers(1, mpe)) if length <= mpe else length
        elif scaling.rope_type == "longrope":
            orig = scaling.original_max_position_embeddings  # type: ignore[union-attr]
            above = length > orig
            other["seq_len"] = draw(st.integers(orig + 1, 10**6) if above else st.integers(1, orig))
    else:
        other = canonical_dict(spec)
    return fields, other


@SETTINGS
@given(respellings())
def test_key_stable_under_equal_spellings(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    first, second = (parse_spec(f) for f in pair)
    assert content_key(first) == content_key(second)
    assert same_tables(compute(first).tensors, compute(second).tensors)


def test_named_equal_spellings() -> None:
    def key(**fields: Any) -> str:
        return content_key(parse_spec({"kind": "rope", "max_positions": 16, **fields}))

    assert key(head_dim=128, partial_rotary_factor=0.5) == key(head_dim=128, rotary_dim=64)
    assert key(head_dim=128, rope_theta=10000) == key(head_dim=128, rope_theta=10000.0)
    assert key(head_dim=128) == key(head_dim=128, rotary_dim=128, profile="hf")
    assert key(head_dim=128, profile="vllm") == key(head_dim=128, packing="cos_sin", width="half")
    assert key(head_dim=64, rope_scaling={"rope_type": "linear", "factor": 1}) == key(head_dim=64)
    assert key(head_dim=64, rope_scaling={"rope_type": "ntk_alpha", "alpha": 1.0}) == key(
        head_dim=64
    )
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 4096}
    assert key(head_dim=64, rope_scaling=dynamic, seq_len=100) == key(
        head_dim=64, rope_scaling=dynamic, seq_len=4096
    )
    assert key(head_dim=64, rope_scaling=dynamic, seq_len=4097) != key(
        head_dim=64, rope_scaling=dynamic, seq_len=4096
    )
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    assert key(head_dim=64, rope_scaling={**yarn, "mscale": 0.707}) == key(
        head_dim=64, rope_scaling=yarn
    )


@st.composite
def mutations(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """A spec and a nearby one (one field changed, often to a value that may or may not change
    the table)."""
    fields = draw(rope_specs())
    other = {**fields, "rope_scaling": dict(fields["rope_scaling"])}
    scaling = other["rope_scaling"]
    name = draw(
        st.sampled_from(
            ["seq_len", "theta", "max_positions", "dtype", "precision", "interleaved", "scaling"]
        )
    )
    if name == "seq_len":
        other["seq_len"] = draw(st.integers(1, 200))
    elif name == "theta":
        theta = float(fields["rope_theta"])
        other["rope_theta"] = draw(st.sampled_from([theta * (1 + 2**-52), theta * (1 + 2**-20)]))
    elif name == "max_positions":
        other["max_positions"] = draw(st.integers(1, 48))
    elif name == "dtype":
        other["dtype"] = draw(st.sampled_from(["float32", "bfloat16", "float16"]))
    elif name == "precision":
        other["precision"] = draw(st.sampled_from(["reference", "exact"]))
    elif name == "interleaved":
        other["interleaved"] = not fields.get("interleaved", False)
    else:
        key = draw(st.sampled_from(sorted(k for k in scaling if k != "rope_type") or ["none"]))
        value = scaling.get(key)
        if isinstance(value, bool):
            scaling[key] = not value
        elif isinstance(value, float):
            scaling[key] = draw(st.sampled_from([value * (1 + 2**-40), value + 1.0, 1.0]))
        elif isinstance(value, int):
            scaling[key] = value + draw(st.sampled_from([1, -1])) if value > 1 else value + 1
        elif isinstance(value, list):
            scaling[key] = [v * 1.5 for v in value]
    return fields, other


@SETTINGS
@given(mutations())
def test_different_tables_have_different_keys(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    first = parse_spec(pair[0])
    try:
        second = parse_spec(pair[1])
    except Exception:  # the mutation made it invalid (e.g. beta_fast < beta_slow)
        return
    assert isinstance(first, RopeSpec)
    assert isinstance(second, RopeSpec)
    if not same_tables(straight_table(first), straight_table(second)):
        assert content_key(first) != content_key(second)
    if content_key(first) == content_key(second):
        assert same_tables(straight_table(first), straight_table(second))
