"""posenc_check: reading the position caches baked into an ONNX model and saying how far they are
from the exact table, and why. One implementation, used by both sides:

- posenc-client (`posenc-client verify`, `posenc_client.onnx.verify_rope_caches`, and `plug`,
  which finds the same consumers and length switches to fill them);
- the server (`POST /v1/check/onnx`, the explorer's check pane at /ui),

so that all of them give the same outcome per site.

It ships in both distributions (the client's `src/` and, through the server's package list, the
server's) because neither may import the other: the client stays torch-free and the server never
imports the client. It needs numpy and onnx (ml_dtypes, an onnx dependency, for bfloat16) and
imports nothing of posenc or posenc_client (import-linter contract in pyproject.toml).

Modules: `graph` (node and tensor reading), `rope` (the nodes reading cos/sin caches, the `If`
length switches), `freq` (RoPE frequency constants computed into cos/sin in the graph), `sites`
(every RoPE site of a model, checkable or not, and the bounds), `verify` (comparison, diagnosis
and the one verdict model: `verify_model`, `outcome`). Importing this package imports none of
them (and so not onnx).
"""
