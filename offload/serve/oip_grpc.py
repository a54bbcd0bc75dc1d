"""The Open Inference Protocol v2 over gRPC (``inference.GRPCInferenceService``, the service KServe
specifies and Triton serves), beside the REST routes: one data plane, two protocols.

Both protocols end in :meth:`ScoringService.submit_rows`'s two steps: the same input check, the same
:class:`~offload.serve.batcher.DynamicBatcher` and :class:`~offload.serve.faults.FailoverRunner`,
the same latency histogram and error counter. Errors come from the one table in
:mod:`offload.serve.errors` (its gRPC column); every response is counted in
``offload_grpc_responses_total{code}``.

The methods here know nothing of the transport: :class:`OipGrpc` maps each RPC's path to a
:class:`~offload.serve.grpc_server.Method`, whose handler takes the request and a
:class:`~offload.serve.grpc_server.Call` and ends an error with
:class:`~offload.serve.grpc_server.GrpcError`. Two transports serve them on the event loop
uvicorn runs (so a gRPC request reaches the batcher exactly as a REST one does, and both
protocols' requests share batches):

- ``lean`` (the default): offload's own HTTP/2 (:mod:`offload.serve.http2`,
  :mod:`offload.serve.grpc_server`). On 2 cores a batch-1 RPC from ``tritonclient.grpc`` costs it
  about a third of grpc.aio's server CPU (BENCHMARKS.md), and puts gRPC at REST's latency.
- ``grpcio``: grpc.aio (:mod:`offload.serve.grpc_aio`), grpc core's HTTP/2, for sites that
  want Google's implementation on the wire.

Limits, the same on both: ``max_body_bytes`` is the largest request message (RESOURCE_EXHAUSTED
before any handler runs), ``grpc_max_streams`` the concurrent streams per connection (HTTP/2
SETTINGS_MAX_CONCURRENT_STREAMS), ``max_queue_size`` the RPCs in progress at once (beyond it
RESOURCE_EXHAUSTED). The lean transport also applies ``max_head_bytes``, ``header_timeout_s``,
``body_timeout_s`` and ``max_connections`` as REST does (SECURITY.md). With ``api_key`` set, every
RPC but ServerLive/ServerReady (the REST health routes' counterparts) needs metadata
``authorization: Bearer <key>``.

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

import numpy as np

from offload.serve.auth import bearer_ok
from offload.serve.errors import ConfigError, InvalidRequest, ServeError, Unauthorized, UnknownModel, grpc_answer
from offload.serve.grpc_server import Call, GrpcError, GrpcServer, Method
from offload.serve.http2 import Http2Limits
from offload.serve.httpguard import default_max_connections
from offload.serve.oip import TensorSpec, as_fp32, check_shape, fp32_finite, fp32_rows
from offload.serve.proto import grpc_predict_v2_pb2 as pb

__all__ = ["GrpcEndpoint", "OipGrpc", "parse_grpc_infer", "SERVICE"]

_log = logging.getLogger("offload.serve")

SERVICE = "inference.GRPCInferenceService"

# Typed-contents fields other than fp32_contents: filled in an FP32 request they mean a wrong datatype.
_OTHER_CONTENTS = ("bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents", "fp64_contents", "bytes_contents")


def parse_grpc_infer(req: pb.ModelInferRequest, inp: TensorSpec, out: TensorSpec, max_batch: int) -> tuple[np.ndarray, bool, bool]:
    """The rows of a ModelInferRequest (float32, the FP32 values sent); whether the input came
    as ``raw_input_contents`` (the answer then uses raw output contents too); and whether its
    values are proved finite (:func:`~offload.serve.oip.fp32_finite`, raw contents only)."""
    # A repeated field is read by index or slice, never iterated: upb's containers have no
    # iterator, so Python walks them by index until their item function raises a formatted
    # IndexError (protobuf 7.36 python/repeated.c, PyUpb_RepeatedContainer_Item), about a
    # microsecond a loop. A slice is one C call that makes the list. Each attribute read of a
    # message is a name lookup in upb: each is read once.
    inputs = req.inputs
    if len(inputs) != 1:
        raise InvalidRequest(f"inputs: expected exactly 1 tensor named {inp.name!r}, got {len(inputs)}")
    t = inputs[0]
    if t.name != inp.name:
        raise InvalidRequest(f"inputs[0].name: unknown input {t.name!r}; the model's input is {inp.name!r}")
    if t.datatype != inp.datatype:
        raise InvalidRequest(f"inputs[0].datatype: {t.datatype!r} is not supported; expected {inp.datatype!r}")
    b, f = check_shape(t.shape[:], inp, max_batch)
    raw = req.raw_input_contents
    if raw:
        if len(raw) != 1:
            raise InvalidRequest(f"raw_input_contents: {len(raw)} entries for 1 input")
        if t.HasField("contents"):
            raise InvalidRequest("inputs[0]: has both contents and raw_input_contents")
        data = raw[0]
        if len(data) != b * f * 4:
            raise InvalidRequest(f"raw_input_contents[0]: {len(data)} bytes; shape [{b}, {f}] FP32 needs {b * f * 4}")
        x32 = fp32_rows(data, b, f)
        finite = fp32_finite(data)
    else:
        c = t.contents
        for name in _OTHER_CONTENTS:
            if len(getattr(c, name)):
                raise InvalidRequest(f"inputs[0].contents.{name}: the input is FP32; send fp32_contents or raw_input_contents")
        values = c.fp32_contents
        if len(values) != b * f:
            raise InvalidRequest(f"inputs[0].contents.fp32_contents: {len(values)} values; shape [{b}, {f}] needs {b * f}")
        x32 = np.array(values[:], dtype=np.float32).reshape(b, f)
        finite = False
    outputs = req.outputs
    if outputs:
        for i, o in enumerate(outputs[:]):
            if o.name != out.name:
                raise InvalidRequest(f"outputs[{i}].name: unknown output {o.name!r}; the model's output is {out.name!r}")
    return x32, bool(raw), finite


class OipGrpc:
    """The OIP v2 gRPC methods of one :class:`~offload.serve.app.ScoringService`, for any transport.

    Example::

        methods = OipGrpc(svc).methods()   # {"/inference.GRPCInferenceService/ModelInfer": Method(...), ...}
    """

    def __init__(self, svc: Any) -> None:
        self.svc = svc
        m = svc.model
        self._name, self._version = m.name, m.version
        self._want = svc.config.api_key.encode() if svc.config.api_key else None
        self._hist = svc.metrics.request_duration.labels(model=m.name)
        self._codes: dict[str, Any] = {}
        self._heads: dict[int, bytes] = {}  # raw_answer's serialized fixed part, by batch size
        # The hot path's OK counter, added to directly (a LoopCounter child: a plain number);
        # exported as 0 from the start, as REST's 200s are.
        self._ok = self._codes["OK"] = svc.metrics.grpc_responses.labels(code="OK")
        meta = m.metadata()
        tensors = lambda ts: [pb.ModelMetadataResponse.TensorMetadata(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in ts]  # noqa: E731
        self._model_meta = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"], inputs=tensors(meta["inputs"]), outputs=tensors(meta["outputs"]))

    def methods(self) -> dict[str, Method]:
        """Every RPC this service answers, by path; the others are UNIMPLEMENTED."""
        return {
            f"/{SERVICE}/ServerLive": Method(pb.ServerLiveRequest, self.server_live),
            f"/{SERVICE}/ServerReady": Method(pb.ServerReadyRequest, self.server_ready),
            f"/{SERVICE}/ModelReady": Method(pb.ModelReadyRequest, self.model_ready),
            f"/{SERVICE}/ServerMetadata": Method(pb.ServerMetadataRequest, self.server_metadata),
            f"/{SERVICE}/ModelMetadata": Method(pb.ModelMetadataRequest, self.model_metadata),
            f"/{SERVICE}/ModelInfer": Method(pb.ModelInferRequest, self.model_infer),
        }

    def count(self, code: str) -> None:
        """``offload_grpc_responses_total{code}`` += 1 (labelled children cached: labels() locks)."""
        child = self._codes.get(code)
        if child is None:
            child = self._codes[code] = self.svc.metrics.grpc_responses.labels(code=code)
        child.inc()

    def refused(self, code: str) -> None:
        """A status the transport gave before any handler ran (unknown method, oversized or
        malformed message): counted as a response, and as an error of the matching type."""
        self.count(code)
        self.svc.metrics.errors.labels(type=_TRANSPORT_ERRORS.get(code, "bad_request")).inc()

    def _fail(self, err: ServeError) -> GrpcError:
        code, kind = grpc_answer(err)
        self.count(code)
        self.svc.metrics.errors.labels(type=kind).inc()
        return GrpcError(code, str(err))

    def _check_auth(self, call: Call) -> None:
        if self._want is None:
            return
        got = call.header("authorization") or ""  # gRPC metadata keys arrive lower-case (HTTP/2 header names)
        if not bearer_ok(got.encode("latin-1", "replace"), self._want):
            raise Unauthorized(f"unauthorized: {'missing authorization metadata' if not got else 'invalid API key'}; send 'authorization: Bearer <key>'")

    def _check_model(self, name: str, version: str) -> None:
        if name != self._name:
            raise UnknownModel(f"unknown model {name!r}; this server serves {self._name!r}")
        if version and version != self._version:
            raise UnknownModel(f"model {name!r} has no version {version!r}; versions: [{self._version!r}]")

    # -- RPCs -----------------------------------------------------------------------------------
    async def server_live(self, request, call: Call):
        self.count("OK")
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, request, call: Call):
        self.count("OK")
        return pb.ServerReadyResponse(ready=self.svc.is_ready())

    async def model_ready(self, request, call: Call):
        try:
            self._check_auth(call)
            self._check_model(request.name, request.version)
        except ServeError as e:
            raise self._fail(e) from None
        self.count("OK")
        return pb.ModelReadyResponse(ready=self.svc.is_ready())

    async def server_metadata(self, request, call: Call):
        from offload import __version__

        try:
            self._check_auth(call)
        except ServeError as e:
            raise self._fail(e) from None
        self.count("OK")
        return pb.ServerMetadataResponse(name="offload", version=__version__, extensions=["binary_tensor_data"])

    async def model_metadata(self, request, call: Call):
        try:
            self._check_auth(call)
            self._check_model(request.name, request.version)
        except ServeError as e:
            raise self._fail(e) from None
        self.count("OK")
        return self._model_meta

    async def model_infer(self, request, call: Call):
        t0 = time.perf_counter()
        svc = self.svc
        model = svc.model
        try:
            self._check_auth(call)
            self._check_model(request.model_name, request.model_version)
            x, raw, finite = parse_grpc_infer(request, model.input, model.output, svc.config.max_batch_size)
            # The batcher's awaitable awaited in this frame (each coroutine between the RPC and
            # its future is a frame on every resume, as on REST's hot path). The service has
            # started: its lifespan starts it before it opens the gRPC port (GrpcEndpoint.start).
            r = svc.submit_rows(x, finite)
            shared, off, n = r if type(r) is tuple else await r
        except ServeError as e:
            self._hist.observe(time.perf_counter() - t0)
            raise self._fail(e) from None
        except asyncio.CancelledError:
            # Cancelled when the client's deadline passes or the client cancels (grpc.aio:
            # aio/server.pyx.pxi, _handle_cancellation_from_core; the lean transport: a reset
            # stream or its own deadline timer); the transport answers the status, so it is
            # counted here or never. Not an offload_errors_total: the service did not fail, the
            # client stopped waiting (the batcher drops the abandoned rows).
            self._hist.observe(time.perf_counter() - t0)
            left = call.time_remaining()
            self.count("DEADLINE_EXCEEDED" if left is not None and left <= 0 else "CANCELLED")
            raise
        y = shared.y
        if n != y.shape[0]:  # its rows of a shared batch (a lone request's are the batch: no slice, a NumPy call)
            y = y[off : off + n]
        y32 = as_fp32(y)  # the runner's rows are C-ordered float32 already: no NumPy call
        if raw:
            resp: Any = self.raw_answer(request.id, y32)
        else:
            out = pb.ModelInferResponse.InferOutputTensor(name=model.output.name, datatype="FP32", shape=y32.shape)
            out.contents.fp32_contents.extend(y32.ravel().tolist())
            resp = pb.ModelInferResponse(model_name=self._name, model_version=self._version, id=request.id, outputs=[out])
        self._hist.observe(time.perf_counter() - t0)
        self._ok.value += 1
        return resp

    def raw_answer(self, request_id: str, y32: np.ndarray) -> bytes:
        """The wire bytes of the ModelInferResponse that answers ``y32`` (the [n, outputs] FP32
        rows) as raw output contents to request ``request_id``.

        Two serialized messages, concatenated: the parts that depend only on the batch size (model
        name and version, the output tensor's name, datatype and shape), serialized once per size,
        then the request's id and the rows. A parser merges concatenated messages into one, and
        fields may come in any order (protobuf's encoding guide, "Last One Wins" and "Field
        Order"), so every client reads the same message as from one serialization. Per request
        that is one small message instead of three, with their lists (upb: ~4.6 against ~1.8 us).

        Example::

            wire = oip.raw_answer("req-1", np.float32([[0.25]]))
            pb.ModelInferResponse.FromString(wire).raw_output_contents[0]   # b"\x00\x00\x80>"
        """
        n = y32.shape[0]
        head = self._heads.get(n)
        if head is None:  # at most one a batch size, up to max_batch_size
            out = pb.ModelInferResponse.InferOutputTensor(name=self.svc.model.output.name, datatype="FP32", shape=y32.shape)
            head = self._heads[n] = pb.ModelInferResponse(model_name=self._name, model_version=self._version, outputs=[out]).SerializeToString()
        return head + pb.ModelInferResponse(id=request_id, raw_output_contents=[y32.tobytes()]).SerializeToString()


# The error type (offload_errors_total{type}) of a status the transport gives by itself.
_TRANSPORT_ERRORS = {"RESOURCE_EXHAUSTED": "too_large", "UNIMPLEMENTED": "bad_request", "INTERNAL": "bad_request"}


class GrpcEndpoint:
    """The gRPC listener of one :class:`~offload.serve.app.ScoringService`, on its event loop,
    over the transport ``config.grpc_server`` names."""

    def __init__(self, svc: Any, host: str, port: int) -> None:
        self.svc = svc
        self.host, self.port = host, port
        self.oip = OipGrpc(svc)
        cfg = svc.config
        # The server (no socket yet): a GrpcServer or an AioServer, as config.grpc_server says.
        self.server: Any
        if cfg.grpc_server == "lean":
            limits = Http2Limits(
                max_streams=cfg.grpc_max_streams,
                max_header_bytes=cfg.max_head_bytes,
                max_body_bytes=cfg.max_body_bytes,
                header_timeout_s=cfg.header_timeout_s,
                body_timeout_s=cfg.body_timeout_s,
                max_connections=cfg.max_connections or default_max_connections(),
            )
            self.server = GrpcServer(self.oip.methods(), limits, max_rpcs=cfg.max_queue_size, on_status=self.oip.refused)
        else:
            from offload.serve.grpc_aio import AioServer  # imports grpc: only when asked for

            self.server = AioServer(SERVICE, self.oip.methods(), max_message_bytes=cfg.max_body_bytes, max_streams=cfg.grpc_max_streams, max_rpcs=cfg.max_queue_size)

    async def start(self) -> None:
        try:
            bound = await self.server.start(self.host, self.port)
        except OSError as e:
            raise ConfigError(f"grpc_port={self.port}: cannot listen on {self.host} ({e})") from None
        self.port = bound
        _log.info("gRPC (OIP v2, %s) listening on %s:%d", self.svc.config.grpc_server, self.host, bound)

    async def stop(self, grace_s: float) -> None:
        """Refuses new RPCs and answers those in progress (up to ``grace_s``); nothing for a
        server that is not listening (both kinds' ``stop`` check)."""
        await self.server.stop(grace_s)
