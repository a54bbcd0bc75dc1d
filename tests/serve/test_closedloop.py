"""The closed-loop load tool (bench_serve's throughput-at-concurrency engine) against a live
service: it counts every answer by status, keeps its connections busy, refuses what it cannot
measure."""

from __future__ import annotations

import asyncio

import orjson
import pytest

import _serve_standin as standin
from _serve_live import Service, live
from offload.loadgen.closedloop import run_closed
from offload.serve.config import ServeConfig


@pytest.fixture(scope="module")
def svc():
    from offload.host.bundle import load

    return Service(load(standin.risk_bundle_path()), ServeConfig(device="sim"))


def _body(n_features: int) -> bytes:
    return orjson.dumps({"inputs": [{"name": "x", "shape": [1, n_features], "datatype": "FP32", "data": [0.25] * n_features}]})


def test_counts_answers_and_uses_every_connection(svc):
    with live(svc.app) as url:
        get = svc.metrics.registry.get_sample_value
        before = get("offload_requests_total", {"model": "risk", "code": "200"}) or 0.0
        res = asyncio.run(run_closed(f"http://{url}/v2/models/risk/infer", _body(svc.model.input.width), connections=8, duration=0.5))
        after = get("offload_requests_total", {"model": "risk", "code": "200"})
    assert res.errors == {}
    assert res.ok > 8
    # Every answer the tool counted is one the server counted, none more, none lost.
    assert after - before == res.ok
    assert res.hist.get_total_count() == res.ok


def test_non_200_answers_are_errors_not_throughput(svc):
    with live(svc.app) as url:
        res = asyncio.run(run_closed(f"http://{url}/v2/models/nosuch/infer", _body(svc.model.input.width), connections=2, duration=0.3))
        bad = asyncio.run(run_closed(f"http://{url}/v2/models/risk/infer", b'{"inputs": 1}', connections=2, duration=0.3))
    assert res.ok == 0 and res.errors.get("http_404", 0) > 0
    assert bad.ok == 0 and bad.errors.get("http_400", 0) > 0


def test_refuses_non_loopback_and_unbounded_runs():
    with pytest.raises(ValueError, match="loopback"):
        asyncio.run(run_closed("http://10.1.2.3:8000/v2/models/risk/infer", b"{}", connections=1, duration=1))
    with pytest.raises(ValueError, match="connections"):
        asyncio.run(run_closed("http://127.0.0.1:1/x", b"{}", connections=0, duration=1))
    with pytest.raises(ValueError, match="duration"):
        asyncio.run(run_closed("http://127.0.0.1:1/x", b"{}", connections=1, duration=10_000))
