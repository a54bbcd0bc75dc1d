"""Baseline servers for bench/bench_serve.py, on the same HTTP stack as the service (uvicorn with
uvloop + httptools; the infer POST handled as plain ASGI in front of Starlette, as the service
does; orjson; the same OIP parser and encoder):

- ``naive``: the float torch model called once per request, in the request handler, no batching.
- ``floor``: a trivial endpoint that reads the body and returns a constant OIP response: the
  cost of the HTTP round trip alone. With ``--grpc-port`` the same process also answers the OIP
  v2 gRPC ModelInfer with a constant on the same uvloop, over the lean transport
  (offload/serve/grpc_server.py, ``offload serve``'s default), and with ``--grpcio-port`` over
  grpc.aio (the same transport options and grpc core settings as ``offload serve --grpc-server
  grpcio``), and with ``--h2-port`` over a connection of ``h2`` (python-hyper's HTTP/2 state
  machine, the library the lean transport does not use, answering the same constant): the cost of
  each gRPC round trip alone.

    python bench/_serve_baselines.py naive WEIGHTS.npz --port 8001
    python bench/_serve_baselines.py floor --port 8002 [--grpc-port 8003] [--grpcio-port 8004] [--h2-port 8005]
"""

from __future__ import annotations

import argparse

import numpy as np
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from offload.serve.oip import OipError, TensorSpec, encode_infer, parse_infer
from offload.serve.server import _uvicorn_config, grpc_core_env

INP, OUT = TensorSpec("x", 16), TensorSpec("y", 1)
META = orjson.dumps({"name": "risk", "versions": ["1"], "platform": "baseline", "inputs": [INP.metadata()], "outputs": [OUT.metadata()]})


def _meta(request: Request) -> Response:
    return Response(META, media_type="application/json")


def naive_app(weights: str):
    import torch

    from offload.examples.risk import train_float_model

    torch.set_num_threads(1)  # one row per call: threads only add hand-off cost
    model = train_float_model(np.zeros((1, 16), np.float32), np.zeros(1, np.float32), epochs=0)
    with np.load(weights, allow_pickle=False) as w:
        model.load_state_dict({k: torch.from_numpy(w[k]) for k in w.files})
    model.eval()

    def infer(body: bytes, header_length: str | None) -> tuple[int, bytes, dict[str, str]]:
        try:
            req = parse_infer(body, header_length, INP, OUT, 64)
        except OipError as e:
            return e.status, orjson.dumps({"error": e.message}), {"content-type": "application/json"}
        with torch.inference_mode():
            y = model(torch.from_numpy(req.x.astype(np.float32))).numpy()
        out, headers = encode_infer("risk", "1", req, y, OUT)
        return 200, out, headers

    return _app(infer)


def floor_app():
    const = orjson.dumps({"model_name": "risk", "model_version": "1", "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 1], "data": [0.5]}]})
    headers = {"content-type": "application/json"}
    return _app(lambda body, header_length: (200, const, headers))


def _app(infer):
    """Plain-ASGI POST /v2/models/risk/infer (body read as the service reads it), Starlette for the rest."""
    routed = Starlette(routes=[Route("/v2/models/risk", _meta)])

    async def app(scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/v2/models/risk/infer":
            await routed(scope, receive, send)
            return
        hl = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"inference-header-content-length"), None)
        chunks, more = [], True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        status, out, headers = infer(b"".join(chunks), hl)
        raw = [(b"content-length", str(len(out)).encode())] + [(k.encode(), v.encode()) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": out})

    return app


def _h2_floor(answer: bytes):
    """A protocol answering every gRPC request with ``answer`` on an ``h2`` connection, as lean
    as h2 allows (no header validation or normalisation, flow control acknowledged as read)."""
    import asyncio

    import h2.config
    import h2.connection
    import h2.events

    cfg = h2.config.H2Configuration(client_side=False, header_encoding=None, validate_outbound_headers=False, normalize_outbound_headers=False, validate_inbound_headers=False, normalize_inbound_headers=False)
    head = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    trailers = [(b"grpc-status", b"0")]

    class Floor(asyncio.Protocol):
        def connection_made(self, transport):
            self.t, self.c = transport, h2.connection.H2Connection(cfg)
            self.c.initiate_connection()
            transport.write(self.c.data_to_send())

        def data_received(self, data):
            for ev in self.c.receive_data(data):
                if isinstance(ev, h2.events.DataReceived):
                    self.c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded):
                    self.c.send_headers(ev.stream_id, head)
                    self.c.send_data(ev.stream_id, answer)
                    self.c.send_headers(ev.stream_id, trailers, end_stream=True)
            self.t.write(self.c.data_to_send())

    return Floor


def grpc_floor_methods():
    """``(methods, answer)``: the OIP v2 gRPC ModelInfer answering ``answer`` (a constant
    ModelInferResponse), for a gRPC server of offload's."""
    from offload.serve.grpc_server import Method
    from offload.serve.oip_grpc import SERVICE
    from offload.serve.proto import grpc_predict_v2_pb2 as pb

    const = pb.ModelInferResponse(model_name="risk", model_version="1", outputs=[pb.ModelInferResponse.InferOutputTensor(name="y", datatype="FP32", shape=[1, 1])], raw_output_contents=[np.float32(0.5).tobytes()])

    async def infer(request, call):
        return const

    return {f"/{SERVICE}/ModelInfer": Method(pb.ModelInferRequest, infer)}, const


async def _with_grpc_floors(server: uvicorn.Server, lean_port: int | None, grpcio_port: int | None, h2_port: int | None = None) -> None:
    from offload.serve.grpc_server import GrpcServer
    from offload.serve.http2 import Http2Limits
    from offload.serve.oip_grpc import SERVICE

    methods, const = grpc_floor_methods()
    servers = []
    if lean_port is not None:
        servers.append((GrpcServer(methods, Http2Limits(), max_rpcs=1024), lean_port))
    if grpcio_port is not None:
        from offload.serve.grpc_aio import AioServer

        servers.append((AioServer(SERVICE, methods, max_message_bytes=4 << 20, max_streams=128, max_rpcs=1024), grpcio_port))
    for g, port in servers:
        await g.start("127.0.0.1", port)
    h2_server = None
    if h2_port is not None:
        import asyncio

        out = const.SerializeToString()
        h2_server = await asyncio.get_running_loop().create_server(_h2_floor(b"\0" + len(out).to_bytes(4, "big") + out), "127.0.0.1", h2_port)
    try:
        await server.serve()
    finally:
        for g, _ in servers:
            await g.stop(1.0)
        if h2_server is not None:
            h2_server.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["naive", "floor"])
    ap.add_argument("weights", nargs="?")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, default=None, help="floor only: also a constant gRPC ModelInfer (lean transport)")
    ap.add_argument("--grpcio-port", type=int, default=None, help="floor only: also a constant gRPC ModelInfer on grpc.aio")
    ap.add_argument("--h2-port", type=int, default=None, help="floor only: also a constant gRPC ModelInfer on an h2 connection")
    a = ap.parse_args()
    app = naive_app(a.weights) if a.kind == "naive" else floor_app()
    server = uvicorn.Server(_uvicorn_config(app, "127.0.0.1", a.port, 5.0, "warning"))
    if a.grpc_port is None and a.grpcio_port is None and a.h2_port is None:
        server.run()
    else:
        import uvloop

        grpc_core_env()  # as serve() sets it for grpcio: the same grpc core I/O path as the service
        uvloop.run(_with_grpc_floors(server, a.grpc_port, a.grpcio_port, a.h2_port))


if __name__ == "__main__":
    main()
