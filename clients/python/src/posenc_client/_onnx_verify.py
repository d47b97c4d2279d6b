"""How far the position caches baked into a model are from the exact ones: `verify_rope_caches`
and `verify_inv_freq`, changing nothing.

Finding the caches, comparing and diagnosing them (the verdicts `exact`, `placeholder`, `repair`,
`mismatch` and their causes) are `posenc_check.verify`'s, whose docstring says how the cause is
read from the cache; the server's `POST /v1/check/onnx` (the explorer's check pane) runs the same
code. This module takes the model as the client does (path, bytes, ModelProto, OnnxModel; a path
is read without its external data, the caches' own bytes from its folder) and adds the frequency
constants that `torch.onnx.export` models compute RoPE from (`verify_inv_freq`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np

from posenc_check.verify import ULP_REPAIR, CacheReport, classify, compare, went_through
from posenc_check.verify import verify_rope_caches as _verify_rope_caches
from posenc_client._formats import dtype_name
from posenc_client._models import Tables
from posenc_client._onnx_patch import ModelLike, load_model

__all__ = ["CacheReport", "verify_inv_freq", "verify_rope_caches"]


def _data_dir(
    model: ModelLike, data_dir: str | os.PathLike[str] | None
) -> str | os.PathLike[str] | None:
    """Where external data is read: `data_dir`, else a path model's folder."""
    if data_dir is None and isinstance(model, (str, os.PathLike)):
        return os.path.dirname(os.fspath(model)) or "."
    return data_dir


def verify_inv_freq(
    model: ModelLike,
    tables: Tables,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    nodes: Iterable[str] | None = None,
) -> list[CacheReport]:
    """Compare every RoPE frequency constant of `model` (`find_frequency_constants`: RoPE
    computed in the graph, as `torch.onnx.export` leaves it: initializers, `Constant` nodes,
    values computed from constants) with the table's `inv_freq`, changing nothing; one
    `CacheReport` each (one row: `first` is (0, column)). `IncompatibleModelError` naming the
    node for frequencies that are not constant."""
    from posenc_client._onnx_freq import find_frequency_constants, frequency_values

    data_dir = _data_dir(model, data_dir)
    proto = load_model(model)
    wanted = set(nodes) if nodes is not None else None
    exact = np.asarray(tables["inv_freq"]).reshape(1, -1)
    reports = []
    for constant in find_frequency_constants(proto):
        if wanted is not None and constant.node not in wanted:
            continue
        folder = None if data_dir is None else os.fspath(data_dir)
        value = frequency_values(proto, constant, folder).reshape(1, -1)
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
        reports.append(
            CacheReport(
                name=constant.node,
                nodes=(constant.cos, constant.sin),
                side="",
                shape=constant.shape,
                dtype=dtype_name(value.dtype),
                rows=rows,
                max_abs=max_abs,
                max_ulp=max_ulp,
                first=first,
                verdict=verdict,
                diagnosis=tuple(causes),
            )
        )
    return reports


def verify_rope_caches(
    model: ModelLike,
    tables: Tables,
    *,
    long_tables: Tables | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    nodes: Iterable[str] | None = None,
) -> list[CacheReport]:
    """Compare every cos/sin cache baked into `model`'s RoPE consumers with `tables` (and, for
    the long branch of a LongRoPE `If`, `long_tables`), changing nothing
    (`posenc_check.verify.verify_rope_caches`).

    Args:
        model: the model (a path is read without its external data; only the caches' own bytes
            are read, from `data_dir`, default: the path's folder).
        tables: the served table for the model's config (half-width, `profile="ort_gqa"` or
            `"onnx"`), with at least the model's rows.
        long_tables: the table past a length switch (compared with the If's long branch).
        nodes: only these consumers.

    Returns one `CacheReport` per cache (graph-input caches have no values and are skipped).
    """
    return _verify_rope_caches(
        load_model(model),
        tables,
        long_tables=long_tables,
        data_dir=_data_dir(model, data_dir),
        nodes=nodes,
    )
