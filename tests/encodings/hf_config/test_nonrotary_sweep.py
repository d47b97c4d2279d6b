"""The non-rotary sweep (issue 24): every model type of the locked transformers whose modeling
code uses ALiBi, T5 buckets, sinusoids, 2-D sine tables or relative indices (`nonrotary_sweep.
MARKERS`), default config plus the released variants, through `resolve_hf_parts` (what
/v1/resolve calls). Each is exact against the model's own code or refused with a reason that
names the model's encoding; never accepted and different, never a marked family dropped without
a refusal, and a composite served in part lists each part it leaves out (`unserved`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from transformers import GenerationConfig

from posenc.encodings import ConfigError, compute, parse_spec
from posenc.encodings.hf_config import MAPPERS, resolve_hf_config, resolve_hf_parts
from posenc.encodings.hf_config.unmapped import LEFT_OUT, REFUSED, refuse
from posenc.encodings.hf_config.unmapped import left_out as left_out_parts
from tests.encodings.hf_config import nonrotary_sweep as sweep
from tests.encodings.hf_config import released_nonrotary as released

CASES = sweep.cases()
GENERIC = "unknown model_type without rope/alibi/relative-bias/sinusoidal fields"


def _config(model_type: str, extra: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    cfg = sweep.hf_config(model_type, extra)
    return cfg, cfg.to_dict()


def test_the_sweep_finds_the_families() -> None:
    found = {f for t, _ in CASES.values() for f in sweep.families(t)}
    assert found == set(sweep.MARKERS)
    assert len(CASES) > 100, len(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_exact_or_refused_with_the_reason(case: str) -> None:
    model_type, extra = CASES[case]
    cfg, config = _config(model_type, extra)
    if model_type in sweep.REQUEST:
        # Tables sized by the request: without its fields the error names them.
        with pytest.raises(ConfigError) as missing:
            resolve_hf_parts(config)
        sizes = {k for k in sweep.REQUEST[model_type] if not k.startswith("valid_")}
        assert {p.field for p in missing.value.problems} >= sizes, missing.value
    try:
        resolution = resolve_hf_parts(config, **sweep.REQUEST.get(model_type, {}))
    except ConfigError as err:
        (problem,) = err.problems
        # The generic message is only true of a text_config read instead of the model itself.
        assert not problem.message.startswith(GENERIC) or problem.field.startswith(
            "text_config."
        ), (
            case,
            problem,
        )
        assert problem.message, case
        mapper = MAPPERS.get(model_type)
        if mapper is not None and mapper is not refuse:
            # A mapped model type is refused only where the sweep knows why.
            assert sweep.DEFAULT_REFUSALS.get(case, "\0") in problem.field, (case, problem)
        return
    resolved = resolution.specs
    marked = sweep.families(model_type)
    got = {n.spec.kind for n in resolved}
    # Served in part: each part left out is listed with its reason, and noted on every table.
    expected = sweep.NOT_SERVED.get(case, {})
    assert [u.part for u in resolution.unserved] == list(expected), (case, resolution.unserved)
    for part in resolution.unserved:
        assert expected[part.part] in part.reason, (case, part)
    # Every marked family is served, listed as unserved, or documented as absent (issue 39).
    missing = sweep.unaccounted(case, got, [u.part for u in resolution.unserved])
    assert not missing, (case, sorted(missing), "served", sorted(got))
    left_out = [reason for _, reason, _ in left_out_parts(config)]
    for named in resolved:
        noted = named.notes.get("not_served", "")
        assert all(reason in noted for reason in left_out), (case, named.name)
        if not left_out:
            assert "not_served" not in named.notes, case
    allowed = set(marked) | {sweep.ALTERNATIVES.get(case, sweep.ALTERNATIVES.get(model_type, ""))}
    if case in sweep.NOT_SERVED:
        allowed.add("rope")  # a composite's text model: the RoPE sweep's
    assert got <= allowed, (case, got, marked)
    for named in resolved:
        if named.spec.kind not in marked:
            continue  # the config's other family (e.g. Falcon's RoPE): the RoPE sweep's part
        ours, theirs = sweep.REFERENCES[named.spec.kind](model_type, cfg, named)
        assert ours.shape == theirs.shape, (case, named.name)
        rtol = sweep.TOLERANCE.get(named.spec.kind, 0.0)
        if rtol:
            torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=rtol, atol=0)
        else:
            assert torch.equal(ours, theirs.to(ours.dtype)), (case, named.name)


@pytest.mark.parametrize("mutant", ["maskformer-swin", "maskformer", "falcon+alibi"])
def test_a_marked_family_left_unaccounted_fails(mutant: str) -> None:
    """`unaccounted` catches a served config that drops one of its marked families without a
    word: maskformer-swin without its exclusion, MaskFormer without its unserved backbone,
    Falcon-RW serving nothing of its alibi."""
    model_type, extra = CASES[mutant]
    resolution = resolve_hf_parts(
        _config(model_type, extra)[1], **sweep.REQUEST.get(model_type, {})
    )
    served = {n.spec.kind for n in resolution.specs}
    parts = [u.part for u in resolution.unserved]
    assert not sweep.unaccounted(mutant, served, parts)
    excluded = dict(sweep.EXCLUDED)
    excluded.pop(mutant, None)
    unserved_families = dict(sweep.UNSERVED_FAMILIES)
    unserved_families.pop(mutant, None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sweep, "EXCLUDED", excluded)
        patch.setattr(sweep, "UNSERVED_FAMILIES", unserved_families)
        if mutant == "falcon+alibi":
            served -= {"alibi"}
        assert sweep.unaccounted(mutant, served, parts), mutant


def test_the_exclusions_are_not_stale() -> None:
    """Each `EXCLUDED` family is marked for its case and not served by it."""
    for case, excluded in sweep.EXCLUDED.items():
        model_type, extra = CASES[case]
        assert set(excluded) <= sweep.families(model_type), case
        resolution = resolve_hf_parts(_config(model_type, extra)[1])
        assert not set(excluded) & {n.spec.kind for n in resolution.specs}, case


def test_every_refusal_names_a_swept_model_type() -> None:
    """`unmapped.REFUSED` holds no stale names: each is a model type the sweep finds."""
    swept = {t for t, _ in CASES.values()}
    assert set(REFUSED) <= swept, sorted(set(REFUSED) - swept)
    assert set(LEFT_OUT) <= swept


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_every_refusal_is_what_resolve_says(model_type: str) -> None:
    """Each reason of `unmapped.REFUSED` is the error of the model type's own config (not shadowed
    by a `text_config` read first)."""
    _, config = _config(model_type, {})
    with pytest.raises(ConfigError) as err:
        resolve_hf_config(config)
    (problem,) = err.value.problems
    assert (problem.field, problem.message) == ("model_type", REFUSED[model_type])


@pytest.mark.parametrize("pad", [0, 1, 2])
@pytest.mark.parametrize("model_type", ["xglm", "m2m_100", "nllb-moe"])
def test_the_first_row_note_is_the_row_the_model_reads(model_type: str, pad: int) -> None:
    """`notes["first_row"]`: the table row position 0 reads, checked on the model's own module
    (XGLM: position + 2 whatever pad_token_id; M2M100 and NLLB-MoE: pad_token_id + 1 + position),
    with pad_token_id 0, 1 (the released value) and 2."""
    cfg, config = _config(model_type, {"pad_token_id": pad, "max_position_embeddings": 64})
    (named,) = resolve_hf_parts(config).specs
    table = compute(named.spec).tensors["embedding"]
    mod = sweep._modeling(model_type)
    cls = next(
        getattr(mod, n) for n in sorted(dir(mod)) if n.endswith("SinusoidalPositionalEmbedding")
    )
    module = cls(cfg.max_position_embeddings, cfg.d_model, cfg.pad_token_id)
    length = 40
    if model_type == "xglm":
        read = module(torch.arange(length)[None])[0]
    else:
        read = module(torch.full((1, length), pad + 7))[0]  # no padding token in the input
    first = named.notes["first_row"]
    assert torch.equal(table[first : first + length], read), (model_type, pad, first)


@pytest.mark.parametrize("rows", [32, 64])
def test_mpnet_bias_from_the_rows_the_notes_name(rows: int) -> None:
    """MPNet's notes: pass the first 32 rows of relative_attention_bias (what /v1/tables takes);
    the bias table then equals MPNetEncoder.compute_position_bias with the whole embedding."""
    cfg, config = _config("mpnet", {"relative_attention_num_buckets": rows})
    (named,) = resolve_hf_parts(config, key_length=48).specs
    assert "first 32 rows" in named.notes["bias"]
    encoder = sweep._modeling("mpnet").MPNetEncoder(cfg)
    torch.nn.init.normal_(encoder.relative_attention_bias.weight)
    weight = encoder.relative_attention_bias.weight.detach()
    spec = named.spec.model_dump() | {"relative_attention_bias": weight[:32].tolist()}
    ours = compute(parse_spec(spec)).tensors["bias"]
    with torch.no_grad():
        theirs = encoder.compute_position_bias(torch.zeros(1, 48, cfg.hidden_size))[0]
    assert torch.equal(ours, theirs)


def test_mpnet_with_fewer_than_32_rows_is_refused() -> None:
    _, config = _config("mpnet", {"relative_attention_num_buckets": 16})
    with pytest.raises(ConfigError) as err:
        resolve_hf_parts(config)
    assert err.value.problems[0].field == "relative_attention_num_buckets"


@pytest.mark.parametrize("radius", [127, 5])
def test_longt5_notes_the_local_window_the_model_masks(radius: int) -> None:
    """LongT5's encoder notes name the local window: the farthest key LongT5's own locality
    mask lets a query see is local_radius away."""
    mod = sweep._modeling("longt5")
    _, config = _config("longt5", {"local_radius": radius})
    encoder = next(n for n in resolve_hf_parts(config).specs if n.name == "t5_bias:encoder")
    assert f"local_radius={radius}" in encoder.notes["local_window"]
    assert f"|i - j| <= {radius}" in encoder.notes["local_window"]
    block = radius + 1
    relative = mod._make_3block_relative_position_ids(block)
    allowed = mod._mask_local_attention_mask(
        torch.ones(1, 1, block, 3 * block, dtype=torch.bool), block
    )
    assert int(relative[allowed[0, 0]].abs().max()) == radius


@pytest.mark.parametrize("model_type", ["layoutlmv2", "layoutlmv3"])
def test_layoutlm_bias_from_the_weights_the_notes_name(model_type: str) -> None:
    """LayoutLMv2/v3: the served buckets with rel_pos_bias.weight transposed (the notes) give the
    encoder's own 1-D relative bias (before LayoutLMv3's division by sqrt(head_dim))."""
    cfg, config = _config(model_type, {})
    served = resolve_hf_parts(config, key_length=64).specs
    (named,) = [n for n in served if n.spec.kind == "t5_bias"]
    assert "transpose" in named.notes["bias"]
    mod = sweep._modeling(model_type)
    encoder_cls = "LayoutLMv2Encoder" if model_type == "layoutlmv2" else "LayoutLMv3Encoder"
    encoder = getattr(mod, encoder_cls)(sweep._rebuilt(model_type, cfg, {"num_hidden_layers": 1}))
    torch.nn.init.normal_(encoder.rel_pos_bias.weight)
    weight = encoder.rel_pos_bias.weight.detach()
    spec = named.spec.model_dump() | {"relative_attention_bias": weight.t().tolist()}
    ours = compute(parse_spec(spec)).tensors["bias"]
    with torch.no_grad():
        positions = torch.arange(64)[None]
        if model_type == "layoutlmv2":
            theirs = encoder._calculate_1d_position_embeddings(positions)[0]
        else:
            theirs = encoder._cal_1d_pos_emb(positions)[0]
    assert torch.equal(ours, theirs)


RELEASED_CASES = sorted(released.RELEASED)


def test_every_released_row_names_its_checkpoint_and_source() -> None:
    """Each `+size` row of the sweep stands for a released checkpoint (`released.RELEASED`) whose
    config.json values come from a named public source; an unverified row claims no release."""
    size_rows = {case for case in sweep.VARIANTS if case in released.RELEASED}
    assert size_rows == set(released.RELEASED)
    for case, row in released.RELEASED.items():
        assert sweep.VARIANTS[case] == (row.model_type, row.config), case
        assert row.source, case
        assert row.config, case
        if row.verified:
            assert "/" in row.checkpoint, case
    assert len(released.RELEASED) >= 20


# Keys transformers' config class consumes under another name (BloomConfig: `n_embed` is the
# legacy spelling of hidden_size, popped in __init__).
_RENAMED = {("bloom", "n_embed"): "hidden_size"}
# Keys of the released files that transformers 5.24's config classes do not declare, none of
# which sizes a position table in transformers' modeling code: Megatron-DeepSpeed's BLOOM flags
# (fusions, offset_alibi, n_inner, unk_token_id), MPT's tokenizer_name / verbose, Falcon-RW's
# apply_residual_connection_post_layernorm, Marian's v4 keys (static_position_embeddings, which
# posenc still checks: false is refused), generation parameters (GenerationConfig's fields) and
# the weights' dtype.
_UNREAD = {
    "attention_softmax_in_fp32",
    "bias_dropout_fusion",
    "masked_softmax_fusion",
    "n_inner",
    "offset_alibi",
    "skip_bias_add",
    "skip_bias_add_qkv",
    "unk_token_id",
    "tokenizer_name",
    "verbose",
    "apply_residual_connection_post_layernorm",
    "add_bias_logits",
    "add_final_layer_norm",
    "classif_dropout",
    "normalize_before",
    "normalize_embedding",
    "static_position_embeddings",
    "torch_dtype",
} | {k for k in vars(GenerationConfig()) if not k.startswith("_")}


@pytest.mark.parametrize("case", RELEASED_CASES)
def test_the_sweep_row_holds_the_released_values(case: str) -> None:
    """transformers' config object the sweep builds for a released row (and compares tables
    against) holds every value of the released config.json: no key silently ignored (Falcon's
    legacy n_head, which transformers 5.24's FalconConfig does not alias, would fail here)."""
    row = released.RELEASED[case]
    cfg, built = _config(row.model_type, row.config)
    cls = type(cfg)
    declared = {f.name for f in dataclasses.fields(cls)} | set(cls.attribute_map)
    for key, value in row.config.items():
        name = _RENAMED.get((row.model_type, key), key)
        if name not in declared:
            # Not a key of the config class: one transformers does not read at all.
            assert key in _UNREAD, (case, key, "not read by", cls.__name__)
            continue
        got = built[name] if name in built else getattr(cfg, name)
        if isinstance(value, dict):
            got = got if isinstance(got, dict) else got.to_dict()
            assert {k: got[k] for k in value} == value, (case, key)
        elif isinstance(value, list):
            assert list(got) == value, (case, key, got)
        else:
            assert got == value, (case, key, got)


@pytest.mark.parametrize("case", [c for c in RELEASED_CASES if released.RELEASED[c].copy])
def test_a_released_config_resolves_as_its_sweep_row(case: str) -> None:
    """The released config.json itself, posted as a user would (`resolve_hf_parts` of the raw
    mapping, its own key spellings: BLOOM 176B's n_embed / num_attention_heads), resolves to the
    same tables as the sweep's row, which `test_exact_or_refused_with_the_reason` compares with
    the model's own code."""
    row = released.RELEASED[case]
    raw = resolve_hf_parts({"model_type": row.model_type, **row.config})
    built = resolve_hf_parts(_config(row.model_type, row.config)[1])
    assert [(n.name, n.spec) for n in raw.specs] == [(n.name, n.spec) for n in built.specs]
    assert raw.specs, case
