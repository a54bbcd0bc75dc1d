"""What the hot path's shortcuts must never change: the FP32 range check done in one reduction
refuses exactly what the element-wise check refused; JSON answers built from a cached head are the
encoder's bytes; the sim device skips its per-call checks only for rows the service has checked,
and bad rows are still refused at the service's edge; metrics count every request as before."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import numpy as np
import orjson
import pytest

import _serve_standin as standin
from offload.host import DeviceError
from offload.host.sim import SimDevice
from offload.serve.app import ScoringService
from offload.serve.config import ServeConfig
from offload.serve.errors import DeviceUnavailable, InvalidRequest
from offload.serve.faults import FailoverRunner
from offload.serve.metrics import ServeMetrics
from offload.serve.oip import InferRequest, JsonRows, LoneRows, TensorSpec, encode_infer, encode_json, encode_json_rows, fp32_finite, json_row_values, json_single_answers, parse_infer, stack_rows

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
        # FP32 values whose bytes begin as the extremes' do: taken the exact way, same array
        "all-ones mantissas": [float(np.nextafter(np.float32(1), np.float32(0))), -float(np.nextafter(np.float32(2), np.float32(0))), 0.5, 1.0],
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
    bound = dev.bind_rows(h)
    np.testing.assert_array_equal(bound(x), dev.run(h, {"x": x})["y"])
    dev.close()
    with pytest.raises(DeviceError, match="closed"):
        bound(x)


def test_an_unguarded_sim_call_is_the_guarded_one_and_the_runner_drops_it_before_any_close(bundle):
    kernel = next(iter(bundle.kernels.values()))
    dev = SimDevice()
    h = dev.load(kernel)
    x = np.random.default_rng(5).normal(scale=4.0, size=(9, 16)).astype(np.float32)
    guarded, bare = dev.bind_rows(h, fp32=True), dev.bind_rows(h, fp32=True, guard=False)
    assert bare is not guarded
    np.testing.assert_array_equal(bare(x).view(np.uint32), guarded(x).view(np.uint32))
    dev.close()
    with pytest.raises(DeviceError, match="closed"):
        guarded(x)

    # The runner's unguarded call is gone before its device closes: close() finds it cleared.
    # (Watched on the instance: only the SimDevice class itself gets the bound call.)
    seen: list = []
    watched = SimDevice()
    watched.close = lambda: (seen.append((r._live, r._fast)), SimDevice.close(watched))
    r = FailoverRunner(kernel, "sim", n_out=1, fallback="503", metrics=ServeMetrics(), model="risk", opener=lambda spec: watched)
    assert r._fast is not None and r._primary is watched
    r.close()
    assert seen == [(None, None)]
    with pytest.raises(DeviceUnavailable, match="closed"):  # and a call after close is refused by the runner
        r.run_inline(x)


class _NanSim(SimDevice):
    """A device that is a SimDevice by inheritance only (as the fault tests' hostile device is):
    it must still get the output check."""

    def run(self, handle, inputs, timeout=None):
        y = super().run(handle, inputs, timeout)["y"].copy()
        y[0, 0] = np.nan
        return {"y": y}


def test_the_runners_inline_call_reaches_the_compiled_kernel_through_one_frame(bundle, monkeypatch):
    # Runner -> the program's bound call -> the compiled entry point: no device guard, kind,
    # mapping or Program.run_fp32 frame between them (each cost the one-row call at one
    # connection ~0.5-1 us), and the answer is still the checked run's, rounded to FP32.
    import sys

    from offload.sim.mlp import fused

    fused.warm_up()
    real = fused._ENTRY["f"]
    stacks: list[list[str]] = []

    def entry(*args):
        names, f = [], sys._getframe(1)
        while f is not None and f.f_code.co_name != "run_inline":
            names.append(f.f_code.co_name)
            f = f.f_back
        if f is not None:  # (the device's load runs the kernel too: its warm-up)
            stacks.append(names)
        return real(*args)

    monkeypatch.setitem(fused._ENTRY, "f", entry)  # the bound calls take their entry point when made,
    monkeypatch.setattr(fused, "warm_up", lambda: 0.0)  # after the device's load has warmed up
    kernel = next(iter(bundle.kernels.values()))
    r = FailoverRunner(kernel, "sim", n_out=1, fallback="503", metrics=ServeMetrics(), model="risk")
    try:
        x = np.random.default_rng(4).normal(scale=4.0, size=(1, 16)).astype(np.float32)
        y, device = r.run_inline(x)
    finally:
        r.close()
    assert stacks == [["run"]] and device == "sim"
    dev = SimDevice()
    want = dev.run(dev.load(kernel), {"x": x.astype(np.float64)})["y"].astype(np.float32)
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))


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


def test_close_while_a_reopen_finishes_closes_the_fresh_device_and_returns(bundle):
    """close() during a reopen: the reopener, finding the runner closed, closes the device it
    just opened (it once did so under the runner's lock, which closing takes too: a deadlock)."""
    kernel = next(iter(bundle.kernels.values()))
    closed_devs: list = []
    runner: list = []

    class _Tracked(SimDevice):
        def close(self):
            closed_devs.append(self)
            super().close()

    opened: list = []
    reopening = threading.Event()

    def opener(spec):
        if len(opened) == 2:  # after the primary and the fall-back, the reopen: it finishes only once close() has begun
            reopening.set()
            runner[0]._closed.wait(10)
        dev = _NanSim() if spec == "sim" and not opened else _Tracked()
        opened.append(dev)
        return dev

    r = FailoverRunner(kernel, "sim", n_out=1, fallback="sim", metrics=ServeMetrics(), model="risk", opener=opener, reopen_backoff_s=60)
    runner.append(r)
    r.run_inline(np.zeros((2, 16)))  # the NaN is a fault: the reopener starts
    assert reopening.wait(10)
    t = threading.Thread(target=r.close, daemon=True)
    t.start()
    t.join(15)
    assert not t.is_alive(), "close() never returned"
    fresh = opened[-1]
    deadline = time.monotonic() + 10
    while fresh not in closed_devs and time.monotonic() < deadline:  # closed on a thread of its own
        time.sleep(0.01)
    assert len(opened) == 3 and fresh in closed_devs and r.state == "closed"


async def _post(svc, body: bytes, headers=()) -> tuple[int, dict]:
    status, raw = await _post_raw(svc, body, headers)
    return status, orjson.loads(raw)


async def _post_raw(svc, body: bytes, headers=()) -> tuple[int, bytes]:
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg):
        sent.append(msg)

    scope = {"type": "http", "method": "POST", "path": "/v2/models/risk/infer", "headers": [(b"content-length", str(len(body)).encode()), *headers]}
    await svc.app(scope, receive, send)
    return sent[0]["status"], sent[1]["body"]


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
    assert sample('offload_queue_duration_seconds_count{model="risk"}') == 7  # refused rows are never counted as queued for the device
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
    # Binary rows: proved finite up to 256 bytes (fp32_finite), not looked at beyond.
    for rows, finite in ((1, True), (4, True), (5, False)):
        head = orjson.dumps({"inputs": [{"name": "x", "shape": [rows, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64 * rows}}]})
        x = rng.normal(scale=1e30, size=(rows, 16)).astype(np.float32)
        req = parse_infer(head + x.tobytes(), str(len(head)), model.input, model.output, 64)
        assert req.finite is finite
        model.validate(req.x)
        x[-1, -1] = np.nan
        assert not parse_infer(head + x.tobytes(), str(len(head)), model.input, model.output, 64).finite


def test_the_fp32_finite_proof_is_numpys_isfinite_for_every_exponent_and_size():
    """fp32_finite against np.isfinite: every size it looks at (0 to 64 values), every exponent
    at a random place among finite values, the edges of each class (largest finite, smallest
    subnormal, signed zeros and infinities, NaN payloads, the neighbours of infinity), and
    random bit patterns; nothing over 256 bytes, or short of a whole value, counts as proved."""
    rng = np.random.default_rng(11)
    edges = [0, 0x80000000, 1, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0xFFFFFFFF, 0x3F800000]

    def finite_bits(n: int) -> np.ndarray:
        bits = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype("<u4")
        return bits & ~np.array(0x7F800000, "<u4") | (rng.integers(0, 255, size=n, dtype=np.uint64).astype("<u4") << 23)

    def check(bits: np.ndarray) -> None:
        want = bool(np.isfinite(bits.view("<f4")).all())
        assert fp32_finite(bits.tobytes()) is want, [hex(b) for b in bits]

    for n in range(65):
        check(finite_bits(n))
        check(rng.integers(0, 2**32, size=n, dtype=np.uint64).astype("<u4"))
        if n:
            for e in range(256):
                bits = finite_bits(n)
                bits[rng.integers(n)] = (int(rng.integers(2)) << 31) | (e << 23) | int(rng.integers(1 << 23))
                check(bits)
            for edge in edges:
                bits = finite_bits(n)
                bits[rng.integers(n)] = edge
                check(bits)
    assert not fp32_finite(finite_bits(65).tobytes())
    assert not fp32_finite(finite_bits(16).tobytes()[:-1])  # not whole values: not looked at


def _eager_or_error(body: bytes, f: int = 4):
    """What the per-request parser makes of a body: float32 rows, or its refusal's message."""
    try:
        return parse_infer(body, None, TensorSpec("x", f), OUT, 64).x
    except InvalidRequest as e:
        return str(e)


def _json_bodies(rng: np.random.Generator, f: int = 4) -> list[bytes]:
    """Bodies the lazy path keeps (a flat list whose first value is a float) and bodies it does
    not, valid and not: FP32 rounding, range edges, ints and booleans after the first value,
    non-numbers, nested values."""
    above = float(np.nextafter(FP32_MAX, np.inf))
    tails = [
        lambda: rng.normal(size=f - 1).tolist(),  # values float32 cannot hold exactly: rounded
        lambda: [FP32_MAX, -FP32_MAX] + [0.1] * (f - 3),
        lambda: [above] + [0.0] * (f - 2),
        lambda: [1e39] * (f - 1),
        lambda: [3, -(2**62)] + [0.5] * (f - 3),  # ints after a float: float64 like the rest
        lambda: [True] + [0.25] * (f - 2),
        lambda: [2**70] + [0.0] * (f - 2),  # NumPy makes it an object array
        # Around 2**63, where the batch's array.array reading must hand over to NumPy's: ints
        # orjson keeps as ints (up to 2**64 - 1), floats past 2**63 yet inside FP32.
        lambda: [2**63, -(2**63)] + [0.5] * (f - 3),
        lambda: [2**64 - 1] + [0.0] * (f - 2),
        lambda: [2**63 - 1, -(2**63) + 1] + [0.5] * (f - 3),
        lambda: [9.3e18, -9.3e18] + [0.5] * (f - 3),
        lambda: [1e30] + [0.0] * (f - 2),
        lambda: ["1.5"] + [0.0] * (f - 2),  # NumPy would parse the string as a number
        lambda: [None] + [0.0] * (f - 2),
        lambda: [[0.5]] + [0.0] * (f - 2),
        lambda: [{"a": 1}] + [0.0] * (f - 2),
    ]
    bodies = []
    for _ in range(120):
        rows = int(rng.integers(1, 4))
        data: list = []
        for _ in range(rows):
            first = float(rng.normal()) if rng.random() < 0.9 else int(rng.integers(-5, 5))
            tail = tails[0]() if rng.random() < 0.6 else tails[int(rng.integers(len(tails)))]()
            data += [first] + tail
        if rng.random() < 0.05:
            data = [data[i * f : (i + 1) * f] for i in range(rows)]  # nested rows: the eager path
        bodies.append(json.dumps({"inputs": [{"name": "x", "shape": [rows, f], "datatype": "FP32", "data": data}]}).encode())  # orjson refuses 2**70
    return bodies


@pytest.fixture
def msgspec_reader(monkeypatch):
    """parse_infer without the compiled JSON reader: common bodies come back as JsonRows, as
    they do where it cannot be built, and for the bodies it leaves to msgspec (an id, ...)."""
    import offload.serve.oip as oip

    monkeypatch.setattr(oip, "compiled_json_rows", lambda: None)


@pytest.mark.parametrize("f", [4, 100], ids=["small batches", "batches past stack_rows' _SMALL"])
def test_json_rows_converted_with_their_batch_are_each_request_converted_alone(f, msgspec_reader):
    import offload.serve.oip as oip

    rng = np.random.default_rng(11)
    lazy, eager = [], []
    for body in _json_bodies(rng, f):
        want = _eager_or_error(body, f)
        try:
            lazy.append(parse_infer(body, None, TensorSpec("x", f), OUT, 64, lazy_json=True).x)
        except InvalidRequest as e:  # only bodies the eager path takes, and refuses the same way
            assert type(want) is str and str(e) == want
            continue
        eager.append(want)
    assert sum(type(x) is JsonRows for x in lazy) > 80  # the lazy path is the common one here
    assert sum(isinstance(e, str) for e in eager) > 20  # and its refusals are common too
    sizes = []
    for _ in range(300):
        idx = rng.choice(len(lazy), size=int(rng.integers(1, 12)), replace=False)
        sizes.append(sum(len(lazy[i]) for i in idx) * f)
        x, refused = stack_rows([lazy[i] for i in idx])
        want_refused = {k: eager[i] for k, i in enumerate(idx) if isinstance(eager[i], str)}
        assert {k: str(e) for k, e in refused.items()} == want_refused
        kept = [eager[i] for i in idx if not isinstance(eager[i], str)]
        if kept:
            want = np.concatenate(kept, axis=0)  # float32: the FP32 values sent
            assert x.dtype == np.float32 and x.flags.c_contiguous and x.flags.writeable  # the device's compiled FP32 path takes it as it is
            np.testing.assert_array_equal(x, want)
        else:
            assert x.shape[0] == 0
    # Both of stack_rows' ways were taken: batches up to _SMALL values, and (wide rows) past it.
    assert min(sizes) <= oip._SMALL and (max(sizes) > oip._SMALL) == (f == 100)


@pytest.mark.parametrize("f", [4, 100], ids=["small rows", "rows past stack_rows' _SMALL"])
def test_a_lone_requests_rows_are_what_its_batch_alone_gets_in_a_reused_buffer(f, msgspec_reader):
    # LoneRows(f)(x) must be stack_rows([x])'s array or raise its refusal, for every request in
    # turn, whatever the one before it left in the shared buffer; one-row JSON requests get that
    # buffer, which is what saves the allocations.
    rng = np.random.default_rng(21)
    alone = LoneRows(f)
    xs = []
    for body in _json_bodies(rng, f):
        try:
            xs.append(parse_infer(body, None, TensorSpec("x", f), OUT, 64, lazy_json=True).x)
        except InvalidRequest:
            continue
    xs.append(rng.normal(size=(2, f)).astype(np.float32))  # arrays: stack_rows' own
    order = [xs[i] for i in rng.permutation(len(xs))] * 2
    reused = refusals = arrays = 0
    first = None
    for x in order:
        want, refused = stack_rows([x])
        if refused:
            with pytest.raises(InvalidRequest) as e:
                alone(x)
            assert str(e.value) == str(refused[0])
            refusals += 1
            continue
        got = alone(x)
        assert got.dtype == np.float32 and got.flags.c_contiguous and got.flags.writeable and got.flags.aligned
        np.testing.assert_array_equal(got, want)
        if type(x) is JsonRows and len(x) == 1 and got.base is not None and type(got.base) is bytearray:
            first = first if first is not None else got
            assert got is first  # one array, every time
            reused += 1
        if type(x) is np.ndarray:
            assert got is x  # an array the device takes as it is (the compiled reader's): no copy
            arrays += 1
    assert reused > 40 and refusals > 10 and arrays >= 2
    # Arrays the device does not take as they are get stack_rows' copy.
    for x in (np.ones((1, f)), np.ones((2, f), np.float32)[::-1], np.ones((1, f), ">f4")):
        got = alone(x)
        assert got is not x and got.dtype == np.float32 and got.flags.carray
        np.testing.assert_array_equal(got, stack_rows([x])[0])


def test_json_rows_mixed_with_binary_rows_keep_their_order(msgspec_reader):
    rng = np.random.default_rng(12)
    a = rng.normal(size=(2, 4)).astype(np.float32)
    j = rng.normal(size=(3, 4))
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32", "data": j.ravel().tolist()}]})
    lazy = parse_infer(body, None, INP, OUT, 64, lazy_json=True).x
    assert type(lazy) is JsonRows and len(lazy) == 3
    x, refused = stack_rows([a, lazy, a[:1]])
    assert not refused
    assert x.dtype == np.float32
    np.testing.assert_array_equal(x, np.concatenate([a, j.astype(np.float32), a[:1]]))


def test_a_lone_binary_request_is_its_own_batch_and_any_other_array_is_copied():
    """fp32_rows gives a writable float32 array of its own (binary REST, raw gRPC), which
    stack_rows hands the device as it is when it is the whole batch; an array the device must not
    get as it is (read-only, strided, float64) is copied into a writable float32 batch."""
    from offload.serve.oip import fp32_rows

    rng = np.random.default_rng(14)
    want = rng.normal(size=(3, 4)).astype("<f4")
    wire = want.tobytes()
    x = fp32_rows(wire, 3, 4)
    assert x.dtype == np.float32 and x.flags.writeable and x.flags.c_contiguous and x.flags.owndata is False
    np.testing.assert_array_equal(x, want)
    x[0, 0] = 99.0  # its own bytes: the wire's are untouched
    assert wire == want.tobytes()
    batch, refused = stack_rows([x])
    assert batch is x and not refused
    others = [np.frombuffer(wire, "<f4").reshape(3, 4), np.asfortranarray(want), want.astype(np.float64)]
    assert not others[0].flags.writeable and not others[1].flags.c_contiguous
    for a in others:
        batch, refused = stack_rows([a])
        assert batch is not a and not refused
        assert batch.dtype == np.float32 and batch.flags.writeable and batch.flags.c_contiguous
        np.testing.assert_array_equal(batch, want)


def test_json_answers_from_a_batchs_row_texts_are_the_encoders_bytes():
    rng = np.random.default_rng(13)
    for out in (OUT, TensorSpec("y3", 3)):
        for _ in range(40):
            n = int(rng.integers(1, 65))
            y = rng.normal(size=(n, out.width)) * 10.0 ** rng.integers(-40, 39, size=(n, 1))
            y[rng.random(size=y.shape) < 0.05] = -0.0
            rows = json_row_values(y)
            assert len(rows) == n
            off = 0
            while off < n:
                k = int(rng.integers(1, n - off + 1))
                for rid in (None, "r-1"):
                    want = encode_json("risk", "1", rid, y[off : off + k], out)
                    assert encode_json_rows("risk", "1", rid, rows, off, k, out) == want
                off += k
            ones = json_single_answers("risk", "1", rows, out)
            assert ones == [encode_json("risk", "1", None, y[i : i + 1], out) for i in range(n)]


def test_a_request_refused_in_its_batch_leaves_the_others_their_answers(bundle):
    svc = ScoringService(bundle, ServeConfig(device="sim"))
    rng = np.random.default_rng(14)
    xs = [rng.normal(size=(int(rng.integers(1, 4)), 16)).astype(np.float32) for _ in range(6)]
    bodies = [orjson.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}) for x in xs]
    bad = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [0.5, "0.5"] + [0.0] * 14}]})
    want_error = _eager_or_error(bad, 16)
    assert isinstance(want_error, str) and type(parse_infer(bad, None, TensorSpec("x", 16), OUT, 64, lazy_json=True).x) is JsonRows

    async def go():
        await svc._ensure_started()
        try:
            return await asyncio.gather(*(_post(svc, b) for b in bodies[:3] + [bad] + bodies[3:]))
        finally:
            await svc.batcher.stop()

    answers = asyncio.run(go())
    assert [a[0] for a in answers] == [200] * 3 + [400] + [200] * 3
    assert answers[3][1]["error"] == want_error
    dev = SimDevice()
    h = dev.load(next(iter(bundle.kernels.values())))
    for x, (_, a) in zip(xs, answers[:3] + answers[4:]):
        want = dev.run(h, {"x": x.astype(np.float64)})["y"].astype(np.float32)
        assert a["outputs"][0]["shape"] == list(want.shape)
        np.testing.assert_array_equal(np.asarray(a["outputs"][0]["data"], dtype=np.float32), want.ravel())
    text = svc.metrics.render().decode()
    # All seven rode one batch (the first request led it, the rest queued behind its pass); the
    # refused request's row never reached the device.
    assert 'offload_batch_size_count{model="risk"} 1.0' in text
    assert f'offload_batch_size_sum{{model="risk"}} {float(sum(len(x) for x in xs))}' in text


def test_every_answer_in_a_mixed_batch_is_the_bytes_its_rows_alone_get(bundle):
    # Single-row answers without an id come from the batch's one list of them; rows with an id,
    # several rows, and a request alone take the encoder: all must be the same bytes.
    svc = ScoringService(bundle, ServeConfig(device="sim"))
    rng = np.random.default_rng(18)
    kinds = [(1, None), (1, None), (2, None), (1, "a"), (1, None), (3, "b"), (1, None)]
    xs = [rng.normal(size=(n, 16)).astype(np.float32) for n, _ in kinds]
    bodies = []
    for x, (_, rid) in zip(xs, kinds):
        req = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
        bodies.append(orjson.dumps(req if rid is None else {**req, "id": rid}))

    async def go():
        await svc._ensure_started()
        try:
            together = await asyncio.gather(*(_post_raw(svc, b) for b in bodies))
            alone = [await _post_raw(svc, b) for b in bodies]
            return together, alone
        finally:
            await svc.batcher.stop()

    together, alone = asyncio.run(go())
    text = svc.metrics.render().decode()
    assert f'offload_batch_size_count{{model="risk"}} {1.0 + len(bodies)}' in text  # one batch, then each alone
    dev = SimDevice()
    h = dev.load(next(iter(bundle.kernels.values())))
    for x, (_, rid), a, b in zip(xs, kinds, together, alone):
        want = encode_json("risk", "1", rid, dev.run(h, {"x": x.astype(np.float64)})["y"].astype(np.float32), OUT)
        assert a == (200, want) and b == (200, want)


def _common_bodies(rng: np.random.Generator) -> list[bytes]:
    """The body every client sends, and near misses of it: an id (string or not), extra keys at
    either level, each field of the wrong type or value, shapes of floats or booleans, batches at
    and past their bounds, data of the wrong length or starting with an int."""
    def tensor(**kw):
        t = {"name": "x", "shape": [2, 4], "datatype": "FP32", "data": rng.normal(size=8).tolist()}
        t.update(kw)
        return t

    drop = object()
    variants = [
        {"inputs": [tensor()]},
        {"id": "r-1", "inputs": [tensor()]},
        {"inputs": [tensor()], "id": None},
        {"inputs": [tensor()], "id": 7},
        {"inputs": [tensor()], "parameters": {"binary_data_output": True}},
        {"inputs": [tensor()], "outputs": [{"name": "y"}]},
        {"inputs": [tensor()], "outputs": [{"name": "z"}]},
        {"inputs": [tensor()], "other": 1},
        {"inputs": [tensor(), tensor()]},
        {"inputs": []},
        {"inputs": tensor()},
        {"inputs": [tensor(parameters={})]},
        {"inputs": [tensor(name="w")]},
        {"inputs": [tensor(datatype="FP64")]},
        {"inputs": [tensor(shape=[2.0, 4])]},
        {"inputs": [tensor(shape=[2, 4.0])]},
        {"inputs": [tensor(shape=[True, 4])]},
        {"inputs": [tensor(shape=[2, 4, 1])]},
        {"inputs": [tensor(shape=(2, 5), data=rng.normal(size=10).tolist())]},
        {"inputs": [tensor(shape=[0, 4], data=[])]},
        {"inputs": [tensor(shape=[64, 4], data=rng.normal(size=256).tolist())]},
        {"inputs": [tensor(shape=[65, 4], data=rng.normal(size=260).tolist())]},
        {"inputs": [tensor(data=rng.normal(size=7).tolist())]},
        {"inputs": [tensor(data=[1] + rng.normal(size=7).tolist())]},
        {"inputs": [tensor(data="0.5")]},
        {"inputs": [tensor(data=drop)]},
        {"inputs": [tensor(shape=drop)]},
        {"inputs": [tensor(data=[[0.5] * 4, [0.5] * 4])]},
        [tensor()],
        "x",
    ]
    bodies = []
    for v in variants:
        if isinstance(v, dict):
            for t in v.get("inputs") if isinstance(v.get("inputs"), list) else ():
                for k in [k for k, x in t.items() if x is drop]:
                    del t[k]
        bodies.append(orjson.dumps(v))
    return bodies


def _parsed_or_error(body: bytes, general: bool = False):
    """What parse_infer makes of ``body`` (``general``: its general parser alone, without the common-body shortcut)."""
    import offload.serve.oip as oip

    try:
        r = oip._parse_general(body, None, INP, OUT, 64, True) if general else parse_infer(body, None, INP, OUT, 64, lazy_json=True)
    except InvalidRequest as e:
        return "error", str(e)
    try:
        x = r.x.convert() if type(r.x) is JsonRows else r.x  # the rows the batch will hold
    except InvalidRequest as e:
        return "refused in its batch", str(e)
    return (x.dtype.str, x.shape, x.tobytes()), r.id, r.binary_output, r.finite


def _taken_by_shortcut(bodies: list[bytes], monkeypatch) -> list[bool]:
    """For each body, whether parse_infer answered it without its general parser."""
    import offload.serve.oip as oip

    general, calls = oip._parse_general, []

    def spy(*a):
        calls.append(a[0])
        return general(*a)

    with monkeypatch.context() as m:
        m.setattr(oip, "_parse_general", spy)
        for b in bodies:
            with contextlib.suppress(InvalidRequest):
                parse_infer(b, None, INP, OUT, 64, lazy_json=True)
    return [b not in calls for b in bodies]


def test_the_common_body_shortcut_answers_every_body_as_the_general_parser_does(monkeypatch):
    bodies = _common_bodies(np.random.default_rng(15))
    taken = _taken_by_shortcut(bodies, monkeypatch)
    fast = [_parsed_or_error(b) for b in bodies]
    slow = [_parsed_or_error(b, general=True) for b in bodies]
    assert fast == slow
    # The shortcut takes the common bodies (plain, with an id string or null, the largest batch,
    # ints in the data) and nothing else.
    assert [i for i, t in enumerate(taken) if t] == [0, 1, 2, 20, 23]
    assert sum(f[0] == "error" for f in fast) > 15


def test_the_shortcut_reads_every_number_text_to_the_doubles_the_general_parser_reads(monkeypatch):
    import struct

    rng = np.random.default_rng(16)
    texts = []
    for i in range(400):  # random bit patterns, each finite double written three ways, and ints
        if i % 2:  # any double (most beyond FP32: refused either way)
            x = struct.unpack("<d", rng.integers(0, 2**64, dtype=np.uint64).tobytes())[0]
        else:  # inside FP32's range, from its subnormals up
            x = float(rng.normal() * 10.0 ** rng.integers(-46, 38))
        if not np.isfinite(x):
            continue
        texts.append([repr(x), f"{x:.17g}", f"{x:.12e}", str(int(rng.integers(-(2**63), 2**63 - 1)))][i % 4])
    texts += ["-0", "0", "-0.0", "1e-400", "2.4703282292062327e-324", "9007199254740993", "18446744073709551615", "18446744073709551616", "1E5"]
    bodies = []
    for k in range(0, len(texts), 4):
        vals = (texts[k : k + 4] + ["0.5"] * 4)[:4]
        bodies.append(('{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[' + ",".join(["0.25", *vals[1:]]) + "]}]}").encode())
        bodies.append(('{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[' + ",".join(vals) + "]}]}").encode())
    fast = [_parsed_or_error(b) for b in bodies]
    assert sum(_taken_by_shortcut(bodies, monkeypatch)) > 150
    assert fast == [_parsed_or_error(b, general=True) for b in bodies]


def test_the_sim_devices_fp32_call_is_its_run_rounded_to_fp32(bundle):
    # What the service binds: FP32 rows in, float32 outputs out, each bit pattern that of the
    # checked run's float64 output cast to FP32; a kind with no rows binding has no bound call.
    from _scale_add import make_kernel

    dev = SimDevice()
    h = dev.load(next(iter(bundle.kernels.values())))
    x = np.random.default_rng(3).normal(scale=4.0, size=(37, 16)).astype(np.float32)
    y = dev.bind_rows(h, fp32=True)(x)
    want = dev.run(h, {"x": x.astype(np.float64)})["y"].astype(np.float32)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))
    hs = dev.load(make_kernel())
    assert dev.bind_rows(hs, fp32=True) is None  # no rows binding: the caller runs it checked
    dev.close()


def test_no_request_compiles_anything_and_every_way_in_answers_the_checked_runs_fp32(bundle):
    # The device's load compiled both signatures of the MLP kernel; JSON rows alone and batched,
    # on the lone-request path and on the queue, and binary rows all reach it as writable C-order
    # float32 arrays, so no request pays a JIT. Every answer is the checked float64 run, in FP32.
    from offload.sim.mlp import fused

    svc = ScoringService(bundle, ServeConfig(device="sim"))
    rng = np.random.default_rng(15)
    xs = [rng.normal(scale=3.0, size=(int(rng.integers(1, 5)), 16)).astype(np.float32) for _ in range(40)]
    json_bodies = [orjson.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}) for x in xs]
    head = orjson.dumps({"inputs": [{"name": "x", "shape": list(xs[0].shape), "datatype": "FP32", "parameters": {"binary_data_size": xs[0].nbytes}}]})
    binary = head + xs[0].tobytes()

    async def go():
        await svc._ensure_started()
        before = len(fused._run_rows.signatures)
        try:
            alone = [await _post(svc, b) for b in json_bodies[:30]]  # past _LONELY_PASSES: the no-queue path
            together = await asyncio.gather(*(_post(svc, b) for b in json_bodies[30:]))
            raw = await _post(svc, binary, [(b"inference-header-content-length", str(len(head)).encode())])
        finally:
            await svc.batcher.stop()
        return alone + list(together), raw, len(fused._run_rows.signatures) - before

    answers, raw, compiled = asyncio.run(go())
    assert compiled == 0
    dev = SimDevice()
    h = dev.load(next(iter(bundle.kernels.values())))
    for x, (status, a) in zip(xs, answers):
        want = dev.run(h, {"x": x.astype(np.float64)})["y"].astype(np.float32)
        assert status == 200
        np.testing.assert_array_equal(np.asarray(a["outputs"][0]["data"], dtype=np.float32).view(np.uint32), want.ravel().view(np.uint32))
    assert raw[0] == 200
    want = dev.run(h, {"x": xs[0].astype(np.float64)})["y"].astype(np.float32)
    np.testing.assert_array_equal(np.asarray(raw[1]["outputs"][0]["data"], dtype=np.float32), want.ravel())
    dev.close()


def test_a_reopened_device_is_probed_at_its_own_precision_not_the_wire_fp32():
    # The runner rounds what it returns to FP32 (the wire type); the probe of a reopened device
    # must compare the device's own outputs with the sim reference's, before that rounding. For
    # a model whose outputs FP32 cannot hold, a rounded-against-exact compare would refuse every
    # fresh handle and keep the device down for good.
    from mlp_cases import quantize_like_hls4ml

    from offload.kernels import Kernel
    from offload.kernels.mlp import MlpSpec
    from offload.sim.mlp import MlpLayer

    rng = np.random.default_rng(16)
    w, b = rng.normal(size=(4, 1)), rng.normal(size=1)
    layer = MlpLayer("fc0", "dense", 4, 1, "ap_fixed<40,12>", weight="ap_fixed<16,2>", bias="ap_fixed<16,2>", accum="ap_fixed<48,20>", use_bias=True)
    consts = {"fc0.weight": quantize_like_hls4ml(w, "ap_fixed<16,2>"), "fc0.bias": quantize_like_hls4ml(b, "ap_fixed<16,2>")}
    spec = MlpSpec(4, "ap_fixed<16,6>", (layer,), consts)
    kernel = Kernel("m", spec, spec.tensors())
    probe = rng.normal(scale=3.0, size=(8, 4)).astype(np.float32).astype(np.float64)
    dev = SimDevice()
    y = dev.run(dev.load(kernel), {"x": probe})["y"]
    dev.close()
    assert not np.array_equal(y.astype(np.float32).astype(np.float64), y)  # outputs FP32 cannot hold
    opened: list = []

    def opener(s):
        d = _NanSim() if s == "sim" and not opened else SimDevice()
        opened.append(d)
        return d

    r = FailoverRunner(kernel, "sim", n_out=spec.n_outputs, fallback="sim", metrics=ServeMetrics(), model="m",
                       opener=opener, reopen_backoff_s=0.01, probe=probe)
    try:
        got, device = r.run_inline(probe)
        assert device == "sim-fallback" and got.dtype == np.float32
        np.testing.assert_array_equal(got, y.astype(np.float32))
        deadline = time.monotonic() + 10
        while r.state != "up" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert r.state == "up", "the reopened device's probe was refused"
        got, device = r.run_inline(probe)
        assert device == "sim"
        np.testing.assert_array_equal(got.view(np.uint32), y.astype(np.float32).view(np.uint32))
    finally:
        r.close()


@pytest.mark.parametrize("api_key", [None, "k"])
def test_uvicorn_takes_the_services_app_for_asgi3(bundle, api_key):
    import uvicorn

    svc = ScoringService(bundle, ServeConfig(device="sim", api_key=api_key))
    config = uvicorn.Config(svc.app, lifespan="off")
    config.load()
    assert config.interface == "asgi3"


def test_a_request_waiting_on_its_batch_suspends_in_one_frame_of_the_service(bundle):
    """Each coroutine between a request's task and the batcher's future is entered and left on
    every resume: the hot path is one coroutine, the app itself, awaiting the future directly."""
    # A delay of whole timer ticks: the request waits on its future for the batch's timer.
    svc = ScoringService(bundle, ServeConfig(device="sim", max_queue_delay_us=20_000))
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [0.25] * 16}]})

    names, (status, _) = asyncio.run(_suspended_in_service(svc, _post(svc, body)))
    assert status == 200
    assert names == ["app"]


async def _suspended_in_service(svc: ScoringService, request) -> tuple[list[str], object]:
    """Runs the coroutine ``request`` on ``svc`` until it waits on its batch: the names of the
    service's coroutines (offload.serve's) suspended between its task and the batcher's future,
    outermost first, and then its result."""
    import os

    import offload.serve.app as app_module

    serve_dir = os.path.dirname(app_module.__file__)
    await svc._ensure_started()
    try:
        task = asyncio.ensure_future(request)
        while svc.batcher.depth == 0:
            await asyncio.sleep(0)
        chain, coro = [], task.get_coro()
        while hasattr(coro, "cr_code"):  # the suspended coroutines, outermost first, to the future
            chain.append(coro.cr_code)
            coro = coro.cr_await
        result = await task
        return [c.co_name for c in chain if os.path.dirname(c.co_filename) == serve_dir], result
    finally:
        await svc.batcher.stop()


def test_an_rpc_waiting_on_its_batch_suspends_in_one_frame_of_the_service(bundle):
    """As on REST: between the RPC's handler and the batcher's future no other coroutine of the
    service (each is entered and left on every resume), and the answer is the checked run's."""
    from offload.serve.grpc_server import Call
    from offload.serve.oip_grpc import OipGrpc
    from offload.serve.proto import grpc_predict_v2_pb2 as pb

    svc = ScoringService(bundle, ServeConfig(device="sim", max_queue_delay_us=20_000))
    oip = OipGrpc(svc)
    x = np.random.default_rng(15).normal(scale=4.0, size=(1, 16)).astype(np.float32)
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 16])
    request = pb.ModelInferRequest(model_name="risk", inputs=[tensor], raw_input_contents=[x.tobytes()])
    names, wire = asyncio.run(_suspended_in_service(svc, oip.model_infer(request, Call([], None))))
    assert names == ["model_infer"]
    resp = pb.ModelInferResponse.FromString(wire)
    dev = SimDevice()
    want = dev.run(dev.load(next(iter(bundle.kernels.values()))), {"x": x.astype(np.float64)})["y"].astype(np.float32)
    assert resp.raw_output_contents[0] == want.tobytes() and list(resp.outputs[0].shape) == [1, 1]


def test_lone_single_row_answers_are_the_encoders_bytes_each_encoded_once(bundle, monkeypatch):
    # A lone id-less one-row JSON request takes its answer from the service's memo, keyed by the
    # output row's bytes: the encoder runs once per different output, and every answer, memoized
    # or not, is the encoder's bytes for that request's own output.
    import offload.serve.app as app_mod

    calls = []

    def counting(*a):
        calls.append(a[3].tobytes())
        return encode_json(*a)

    monkeypatch.setattr(app_mod, "encode_json", counting)
    svc = ScoringService(bundle, ServeConfig(device="sim"))
    assert svc.model.output_rows == 2 ** 9  # the risk score: ap_ufixed<9,0>
    rng = np.random.default_rng(19)
    xs = rng.normal(size=(150, 1, 16)).astype(np.float32) * 3
    xs = np.concatenate([xs, xs[::3]])  # repeated rows: the same outputs again
    dev = SimDevice()
    h = dev.load(next(iter(bundle.kernels.values())))
    wants = [dev.run(h, {"x": x.astype(np.float64)})["y"].astype(np.float32) for x in xs]

    async def go(service):
        await service._ensure_started()
        try:
            return [await _post_raw(service, orjson.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": x.ravel().tolist()}]})) for x in xs]
        finally:
            await service.batcher.stop()

    got = asyncio.run(go(svc))
    for (status, body), y in zip(got, wants):
        assert (status, body) == (200, encode_json("risk", "1", None, y, OUT))
    distinct = {y.tobytes() for y in wants}
    assert 1 < len(distinct) < len(xs)  # the case has both misses and hits
    assert sorted(calls) == sorted(distinct) and len(svc._answers) == len(distinct)

    # A model with more output rows than the bound gets no memo; one that fills it stops keeping
    # answers at the bound. Both still answer every request with the encoder's bytes.
    for bound, memo in ((2**9 - 1, None), (2**9, 3)):
        calls.clear()
        monkeypatch.setattr(app_mod, "_ANSWERS_MAX", bound)
        svc = ScoringService(bundle, ServeConfig(device="sim"))
        assert (svc._answers is None) == (memo is None)
        if memo is not None:
            monkeypatch.setattr(app_mod, "_ANSWERS_MAX", memo)
        got = asyncio.run(go(svc))
        for (status, body), y in zip(got, wants):
            assert (status, body) == (200, encode_json("risk", "1", None, y, OUT))
        kept: list[bytes] = []  # what the memo must hold: the first `memo` different outputs
        misses = 0
        for w in wants:
            if w.tobytes() not in kept:
                misses += 1
                if memo is not None and len(kept) < memo:
                    kept.append(w.tobytes())
        assert len(calls) == misses and (memo is None or sorted(svc._answers) == sorted(kept))
