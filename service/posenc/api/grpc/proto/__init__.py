"""Generated stubs of `inference.GRPCInferenceService` (`make grpc-stubs`; do not edit).

`grpc_service.proto` and `model_config.proto` are Triton's published protocol files, vendored
unchanged; the `*_pb2*` modules are what `tools/grpc_stubs.py` generates from them with
grpcio-tools, registered in a private descriptor pool (`_pool`).
"""
