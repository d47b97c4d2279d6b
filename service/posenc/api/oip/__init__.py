"""posenc.api.oip: the Open Inference Protocol (KServe v2) with the binary tensor extension.

One model per family (`rope`, `alibi`, `sinusoidal`, `sinusoidal_2d`, `t5_bias`, `vision_rope`,
see `models`); the table spec comes in the request parameters (`spec` JSON or flat keys); inputs are
positions, outputs the rows for them, gathered from the service's cached tables or computed for
exactly those positions. `codec` is the wire format, `context` what the models need from the
service (cache, limits, readiness), `params` the request parameters. The HTTP surface is
`posenc.api.routes.oip`; the app builds each request's `OipContext` in `posenc.api.deps`.
"""

from posenc.api.oip.codec import OipError
from posenc.api.oip.context import OipContext
from posenc.api.oip.models import MODELS

EXTENSIONS = ("binary_tensor_data", "model_configuration", "parameters", "statistics")
"""The protocol extensions server metadata announces (HTTP `GET /v2`, gRPC ServerMetadata).
Not `model_repository`: its index answers, but a model is a table family, always loaded, and
load/unload are not served."""

__all__ = ["EXTENSIONS", "MODELS", "OipContext", "OipError"]
