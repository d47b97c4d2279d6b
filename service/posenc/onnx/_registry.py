"""The exporter registry: one `GraphExporter` per (kind, graph name).

An exporter declares the modes, ops, input styles and roles it supports (the first mode, op and
input style is the default; a role has none and must be given), builds its graph into a `Graph`,
and supplies the `Sample`s that `verify` runs through onnxruntime: inputs and the outputs the
encodings core (or, for CoPE, the torch reference `posenc.encodings.cope`) computes for them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch

from posenc.encodings import FieldProblem, SpecBase
from posenc.encodings.tolerances import ATOL as ATOL  # re-exported for the graphs
from posenc.onnx._graph import Graph
from posenc.onnx._options import ExportOptions, InputStyle, Mode, Op, Role


@dataclass(frozen=True)
class Sample:
    """One verification run: `feeds` in, `expected` out (torch tensors from the encodings core),
    compared elementwise within `atol` (0: bit-identical); non-finite values must match exactly.
    """

    feeds: dict[str, torch.Tensor]
    expected: dict[str, torch.Tensor]
    atol: float = 0.0
    label: str = ""


class GraphExporter(ABC):
    """Builds one graph for one family. Subclasses set the class attributes and implement `build`
    and `samples`; `problems` rejects option/spec combinations the graph cannot serve."""

    kind: ClassVar[str]
    graph: ClassVar[str]
    summary: ClassVar[str]
    modes: ClassVar[tuple[Mode, ...]]
    ops: ClassVar[tuple[Op, ...]] = ()
    input_styles: ClassVar[tuple[InputStyle, ...]] = ()
    roles: ClassVar[tuple[Role, ...]] = ()
    takes_num_heads: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return f"{self.kind}/{self.graph}"

    def normalize(self, spec: Any) -> SpecBase:
        """The canonical spec with the fields this graph does not read reset, so that specs giving
        the same graph share one canonical form (and export key)."""
        result: SpecBase = spec
        return result

    def styles(self, mode: str) -> tuple[InputStyle, ...]:
        """The input styles `mode` takes (default: all of `input_styles`; a mode whose graph has
        no position inputs returns none, so `inputs` is neither defaulted nor accepted)."""
        return self.input_styles

    def problems(self, spec: Any, options: ExportOptions) -> list[FieldProblem]:
        """Why `spec` with the resolved `options` cannot be exported (empty when it can)."""
        return []

    @abstractmethod
    def build(self, g: Graph, spec: Any, options: ExportOptions) -> dict[str, Any]:
        """Declare inputs, add nodes, declare outputs; return the notes for `metadata_props`."""

    @abstractmethod
    def samples(self, spec: Any, options: ExportOptions) -> list[Sample]:
        """Inputs and core-computed expected outputs for `verify`."""

    def describe(self) -> dict[str, Any]:
        """What the exporter supports, for listings."""
        return {
            "kind": self.kind,
            "graph": self.graph,
            "summary": self.summary,
            "modes": list(self.modes),
            "ops": list(self.ops),
            "inputs": list(self.input_styles),
            "roles": list(self.roles),
            "num_heads": self.takes_num_heads,
        }


EXPORTERS: dict[tuple[str, str], GraphExporter] = {}

_E = TypeVar("_E", bound=GraphExporter)


def register_exporter(cls: type[_E]) -> type[_E]:
    """Class decorator registering one instance under (kind, graph); a second one raises."""
    key = (cls.kind, cls.graph)
    if key in EXPORTERS:
        raise ValueError(f"exporter {cls.kind}/{cls.graph} is already registered")
    EXPORTERS[key] = cls()
    return cls


def graphs_for(kind: str) -> list[str]:
    """The graph names registered for `kind`, in registration order (the first is the default)."""
    return [graph for k, graph in EXPORTERS if k == kind]
