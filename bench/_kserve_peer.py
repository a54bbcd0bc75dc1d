"""KServe's Python ModelServer (single worker) serving the risk example's float MLP: the peer that
bench/bench_serve.py compares the service with. It runs ONLY inside the bench's own virtual
environment (bench/.venvs/kserve, made by bench_serve.py --kserve), never the project's: kserve is
no dependency of offload, and this file imports nothing of offload.

The model is the naive server's: the same trained weights (an ``.npz`` of the torch state dict,
16-32-16-1, ReLU, sigmoid), evaluated in float32 with NumPy (torch is not installed there, and
for one row the two agree to float32 rounding). It answers OIP v2 REST at
``/v2/models/risk/infer`` with KServe's own request parsing and response encoding (JSON; KServe answers 400 to a body
sent without ``content-type: application/json``).

    bench/.venvs/kserve/bin/python bench/_kserve_peer.py WEIGHTS.npz --port 8080
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("weights")
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args()
    # kserve parses sys.argv itself when imported (model_server.py, parse_known_args): give it
    # only what it should see. Its per-request log lines (access log, latency trace) are off:
    # the peer is measured at its best, as the service runs with access_log=False.
    sys.argv = [sys.argv[0], "--http_port", str(a.port), "--workers", "1", "--enable_grpc", "false", "--configure_logging", "false", "--enable_latency_logging", "false"]
    from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer

    with np.load(a.weights, allow_pickle=False) as w:
        layers = [(w[f"{i}.weight"].T.astype(np.float32).copy(), w[f"{i}.bias"].astype(np.float32)) for i in (0, 2, 4)]

    def forward(x: np.ndarray) -> np.ndarray:
        h = x.astype(np.float32, copy=False)
        for i, (wt, b) in enumerate(layers):
            h = h @ wt + b
            if i < len(layers) - 1:
                np.maximum(h, 0.0, out=h)
        return (1.0 / (1.0 + np.exp(-h))).astype(np.float32)

    class Risk(Model):
        def __init__(self) -> None:
            super().__init__("risk")
            self.ready = True

        async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
            y = forward(payload.inputs[0].as_numpy())
            out = InferOutput(name="y", shape=list(y.shape), datatype="FP32")
            out.set_data_from_numpy(y, binary_data=False)
            return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=[out])

    ModelServer(http_port=a.port, workers=1, enable_grpc=False, enable_docs_url=False, enable_latency_logging=False).start([Risk()])


if __name__ == "__main__":
    main()
