"""The Open Inference Protocol v2 over gRPC (``inference.GRPCInferenceService``, the service KServe
specifies and Triton serves), beside the REST routes: one data plane, two protocols.

Both protocols end in :meth:`ScoringService.infer_rows`: the same input check, the same
:class:`~offload.serve.batcher.DynamicBatcher` and :class:`~offload.serve.faults.FailoverRunner`,
the same latency histogram and error counter. Errors come from the one table in
:mod:`offload.serve.errors` (its gRPC column); every response is counted in
``offload_grpc_responses_total{code}``.

The server is ``grpc.aio`` on the event loop uvicorn runs (uvloop): no second loop or thread hands
requests across, so a gRPC request reaches the batcher exactly as a REST one does and both
protocols' requests share batches. grpc.aio is loop-agnostic: its completion-queue poller thread
wakes the running loop through a socket pair, so it works on uvloop as on asyncio's own loop.
Measured per batch-1 RPC on 2 cores, and not better: the thread-pool ``grpc.server`` handing each
call to the loop (run_coroutine_threadsafe or call_soon_threadsafe: +100-150 us, the hand-off),
asyncio's own loop instead of uvloop (within noise), grpclib (pure Python on h2: +100 us of server
CPU), raw-bytes handlers (protobuf parse and build are under 10 us of the RPC), and
GRPC_POLL_STRATEGY. What helped is one thread hop less inside grpc core:
``offload.serve.server.GRPC_EXPERIMENTS``.

Limits: ``max_body_bytes`` is the largest request message (grpc core answers RESOURCE_EXHAUSTED
before any handler runs), ``grpc_max_streams`` the concurrent streams per connection (HTTP/2
SETTINGS_MAX_CONCURRENT_STREAMS), ``max_queue_size`` the RPCs in progress at once (beyond it grpc
answers RESOURCE_EXHAUSTED). With ``api_key`` set, every RPC but ServerLive/ServerReady (the REST
health routes' counterparts) needs metadata ``authorization: Bearer <key>``.

The port is off unless asked for (``offload serve --grpc-port N``; Triton's default is 8001): a
second listener is a second surface to guard, so it opens only when someone will use it.

Example::

    svc.grpc = GrpcEndpoint(svc, "127.0.0.1", 8001)   # started and stopped by the app's lifespan
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc
import numpy as np

from offload.serve.auth import bearer_ok
from offload.serve.errors import ConfigError, InvalidRequest, ServeError, Unauthorized, UnknownModel, grpc_answer
from offload.serve.oip import TensorSpec, check_shape
from offload.serve.proto import grpc_predict_v2_pb2 as pb
from offload.serve.proto import grpc_predict_v2_pb2_grpc as pb_grpc

__all__ = ["GrpcEndpoint", "parse_grpc_infer", "TRANSPORT_OPTIONS"]

_log = logging.getLogger("offload.serve")

# The transport settings of every gRPC listener here, the service's and the benchmark floor's.
TRANSPORT_OPTIONS = (
    # grpc sets SO_REUSEPORT by default on Linux: a second server would share the port silently
    # (and get half the connections) instead of failing to start.
    ("grpc.so_reuseport", 0),
)
# Not set, though tried: grpc.http2.bdp_probe=0 (within noise: chttp2's BdpEstimator pings at
# most every 100 ms, doubling while the estimate is stable, so not per RPC) and
# grpc.optimization_target=latency (chttp2 already treats its default, "blend", as latency).

# Typed-contents fields other than fp32_contents: filled in an FP32 request they mean a wrong datatype.
_OTHER_CONTENTS = ("bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents", "fp64_contents", "bytes_contents")


def parse_grpc_infer(req: pb.ModelInferRequest, inp: TensorSpec, out: TensorSpec, max_batch: int) -> tuple[np.ndarray, bool]:
    """The rows of a ModelInferRequest (float32, the FP32 values sent) and whether the
    input came as ``raw_input_contents`` (the answer then uses raw output contents too)."""
    if len(req.inputs) != 1:
        raise InvalidRequest(f"inputs: expected exactly 1 tensor named {inp.name!r}, got {len(req.inputs)}")
    t = req.inputs[0]
    if t.name != inp.name:
        raise InvalidRequest(f"inputs[0].name: unknown input {t.name!r}; the model's input is {inp.name!r}")
    if t.datatype != inp.datatype:
        raise InvalidRequest(f"inputs[0].datatype: {t.datatype!r} is not supported; expected {inp.datatype!r}")
    b, f = check_shape(list(t.shape), inp, max_batch)
    raw = req.raw_input_contents
    if raw:
        if len(raw) != 1:
            raise InvalidRequest(f"raw_input_contents: {len(raw)} entries for 1 input")
        if t.HasField("contents"):
            raise InvalidRequest("inputs[0]: has both contents and raw_input_contents")
        data = raw[0]
        if len(data) != b * f * 4:
            raise InvalidRequest(f"raw_input_contents[0]: {len(data)} bytes; shape [{b}, {f}] FP32 needs {b * f * 4}")
        x32 = np.frombuffer(data, dtype="<f4").reshape(b, f)
    else:
        c = t.contents
        for name in _OTHER_CONTENTS:
            if len(getattr(c, name)):
                raise InvalidRequest(f"inputs[0].contents.{name}: the input is FP32; send fp32_contents or raw_input_contents")
        if len(c.fp32_contents) != b * f:
            raise InvalidRequest(f"inputs[0].contents.fp32_contents: {len(c.fp32_contents)} values; shape [{b}, {f}] needs {b * f}")
        x32 = np.array(c.fp32_contents, dtype=np.float32).reshape(b, f)
    for i, o in enumerate(req.outputs):
        if o.name != out.name:
            raise InvalidRequest(f"outputs[{i}].name: unknown output {o.name!r}; the model's output is {out.name!r}")
    return x32, bool(raw)


class _Servicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, svc: Any) -> None:
        self.svc = svc
        m = svc.model
        self._name, self._version = m.name, m.version
        self._want = svc.config.api_key.encode() if svc.config.api_key else None
        self._hist = svc.metrics.request_duration.labels(model=m.name)
        self._codes: dict[str, Any] = {}
        meta = m.metadata()
        tensors = lambda ts: [pb.ModelMetadataResponse.TensorMetadata(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in ts]  # noqa: E731
        self._model_meta = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"], inputs=tensors(meta["inputs"]), outputs=tensors(meta["outputs"]))

    def _count(self, code: str) -> None:
        child = self._codes.get(code)
        if child is None:
            child = self._codes[code] = self.svc.metrics.grpc_responses.labels(code=code)
        child.inc()

    async def _fail(self, context: grpc.aio.ServicerContext, err: ServeError) -> None:
        code, kind = grpc_answer(err)
        self._count(code)
        self.svc.metrics.errors.labels(type=kind).inc()
        await context.abort(grpc.StatusCode[code], str(err))

    def _check_auth(self, context: grpc.aio.ServicerContext) -> None:
        if self._want is None:
            return
        got = ""
        for k, v in context.invocation_metadata() or ():
            if k == "authorization":  # gRPC metadata keys arrive lower-case (HTTP/2 header names)
                got = v
                break
        if not bearer_ok(got.encode("latin-1", "replace"), self._want):
            raise Unauthorized(f"unauthorized: {'missing authorization metadata' if not got else 'invalid API key'}; send 'authorization: Bearer <key>'")

    def _check_model(self, name: str, version: str) -> None:
        if name != self._name:
            raise UnknownModel(f"unknown model {name!r}; this server serves {self._name!r}")
        if version and version != self._version:
            raise UnknownModel(f"model {name!r} has no version {version!r}; versions: [{self._version!r}]")

    # -- RPCs -----------------------------------------------------------------------------------
    async def ServerLive(self, request, context):
        self._count("OK")
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        self._count("OK")
        return pb.ServerReadyResponse(ready=self.svc.is_ready())

    async def ModelReady(self, request, context):
        try:
            self._check_auth(context)
            self._check_model(request.name, request.version)
        except ServeError as e:
            await self._fail(context, e)
        self._count("OK")
        return pb.ModelReadyResponse(ready=self.svc.is_ready())

    async def ServerMetadata(self, request, context):
        from offload import __version__

        try:
            self._check_auth(context)
        except ServeError as e:
            await self._fail(context, e)
        self._count("OK")
        return pb.ServerMetadataResponse(name="offload", version=__version__, extensions=["binary_tensor_data"])

    async def ModelMetadata(self, request, context):
        try:
            self._check_auth(context)
            self._check_model(request.name, request.version)
        except ServeError as e:
            await self._fail(context, e)
        self._count("OK")
        return self._model_meta

    async def ModelInfer(self, request, context):
        t0 = time.perf_counter()
        svc = self.svc
        model = svc.model
        try:
            self._check_auth(context)
            self._check_model(request.model_name, request.model_version)
            x, raw = parse_grpc_infer(request, model.input, model.output, svc.config.max_batch_size)
            y = await svc.infer_rows(x)
        except ServeError as e:
            self._hist.observe(time.perf_counter() - t0)
            await self._fail(context, e)
        except asyncio.CancelledError:
            # grpc.aio cancels this task when the client's deadline passes or the client cancels
            # (aio/server.pyx.pxi, _handle_cancellation_from_core); grpc core answers the status
            # itself, so it is counted here or never. Not an offload_errors_total: the service
            # did not fail, the client stopped waiting (the batcher drops the abandoned rows).
            self._hist.observe(time.perf_counter() - t0)
            left = context.time_remaining()
            self._count("DEADLINE_EXCEEDED" if left is not None and left <= 0 else "CANCELLED")
            raise
        y32 = np.ascontiguousarray(y, dtype="<f4")
        out = pb.ModelInferResponse.InferOutputTensor(name=model.output.name, datatype="FP32", shape=y32.shape)
        if raw:
            resp = pb.ModelInferResponse(model_name=self._name, model_version=self._version, id=request.id, outputs=[out], raw_output_contents=[y32.tobytes()])
        else:
            out.contents.fp32_contents.extend(y32.ravel().tolist())
            resp = pb.ModelInferResponse(model_name=self._name, model_version=self._version, id=request.id, outputs=[out])
        self._hist.observe(time.perf_counter() - t0)
        self._count("OK")
        return resp


class GrpcEndpoint:
    """The gRPC listener of one :class:`~offload.serve.app.ScoringService`, on its event loop."""

    def __init__(self, svc: Any, host: str, port: int) -> None:
        self.svc = svc
        self.host, self.port = host, port
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        cfg = self.svc.config
        server = grpc.aio.server(
            options=[("grpc.max_receive_message_length", cfg.max_body_bytes), ("grpc.max_concurrent_streams", cfg.grpc_max_streams), *TRANSPORT_OPTIONS],
            maximum_concurrent_rpcs=cfg.max_queue_size,
        )
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(_Servicer(self.svc), server)
        host = f"[{self.host}]" if ":" in self.host else self.host
        try:
            bound = server.add_insecure_port(f"{host}:{self.port}")
        except RuntimeError as e:  # grpcio >= 1.5x raises where it once returned 0
            raise ConfigError(f"grpc_port={self.port}: cannot listen on {self.host} ({e})") from None
        if bound == 0:
            raise ConfigError(f"grpc_port={self.port}: cannot listen on {self.host}")
        self.port = bound
        await server.start()
        self._server = server
        _log.info("gRPC (OIP v2) listening on %s:%d", self.host, bound)

    async def stop(self, grace_s: float) -> None:
        """Refuses new RPCs and answers those in progress (up to ``grace_s``)."""
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
