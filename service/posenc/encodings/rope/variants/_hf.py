"""What a variant's `from_hf` reads: one rope parameter dict of a transformers config.json.

transformers 5 keeps a model's RoPE settings in `rope_parameters` (v4 configs: `rope_scaling` plus
top-level keys; `modeling_rope_utils.py`, `RotaryEmbeddingConfigMixin.standardize_rope_params`).
The `hf_config` package finds the dict of each layer type and the values that live outside it
(max_position_embeddings, the original length); each variant's `from_hf` turns the dict into its
`rope_scaling` wire dict and the notes a runtime needs beside the table, naming the config key of
anything it cannot map.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, TypeVar

from pydantic import BaseModel

from posenc.encodings.base import validate_as
from posenc.encodings.config_values import check_number, fail
from posenc.encodings.errors import ConfigError, FieldProblem, SpecError

_M = TypeVar("_M", bound=BaseModel)

HfMapping = tuple[dict[str, Any], dict[str, Any]]
"""(`rope_scaling` wire dict, notes) of one rope parameter dict."""


@dataclass(frozen=True)
class HfRopeParams:
    """One rope parameter dict and what surrounds it in the config.

    `key` is the dict's config path for errors (`rope_scaling`,
    `text_config.rope_parameters.full_attention`); `max_position_embeddings` the model's length
    (None when the config has none) at `max_position_embeddings_key`; `original_length()` the
    original context length as transformers' `standardize_rope_params` fills it in (top-level
    value, the dict's, the config class default, max_position_embeddings), failing when none is
    known: called only by the variants that use it, so the others never fail on it. `nested`:
    the dict is one of several in the model's rope parameters (per layer type or rope key), so
    a key transformers reads only at the top level of `config.rope_parameters` is never read
    from it (`_compute_yarn_parameters`' `truncate`).
    """

    params: Mapping[str, Any]
    key: str
    max_position_embeddings: int | None
    max_position_embeddings_key: str
    original_length: Callable[[], int]
    nested: bool = False

    def fail(self, name: str, message: str, value: Any = None) -> NoReturn:
        """Fail at `<key>.<name>`."""
        fail(f"{self.key}.{name}", message, value)

    def value(self, name: str) -> float:
        """`params[name]` as a float; absent or not a number fails."""
        return float(check_number(f"{self.key}.{name}", self.params.get(name)))

    def optional(self, name: str) -> float | None:
        """`params[name]` as a float, None when absent or null."""
        return None if self.params.get(name) is None else self.value(name)

    def factor(self) -> float:
        """The required `factor`."""
        factor = self.optional("factor")
        if factor is None:
            self.fail("factor", "required key missing", None)
        return factor

    def needs_max_position_embeddings(self, why: str) -> int:
        """max_position_embeddings, or a failure at its key saying `why` it is needed."""
        if self.max_position_embeddings is None:
            fail(self.max_position_embeddings_key, why, None)
        return self.max_position_embeddings

    def validated(self, model: type[_M], data: Mapping[str, Any]) -> _M:
        """`data` validated as `model` (notes need the parameters), naming config keys."""
        try:
            return validate_as(model, data, "rope_scaling")
        except SpecError as err:
            problems = [
                FieldProblem(
                    f"{self.key}.{p.field}" if p.field != "(spec)" else self.key, p.message, p.value
                )
                for p in err.problems
            ]
            raise ConfigError("cannot map config", problems) from None


class FromHfFn(Protocol):
    def __call__(self, p: HfRopeParams) -> HfMapping: ...
