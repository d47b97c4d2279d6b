"""How far the position tables a model holds are from the exact ones, and why: `verify_model`
checks every RoPE site (`sites.find_sites`: baked caches, gathered tables, folded constants,
LongRoPE's If branches, frequency constants, and those it cannot check) and `outcome` gives the
whole model's verdict, the one `posenc-client verify` exits with and `POST /v1/check/onnx`
answers; `check_caches` compares and diagnoses one pair, `check_frequencies` one frequency
constant, `verify_rope_caches` the baked caches only, `departures` maps where a cache departs.

Exporters bake half-width cos/sin caches (P, d/2) into models (onnxruntime-genai's builder: GQA
`cos_cache` / `sin_cache` initializers, LongRoPE's two caches in an `If`). Each is compared,
changing nothing, with the served table for the model's config: max abs and ulp error and the
first (row, column) where it departs, then a diagnosis read from the cache itself:

- the attention scaling A is `cos[0, 0]` (angle 0), each column's frequency the angle
  `atan2(sin, cos)` at the furthest row where it stays below pi/2, divided by the row (one
  rounding of a value below 1, so relative precision ~1e-7 / angle);
- the frequencies' ratio to the table's `q[j]` says which: all 1 (rounding, positions off by
  one: rows shifted), the unscaled default of the same theta (the config's scaling missing: a
  repair), 1 outside the config's transition band only (its ramp computed differently: YaRN's
  correction range not rounded as transformers does, `truncate`), a geometric ratio (another
  rope_theta), a constant (another linear factor), anything else (another scaling variant).

Verdicts: `exact` (bit-equal), `placeholder` (all zeros: an exporter left the slot to fill),
`repair` (what the table replaces is a known exporter error or rounding, or a single row: plug
fixes it), `mismatch` (the model's caches do not look like this config at all: a wrong config,
refused by `posenc-client plug` without `--force`), `not_checkable` (the model holds no values
to compare: graph inputs, values computed from its inputs, an unknown pattern; the reason names
the node).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import onnx

from posenc_check.freq import FrequencyConstant, frequency_values
from posenc_check.graph import Array, read_tensor
from posenc_check.sites import (
    BakedCaches,
    Site,
    SiteLimitError,
    TableRequest,
    Unchecked,
    find_sites,
    table_request,
)

__all__ = [
    "NOT_CHECKABLE",
    "BakedCaches",
    "CacheReport",
    "SiteLimitError",
    "TableRequest",
    "baked_caches",
    "check_caches",
    "check_site",
    "departures",
    "outcome",
    "read_site",
    "verify_model",
    "verify_rope_caches",
]


class ExactTable(Protocol):
    """A served rope table: its canonical `spec` (transformers' field names: `rope_theta`,
    `rope_scaling`) and its tensors by name (`cos`, `sin` (P, d/2); `inv_freq` (d/2,))."""

    @property
    def spec(self) -> Mapping[str, Any]: ...

    def __getitem__(self, name: str, /) -> Array: ...


NOT_CHECKABLE = "not_checkable"
"""The verdict of a site whose values the model does not hold (`sites.Unchecked`)."""

ULP_REPAIR = 4
"""Departures of at most this many ulp are rounding (another op order or libm)."""
RATIO_TOLERANCE = 1e-4
"""Relative difference under which two frequencies are the same."""


@dataclass(frozen=True)
class CacheReport:
    """One cache of the model against the exact table.

    `name`: the cache the consumers read (an initializer, or an If output: then `side` is
    "short"/"long" for its else/then branch, else ""); `nodes`: the consumers reading it;
    `shape`/`dtype`: the model's cache; `rows`: rows compared (the model's, at most the
    table's); `max_abs`, `max_ulp`: largest error (ulp of the exact value in the model's dtype,
    taken at 1/2 for smaller values); `first`: first (row, column) that differs, None when
    bit-equal; `verdict`: exact, placeholder, repair or mismatch; `diagnosis`: the likely
    causes, most specific first (for `not_checkable`, why); `kind`: the site's ("cache",
    "gathered", "folded", "frequencies", or "" when not checkable: `posenc_check.sites`)."""

    name: str
    nodes: tuple[str, ...]
    side: str
    shape: tuple[int, ...]
    dtype: str
    rows: int
    max_abs: float
    max_ulp: int
    first: tuple[int, int] | None
    verdict: str
    diagnosis: tuple[str, ...] = field(default=())
    kind: str = "cache"

    def line(self) -> str:
        """A one-line summary for reports."""
        where = f"{self.name}{f' ({self.side})' if self.side else ''}"
        if self.verdict == NOT_CHECKABLE:
            return f"{where}: not checkable: " + "; ".join(self.diagnosis)
        if self.first is None:
            return f"{where}: exact ({self.rows} rows)"
        row, col = self.first
        return (
            f"{where}: {self.verdict}: max abs {self.max_abs:.3g}, {self.max_ulp} ulp, first "
            f"departs at row {row} column {col} ({self.rows} rows); " + "; ".join(self.diagnosis)
        )


def _ulps(model: Array, exact: Array) -> Array:
    """|model - exact| in ulp of the exact value in the model's dtype, of 1/2 for smaller values
    (trig tables cross zero, where ulp shrink to nothing: their scale is their amplitude)."""
    a = model.astype(np.float64)
    b = exact.astype(np.float64)
    floor = np.maximum(np.abs(b), 0.5).astype(model.dtype)
    spacing = np.spacing(floor) if model.dtype.kind == "f" else _bf16_spacing(floor)
    result: Array = np.abs(a - b) / spacing.astype(np.float64)
    return result


def _bf16_spacing(values: Array) -> Array:
    """ulp of bfloat16 values (8 significant bits): 2^(exponent - 7)."""
    _, exponent = np.frexp(values.astype(np.float64))
    result: Array = np.ldexp(1.0, exponent - 8)
    return result


def _frequencies(cos: Array, sin: Array) -> tuple[Array, float]:
    """Per-column angle per position of a (P, w) cache pair, and its amplitude A = cos[0, 0]."""
    amplitude = float(cos[0, 0])
    if cos.shape[0] < 2:
        return np.full(cos.shape[1], np.nan), amplitude
    first = np.arctan2(sin[1].astype(np.float64), cos[1].astype(np.float64))
    rows = np.clip(np.floor((np.pi / 2) / np.maximum(np.abs(first), 1e-30)), 1, cos.shape[0] - 1)
    rows = rows.astype(np.int64)
    columns = np.arange(cos.shape[1])
    angles = np.arctan2(
        sin[rows, columns].astype(np.float64), cos[rows, columns].astype(np.float64)
    )
    return angles / rows, amplitude


def _default_frequencies(tables: ExactTable, width: int) -> Array | None:
    """theta^(-2j/d) for the table's rope_theta (float64), d = 2 * width."""
    theta = tables.spec.get("rope_theta")
    if not isinstance(theta, (int, float)):
        return None
    return np.asarray(float(theta) ** (-np.arange(width) * 2.0 / (2 * width)))


def _diagnose(
    model: tuple[Array, Array], table: tuple[Array, Array], tables: ExactTable
) -> tuple[str, list[str]]:
    """(verdict, causes) for a cos/sin pair that is not bit-equal to the table."""
    (mcos, msin), (tcos, tsin) = model, table
    if mcos.shape[1] != tcos.shape[1]:
        return "mismatch", [
            f"wrong rotary width: the model's caches have {mcos.shape[1]} columns "
            f"(d = {2 * mcos.shape[1]}), the config's {tcos.shape[1]} (d = {2 * tcos.shape[1]})"
        ]
    rows = min(mcos.shape[0], tcos.shape[0])
    mcos, msin, tcos, tsin = mcos[:rows], msin[:rows], tcos[:rows], tsin[:rows]
    if mcos.dtype != tcos.dtype:
        low = tcos.astype(mcos.dtype)
        if np.array_equal(mcos, low) and np.array_equal(msin, tsin.astype(msin.dtype)):
            return "repair", [f"the exact table rounded to {mcos.dtype.name}"]
    if through := went_through(mcos, tcos):
        return "repair", [f"the exact table went through {through}: precision lost"]
    shift = 1e-5 + 4 * np.finfo(np.float32).eps
    for offset, text in ((1, "row p holds position p + 1"), (-1, "row p holds position p - 1")):
        a = mcos[: rows - 1] if offset == 1 else mcos[1:]
        b = tcos[1:] if offset == 1 else tcos[: rows - 1]
        if rows > 2 and float(np.max(np.abs(a - b.astype(a.dtype)))) < shift:
            return "repair", [f"positions off by one: {text}"]
    inv_m, amp_m = _frequencies(mcos, msin)
    inv_t, amp_t = _frequencies(tcos, tsin)
    return classify(inv_m, inv_t, amp_m, amp_t, tables)


def went_through(model: Array, exact: Array) -> str | None:
    """ "float16" or "bfloat16" when `model` is `exact` rounded through that dtype (and stored
    wider), else None."""
    import ml_dtypes

    for name, dtype in (("float16", np.dtype(np.float16)), ("bfloat16", ml_dtypes.bfloat16)):
        if model.dtype != dtype and np.array_equal(model, exact.astype(dtype).astype(model.dtype)):
            return name
    return None


def classify(
    inv_m: Array, inv_t: Array, amp_m: float, amp_t: float, tables: ExactTable
) -> tuple[str, list[str]]:
    """(verdict, causes) from the model's and the table's frequencies and amplitudes."""
    causes: list[str] = []
    if not np.isclose(amp_m, amp_t, rtol=1e-6, atol=0):
        causes.append(
            f"attention scaling differs: the model's cos[0] = {amp_m:.7g}, the config's "
            f"{amp_t:.7g} (mscale / attention_factor)"
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = inv_m / inv_t
    same = np.abs(ratio - 1) < RATIO_TOLERANCE
    rope_type = str((tables.spec.get("rope_scaling") or {}).get("rope_type", "default"))
    if same.all():
        if causes:
            return "repair", causes
        return "repair", ["the same frequencies: rounding of the angles or op order"]
    default = _default_frequencies(tables, len(inv_t))
    if default is not None:
        expected = default / inv_t
        if np.all(np.abs(ratio / expected - 1) < RATIO_TOLERANCE) and rope_type != "default":
            return "repair", [
                f"the config's {rope_type} scaling is missing: the model's caches are the "
                "unscaled RoPE of the same rope_theta",
                *causes,
            ]
        band = ~(np.abs(expected - 1) < RATIO_TOLERANCE)
        band &= ~(np.abs(expected - expected.max()) < RATIO_TOLERANCE * expected.max())
        near = np.convolve(band.astype(int), np.ones(3, int), mode="same") > 0
        differs = np.flatnonzero(~same)
        if rope_type != "default" and band.any() and near[differs].all():
            cols = f"{differs.min()}..{differs.max()}"
            what = (
                "YaRN rounding: the correction range is not floored/ceiled as transformers "
                "does (truncate=true)"
                if rope_type == "yarn"
                else f"the {rope_type} transition is computed differently"
            )
            return "repair", [f"{what}: frequencies differ in columns {cols} only", *causes]
    columns = np.arange(len(ratio))
    logs = np.log(np.abs(ratio))
    if len(ratio) > 2 and np.isfinite(logs).all():
        slope = float(np.dot(columns, logs) / np.dot(columns, columns))
        if np.max(np.abs(logs - slope * columns)) < 1e-3 and abs(slope) > 1e-6:
            theta = tables.spec.get("rope_theta")
            if isinstance(theta, (int, float)):
                # ratio = (theta / theta')^(2j/d): theta' = theta * exp(-slope * d / 2)
                other = float(theta) * float(np.exp(-slope * len(ratio)))
                causes.insert(0, f"wrong theta: the model's caches fit rope_theta ~ {other:.6g}")
                return "mismatch", causes
        if np.max(np.abs(logs - logs.mean())) < 1e-3:
            factor = float(np.exp(-logs.mean()))
            causes.insert(0, f"every frequency divided by {factor:.6g}: another linear factor")
            return "mismatch", causes
    top = int(np.argmax(np.abs(logs)))
    causes.insert(
        0,
        f"another scaling variant: frequencies differ in {int((~same).sum())} of {len(ratio)} "
        f"columns, up to x{float(ratio[top]):.4g} (column {top}); the config's is {rope_type}",
    )
    return "mismatch", causes


CHUNK_ROWS = 8192
"""Rows compared at a time: the float64 temporaries stay a few MiB whatever the table."""


def compare(model: Array, table: Array) -> tuple[int, float, int, tuple[int, int] | None]:
    """(rows compared, max abs, max ulp, first differing (row, column)) of one cache, in
    chunks of `CHUNK_ROWS` rows."""
    rows = min(model.shape[0], table.shape[0])
    if model.ndim != 2 or table.ndim != 2 or model.shape[1] != table.shape[1]:
        return rows, float("inf"), 0, (0, 0)
    first: tuple[int, int] | None = None
    max_abs, max_ulp = 0.0, 0.0
    for start in range(0, rows, CHUNK_ROWS):
        a = model[start : min(start + CHUNK_ROWS, rows)]
        b = table[start : start + len(a)].astype(a.dtype)
        differs = a != b
        if not differs.any():
            continue
        if first is None:
            row, col = np.argwhere(differs)[0]
            first = (start + int(row), int(col))
        error = np.abs(a.astype(np.float64) - b.astype(np.float64))
        max_abs = max(max_abs, float(error.max()))
        max_ulp = max(max_ulp, float(_ulps(a, b).max()))
    return rows, max_abs, int(np.ceil(max_ulp)), first


def baked_caches(model: onnx.ModelProto, nodes: Iterable[str] | None = None) -> list[BakedCaches]:
    """Every cos/sin cache pair of kind "cache" baked into `model`'s RoPE consumers (only
    `nodes`, when given), in graph order, reading no values (`sites.find_sites`)."""
    return [
        site
        for site in find_sites(model, nodes)
        if isinstance(site, BakedCaches) and site.kind == "cache"
    ]


def check_caches(
    caches: BakedCaches, values: tuple[Array, Array], tables: ExactTable
) -> list[CacheReport]:
    """The cos and the sin report of one baked pair (`values`: its cos and sin) against the
    exact table: compared (`compare`), then diagnosed (`_diagnose`) when they differ."""
    exact = (tables["cos"], tables["sin"])
    results = [compare(value, table) for value, table in zip(values, exact, strict=True)]
    worst = max(max_ulp for _, _, max_ulp, _ in results)
    if all(first is None for *_, first in results):
        verdict, causes = "exact", []
    elif not any(np.any(value) for value in values):
        verdict, causes = "placeholder", ["all zeros: a placeholder, no table to compare"]
    elif min(value.shape[0] for value in values) < 2:
        verdict, causes = "repair", ["one row only: too little to diagnose"]
    elif worst <= ULP_REPAIR and all(r[1] < 1e-3 for r in results):
        verdict = "repair"
        causes = [f"within {worst} ulp: another op order or libm (harmless)"]
    else:
        verdict, causes = _diagnose(values, exact, tables)
    return [
        CacheReport(
            name=name,
            nodes=caches.nodes,
            side=caches.side,
            shape=tuple(int(d) for d in value.shape),
            dtype=value.dtype.name,
            rows=rows,
            max_abs=max_abs,
            max_ulp=max_ulp,
            first=first,
            verdict=verdict if first is not None else "exact",
            diagnosis=tuple(causes) if first is not None else (),
            kind=caches.kind,
        )
        for name, value, (rows, max_abs, max_ulp, first) in zip(
            (caches.cos, caches.sin), values, results, strict=True
        )
    ]


def site_values(site: BakedCaches, data_dir: str | os.PathLike[str] | None) -> tuple[Array, Array]:
    """The half-width (P, d/2) cos and sin a site holds: its tensors read (`graph.read_tensor`),
    a folded (..., P, d) pair brought to (P, d/2) (its two halves must be equal: cat(c, c), or
    its columns equal in twos: repeat_interleave(c, 2)). ValueError when they are not two
    tables of one shape."""
    values = [read_tensor(t, data_dir) for t in (site.cos_tensor, site.sin_tensor)]
    if site.layout != "half":
        flat = [v.reshape(v.shape[-2], v.shape[-1]) for v in values]
        half = flat[0].shape[1] // 2
        if all(np.array_equal(v[:, :half], v[:, half:]) for v in flat):
            values = [v[:, :half] for v in flat]
        elif all(np.array_equal(v[:, 0::2], v[:, 1::2]) for v in flat):
            values = [v[:, 0::2] for v in flat]
        else:
            raise ValueError(
                f"the constants {site.cos!r}, {site.sin!r} {list(flat[0].shape)} are neither "
                "cat(c, c) nor repeat_interleave(c, 2) of a half-width table"
            )
    shapes = [tuple(int(d) for d in v.shape) for v in values]
    if any(len(s) != 2 or 0 in s for s in shapes) or shapes[0] != shapes[1]:
        raise ValueError(
            f"the caches {site.cos!r} {list(shapes[0])} and {site.sin!r} {list(shapes[1])} are "
            "not two (P, d/2) tables of one shape"
        )
    return values[0], values[1]


def check_frequencies(constant: FrequencyConstant, value: Array, tables: ExactTable) -> CacheReport:
    """One frequency constant's values (any shape holding d/2 values) against the table's
    `inv_freq`: compared as one row (`first` is (0, column)), diagnosed by `classify`."""
    value = value.reshape(1, -1)
    exact = np.asarray(tables["inv_freq"]).reshape(1, -1)
    rows, max_abs, max_ulp, first = compare(value, exact)
    if first is None:
        verdict, causes = "exact", []
    elif value.shape != exact.shape:
        verdict = "mismatch"
        causes = [
            f"wrong rotary width: {value.shape[1]} frequencies, the config's {exact.shape[1]}"
        ]
    elif max_ulp <= ULP_REPAIR:
        verdict, causes = "repair", [f"within {max_ulp} ulp: another op order or libm"]
    elif through := went_through(value, exact):
        verdict, causes = "repair", [f"the exact frequencies went through {through}"]
    else:
        inv_m = value[0].astype(np.float64)
        verdict, causes = classify(inv_m, exact[0].astype(np.float64), 1.0, 1.0, tables)
    return CacheReport(
        name=constant.node,
        nodes=(constant.cos, constant.sin),
        side="",
        shape=constant.shape,
        dtype="bool" if value.dtype == np.bool_ else value.dtype.name,
        rows=rows,
        max_abs=max_abs,
        max_ulp=max_ulp,
        first=first,
        verdict=verdict,
        diagnosis=tuple(causes),
        kind="frequencies",
    )


def not_checkable(name: str, nodes: Iterable[str], reason: str, side: str = "") -> CacheReport:
    """The report of a site that could not be compared, and why."""
    return CacheReport(
        name=name, nodes=tuple(nodes), side=side, shape=(), dtype="", rows=0, max_abs=0.0,
        max_ulp=0, first=None, verdict=NOT_CHECKABLE, diagnosis=(reason,), kind="",
    )  # fmt: skip


def read_site(
    model: onnx.ModelProto, site: Site, data_dir: str | os.PathLike[str] | None
) -> tuple[Array, ...] | CacheReport:
    """The values a site is compared with (cos and sin; or the frequencies), or its
    `not_checkable` report when it holds none or they cannot be read."""
    if isinstance(site, Unchecked):
        return not_checkable(site.name, site.nodes, site.reason)
    try:
        if isinstance(site, FrequencyConstant):
            return (frequency_values(model, site, data_dir),)
        return site_values(site, data_dir)
    except Exception as err:  # protobuf, numpy and the reference evaluator raise many kinds
        if isinstance(site, FrequencyConstant):
            return not_checkable(site.node, (site.cos, site.sin), str(err))
        return not_checkable(site.cos, site.nodes, f"cannot read its values: {err}", site.side)


def check_site(
    site: Site, values: tuple[Array, ...] | CacheReport, tables: ExactTable | None
) -> list[CacheReport]:
    """The reports of one site (`read_site`'s values) against `tables` (the exact table of its
    `sites.table_request`; None: not comparable, with the reason given by the caller)."""
    if isinstance(values, CacheReport):
        return [values]
    if tables is None or isinstance(site, Unchecked):
        raise ValueError("a site with values is compared with its table (tables_for)")
    if isinstance(site, FrequencyConstant):
        return [check_frequencies(site, values[0], tables)]
    return check_caches(site, (values[0], values[1]), tables)


def verify_model(
    model: onnx.ModelProto,
    tables_for: Callable[[TableRequest], ExactTable],
    *,
    data_dir: str | os.PathLike[str] | None = None,
    nodes: Iterable[str] | None = None,
) -> list[CacheReport]:
    """Every RoPE site of `model` (`sites.find_sites`: baked caches, gathered tables, folded
    cos/sin constants, LongRoPE's If branches, frequency constants, and the sites whose values
    the model does not hold) against the exact table `tables_for` gives for its
    `TableRequest`, changing nothing: one report per cache (cos, sin), per frequency constant,
    and per site that is `not_checkable` (with the reason). The verdict of the whole is
    `outcome(reports)`. Raises `sites.SiteLimitError` past the bounds."""
    reports: list[CacheReport] = []
    for site in find_sites(model, nodes):
        values = read_site(model, site, data_dir)
        tables = None
        if not isinstance(values, CacheReport) and not isinstance(site, Unchecked):
            tables = tables_for(table_request(site))
        reports.extend(check_site(site, values, tables))
    return reports


OUTCOMES = ("exact", "repair", "mismatch", NOT_CHECKABLE, "none")


def outcome(reports: Iterable[CacheReport], *, allow_unchecked: bool = False) -> str:
    """The verdict of a whole model from its reports: "mismatch" when one site does not look
    like the config, else "repair" when one departs (or is an all-zero placeholder) in a way
    plug repairs, else NOT_CHECKABLE when one site could not be checked (unless
    `allow_unchecked`) or none was, "none" when there are no sites at all, else "exact": every
    site checked and bit-equal."""
    verdicts = [report.verdict for report in reports]
    if not verdicts:
        return "none"
    if "mismatch" in verdicts:
        return "mismatch"
    if "repair" in verdicts or "placeholder" in verdicts:
        return "repair"
    checked = [v for v in verdicts if v != NOT_CHECKABLE]
    if not checked or (len(checked) < len(verdicts) and not allow_unchecked):
        return NOT_CHECKABLE
    return "exact"


def verify_rope_caches(
    model: onnx.ModelProto,
    tables: ExactTable,
    *,
    long_tables: ExactTable | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    nodes: Iterable[str] | None = None,
) -> list[CacheReport]:
    """Compare every cos/sin cache baked into `model`'s RoPE consumers (`baked_caches`) with
    `tables` (and, for the long branch of a LongRoPE `If`, `long_tables`), changing nothing.

    Args:
        model: the model, its weights possibly left in external data: only the caches' own
            bytes are read, from `data_dir` (`graph.read_tensor`).
        tables: the exact table for the model's config (half-width (P, d/2) `cos`/`sin`, at
            least the model's rows).
        long_tables: the table past a length switch (compared with the If's long branch).
        nodes: only these consumers.

    Returns two `CacheReport`s (cos, sin) per baked pair.
    """
    reports: list[CacheReport] = []
    for caches in baked_caches(model, nodes):
        side_tables = long_tables if caches.side == "long" else tables
        if side_tables is None:
            continue
        values = (
            read_tensor(caches.cos_tensor, data_dir),
            read_tensor(caches.sin_tensor, data_dir),
        )
        reports.extend(check_caches(caches, values, side_tables))
    return reports


def departures(model: Array, table: Array, rows: int = 256, columns: int = 256) -> Array:
    """Where a (P, w) cache departs from the exact (P', w) table: max |model - exact| over
    blocks of ceil(P/rows) positions by ceil(w/columns) columns, (ceil(P/block rows),
    ceil(w/block columns)) float64, comparing the first min(P, P') rows in chunks of
    `CHUNK_ROWS` (a map small enough to plot whatever the table)."""
    count = min(model.shape[0], table.shape[0])
    row_step = max(1, -(-count // rows))
    col_step = max(1, -(-model.shape[1] // columns))
    out = np.zeros((-(-count // row_step), -(-model.shape[1] // col_step)))
    chunk = row_step * max(1, CHUNK_ROWS // row_step)
    for start in range(0, count, chunk):
        stop = min(start + chunk, count)
        error = np.abs(model[start:stop].astype(np.float64) - table[start:stop].astype(np.float64))
        blocks = np.maximum.reduceat(
            np.maximum.reduceat(error, np.arange(0, stop - start, row_step), axis=0),
            np.arange(0, error.shape[1], col_step),
            axis=1,
        )
        out[start // row_step : start // row_step + blocks.shape[0]] = blocks
    return out
