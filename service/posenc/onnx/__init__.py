"""posenc.onnx: every position table as a small, verified ONNX subgraph.

Public API:
- `export(spec, graph, *, opset, mode, op, num_heads, inputs, role) -> onnx.ModelProto`
- `verify(model, spec) -> Verification`: checker, shape inference, one onnxruntime run against
  the torch tables of `posenc.encodings`; raises `ExportError` (error_type "export").
- `EXPORTERS`: (kind, graph) -> `GraphExporter`, what each graph supports.
- `CopeSpec`, `ONNX_SPECS`, `parse_export_spec(data)`: graph-only kinds (CoPE has no table, so it
  is no family of `posenc.encodings`) and a `parse_spec` that knows them too.
- `resolve(spec, options)`, `export_key(spec, options)`: canonical requests and their cache key.
- `ort_session(model)`, `ort_run(session, feeds)`: onnxruntime CPU with torch tensors in and out
  (bfloat16 included, which onnxruntime's numpy interface cannot carry).
"""

from posenc.onnx import graphs
from posenc.onnx._errors import ExportError, UnsupportedExportError
from posenc.onnx._export import (
    Resolved,
    Verification,
    build,
    export,
    metadata,
    model_summary,
    options_from,
    resolve,
    verify,
)
from posenc.onnx._options import (
    DEFAULT_OPSET,
    EXPORT_FORMAT_VERSION,
    IR_VERSIONS,
    OPSETS,
    ExportOptions,
    export_key,
)
from posenc.onnx._ort import run as ort_run
from posenc.onnx._ort import session as ort_session
from posenc.onnx._registry import (
    ATOL,
    EXPORTERS,
    GraphExporter,
    Sample,
    graphs_for,
    register_exporter,
)
from posenc.onnx._specs import ONNX_SPECS, CopeSpec, parse_export_spec

__all__ = [
    "ATOL",
    "DEFAULT_OPSET",
    "EXPORTERS",
    "EXPORT_FORMAT_VERSION",
    "IR_VERSIONS",
    "ONNX_SPECS",
    "OPSETS",
    "CopeSpec",
    "ExportError",
    "ExportOptions",
    "GraphExporter",
    "Resolved",
    "Sample",
    "UnsupportedExportError",
    "Verification",
    "build",
    "export",
    "export_key",
    "graphs",
    "graphs_for",
    "metadata",
    "model_summary",
    "options_from",
    "ort_run",
    "ort_session",
    "parse_export_spec",
    "register_exporter",
    "resolve",
    "verify",
]
