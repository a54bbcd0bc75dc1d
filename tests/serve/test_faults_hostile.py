"""Device faults against a real ``offload serve`` process (issue 15, items 8, 9 and 10): a stuck
call, a call that ignores its timeout, every kind of device failure, and wrong outputs. The
process runs the real CLI with a misbehaving device registered (``_hostile_serve.py``)."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from _serve_proc import risk_bundle, serving

N_IN = 16
X = np.random.default_rng(15).uniform(-3, 3, (2, N_IN)).astype(np.float32)
BODY = {"inputs": [{"name": "x", "shape": [2, N_IN], "datatype": "FP32", "data": X.ravel().tolist()}]}


@pytest.fixture(scope="module")
def want() -> np.ndarray:
    """The sim device's answer for X, as the FP32 the service returns."""
    from offload.host import open_device
    from offload.host.bundle import load

    dev = open_device("sim")
    h = dev.load(next(iter(load(risk_bundle()).kernels.values())))
    y = dev.run(h, {"x": X.astype(np.float64)})["y"].astype(np.float32)
    dev.close()
    return y


def _infer(c: httpx.Client) -> httpx.Response:
    return c.post("/v2/models/risk/infer", json=BODY)


def _scores(r: httpx.Response) -> np.ndarray:
    out = r.json()["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def _wait(pred, what: str, timeout: float = 15) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def _up(srv, spec: str) -> bool:
    return srv.metrics().get(f'offload_device_state{{device="{spec}",state="up"}}') == 1.0


def test_a_stuck_call_is_abandoned_a_fresh_handle_serves_and_sigterm_still_exits(want):
    # The first call never returns, though the device reports its timeout (as the card backends
    # do); closing that device would wait for the stuck call forever.
    with serving("--device", "hostile:stuck", "--fallback", "503", "--device-timeout-ms", "200", "--request-timeout-ms", "5000", hostile=True) as s:
        with httpx.Client(base_url=s.url, timeout=10) as c:
            r = _infer(c)
            assert r.status_code == 503, r.text
            _wait(lambda: c.get("/v2/health/ready").status_code == 200, "a fresh device handle")
            r = _infer(c)
            assert r.status_code == 200, r.text
            np.testing.assert_array_equal(_scores(r), want)
            assert c.get("/v2/health/live").status_code == 200
        assert s.metrics()['offload_device_faults_total{device="hostile:stuck",type="DeviceTimeout"}'] == 1.0
        assert s.stop(timeout=15) == 0


def test_a_call_that_ignores_its_timeout_fails_over_and_readiness_follows(want):
    # The call blocks past its timeout and the first probes of a fresh handle block too: the
    # service's own deadline abandons each, answers 503 (as configured) and reports not-ready
    # until a fresh handle answers its probe.
    with serving("--device", "hostile:hang,hang,hang", "--fallback", "503", "--device-timeout-ms", "200", "--request-timeout-ms", "5000", hostile=True) as s:
        with httpx.Client(base_url=s.url, timeout=10) as c:
            r = _infer(c)
            assert r.status_code == 503 and "abandoned" in r.json()["error"], r.text
            assert c.get("/v2/health/ready").status_code == 503
            assert c.get("/v2/models/risk/ready").status_code == 503
            _wait(lambda: c.get("/v2/health/ready").status_code == 200, "recovery")
            r = _infer(c)
            assert r.status_code == 200
            np.testing.assert_array_equal(_scores(r), want)
        m = s.metrics()
        assert m['offload_device_faults_total{device="hostile:hang,hang,hang",type="DeviceAbandoned"}'] == 1.0
        assert s.stop(timeout=15) == 0


FAULTS = ["hang", "runtime", "oserror", "missing", "rows", "shape", "flat", "nan"]


def test_every_device_failure_fails_over_to_the_sim_device_and_is_counted(want):
    # One fault per request, each followed by the healthy probe of the reopened device.
    spec = "hostile:" + ",".join(f"{f},ok" for f in FAULTS)
    with serving("--device", spec, "--device-timeout-ms", "200", "--request-timeout-ms", "5000", hostile=True) as s:
        with httpx.Client(base_url=s.url, timeout=10) as c:
            for f in FAULTS:
                r = _infer(c)
                assert r.status_code == 200, (f, r.text)
                np.testing.assert_array_equal(_scores(r), want, err_msg=f)
                _wait(lambda: _up(s, spec), f"the device to reopen after {f}")
            r = _infer(c)  # the plan is spent: the reopened device answers itself
            np.testing.assert_array_equal(_scores(r), want)
        m = s.metrics()
    faults = {k: v for k, v in m.items() if k.startswith("offload_device_faults_total")}
    kinds = {"DeviceAbandoned": 1, "RuntimeError": 1, "OSError": 1, "DeviceError": 2, "DeviceOutputError": 3}
    assert faults == {f'offload_device_faults_total{{device="{spec}",type="{k}"}}': float(n) for k, n in kinds.items()}
    assert m['offload_fallbacks_total{model="risk"}'] == len(FAULTS)
    assert m[f'offload_compute_duration_seconds_count{{device="{spec}",model="risk"}}'] == 1.0


def test_without_fallback_failures_are_503_and_wrong_outputs_500_never_scores(want):
    with serving("--device", "hostile:runtime,ok,oserror,ok,missing,ok,rows,ok,shape,ok,flat,ok,nan,ok", "--fallback", "503", hostile=True) as s:
        with httpx.Client(base_url=s.url, timeout=10) as c:
            for f, status, words in [
                ("runtime", 503, "RuntimeError"),
                ("oserror", 503, "Input/output error"),
                ("missing", 503, "no output 'y'"),
                ("rows", 503, "3 rows for a batch of 2"),
                ("shape", 500, "shape [2, 2]; the model declares [2, 1]"),
                ("flat", 500, "shape [2]; the model declares [2, 1]"),
                ("nan", 500, "non-finite"),
            ]:
                r = _infer(c)
                assert r.status_code == status and words in r.json()["error"], (f, r.status_code, r.text)
                assert "outputs" not in r.json()
                _wait(lambda: c.get("/v2/health/ready").status_code == 200, f"recovery after {f}")
            r = _infer(c)
            np.testing.assert_array_equal(_scores(r), want)
        m = s.metrics()
    assert m['offload_responses_total{code="500"}'] == 3.0
    assert m['offload_responses_total{code="503"}'] >= 4.0
    assert m['offload_errors_total{type="bad_output"}'] == 3.0
    assert sum(v for k, v in m.items() if k.startswith("offload_device_faults_total")) == 7.0
