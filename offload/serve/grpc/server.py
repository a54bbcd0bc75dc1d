"""The OIP v2 gRPC service (``inference.GRPCInferenceService``, KServe's and Triton's) on grpc.aio,
on the event loop the REST routes run on, over the same data plane: REST and gRPC requests share
batches, limits, metrics and fail-over.

grpc core owns the wire (HTTP/2, HPACK, flow control, its own defences against rapid reset and
header floods); the settings below bound what one client can hold:

- ``grpc.max_receive_message_length`` = ``max_body_bytes`` (RESOURCE_EXHAUSTED before any handler);
- ``grpc.max_concurrent_streams`` = ``grpc_max_streams`` per connection. The service's slots are
  the batcher's queue (``max_queue_size``, UNAVAILABLE beyond, counted like every answer
  here); an RPC whose answer is computed but waits for its peer to read holds none. grpc's
  ``maximum_concurrent_rpcs`` is not set: it counted those RPCs too, so connections that never read
  could take every slot, and its refusals never reached a handler, so no metric saw them;
- ``grpc.max_metadata_size`` = ``max_head_bytes`` (request metadata, as REST's head cap);
- keepalive pings every 60 s (a dead peer is dropped after 20 s without an answer) and
  ``grpc.max_connection_age_ms`` with a grace of ``drain_timeout_s``: every connection, a stalled
  one included, ends within a bounded time, its RPCs answered or cut.

Requests are parsed here, not by grpc (the handlers take raw bytes), so a message that does not
parse is INVALID_ARGUMENT naming the message type, never UNKNOWN with a Python exception's text.

Example::

    listener = GrpcListener(plane, "127.0.0.1", 8001)
    await listener.start()          # offload serve does this in the REST app's lifespan
    await listener.stop()
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

import grpc
from google.protobuf.message import DecodeError

from offload.serve.auth import bearer_ok
from offload.serve.dataplane import DataPlane
from offload.serve.errors import ConfigError, InvalidRequest, ServeError, ShuttingDown, Unauthorized, grpc_answer
from offload.serve.grpc.codec import decode_infer, encode_infer
from offload.serve.proto import grpc_predict_v2_pb2 as pb

__all__ = ["GrpcListener", "SERVICE", "server_options"]

_log = logging.getLogger("offload.serve")

SERVICE = "inference.GRPCInferenceService"
_OPEN = ("ServerLive", "ServerReady")
_DEADLINE_SLACK_S = 0.01  # grpc core's timers fire on whole-millisecond ticks; 10 of them  # the REST health routes' counterparts: no key needed


def server_options(plane: DataPlane) -> list[tuple[str, Any]]:
    """The grpc core channel arguments of the service's listener (module docstring)."""
    cfg = plane.config
    return [
        ("grpc.max_receive_message_length", cfg.max_body_bytes),
        ("grpc.max_concurrent_streams", cfg.grpc_max_streams),
        # grpc core's default refuses (REFUSED_STREAM) streams past the limit while earlier ones
        # are still being freed, which fails a client's burst opened before it read the server's
        # SETTINGS; off, streams count as HTTP/2 counts them (RFC 9113 5.1.2).
        ("grpc.http.overload_protection", 0),
        ("grpc.max_metadata_size", cfg.max_head_bytes),
        ("grpc.absolute_max_metadata_size", cfg.max_head_bytes),
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.max_connection_age_ms", 600_000),
        ("grpc.max_connection_age_grace_ms", int(cfg.drain_timeout_s * 1000)),
        # grpc sets SO_REUSEPORT by default on Linux: a second server would share the port
        # silently (and get half the connections) instead of failing to start.
        ("grpc.so_reuseport", 0),
    ]


class _Servicer:
    """The OIP v2 methods of one data plane."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self._want = plane.config.api_key.encode() if plane.config.api_key else None
        meta = plane.model.metadata()
        tensors = lambda ts: [pb.ModelMetadataResponse.TensorMetadata(**t) for t in ts]  # noqa: E731
        self._model_meta = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"], inputs=tensors(meta["inputs"]), outputs=tensors(meta["outputs"]))
        self._counter = plane.metrics.grpc_responses
        self._counter.labels(code="OK")  # exported as 0 from the start

    def methods(self) -> dict[str, tuple[type, Callable[[Any], Awaitable[Any]]]]:
        p = self.plane
        return {
            "ServerLive": (pb.ServerLiveRequest, lambda r: _done(pb.ServerLiveResponse(live=True))),
            "ServerReady": (pb.ServerReadyRequest, lambda r: _done(pb.ServerReadyResponse(ready=p.ready()))),
            "ServerMetadata": (pb.ServerMetadataRequest, lambda r: _done(pb.ServerMetadataResponse(**p.server_metadata()))),
            "ModelReady": (pb.ModelReadyRequest, self._model_ready),
            "ModelMetadata": (pb.ModelMetadataRequest, self._model_metadata),
            "ModelInfer": (pb.ModelInferRequest, self._model_infer),
        }

    async def _model_ready(self, r: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        self.plane.check_model(r.name, r.version)
        return pb.ModelReadyResponse(ready=self.plane.ready())

    async def _model_metadata(self, r: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        self.plane.check_model(r.name, r.version)
        return self._model_meta

    async def _model_infer(self, r: pb.ModelInferRequest) -> pb.ModelInferResponse:
        p = self.plane
        p.check_model(r.model_name, r.model_version)
        req = decode_infer(r, p.model.input, p.model.output, p.config.max_batch_size)
        return encode_infer(await p.infer(req))

    def handler(self, name: str, request_type: type, fn: Callable[[Any], Awaitable[Any]]):
        guarded = self._want is not None and name not in _OPEN

        async def handle(wire: bytes, context: grpc.aio.ServicerContext):
            t0 = time.perf_counter()
            budget = context.time_remaining()  # None: the client set no deadline
            try:
                if guarded:
                    self._check_auth(context)
                if self.plane.draining and name not in _OPEN:
                    # grpc core cancels the calls it holds but has not handed out when the server
                    # stops; answering UNAVAILABLE (retry elsewhere) while draining leaves it none.
                    raise ShuttingDown("service is shutting down; retry on another replica")
                try:
                    request = request_type.FromString(wire)
                except DecodeError:
                    raise InvalidRequest(f"the request message does not parse as {request_type.DESCRIPTOR.full_name}") from None
                resp = await fn(request)
            except ServeError as e:
                code, _ = grpc_answer(e)
                self.plane.failed(e)
                self._count(code)
                await context.abort(grpc.StatusCode[code], str(e))
            except asyncio.CancelledError:
                # The client's deadline passed or it cancelled: grpc answers the status itself,
                # so it is counted here or never. Not an error of the service's. grpc core's timer
                # can cancel the handler a little before Python's clock reads the deadline as
                # passed, so the deadline counts as the reason once all but _DEADLINE_SLACK_S of it
                # has elapsed; a client that cancels earlier than that is CANCELLED.
                late = budget is not None and time.perf_counter() - t0 >= budget - _DEADLINE_SLACK_S
                self._count("DEADLINE_EXCEEDED" if late else "CANCELLED")
                raise
            finally:
                if name == "ModelInfer":
                    self.plane.metrics.request_duration.labels(model=self.plane.model.name).observe(time.perf_counter() - t0)
            self._count("OK")
            return resp

        return grpc.unary_unary_rpc_method_handler(handle, request_deserializer=None, response_serializer=lambda m: m.SerializeToString())

    def _check_auth(self, context: grpc.aio.ServicerContext) -> None:
        got = next((v for k, v in context.invocation_metadata() or () if k == "authorization"), "")
        if not bearer_ok(got.encode("latin-1", "replace"), self._want):
            raise Unauthorized(f"unauthorized: {'missing authorization metadata' if not got else 'invalid API key'}; send 'authorization: Bearer <key>'")

    def _count(self, code: str) -> None:
        self._counter.labels(code=code).inc()


async def _done(resp: Any) -> Any:
    return resp


class GrpcListener:
    """The gRPC listener of one data plane."""

    def __init__(self, plane: DataPlane, host: str, port: int) -> None:
        self.plane = plane
        self.host, self.port = host, port
        self._servicer = _Servicer(plane)
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        """Listens on ``host:port`` (``self.port`` becomes the bound port); :class:`ConfigError` when it cannot."""
        s = self._servicer
        handlers = {name: s.handler(name, t, fn) for name, (t, fn) in s.methods().items()}
        server = grpc.aio.server(options=server_options(self.plane))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        addr = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        try:
            bound = server.add_insecure_port(addr)
        except RuntimeError as e:  # grpcio raises where it once returned 0
            raise ConfigError(f"grpc_port={self.port}: cannot listen on {self.host} ({e})") from None
        await server.start()
        self._server, self.port = server, bound
        _log.info("gRPC (OIP v2) listening on %s:%d", self.host, bound)

    async def stop(self) -> None:
        """Refuses new RPCs and answers those in progress (within ``drain_timeout_s``)."""
        if self._server is not None:
            await self._server.stop(self.plane.config.drain_timeout_s)
            self._server = None
