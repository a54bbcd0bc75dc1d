"""Stock ``tritonclient`` clients in a process of their own, for ``bench_serve.py --protocols``:
grpc core reads ``GRPC_EXPERIMENTS`` once, when grpc is first imported, so a gRPC client with
other grpc core settings than the bench's own needs its own process, and the REST client beside
it in that process is the control (same process size, same caches, same interpreter state). The
parent runs it with the environment it wants and asks for rounds, interleaved with its own:

    python bench/_client.py NAME=grpc://HOST:PORT NAME=http://HOST:PORT ... --per-round 250

Each line on stdin names a target; the answer on stdout is one JSON line: that round's latencies
(seconds, one batch-1 ``infer`` call each, one in flight) and this process's CPU seconds (all its
threads) over the round. The inputs are the bench's own (``make_transactions(per_round, 11)``),
binary tensors on REST as in the parent.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from offload.examples.risk import make_transactions


def inputs(per_round: int) -> tuple[list, list, list]:
    """The bench's batch-1 requests, built up front so that the clock covers the call alone:
    ``(grpc inputs, REST inputs, REST outputs)``, row ``i`` of ``make_transactions(per_round, 11)``
    as call ``i``'s, binary tensors on REST."""
    x = make_transactions(per_round, 11)[0].astype(np.float32)
    g_in, h_in = [], []
    for i in range(per_round):
        gi = tgrpc.InferInput("x", [1, 16], "FP32")
        gi.set_data_from_numpy(x[i : i + 1])
        hi = thttp.InferInput("x", [1, 16], "FP32")
        hi.set_data_from_numpy(x[i : i + 1], binary_data=True)
        g_in.append([gi])
        h_in.append([hi])
    return g_in, h_in, [thttp.InferRequestedOutput("y", binary_data=True)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("targets", nargs="+", help="NAME=grpc://HOST:PORT or NAME=http://HOST:PORT")
    ap.add_argument("--per-round", type=int, required=True)
    a = ap.parse_args()
    g_in, h_in, h_out = inputs(a.per_round)
    clients, calls = [], {}
    for t in a.targets:
        name, _, url = t.partition("=")
        scheme, _, addr = url.partition("://")
        if scheme == "grpc":
            c = tgrpc.InferenceServerClient(addr)
            calls[name] = lambda i, c=c: c.infer("risk", g_in[i])
        elif scheme == "http":
            c = thttp.InferenceServerClient(addr)
            calls[name] = lambda i, c=c: c.infer("risk", h_in[i], outputs=h_out)
        else:
            raise SystemExit(f"target {t!r}: the scheme must be grpc:// or http://")
        clients.append(c)
    print("ready", flush=True)
    for line in sys.stdin:
        call = calls[line.strip()]
        lat = []
        c0 = time.process_time()
        for i in range(a.per_round):
            t = time.perf_counter()
            call(i)
            lat.append(time.perf_counter() - t)
        print(json.dumps({"lat": lat, "cpu_s": time.process_time() - c0}), flush=True)
    for c in clients:
        c.close()


if __name__ == "__main__":
    main()
