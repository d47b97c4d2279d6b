"""Every graph x mode x op x opset 17..23 x dtype (the non-default input styles of alibi/t5_bias/
relative_index at opsets 17 and 23): the model verifies (checker, shape inference,
onnxruntime against the core) and, checked here independently of the exporter's own samples,
equals the encodings core's table (or CoPE's torch reference) within the tolerance table
(exactly where the graph only moves core values)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from posenc.encodings import SpecBase, compute
from posenc.encodings.cope import cope_logits
from posenc.onnx import EXPORTERS, OPSETS, export, metadata, verify
from posenc.onnx.graphs import cope
from posenc.onnx.graphs._rotary import reference_rotate
from tests.onnx.cases import DTYPES, assert_close, run, spec_for
from tests.tolerances import ATOL

LATER_KINDS = {"cope", "learned", "normalized", "relative_index", "xpos", "vision_rope"}
"""Issue 9's graphs (and issue 18's vision_rope), checked by `_later_case`."""
ENDS = (OPSETS[0], OPSETS[-1])


def _combos() -> list[Any]:
    out = []
    for (kind, graph), exporter in sorted(EXPORTERS.items()):
        for mode in exporter.modes:
            variants = exporter.ops or exporter.styles(mode) or (None,)
            for variant, opset, dtype in itertools.product(variants, OPSETS, DTYPES):
                if variant == "onnx" and opset < 23:
                    continue  # RotaryEmbedding exists from opset 23 (refusal tested elsewhere)
                if variant in ("onnx", "contrib") and dtype == "bfloat16":
                    continue  # no onnxruntime CPU kernel (refusal tested elsewhere)
                if variant in exporter.input_styles[1:] and opset not in ENDS:
                    continue  # input styles differ only in the first nodes: ends of the range
                out.append(
                    pytest.param(
                        kind,
                        graph,
                        mode,
                        variant,
                        opset,
                        dtype,
                        id=f"{kind}/{graph}-{mode}-{variant}-op{opset}-{dtype}",
                    )
                )
    return out


def _variant_kwargs(kind: str, graph: str, variant: str | None) -> dict[str, Any]:
    if variant is None:
        return {}
    if graph != "rotary":
        return {"inputs": variant}
    # xPos: the key role (the reciprocal decay); the query role is tested in test_xpos.py
    return {"op": variant, "role": "key"} if kind == "xpos" else {"op": variant}


@pytest.mark.parametrize(("kind", "graph", "mode", "variant", "opset", "dtype"), _combos())
def test_graph_equals_core(
    kind: str, graph: str, mode: str, variant: str | None, opset: int, dtype: str
) -> None:
    spec = spec_for(kind, graph, dtype)
    model = export(spec, graph, opset=opset, mode=mode, **_variant_kwargs(kind, graph, variant))
    assert {o.version for o in model.opset_import if o.domain == ""} == {opset}
    assert metadata(model)["graph"] == f"{kind}/{graph}"
    report = verify(model, spec)
    assert report.samples >= 1
    if kind in LATER_KINDS:
        feeds, expected, atol = _later_case(spec, graph, mode, variant, dtype)
    else:
        feeds, expected, atol = _core_case(spec, graph, mode, variant, dtype)
    outputs = run(model, feeds)
    for name, want in expected.items():
        assert_close(outputs[name], want, atol)


def _core_case(
    spec: SpecBase, graph: str, mode: str, variant: str | None, dtype: str
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], float]:
    """Inputs covering the spec's whole table and the core's tensors for them."""
    table = compute(spec).tensors
    exact_gather = mode == "table"
    if spec.kind == "rope" and graph == "cos_sin":
        rows = torch.arange(spec.max_positions)[None]
        expected = {k: v[None] for k, v in table.items() if k != "inv_freq"}
        return {"position_ids": rows}, expected, 0.0 if exact_gather else ATOL[dtype]
    if spec.kind == "rope":
        gen = torch.Generator().manual_seed(1)
        x = (torch.rand(2, 3, 7, spec.head_dim, generator=gen) * 2 - 1).to(table["cos"].dtype)
        pos = torch.stack(
            (torch.arange(7), torch.arange(spec.max_positions - 7, spec.max_positions))
        )
        cos, sin = table["cos"][pos].float(), table["sin"][pos].float()  # full width cat(c, c)
        y, _ = apply_rotary_pos_emb(x.float(), x.float(), cos, sin)
        return {"x": x, "position_ids": pos}, {"y": y.to(x.dtype)}, 2 * ATOL[dtype]
    if spec.kind == "alibi":
        q, k = spec.query_length, spec.key_length
        queries = torch.arange(spec.query_offset, spec.query_offset + q)
        feeds = (
            {"query_positions": queries, "key_positions": torch.arange(k)}
            if variant == "positions"
            else {"past_length": torch.tensor(k - q), "query_length": torch.tensor(q)}
        )
        return feeds, {"bias": table["bias"][None]}, 0.0
    if spec.kind == "t5_bias":
        queries = torch.arange(spec.query_offset, spec.query_offset + spec.query_length)
        keys = torch.arange(spec.key_length)
        feeds = (
            {"query_positions": queries, "key_positions": keys}
            if variant == "positions"
            else {
                "past_length": torch.tensor(spec.query_offset),
                "query_length": torch.tensor(spec.query_length),
            }
        )
        if variant == "lengths":
            # keys end at the last query: compare the columns the spec has
            keys = keys[: spec.query_offset + spec.query_length]
        expected = {"buckets": table["buckets"], "bias": table["bias"][None]}
        if variant == "lengths":
            expected = {
                "buckets": expected["buckets"][:, : len(keys)],
                "bias": expected["bias"][..., : len(keys)],
            }
        return feeds, expected, 0.0
    if spec.kind == "sinusoidal":
        first = spec.position_offset or 0
        rows = torch.arange(first, first + (spec.max_positions or 0))[None]
        return (
            {"position_ids": rows},
            {"embedding": table["embedding"][None]},
            (0.0 if exact_gather else ATOL[dtype]),
        )
    sizes = {
        "height": spec.height,
        "width": spec.width,
        "valid_height": spec.valid_height,
        "valid_width": spec.valid_width,
    }
    feeds = {k: torch.tensor(v) for k, v in sizes.items()}
    return feeds, {"embedding": table["embedding"]}, ATOL[dtype]


def _later_case(
    spec: Any, graph: str, mode: str, variant: str | None, dtype: str
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], float]:
    """Inputs for issue 9's graphs and the core's (or CoPE's reference) outputs for them."""
    gen = torch.Generator().manual_seed(2)
    if spec.kind == "cope":
        d, t = spec.head_dim, 11
        q, k = torch.randn(1, 3, t, d, generator=gen), torch.randn(1, 3, t, d, generator=gen)
        emb = torch.tensor(spec.pos_emb) if spec.pos_emb is not None else None
        feeds = {"q": q.to(getattr(torch, dtype)), "k": k.to(getattr(torch, dtype))}
        if emb is None:
            emb = torch.randn(d, spec.npos_max, generator=gen)
            feeds["pos_emb"] = emb.to(getattr(torch, dtype))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        if spec.mask == "input":
            mask = (torch.rand(1, 1, t, t, generator=gen) < 0.5) | torch.eye(t, dtype=torch.bool)
            feeds["attention_mask"] = mask
        qf, kf, ef = feeds["q"].float(), feeds["k"].float(), emb.float()
        if "pos_emb" in feeds:
            ef = feeds["pos_emb"].float()
        logits = cope_logits(qf, kf, ef, spec.npos_max, spec.variant, mask)
        atol = cope.tolerance(spec, qf, kf, ef, dtype=dtype)
        if graph == "logits":
            return feeds, {"logits": logits.to(getattr(torch, dtype))}, atol
        v = torch.randn(1, 3, t, 4, generator=gen).to(getattr(torch, dtype))
        y = torch.softmax(logits, dim=-1) @ v.float()
        peak = float(v.float().abs().max())
        atol = 2 * cope.tolerance(spec, qf, kf, ef, dtype="float32") * peak
        return {**feeds, "v": v}, {"y": y.to(v.dtype)}, atol + 2 * ATOL[dtype] * (1 + peak)
    table = compute(spec).tensors
    if spec.kind == "xpos":
        first = spec.position_offset
        pos = torch.arange(first, first + spec.max_positions)[None]
        peak = max(float(t.double().abs().max()) for t in table.values())
        atol = 0.0 if mode == "table" else 2 * ATOL[dtype] * max(1.0, peak)
        if graph == "cos_sin":
            return {"position_ids": pos}, {n: t[None] for n, t in table.items()}, atol
        half = compute(spec.model_copy(update={"width": "half"})).tensors
        pos = torch.stack((pos[0, :7], pos[0, -7:]))
        x = (torch.rand(2, 3, 7, spec.head_dim, generator=gen) * 2 - 1).to(half["cos_k"].dtype)
        y = reference_rotate(x, half["cos_k"][pos], half["sin_k"][pos], spec.head_dim, True)
        return {"x": x, "position_ids": pos}, {"y": y}, 4 * ATOL[dtype] * max(1.0, peak)
    if spec.kind == "relative_index":
        expected = {"index": table["index"], "bias": table["bias"][None]}
        if mode == "table":
            return {}, expected, 0.0
        q, k = spec.shape()
        queries = torch.arange(spec.query_offset, spec.query_offset + q)
        feeds = (
            {"query_positions": queries, "key_positions": torch.arange(k)}
            if variant == "positions"
            else {"past_length": torch.tensor(k - q), "query_length": torch.tensor(q)}
        )
        return feeds, expected, 0.0
    if spec.kind == "normalized":
        b, p = len(spec.lengths), spec.rows()
        feeds = {
            "position_ids": torch.arange(p).expand(b, p),
            "lengths": torch.tensor(spec.lengths),
        }
        return feeds, {"embedding": table["embedding"]}, 0.0
    if spec.kind == "vision_rope":
        rows = torch.arange(spec.rows()).flip(0)  # every row, gathered in reverse
        return {"patch_ids": rows}, {n: table[n][rows] for n in ("cos", "sin")}, 0.0
    rows = table["embedding"].shape[0]
    return {"position_ids": torch.arange(rows)[None]}, {"embedding": table["embedding"][None]}, 0.0
