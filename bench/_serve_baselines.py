"""Baseline servers for bench/bench_serve.py, on the same HTTP stack as the service (Starlette on
uvicorn with uvloop + httptools, orjson, the same OIP parser and encoder):

- ``naive``: the float torch model called once per request, in the request handler, no batching.
- ``floor``: a trivial endpoint that reads the body and returns a constant OIP response: the
  cost of the HTTP round trip alone.

    python bench/_serve_baselines.py naive WEIGHTS.npz --port 8001
    python bench/_serve_baselines.py floor --port 8002
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
from offload.serve.server import _uvicorn_config

INP, OUT = TensorSpec("x", 16), TensorSpec("y", 1)
META = orjson.dumps({"name": "risk", "versions": ["1"], "platform": "baseline", "inputs": [INP.metadata()], "outputs": [OUT.metadata()]})


def _meta(request: Request) -> Response:
    return Response(META, media_type="application/json")


def naive_app(weights: str) -> Starlette:
    import torch

    from offload.examples.risk import train_float_model

    torch.set_num_threads(1)  # one row per call: threads only add hand-off cost
    model = train_float_model(np.zeros((1, 16), np.float32), np.zeros(1, np.float32), epochs=0)
    with np.load(weights, allow_pickle=False) as w:
        model.load_state_dict({k: torch.from_numpy(w[k]) for k in w.files})
    model.eval()

    async def infer(request: Request) -> Response:
        try:
            req = parse_infer(await request.body(), request.headers.get("inference-header-content-length"), INP, OUT, 64)
        except OipError as e:
            return Response(orjson.dumps({"error": e.message}), status_code=e.status, media_type="application/json")
        with torch.inference_mode():
            y = model(torch.from_numpy(req.x.astype(np.float32))).numpy()
        body, headers = encode_infer("risk", "1", req, y, OUT)
        return Response(body, headers=headers)

    return Starlette(routes=[Route("/v2/models/risk", _meta), Route("/v2/models/risk/infer", infer, methods=["POST"])])


def floor_app() -> Starlette:
    const = orjson.dumps({"model_name": "risk", "model_version": "1", "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 1], "data": [0.5]}]})

    async def infer(request: Request) -> Response:
        await request.body()
        return Response(const, media_type="application/json")

    return Starlette(routes=[Route("/v2/models/risk", _meta), Route("/v2/models/risk/infer", infer, methods=["POST"])])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["naive", "floor"])
    ap.add_argument("weights", nargs="?")
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args()
    app = naive_app(a.weights) if a.kind == "naive" else floor_app()
    uvicorn.Server(_uvicorn_config(app, "127.0.0.1", a.port, 5.0, "warning")).run()


if __name__ == "__main__":
    main()
