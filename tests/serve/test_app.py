"""The scoring service over real HTTP: OIP v2 with a stock Triton client, batching correctness
under concurrency, hostile input, queue limits, timeouts, fail-over and auth."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest

import _serve_standin as standin
from _serve_live import Service, live
from offload.host import open_device
from offload.serve.config import ServeConfig

tritonhttp = pytest.importorskip("tritonclient.http")

N_IN = 16  # the risk example's features


def _sim_rows(bundle, x: np.ndarray) -> np.ndarray:
    """The sim device's answer for each row scored ALONE, as the FP32 the service returns."""
    dev = open_device("sim")
    h = dev.load(next(iter(bundle.kernels.values())))
    out = np.concatenate([dev.run(h, {"x": x[i : i + 1].astype(np.float64)})["y"] for i in range(len(x))])
    dev.close()
    return out.astype(np.float32)


def _body(x: np.ndarray, name="x", dtype="FP32") -> dict:
    return {"inputs": [{"name": name, "shape": list(x.shape), "datatype": dtype, "data": x.ravel().tolist()}]}


@pytest.fixture(scope="module")
def bundle():
    from offload.host.bundle import load

    b = load(standin.risk_bundle_path())
    assert b.name == "risk"
    return b


def test_stock_triton_client_json_and_binary(bundle):
    svc = Service(bundle, ServeConfig(device="sim"))
    with live(svc.app) as url:
        c = tritonhttp.InferenceServerClient(url)
        assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("risk")
        meta = c.get_model_metadata("risk")
        assert meta["inputs"][0] == {"name": "x", "datatype": "FP32", "shape": [-1, N_IN]}
        assert meta["outputs"][0]["shape"] == [-1, 1]
        x = np.random.default_rng(1).normal(size=(5, N_IN)).astype(np.float32)
        want = _sim_rows(bundle, x)
        for binary in (False, True):
            inp = tritonhttp.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            out = tritonhttp.InferRequestedOutput("y", binary_data=binary)
            res = c.infer("risk", [inp], outputs=[out], request_id="r1")
            got = res.as_numpy("y")
            assert got.dtype == np.float32 and got.shape == (5, 1)
            np.testing.assert_array_equal(got, want)
            assert res.get_response()["id"] == "r1"
        with pytest.raises(tritonhttp.InferenceServerException, match="unknown model"):
            c.get_model_metadata("nope")
        c.close()


@pytest.mark.parametrize("device", ["sim", "flaky"], ids=["inline-sim", "worker-thread"])
def test_concurrent_requests_each_get_their_own_rows(bundle, device):
    # A 3 ms batching window and 200 concurrent requests: batches must form, and every response
    # must still be exactly the single-row sim result for that request's own rows. "sim" runs
    # batches on the event loop; "flaky" (a sim that never fails here) runs them on the worker thread.
    svc = Service(bundle, ServeConfig(device=device, max_batch_size=32, max_queue_delay_us=3000, max_queue_size=1000))
    rng = np.random.default_rng(7)
    sizes = rng.integers(1, 4, 200)
    xs = [rng.uniform(-4, 4, (int(n), N_IN)).astype(np.float32) for n in sizes]
    want = _sim_rows(bundle, np.concatenate(xs))
    offs = np.concatenate([[0], np.cumsum(sizes)])

    async def go(url):
        limits = httpx.Limits(max_connections=50)
        async with httpx.AsyncClient(base_url=f"http://{url}", limits=limits, timeout=30) as c:
            rs = await asyncio.gather(*[c.post("/v2/models/risk/infer", json={**_body(x), "id": str(i)}) for i, x in enumerate(xs)])
            return rs

    with live(svc.app) as url:
        rs = asyncio.run(go(url))
    for i, r in enumerate(rs):
        assert r.status_code == 200, r.text
        j = r.json()
        assert j["id"] == str(i)
        got = np.asarray(j["outputs"][0]["data"], dtype=np.float32).reshape(j["outputs"][0]["shape"])
        np.testing.assert_array_equal(got, want[offs[i] : offs[i + 1]], err_msg=f"request {i}")
    hist = svc.metrics.batch_size.labels(model="risk")
    n_batches = svc.metrics.registry.get_sample_value("offload_batch_size_count", {"model": "risk"})
    rows = svc.metrics.registry.get_sample_value("offload_batch_size_sum", {"model": "risk"})
    assert hist is not None and rows == sizes.sum()  # no row lost or computed twice
    assert n_batches < len(xs), "no batching happened"
    get = svc.metrics.registry.get_sample_value
    assert get("offload_request_duration_seconds_count", {"model": "risk"}) == len(xs)
    assert get("offload_queue_duration_seconds_count", {"model": "risk"}) == len(xs)
    assert get("offload_compute_duration_seconds_count", {"model": "risk", "device": device}) == n_batches
    assert get("offload_requests_total", {"model": "risk", "code": "200"}) == len(xs)
    # The server has shut down by now: its lifespan closed the device.
    assert get("offload_device_state", {"device": device, "state": "closed"}) == 1.0
    assert get("offload_device_state", {"device": device, "state": "up"}) == 0.0


_BIN_HEAD = b'{"inputs":[{"name":"x","shape":[1,16],"datatype":"FP32","parameters":{"binary_data_size":32}}]}'
HOSTILE = [
    # (description, body bytes or json, headers, status, words the error must name)
    ("malformed JSON", b'{"inputs": [', {}, 400, "malformed JSON"),
    ("not an object", b"[1, 2]", {}, 400, "request body"),
    ("no inputs", {"id": "a"}, {}, 400, "inputs"),
    ("wrong input name", {"inputs": [{"name": "z", "shape": [1, N_IN], "datatype": "FP32", "data": [0.0] * N_IN}]}, {}, 400, "'z'"),
    ("wrong datatype", {"inputs": [{"name": "x", "shape": [1, N_IN], "datatype": "INT64", "data": [0] * N_IN}]}, {}, 400, "INT64"),
    ("wrong feature count", {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [0.0] * 3}]}, {}, 400, "features"),
    ("shape/data mismatch", {"inputs": [{"name": "x", "shape": [2, N_IN], "datatype": "FP32", "data": [0.0] * N_IN}]}, {}, 400, "needs 32"),
    ("3-d shape", {"inputs": [{"name": "x", "shape": [1, 1, N_IN], "datatype": "FP32", "data": [0.0] * N_IN}]}, {}, 400, "shape"),
    ("strings", {"inputs": [{"name": "x", "shape": [1, N_IN], "datatype": "FP32", "data": ["a"] * N_IN}]}, {}, 400, "numbers"),
    ("ragged", {"inputs": [{"name": "x", "shape": [2, N_IN], "datatype": "FP32", "data": [[0.0] * N_IN, [0.0]]}]}, {}, 400, "rectangular"),
    ("FP32 overflow", {"inputs": [{"name": "x", "shape": [1, N_IN], "datatype": "FP32", "data": [1e39] + [0.0] * (N_IN - 1)}]}, {}, 400, "FP32 range"),
    ("oversized batch", {"inputs": [{"name": "x", "shape": [65, N_IN], "datatype": "FP32", "data": [0.0] * (65 * N_IN)}]}, {}, 400, "max batch size"),
    ("bad binary size", _BIN_HEAD + b"\0" * 8, {"Inference-Header-Content-Length": str(len(_BIN_HEAD))}, 400, "binary_data_size"),
    ("bad header length", b"{}", {"Inference-Header-Content-Length": "abc"}, 400, "Inference-Header-Content-Length"),
]


def test_hostile_input_gets_4xx_json_and_service_keeps_serving(bundle):
    svc = Service(bundle, ServeConfig(device="sim", max_batch_size=64, max_body_bytes=64 * 1024))
    good = np.linspace(-1, 1, N_IN, dtype=np.float32).reshape(1, N_IN)
    with live(svc.app) as url, httpx.Client(base_url=f"http://{url}", timeout=10) as c:
        for desc, body, headers, status, words in HOSTILE:
            kw = {"content": body} if isinstance(body, bytes) else {"json": body}
            r = c.post("/v2/models/risk/infer", headers=headers, **kw)
            assert r.status_code == status, (desc, r.status_code, r.text)
            err = r.json()["error"]
            assert words in err, (desc, err)
            assert "Traceback" not in r.text
        # NaN/inf cannot travel in JSON; binary tensors carry them to the kernel's own check.
        for bad in (np.nan, np.inf):
            x = good.copy()
            x[0, 5] = bad
            raw = x.astype("<f4").tobytes()
            head = f'{{"inputs":[{{"name":"x","shape":[1,{N_IN}],"datatype":"FP32","parameters":{{"binary_data_size":{len(raw)}}}}}]}}'.encode()
            r = c.post("/v2/models/risk/infer", content=head + raw, headers={"Inference-Header-Content-Length": str(len(head))})
            assert r.status_code == 400 and "row 0 column 5" in r.json()["error"], r.text
        r = c.post("/v2/models/risk/infer", content=b"0" * (65 * 1024))
        assert r.status_code == 413 and "limit" in r.json()["error"]
        r = c.post("/v2/models/risk/infer", content=iter([b"0" * 40000, b"0" * 40000]))  # chunked: no length up front
        assert r.status_code == 413 and "limit" in r.json()["error"]
        r = c.post("/v2/models/other/infer", json=_body(good))
        assert r.status_code == 404 and "unknown model 'other'" in r.json()["error"]
        r = c.get("/v2/models/risk/infer")
        assert r.status_code == 405 and "error" in r.json()
        r = c.post("/v2/models/risk/versions/2/infer", json=_body(good))
        assert r.status_code == 404 and "no version '2'" in r.json()["error"]
        r = c.post("/v2/models/risk/versions/1/infer", json=_body(good))
        assert r.status_code == 200
        r = c.post("/v2/models/risk/infer", json=_body(good))
        assert r.status_code == 200
        np.testing.assert_array_equal(np.float32(r.json()["outputs"][0]["data"]), _sim_rows(bundle, good).ravel())
        metrics = c.get("/metrics").text
    assert 'offload_errors_total{type="bad_request"}' in metrics
    assert 'offload_requests_total{code="400",model="risk"}' in metrics


def test_full_queue_answers_503_at_once_and_timeouts_504(bundle):
    standin.GatedDevice.gate.clear()
    standin.GatedDevice.batches.clear()
    cfg = ServeConfig(device="gated", fallback="503", max_batch_size=1, max_queue_delay_us=0, max_queue_size=2, request_timeout_ms=20000)
    svc = Service(bundle, cfg)
    x = np.zeros((1, N_IN), np.float32)

    async def go(url):
        async with httpx.AsyncClient(base_url=f"http://{url}", timeout=30) as c:
            first = asyncio.ensure_future(c.post("/v2/models/risk/infer", json=_body(x)))
            await asyncio.sleep(0.3)  # the device now holds one batch; the queue is empty
            queued = [asyncio.ensure_future(c.post("/v2/models/risk/infer", json=_body(x))) for _ in range(2)]
            await asyncio.sleep(0.3)
            t0 = time.monotonic()
            rejected = await c.post("/v2/models/risk/infer", json=_body(x))
            waited = time.monotonic() - t0
            standin.GatedDevice.gate.set()
            return await first, await asyncio.gather(*queued), rejected, waited

    with live(svc.app) as url:
        first, queued, rejected, waited = asyncio.run(go(url))
    assert rejected.status_code == 503 and "queue is full" in rejected.json()["error"]
    assert waited < 5, "a full queue must reject without waiting for the device"
    assert first.status_code == 200 and all(r.status_code == 200 for r in queued)

    standin.GatedDevice.gate.clear()
    svc = Service(bundle, ServeConfig(device="gated", fallback="503", max_batch_size=1, max_queue_delay_us=0, request_timeout_ms=200))
    with live(svc.app) as url, httpx.Client(base_url=f"http://{url}", timeout=30) as c:
        r = c.post("/v2/models/risk/infer", json=_body(x))
        standin.GatedDevice.gate.set()
    assert r.status_code == 504 and "200 ms" in r.json()["error"]


@pytest.mark.parametrize("timeout", [False, True], ids=["error", "timeout"])
def test_device_fault_fails_over_to_sim_bit_identical_then_reopens(bundle, timeout):
    svc = Service(bundle, ServeConfig(device="flaky", fallback="sim", max_batch_size=16, reopen_backoff_s=0.05))
    dev = standin.FlakyDevice.instances[-1]
    dev.fail_next, dev.timeout = 1, timeout
    x = np.random.default_rng(3).normal(size=(4, N_IN)).astype(np.float32)
    with live(svc.app) as url, httpx.Client(base_url=f"http://{url}", timeout=10) as c:
        r = c.post("/v2/models/risk/infer", json=_body(x))
        assert r.status_code == 200
        np.testing.assert_array_equal(np.float32(r.json()["outputs"][0]["data"]).reshape(4, 1), _sim_rows(bundle, x))
        assert svc.runner.wait_up(10), "device was not reopened"
        assert standin.FlakyDevice.instances[-1] is not dev, "a fresh device should have been opened"
        r = c.post("/v2/models/risk/infer", json=_body(x))
        assert r.status_code == 200
        text = c.get("/metrics").text
    assert standin.FlakyDevice.instances[-1].runs >= 2  # the probe and the second request ran on the reopened device
    kind = "DeviceTimeout" if timeout else "DeviceError"
    assert f'offload_device_faults_total{{device="flaky",type="{kind}"}} 1.0' in text
    assert 'offload_fallbacks_total{model="risk"} 1.0' in text
    assert 'offload_device_state{device="flaky",state="up"} 1.0' in text


def test_device_fault_with_503_fallback_and_failed_reopen(bundle):
    svc = Service(bundle, ServeConfig(device="flaky", fallback="503", reopen_backoff_s=0.05))
    dev = standin.FlakyDevice.instances[-1]
    dev.fail_next = 1
    standin.FlakyDevice.fail_opens = 2  # the first two reopen attempts fail: the service retries
    x = np.ones((1, N_IN), np.float32)
    with live(svc.app) as url, httpx.Client(base_url=f"http://{url}", timeout=10) as c:
        r = c.post("/v2/models/risk/infer", json=_body(x))
        assert r.status_code == 503 and "flaky" in r.json()["error"]
        assert svc.runner.wait_up(10)
        assert standin.FlakyDevice.fail_opens == 0
        assert c.get("/v2/health/ready").status_code == 200
        r = c.post("/v2/models/risk/infer", json=_body(x))
        assert r.status_code == 200
        np.testing.assert_array_equal(np.float32(r.json()["outputs"][0]["data"]), _sim_rows(bundle, x).ravel())


def test_api_key(bundle):
    svc = Service(bundle, ServeConfig(device="sim", api_key="s3cret"))
    x = np.ones((1, N_IN), np.float32)
    with live(svc.app) as url, httpx.Client(base_url=f"http://{url}", timeout=10) as c:
        assert c.get("/v2/health/live").status_code == 200
        assert c.get("/v2/health/ready").status_code == 200
        for hdr in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = c.post("/v2/models/risk/infer", json=_body(x), headers=hdr)
            assert r.status_code == 401 and "unauthorized" in r.json()["error"], hdr
            assert c.get("/v2/models/risk", headers=hdr).status_code == 401
            assert c.get("/metrics", headers=hdr).status_code == 401
        ok = {"Authorization": "Bearer s3cret"}
        assert c.post("/v2/models/risk/infer", json=_body(x), headers=ok).status_code == 200
        assert c.get("/metrics", headers=ok).status_code == 200


def test_a_device_bug_is_a_device_fault_that_fails_over(bundle):
    # A binding's RuntimeError is a device failure like any other (issue 15 item 9): the batch is
    # re-run on the sim device, the fault is counted, and the device reopens.
    svc = Service(bundle, ServeConfig(device="flaky", reopen_backoff_s=0.05))
    dev = standin.FlakyDevice.instances[-1]
    x = np.ones((1, N_IN), np.float32)
    with live(svc.app) as url, httpx.Client(base_url=f"http://{url}", timeout=10) as c:
        dev.crash = True
        r = c.post("/v2/models/risk/infer", json=_body(x))
        assert r.status_code == 200
        np.testing.assert_array_equal(np.float32(r.json()["outputs"][0]["data"]), _sim_rows(bundle, x).ravel())
        assert svc.runner.wait_up(10)
        assert c.post("/v2/models/risk/infer", json=_body(x)).status_code == 200
        assert 'offload_device_faults_total{device="flaky",type="RuntimeError"} 1.0' in c.get("/metrics").text


def test_a_persistent_device_serves_through_its_ring_and_sim_refuses_the_mode(bundle):
    # auto takes the ring where the device has one (emu: the kernel's HLS C++ loop in its own
    # thread); the answers are the sim device's, bit for bit. A device without the mode is refused
    # at start-up with the reason, not at the first request.
    from offload.sim.errors import UnsupportedError

    svc = Service(bundle, ServeConfig(device="emu", max_queue_delay_us=0))
    assert svc.plane.launch == "persistent"
    x = np.linspace(-2, 2, 3 * N_IN, dtype=np.float32).reshape(3, N_IN)
    with live(svc.app) as url, httpx.Client(base_url=f"http://{url}", timeout=60) as c:
        for i in range(3):
            r = c.post("/v2/models/risk/infer", json=_body(x[i : i + 1]))
            assert r.status_code == 200, r.text
            np.testing.assert_array_equal(np.float32(r.json()["outputs"][0]["data"]), _sim_rows(bundle, x[i : i + 1]).ravel())
    assert Service(bundle, ServeConfig(device="emu", launch="per_call")).plane.launch == "per_call"
    with pytest.raises(UnsupportedError, match="'persistent' launch mode"):
        Service(bundle, ServeConfig(device="sim", launch="persistent"))
