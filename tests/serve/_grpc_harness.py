"""A lean :class:`~offload.serve.grpc_server.GrpcServer` with test methods on a uvloop loop in a
background thread, and two kinds of client for it: ``h2`` (python-hyper's HTTP/2, an
implementation independent of offload's, which checks every frame the server sends) and raw
frames for what no well-behaved client sends. All traffic on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import socket
import struct
import threading
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import hpack
import uvloop

from offload.serve.grpc_server import GrpcError, GrpcServer, Method
from offload.serve.http2 import Http2Limits
from offload.serve.proto import grpc_predict_v2_pb2 as pb

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
TAG: contextvars.ContextVar[str] = contextvars.ContextVar("tag", default="")
Req, Resp = pb.ModelInferRequest, pb.ModelInferResponse


@dataclass
class Probe:
    """What the test methods saw, read from the test thread."""

    calls: int = 0
    cancelled: int = 0
    release: asyncio.Event | None = None
    statuses: list = field(default_factory=list)


def methods(probe: Probe, loop_box: dict) -> dict[str, Method]:
    async def echo(req, call):
        probe.calls += 1
        return Resp(id=req.id, model_name=req.model_name, model_version=call.header("x-tag") or "")

    async def slow(req, call):
        """Waits for the test to release it; a cancel is counted. ``req.id == "stubborn"``
        keeps running 0.5 s after a cancel (a handler slow to let go)."""
        probe.calls += 1
        try:
            await probe.release.wait()
        except asyncio.CancelledError:
            probe.cancelled += 1
            if req.id == "stubborn":
                await asyncio.sleep(0.5)
            raise
        return Resp(id=req.id)

    async def refuse(req, call):
        raise GrpcError("INVALID_ARGUMENT", req.id)

    async def boom(req, call):
        raise RuntimeError("a handler bug")

    async def ctx(req, call):
        """Answers what TAG held when it started (model_name) and after a wait (id), and whether
        it ran in a task by then (model_version)."""
        before = TAG.get()
        TAG.set(req.id)
        await asyncio.sleep(0)
        return Resp(model_name=before, id=TAG.get(), model_version=str(asyncio.current_task() is not None))

    return {
        "/t.T/Echo": Method(Req, echo),
        "/t.T/Slow": Method(Req, slow),
        "/t.T/Refuse": Method(Req, refuse),
        "/t.T/Boom": Method(Req, boom),
        "/t.T/Ctx": Method(Req, ctx),
    }


@contextlib.contextmanager
def running(limits: Http2Limits | None = None, max_rpcs: int = 64):
    """Yields ``(port, probe, server, loop)`` of a server on a uvloop thread; stops it after."""
    loop = uvloop.new_event_loop()
    probe = Probe()
    box: dict = {}
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        probe.release = asyncio.Event()
        srv = GrpcServer(methods(probe, box), limits or Http2Limits(), max_rpcs=max_rpcs, on_status=probe.statuses.append)
        box["port"] = loop.run_until_complete(srv.start("127.0.0.1", 0))
        box["srv"] = srv
        ready.set()
        loop.run_forever()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(10), "server did not start"
    try:
        yield box["port"], probe, box["srv"], loop
    finally:
        asyncio.run_coroutine_threadsafe(box["srv"].stop(1.0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)


def in_loop(loop, fn, *args):
    """Runs ``fn(*args)`` on the server's loop and returns its result."""

    async def call():
        return fn(*args)

    return asyncio.run_coroutine_threadsafe(call(), loop).result(10)


def grpc_message(msg: bytes, flag: int = 0) -> bytes:
    return bytes([flag]) + struct.pack(">I", len(msg)) + msg


def request_headers(path: str, extra: list[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "t"), ("content-type", "application/grpc"), ("te", "trailers"), *extra]


class H2Peer:
    """An ``h2`` client connection: every frame the server sends is checked by h2's state machine
    (a violation raises ``h2.exceptions.ProtocolError`` out of :meth:`events`)."""

    def __init__(self, port: int, settings: dict | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        if settings:
            self.h2.update_settings(settings)
        self.flush()
        self.closed = False
        self.seen: list = []  # events read but not yet taken by answer()

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.sock.sendall(data)

    def call(self, path: str, body: bytes, extra=()) -> int:
        sid = self.h2.get_next_available_stream_id()
        self.h2.send_headers(sid, request_headers(path, extra))
        self.send_body(sid, body)
        return sid

    def send_body(self, sid: int, body: bytes) -> None:
        """Sends ``body`` within the windows the server grants (h2 refuses to overrun them) and
        in frames of the size it allows, then ends the stream."""
        while True:
            room = min(self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size, len(body))
            if room == 0 and body:
                self.seen += self.events(lambda evs: any(isinstance(e, h2.events.WindowUpdated) for e in evs), timeout=5)
                continue
            self.h2.send_data(sid, body[:room], end_stream=room == len(body))
            self.flush()
            body = body[room:]
            if not body:
                return

    def events(self, until, timeout: float = 10.0, ack: bool = True) -> list:
        """Reads until ``until(events)`` holds or the server closes; data is acknowledged
        (window updates sent) unless ``ack`` is False."""
        out: list = []
        self.sock.settimeout(timeout)
        while not until(out):
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            if not data:
                self.closed = True
                break
            evs = self.h2.receive_data(data)
            for e in evs:
                if ack and isinstance(e, h2.events.DataReceived) and e.flow_controlled_length:
                    self.h2.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
            out += evs
            self.flush()
        return out

    def answer(self, sid: int, timeout: float = 10.0) -> tuple[dict, bytes, dict]:
        """(headers, body, trailers) of stream ``sid``; a trailers-only answer has empty body and trailers."""
        headers, body, trailers = {}, b"", {}

        def done(evs):
            return any(isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) and e.stream_id == sid for e in self.seen + evs)

        if not done([]):
            self.seen += self.events(done, timeout)
        mine = [e for e in self.seen if getattr(e, "stream_id", None) == sid]
        self.seen = [e for e in self.seen if getattr(e, "stream_id", None) != sid]
        for e in mine:
            if isinstance(e, h2.events.ResponseReceived):
                headers = dict(e.headers)
            elif isinstance(e, h2.events.DataReceived):
                body += e.data
            elif isinstance(e, h2.events.TrailersReceived):
                trailers = dict(e.headers)
            elif isinstance(e, h2.events.StreamReset):
                raise AssertionError(f"stream {sid} reset with {e.error_code!r}")
        return headers, body, trailers

    def close(self) -> None:
        self.sock.close()


def frame(typ: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((typ, flags)) + struct.pack(">I", sid) + payload


SETTINGS_FRAME = frame(4, 0, 0)


def read_frames(sock: socket.socket, timeout: float = 10.0, stop=None) -> list[tuple[int, int, int, bytes]]:
    """Raw frames the server sends until it closes (or ``stop(frames)`` holds, or ``timeout``)."""
    sock.settimeout(timeout)
    buf, frames = b"", []
    while stop is None or not stop(frames):
        try:
            data = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not data:
            break
        buf += data
        while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
            n = int.from_bytes(buf[:3], "big")
            frames.append((buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9 : 9 + n]))
            buf = buf[9 + n :]
    return frames


def goaway_code(frames) -> int | None:
    for typ, _, _, payload in frames:
        if typ == 7:
            return int.from_bytes(payload[4:8], "big")
    return None


def raw_connection(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(PREFACE + SETTINGS_FRAME)
    return s


def header_block(headers, encoder: hpack.Encoder | None = None) -> bytes:
    return (encoder or hpack.Encoder()).encode(headers)
