"""Which stage of the service's hot path costs what at one connection, inside a real server.

``bench_serve_appcpu.py`` shows that at one connection the app's cost in a server is mostly cache
misses: its code and data have left the caches by the time the next request comes. Instruction
counts then say little about what a stage costs. This measures it by ablation: one server per
setting, each the service behind uvicorn (as ``bench_serve_appcpu.py`` runs it), where one stage
is replaced by a dictionary lookup of the answer that stage gave the first time. The benchmark
sends one body over and over, so every setting answers the same bytes (checked); what a setting
saves against ``full`` is what its stage costs when it runs cold (less the lookup's own cost, a
key made of the request's values: the savings are lower bounds):

- ``parse``: ``parse_infer`` (msgspec decode and the body's checks);
- ``stack``: the batch's rows from the request's JSON values (``stack_rows``);
- ``kernel``: the sim device's prepared call (the numba MLP kernel and the calls around it);
- ``encode``: the JSON answer from the batch's outputs;
- ``batcher``: the batcher, the stacking and the device call together.

The servers are loaded in turn, the order flipped every round, one ``--connections``
closed-loop connection; medians over ``--rounds``.

    .venv/bin/python bench/bench_serve_ablate.py [--rounds 4] [--duration 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ("full", "parse", "stack", "kernel", "encode", "batcher")
_INFER = "/v2/models/risk/infer"


def _memo(fn, key):
    """``fn`` answering from a dictionary keyed by ``key(*args)``: the first call computes."""
    seen: dict = {}

    def call(*args, **kw):
        k = key(*args)
        if k not in seen:
            seen[k] = fn(*args, **kw)
        return seen[k]

    return call


def _service(bundle: str, setting: str):
    import offload
    from offload.serve import app as appmod
    from offload.serve.app import ScoringService
    from offload.serve.config import ServeConfig

    svc = ScoringService(offload.load(bundle), ServeConfig(device="sim", max_queue_size=4096))
    if setting == "parse":
        appmod.parse_infer = _memo(appmod.parse_infer, lambda body, *rest: body)
    elif setting == "stack":
        svc.batcher._stack = _memo(svc.batcher._stack, lambda xs: tuple(tuple(x.data) for x in xs))
    elif setting == "kernel":
        dev, handle, fast = svc.runner._live
        svc.runner._live = (dev, handle, _memo(fast, lambda x: x.tobytes()))
    elif setting == "encode":
        svc._encode = _memo(svc._encode, lambda req, shared, off, n: (req.id, req.binary_output, shared.y[off : off + n].tobytes()))
    elif setting == "batcher":
        from offload.serve.batcher import BatchOut

        real = svc.batcher.submit
        seen: dict = {}

        async def first(k, x, timeout):
            r = real(x, timeout)
            seen[k] = r if type(r) is tuple else await r
            out, off, n = seen[k]
            return BatchOut(out.y), off, n

        def submit(x, timeout):
            # After the first time, the answer itself, as submit gives a request that ran alone.
            k = tuple(x.data)
            if k not in seen:
                return first(k, x, timeout)
            out, off, n = seen[k]
            return BatchOut(out.y), off, n  # a fresh one: the encoder's per-batch cache stays empty

        svc.batcher.submit = submit
    return svc.app


def _child(setting: str, bundle: str, port: int, out: str) -> None:
    from bench_serve_appcpu import serve_timed

    serve_timed(_service(bundle, setting), port, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--connections", type=int, default=1)
    ap.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    ap.add_argument("--bundle", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    if a.child:
        _child(a.child, a.bundle, a.port, a.out)
        return
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import httpx
    import uvloop
    from bench_serve import _cpu_s, _port, _start
    from bench_serve_inproc import risk_body

    from offload.examples.risk import build_risk_bundle
    from offload.loadgen.closedloop import run_closed

    body = risk_body()
    with tempfile.TemporaryDirectory() as tmp:
        bundle = str(Path(tmp) / "risk")
        build_risk_bundle(bundle)
        ports = {s: _port() for s in SETTINGS}
        procs = {s: _start([sys.executable, __file__, "--child", s, "--bundle", bundle, "--port", str(ports[s]), "--out", f"{tmp}/{s}.json"], ports[s]) for s in SETTINGS}
        cpu: dict[str, list[float]] = {s: [] for s in SETTINGS}
        served = dict.fromkeys(SETTINGS, 0)
        try:
            answers = {s: httpx.post(f"http://127.0.0.1:{ports[s]}{_INFER}", content=body).content for s in SETTINGS}
            if len(set(answers.values())) != 1:
                raise SystemExit(f"the settings answer differently: {answers}")
            for s in SETTINGS:  # warm-up: JIT, first-call paths, the batcher's lonely state
                uvloop.run(run_closed(f"http://127.0.0.1:{ports[s]}{_INFER}", body, connections=a.connections, duration=1.0))
            for r in range(a.rounds):
                for s in SETTINGS if r % 2 == 0 else SETTINGS[::-1]:
                    c0 = _cpu_s(procs[s].pid)
                    res = uvloop.run(run_closed(f"http://127.0.0.1:{ports[s]}{_INFER}", body, connections=a.connections, duration=a.duration))
                    cpu[s].append((_cpu_s(procs[s].pid) - c0) / res.ok * 1e6)
                    served[s] += res.ok
        finally:
            for p in procs.values():
                p.send_signal(signal.SIGTERM)
            for p in procs.values():
                p.wait(timeout=30)
        app = {s: float(np.median(json.loads(Path(f"{tmp}/{s}.json").read_text())[-served[s]:])) * 1e6 for s in SETTINGS}
    print(f"| stage answered from a dictionary | server process CPU us/req (median of {a.rounds}) | app CPU us/req (median) | the stage's cost, from the app's CPU |")
    print("|---|---:|---:|---:|")
    for s in SETTINGS:
        cost = "-" if s == "full" else f"{app['full'] - app[s]:.1f}"
        print(f"| {s if s != 'full' else 'none (full)'} | {np.median(cpu[s]):.1f} | {app[s]:.1f} | {cost} |")


if __name__ == "__main__":
    main()
