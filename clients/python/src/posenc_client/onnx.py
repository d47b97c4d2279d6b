"""Plug served tables and subgraphs into ONNX models that cannot compute them.

Needs `onnx` (`pip install 'posenc-client[onnx]'`); importing `posenc_client` alone never imports
it. Every function takes a model as an `onnx.ModelProto`, serialized bytes, a path (read
without its external data) or an `OnnxModel`, never modifies it, and returns a new `ModelProto`
(write one with external data by `save_model`).

- `attach_rope_caches(model, tables)`: put served cos/sin caches in place of the cache inputs or
  initializers of every RoPE consumer: `com.microsoft.GroupQueryAttention` with `do_rotary=1`,
  the standard `RotaryEmbedding` (opset 23) and `com.microsoft.RotaryEmbedding`. What each
  consumer needs (onnx 1.23 / onnxruntime 1.31 schemas, checked before anything is written):

  | consumer                  | cos/sin inputs | shape            | also                          |
  |---------------------------|----------------|------------------|-------------------------------|
  | RotaryEmbedding-23        | 1, 2           | (P, d/2)         | position_ids given; dtype = X |
  | com.microsoft.RotaryEmb.  | 2, 3           | (P, d/2)         | dtype = input                 |
  | com.microsoft.GQA rotary  | 7, 8           | (P, d/2)         | d/2 a multiple of 8, d <=     |
  |                           |                |                  | head_size, head_size % 16 == 0|
  |                           |                |                  | dtype = query; P >= total len |

  d is the rotary dim: `rotary_embedding_dim`, else the head size. Half-width values are the
  same for both pairings, but a table fetched for interleaved pairs (GPT-J, DeepSeek) plugged into
  a half-split node means the config and the graph disagree: that is an error unless
  `check_pairing=False`.
  Caches inside the branches of an `If` on the length (onnxruntime-genai's LongRoPE) are
  filled on both sides: pass the table past the switch as `long_tables`.
- `attach_inv_freq(model, tables)`: RoPE computed inside the graph from frequencies
  (`torch.onnx.export`: dynamo keeps transformers' `inv_freq` buffer as an initializer,
  TorchScript and optimum fold it into a `Constant`; a chain over constants is evaluated): the
  served `inv_freq` replaces them (`find_frequency_constants`, `verify_inv_freq`).
- `attach_site_tables(model, tables_for)`: the RoPE sites a model stores as tables, not as a
  consumer's cache inputs (`table_sites`): a table its caches are gathered from by position
  (posenc's own `rope/rotary` graph in mode `table`) and full-width cos/sin constants a
  static-shape `torch.onnx.export` folded in; each stored tensor is rewritten with the exact
  values in its shape and dtype (`tables_for` as for `verify_model`).
- `verify_model(model, tables_for)`: every RoPE site of a model (baked caches, tables gathered
  by position, folded cos/sin constants, LongRoPE's If branches, frequency constants) against
  the exact tables, one outcome each, sites whose values the model does not hold reported
  `not_checkable` with the reason; `outcome(reports)` is the whole model's verdict (what
  `posenc-client verify` exits with). `verify_rope_caches(model, tables)`: the baked caches
  only: how far they are from the exact ones (max abs, ulp, first differing row and column)
  and the likely cause, changing nothing.
- `load_model(path)`, `save_model(model, path, data_dir=...)`: models with external data are
  read without their weights and written keeping the weights' files (see `_onnx_files`).
- `attach_alibi_bias(model, bias)`: merge the server's `alibi/bias` subgraph (from
  `Client.onnx(spec, graph="bias")`) so that its `bias` [1, H, Q, K] feeds an ONNX `Attention`
  `attn_mask` (input 3) or an onnxruntime `attention_bias` (`MultiHeadAttention` input 5,
  `GroupQueryAttention` input 10), replacing that graph input or filling the empty slot.
- `merge_subgraph(model, subgraph, io_map, prefix)`: `onnx.compose.merge_models` with the IR
  versions and the default-domain opsets aligned first (the subgraph is converted to the model's
  opset, never the other way round), the model's identity and outputs kept, and the subgraph's
  metadata kept under its prefix.

Errors are `IncompatibleModelError` (also a ValueError) naming the node, what it needs, what it
got and how to fetch the right table.

Each `attach_*` function runs one patcher through the same loop (`_onnx_patch.patch`): find the
nodes that can take the value, check every one (all problems reported at once), apply. The
patchers live in `_onnx_rope.py` and `_onnx_alibi.py`, `attach_site_tables` (no patcher: it
rewrites stored tensors in place) in `_onnx_sites.py`, `merge_subgraph` in `_onnx_merge.py`,
the file handling in `_onnx_files.py`, `verify_rope_caches` in `_onnx_verify.py`.
"""

from __future__ import annotations

try:
    import onnx  # noqa: F401  (only the check: the modules below import it)
except ImportError as err:  # pragma: no cover - exercised in the fresh-venv test
    raise ImportError("posenc_client.onnx needs onnx: pip install 'posenc-client[onnx]'") from err

from posenc_check.rope import LengthSwitch
from posenc_client._onnx_alibi import AlibiConsumer, attach_alibi_bias, find_alibi_consumers
from posenc_client._onnx_files import save_model
from posenc_client._onnx_freq import FrequencyConstant, attach_inv_freq, find_frequency_constants
from posenc_client._onnx_merge import merge_subgraph
from posenc_client._onnx_patch import load_model
from posenc_client._onnx_rope import RopeConsumer, attach_rope_caches, find_rope_consumers
from posenc_client._onnx_sites import attach_site_tables, table_sites
from posenc_client._onnx_verify import (
    CacheReport,
    TableRequest,
    outcome,
    verify_inv_freq,
    verify_model,
    verify_rope_caches,
)

__all__ = [
    "AlibiConsumer",
    "CacheReport",
    "FrequencyConstant",
    "LengthSwitch",
    "RopeConsumer",
    "TableRequest",
    "attach_alibi_bias",
    "attach_inv_freq",
    "attach_rope_caches",
    "attach_site_tables",
    "find_alibi_consumers",
    "find_frequency_constants",
    "find_rope_consumers",
    "load_model",
    "merge_subgraph",
    "outcome",
    "save_model",
    "table_sites",
    "verify_inv_freq",
    "verify_model",
    "verify_rope_caches",
]
