"""posenc.api.grpc: the Open Inference Protocol over gRPC (`inference.GRPCInferenceService`).

`posenc serve --grpc-port N` (`POSENC_GRPC_PORT`) starts it beside the HTTP server, in the same
process and event loop (grpc.aio), from the app's lifespan: the same models, cache, limits, API
keys and metrics as `/v2`. `service` is the servicer and the server, `convert` the mapping of
protocol buffers to the `/v2` codec's types, `proto` the stubs generated from Triton's published
`.proto` files (`make grpc-stubs`).
"""

from posenc.api.grpc.service import GrpcServer, InferenceService

__all__ = ["GrpcServer", "InferenceService"]
