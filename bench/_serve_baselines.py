"""Baseline servers for bench/bench_serve.py, on the same HTTP stack as the service (uvicorn with
uvloop + httptools; the infer POST handled as plain ASGI in front of Starlette, as the service
does; orjson; the same OIP parser and encoder):

- ``naive``: the float torch model called once per request, in the request handler, no batching.
- ``floor``: a trivial endpoint that reads the body and returns a constant OIP response: the
  cost of the HTTP round trip alone. With ``--grpc-port`` the same process also answers the OIP
  v2 gRPC ModelInfer with a constant on the same uvloop, over the lean transport
  (offload/serve/grpc_server.py, ``offload serve``'s default), and with ``--grpcio-port`` over
  grpc.aio (the same transport options and grpc core settings as ``offload serve --grpc-server
  grpcio``): the cost of each gRPC round trip alone.

    python bench/_serve_baselines.py naive WEIGHTS.npz --port 8001
    python bench/_serve_baselines.py floor --port 8002 [--grpc-port 8003] [--grpcio-port 8004]
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


async def _with_grpc_floors(server: uvicorn.Server, lean_port: int | None, grpcio_port: int | None) -> None:
    from offload.serve.grpc_server import GrpcServer, Method
    from offload.serve.http2 import Http2Limits
    from offload.serve.oip_grpc import SERVICE
    from offload.serve.proto import grpc_predict_v2_pb2 as pb

    const = pb.ModelInferResponse(model_name="risk", model_version="1", outputs=[pb.ModelInferResponse.InferOutputTensor(name="y", datatype="FP32", shape=[1, 1])], raw_output_contents=[np.float32(0.5).tobytes()])

    async def infer(request, call):
        return const

    methods = {f"/{SERVICE}/ModelInfer": Method(pb.ModelInferRequest, infer)}
    servers = []
    if lean_port is not None:
        servers.append((GrpcServer(methods, Http2Limits(), max_rpcs=1024), lean_port))
    if grpcio_port is not None:
        from offload.serve.grpc_aio import AioServer

        servers.append((AioServer(SERVICE, methods, max_message_bytes=4 << 20, max_streams=128, max_rpcs=1024), grpcio_port))
    for g, port in servers:
        await g.start("127.0.0.1", port)
    try:
        await server.serve()
    finally:
        for g, _ in servers:
            await g.stop(1.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["naive", "floor"])
    ap.add_argument("weights", nargs="?")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, default=None, help="floor only: also a constant gRPC ModelInfer (lean transport)")
    ap.add_argument("--grpcio-port", type=int, default=None, help="floor only: also a constant gRPC ModelInfer on grpc.aio")
    a = ap.parse_args()
    app = naive_app(a.weights) if a.kind == "naive" else floor_app()
    server = uvicorn.Server(_uvicorn_config(app, "127.0.0.1", a.port, 5.0, "warning"))
    if a.grpc_port is None and a.grpcio_port is None:
        server.run()
    else:
        import uvloop

        grpc_core_env()  # as serve() sets it for grpcio: the same grpc core I/O path as the service
        uvloop.run(_with_grpc_floors(server, a.grpc_port, a.grpcio_port))


if __name__ == "__main__":
    main()
