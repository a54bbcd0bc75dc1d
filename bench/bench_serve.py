"""The scoring service against KServe's ModelServer, closed loop, batch-1 JSON over REST.

    .venv/bin/python bench/bench_serve.py --connections 1,8,64 --kserve --duration 3 --repeats 3

Each sweep runs every server at each concurrency back to back (N keep-alive connections, one
request in flight each; ``offload.loadgen.closedloop``), and reports throughput, p50/p99 and the
server's CPU per request. Goals (issue 43): the service's throughput at least 8x KServe's at equal
p99 (KServe at its best cell against the service's best with a p99 no higher), and the service's
infer p99 within 2x its health route's p99 at the same concurrency.

The KServe peer (``bench/_kserve_peer.py``: KServe's ``ModelServer``, 1 worker, the same model's
float weights in NumPy) runs in its own venv, ``bench/.venvs/kserve`` (git-ignored), made on first
use; kserve is never a project dependency.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
KSERVE_VENV = ROOT / "bench" / ".venvs" / "kserve"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd: list[str], port: int) -> subprocess.Popen:
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if p.poll() is not None:
            raise RuntimeError(f"{cmd} exited: {p.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/models/risk", timeout=1).status_code == 200:
                return p
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    p.kill()
    raise RuntimeError(f"{cmd} did not start")


def _cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def kserve_python(install_timeout_s: float) -> Path | None:
    """The bench venv's python with kserve importable, made on first use; None (said why) if not."""
    py = KSERVE_VENV / "bin" / "python"
    try:
        if not py.exists():
            print(f"kserve peer: creating {KSERVE_VENV.relative_to(ROOT)} and installing kserve (first use; minutes)", flush=True)
            subprocess.run([sys.executable, "-m", "venv", str(KSERVE_VENV)], check=True, timeout=120)
        if subprocess.run([str(py), "-c", "import kserve, numpy"], capture_output=True, timeout=120).returncode != 0:
            r = subprocess.run([str(py), "-m", "pip", "install", "-q", "kserve", "numpy"], capture_output=True, text=True, timeout=install_timeout_s)
            if r.returncode != 0:
                print(f"kserve peer: SKIPPED, pip install kserve failed: {r.stderr.strip()[-1500:]}", flush=True)
                return None
    except (OSError, subprocess.SubprocessError) as e:
        print(f"kserve peer: SKIPPED ({e})", flush=True)
        return None
    return py


def sweep(servers: dict[str, tuple[list[str], int]], conns: list[int], duration: float, repeats: int, body: bytes) -> dict:
    """Median throughput, p50, p99 and server CPU per request, per server, route and concurrency."""
    import uvloop

    from offload.loadgen.closedloop import run_closed

    procs = {k: _start(cmd, port) for k, (cmd, port) in servers.items()}
    cells: dict[tuple[str, str, int], list[dict]] = {}
    routes = {"infer": ("/v2/models/risk/infer", body), "health": ("/v2/health/ready", None)}
    try:
        for k, (_, port) in servers.items():  # warm-up: imports, JIT, cold caches
            uvloop.run(run_closed(f"http://127.0.0.1:{port}{routes['infer'][0]}", body, connections=8, duration=1.0))
        for rep in range(repeats):
            for c in conns:
                for k, (_, port) in (servers.items() if rep % 2 == 0 else reversed(servers.items())):
                    for route, (path, b) in routes.items():
                        if route == "health" and k != "service":
                            continue
                        c0 = _cpu_s(procs[k].pid)
                        res = uvloop.run(run_closed(f"http://127.0.0.1:{port}{path}", b, connections=c, duration=duration))
                        cpu = (_cpu_s(procs[k].pid) - c0) / max(res.ok, 1) * 1e6
                        p = res.percentiles()
                        row = {"throughput": res.throughput, "p50_ms": p["p50"] / 1e3, "p99_ms": p["p99"] / 1e3, "errors": sum(res.errors.values()), "cpu_us": cpu}
                        cells.setdefault((k, route, c), []).append(row)
                        print(f"[{rep + 1}/{repeats}] {k:8s} {route:6s} {c:3d} conns {row['throughput']:7.0f} req/s  p50 {row['p50_ms']:7.3f} ms  p99 {row['p99_ms']:7.3f} ms  CPU {cpu:6.1f} us/req", flush=True)
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(timeout=30)
    return {f"{k}/{route}/{c}": {f: float(np.median([r[f] for r in rows])) for f in rows[0]} for (k, route, c), rows in cells.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", default="1,8,64")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3, help="sweeps; each cell reports the median")
    ap.add_argument("--kserve", action="store_true", help="add KServe's ModelServer as a peer (own venv, see above)")
    ap.add_argument("--kserve-install-timeout", type=float, default=900.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    conns = [int(c) for c in a.connections.split(",")]

    import torch

    from offload.examples.risk import build_risk_bundle, make_transactions, train_float_model

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    build_risk_bundle(tmp / "risk")
    x = make_transactions(1, 5)[0].astype(np.float32)
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": x.ravel().tolist()}]})
    sport = _port()
    servers = {"service": ([sys.executable, "-m", "offload.cli", "serve", str(tmp / "risk"), "--device", "sim", "--max-queue-size", "4096", "--port", str(sport)], sport)}
    kpy = kserve_python(a.kserve_install_timeout) if a.kserve else None
    if kpy is not None:
        xs, ys = make_transactions(20000, 0)
        model = train_float_model(xs, ys, seed=0)  # the bundle's training, same seed, as float weights
        np.savez(tmp / "float.npz", **{k: v.detach().numpy() for k, v in model.state_dict().items()})
        kport = _port()
        servers["kserve"] = ([str(kpy), "bench/_kserve_peer.py", str(tmp / "float.npz"), "--port", str(kport)], kport)
    res = sweep(servers, conns, a.duration, a.repeats, body)
    print("\n| server / route | " + " | ".join(f"{c} conns req/s, p50/p99 ms, CPU us" for c in conns) + " |")
    for key in sorted({k.rsplit("/", 1)[0] for k in res}):
        print(f"| {key} | " + " | ".join(f"{res[f'{key}/{c}']['throughput']:.0f}, {res[f'{key}/{c}']['p50_ms']:.2f}/{res[f'{key}/{c}']['p99_ms']:.2f}, {res[f'{key}/{c}']['cpu_us']:.0f}" for c in conns) + " |")
    summary = {"p99_infer_over_health": {c: res[f"service/infer/{c}"]["p99_ms"] / res[f"service/health/{c}"]["p99_ms"] for c in conns}}
    print("infer p99 / health p99: " + ", ".join(f"{v:.2f}x at {c}" for c, v in summary["p99_infer_over_health"].items()) + " (goal <= 2)")
    if kpy is not None:
        kc = max(conns, key=lambda c: res[f"kserve/infer/{c}"]["throughput"])
        kb = res[f"kserve/infer/{kc}"]
        best = max((res[f"service/infer/{c}"]["throughput"] for c in conns if res[f"service/infer/{c}"]["p99_ms"] <= kb["p99_ms"] and not res[f"service/infer/{c}"]["errors"]), default=0.0)
        summary["service_over_kserve_at_equal_p99"] = best / kb["throughput"]
        print(f"KServe at its best: {kb['throughput']:.0f} req/s at {kc} conns, p99 {kb['p99_ms']:.2f} ms; service's best with p99 <= that: {best:.0f} req/s: {best / kb['throughput']:.2f}x (goal >= 8)")
    if a.json:
        Path(a.json).write_text(json.dumps({"cells": res, "summary": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
