"""Scoring service latency and throughput against a naive server and the loopback floor.

Three servers, each its own process on the same HTTP stack (Starlette + uvicorn/uvloop/httptools,
orjson), loaded one after the other by the open-loop load tool (``offload bench``'s engine) with
batch-1 requests at several constant rates:

- ``service``: ``offload serve`` on the sim device (dynamic batching, defaults);
- ``naive``: the float torch model called once per request, no batching;
- ``floor``: a trivial endpoint (read the body, return a constant).

    .venv/bin/python bench/bench_serve.py [--rates 1000,2000,3000,4000,5000,6000] [--duration 4] [--repeats 3] [--json out.json]

Each cell is the median of ``--repeats`` interleaved sweeps (the machine is shared). Server CPU
per request (from /proc) is reported too: unlike latency, it hardly moves with other load.
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

ROOT = Path(__file__).resolve().parents[1]
SLO_P99_MS = 20.0  # the latency bound at which throughputs are compared ("equal p99")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd: list[str], port: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
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


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads), from /proc; None off Linux."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _sustained(rows: list[dict], rate: float) -> bool:
    r = next(x for x in rows if x["rate"] == rate)
    return not r["errors"] and r["throughput"] >= 0.97 * rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="1000,2000,3000,4000,5000,6000")
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=3, help="sweeps; each cell reports the median")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rates = [float(r) for r in a.rates.split(",")]

    import torch
    import uvloop

    from offload.examples.risk import build_risk_bundle, make_transactions, train_float_model
    from offload.loadgen.openloop import run_load

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    build_risk_bundle(tmp / "risk")
    # The naive server's float model: the same training (same seed) as the bundle's, saved as npz.
    x, y = make_transactions(20000, 0)
    model = train_float_model(x, y, seed=0)
    np.savez(tmp / "float.npz", **{k: v.detach().numpy() for k, v in model.state_dict().items()})

    ports = {"service": _port(), "naive": _port(), "floor": _port()}
    py = sys.executable
    cmds = {
        "service": [py, "-m", "offload.cli", "serve", str(tmp / "risk"), "--port", str(ports["service"]), "--device", "sim", "--max-queue-size", "4096"],
        "naive": [py, "bench/_serve_baselines.py", "naive", str(tmp / "float.npz"), "--port", str(ports["naive"])],
        "floor": [py, "bench/_serve_baselines.py", "floor", "--port", str(ports["floor"])],
    }
    procs = {k: _start(c, ports[k]) for k, c in cmds.items()}
    runs: dict[tuple[str, float], list[dict]] = {(k, r): [] for k in cmds for r in rates}
    try:
        for k in cmds:  # warm-up: first requests pay imports and cold caches
            uvloop.run(run_load(f"http://127.0.0.1:{ports[k]}/v2/models/risk", 200, 1))
        # The machine is shared: repeat the whole sweep and keep each cell's median, so one burst
        # of someone else's work does not decide a figure. Servers alternate within each rate.
        for rep in range(a.repeats):
            for rate in rates:
                for k in ("floor", "naive", "service"):
                    c0 = _cpu_s(procs[k].pid)
                    res = uvloop.run(run_load(f"http://127.0.0.1:{ports[k]}/v2/models/risk", rate, a.duration, timeout=10))
                    c1 = _cpu_s(procs[k].pid)
                    p = res.percentiles()
                    cpu_us = (c1 - c0) / res.sent * 1e6 if c0 is not None and c1 is not None else float("nan")
                    row = {"rate": rate, "p50_ms": p["p50"] / 1e3, "p99_ms": p["p99"] / 1e3, "throughput": res.throughput, "errors": sum(res.errors.values()), "server_cpu_us_per_req": cpu_us}
                    runs[(k, rate)].append(row)
                    print(f"[{rep + 1}/{a.repeats}] {k:8s} rate {rate:6.0f}/s  p50 {row['p50_ms']:8.3f} ms  p99 {row['p99_ms']:9.3f} ms  {row['throughput']:7.1f} req/s  errors {row['errors']}  server CPU {cpu_us:5.0f} us/req", flush=True)
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(timeout=30)
    results: dict[str, list[dict]] = {k: [] for k in cmds}
    for (k, rate), rows in runs.items():
        med = {f: float(np.median([r[f] for r in rows])) for f in ("p50_ms", "p99_ms", "throughput", "server_cpu_us_per_req")}
        results[k].append({"rate": rate, **med, "errors": int(sum(r["errors"] for r in rows)), "runs": rows})

    print("\n| rate (req/s) | floor p50 / p99 ms | naive p50 / p99 ms | service p50 / p99 ms | floor / naive / service req/s | server CPU us/req floor / naive / service |")
    print("|---:|---:|---:|---:|---:|---:|")
    for i, rate in enumerate(rates):
        f, n, s = results["floor"][i], results["naive"][i], results["service"][i]
        cell = lambda r: f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f}" + (f" ({r['errors']} err)" if r["errors"] else "")  # noqa: E731
        print(f"| {rate:.0f} | {cell(f)} | {cell(n)} | {cell(s)} | {f['throughput']:.0f} / {n['throughput']:.0f} / {s['throughput']:.0f} | {f['server_cpu_us_per_req']:.0f} / {n['server_cpu_us_per_req']:.0f} / {s['server_cpu_us_per_req']:.0f} |")

    floor_top = max((r for r in rates if _sustained(results["floor"], r)), default=None)
    summary: dict = {"slo_p99_ms": SLO_P99_MS, "floor_top_rate": floor_top}
    if floor_top is not None:
        i = rates.index(floor_top)
        ratio = results["service"][i]["p99_ms"] / results["floor"][i]["p99_ms"]
        summary["service_over_floor_p99_at_floor_top"] = ratio
        print(f"\nhighest rate the floor sustains: {floor_top:.0f}/s; service p99 / floor p99 there: {ratio:.2f}x (target <= 2)")

    def best(k: str) -> float:
        ok = [r["throughput"] for r in results[k] if r["p99_ms"] <= SLO_P99_MS and not r["errors"] and r["throughput"] >= 0.97 * r["rate"]]
        return max(ok, default=0.0)

    summary["throughput_at_slo"] = {k: best(k) for k in results}
    sb, nb = best("service"), best("naive")
    summary["service_over_naive_at_slo"] = sb / nb if nb else None
    print(f"highest sustained throughput with p99 <= {SLO_P99_MS:g} ms: service {sb:.0f}, naive {nb:.0f}, floor {best('floor'):.0f} req/s"
          + (f"; service / naive {sb / nb:.2f}x (target >= 3)" if nb else ""))
    # Where every server is CPU-bound, no server on this stack can beat naive by more than the floor does.
    top = results["naive"][-1]["server_cpu_us_per_req"] / results["floor"][-1]["server_cpu_us_per_req"]
    summary["naive_over_floor_cpu_at_top_rate"] = top
    print(f"server CPU per request at {rates[-1]:.0f}/s: naive / floor {top:.2f}x (bounds any CPU-bound throughput gain over naive), "
          f"service / naive {results['service'][-1]['server_cpu_us_per_req'] / results['naive'][-1]['server_cpu_us_per_req']:.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps({"results": results, "summary": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
