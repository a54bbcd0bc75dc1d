"""The scoring service's own CPU per request, without HTTP: the ASGI app driven in-process.

``bench_serve.py`` measures the whole server against its floor; this isolates what the app adds.
Batch-1 JSON requests go straight into ``ScoringService.app`` (the plain-ASGI infer path) on
uvloop, ``--conc`` at a time (``asyncio.gather``); thread CPU time per request is reported. The
cost of the harness itself (a task per request, gathered) is measured in the same run and
subtracted.

``--sweep-bytes N`` reads through an N-byte buffer before each round of requests, outside the
timed region: what other processes (the client, the kernel's network stack) do to the caches
between requests in a real server at one connection. Comparing 0 with a few MB shows how much of
the real server's per-request cost is cache misses rather than work.

    .venv/bin/python bench/bench_serve_inproc.py [--conc 1,8,64] [--sweep-bytes 0,1000000,8000000] [--requests 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
import uvloop

import offload
from offload.examples.risk import build_risk_bundle, make_transactions
from offload.serve.app import ScoringService
from offload.serve.config import ServeConfig


def risk_body() -> bytes:
    """The batch-1 JSON infer body the service benchmarks send: one risk transaction, FP32."""
    x = make_transactions(1, 5)[0].astype(np.float32)
    return orjson.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": x.ravel().tolist()}]})


def asgi_infer(body: bytes, headers: list[tuple[bytes, bytes]] = ()):
    """``(scope, receive, send, statuses)`` of a POST to the risk model's infer URL with ``body``,
    as uvicorn hands it to an app (``headers`` before Content-Length); ``statuses`` collects the
    answers' status codes."""
    scope = {"type": "http", "method": "POST", "path": "/v2/models/risk/infer", "headers": [*headers, (b"content-length", str(len(body)).encode())]}
    statuses: list[int] = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg):
        if msg["type"] == "http.response.start":
            statuses.append(msg["status"])

    return scope, receive, send, statuses


async def _measure(svc: ScoringService, body: bytes, conc: int, n: int, sweep: np.ndarray | None) -> tuple[float, float]:
    """(app + harness, harness alone) thread CPU seconds per request."""
    scope, receive, send, statuses = asgi_infer(body)

    async def one():
        await svc.app(scope, receive, send)

    async def noop():
        await asyncio.sleep(0)

    rounds = max(1, n // conc)
    for _ in range(max(1, 500 // conc)):  # warm-up: JIT, caches, first-call paths
        await asyncio.gather(*[one() for _ in range(conc)])
    spent = {"app": 0.0, "harness": 0.0}
    for what, fn in (("app", one), ("harness", noop)):
        for _ in range(rounds):
            if sweep is not None:
                sweep.sum()
            t = time.thread_time()
            await asyncio.gather(*[fn() for _ in range(conc)])
            spent[what] += time.thread_time() - t
    if any(s != 200 for s in statuses):
        raise SystemExit(f"the service answered {sorted(set(statuses))}, not only 200")
    per = rounds * conc
    return spent["app"] / per, spent["harness"] / per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conc", default="1,8,64", help="requests in flight, comma-separated")
    ap.add_argument("--sweep-bytes", default="0", help="bytes read between rounds, comma-separated (0: none)")
    ap.add_argument("--requests", type=int, default=20000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        build_risk_bundle(Path(tmp) / "risk")
        svc = ScoringService(offload.load(str(Path(tmp) / "risk")), ServeConfig(device="sim"))
    body = risk_body()

    async def run() -> None:
        await svc._ensure_started()
        print("| requests in flight | bytes swept between rounds | app CPU us/req (harness subtracted) |")
        print("|---:|---:|---:|")
        for sweep_bytes in (int(s) for s in a.sweep_bytes.split(",")):
            sweep = np.ones(sweep_bytes // 8) if sweep_bytes else None
            for conc in (int(c) for c in a.conc.split(",")):
                both, harness = await _measure(svc, body, conc, a.requests, sweep)
                print(f"| {conc} | {sweep_bytes} | {(both - harness) * 1e6:.1f} |", flush=True)
        await svc.batcher.stop()

    uvloop.run(run())


if __name__ == "__main__":
    main()
