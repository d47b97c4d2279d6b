"""How far the position tables a model holds are from the exact ones, changing nothing:
`verify_model` (every RoPE site, the verdict `posenc-client verify` and `POST /v1/check/onnx`
give), `verify_rope_caches` (the baked caches) and `verify_inv_freq` (frequency constants).

Finding the caches, comparing and diagnosing them (the verdicts `exact`, `placeholder`, `repair`,
`mismatch` and their causes) are `posenc_check.verify`'s, whose docstring says how the cause is
read from the cache; the server's `POST /v1/check/onnx` (the explorer's check pane) runs the same
code. This module takes the model as the client does (path, bytes, ModelProto, OnnxModel; a path
is read without its external data, the caches' own bytes from its folder) and adds the frequency
constants that `torch.onnx.export` models compute RoPE from (`verify_inv_freq`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from posenc_check.freq import find_frequency_constants, frequency_values
from posenc_check.sites import SiteLimitError, TableRequest
from posenc_check.verify import NOT_CHECKABLE, CacheReport, check_frequencies, outcome
from posenc_check.verify import verify_model as _verify_model
from posenc_check.verify import verify_rope_caches as _verify_rope_caches
from posenc_client._exceptions import IncompatibleModelError
from posenc_client._onnx_patch import ModelLike, load_model
from posenc_client._tables import Tables

__all__ = [
    "NOT_CHECKABLE",
    "CacheReport",
    "TableRequest",
    "outcome",
    "verify_inv_freq",
    "verify_model",
    "verify_rope_caches",
]


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
    `CacheReport` each (one row: `first` is (0, column); `posenc_check.verify.check_frequencies`).
    `IncompatibleModelError` naming the node for frequencies that are not constant."""
    data_dir = _data_dir(model, data_dir)
    proto = load_model(model)
    wanted = set(nodes) if nodes is not None else None
    reports = []
    for constant in find_frequency_constants(proto):
        if wanted is not None and constant.node not in wanted:
            continue
        try:
            value = frequency_values(proto, constant, data_dir)
        except ValueError as err:
            raise IncompatibleModelError(str(err)) from None
        reports.append(check_frequencies(constant, value, tables))
    return reports


def verify_model(
    model: ModelLike,
    tables_for: Callable[[TableRequest], Tables],
    *,
    data_dir: str | os.PathLike[str] | None = None,
    nodes: Iterable[str] | None = None,
) -> list[CacheReport]:
    """Every RoPE site of `model` against the exact tables, changing nothing
    (`posenc_check.verify.verify_model`): baked caches, tables gathered by position, folded
    cos/sin constants, LongRoPE's If branches, frequency constants, and one `not_checkable`
    report (with its reason) per site whose values the model does not hold. `tables_for` gives
    the table for a `TableRequest` (what `posenc-client verify` fetches for the model's
    config). The whole model's verdict is `outcome(reports)`. A model past the bounds
    (`posenc_check.sites.MAX_SITES`, a tensor read as both cos and sin) raises
    `IncompatibleModelError`."""
    try:
        return _verify_model(
            load_model(model), tables_for, data_dir=_data_dir(model, data_dir), nodes=nodes
        )
    except SiteLimitError as err:
        raise IncompatibleModelError(str(err)) from None


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
