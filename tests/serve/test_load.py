"""The open-loop load tool: counts, report files, loopback-only, and no coordinated omission."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from click.testing import CliRunner

import _serve_standin as standin
from _serve_live import Service, live
from offload.serve.config import ServeConfig
from offload.loadgen.openloop import run_load


@pytest.fixture(scope="module")
def bundle():
    from offload.host.bundle import load

    return load(standin.risk_bundle_path())


def test_refuses_non_loopback_and_unbounded_runs():
    for url in ("http://10.1.2.3:8000/v2/models/risk", "http://example.com/v2/models/risk", "https://127.0.0.1/v2/models/risk"):
        with pytest.raises(ValueError, match="loopback|http://"):
            asyncio.run(run_load(url, 10, 1))
    with pytest.raises(ValueError, match="duration"):
        asyncio.run(run_load("http://127.0.0.1:1/v2/models/risk", 10, 10_000))
    with pytest.raises(ValueError, match="requests"):
        asyncio.run(run_load("http://127.0.0.1:1/v2/models/risk", 1e7, 1))
    with pytest.raises(ValueError, match="name the model"):
        asyncio.run(run_load("http://127.0.0.1:1", 10, 1))


def test_cli_bench_counts_and_reports(bundle, tmp_path):
    from offload.cli import main

    svc = Service(bundle, ServeConfig(device="sim"))
    out = tmp_path / "run"
    with live(svc.app) as url:
        r = CliRunner().invoke(main, ["bench", f"http://{url}/v2/models/risk", "--rate", "100", "--duration", "1", "--batch", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "p99=" in r.output and "throughput" in r.output
    res = json.loads((tmp_path / "run.json").read_text())
    assert res["sent"] == 100 and res["ok"] + sum(res["errors"].values()) == 100
    assert res["ok"] == 100, res["errors"]
    lat = res["latency_us"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The server saw exactly what the tool sent: 100 requests of 2 rows.
    rows = svc.metrics.registry.get_sample_value("offload_batch_size_sum", {"model": "risk"})
    assert rows == 200


def test_latency_counts_from_the_due_time_not_the_send_time(bundle):
    # The device is blocked for a second from the first request it sees. An open-loop tool keeps
    # sending on schedule and charges every request the time since it was DUE: the ~75 requests
    # due in the first 0.75 s of the stall each wait >= 0.25 s. A closed-loop tool would record
    # one slow request and simply send fewer. (Timed from the device's first call, not from the
    # test's clock: on a loaded machine the tool's start-up alone can take a second.)
    standin.GatedDevice.gate.clear()
    standin.GatedDevice.entered.clear()
    svc = Service(bundle, ServeConfig(device="gated", max_batch_size=64, request_timeout_ms=30000))
    with live(svc.app) as url:
        def open_gate_a_second_after_the_first_call():
            standin.GatedDevice.entered.wait(timeout=30)
            time.sleep(1.0)
            standin.GatedDevice.gate.set()

        timer = threading.Thread(target=open_gate_a_second_after_the_first_call)
        timer.start()
        res = asyncio.run(run_load(f"http://{url}/v2/models/risk", 100, 1.5, timeout=30))
        timer.join()
    assert res.ok == res.sent == 150
    slow = sum(1 for v in _values(res.hist) if v >= 250_000)
    assert slow >= 25, f"only {slow} requests show the stall"


def _values(hist):
    for item in hist.get_recorded_iterator():
        for _ in range(item.count_at_value_iterated_to):
            yield item.value_iterated_to
