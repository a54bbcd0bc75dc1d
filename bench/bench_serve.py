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

``--protocols`` measures instead gRPC against REST (binary tensors) on ONE ``offload serve
--grpc-port`` process (the lean gRPC transport, the default): batch-1 requests from stock
``tritonclient.grpc`` and ``tritonclient.http`` clients, one request at a time, in alternating
rounds (the order flips every round), so every row sees the same machine load. p50 / p99 over all
rounds, server CPU per request and the client's own CPU per request (this process, all its
threads: with one request in flight it is on every call's critical path). Also measured: a second
``offload serve --grpc-server grpcio`` process (gRPC on grpc.aio, the transport before the lean
one), and each stack's floor (``_serve_baselines.py floor --grpc-port --grpcio-port --h2-port``:
constant answers on the same stacks, h2's HTTP/2 among them), which bounds what the service could reach on it; the clients' CPU
against the floors is each stock client's own cost, which no server takes away. The rows
ending ``_proc2`` are the same stock clients in a second process (``_client.py``) with grpc
core's EventEngine client off (``GRPC_EXPERIMENTS=-event_engine_client``, README.md "Clients"),
in the same interleaved rounds; REST there is the control for gRPC there.

    .venv/bin/python bench/bench_serve.py --protocols [--rounds 20] [--per-round 250]

``--connections 1,8,64`` measures instead throughput at a fixed concurrency (closed loop:
``offload.loadgen.closedloop``, each connection sends its next batch-1 JSON request when the last
answer is in) for the floor, the service and, with ``--kserve``, KServe's Python ModelServer
(single worker) serving the naive server's float weights. KServe is never a project dependency:
the script makes its own virtual environment, bench/.venvs/kserve (git-ignored), and pip-installs
``kserve`` there on first use; if that fails or takes longer than ``--kserve-install-timeout``, it
says so and measures the rest. Servers alternate within each cell, ``--repeats`` sweeps, medians;
the goal ratios are also given paired (service over floor within each sweep, where both saw the
same phase of the machine's load), as the median of the sweeps' ratios.

    .venv/bin/python bench/bench_serve.py --connections 1,8,64 --kserve [--duration 3] [--repeats 3]

``--placement same`` puts every server and the client (this process) on CPU 0, ``split`` the
servers on CPU 0 and the client on CPU 1; the default leaves both to the scheduler. At one
connection, where the scheduler puts a woken client decides what a request costs the floor: on
its server's CPU no wake-up crosses CPUs, and the floor's CPU a request is about half what it is
across two (round 19). Unpinned, a run gets whichever placement the scheduler keeps choosing, often
for minutes, so the one-connection ratio is measured in both.

    .venv/bin/python bench/bench_serve.py --connections 1 --placement same [--repeats 9]

``--base REV`` adds, to ``--connections`` or ``--protocols``, the service as it was at git
revision REV (a temporary worktree, run with this environment's packages by ``_at_tree.py``) in
the same interleaved rounds: what a change did, as the paired ratio of this checkout's service
over the base's (CPU per request and throughput; with ``--protocols``, gRPC and REST binary p50
and server CPU from the tuned client process), round by round, where both saw the same phase of
the machine's load.

    .venv/bin/python bench/bench_serve.py --connections 1,64 --base HEAD~3 [--duration 1] [--repeats 20]
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
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
# grpc core's EventEngine client (src/core/lib/experiments/rollouts.yaml, grpcio 1.85:
# event_engine_client "default: true") reads a client's sockets on EventEngine worker threads,
# which hand every completion to the thread blocked in the call: about 3 worker wake-ups a unary
# RPC. Off, the calling thread polls and reads the socket itself, the path grpc core took by
# default for years. README.md ("Clients") gives it to users; the --protocols rows "*_proc2"
# measure it.
TUNED_CLIENT_EXPERIMENTS = "-event_engine_client"
SLO_P99_MS = 20.0  # the latency bound at which throughputs are compared ("equal p99")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(procs) -> None:
    """Terminates every server first, then waits for each: they shut down side by side."""
    procs = list(procs)
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=30)


def _end_child(child: subprocess.Popen) -> None:
    """Ends a client child driven over stdin: EOF asks it to finish; killed if it does not."""
    child.stdin.close()
    try:
        child.wait(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


# --placement: the CPUs of the servers and of this process (the closed-loop client), or None to
# leave both to the scheduler. At one connection the floor's CPU a request doubles from the same
# CPU to two (round 19: a woken client on the server's CPU costs no cross-CPU wake-up), and the
# scheduler picks either for minutes at a time.
PLACEMENTS: dict[str, tuple[set[int], set[int]] | None] = {"os": None, "same": ({0}, {0}), "split": ({0}, {1})}


def _start(cmd: list[str], port: int, cpus: set[int] | None = None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))  # before exec: every thread inherits it
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT, preexec_fn=pin)
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


def _cpu_times(pid: int) -> tuple[float, float] | None:
    """User and system CPU seconds of a process (all its threads), from /proc; None off Linux."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(f[11]) / tick, int(f[12]) / tick


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads), from /proc; None off Linux."""
    t = _cpu_times(pid)
    return None if t is None else t[0] + t[1]


KSERVE_VENV = ROOT / "bench" / ".venvs" / "kserve"


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
                print(f"kserve peer: SKIPPED, pip install kserve failed (exit {r.returncode}): {r.stderr.strip()[-1500:]}", flush=True)
                return None
    except subprocess.TimeoutExpired as e:
        print(f"kserve peer: SKIPPED, {' '.join(map(str, e.cmd[:4]))} took longer than {e.timeout:.0f} s", flush=True)
        return None
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"kserve peer: SKIPPED, cannot make its virtual environment: {e}", flush=True)
        return None
    v = subprocess.run([str(py), "-c", "import importlib.metadata as m; print(m.version('kserve'))"], capture_output=True, text=True, timeout=120)
    print(f"kserve peer: kserve {v.stdout.strip()} in {KSERVE_VENV.relative_to(ROOT)}", flush=True)
    return py


def connections(tmp: Path, conns: list[int], duration: float, repeats: int, with_kserve: bool, install_timeout_s: float, base: Path | None = None, placement: str = "os") -> dict:
    """Closed-loop throughput / p50 / p99 / server CPU per request at each concurrency; with
    ``base`` (another checkout), its service too; servers and client on the CPUs ``placement``
    names (:data:`PLACEMENTS`)."""
    import uvloop

    from bench_serve_inproc import risk_body

    from offload.loadgen.closedloop import run_closed

    py = sys.executable
    ports = {"floor": _port(), "service": _port(), "kserve": _port(), "base": _port()}
    serve = ["serve", str(tmp / "risk"), "--device", "sim", "--max-queue-size", "4096", "--port"]
    cmds = {
        "floor": [py, "bench/_serve_baselines.py", "floor", "--port", str(ports["floor"])],
        "service": [py, "-m", "offload.cli", *serve, str(ports["service"])],
    }
    if base is not None:
        cmds["base"] = [py, "bench/_at_tree.py", str(base), *serve, str(ports["base"])]
    kpy = kserve_python(install_timeout_s) if with_kserve else None
    if kpy is not None:
        cmds["kserve"] = [str(kpy), "bench/_kserve_peer.py", str(tmp / "float.npz"), "--port", str(ports["kserve"])]
    body = risk_body()
    server_cpus, client_cpus = PLACEMENTS[placement] or (None, None)
    procs = {k: _start(c, ports[k], server_cpus) for k, c in cmds.items()}
    if client_cpus is not None:
        os.sched_setaffinity(0, client_cpus)
    runs: dict[tuple[str, int], list[dict]] = {(k, c): [] for k in cmds for c in conns}
    try:
        for k in cmds:  # warm-up: first requests pay imports, JIT and cold caches
            uvloop.run(run_closed(f"http://127.0.0.1:{ports[k]}/v2/models/risk/infer", body, connections=8, duration=1.0))
        for rep in range(repeats):
            for c in conns:
                order = list(cmds) if (rep + conns.index(c)) % 2 == 0 else list(cmds)[::-1]
                for k in order:
                    c0 = _cpu_s(procs[k].pid)
                    res = uvloop.run(run_closed(f"http://127.0.0.1:{ports[k]}/v2/models/risk/infer", body, connections=c, duration=duration))
                    c1 = _cpu_s(procs[k].pid)
                    p = res.percentiles()
                    cpu_us = (c1 - c0) / res.ok * 1e6 if c0 is not None and c1 is not None and res.ok else float("nan")
                    row = {"connections": c, "throughput": res.throughput, "p50_ms": p["p50"] / 1e3, "p99_ms": p["p99"] / 1e3, "errors": sum(res.errors.values()), "server_cpu_us_per_req": cpu_us}
                    runs[(k, c)].append(row)
                    print(f"[{rep + 1}/{repeats}] {k:8s} {c:4d} conns  {row['throughput']:7.0f} req/s  p50 {row['p50_ms']:8.3f} ms  p99 {row['p99_ms']:8.3f} ms  errors {row['errors']}  server CPU {cpu_us:6.1f} us/req", flush=True)
    finally:
        _stop(procs.values())
    res: dict = {k: {} for k in cmds}
    for (k, c), rows in runs.items():
        res[k][c] = {f: float(np.median([r[f] for r in rows])) for f in ("throughput", "p50_ms", "p99_ms", "server_cpu_us_per_req")}
        res[k][c]["errors"] = int(sum(r["errors"] for r in rows))
        res[k][c]["runs"] = rows
    names = list(cmds)
    print("\n| connections | " + " | ".join(f"{k} req/s" for k in names) + " | " + " | ".join(f"{k} p50 / p99 ms" for k in names) + " | server CPU us/req " + " / ".join(names) + " |")
    print("|---:|" + "---:|" * (2 * len(names) + 1))
    for c in conns:
        print(f"| {c} | " + " | ".join(f"{res[k][c]['throughput']:.0f}" for k in names) + " | " + " | ".join(f"{res[k][c]['p50_ms']:.2f} / {res[k][c]['p99_ms']:.2f}" for k in names)
              + " | " + " / ".join(f"{res[k][c]['server_cpu_us_per_req']:.0f}" for k in names) + " |")
    summary: dict = {}
    hi, lo = max(conns), min(conns)
    summary["service_over_floor_throughput_at_max_conns"] = r1 = res["service"][hi]["throughput"] / res["floor"][hi]["throughput"]
    summary["service_over_floor_cpu_at_min_conns"] = r2 = res["service"][lo]["server_cpu_us_per_req"] / res["floor"][lo]["server_cpu_us_per_req"]
    # On a shared machine the throughputs move with everyone else's load (each server gets what
    # CPU is left); CPU per request hardly does, and once CPU-bound a server's throughput is its
    # inverse: the capacity ratio says what the throughput ratio would be on a machine of its own.
    summary["service_over_floor_capacity_at_max_conns"] = r1c = res["floor"][hi]["server_cpu_us_per_req"] / res["service"][hi]["server_cpu_us_per_req"]
    # Paired: each sweep measures the two servers back to back at a concurrency, so a ratio taken
    # within a sweep sees one phase of the machine's load; the medians above may take the floor
    # from a calm sweep and the service from a noisy one. The median of the sweeps' ratios.
    pair_thr = [s["throughput"] / f["throughput"] for s, f in zip(runs[("service", hi)], runs[("floor", hi)])]
    pair_cpu = [s["server_cpu_us_per_req"] / f["server_cpu_us_per_req"] for s, f in zip(runs[("service", lo)], runs[("floor", lo)])]
    summary["paired_throughput_at_max_conns"] = {"median": float(np.median(pair_thr)), "sweeps": pair_thr, "met": sum(r >= 0.7 for r in pair_thr)}
    summary["paired_cpu_at_min_conns"] = {"median": float(np.median(pair_cpu)), "sweeps": pair_cpu, "met": sum(r <= 1.5 for r in pair_cpu)}
    print(f"\nservice / floor throughput at {hi} connections: {r1:.2f}x measured, {r1c:.2f}x from CPU per request (goal >= 0.7)")
    print(f"service / floor server CPU per request at {lo} connection(s): {r2:.2f}x (goal <= 1.5)")
    print(f"paired within each sweep, median [min, max]: throughput at {hi} {np.median(pair_thr):.2f}x [{min(pair_thr):.2f}, {max(pair_thr):.2f}], "
          f"goal met in {summary['paired_throughput_at_max_conns']['met']}/{len(pair_thr)} sweeps; CPU at {lo} {np.median(pair_cpu):.2f}x "
          f"[{min(pair_cpu):.2f}, {max(pair_cpu):.2f}], goal met in {summary['paired_cpu_at_min_conns']['met']}/{len(pair_cpu)} sweeps")
    if "base" in res:
        summary["service_over_base"] = _paired_over_base(runs, conns)
    if "kserve" in res:
        # Equal p99: KServe at its best throughput, against the service's best at a p99 no higher.
        kc = max(conns, key=lambda c: res["kserve"][c]["throughput"])
        kb = res["kserve"][kc]
        ok = [res["service"][c]["throughput"] for c in conns if res["service"][c]["p99_ms"] <= kb["p99_ms"] and not res["service"][c]["errors"]]
        sb = max(ok, default=0.0)
        summary["kserve_best"] = {"connections": kc, **{f: kb[f] for f in ("throughput", "p99_ms")}}
        summary["service_over_kserve_at_equal_p99"] = r3 = sb / kb["throughput"]
        summary["kserve_over_service_cpu_per_req"] = {c: res["kserve"][c]["server_cpu_us_per_req"] / res["service"][c]["server_cpu_us_per_req"] for c in conns}
        print(f"KServe (1 worker) at its best: {kb['throughput']:.0f} req/s at {kc} connections, p99 {kb['p99_ms']:.2f} ms; "
              f"service's best with p99 <= that: {sb:.0f} req/s: {r3:.2f}x (goal >= 8)")
        print("KServe / service server CPU per request: " + ", ".join(f"{v:.1f}x at {c}" for c, v in summary["kserve_over_service_cpu_per_req"].items()))
    return {"results": res, "summary": summary, "placement": placement}


def _paired_over_base(runs: dict, conns: list[int]) -> dict:
    """This checkout's service over the base revision's, each sweep's ratio (both measured back to
    back in it): CPU per request and throughput at each concurrency."""
    out = {}
    for c in conns:
        cpu = [s["server_cpu_us_per_req"] / b["server_cpu_us_per_req"] for s, b in zip(runs[("service", c)], runs[("base", c)])]
        thr = [s["throughput"] / b["throughput"] for s, b in zip(runs[("service", c)], runs[("base", c)])]
        out[c] = {"cpu_median": float(np.median(cpu)), "cpu_sweeps_below": sum(r < 1 for r in cpu), "throughput_median": float(np.median(thr)), "sweeps": len(cpu)}
        print(f"service / base at {c} connection(s), paired: CPU per request {np.median(cpu):.3f}x (below 1 in {out[c]['cpu_sweeps_below']}/{len(cpu)} sweeps), "
              f"throughput {np.median(thr):.3f}x")
    return out


def _sustained(rows: list[dict], rate: float) -> bool:
    r = next(x for x in rows if x["rate"] == rate)
    return not r["errors"] and r["throughput"] >= 0.97 * rate


def protocols(bundle: Path, rounds: int, per_round: int, base: Path | None = None) -> dict:
    """gRPC vs REST binary, batch 1, closed loop (one request in flight), interleaved rounds;
    with ``base`` (another checkout), its service too, from the tuned client process."""
    if "GRPC_EXPERIMENTS" in os.environ:
        print(f"note: GRPC_EXPERIMENTS={os.environ['GRPC_EXPERIMENTS']} is set: the gRPC rows without _proc2 do not use grpc core's defaults")
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp

    from _client import inputs  # bench/ is on the path: this script lives there

    port, gport, fport, fgport = _port(), _port(), _port(), _port()
    aport, agport, faport, fhport = _port(), _port(), _port(), _port()
    with contextlib.ExitStack() as stack:
        servers: list[subprocess.Popen] = []
        stack.callback(_stop, servers)  # every server started, however the bench ends
        proc = _start([sys.executable, "-m", "offload.cli", "serve", str(bundle), "--port", str(port), "--grpc-port", str(gport), "--device", "sim"], port)
        servers.append(proc)
        aio = _start([sys.executable, "-m", "offload.cli", "serve", str(bundle), "--port", str(aport), "--grpc-port", str(agport), "--grpc-server", "grpcio", "--device", "sim"], aport)
        servers.append(aio)
        floor = _start([sys.executable, "bench/_serve_baselines.py", "floor", "--port", str(fport), "--grpc-port", str(fgport), "--grpcio-port", str(faport), "--h2-port", str(fhport)], fport)
        servers.append(floor)
        base_targets: list[str] = []
        if base is not None:
            bport, bgport = _port(), _port()
            based = _start([sys.executable, "bench/_at_tree.py", str(base), "serve", str(bundle), "--port", str(bport), "--grpc-port", str(bgport), "--device", "sim"], bport)
            servers.append(based)
            base_targets = [f"grpc_base=grpc://127.0.0.1:{bgport}", f"rest_binary_base=http://127.0.0.1:{bport}"]
        gc_, hc = tgrpc.InferenceServerClient(f"127.0.0.1:{gport}"), thttp.InferenceServerClient(f"127.0.0.1:{port}")
        fgc, fhc = tgrpc.InferenceServerClient(f"127.0.0.1:{fgport}"), thttp.InferenceServerClient(f"127.0.0.1:{fport}")
        agc, fagc = tgrpc.InferenceServerClient(f"127.0.0.1:{agport}"), tgrpc.InferenceServerClient(f"127.0.0.1:{faport}")
        fh2c = tgrpc.InferenceServerClient(f"127.0.0.1:{fhport}")
        for c in (gc_, hc, fgc, fhc, agc, fagc, fh2c):
            stack.callback(c.close)
        # The same stock clients in a second process with grpc core's EventEngine client off
        # (TUNED_CLIENT_EXPERIMENTS): its gRPC calls' own thread reads the socket. Its REST rows are
        # the control: the same process, only the gRPC setting differs from this one's.
        tuned = subprocess.Popen(
            [sys.executable, "bench/_client.py", f"grpc=grpc://127.0.0.1:{gport}", f"rest_binary=http://127.0.0.1:{port}", f"grpc_floor=grpc://127.0.0.1:{fgport}", f"rest_floor=http://127.0.0.1:{fport}", *base_targets, "--per-round", str(per_round)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "GRPC_EXPERIMENTS": TUNED_CLIENT_EXPERIMENTS},
        )  # fmt: skip
        stack.callback(_end_child, tuned)
        if tuned.stdout.readline().strip() != "ready":
            raise RuntimeError("bench/_client.py did not start")
        g_in, h_in, h_out = inputs(per_round)  # the second process builds the same

        def local(call):
            def one_round() -> tuple[list[float], float]:
                lat, c0 = [], time.process_time()
                for i in range(per_round):
                    t = time.perf_counter()
                    call(i)
                    lat.append(time.perf_counter() - t)
                return lat, time.process_time() - c0

            return one_round

        def remote(target: str):
            def one_round() -> tuple[list[float], float]:
                tuned.stdin.write(target + "\n")
                tuned.stdin.flush()
                got = json.loads(tuned.stdout.readline())
                return got["lat"], got["cpu_s"]

            return one_round

        calls = {
            "grpc": lambda i: gc_.infer("risk", g_in[i]),
            "rest_binary": lambda i: hc.infer("risk", h_in[i], outputs=h_out),
            "grpc_grpcio": lambda i: agc.infer("risk", g_in[i]),
            # The same clients against constant answers on the same stacks: each stack's floor.
            "grpc_floor": lambda i: fgc.infer("risk", g_in[i]),
            "rest_floor": lambda i: fhc.infer("risk", h_in[i]),
            "grpcio_floor": lambda i: fagc.infer("risk", g_in[i]),
            "h2_floor": lambda i: fh2c.infer("risk", g_in[i]),
        }
        rows = {k: local(f) for k, f in calls.items()}
        for k in ("grpc", "rest_binary", "grpc_floor", "rest_floor"):
            rows[f"{k}_proc2"] = remote(k)
        pid = {"grpc": proc.pid, "rest_binary": proc.pid, "grpc_grpcio": aio.pid, "grpc_floor": floor.pid, "rest_floor": floor.pid, "grpcio_floor": floor.pid, "h2_floor": floor.pid}
        pid |= {f"{k}_proc2": pid[k] for k in ("grpc", "rest_binary", "grpc_floor", "rest_floor")}
        if base is not None:
            for k in ("grpc_base", "rest_binary_base"):
                rows[f"{k}_proc2"] = remote(k)
                pid[f"{k}_proc2"] = based.pid
        lat: dict[str, list[float]] = {k: [] for k in rows}
        cpu: dict[str, float] = {k: 0.0 for k in rows}
        ccpu: dict[str, float] = {k: 0.0 for k in rows}  # the client's own process: its cost
        round_p50: dict[str, list[float]] = {k: [] for k in rows}
        for one_round in rows.values():  # warm-up: connections, first-call paths
            one_round()
        for r in range(rounds):
            for k in list(rows)[:: 1 if r % 2 == 0 else -1]:
                c0 = _cpu_s(pid[k])
                one, client_s = rows[k]()
                ccpu[k] += client_s
                cpu[k] += (_cpu_s(pid[k]) or 0.0) - (c0 or 0.0)
                lat[k] += one
                round_p50[k].append(float(np.median(one)) * 1e6)
    out = {}
    for k in rows:
        a = np.array(lat[k]) * 1e6
        out[k] = {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)), "server_cpu_us_per_req": cpu[k] / len(a) * 1e6, "client_cpu_us_per_req": ccpu[k] / len(a) * 1e6, "round_p50_us": round_p50[k]}
    wins = sum(g <= r for g, r in zip(round_p50["grpc"], round_p50["rest_binary"]))
    out["grpc_over_rest_p50"] = out["grpc"]["p50_us"] / out["rest_binary"]["p50_us"]
    out["rounds_grpc_p50_at_or_below_rest"] = f"{wins}/{rounds}"
    print(f"\nbatch 1, one request in flight, {rounds} interleaved rounds x {per_round} requests per protocol")
    print("| protocol | p50 us | p99 us | server CPU us/req | client CPU us/req |\n|---|---:|---:|---:|---:|")
    for k in rows:
        print(f"| {k} | {out[k]['p50_us']:.0f} | {out[k]['p99_us']:.0f} | {out[k]['server_cpu_us_per_req']:.0f} | {out[k]['client_cpu_us_per_req']:.0f} |")
    out["grpc_floor_over_rest_floor_p50"] = out["grpc_floor"]["p50_us"] / out["rest_floor"]["p50_us"]
    out["grpcio_over_rest_p50"] = out["grpc_grpcio"]["p50_us"] / out["rest_binary"]["p50_us"]
    # Paired: each round's ratio (both rows saw that round's phase of the machine's load).
    paired = sorted(g / r for g, r in zip(round_p50["grpc"], round_p50["rest_binary"]))
    out["grpc_over_rest_p50_paired"] = float(np.median(paired))
    print(f"gRPC p50 / REST binary p50: {out['grpc_over_rest_p50']:.2f}x over all rounds, {out['grpc_over_rest_p50_paired']:.2f}x the median of rounds' ratios ({paired[0]:.2f}-{paired[-1]:.2f}) (goal <= 1); gRPC at or below REST in {wins}/{rounds} rounds")
    # The second client process: gRPC with the EventEngine client off against REST in that process.
    tuned = sorted(g / r for g, r in zip(round_p50["grpc_proc2"], round_p50["rest_binary_proc2"]))
    twins = sum(g <= r for g, r in zip(round_p50["grpc_proc2"], round_p50["rest_binary_proc2"]))
    out["grpc_over_rest_p50_proc2"] = out["grpc_proc2"]["p50_us"] / out["rest_binary_proc2"]["p50_us"]
    out["grpc_over_rest_p50_proc2_paired"] = float(np.median(tuned))
    out["rounds_grpc_p50_at_or_below_rest_proc2"] = f"{twins}/{rounds}"
    print(f"second client process (GRPC_EXPERIMENTS={TUNED_CLIENT_EXPERIMENTS}): gRPC p50 / REST binary p50 {out['grpc_over_rest_p50_proc2']:.2f}x over all rounds, "
          f"{out['grpc_over_rest_p50_proc2_paired']:.2f}x the median of rounds' ratios ({tuned[0]:.2f}-{tuned[-1]:.2f}); at or below REST in {twins}/{rounds} rounds; "
          f"its gRPC against this process's REST: {out['grpc_proc2']['p50_us'] / out['rest_binary']['p50_us']:.2f}x")
    print(f"the same service on grpc.aio (--grpc-server grpcio): {out['grpcio_over_rest_p50']:.2f}x REST binary p50")
    print(f"floors (constant answers, same stacks and clients): gRPC / REST p50 {out['grpc_floor_over_rest_floor_p50']:.2f}x")
    # One request in flight: the client's own CPU is on the critical path of every call. Against
    # the floors it is the stock client's cost alone, which no server can take away.
    gc_cpu, hc_cpu = out["grpc_floor"]["client_cpu_us_per_req"], out["rest_floor"]["client_cpu_us_per_req"]
    tc_cpu, thc_cpu = out["grpc_floor_proc2"]["client_cpu_us_per_req"], out["rest_floor_proc2"]["client_cpu_us_per_req"]
    out["client_cpu_grpc_minus_rest_us"] = gc_cpu - hc_cpu
    out["client_cpu_grpc_minus_rest_us_proc2"] = tc_cpu - thc_cpu
    print(f"clients' own CPU per call against the floors: tritonclient.grpc {gc_cpu:.0f} us, tritonclient.http {hc_cpu:.0f} us ({gc_cpu - hc_cpu:+.0f} us for gRPC); "
          f"second process: {tc_cpu:.0f} and {thc_cpu:.0f} us ({tc_cpu - thc_cpu:+.0f} us for gRPC)")
    if base is not None:
        for k in ("grpc", "rest_binary"):
            new, old = round_p50[f"{k}_proc2"], round_p50[f"{k}_base_proc2"]
            paired = [n / o for n, o in zip(new, old)]
            out[f"{k}_over_base_p50_paired"] = float(np.median(paired))
            out[f"{k}_over_base_cpu"] = out[f"{k}_proc2"]["server_cpu_us_per_req"] / out[f"{k}_base_proc2"]["server_cpu_us_per_req"]
            print(f"{k} (second process) / the base revision's: p50 {np.median(paired):.3f}x paired (below 1 in {sum(r < 1 for r in paired)}/{rounds} rounds), "
                  f"server CPU {out[f'{k}_over_base_cpu']:.3f}x over all rounds")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="1000,2000,3000,4000,5000,6000")
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=3, help="sweeps; each cell reports the median")
    ap.add_argument("--protocols", action="store_true", help="gRPC vs REST binary p50 at batch 1 instead of the rate sweep")
    ap.add_argument("--rounds", type=int, default=20, help="--protocols: interleaved rounds")
    ap.add_argument("--per-round", type=int, default=250, help="--protocols: requests per protocol per round")
    ap.add_argument("--connections", default=None, help="closed loop at these concurrencies (e.g. 1,8,64) instead of the rate sweep")
    ap.add_argument("--kserve", action="store_true", help="--connections: add KServe's ModelServer as a peer (own venv, see above)")
    ap.add_argument("--kserve-install-timeout", type=float, default=900.0, help="seconds pip may take to install kserve")
    ap.add_argument("--placement", choices=sorted(PLACEMENTS), default="os",
                    help="--connections: servers and client on CPUs the scheduler picks (os), all on CPU 0 (same), or servers on 0 and client on 1 (split)")
    ap.add_argument("--base", default=None, metavar="REV", help="--connections / --protocols: also the service at git revision REV (see above)")
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
    base = None
    if a.base is not None:
        from _at_tree import add_worktree, remove_worktree  # bench/ is on the path: this script lives there

        base = add_worktree(a.base, tmp / "base")
        atexit.register(remove_worktree, base)
    if a.protocols:
        res = protocols(tmp / "risk", a.rounds, a.per_round, base)
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=2) + "\n")
        return
    # The naive server's float model: the same training (same seed) as the bundle's, saved as npz.
    x, y = make_transactions(20000, 0)
    model = train_float_model(x, y, seed=0)
    np.savez(tmp / "float.npz", **{k: v.detach().numpy() for k, v in model.state_dict().items()})
    if a.connections:
        out = connections(tmp, [int(c) for c in a.connections.split(",")], a.duration, a.repeats, a.kserve, a.kserve_install_timeout, base, a.placement)
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
        return

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
        _stop(procs.values())
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
