"""The service as users run it: `offload example risk`, then `offload serve` in a real subprocess,
scored by a stock Triton client; SIGTERM drains queued requests before the process exits."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from offload.examples.risk import FEATURES, make_transactions
from offload.quant.metrics import auc

tritonhttp = pytest.importorskip("tritonclient.http")
OFFLOAD = [sys.executable, "-m", "offload.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server did not become ready")


@pytest.fixture(scope="module")
def cli_bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ex") / "risk"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([*OFFLOAD, "example", "risk", str(out)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "AUC float" in r.stdout
    return out


def test_auc_matches_pairwise_definition():
    rng = np.random.default_rng(0)
    y = rng.random(300) < 0.3
    s = rng.integers(0, 20, 300).astype(float)  # many ties, as quantized scores have
    pos, neg = s[y], s[~y]
    pairwise = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (len(pos) * len(neg))
    assert auc(y, s) == pytest.approx(pairwise, abs=1e-12)


def test_example_bundle_meta_is_what_the_sim_device_scores(cli_bundle):
    from offload.host import open_device
    from offload.host.bundle import load

    b = load(cli_bundle)
    m = b.meta
    assert b.name == "risk" and m["model"] == "risk" and m["features"] == list(FEATURES)
    # Recompute the quantized AUC through the device path the service uses: meta must not flatter.
    x, y = make_transactions(m["n_train"] + m["n_test"], m["seed"])
    dev = open_device("sim")
    h = dev.load(next(iter(b.kernels.values())))
    s = dev.run(h, {"x": x[m["n_train"] :].astype(np.float64)})["y"]
    assert auc(y[m["n_train"] :], s) == m["auc_quantized"]
    # The label is a noisy function of the features: chance is 0.5; a model that learned nothing fails.
    assert m["auc_float"] > 0.7 and m["auc_quantized"] > 0.7


def test_cli_serve_triton_client_and_sigterm_drain(cli_bundle):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # A 3 s batching window and a batch limit above the request count: requests sit queued
    # until the window closes, so SIGTERM arrives while all of them are in flight.
    cmd = [*OFFLOAD, "serve", str(cli_bundle), "--port", str(port), "--max-batch-size", "64", "--max-queue-delay-us", "3000000", "--request-timeout-ms", "20000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_ready(url, proc)
        c = tritonhttp.InferenceServerClient(f"127.0.0.1:{port}", concurrency=16)
        x = make_transactions(16, seed=5)[0]
        from offload.host import open_device
        from offload.host.bundle import load

        dev = open_device("sim")
        h = dev.load(next(iter(load(cli_bundle).kernels.values())))
        want = [dev.run(h, {"x": x[i : i + 1].astype(np.float64)})["y"].astype(np.float32) for i in range(16)]

        pending = []
        for i in range(16):
            inp = tritonhttp.InferInput("x", [1, 16], "FP32")
            inp.set_data_from_numpy(x[i : i + 1])
            pending.append(c.async_infer("risk", [inp]))
        end = time.monotonic() + 20
        while True:  # wait until the server holds all 16 in its queue
            text = httpx.get(f"{url}/metrics", timeout=5).text
            depth = [ln for ln in text.splitlines() if ln.startswith("offload_queue_depth{")]
            if depth and float(depth[0].split()[-1]) == 16:
                break
            assert time.monotonic() < end, "requests never queued"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        for i, p in enumerate(pending):
            np.testing.assert_array_equal(p.get_result(timeout=30).as_numpy("y"), want[i], err_msg=f"request {i}")
        assert proc.wait(timeout=30) == 0
        c.close()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/v2/health/live", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_demo_section_runs_end_to_end():
    from rich.console import Console

    from offload.demo.serve import serve_demo_section

    console = Console(record=True, width=120)
    assert serve_demo_section(console, rate=100, duration=1)
    text = console.export_text()
    assert "bit-identical" in text and "exit status 0" in text and "latency plot" in text
