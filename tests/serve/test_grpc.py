"""OIP v2 over gRPC against a real ``offload serve --grpc-port`` process (grpc.aio), spoken by a
stock ``tritonclient.grpc``
(and its own generated stub for requests the client cannot form): the same numbers as REST,
health and metadata, the bearer key, refused requests that leave the server serving, the
message-size limit, and one batcher for both protocols. All traffic on 127.0.0.1."""

from __future__ import annotations

import concurrent.futures
import signal
import time

import grpc
import numpy as np
import pytest
from _serve_proc import free_port, risk_bundle, serving

from offload.examples.risk import make_transactions
from offload.host import open_device
from offload.host.bundle import load

tgrpc = pytest.importorskip("tritonclient.grpc")
thttp = pytest.importorskip("tritonclient.http")
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

KEY = "k3y"
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def srv():
    gport = free_port()
    with serving("--grpc-port", str(gport), api_key=KEY) as s:
        s.grpc = f"127.0.0.1:{gport}"
        yield s
        assert s.stop() == 0


@pytest.fixture(scope="module")
def client(srv):
    c = tgrpc.InferenceServerClient(srv.grpc)
    yield c
    c.close()


def _rows(n: int, seed: int = 3) -> np.ndarray:
    return make_transactions(n, seed)[0].astype(np.float32)


def _grpc_infer(c, x: np.ndarray, headers=AUTH, datatype: str = "FP32"):
    i = tgrpc.InferInput("x", list(x.shape), datatype)
    i.set_data_from_numpy(x)
    return c.infer("risk", [i], headers=headers)


def _code(excinfo) -> str:
    return excinfo.value.status()


def test_infer_is_bit_identical_to_rest_binary(srv, client):
    x = _rows(7)
    y = _grpc_infer(client, x).as_numpy("y")
    h = thttp.InferenceServerClient(srv.url.removeprefix("http://"))
    hi = thttp.InferInput("x", list(x.shape), "FP32")
    hi.set_data_from_numpy(x, binary_data=True)
    want = h.infer("risk", [hi], outputs=[thttp.InferRequestedOutput("y", binary_data=True)], headers={"Authorization": f"Bearer {KEY}"}).as_numpy("y")
    h.close()
    assert y.dtype == np.float32 and y.shape == (7, 1)
    assert np.unique(want).size > 1  # real scores, not a constant both sides could agree on
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))


def test_typed_contents_get_typed_contents_back(srv, client):
    x = _rows(3)
    want = _grpc_infer(client, x).as_numpy("y")
    req = service_pb2.ModelInferRequest(model_name="risk", id="req-7")
    t = req.inputs.add(name="x", datatype="FP32", shape=[3, 16])
    t.contents.fp32_contents.extend(x.ravel().tolist())
    with grpc.insecure_channel(srv.grpc) as ch:
        resp = service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, metadata=tuple(AUTH.items()), timeout=10)
    assert resp.id == "req-7" and not resp.raw_output_contents
    (out,) = resp.outputs
    assert (out.name, out.datatype, list(out.shape)) == ("y", "FP32", [3, 1])
    got = np.array(out.contents.fp32_contents, dtype=np.float32).reshape(3, 1)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_health_and_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("risk", headers=AUTH)
    sm = client.get_server_metadata(headers=AUTH)
    assert sm.name == "offload"
    mm = client.get_model_metadata("risk", headers=AUTH)
    assert (mm.name, list(mm.versions), mm.platform) == ("risk", ["1"], "offload_mlp")
    assert [(t.name, t.datatype, list(t.shape)) for t in mm.inputs] == [("x", "FP32", [-1, 16])]
    assert [(t.name, t.datatype, list(t.shape)) for t in mm.outputs] == [("y", "FP32", [-1, 1])]
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("nope", headers=AUTH)
    assert _code(e) == "StatusCode.NOT_FOUND" and "nope" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("risk", model_version="9", headers=AUTH)
    assert _code(e) == "StatusCode.NOT_FOUND"


@pytest.mark.parametrize("headers", [None, {"authorization": "Bearer wrong"}, {"authorization": KEY}, {"authorization": f"Basic {KEY}"}], ids=["none", "wrong-key", "no-scheme", "basic"])
def test_the_key_is_required(client, headers):
    with pytest.raises(InferenceServerException) as e:
        _grpc_infer(client, _rows(1), headers=headers)
    assert _code(e) == "StatusCode.UNAUTHENTICATED"
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("risk", headers=headers)
    assert _code(e) == "StatusCode.UNAUTHENTICATED"


def test_the_scheme_is_case_insensitive_and_health_is_open(client):
    assert _grpc_infer(client, _rows(1), headers={"authorization": f"bEaReR {KEY}"}).as_numpy("y").shape == (1, 1)
    assert client.is_server_live() and client.is_server_ready()  # no key, as /v2/health/* over REST


def _refusals(srv, client) -> list[tuple[str, str]]:
    x = _rows(2)
    nan = x.copy()
    nan[1, 3] = np.nan
    cases = {
        "shape": lambda: _grpc_infer(client, np.zeros((2, 15), np.float32)),
        "dtype": lambda: _grpc_infer(client, x.astype(np.float64), datatype="FP64"),
        "nan": lambda: _grpc_infer(client, nan),
        "inf": lambda: _grpc_infer(client, np.full((1, 16), np.inf, np.float32)),
        "batch": lambda: _grpc_infer(client, np.zeros((65, 16), np.float32)),
    }
    out = []
    for name, call in cases.items():
        with pytest.raises(InferenceServerException) as e:
            call()
        out.append((name, _code(e), e.value.message()))
    # What tritonclient cannot send: raw bytes of the wrong length, raw and typed contents at once.
    with grpc.insecure_channel(srv.grpc) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        short = service_pb2.ModelInferRequest(model_name="risk", raw_input_contents=[b"\0" * 60])
        short.inputs.add(name="x", datatype="FP32", shape=[1, 16])
        both = service_pb2.ModelInferRequest(model_name="risk", raw_input_contents=[b"\0" * 64])
        both.inputs.add(name="x", datatype="FP32", shape=[1, 16]).contents.fp32_contents.extend([0.0] * 16)
        for name, req in (("short", short), ("both", both)):
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(req, metadata=tuple(AUTH.items()), timeout=10)
            out.append((name, str(e.value.code()), e.value.details()))
    return out


def test_malformed_requests_are_invalid_argument_and_the_server_keeps_serving(srv, client):
    before = srv.metrics()
    got = _refusals(srv, client)
    assert [c for _, c, _ in got] == ["StatusCode.INVALID_ARGUMENT"] * len(got), got
    msgs = dict((n, m) for n, _, m in got)
    assert "16" in msgs["shape"] and "FP32" in msgs["dtype"] and "finite" in msgs["nan"] and "64" in msgs["batch"] and "60 bytes" in msgs["short"]
    y = _grpc_infer(client, _rows(2)).as_numpy("y")  # still serving, same numbers
    np.testing.assert_array_equal(y, _grpc_infer(client, _rows(2)).as_numpy("y"))
    after = srv.metrics()
    key = 'offload_grpc_responses_total{code="INVALID_ARGUMENT"}'
    assert after[key] - before.get(key, 0.0) == len(got)
    assert after['offload_errors_total{type="bad_request"}'] - before.get('offload_errors_total{type="bad_request"}', 0.0) == len(got)
    assert srv.proc.poll() is None


def test_an_oversized_message_is_resource_exhausted(srv, client):
    # grpc core refuses it before any handler runs (grpc.max_receive_message_length).
    big = np.zeros((70_000, 16), np.float32)  # 4.5 MB of raw contents; the limit is max_body_bytes, 4 MiB
    with pytest.raises(InferenceServerException) as e:
        _grpc_infer(client, big)
    assert _code(e) == "StatusCode.RESOURCE_EXHAUSTED"
    assert _grpc_infer(client, _rows(1)).as_numpy("y").shape == (1, 1)


def test_rest_and_grpc_requests_share_one_batcher():
    """With a 3 s queue delay and a batch limit of 2, one REST and one gRPC request make up a full
    batch together: the device sees a single batch of 2 rows long before the delay is over."""
    gport = free_port()
    with serving("--grpc-port", str(gport), "--max-batch-size", "2", "--max-queue-delay-us", "3000000", "--request-timeout-ms", "20000") as s:
        x = _rows(2)
        c = tgrpc.InferenceServerClient(f"127.0.0.1:{gport}")
        h = thttp.InferenceServerClient(s.url.removeprefix("http://"))
        hi = thttp.InferInput("x", [1, 16], "FP32")
        hi.set_data_from_numpy(x[1:], binary_data=True)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            fg = pool.submit(_grpc_infer, c, x[:1], None)
            fh = pool.submit(h.infer, "risk", [hi])
            yg, yh = fg.result(timeout=30).as_numpy("y"), fh.result(timeout=30).as_numpy("y")
        m = s.metrics()
        c.close()
        h.close()
        assert m['offload_batch_size_count{model="risk"}'] == 1 and m['offload_batch_size_sum{model="risk"}'] == 2
        # The 3 s delay never ran out: a full batch goes at once.
        assert m['offload_queue_duration_seconds_count{model="risk"}'] == 2
        assert m['offload_queue_duration_seconds_bucket{le="2.0",model="risk"}'] == 2
        assert yg.shape == yh.shape == (1, 1)
        assert s.stop() == 0


def test_a_missed_client_deadline_is_counted_and_the_server_keeps_serving():
    """A request still queued behind a 3 s batching window when the client's 0.3 s deadline passes:
    the client gets DEADLINE_EXCEEDED, the transport cancels the handler, and the response is
    counted under its code (the transport sends that status, not the handler)."""
    gport = free_port()
    with serving("--grpc-port", str(gport), "--max-queue-delay-us", "3000000", "--request-timeout-ms", "20000") as s:
        c = tgrpc.InferenceServerClient(f"127.0.0.1:{gport}")
        i = tgrpc.InferInput("x", [1, 16], "FP32")
        i.set_data_from_numpy(_rows(1))
        with pytest.raises(InferenceServerException) as e:
            c.infer("risk", [i], client_timeout=0.3)
        assert _code(e) == "StatusCode.DEADLINE_EXCEEDED"
        key = 'offload_grpc_responses_total{code="DEADLINE_EXCEEDED"}'
        end = time.monotonic() + 20
        while s.metrics().get(key, 0.0) != 1:
            assert time.monotonic() < end, f"{key} never reached 1"
            time.sleep(0.05)
        assert c.infer("risk", [i], client_timeout=20).as_numpy("y").shape == (1, 1)
        c.close()
        assert s.stop() == 0


def test_sigterm_answers_the_grpc_requests_already_taken():
    """Requests queued behind a 3 s batching window when SIGTERM arrives are answered (with the
    right numbers) before the process exits 0: the gRPC server is stopped with a grace period
    while the batcher still runs."""
    gport = free_port()
    with serving("--grpc-port", str(gport), "--max-queue-delay-us", "3000000", "--request-timeout-ms", "20000") as s:
        x = _rows(4, seed=9)
        c = tgrpc.InferenceServerClient(f"127.0.0.1:{gport}")
        dev = open_device("sim")
        h = dev.load(next(iter(load(risk_bundle()).kernels.values())))
        want = [dev.run(h, {"x": x[i : i + 1].astype(np.float64)})["y"].astype(np.float32) for i in range(4)]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futs = [pool.submit(_grpc_infer, c, x[i : i + 1], None) for i in range(4)]
            end = time.monotonic() + 20
            while s.metrics().get('offload_queue_depth{model="risk"}', 0.0) != 4:  # all four queued
                assert time.monotonic() < end, "requests never queued"
                time.sleep(0.05)
            s.proc.send_signal(signal.SIGTERM)
            got = [f.result(timeout=30).as_numpy("y") for f in futs]
        c.close()
        for i in range(4):
            np.testing.assert_array_equal(got[i], want[i], err_msg=f"request {i}")
        assert s.proc.wait(timeout=30) == 0


def test_every_serve_error_has_a_grpc_status_in_the_one_table():
    from offload.serve import errors

    for cls, (http, kind, code) in errors.HTTP_STATUS.items():
        assert code in grpc.StatusCode.__members__, f"{cls.__name__}: {code!r} is no gRPC status"
        assert errors.grpc_answer(cls("x")) == (code, kind) and errors.answer(cls("x")) == (http, kind)
        assert code != "OK"
    assert errors.grpc_answer(errors.InvalidRequest("x")) == ("INVALID_ARGUMENT", "bad_request")
    assert errors.grpc_answer(errors.QueueFull("x"))[0] == "UNAVAILABLE"  # the code clients retry
