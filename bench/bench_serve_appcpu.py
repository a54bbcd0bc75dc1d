"""Where the one-connection CPU goes: the same app's CPU per request inside a real server and
driven in-process, with warm and with swept caches.

``bench_serve.py`` reports the server's CPU per request; ``bench_serve_instr.py`` counts the
app's instructions. Neither says why, at one connection, the service costs so much more than its
instruction count suggests. This measures the app's own thread CPU time per infer request
(``time.thread_time`` around the ASGI call, nothing else) in three settings, for the service on
the sim device and for the constant-answer floor app:

- ``server``: the app behind uvicorn (the service's uvicorn settings, ``gc.freeze`` as
  ``offload serve`` does), loaded by ``--connections`` closed-loop keep-alive connections. Between
  two requests the process sleeps in epoll while the client and the kernel's network stack run;
- ``in-process``: the same app object called back to back in one loop (no HTTP), caches warm;
- ``in-process, swept``: the same, reading ``--sweep-bytes`` of memory before each request,
  outside the timed region (1 MB is this machine's L2 per core, 32 MB its shared L3).

If the server figure is well above the warm in-process one, and a sweep brings the in-process
figure up to it, then the server's cost per request is cache misses of the app's own code and
data after each idle wait, not work that fewer instructions would remove in proportion.

    .venv/bin/python bench/bench_serve_appcpu.py [--connections 1] [--duration 5] [--sweep-bytes 1000000,32000000]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
_INFER = "/v2/models/risk/infer"


def _timed(app, samples: list[float]):
    """``app``, with the thread CPU time of each infer request appended to ``samples``."""

    async def wrapped(scope, receive, send):
        if scope["type"] != "http" or scope["path"] != _INFER:
            await app(scope, receive, send)
            return
        c0 = time.thread_time()
        await app(scope, receive, send)
        samples.append(time.thread_time() - c0)

    return wrapped


def _app(kind: str, bundle: str):
    if kind == "floor":
        from _serve_baselines import floor_app

        return floor_app()
    import offload
    from offload.serve.app import ScoringService
    from offload.serve.config import ServeConfig

    return ScoringService(offload.load(bundle), ServeConfig(device="sim", max_queue_size=4096)).app


def serve_timed(app, port: int, out: str) -> None:
    """Serves ``app`` (timed per infer request) on ``port`` as ``offload serve`` would, until
    SIGTERM; then writes the samples to ``out``."""
    import uvicorn

    from offload.serve.server import _settle_gc, _uvicorn_config

    samples: list[float] = []
    server = uvicorn.Server(_uvicorn_config(_timed(app, samples), "127.0.0.1", port, 5.0, "warning"))
    _settle_gc()  # as offload serve does before it serves

    def leave(signum, frame) -> None:  # uvicorn re-raises the SIGTERM it drained on
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, leave)
    try:
        server.run()
    finally:
        Path(out).write_text(json.dumps(samples))


def _child(kind: str, bundle: str, port: int, out: str) -> None:
    """Serves ``kind`` on ``port`` until SIGTERM, then writes its samples to ``out``."""
    serve_timed(_app(kind, bundle), port, out)


def _stats(samples: list[float]) -> dict[str, float]:
    us = np.asarray(samples) * 1e6
    return {"n": int(us.size), "mean_us": float(us.mean()), "p50_us": float(np.median(us)), "p90_us": float(np.percentile(us, 90)), "p99_us": float(np.percentile(us, 99))}


def in_server(kind: str, bundle: str, tmp: Path, connections: int, duration: float) -> dict[str, float]:
    """The app's CPU per request in the measured run, and the whole process's (every thread, from
    /proc): what the server spends on a request outside the app is their difference."""
    import uvloop

    sys.path.insert(0, str(ROOT / "bench"))
    from bench_serve import _cpu_times, _port, _start
    from bench_serve_inproc import risk_body

    from offload.loadgen.closedloop import run_closed

    port, out = _port(), tmp / f"{kind}.json"
    warm = 2000
    proc = _start([sys.executable, __file__, "--child", kind, "--bundle", bundle, "--port", str(port), "--out", str(out)], port)
    body, url = risk_body(), f"http://127.0.0.1:{port}{_INFER}"
    try:
        async def warm_up() -> None:
            done = 0
            while done < warm:  # JIT, first-call paths; these samples are skipped
                done += (await run_closed(url, body, connections=connections, duration=0.5)).ok

        uvloop.run(warm_up())
        c0 = (*_cpu_times(proc.pid), _sleeps(proc.pid))
        res = uvloop.run(run_closed(url, body, connections=connections, duration=duration))
        c1 = (*_cpu_times(proc.pid), _sleeps(proc.pid))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    stats = _stats(json.loads(out.read_text())[-res.ok :])  # the measured run's requests
    user, sys_, sleeps = ((b - a) / res.ok for a, b in zip(c0, c1))
    stats.update(process_us=(user + sys_) * 1e6, user_us=user * 1e6, sys_us=sys_ * 1e6, sleeps=sleeps)
    return stats


def _sleeps(pid: int) -> int:
    """How many times a process's main thread went to sleep (voluntary context switches: an epoll
    wait that blocked), from /proc."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt_switches"))


def in_process(kind: str, bundle: str, n: int, sweep_bytes: int) -> dict[str, float]:
    import uvloop

    sys.path.insert(0, str(ROOT / "bench"))
    from bench_serve_inproc import asgi_infer, risk_body

    samples: list[float] = []
    app = _timed(_app(kind, bundle), samples)
    scope, receive, send, statuses = asgi_infer(risk_body())
    sweep = np.ones(sweep_bytes // 8) if sweep_bytes else None

    async def run() -> None:
        # No lifespan: the service starts its batcher on its first request (skipped with the warm-up).
        for i in range(2000 + n):
            if sweep is not None:
                sweep.sum()
            await app(scope, receive, send)

    uvloop.run(run())
    if any(s != 200 for s in statuses):
        raise SystemExit(f"{kind} answered {sorted(set(statuses))}, not only 200")
    return _stats(samples[2000:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=1)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--requests", type=int, default=10000, help="in-process requests per setting")
    ap.add_argument("--sweep-bytes", default="1000000,32000000", help="bytes read before each in-process request, comma-separated")
    ap.add_argument("--child", choices=["service", "floor"], help=argparse.SUPPRESS)
    ap.add_argument("--bundle", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        sys.path.insert(0, str(ROOT / "bench"))
        _child(a.child, a.bundle, a.port, a.out)
        return
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from offload.examples.risk import build_risk_bundle

    with tempfile.TemporaryDirectory() as tmp:
        bundle = str(Path(tmp) / "risk")
        build_risk_bundle(bundle)
        rows = []
        for kind in ("floor", "service"):
            settings = [(f"server, {a.connections} connection(s)", None), ("in-process, warm", 0)]
            settings += [(f"in-process, {int(b) / 1e6:g} MB swept before each", int(b)) for b in a.sweep_bytes.split(",")]
            for name, sweep in settings:
                s = in_server(kind, bundle, Path(tmp), a.connections, a.duration) if sweep is None else in_process(kind, bundle, a.requests, sweep)
                rows.append((kind, name, s))
                whole = f"  whole process {s['process_us']:7.1f} (user {s['user_us']:.1f}, sys {s['sys_us']:.1f}, sleeps/req {s['sleeps']:.2f})" if "process_us" in s else ""
                print(f"{kind:8s} {name:40s} app CPU us/req: p50 {s['p50_us']:7.1f}  mean {s['mean_us']:7.1f}  p90 {s['p90_us']:7.1f}  p99 {s['p99_us']:7.1f}{whole}  (n={s['n']})", flush=True)
    print("\n| app | setting | app CPU us/req p50 | mean | p99 | whole server process us/req (user / sys) | sleeps/req |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for kind, name, s in rows:
        whole = f"{s['process_us']:.1f} ({s['user_us']:.0f} / {s['sys_us']:.0f})" if "process_us" in s else "-"
        sleeps = f"{s['sleeps']:.2f}" if "sleeps" in s else "-"
        print(f"| {kind} | {name} | {s['p50_us']:.1f} | {s['mean_us']:.1f} | {s['p99_us']:.1f} | {whole} | {sleeps} |")


if __name__ == "__main__":
    main()
