"""The ``grpcio`` transport of the OIP v2 gRPC endpoint: the same methods
(:class:`~offload.serve.grpc_server.Method`) served by grpc.aio, grpc core's HTTP/2, on the event
loop uvicorn runs (``offload serve --grpc-server grpcio``).

grpc.aio is loop-agnostic: its completion-queue poller thread wakes the running loop through a
socket pair, so it works on uvloop as on asyncio's own loop. Measured per batch-1 RPC on 2 cores,
and not better: the thread-pool ``grpc.server`` handing each call to the loop
(run_coroutine_threadsafe or call_soon_threadsafe: +100-150 us, the hand-off), asyncio's own loop
instead of uvloop (within noise), grpclib (pure Python on h2: +100 us of server CPU), raw-bytes
handlers (protobuf parse and build are under 10 us of the RPC), and GRPC_POLL_STRATEGY. What
helped is one thread hop less inside grpc core: ``offload.serve.server.GRPC_EXPERIMENTS``.

Example::

    server = AioServer("inference.GRPCInferenceService", methods, max_message_bytes=4 << 20, max_streams=128, max_rpcs=1024)
    port = await server.start("127.0.0.1", 8001)
"""

from __future__ import annotations

from typing import Any

import grpc

from offload.serve.grpc_server import GrpcError, Method, answer_bytes

__all__ = ["AioServer", "TRANSPORT_OPTIONS"]

# The transport settings of every grpc.aio listener here, the service's and the benchmark floor's.
TRANSPORT_OPTIONS = (
    # grpc sets SO_REUSEPORT by default on Linux: a second server would share the port silently
    # (and get half the connections) instead of failing to start.
    ("grpc.so_reuseport", 0),
)
# Not set, though tried: grpc.http2.bdp_probe=0 (within noise: chttp2's BdpEstimator pings at
# most every 100 ms, doubling while the estimate is stable, so not per RPC) and
# grpc.optimization_target=latency (chttp2 already treats its default, "blend", as latency).


class _AioCall:
    """:class:`~offload.serve.grpc_server.Call` over a grpc.aio ServicerContext."""

    __slots__ = ("_context",)

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context

    def header(self, name: str) -> str | None:
        for k, v in self._context.invocation_metadata() or ():
            if k == name:
                return v
        return None

    def time_remaining(self) -> float | None:
        return self._context.time_remaining()


def _handler(method: Method):
    async def handle(request, context: grpc.aio.ServicerContext):
        try:
            return await method.handler(request, _AioCall(context))
        except GrpcError as e:
            await context.abort(grpc.StatusCode[e.code], e.message)

    return grpc.unary_unary_rpc_method_handler(handle, request_deserializer=method.request_type.FromString, response_serializer=answer_bytes)


class AioServer:
    """``methods`` (by path, all of ``service``) on a grpc.aio server."""

    def __init__(self, service: str, methods: dict[str, Method], *, max_message_bytes: int, max_streams: int, max_rpcs: int) -> None:
        prefix = f"/{service}/"
        if any(not p.startswith(prefix) for p in methods):
            raise ValueError(f"every method path must start with {prefix!r}")
        self._generic = grpc.method_handlers_generic_handler(service, {p[len(prefix) :]: _handler(m) for p, m in methods.items()})
        self._options = [("grpc.max_receive_message_length", max_message_bytes), ("grpc.max_concurrent_streams", max_streams), *TRANSPORT_OPTIONS]
        self._max_rpcs = max_rpcs
        self._server: Any = None

    async def start(self, host: str, port: int) -> int:
        """Listens on ``host:port``; returns the port. Raises ``OSError`` when it cannot."""
        server = grpc.aio.server(options=self._options, maximum_concurrent_rpcs=self._max_rpcs)
        server.add_generic_rpc_handlers((self._generic,))
        addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(addr)
        except RuntimeError as e:  # grpcio >= 1.5x raises where it once returned 0
            raise OSError(str(e)) from None
        if bound == 0:
            raise OSError(f"cannot bind {addr}")
        await server.start()
        self._server = server
        return bound

    async def stop(self, grace_s: float) -> None:
        """Refuses new RPCs and answers those in progress (up to ``grace_s``)."""
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
