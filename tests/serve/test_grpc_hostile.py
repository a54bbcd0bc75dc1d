"""Hostile gRPC against a real ``offload serve --grpc-port`` process (grpc.aio): the probes a
server on the network meets (rapid reset, CONTINUATION and HPACK floods, flow-control abuse,
compression bombs, peers that never read), malformed messages, a burst on one channel, and SIGTERM
under load. After each probe a well-behaved client is served. All traffic on 127.0.0.1."""

from __future__ import annotations

import concurrent.futures
import gzip
import os
import signal
import socket
import threading
import time

import grpc
import hpack
import numpy as np
import pytest
from _grpc_harness import INFER, LIVE, frame, goaway_code, grpc_message, header_block, raw_connection, read_frames, request_headers
from _serve_proc import free_port, serving

from offload.serve.proto import grpc_predict_v2_pb2 as pb

N_IN = 16


def _request(rows: int = 1, rid: str = "") -> pb.ModelInferRequest:
    t = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[rows, N_IN])
    return pb.ModelInferRequest(model_name="risk", id=rid, inputs=[t], raw_input_contents=[np.full((rows, N_IN), 0.25, "<f4").tobytes()])


def _infer(target: str, req: pb.ModelInferRequest | bytes, timeout: float = 10.0):
    with grpc.insecure_channel(target) as ch:
        call = ch.unary_unary(INFER, request_serializer=None, response_deserializer=pb.ModelInferResponse.FromString)
        return call(req if isinstance(req, bytes) else req.SerializeToString(), timeout=timeout)


@pytest.fixture(scope="module")
def srv():
    gport = free_port()
    with serving("--grpc-port", str(gport), "--max-queue-delay-us", "0") as s:
        s.gport, s.grpc = gport, f"127.0.0.1:{gport}"
        _infer(s.grpc, _request())  # up
        yield s
        assert s.stop() == 0


def _serves(srv) -> None:
    resp = _infer(srv.grpc, _request(rid="after"))
    assert resp.id == "after" and len(resp.raw_output_contents[0]) == 4
    assert srv.proc.poll() is None


def test_a_malformed_message_is_invalid_argument_never_unknown(srv):
    for wire in (b"\xff\xff\xff\xff", b"\x0a\x05ab", _request().SerializeToString()[:-3]):
        with pytest.raises(grpc.RpcError) as e:
            _infer(srv.grpc, wire)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (wire, e.value.code(), e.value.details())
        assert "Traceback" not in e.value.details() and "ModelInferRequest" in e.value.details()
    _serves(srv)


def test_a_burst_of_300_rpcs_on_one_channel_is_answered(srv):
    before = srv.metrics()
    with grpc.insecure_channel(srv.grpc) as ch:
        call = ch.unary_unary(INFER, request_serializer=None, response_deserializer=pb.ModelInferResponse.FromString)
        futs = [call.future(_request(rid=str(i)).SerializeToString(), timeout=60) for i in range(300)]
        got = [f.result() for f in futs]
    assert [r.id for r in got] == [str(i) for i in range(300)]
    key = 'offload_grpc_responses_total{code="OK"}'
    assert srv.metrics()[key] - before.get(key, 0.0) == 300


def test_every_refusal_in_a_burst_shows_in_the_metrics():
    # A queue of 4 against 200 concurrent RPCs, batches gathered for 20 ms: some are refused. Each
    # status a client gets is counted under its code (before: grpc's own concurrency limit refused
    # RPCs unseen by the metrics).
    gport = free_port()
    with serving("--grpc-port", str(gport), "--max-queue-size", "4", "--max-batch-size", "64", "--max-queue-delay-us", "20000") as s:
        target = f"127.0.0.1:{gport}"
        _infer(target, _request())  # up
        before = s.metrics()
        codes: dict[str, int] = {}
        with grpc.insecure_channel(target) as ch:
            call = ch.unary_unary(INFER, request_serializer=None, response_deserializer=pb.ModelInferResponse.FromString)
            futs = [call.future(_request(rid=str(i)).SerializeToString(), timeout=30) for i in range(200)]
            for f in futs:
                try:
                    f.result()
                    code = "OK"
                except grpc.RpcError as e:
                    code = e.code().name
                codes[code] = codes.get(code, 0) + 1
        after = s.metrics()
        assert s.stop() == 0
    counted = {c: after.get(f'offload_grpc_responses_total{{code="{c}"}}', 0.0) - before.get(f'offload_grpc_responses_total{{code="{c}"}}', 0.0) for c in codes}
    assert counted == {c: float(n) for c, n in codes.items()}, (codes, counted)
    assert codes.get("UNAVAILABLE", 0) > 0 and set(codes) <= {"OK", "UNAVAILABLE"}, codes  # a full queue: retry elsewhere


def test_a_flood_of_reset_streams_leaves_the_server_serving(srv):
    enc = hpack.Encoder()
    s = raw_connection(srv.gport)
    body = grpc_message(_request().SerializeToString())
    burst = b"".join(frame(1, 4, sid, header_block(request_headers(INFER), enc)) + frame(0, 1, sid, body) + frame(3, 0, sid, b"\0\0\0\x08") for sid in range(1, 2 * 3000, 2))
    try:
        s.sendall(burst)
    except (BrokenPipeError, ConnectionResetError):
        pass  # grpc core ended the connection as abusive: what it may do
    read_frames(s, timeout=3)
    s.close()
    _serves(srv)


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the server's memory from /proc (Linux)")
@pytest.mark.xfail(
    strict=True,
    reason="grpcio 1.85 keeps a header block's CONTINUATION frames in memory past grpc.max_metadata_size and "
    "grpc.absolute_max_metadata_size (64 MB sent grew the server by ~58 MB); SECURITY.md: expose gRPC behind a proxy "
    "that caps header blocks. Strict: a grpcio that fixes it makes this test fail, so the note is removed then.",
)
def test_a_continuation_flood_holds_no_memory_and_others_are_served(srv):
    # One header block that never ends: the server should hold at most its metadata limit of it.
    rss0 = _rss_kib(srv.proc.pid)
    s = raw_connection(srv.gport)
    s.settimeout(10)
    sent = 0
    try:
        s.sendall(frame(1, 0, 1, header_block(request_headers(INFER))))
        junk = frame(9, 0, 1, b"\x40\x01a\x01b" * 3000)  # literal headers, never END_HEADERS
        while sent < 64 << 20:
            s.sendall(junk)
            sent += len(junk)
            if sent % (8 << 20) < len(junk):
                _serves(srv)  # others are served while it floods
    except (BrokenPipeError, ConnectionResetError):
        pass  # cut off: better still
    finally:
        s.close()
    assert _rss_kib(srv.proc.pid) - rss0 < 32 << 10, f"{sent} bytes of one header block grew the server by {_rss_kib(srv.proc.pid) - rss0} KiB"
    _serves(srv)


def test_an_hpack_table_bomb_is_refused(srv):
    # One 4 KiB value in the dynamic table, then referenced thousands of times: a few KB on the
    # wire that decode to tens of MB of metadata, past grpc.max_metadata_size.
    enc = hpack.Encoder()
    first = enc.encode(request_headers(INFER, [("x-bomb", "a" * 4000)]))
    ref = enc.encode([("x-bomb", "a" * 4000)])  # now one byte: an index into the table
    s = raw_connection(srv.gport)
    s.sendall(frame(1, 5, 1, first + ref * 8000) + frame(0, 1, 1, grpc_message(_request().SerializeToString())))
    frames, closed = read_frames(s, timeout=5, stop=lambda fs: any(t in (3, 7) or (t == 1 and f & 1) for t, f, _, _ in fs))
    s.close()
    answered_ok = any(t == 1 and f & 1 and (b"grpc-status", b"0") in hpack.Decoder().decode(p, raw=True) for t, f, _, p in frames)
    assert not answered_ok, "a 32 MB header list was accepted"
    _serves(srv)


def test_a_window_overflow_leaves_the_server_serving(srv):
    # RFC 9113 6.9.1 makes a window past 2**31-1 a FLOW_CONTROL_ERROR; grpc core clamps it
    # instead. Either way the window cannot make it send more than the peer reads.
    s = raw_connection(srv.gport)
    s.sendall(frame(8, 0, 0, b"\x7f\xff\xff\xff") * 2)
    frames, closed = read_frames(s, timeout=2)
    s.close()
    assert goaway_code(frames) in (None, 0x3)
    _serves(srv)


def test_a_compression_bomb_is_resource_exhausted(srv):
    # 64 MiB of zeros in 64 KB of gzip: the decompressed message is past max_body_bytes (4 MiB).
    bomb = gzip.compress(b"\0" * (64 << 20), 9)
    enc = hpack.Encoder()
    s = raw_connection(srv.gport)
    s.sendall(frame(1, 4, 1, header_block(request_headers(INFER, [("grpc-encoding", "gzip")]), enc)))
    msg = grpc_message(bomb, flag=1)
    for i in range(0, len(msg), 16384):
        s.sendall(frame(0, 1 if i + 16384 >= len(msg) else 0, 1, msg[i : i + 16384]))
    frames, _ = read_frames(s, timeout=10, stop=lambda fs: any(t == 3 or (t == 1 and f & 1) for t, f, _, _ in fs))
    s.close()
    trailers = [hpack.Decoder().decode(p, raw=True) for t, f, _, p in frames if t == 1 and f & 1]
    codes = {v for h in trailers for k, v in h if k == b"grpc-status"}
    assert codes == {b"8"} or any(t == 3 for t, *_ in frames), frames  # RESOURCE_EXHAUSTED, or the stream reset
    _serves(srv)


def test_peers_that_never_read_cannot_hold_every_rpc_slot():
    # 20 connections with a receive window of 0, each opening as many RPCs as a connection may
    # (grpc_max_streams) and never reading an answer: their answers cannot be sent, so their RPCs
    # stay in progress, 20 x 8 of them, more than max_queue_size. A well-behaved client is still
    # answered: a computed answer waiting for its peer to read holds no slot (before: grpc's
    # maximum_concurrent_rpcs counted them, and every other client got RESOURCE_EXHAUSTED).
    gport = free_port()
    with serving("--grpc-port", str(gport), "--grpc-max-streams", "8", "--max-queue-size", "64", "--max-queue-delay-us", "0") as s:
        target = f"127.0.0.1:{gport}"
        body = grpc_message(_request().SerializeToString())
        stalled = []
        try:
            for _ in range(20):
                c = raw_connection(gport, initial_window_size=0)
                enc = hpack.Encoder()
                c.sendall(b"".join(frame(1, 4, sid, header_block(request_headers(INFER), enc)) + frame(0, 1, sid, body) for sid in range(1, 2 * 8, 2)))
                stalled.append(c)
            time.sleep(0.5)
            for i in range(5):
                assert _infer(target, _request(rid=f"free-{i}"), timeout=10).id == f"free-{i}"
        finally:
            for c in stalled:
                c.close()
        assert s.stop() == 0


def test_sigterm_under_load_answers_every_rpc_it_took():
    # 16 clients call in a loop; SIGTERM comes mid-stream. An RPC the server took is answered (OK);
    # one it did not take fails UNAVAILABLE (a client may retry it). Never CANCELLED or UNKNOWN.
    gport = free_port()
    with serving("--grpc-port", str(gport), "--max-queue-delay-us", "2000") as s:
        target = f"127.0.0.1:{gport}"
        codes: dict[str, int] = {}
        lock = threading.Lock()
        stop = threading.Event()

        def client() -> None:
            with grpc.insecure_channel(target) as ch:
                call = ch.unary_unary(INFER, request_serializer=None, response_deserializer=pb.ModelInferResponse.FromString)
                wire = _request().SerializeToString()
                while not stop.is_set():
                    try:
                        call(wire, timeout=20)
                        code = "OK"
                    except grpc.RpcError as e:
                        code = e.code().name
                    with lock:
                        codes[code] = codes.get(code, 0) + 1
                    if code != "OK":
                        return

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futs = [pool.submit(client) for _ in range(16)]
            end = time.monotonic() + 30
            while codes.get("OK", 0) < 300:
                assert time.monotonic() < end, codes
                time.sleep(0.02)
            s.proc.send_signal(signal.SIGTERM)
            assert s.proc.wait(timeout=30) == 0
            stop.set()
            for f in futs:
                f.result(timeout=30)
    assert set(codes) <= {"OK", "UNAVAILABLE"}, codes


def test_a_connection_that_sends_nothing_does_not_stop_the_server(srv):
    idle = [socket.create_connection(("127.0.0.1", srv.gport), timeout=5) for _ in range(50)]
    try:
        _serves(srv)
    finally:
        for c in idle:
            c.close()
    assert _infer(srv.grpc, _request(rid="x")).id == "x"
    assert pb.ServerLiveResponse.FromString(grpc.insecure_channel(srv.grpc).unary_unary(LIVE, request_serializer=None)(b"", timeout=5)).live
