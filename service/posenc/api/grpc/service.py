"""`inference.GRPCInferenceService` on grpc.aio, in the HTTP server's process and event loop.

The servicer answers the Open Inference Protocol's calls from the same objects `/v2` uses: the
app's `AppState` (readiness, metrics, API keys), its `OipContext` (`posenc.api.deps.context_for`:
the cache, the table store, the limits) and the models (`posenc.api.oip.models`), so a table is
computed once whichever protocol asked for it.

| call                     | answer                                                      |
|--------------------------|-------------------------------------------------------------|
| ServerLive               | live: true while the process serves                         |
| ServerReady              | ready: warm and not draining (`/v2/health/ready`)           |
| ServerMetadata           | name, version, extensions (`GET /v2`)                       |
| ModelReady               | ready: known model (and version) and a ready server         |
| ModelMetadata            | `GET /v2/models/{model}`                                    |
| ModelConfig              | `GET /v2/models/{model}/config` as Triton's `ModelConfig`   |
| ModelInfer               | `POST /v2/models/{model}/infer`, outputs as raw bytes       |
| ModelStreamInfer         | ModelInfer per streamed request, in order; a failure is an  |
|                          | `error_message` on the stream, which stays open (Triton's)  |
| ModelStatistics          | `GET /v2/models[/{model}]/stats` (`posenc.api.oip.stats`):  |
|                          | one model's, or every model's for an empty name             |
| RepositoryIndex          | `POST /v2/repository/index`: every model, READY (or         |
|                          | UNAVAILABLE while warming up or draining)                   |
| the others (model load,  | UNIMPLEMENTED, without a traceback in the log               |
| shared memory, trace,    |                                                             |
| log settings)            |                                                             |

Errors carry the message `/v2` sends as `{"error": message}` (`posenc.api.oip.errors`) with the
status code of its HTTP status: 400 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 404 NOT_FOUND, 413
RESOURCE_EXHAUSTED, 503 UNAVAILABLE (with `retry-after` trailing metadata), 500 INTERNAL. A
request message over `max_infer_body_bytes` is refused by gRPC itself before it is read
(RESOURCE_EXHAUSTED, gRPC's message).

API keys (`POSENC_API_KEYS`) guard the model calls (ModelReady, ModelMetadata, ModelConfig,
ModelInfer, ModelStreamInfer, ModelStatistics, RepositoryIndex) as they guard `/v2/models` and
`/v2/repository`: the
`authorization` metadata must be `Bearer <key>` (the check `posenc.api.auth.bearer_verdict`,
constant time); health and server metadata stay open.
"""

from __future__ import annotations

import logging
import socket
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

import posenc
from posenc.api.auth import INVALID_MESSAGE, MISSING_MESSAGE, bearer_verdict
from posenc.api.deps import context_for
from posenc.api.grpc import convert
from posenc.api.grpc.proto import grpc_service_pb2 as pb
from posenc.api.grpc.proto import grpc_service_pb2_grpc as pb_grpc
from posenc.api.grpc.steps import answer as steps_answer
from posenc.api.grpc.steps import keep as steps_keep
from posenc.api.grpc.steps import step_key
from posenc.api.oip import EXTENSIONS
from posenc.api.oip.codec import OipError
from posenc.api.oip.errors import INTERNAL_MESSAGE, as_oip_error
from posenc.api.oip.models import MODELS, VERSION, find_model
from posenc.api.state import AppState, StartupError
from posenc.runtime import Lease, for_peer

log = logging.getLogger("posenc.api.grpc")

R = TypeVar("R")

STATUS_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
}
"""HTTP status of an `OipError` -> the gRPC status code sent for it."""

SERVICE_NAME = "inference.GRPCInferenceService"


def _version(value: str) -> str | None:
    return value or None


def peer_host(peer: str) -> str:
    """The address of a gRPC peer (`ipv4:127.0.0.1:5000`, `ipv6:%5B::1%5D:5000`) as HTTP's ASGI
    scope names a client (`127.0.0.1`, `::1`), so both protocols share a peer's budget."""
    _, _, address = urllib.parse.unquote(peer).partition(":")
    host = address.rsplit(":", 1)[0] if address.count(":") >= 1 else address
    return host.removeprefix("[").removesuffix("]") if host else peer


class CallError(Exception):
    """A call's outcome as a gRPC status: code, message and trailing metadata."""

    def __init__(
        self, code: grpc.StatusCode, message: str, trailers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailers = trailers


def failure(exc: Exception) -> CallError:
    """`exc` as the status sent (an unexpected exception is logged and sent as INTERNAL)."""
    if isinstance(exc, CallError):
        return exc
    error = as_oip_error(exc)
    if error is None:
        log.exception("unhandled error in the gRPC service", exc_info=exc)
        error = OipError(500, INTERNAL_MESSAGE)
    code = STATUS_CODES.get(error.status, grpc.StatusCode.UNKNOWN)
    trailers = tuple((k.lower(), v) for k, v in error.headers.items())
    return CallError(code, error.message, trailers)


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    """The servicer of `inference.GRPCInferenceService` for one app (its `AppState`)."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        self.keys = [k.get_secret_value().encode() for k in state.settings.api_keys]

    def _authorise(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if not self.keys:
            return
        value = next(
            (v for k, v in context.invocation_metadata() or () if k == "authorization"), None
        )
        raw = value.encode() if isinstance(value, str) else value
        verdict = bearer_verdict(raw, self.keys)
        if not verdict:
            message = MISSING_MESSAGE if verdict is None else INVALID_MESSAGE
            raise CallError(grpc.StatusCode.UNAUTHENTICATED, message)

    async def _call(
        self,
        method: str,
        context: grpc.aio.ServicerContext[Any, Any],
        fn: Callable[[], Awaitable[R]],
        protected: bool = False,
    ) -> R:
        """Run one unary call: the key check, `fn`, the failure as a status, the metrics."""
        start = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            if protected:
                self._authorise(context)
            return await fn()
        except Exception as exc:
            err = failure(exc)
            code = err.code
            if err.trailers:
                context.set_trailing_metadata(err.trailers)
            await context.abort(err.code, err.message)
            raise  # context.abort raises; this line keeps the type checker informed
        finally:
            self.state.metrics.observe_grpc(method, code.name, time.perf_counter() - start)

    async def ServerLive(  # noqa: N802 (the protocol's method names)
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ServerLiveResponse:
        async def run() -> pb.ServerLiveResponse:
            return pb.ServerLiveResponse(live=True)

        return await self._call("ServerLive", context, run)

    async def ServerReady(  # noqa: N802
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ServerReadyResponse:
        async def run() -> pb.ServerReadyResponse:
            return pb.ServerReadyResponse(ready=self.state.is_ready())

        return await self._call("ServerReady", context, run)

    async def ServerMetadata(  # noqa: N802
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ServerMetadataResponse:
        async def run() -> pb.ServerMetadataResponse:
            return pb.ServerMetadataResponse(
                name="posenc", version=posenc.__version__, extensions=list(EXTENSIONS)
            )

        return await self._call("ServerMetadata", context, run)

    async def ModelReady(  # noqa: N802
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ModelReadyResponse:
        async def run() -> pb.ModelReadyResponse:
            try:
                find_model(request.name, _version(request.version))
            except OipError:
                # like Triton: an unknown model is not ready (tritonclient.http says False too)
                return pb.ModelReadyResponse(ready=False)
            return pb.ModelReadyResponse(ready=self.state.is_ready())

        return await self._call("ModelReady", context, run, protected=True)

    async def ModelMetadata(  # noqa: N802
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ModelMetadataResponse:
        async def run() -> pb.ModelMetadataResponse:
            meta = find_model(request.name, _version(request.version)).metadata()
            return pb.ModelMetadataResponse(
                name=meta["name"],
                versions=meta["versions"],
                platform=meta["platform"],
                inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["inputs"]],
                outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["outputs"]],
            )

        return await self._call("ModelMetadata", context, run, protected=True)

    async def ModelConfig(  # noqa: N802
        self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ModelConfigResponse:
        async def run() -> pb.ModelConfigResponse:
            model = find_model(request.name, _version(request.version))
            config = model.config(context_for(self.state))
            return pb.ModelConfigResponse(config=convert.model_config(config))

        return await self._call("ModelConfig", context, run, protected=True)

    async def ModelStatistics(  # noqa: N802
        self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ModelStatisticsResponse:
        async def run() -> pb.ModelStatisticsResponse:
            stats = context_for(self.state, grpc=True).stats
            if request.name:
                names = [find_model(request.name, _version(request.version)).name]
            else:
                names = sorted(MODELS)
            return pb.ModelStatisticsResponse(
                model_stats=[convert.model_statistics(name, stats.get(name)) for name in names]
            )

        return await self._call("ModelStatistics", context, run, protected=True)

    async def RepositoryIndex(  # noqa: N802
        self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RepositoryIndexResponse:
        async def run() -> pb.RepositoryIndexResponse:
            ready = self.state.is_ready()
            if request.ready and not ready:
                return pb.RepositoryIndexResponse()
            state = "READY" if ready else "UNAVAILABLE"
            reason = "" if ready else "the server is warming up or draining"
            return pb.RepositoryIndexResponse(
                models=[
                    pb.RepositoryIndexResponse.ModelIndex(
                        name=name, version=VERSION, state=state, reason=reason
                    )
                    for name in sorted(MODELS)
                ]
            )

        return await self._call("RepositoryIndex", context, run, protected=True)

    async def _infer(
        self, request: pb.ModelInferRequest, peer: str, held: list[Lease], stream: bool = False
    ) -> bytes:
        """One inference, as `POST /v2/models/{model}/infer` runs it, answered as the bytes of
        its `ModelInferResponse` (of a `ModelStreamInferResponse` holding it when `stream`),
        built off the event loop (`convert.infer_response_bytes`; the two calls' responses go
        out unserialised, `register`); the in-flight charges of its outputs and their copies
        (`OipContext`) are appended to `held`, for the caller to release once the response is
        sent (on a failure they are released here); they count toward `peer`'s share of the
        budget (`runtime.for_peer`)."""
        model = find_model(request.model_name, _version(request.model_version))
        state = self.state
        cache = state.require_cache()  # 503 while starting or stopping, as `context_for`
        timer = state.stats.timer(model.name)
        steps = state.steps
        key = step_key(request) if steps.size else None
        if key is not None and steps:
            # a decode step whose shape was answered before (`grpc/steps.py`): a cache hit
            with for_peer(peer):
                templated = steps_answer(steps, cache, key, request, stream, timer)
            if templated is not None:
                name, response, leases = templated
                held.extend(leases)
                state.metrics.observe_infer(name, "hit")
                timer.succeeded("hit")
                return response
        service = context_for(state, grpc=True)
        with for_peer(peer):
            try:
                parsed = convert.infer_request(request)
                timer.mark("compute_input")
                try:
                    result = await model.infer(service, parsed)
                finally:
                    service.release_work()
                timer.mark("compute_infer")
                work = sum(t.numel() * t.element_size() for t in result.tensors.values())
                response = await service.offload(
                    lambda: convert.infer_response_bytes(
                        model.name, VERSION, parsed.id, result.tensors, result.parameters, stream
                    ),
                    work,
                )
                timer.mark("compute_output")
            except BaseException:
                service.release()
                timer.failed()
                raise
        charge = service.charged
        held.extend(service.take_held())
        source = str(result.parameters.get("posenc_source", ""))
        if service.observe is not None:
            service.observe(model.name, source)
        timer.succeeded(source)
        entry = service.entry
        if key is not None and result.rows_of is not None and entry is not None:
            (given,) = parsed.inputs.values()
            await steps_keep(
                steps,
                service.cache,
                key,
                request,
                given.tensor,
                entry,
                result.rows_of,
                model.name,
                VERSION,
                result.tensors,
                result.parameters,
                charge,
            )
        return response

    async def ModelInfer(  # noqa: N802
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes:
        held: list[Lease] = []

        def release(_: object = None) -> None:
            for lease in held:
                lease.release()

        # the response's charges are held until the call ends (its message sent, or the call
        # cancelled): gRPC serialises and sends the returned message after this returns
        context.add_done_callback(release)
        try:
            return await self._call(
                "ModelInfer",
                context,
                lambda: self._infer(request, peer_host(context.peer()), held),
                protected=True,
            )
        except BaseException:
            release()
            raise

    async def ModelStreamInfer(  # noqa: N802
        self,
        request_iterator: AsyncIterator[pb.ModelInferRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[bytes]:
        """Each request's response (or its failure as `error_message`) in request order."""

        async def opened() -> None:
            return None

        # the key check (and its metric) once per stream; then each request's outcome
        await self._call("ModelStreamInfer", context, opened, protected=True)
        peer = peer_host(context.peer())
        async for request in request_iterator:
            start = time.perf_counter()
            held: list[Lease] = []
            try:
                response = await self._infer(request, peer, held, stream=True)
            except Exception as exc:
                err = failure(exc)
                self.state.metrics.observe_grpc(
                    "ModelStreamInfer/request", err.code.name, time.perf_counter() - start
                )
                yield pb.ModelStreamInferResponse(
                    error_message=err.message,
                    infer_response=pb.ModelInferResponse(
                        model_name=request.model_name,
                        model_version=request.model_version,
                        id=request.id,
                    ),
                ).SerializeToString()
                continue
            self.state.metrics.observe_grpc(
                "ModelStreamInfer/request", "OK", time.perf_counter() - start
            )
            try:
                # resumed once gRPC has taken the message: its charges are released then
                yield response
            finally:
                del response
                for lease in held:
                    lease.release()


UNIMPLEMENTED = (
    "RepositoryModelLoad",
    "RepositoryModelUnload",
    "SystemSharedMemoryStatus",
    "SystemSharedMemoryRegister",
    "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus",
    "CudaSharedMemoryRegister",
    "CudaSharedMemoryUnregister",
    "TraceSetting",
    "LogSettings",
)
"""The protocol's calls posenc does not serve: answered UNIMPLEMENTED by `_unimplemented`."""


def _unimplemented(name: str) -> Callable[..., Awaitable[Any]]:
    """A handler answering UNIMPLEMENTED quietly: the generated servicer's default raises
    NotImplementedError, which grpc.aio logs with a full traceback on every call (a log flood
    anyone could cause without a key)."""

    async def handler(
        self: InferenceService, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        self.state.metrics.observe_grpc(name, grpc.StatusCode.UNIMPLEMENTED.name, 0.0)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"posenc does not implement {name}")

    handler.__name__ = name
    return handler


for _name in UNIMPLEMENTED:
    setattr(InferenceService, _name, _unimplemented(_name))


SERIALISED = ("ModelInfer", "ModelStreamInfer")
"""The calls whose handlers return their responses serialised (`InferenceService._infer`)."""


class _Handlers:
    """Takes the method handlers the generated `add_..._to_server` registers."""

    handlers: dict[str, grpc.RpcMethodHandler]

    def add_generic_rpc_handlers(self, _: object) -> None:
        pass

    def add_registered_method_handlers(
        self, _: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self.handlers = dict(handlers)


def register(servicer: InferenceService, server: grpc.aio.Server) -> None:
    """Serve `servicer` on `server` as the generated `add_GRPCInferenceServiceServicer_to_server`
    does, except that `SERIALISED` calls send their handlers' bytes as they are (no response
    serializer): grpc.aio serialises a returned message on the event loop, where protobuf holds
    the interpreter lock for the whole copy (hundreds of milliseconds for a large answer)."""
    taken = _Handlers()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, taken)  # type: ignore[no-untyped-call]
    handlers = taken.handlers
    for name in SERIALISED:
        handlers[name] = handlers[name]._replace(response_serializer=None)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _bind_refused(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on, as asyncio says it for uvicorn's port; None when a
    socket binds it (with SO_REUSEADDR, as grpc core and uvicorn bind theirs). Port 0 always
    binds."""
    if port == 0:
        return None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return None  # grpc resolves the name itself and says what fails
    family, kind, proto, _, where = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(where)
        except OSError as exc:
            reason = (exc.strerror or str(exc)).lower()
            where_said = f"error while attempting to bind on address {(host, port)!r}"
            return f"[Errno {exc.errno}] {where_said}: {reason}"
    return None


class GrpcServer:
    """The grpc.aio server of one app: started and stopped by the app's lifespan."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        self.server: grpc.aio.Server | None = None

    def _server(self) -> grpc.aio.Server:
        settings = self.state.settings
        server = grpc.aio.server(
            options=[
                # the infer body cap of HTTP, checked by gRPC on the message's length prefix
                # before the message is read
                ("grpc.max_receive_message_length", settings.max_infer_body_bytes),
                ("grpc.max_send_message_length", -1),
                # a port in use is an error, never a second listener sharing it
                ("grpc.so_reuseport", 0),
                # connections: at most grpc_max_connections open (grpc core closes one more at
                # once), the TLS/HTTP/2 handshake within the HTTP header timeout, a connection
                # without calls closed after grpc_idle_timeout_seconds, and at most
                # grpc_max_concurrent_streams calls at once on one connection
                ("grpc.max_allowed_incoming_connections", settings.grpc_max_connections),
                ("grpc.server_handshake_timeout_ms", _ms(settings.header_timeout_seconds)),
                ("grpc.max_connection_idle_ms", _ms(settings.grpc_idle_timeout_seconds)),
                ("grpc.max_concurrent_streams", settings.grpc_max_concurrent_streams),
            ]
        )
        register(InferenceService(self.state), server)
        return server

    async def start(self, host: str, port: int) -> int:
        """Listen on `host:port` (0: a free port) and serve; returns the bound port.

        Raises `StartupError` when the port cannot be bound, in the words uvicorn uses for its
        own port (`[Errno 98] error while attempting to bind on address ('127.0.0.1', 8001):
        address already in use`): the address is tried first with a plain socket, which tells
        why, before grpc core (which says only "Failed to bind", and logs a line of its own).
        The grpc server is made only once the port is free: one made and never started fails an
        assertion in its `__dealloc__` at exit (a traceback, and the process died of SIGSEGV)."""
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        refused = _bind_refused(host, port)
        if refused is not None:
            raise StartupError(f"gRPC: {refused}")
        self.server = self._server()
        try:
            bound: int = self.server.add_insecure_port(address)
        except RuntimeError as exc:  # lost a race for the port, or a reason the probe missed
            raise StartupError(f"gRPC: {exc}") from None
        await self.server.start()
        log.info("gRPC (%s) on %s:%d", SERVICE_NAME, host, bound)
        return bound

    async def stop(self, grace: float) -> None:
        """Refuse new calls and give those in flight up to `grace` seconds."""
        if self.server is not None:
            await self.server.stop(grace)
