"""The lean gRPC layer (offload/serve/grpc_server.py) as grpcio's own client sees it (statuses,
messages, metadata, compression, deadlines), and the message framing and headers only a raw
HTTP/2 peer can get wrong. The status codes are grpc's (grpc.StatusCode is the oracle)."""

from __future__ import annotations

import gzip
import time
import zlib

import grpc
import h2.events
import pytest
from _grpc_harness import H2Peer, Req, Resp, grpc_message, in_loop, running

from offload.serve.grpc_server import STATUS_CODES, GrpcError, percent_encode
from offload.serve.http2 import Http2Limits


def _stub(ch: grpc.Channel, name: str):
    return ch.unary_unary(f"/t.T/{name}", request_serializer=Req.SerializeToString, response_deserializer=Resp.FromString)


def test_status_codes_are_grpcs():
    assert STATUS_CODES == {c.name: c.value[0] for c in grpc.StatusCode}
    with pytest.raises(ValueError):
        GrpcError("OK", "an error must not be OK")


@pytest.mark.parametrize("compression", [grpc.Compression.NoCompression, grpc.Compression.Gzip, grpc.Compression.Deflate], ids=["identity", "gzip", "deflate"])
def test_grpcio_calls_with_metadata_and_compression(compression):
    with running() as (port, probe, _, _), grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        resp = _stub(ch, "Echo")(Req(id="e" * 5000, model_name="m"), metadata=(("x-tag", "t1"),), timeout=10, compression=compression)
        assert (resp.id, resp.model_name, resp.model_version) == ("e" * 5000, "m", "t1")
        assert probe.calls == 1


def test_an_error_message_arrives_as_it_was_raised():
    msg = "bad value: é 100% \n\x7f ok"  # UTF-8 beyond ASCII, '%', control characters
    with running() as (port, _, _, _), grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        with pytest.raises(grpc.RpcError) as e:
            _stub(ch, "Refuse")(Req(id=msg), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and e.value.details() == msg
    assert percent_encode("plain text") == b"plain text"
    assert percent_encode("50%\n") == b"50%25%0A"
    assert percent_encode("100%") == b"100%25"  # '%' alone is escaped too, or a client would decode "%41" as "A"


def test_unknown_methods_and_handler_bugs_leave_the_server_serving():
    with running() as (port, probe, _, _), grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        with pytest.raises(grpc.RpcError) as e:
            _stub(ch, "Nope")(Req(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED and "/t.T/Nope" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            _stub(ch, "Boom")(Req(), timeout=10)
        assert e.value.code() == grpc.StatusCode.INTERNAL and e.value.details() == "internal error"  # no trace to the client
        assert probe.statuses == ["UNIMPLEMENTED", "INTERNAL"]
        assert _stub(ch, "Echo")(Req(id="still"), timeout=10).id == "still"


def test_a_client_deadline_cancels_the_handler():
    with running() as (port, probe, _, _), grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            _stub(ch, "Slow")(Req(), timeout=0.3)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - t0 < 5
        end = time.monotonic() + 5
        while probe.cancelled < 1:
            assert time.monotonic() < end, "the handler was never cancelled"
            time.sleep(0.01)
        assert _stub(ch, "Echo")(Req(id="next"), timeout=10).id == "next"


def test_the_server_keeps_a_deadline_the_client_does_not():
    """A peer that sends grpc-timeout and then waits without resetting: the server cancels the
    handler at the deadline and answers DEADLINE_EXCEEDED itself."""
    with running() as (port, probe, _, _):
        peer = H2Peer(port)
        t0 = time.monotonic()
        sid = peer.call("/t.T/Slow", grpc_message(Req().SerializeToString()), [("grpc-timeout", "200m")])
        headers, body, trailers = peer.answer(sid)
        assert headers[b"grpc-status"] == b"4" and 0.15 < time.monotonic() - t0 < 3  # trailers-only
        assert probe.cancelled == 1
        peer.close()


def test_rpcs_past_max_rpcs_are_resource_exhausted():
    with running(max_rpcs=2) as (port, probe, _, loop):
        peer = H2Peer(port)
        slow = [peer.call("/t.T/Slow", grpc_message(Req(id=str(i)).SerializeToString())) for i in range(2)]
        end = time.monotonic() + 5
        while probe.calls < 2:
            assert time.monotonic() < end
            time.sleep(0.01)
        third = peer.call("/t.T/Echo", grpc_message(Req().SerializeToString()))
        assert peer.answer(third)[0][b"grpc-status"] == b"8"
        in_loop(loop, probe.release.set)
        assert [peer.answer(sid)[2][b"grpc-status"] for sid in slow] == [b"0", b"0"]
        peer.close()


_ok = Req(id="framed").SerializeToString()
# (body, extra headers, the grpc-status it gets, words its message holds)
_FRAMING = {
    "no message": (b"", [], b"13", "no request message"),
    "truncated header": (b"\0\0\0", [], b"13", "truncated"),
    "truncated message": (b"\0\0\0\0\x64" + b"x" * 10, [], b"13", "truncated"),
    "two messages": (grpc_message(_ok) * 2, [], b"13", "more than one"),
    "flag 2": (grpc_message(_ok, flag=2), [], b"13", "flag 2"),
    "compressed, no grpc-encoding": (grpc_message(gzip.compress(_ok), flag=1), [], b"13", "without a grpc-encoding"),
    "unknown grpc-encoding": (grpc_message(_ok, flag=1), [("grpc-encoding", "snappy")], b"12", "snappy"),
    "corrupt gzip": (grpc_message(b"\x1f\x8b not gzip", flag=1), [("grpc-encoding", "gzip")], b"13", "does not decompress"),
    "cut-off deflate": (grpc_message(zlib.compress(_ok)[:-4], flag=1), [("grpc-encoding", "deflate")], b"13", "truncated"),
    "gzip bomb": (grpc_message(gzip.compress(b"\0" * (8 << 20)), flag=1), [("grpc-encoding", "gzip")], b"8", "larger than"),
    "not protobuf": (grpc_message(b"\xff\xff\xff"), [], b"13", "does not parse"),
    "malformed grpc-timeout": (grpc_message(_ok), [("grpc-timeout", "soon")], b"13", "grpc-timeout"),
    "grpc-timeout of 9 digits": (grpc_message(_ok), [("grpc-timeout", "123456789S")], b"13", "grpc-timeout"),
}


@pytest.mark.parametrize("case", list(_FRAMING))
def test_a_malformed_request_message_gets_grpcs_status(case):
    body, extra, status, words = _FRAMING[case]
    with running(Http2Limits(max_body_bytes=1 << 20)) as (port, probe, _, _):
        peer = H2Peer(port)
        headers, _, _ = peer.answer(peer.call("/t.T/Echo", body, extra))
        assert headers[b":status"] == b"200" and headers[b"grpc-status"] == status, headers
        assert words in headers[b"grpc-message"].decode()
        if status == b"12":
            assert headers[b"grpc-accept-encoding"] == b"identity, deflate, gzip"
        assert probe.calls == 0 and len(probe.statuses) == 1
        assert Resp.FromString(peer.answer(peer.call("/t.T/Echo", grpc_message(_ok)))[1][5:]).id == "framed"
        peer.close()


@pytest.mark.parametrize(("method", "ctype", "status"), [("GET", "application/grpc", b"405"), ("POST", "text/plain", b"415"), ("POST", "application/grpcx", b"415")])
def test_what_is_not_grpc_gets_an_http_status(method, ctype, status):
    with running() as (port, probe, _, _):
        peer = H2Peer(port)
        sid = peer.h2.get_next_available_stream_id()
        peer.h2.send_headers(sid, [(":method", method), (":scheme", "http"), (":path", "/t.T/Echo"), (":authority", "t"), ("content-type", ctype)], end_stream=True)
        peer.flush()
        evs = peer.events(lambda evs: any(isinstance(e, h2.events.StreamEnded) for e in evs))
        (resp,) = [e for e in evs if isinstance(e, h2.events.ResponseReceived)]
        assert dict(resp.headers)[b":status"] == status and probe.calls == 0
        peer.close()
