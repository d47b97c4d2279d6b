"""posenc.api.oip: the Open Inference Protocol (KServe v2) with the binary tensor extension.

One model per family (`rope`, `alibi`, `sinusoidal`, `sinusoidal_2d`, `t5_bias`, see
`models`); the table spec comes in the request parameters (`spec` JSON or flat keys); inputs are
positions, outputs the rows for them, gathered from the service's cached tables or computed for
exactly those positions. `codec` is the wire format, `routes` the HTTP surface, `context` what the
models need from the service (cache, limits, readiness).
"""

from posenc.api.oip.codec import OipError
from posenc.api.oip.context import OipContext
from posenc.api.oip.models import MODELS
from posenc.api.oip.routes import build_router, error_response
from posenc.api.oip.service import app_context

__all__ = ["MODELS", "OipContext", "OipError", "app_context", "build_router", "error_response"]
