"""offload's HTTP/2 server layer (offload/serve/http2.py) against an independent peer (``h2``,
which checks every frame it receives) and against raw frames that break the protocol on purpose:
each connection error ends in GOAWAY with RFC 9113's code and leaves the server serving; stream
errors touch only their stream; the limits in the module docstring hold."""

from __future__ import annotations

import asyncio
import struct
import time

import h2.events
import h2.settings
import hpack
import pytest
from _grpc_harness import PREFACE, H2Peer, Req, Resp, frame, goaway_code, grpc_message, header_block, in_loop, raw_connection, read_frames, request_headers, running
from hypothesis import given, settings
from hypothesis import strategies as st

from offload.serve.http2 import HeaderDecoder, Http2Limits, _all_indexed, encode_headers

ECHO = "/t.T/Echo"


def _echo(peer: H2Peer, rid: str, extra=()) -> tuple[dict, Resp, dict]:
    sid = peer.call(ECHO, grpc_message(Req(id=rid, model_name="m").SerializeToString()), extra)
    headers, body, trailers = peer.answer(sid)
    assert body[0] == 0 and int.from_bytes(body[1:5], "big") == len(body) - 5
    return headers, Resp.FromString(body[5:]), trailers


def _still_serves(port: int) -> None:
    peer = H2Peer(port)
    _, resp, trailers = _echo(peer, "after")
    assert resp.id == "after" and trailers[b"grpc-status"] == b"0"
    peer.close()


def test_unary_exchanges_are_valid_http2_for_an_independent_peer():
    with running() as (port, probe, _, _):
        peer = H2Peer(port)
        headers, resp, trailers = _echo(peer, "one", [("x-tag", "v7")])
        assert headers[b":status"] == b"200" and headers[b"content-type"] == b"application/grpc"
        assert (resp.id, resp.model_name, resp.model_version) == ("one", "m", "v7")
        assert trailers == {b"grpc-status": b"0"}
        # Several streams in flight at once on the connection, answered each on its own.
        sids = {peer.call(ECHO, grpc_message(Req(id=f"r{i}").SerializeToString())): f"r{i}" for i in range(8)}
        for sid, rid in sids.items():
            _, body, trailers = peer.answer(sid)
            assert Resp.FromString(body[5:]).id == rid and trailers[b"grpc-status"] == b"0"
        assert probe.calls == 9
        peer.close()


def test_a_request_past_the_stream_window_gets_window_updates():
    big = "x" * (3 << 20)  # 3 MiB: three times the stream window the server grants, under max_body_bytes
    with running() as (port, _, _, _):
        peer = H2Peer(port)
        sid = peer.h2.get_next_available_stream_id()
        peer.h2.send_headers(sid, request_headers(ECHO))
        peer.send_body(sid, grpc_message(Req(id=big).SerializeToString()))
        _, body, trailers = peer.answer(sid, timeout=30)
        assert Resp.FromString(body[5:]).id == big and trailers[b"grpc-status"] == b"0"
        peer.close()


def test_a_response_waits_for_the_peers_windows():
    """A peer with a 100-byte stream window and a 70 KB answer (past the 65,535-byte connection
    window and the 16 KiB frame): nothing beyond the window is sent until the peer opens it."""
    rid = "y" * 70_000
    with running() as (port, _, _, _):
        peer = H2Peer(port, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100})
        peer.events(lambda evs: any(isinstance(e, h2.events.SettingsAcknowledged) for e in evs), timeout=5)
        sid = peer.call(ECHO, grpc_message(Req(id=rid).SerializeToString()))
        held = peer.events(lambda evs: False, timeout=0.5, ack=False)
        got = sum(len(e.data) for e in held if isinstance(e, h2.events.DataReceived))
        assert got == 100 and not any(isinstance(e, h2.events.StreamEnded) for e in held)
        for e in held:  # now let the rest through
            if isinstance(e, h2.events.DataReceived):
                peer.h2.acknowledge_received_data(e.flow_controlled_length, sid)
        peer.flush()
        _, body, trailers = peer.answer(sid)
        first = b"".join(e.data for e in held if isinstance(e, h2.events.DataReceived))
        assert Resp.FromString((first + body)[5:]).id == rid and trailers[b"grpc-status"] == b"0"
        peer.close()


def test_an_oversized_request_is_answered_at_once_and_the_connection_lives_on():
    enc = hpack.Encoder()
    with running(Http2Limits(max_body_bytes=10_000)) as (port, probe, _, _):
        s = raw_connection(port)
        s.sendall(frame(1, 4, 1, header_block(request_headers(ECHO), enc)) + b"".join(frame(0, 0, 1, b"z" * 8000) for _ in range(4)))
        got = read_frames(s, timeout=5, stop=lambda fs: any(t == 3 and sid == 1 for t, _, sid, _ in fs))
        dec = hpack.Decoder()
        (head,) = [dec.decode(p, raw=True) for t, _, sid, p in got if t == 1 and sid == 1]
        assert (b"grpc-status", b"8") in head  # RESOURCE_EXHAUSTED, trailers-only
        assert [int.from_bytes(p, "big") for t, _, sid, p in got if t == 3 and sid == 1] == [0]  # RST_STREAM NO_ERROR
        assert probe.statuses == ["RESOURCE_EXHAUSTED"] and probe.calls == 0
        # The rest of the body is dropped, and the same connection (same HPACK state) serves on.
        s.sendall(frame(0, 1, 1, b"z" * 100) + frame(1, 4, 3, header_block(request_headers(ECHO), enc)) + frame(0, 1, 3, grpc_message(Req(id="ok").SerializeToString())))
        got = read_frames(s, timeout=5, stop=lambda fs: any(t == 1 and sid == 3 and f & 1 for t, f, sid, _ in fs))
        data = b"".join(p for t, _, sid, p in got if t == 0 and sid == 3)
        assert Resp.FromString(data[5:]).id == "ok"
        s.close()


def test_streams_past_the_limit_are_refused():
    with running(Http2Limits(max_streams=2)) as (port, probe, _, loop):
        peer = H2Peer(port)
        sids = [peer.call("/t.T/Slow", grpc_message(Req(id=str(i)).SerializeToString())) for i in range(3)]
        evs = peer.events(lambda evs: any(isinstance(e, h2.events.StreamReset) for e in evs), timeout=5)
        (reset,) = [e for e in evs if isinstance(e, h2.events.StreamReset)]
        assert reset.stream_id == sids[2] and reset.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
        in_loop(loop, probe.release.set)
        for sid in sids[:2]:
            assert peer.answer(sid)[2][b"grpc-status"] == b"0"
        peer.close()


def test_a_reset_stream_counts_until_its_handler_lets_go():
    """The rapid-reset defence: a stream the peer resets frees its place only when its handler
    has stopped, so resets cannot keep new work starting while the old runs."""
    with running(Http2Limits(max_streams=1)) as (port, probe, _, _):
        peer = H2Peer(port)
        sid = peer.call("/t.T/Slow", grpc_message(Req(id="stubborn").SerializeToString()))
        end = time.monotonic() + 5
        while probe.calls < 1:
            assert time.monotonic() < end
            time.sleep(0.01)
        peer.h2.reset_stream(sid)
        peer.flush()
        refused = peer.call(ECHO, grpc_message(Req(id="too soon").SerializeToString()))
        evs = peer.events(lambda evs: any(isinstance(e, h2.events.StreamReset) for e in evs), timeout=5)
        assert [(e.stream_id, e.error_code) for e in evs if isinstance(e, h2.events.StreamReset)] == [(refused, h2.errors.ErrorCodes.REFUSED_STREAM)]
        time.sleep(0.8)  # the stubborn handler takes 0.5 s to stop after its cancel
        assert probe.cancelled == 1
        assert _echo(peer, "later")[1].id == "later"
        peer.close()


_BAD_HEADERS = {
    "upper-case name": [*request_headers(ECHO), ("X-Tag", "1")],
    "connection header": [*request_headers(ECHO), ("connection", "keep-alive")],
    "te other than trailers": [*request_headers(ECHO)[:5], ("te", "gzip")],
    "no :path": [h for h in request_headers(ECHO) if h[0] != ":path"],
    "pseudo after regular": [("content-type", "application/grpc"), *request_headers(ECHO)[:4]],
    "unknown pseudo": [*request_headers(ECHO)[:4], (":status", "200"), ("content-type", "application/grpc")],
}


@pytest.mark.parametrize("case", list(_BAD_HEADERS))
def test_a_malformed_request_resets_only_its_stream(case):
    enc = hpack.Encoder()
    with running() as (port, probe, _, _):
        s = raw_connection(port)
        s.sendall(frame(1, 5, 1, header_block(_BAD_HEADERS[case], enc)))
        got = read_frames(s, timeout=5, stop=lambda fs: any(t == 3 for t, *_ in fs))
        assert [(sid, int.from_bytes(p, "big")) for t, _, sid, p in got if t == 3] == [(1, 1)]  # PROTOCOL_ERROR
        s.sendall(frame(1, 4, 3, header_block(request_headers(ECHO), enc)) + frame(0, 1, 3, grpc_message(Req(id="ok").SerializeToString())))
        got = read_frames(s, timeout=5, stop=lambda fs: any(t == 1 and sid == 3 and f & 1 for t, f, sid, _ in fs))
        assert Resp.FromString(b"".join(p for t, _, sid, p in got if t == 0 and sid == 3)[5:]).id == "ok"
        assert probe.calls == 1
        s.close()


def _headers_frame(flags: int = 5, sid: int = 1) -> bytes:
    return frame(1, flags, sid, header_block(request_headers(ECHO)))


def _bomb() -> bytes:
    """A 4 KB value entered in the table once, then named by index again and again: a small block
    whose decoded list is far past 16 KiB."""
    enc = hpack.Encoder()
    first = enc.encode([("x-big", "b" * 4000)])
    return first + b"\xbe" * 10  # index 62: the entry just added


# (what comes after the preface and a SETTINGS frame, the GOAWAY code RFC 9113 asks for)
_CONNECTION_ERRORS = {
    "frame past max size": (frame(0, 0, 1, b"x" * 16385), 0x6),
    "DATA on an idle stream": (frame(0, 1, 5, b"abc"), 0x1),
    "HEADERS on an even stream": (_headers_frame(sid=2), 0x1),
    "HEADERS on stream 0": (_headers_frame(sid=0), 0x1),
    "a header block interrupted": (_headers_frame(flags=1) + frame(6, 0, 0, b"12345678"), 0x1),
    "CONTINUATION alone": (frame(9, 4, 1, b"\x82"), 0x1),
    "header block flood": (frame(1, 0, 1, b"\x82" * 16000) + frame(9, 0, 1, b"\x82" * 16000), 0xB),
    "HPACK bomb": (frame(1, 5, 1, _bomb()), 0xB),
    "HPACK index out of range": (frame(1, 5, 1, b"\xff\x80\x7f"), 0x9),
    "WINDOW_UPDATE of 0 on the connection": (frame(8, 0, 0, b"\0\0\0\0"), 0x1),
    "connection window past 2^31-1": (frame(8, 0, 0, (2**31 - 1).to_bytes(4, "big")), 0x3),
    "SETTINGS of 5 bytes": (frame(4, 0, 0, b"\0" * 5), 0x6),
    "SETTINGS_INITIAL_WINDOW_SIZE 2^31": (frame(4, 0, 0, struct.pack(">HI", 4, 2**31)), 0x3),
    "SETTINGS_MAX_FRAME_SIZE 100": (frame(4, 0, 0, struct.pack(">HI", 5, 100)), 0x1),
    "SETTINGS ACK with a payload": (frame(4, 1, 0, b"\0" * 6), 0x6),
    "PUSH_PROMISE": (frame(5, 4, 1, b"\0\0\0\2"), 0x1),
    "PING of 4 bytes": (frame(6, 0, 0, b"1234"), 0x6),
    "RST_STREAM on an idle stream": (frame(3, 0, 9, b"\0\0\0\x08"), 0x1),
    "GOAWAY on a stream": (frame(7, 0, 1, b"\0" * 8), 0x1),
    "padding longer than the frame": (frame(0, 0x9, 1, b"\x09abc"), 0x1),
}


@pytest.mark.parametrize("case", list(_CONNECTION_ERRORS))
def test_a_connection_error_ends_in_goaway_and_the_server_serves_on(case):
    tail, code = _CONNECTION_ERRORS[case]
    if case == "padding longer than the frame":  # needs an open stream for its DATA
        tail = _headers_frame(flags=4) + tail
    with running() as (port, _, _, _):
        s = raw_connection(port)
        s.sendall(tail)
        got = read_frames(s, timeout=5)
        assert goaway_code(got) == code, got
        assert s.recv(1) == b""  # closed after the GOAWAY
        s.close()
        _still_serves(port)


@pytest.mark.parametrize("opening", [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", PREFACE + frame(6, 0, 0, b"12345678")], ids=["http/1.1", "first frame not SETTINGS"])
def test_a_bad_opening_is_refused(opening):
    import socket

    with running() as (port, _, _, _):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(opening)
        got = read_frames(s, timeout=5)
        assert got[0][0] == 4 and goaway_code(got) == 0x1  # the server's SETTINGS, then GOAWAY PROTOCOL_ERROR
        s.close()
        _still_serves(port)


def test_ping_is_answered_with_its_payload():
    with running() as (port, _, _, _):
        s = raw_connection(port)
        s.sendall(frame(6, 0, 0, b"8 bytes!"))
        got = read_frames(s, timeout=5, stop=lambda fs: any(t == 6 for t, *_ in fs))
        assert [(f, p) for t, f, _, p in got if t == 6] == [(1, b"8 bytes!")]
        s.close()


def test_a_silent_connection_and_an_unfinished_request_time_out():
    with running(Http2Limits(header_timeout_s=0.3, body_timeout_s=0.3)) as (port, probe, _, _):
        import socket

        silent = socket.create_connection(("127.0.0.1", port), timeout=10)
        t0 = time.monotonic()
        got = read_frames(silent, timeout=5)
        assert goaway_code(got) == 0x1 and 0.25 < time.monotonic() - t0 < 3
        silent.close()
        s = raw_connection(port)
        s.sendall(_headers_frame(flags=4) + frame(0, 0, 1, b"\0\0\0"))  # headers, part of a body, then nothing
        got = read_frames(s, timeout=5, stop=lambda fs: any(t == 3 for t, *_ in fs))
        assert [(sid, int.from_bytes(p, "big")) for t, _, sid, p in got if t == 3] == [(1, 0x8)]  # CANCEL
        assert probe.calls == 0
        s.close()
        _still_serves(port)


def test_connections_past_the_cap_get_goaway():
    with running(Http2Limits(max_connections=2)) as (port, _, _, _):
        a, b = H2Peer(port), H2Peer(port)
        assert _echo(a, "a")[1].id == "a" and _echo(b, "b")[1].id == "b"
        s = raw_connection(port)
        assert goaway_code(read_frames(s, timeout=5)) == 0xB
        s.close()
        a.close()
        time.sleep(0.2)
        _still_serves(port)
        b.close()


def test_a_flood_of_resets_ends_the_connection():
    enc = hpack.Encoder()
    with running() as (port, _, _, _):
        s = raw_connection(port)
        burst = b"".join(frame(1, 4, sid, header_block(request_headers("/t.T/Slow"), enc)) + frame(3, 0, sid, b"\0\0\0\x08") for sid in range(1, 2 * 1100, 2))
        s.sendall(burst)
        assert goaway_code(read_frames(s, timeout=10)) == 0xB
        s.close()
        _still_serves(port)


def test_stop_sends_goaway_and_answers_the_streams_it_has():
    """Raw frames: h2 stops reading at a GOAWAY (its state machine closes), which RFC 9113 6.8
    does not ask; grpc core clients read on, as tests/serve/test_grpc.py's SIGTERM test shows."""
    with running() as (port, probe, srv, loop):
        s = raw_connection(port)
        s.sendall(frame(1, 4, 1, header_block(request_headers("/t.T/Slow"))) + frame(0, 1, 1, grpc_message(Req(id="in flight").SerializeToString())))
        end = time.monotonic() + 5
        while probe.calls < 1:
            assert time.monotonic() < end
            time.sleep(0.01)
        stopping = asyncio.run_coroutine_threadsafe(srv.stop(5.0), loop)
        got = read_frames(s, timeout=5, stop=lambda fs: any(t == 7 for t, *_ in fs))
        (bye,) = [p for t, _, _, p in got if t == 7]
        assert struct.unpack(">II", bye[:8]) == (1, 0)  # last stream 1, NO_ERROR
        in_loop(loop, probe.release.set)
        got = read_frames(s, timeout=5)  # the answer, then the server closes
        data = b"".join(p for t, _, sid, p in got if t == 0 and sid == 1)
        assert Resp.FromString(data[5:]).id == "in flight"
        assert [hpack.Decoder().decode(p, raw=True) for t, f, sid, p in got if t == 1 and f & 1][-1][-1] == (b"grpc-status", b"0")
        stopping.result(10)
        s.close()


# -- HPACK ------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, 126, 127, 128, 300, 20000])
def test_encode_headers_is_hpack_that_leaves_the_table_alone(size):
    headers = [(b"n" * max(size, 1), b"v" * size), (b"grpc-status", b"0")]
    d = hpack.Decoder(max_header_list_size=1 << 20)
    assert d.decode(encode_headers(headers), raw=True) == headers
    assert d.decode(encode_headers(headers), raw=True) == headers
    assert len(d.header_table.dynamic_entries) == 0


def test_all_indexed_reads_multi_byte_indices():
    assert _all_indexed(b"\x82\x86")
    assert _all_indexed(b"\xff\x80\x01\x82")  # index 127 + 128: a three-byte index, then one more
    assert not _all_indexed(b"\x82\x40\x01a\x01b")  # a literal with indexing after an indexed field
    assert not _all_indexed(b"\x3f\xe1\x1f")  # a table size update
    assert not _all_indexed(b"\xff\x80")  # a multi-byte index cut short


def test_a_remembered_block_means_what_the_table_says_now():
    """b"\\xbe" (index 62) names the newest table entry: after a literal with indexing adds
    another, the same byte must decode to the new one, not the remembered old one."""
    enc, mine = hpack.Encoder(), HeaderDecoder(1 << 16)
    mine.decode(enc.encode([("x-a", "1")]))
    assert mine.decode(b"\xbe")[0] == [(b"x-a", b"1")]
    mine.decode(enc.encode([("x-b", "2")]))
    assert mine.decode(b"\xbe")[0] == [(b"x-b", b"2")]


_names = st.sampled_from(["x-a", "x-b", "content-type", "authorization", "grpc-timeout", ":path"])
_values = st.text(alphabet="abcdef0123", min_size=0, max_size=40)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.tuples(_names, _values), min_size=1, max_size=5), st.booleans(), st.sampled_from([None, 0, 64, 200, 4096])), min_size=1, max_size=40))
def test_header_decoder_agrees_with_hpack_block_for_block(blocks):
    """Blocks from one encoder (Huffman or not, its table resized now and then so that entries
    are evicted and indices reused): the remembering decoder and a plain one agree on each."""
    enc, plain, mine = hpack.Encoder(), hpack.Decoder(max_header_list_size=1 << 16), HeaderDecoder(1 << 16)
    for headers, huffman, resize in blocks:
        if resize is not None:
            enc.header_table_size = resize
        block = enc.encode(headers, huffman=huffman)
        for _ in range(2):  # the second time, an all-indexed block comes from memory
            assert mine.decode(block)[0] == plain.decode(block, raw=True)
            if not _all_indexed(block):
                break


# -- what a review found ----------------------------------------------------------------------
def test_a_reset_in_the_same_read_as_its_request_frees_everything():
    """The handler's task is cancelled before its first step: it must still be told, answer
    nothing and let go of its stream and its place among max_rpcs."""
    enc = hpack.Encoder()
    with running(Http2Limits(max_streams=3), max_rpcs=3) as (port, probe, srv, loop):
        s = raw_connection(port)
        burst = b""
        for sid in (1, 3, 5):  # as many as both limits allow: a leak of any would refuse the next call
            burst += frame(1, 4, sid, header_block(request_headers("/t.T/Slow"), enc)) + frame(0, 1, sid, grpc_message(Req().SerializeToString())) + frame(3, 0, sid, b"\0\0\0\x08")
        s.sendall(burst)
        end = time.monotonic() + 5
        while probe.cancelled < 3:
            assert time.monotonic() < end, f"{probe.cancelled} of 3 handlers heard of their cancel"
            time.sleep(0.01)
        time.sleep(0.1)
        assert in_loop(loop, lambda: len(srv._app.tasks)) == 0
        s.sendall(frame(1, 4, 9, header_block(request_headers(ECHO), enc)) + frame(0, 1, 9, grpc_message(Req(id="room").SerializeToString())))
        got = read_frames(s, timeout=5, stop=lambda fs: any(t == 1 and sid == 9 and f & 1 for t, f, sid, _ in fs))
        assert Resp.FromString(b"".join(p for t, _, sid, p in got if t == 0 and sid == 9)[5:]).id == "room"
        s.close()


def test_empty_continuations_do_not_go_on_forever():
    with running() as (port, _, _, _):
        s = raw_connection(port)
        s.sendall(frame(1, 0, 1, b"\x82") + frame(9, 0, 1) * 5000)
        t0 = time.monotonic()
        assert goaway_code(read_frames(s, timeout=5)) == 0xB and time.monotonic() - t0 < 2
        s.close()


def test_a_connections_unfinished_requests_hold_at_most_its_window():
    """Bodies not yet complete are not given back to the connection's window, so a peer sending
    many of them in parallel runs out of window (here it ignores that, and gets
    FLOW_CONTROL_ERROR) instead of making the server hold them all."""
    enc = hpack.Encoder()
    with running(Http2Limits(max_body_bytes=60_000)) as (port, _, _, _):
        s = raw_connection(port)
        for sid in range(1, 2 * 20, 2):  # 20 bodies of 59 KB, never ended: 1.18 MB > the 1 MiB window
            s.sendall(frame(1, 4, sid, header_block(request_headers(ECHO), enc)) + b"".join(frame(0, 0, sid, b"\0" * 14_750) for _ in range(4)))
        assert goaway_code(read_frames(s, timeout=5)) == 0x3
        s.close()


def test_an_idle_connection_and_a_stuck_header_block_are_closed():
    with running(Http2Limits(idle_timeout_s=0.3, body_timeout_s=0.3)) as (port, _, _, _):
        s = raw_connection(port)
        got = read_frames(s, timeout=5)  # no stream: GOAWAY NO_ERROR after the idle timeout, then closed
        assert goaway_code(got) == 0x0
        s.close()
        s = raw_connection(port)
        s.sendall(frame(1, 0, 1, b"\x82"))  # a header block that never ends
        assert goaway_code(read_frames(s, timeout=5)) == 0xB
        s.close()


def test_the_last_answers_are_not_lost_to_a_reset_at_close():
    """After its last frame the server shuts down its sending side and reads what the peer still
    sends, instead of closing with unread input (which makes the kernel send RST and throw away
    answers in flight): the peer's late frames are dropped and everything sent arrives."""
    with running() as (port, probe, srv, loop):
        s = raw_connection(port)
        opened = frame(8, 0, 0, struct.pack(">I", 1 << 20)) + frame(8, 0, 1, struct.pack(">I", 1 << 20))  # room for the answer
        s.sendall(frame(1, 4, 1, header_block(request_headers("/t.T/Slow"))) + opened + _data_frames(1, grpc_message(Req(id="z" * 300_000).SerializeToString())))
        end = time.monotonic() + 5
        while probe.calls < 1:
            assert time.monotonic() < end
            time.sleep(0.01)
        stopping = asyncio.run_coroutine_threadsafe(srv.stop(5.0), loop)
        in_loop(loop, probe.release.set)
        s.sendall(frame(6, 0, 0, b"late1234") * 50)  # frames the server may read after its last answer
        got = read_frames(s, timeout=5)  # to EOF: a reset here raises, or loses the answer's tail
        data = b"".join(p for t, _, sid, p in got if t == 0 and sid == 1)
        assert len(data) == 5 + len(Resp(id="z" * 300_000).SerializeToString())
        stopping.result(10)
        s.close()


def _data_frames(sid: int, body: bytes, end: bool = True) -> bytes:
    parts = [body[k : k + 16384] for k in range(0, len(body), 16384)]
    return b"".join(frame(0, 1 if end and k == len(parts) - 1 else 0, sid, p) for k, p in enumerate(parts))


def test_stop_returns_once_a_window_bound_answer_is_read():
    """An answer that waits for the peer's window is the last thing stop() waits for: it returns
    once the peer has read it, not at the end of its grace."""
    with running() as (port, _, srv, loop):
        s = raw_connection(port)
        s.sendall(frame(4, 0, 0, struct.pack(">HI", 4, 100)))  # SETTINGS_INITIAL_WINDOW_SIZE 100
        s.sendall(frame(1, 4, 1, header_block(request_headers(ECHO))) + _data_frames(1, grpc_message(Req(id="w" * 70_000).SerializeToString())))
        got = read_frames(s, timeout=5, stop=lambda fs: any(t == 0 for t, *_ in fs))
        assert sum(len(p) for t, _, _, p in got if t == 0) == 100
        t0 = time.monotonic()
        stopping = asyncio.run_coroutine_threadsafe(srv.stop(20.0), loop)
        time.sleep(0.2)
        s.sendall(frame(8, 0, 1, struct.pack(">I", 1 << 20)) + frame(8, 0, 0, struct.pack(">I", 1 << 20)))
        got += read_frames(s, timeout=5)  # the rest, then the server's end of the connection
        assert sum(len(p) for t, _, sid, p in got if t == 0 and sid == 1) == 5 + len(Resp(id="w" * 70_000).SerializeToString())
        s.close()
        stopping.result(10)
        assert time.monotonic() - t0 < 5  # not the 20 s grace


def test_a_handler_has_a_context_of_its_own_and_a_task_after_its_first_wait():
    with running() as (port, _, _, _):
        peer = H2Peer(port)
        got = [Resp.FromString(peer.answer(peer.call("/t.T/Ctx", grpc_message(Req(id=t).SerializeToString())))[1][5:]) for t in ("a", "b")]
        assert [(r.model_name, r.id, r.model_version) for r in got] == [("", "a", "True"), ("", "b", "True")]
        peer.close()


@pytest.mark.parametrize(("extra", "status"), [(0, b"0"), (1, b"8")])
def test_the_message_limit_is_the_message_not_its_prefix(extra, status):
    with running(Http2Limits(max_body_bytes=1000)) as (port, _, _, _):
        msg = Req(id="m" * 997).SerializeToString()  # 1000 bytes with its tag and length
        assert len(msg) == 1000
        msg = Req(id="m" * (997 + extra)).SerializeToString()
        peer = H2Peer(port)
        headers, _, trailers = peer.answer(peer.call(ECHO, grpc_message(msg)))
        assert (trailers or headers)[b"grpc-status"] == status
        peer.close()
