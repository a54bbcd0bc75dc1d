"""Machine instructions per request of the scoring service's ASGI app, counted by callgrind.

On 2 shared cores, wall and CPU times of one server move by 10-30% from run to run; instruction
counts do not (the same interpreter, inputs and hash seed give the same count to within a few
hundred per request). This drives the app in-process as ``bench_serve_inproc.py`` does (batch-1
JSON requests, ``--conc`` at a time, each in its own task as uvicorn runs them), once for the
service on the sim device and once for the constant-answer floor app of ``_serve_baselines.py``,
each under ``valgrind --tool=callgrind`` with collection on only inside the measured rounds
(``--toggle-collect`` on a function only the measured phase calls). The floor's count is what the
harness itself and a minimal app cost; the difference is the service's own work per request.
Counts are not cycles: cache misses, which dominate a real server at one connection, are not in
them. Use them to compare two versions of the code, and ``bench_serve.py`` for what a server does.

    .venv/bin/python bench/bench_serve_instr.py [--conc 1,64] [--rounds 400,10] [--base REV]

``--cold MB`` counts instead where a lone request's cache lines come from when its caches start
empty, as at one connection in a server: MB of memory are read before each request, outside the
counted region, under callgrind's cache simulation (``--cache-sim=yes``); the result is the first-level
misses a request (instruction reads, data reads and writes: lines brought back), the service's
against the floor app's, and the functions with the most lines over the floor's. Callgrind's
last-level model is not this machine's, so only first-level misses are reported.

    .venv/bin/python bench/bench_serve_instr.py --cold 40 [--rounds 100]

``--base REV`` counts the service at git revision REV too (a temporary worktree, imported with this
environment's packages as ``_at_tree.py`` does): what a change did, in instructions.

``--protocol rest-binary`` sends the batch-1 request as a binary tensor instead of JSON, as
``tritonclient.http`` does with ``binary_data=True``, and asks for a binary answer.

``--protocol grpc`` counts batch-1 binary ModelInfer RPCs over the lean gRPC server instead, one in
flight: the service's server and the constant-answer gRPC floor of ``_serve_baselines.py``, each a
connection on a stand-in transport fed by an ``h2`` client. Only the server's side is counted, from
its read of a request to its answer's last frame (with the child's ``run_until_complete`` around
it, the same on both sides), so the client costs nothing here; the floor is then the lean transport
and a constant handler. With ``--cold`` it counts their lines the same way.
``--base`` needs a base from the commit that added this on (``GrpcServer.connection``).

    .venv/bin/python bench/bench_serve_instr.py --protocol grpc --conc 1 [--rounds 200] [--cold 40]

Needs valgrind (Debian: ``apt-get install valgrind``); about a minute per count, and about two more
for each tree whose kernel numba has not yet compiled under valgrind (see ``_warm``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_TOGGLE = "dropwhile_next"  # itertools.dropwhile's step: called by the measured phase alone


def _child(kind: str, bundle: str, conc: int, rounds: int, tree: str | None = None) -> None:
    import uvloop

    if kind.startswith("grpc-"):
        _child_grpc(kind, bundle, rounds, 0, tree)
        return
    svc, app, (scope, receive, send, statuses) = _app(kind, bundle, tree)

    async def go(n: int) -> bool:
        if svc is not None:
            svc.batcher._stopping = False
            await svc.batcher.start()
        loop = asyncio.get_running_loop()
        for _ in range(n):
            await asyncio.gather(*[loop.create_task(app(scope, receive, send)) for _ in range(conc)])
        if svc is not None:
            await svc.batcher.stop()
        return False

    warm = max(2, 600 // conc)  # JIT, caches, first-call paths; the batcher's lonely state
    uvloop.run(go(warm))
    uvloop.run(go(warm))
    list(itertools.dropwhile(lambda _: uvloop.run(go(rounds)), [0]))
    if set(statuses) != {200}:
        raise SystemExit(f"the app answered {sorted(set(statuses))}, not only 200")


def _child_cold(kind: str, bundle: str, rounds: int, sweep_mb: int) -> None:
    """``rounds`` lone requests, each counted on its own, ``sweep_mb`` MB read before each."""
    import numpy as np
    import uvloop

    if kind.startswith("grpc-"):
        _child_grpc(kind, bundle, rounds, sweep_mb, None)
        return
    svc, app, (scope, receive, send, statuses) = _app(kind, bundle, None)
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    if svc is not None:
        loop.run_until_complete(svc.batcher.start())
    for _ in range(600):  # JIT, first-call paths; the batcher's lonely state
        loop.run_until_complete(app(scope, receive, send))
    lines = np.ones(sweep_mb << 20, dtype=np.uint8)[::64]  # one byte a cache line
    for _ in range(rounds):
        lines.sum()
        list(itertools.dropwhile(lambda _: loop.run_until_complete(app(scope, receive, send)), [0]))
    if set(statuses) != {200}:
        raise SystemExit(f"the app answered {sorted(set(statuses))}, not only 200")


def _child_grpc(kind: str, bundle: str, rounds: int, sweep_mb: int, tree: str | None) -> None:
    """``rounds`` lone gRPC requests, each counted on its own from the server's read of it to its
    answer's last frame, with ``sweep_mb`` MB read before each (0: none)."""
    import numpy as np
    import uvloop

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    svc, serve, one, statuses = loop.run_until_complete(_grpc(kind, bundle, tree))
    if svc is not None:
        loop.run_until_complete(svc.batcher.start())
    for _ in range(600):  # JIT, caches, first-call paths; the batcher's lonely state
        loop.run_until_complete(serve(one()))
    lines = np.ones(sweep_mb << 20, dtype=np.uint8)[::64] if sweep_mb else None  # one byte a cache line
    for _ in range(rounds):
        data = one()
        if lines is not None:
            lines.sum()
        list(itertools.dropwhile(lambda _: loop.run_until_complete(serve(data)), [0]))
    one()  # reads the last answer
    if len(statuses) != 600 + rounds or set(statuses) != {b"0"}:
        raise SystemExit(f"{len(statuses)} answers for {600 + rounds} RPCs, grpc-status {sorted(set(statuses))}, not only 0")


def _import_from(tree: str | None) -> None:
    """The offload packages from checkout ``tree`` (None: this one), before anything imports them."""
    if tree is not None:
        from _at_tree import TreeFinder  # bench/ is on the path: this script lives there

        sys.meta_path.insert(0, TreeFinder(Path(tree)))


def _app(kind: str, bundle: str, tree: str | None):
    """(service or None, its ASGI app or the floor app, asgi_infer's request and answers); a
    ``binary-`` kind's request is a binary tensor as ``tritonclient.http`` sends it, its answer
    asked for as one too."""
    _import_from(tree)
    import numpy as np
    import orjson

    values = [0.1 * i + 0.123 for i in range(16)]
    # The headers uvicorn hands the app for bench_serve.py's load tool.
    headers = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json")]
    if kind.startswith("binary-"):
        import tritonclient.http as thttp

        kind = kind.removeprefix("binary-")
        tensor = thttp.InferInput("x", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.array([values], dtype=np.float32), binary_data=True)
        body, json_size = thttp.InferenceServerClient.generate_request_body([tensor], outputs=[thttp.InferRequestedOutput("y", binary_data=True)])
        headers = [(b"host", b"127.0.0.1:8000"), (b"inference-header-content-length", str(json_size).encode())]
    else:
        body = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": values}]})
    svc = None
    if kind == "service":
        import offload
        from offload.serve.app import ScoringService
        from offload.serve.config import ServeConfig

        svc = ScoringService(offload.load(bundle), ServeConfig(device="sim"))
        app = svc.app
        svc._started = True  # the batcher is started on each round's loop below
    else:
        from _serve_baselines import floor_app  # bench/ is on the path: this script lives there

        app = floor_app()
    from bench_serve_inproc import asgi_infer

    return svc, app, asgi_infer(body, headers)


async def _grpc(kind: str, bundle: str, tree: str | None):
    """``(service or None, serve, one, statuses)`` for ``grpc-service`` and ``grpc-floor``: a
    connection of the lean gRPC server (the service's, as ``offload serve --grpc-port`` makes it,
    or ``_serve_baselines.py``'s constant ModelInfer) on a stand-in transport, made on the running
    loop (its timers need one), and an ``h2`` client that speaks to it as grpc core's does (the
    same request headers; window updates and settings acknowledgements go with the next request).

    ``one()`` reads the previous answer (its grpc-status to ``statuses``) and makes the bytes of a
    batch-1 ModelInfer request (raw FP32 contents, as ``tritonclient.grpc`` sends them);
    ``await serve(data)`` is the server's read of them and the loop's passes until the answer's
    last frame is written: a lone request is answered inside the read, but every few a batcher's
    leader takes a pass (``batcher._PROBE_EVERY``)."""
    _import_from(tree)
    import h2.config
    import h2.connection
    import h2.events
    import numpy as np

    from offload.serve.grpc_server import GrpcServer
    from offload.serve.http2 import Http2Limits
    from offload.serve.oip_grpc import SERVICE
    from offload.serve.proto import grpc_predict_v2_pb2 as pb

    svc = None
    if kind == "grpc-service":
        import offload
        from offload.serve.app import ScoringService
        from offload.serve.config import ServeConfig
        from offload.serve.oip_grpc import GrpcEndpoint

        svc = ScoringService(offload.load(bundle), ServeConfig(device="sim"))
        svc._started = True  # the batcher is started on the child's loop
        server = GrpcEndpoint(svc, "127.0.0.1", 0).server
    else:
        from _serve_baselines import grpc_floor_methods  # bench/ is on the path: this script lives there

        server = GrpcServer(grpc_floor_methods()[0], Http2Limits(), max_rpcs=1024)
    written: list[bytes] = []
    ended = [0]  # streams the server has ended (HEADERS or DATA frames with END_STREAM)

    class _Transport:  # what Http2Connection calls on a healthy connection
        def write(self, data: bytes) -> None:
            written.append(data)
            i = 0
            while i < len(data):
                if data[i + 3] in (0, 1) and data[i + 4] & 1:
                    ended[0] += 1
                i += 9 + int.from_bytes(data[i : i + 3], "big")

        def get_extra_info(self, name, default=None):
            return default

    conn = server.connection()
    conn.connection_made(_Transport())
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    x = np.array([0.1 * i + 0.123 for i in range(16)], dtype=np.float32)
    req = pb.ModelInferRequest(model_name="risk", inputs=[pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 16])], raw_input_contents=[x.tobytes()])
    msg = req.SerializeToString()
    msg = b"\0" + len(msg).to_bytes(4, "big") + msg
    head = [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", f"/{SERVICE}/ModelInfer".encode()), (b":authority", b"127.0.0.1:8001"),
        (b"te", b"trailers"), (b"content-type", b"application/grpc"), (b"user-agent", b"grpc-python/1.85.1 grpc-c/51.0.0 (linux; chttp2)"),
        (b"grpc-accept-encoding", b"identity, deflate, gzip"),
    ]  # fmt: skip
    statuses: list[bytes] = []

    def one() -> bytes:
        for ev in client.receive_data(b"".join(written)):
            if isinstance(ev, h2.events.TrailersReceived):
                statuses.append(dict(ev.headers).get(b"grpc-status", b"?"))
            elif isinstance(ev, h2.events.DataReceived):
                client.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        written.clear()
        sid = client.get_next_available_stream_id()
        client.send_headers(sid, head)
        client.send_data(sid, msg, end_stream=True)
        return client.data_to_send()

    async def serve(data: bytes) -> None:
        n = ended[0]
        conn.data_received(data)
        while ended[0] == n:
            await asyncio.sleep(0)

    return svc, serve, one, statuses


def _child_env() -> dict[str, str]:
    """The children's environment: a fixed hash seed (the same dict layouts, so the same counts) and one BLAS thread."""
    return {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}


def _warm(child: list[str]) -> None:
    """One round of the service's ``child`` under ``valgrind --tool=none``, so that numba's disk
    cache beside that tree's kernel holds the code callgrind will run before it is counted.

    Under valgrind LLVM sees another CPU (``haswell`` and its features on this machine's ``znver3``),
    and numba keys its cache by CPU: a cache filled outside valgrind misses there. A kernel then
    compiled under callgrind takes many minutes (a fresh ``--base`` worktree, or a kernel edited
    since its last count); under ``--tool=none``, about two."""
    env = _child_env()
    r = subprocess.run(["valgrind", "--tool=none", "-q", sys.executable, __file__, *child], capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(child[:2])} failed ({r.returncode}): {r.stderr[-2000:]}")


def _count(kind: str, bundle: str, conc: int, rounds: int, tmp: Path, tree: Path | None = None) -> float:
    out = tmp / f"cg.{kind}.{conc}.{'base' if tree else 'this'}.out"
    env = _child_env()
    cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--toggle-collect={_TOGGLE}", f"--callgrind-out-file={out}",
           sys.executable, __file__, "--child", kind, bundle, str(conc), str(rounds), *([str(tree)] if tree else [])]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"{kind} under callgrind failed ({r.returncode}): {r.stderr[-2000:]}")
    totals = [line for line in out.read_text().splitlines() if line.startswith("totals:")]
    return int(totals[0].split()[1]) / (rounds * conc)


def _lines_cold(kind: str, bundle: str, rounds: int, sweep_mb: int, tmp: Path) -> dict[str, float]:
    """First-level misses a request (I1mr + D1mr + D1mw) by function, and in all ("")."""
    out = tmp / f"cg.cold.{kind}.out"
    env = _child_env()
    cmd = ["valgrind", "--tool=callgrind", "--cache-sim=yes", "--collect-atstart=no", f"--toggle-collect={_TOGGLE}", f"--callgrind-out-file={out}",
           sys.executable, __file__, "--child-cold", kind, bundle, str(rounds), str(sweep_mb)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"{kind} under callgrind failed ({r.returncode}): {r.stderr[-2000:]}")
    ann = subprocess.run(["callgrind_annotate", "--show=I1mr,D1mr,D1mw", "--threshold=100", "--inclusive=no", str(out)], capture_output=True, text=True, check=True).stdout
    per: dict[str, float] = {}
    for line in ann.splitlines():
        cells = re.sub(r"\(\s*[\d.]+%\)", "", line).split(None, 3)  # the counts without their percentages
        if len(cells) < 4 or not all(c.replace(",", "").isdigit() or c == "." for c in cells[:3]):
            continue
        n = sum(int(c.replace(",", "")) for c in cells[:3] if c != ".")
        name = "" if "PROGRAM TOTALS" in cells[3] else re.sub(r"'\d+|\s*\[.*\]$", "", cells[3].split(":", 1)[-1]).strip()
        per[name] = per.get(name, 0.0) + n / rounds
    return per


def _cold(bundle: str, rounds: int, sweep_mb: int, tmp: Path, proto: str) -> None:
    _warm(["--child-cold", f"{proto}service", bundle, "1", "1"])
    floor, service = (_lines_cold(f"{proto}{k}", bundle, rounds, sweep_mb, tmp) for k in ("floor", "service"))
    print(f"first-level misses a lone request, {sweep_mb} MB read before each: floor app {floor['']:,.0f}, service {service['']:,.0f} ({service[''] - floor['']:+,.0f})")
    extra = sorted(((service.get(n, 0.0) - floor.get(n, 0.0), n) for n in set(service) | set(floor) if n), reverse=True)
    print("| function | service | floor app | lines over the floor's |\n|---|---:|---:|---:|")
    for d, n in extra[:20]:
        print(f"| `{n}` | {service.get(n, 0.0):,.0f} | {floor.get(n, 0.0):,.0f} | {d:+,.0f} |")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), *sys.argv[6:7])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child-cold":
        _child_cold(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conc", default="1,64", help="requests in flight, comma-separated")
    ap.add_argument("--rounds", default="400,10", help="measured rounds for each --conc")
    ap.add_argument("--base", default=None, metavar="REV", help="also count the service at git revision REV")
    ap.add_argument("--cold", type=int, default=0, metavar="MB", help="count lone requests' first-level misses, MB read before each (see above)")
    ap.add_argument("--protocol", choices=["rest", "rest-binary", "grpc"], default="rest", help="JSON over HTTP/1.1 (the ASGI app), binary tensors over it, or binary gRPC (the lean server); gRPC: --conc 1 only")
    a = ap.parse_args()
    proto = {"rest": "", "rest-binary": "binary-", "grpc": "grpc-"}[a.protocol]
    if proto == "grpc-" and a.conc != "1":
        ap.error("--protocol grpc counts lone requests: --conc 1")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    from _at_tree import add_worktree, remove_worktree  # bench/ is on the path: this script lives there

    from offload.examples.risk import build_risk_bundle

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        build_risk_bundle(tmp / "risk")
        if a.cold:
            _cold(str(tmp / "risk"), int(a.rounds.split(",")[0]), a.cold, tmp, proto)
            return
        base = add_worktree(a.base, tmp / "base") if a.base is not None else None
        try:
            for tree in [None] + ([base] if base else []):
                _warm(["--child", f"{proto}service", str(tmp / "risk"), "1", "1", *([str(tree)] if tree else [])])
            print("| requests in flight | floor instructions/req | service instructions/req | service's own (difference) |" + (f" service at {a.base} | this / base, service's own |" if base else ""))
            print("|---:|---:|---:|---:|" + ("---:|---:|" if base else ""))
            for conc, rounds in zip((int(c) for c in a.conc.split(",")), (int(r) for r in a.rounds.split(","))):
                floor = _count(f"{proto}floor", str(tmp / "risk"), conc, rounds, tmp)
                service = _count(f"{proto}service", str(tmp / "risk"), conc, rounds, tmp)
                row = f"| {conc} | {floor:,.0f} | {service:,.0f} | {service - floor:,.0f} |"
                if base is not None:
                    was = _count(f"{proto}service", str(tmp / "risk"), conc, rounds, tmp, base)
                    row += f" {was:,.0f} | {(service - floor) / (was - floor):.3f} |"
                print(row, flush=True)
        finally:
            if base is not None:
                remove_worktree(base)


if __name__ == "__main__":
    main()
