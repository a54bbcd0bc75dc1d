"""Demo section: the risk model as a live scoring service, scored by a stock Triton client, under load."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import tritonclient.http as tc
from rich import box
from rich.console import Console
from rich.table import Table

from offload.examples.risk import build_risk_bundle, make_transactions
from offload.host import open_device
from offload.loadgen.openloop import run_load, write_report

__all__ = ["serve_demo_section"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_demo_section(console=None, *, rate: float = 300.0, duration: float = 3.0) -> bool:
    """Builds the risk bundle, serves it on the sim device, scores a few transactions with
    ``tritonclient.http``, runs a short open-loop load and stops the service with SIGTERM.

    Returns False when a served score differs from the sim device's own, a request fails, or the
    service does not shut down cleanly. Usable as an ``offload demo`` section (``console`` is a
    rich Console; one is made when omitted).
    """

    console = console or Console()
    console.rule("[bold]Scoring service: the risk MLP over KServe/Triton OIP v2")
    work = Path(tempfile.mkdtemp(prefix="offload-demo-serve-"))
    with console.status("training the risk MLP and writing its bundle"):
        b = build_risk_bundle(work / "risk")
    console.print(f"bundle [bold]{b.name}[/]: {len(b.meta['features'])} features, AUC float {b.meta['auc_float']:.4f}, quantized {b.meta['auc_quantized']:.4f}")

    port = _port()
    url = f"127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "offload.cli", "serve", str(work / "risk"), "--port", str(port), "--device", "sim"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ok = True
    try:
        end = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                console.print(f"[red]service exited: {proc.stderr.read().decode()[-1000:]}")
                return False
            try:
                if httpx.get(f"http://{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > end:
                console.print("[red]service did not become ready")
                return False
            time.sleep(0.1)
        console.print(f"[dim]$ offload serve {work / 'risk'} --port {port} --device sim[/]")

        x = make_transactions(5, seed=42)[0]
        client = tc.InferenceServerClient(url)
        inp = tc.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer("risk", [inp]).as_numpy("y")
        client.close()
        dev = open_device("sim")
        want = dev.run(dev.load(next(iter(b.kernels.values()))), {"x": x.astype(np.float64)})["y"].astype(np.float32)
        dev.close()
        names = b.meta["features"]
        show = ["amount", "merchant_risk", "foreign", "new_device", "txn_1h"]
        table = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, title="tritonclient.http -> /v2/models/risk/infer")
        for c in [*show, "score (service)", "score (sim device)"]:
            table.add_column(c, justify="right")
        for i in range(len(x)):
            table.add_row(*[f"{x[i, names.index(c)]:.2f}" for c in show], f"{got[i, 0]:.6f}", f"{want[i, 0]:.6f}")
        console.print(table)
        same = bool(np.array_equal(got, want))
        ok &= same
        console.print(f"[{'green' if same else 'red'}]{'bit-identical' if same else 'MISMATCH'}[/] to the sim device's own scores")

        console.print(f"[dim]$ offload bench http://{url}/v2/models/risk --rate {rate:g} --duration {duration:g}[/]")
        res = asyncio.run(run_load(f"http://{url}/v2/models/risk", rate, duration))
        write_report(res, work / "load.json", work / "load.png")
        console.print(res.summary())
        console.print(f"latency plot: {work / 'load.png'}  (JSON with the HDR histogram: {work / 'load.json'})")
        ok &= res.ok == res.sent
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = None
    console.print(f"service stopped with SIGTERM: exit status {code}")
    return ok and code == 0
