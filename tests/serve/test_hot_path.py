"""What the hot path's shortcuts must never change: the FP32 range check done in one reduction
refuses exactly what the element-wise check refused; JSON answers built from a cached head are the
encoder's bytes; the sim device skips its per-call checks only for rows the service has checked,
and bad rows are still refused at the service's edge; metrics count every request as before."""

from __future__ import annotations

import asyncio

import numpy as np
import orjson
import pytest

import _serve_standin as standin
from offload.host import DeviceError
from offload.host.sim import SimDevice
from offload.serve.app import ScoringService
from offload.serve.config import ServeConfig
from offload.serve.errors import InvalidRequest
from offload.serve.faults import FailoverRunner
from offload.serve.metrics import ServeMetrics
from offload.serve.oip import InferRequest, TensorSpec, encode_infer, encode_json, parse_infer

FP32_MAX = float(np.finfo(np.float32).max)
INP, OUT = TensorSpec("x", 4), TensorSpec("y", 1)


@pytest.fixture(scope="module")
def bundle():
    from offload.host.bundle import load

    return load(standin.risk_bundle_path())


def _parse(values: list, rows: int = 1) -> np.ndarray:
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [rows, 4], "datatype": "FP32", "data": values}]})
    return parse_infer(body, None, INP, OUT, 64).x


def test_the_one_reduction_range_check_refuses_exactly_the_values_beyond_fp32():
    above = float(np.nextafter(FP32_MAX, np.inf))  # rounds to FP32_MAX as a float32: still refused
    cases = {
        "in range": [1.5, -2.0, 0.0, 3],
        "extremes": [FP32_MAX, -FP32_MAX, FP32_MAX, -FP32_MAX],  # squares sum far past FP32_MAX**2
        "just above": [0.0, above, 0.0, 0.0],
        "just below minus": [0.0, 0.0, -above, 1.0],
        "huge": [1e300, 0.0, 0.0, 0.0],
        "ints": [2**63 - 1, -(2**63), 0, 1],
    }
    for name, values in cases.items():
        refuse = max(abs(float(v)) for v in values) > FP32_MAX
        if refuse:
            with pytest.raises(InvalidRequest, match="exceeds the FP32 range"):
                _parse(values)
        else:
            got = _parse(values)
            assert got.dtype == np.float32, name
            np.testing.assert_array_equal(got, np.asarray(values, dtype=np.float64).astype(np.float32).reshape(1, 4), err_msg=name)
    rng = np.random.default_rng(3)
    for _ in range(200):  # values of every magnitude, some past the range
        v = rng.choice([-1, 1], size=8) * 10.0 ** rng.uniform(-40, 39.5, size=8)
        refuse = bool(np.abs(v).max() > FP32_MAX)
        try:
            got = _parse(v.tolist(), rows=2)
        except InvalidRequest:
            assert refuse, v
        else:
            assert not refuse, v
            np.testing.assert_array_equal(got, v.astype(np.float32).reshape(2, 4))


def test_json_answers_from_the_cached_head_are_the_encoders_bytes():
    rng = np.random.default_rng(5)
    for model, version, out in (("risk", "1", OUT), ('m"q', "null", TensorSpec("null", 2))):
        for rows in (1, 3, 64, 1, 3):  # repeated shapes come from the cache
            y = rng.normal(size=(rows, out.width)) * 10.0 ** rng.integers(-30, 30)
            for rid in (None, "", "r-7", 'quote " and \u00e9'):
                want, headers = encode_infer(model, version, InferRequest(None, rid, False), y, out)
                assert encode_json(model, version, rid, y, out) == want
                assert headers == {"content-type": "application/json"}


def test_the_sim_devices_validated_run_is_its_checked_run(bundle):
    dev = SimDevice()
    h = dev.load(next(iter(bundle.kernels.values())))
    x = np.random.default_rng(2).normal(scale=4.0, size=(37, 16)).astype(np.float32).astype(np.float64)
    np.testing.assert_array_equal(dev.run_validated(h, {"x": x})["y"], dev.run(h, {"x": x})["y"])
    dev.close()
    with pytest.raises(DeviceError, match="closed"):
        dev.run_validated(h, {"x": x})


class _NanSim(SimDevice):
    """A device that is a SimDevice by inheritance only (as the fault tests' hostile device is):
    it must still get the output check."""

    def run(self, handle, inputs, timeout=None):
        y = super().run(handle, inputs, timeout)["y"].copy()
        y[0, 0] = np.nan
        return {"y": y}


def test_only_the_sim_device_itself_skips_the_output_check(bundle):
    kernel = next(iter(bundle.kernels.values()))
    m = ServeMetrics()
    opened: list = []

    def opener(spec):
        dev = _NanSim() if spec == "sim" and not opened else SimDevice()
        opened.append(dev)
        return dev

    r = FailoverRunner(kernel, "sim", n_out=1, fallback="sim", metrics=m, model="risk", opener=opener, reopen_backoff_s=60)
    try:
        x = np.zeros((2, 16))
        y, device = r.run_inline(x)
        assert device == "sim-fallback" and np.isfinite(y).all()  # the NaN was caught, the batch re-ran
        assert m.registry.get_sample_value("offload_device_faults_total", {"device": "sim", "type": "DeviceOutputError"}) == 1
    finally:
        r.close()


async def _post(svc, body: bytes, headers=()) -> tuple[int, dict]:
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg):
        sent.append(msg)

    scope = {"type": "http", "method": "POST", "path": "/v2/models/risk/infer", "headers": [(b"content-length", str(len(body)).encode()), *headers]}
    await svc.app(scope, receive, send)
    return sent[0]["status"], orjson.loads(sent[1]["body"])


def test_bad_rows_are_still_refused_at_the_edge_and_metrics_count_every_request(bundle):
    svc = ScoringService(bundle, ServeConfig(device="sim"))
    good = np.random.default_rng(4).normal(size=(3, 16)).astype(np.float32)
    nan = good.copy()
    nan[1, 2] = np.nan

    def binary(x):
        head = orjson.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}]})
        return head + x.tobytes(), [(b"inference-header-content-length", str(len(head)).encode())]

    async def go():
        await svc._ensure_started()
        try:
            answers = []
            for _ in range(2):
                answers.append(await _post(svc, orjson.dumps({"inputs": [{"name": "x", "shape": [3, 16], "datatype": "FP32", "data": good.ravel().tolist()}]})))
            answers.append(await _post(svc, *binary(nan)))
            answers.append(await _post(svc, orjson.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [1e39] + [0.0] * 15}]})))
            answers += await asyncio.gather(*(_post(svc, *binary(good)) for _ in range(5)))
            return answers
        finally:
            await svc.batcher.stop()

    answers = asyncio.run(go())
    codes = [a[0] for a in answers]
    assert codes == [200, 200, 400, 400] + [200] * 5
    assert "row 1 column 2" in answers[2][1]["error"] and "finite" in answers[2][1]["error"]
    assert "FP32 range" in answers[3][1]["error"]
    assert answers[0][1]["outputs"][0]["shape"] == [3, 1]
    text = svc.metrics.render().decode()

    def sample(line_start: str) -> float:
        (line,) = [ln for ln in text.splitlines() if ln.startswith(line_start)]
        return float(line.rsplit(" ", 1)[1])

    assert sample('offload_requests_total{code="200",model="risk"}') == 7
    assert sample('offload_requests_total{code="400",model="risk"}') == 2
    assert sample('offload_responses_total{code="200"}') == 7
    assert sample('offload_responses_total{code="400"}') == 2
    assert sample('offload_request_duration_seconds_count{model="risk"}') == 9
    assert sample('offload_queue_duration_seconds_count{model="risk"}') == 7  # refused rows never queue
    assert sample('offload_batch_size_sum{model="risk"}') == 7 * 3
    assert sample('offload_queue_depth{model="risk"}') == 0


def test_json_rows_skip_the_edge_check_only_because_they_pass_it(bundle):
    # The service skips the kind's input check for JSON rows the parser proved finite: that holds
    # only while such rows are everything the check asks for, which these pin.
    from offload.kernels.mlp import MAX_BATCH
    from offload.serve.model import served_model

    model = served_model(bundle)
    assert model.input.width == model.kernel.spec.n_features
    with pytest.raises(Exception, match="max_batch_size"):
        ServeConfig(max_batch_size=MAX_BATCH + 1)
    rng = np.random.default_rng(9)
    for rows in (1, 7, 64):
        x = rng.normal(scale=10.0 ** rng.integers(-3, 30), size=(rows, 16))
        body = orjson.dumps({"inputs": [{"name": "x", "shape": [rows, 16], "datatype": "FP32", "data": x.ravel().tolist()}]})
        req = parse_infer(body, None, model.input, model.output, 64)
        assert req.finite and req.x.dtype == np.float32 and req.x.shape == (rows, 16)
        model.validate(req.x)  # what the skipped check would have said
    head = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}]})
    nan = np.full(16, np.nan, dtype=np.float32).tobytes()
    assert not parse_infer(head + nan, str(len(head)), model.input, model.output, 64).finite
