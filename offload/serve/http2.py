"""HTTP/2 (RFC 9113), server side, for unary exchanges: one request (headers and a body), one
response (headers, a body, trailers) per stream. The transport of the lean gRPC server
(:mod:`offload.serve.grpc_server`), on the service's own event loop.

Why not a library: on 2 cores, batch-1 RPCs from ``tritonclient.grpc`` cost grpc.aio 256-320 us
of server CPU each for a constant answer and a connection on ``h2`` (python-hyper) 265 us, where a
minimal HTTP/2 answerer costs 40-65 us and uvicorn's HTTP/1.1 round trip 110-130
(``bench/bench_serve.py --protocols``, BENCHMARKS.md). Frames are 9 bytes of header and a
payload; what is hard in HTTP/2 is header compression, and that stays with ``hpack``
(python-hyper): :class:`HeaderDecoder` only remembers what it decoded for a block made of indexed
fields alone, which cannot change HPACK's dynamic table (RFC 7541 6.1), so the same bytes mean the
same headers until a block that may change the table clears the memory. ``hpack`` takes ~25 us for
the 8-byte block a gRPC client sends on every call; the memory, ~1 us.

What a peer may do and what it costs it (each a test in tests/serve/test_http2.py):

- the connection preface and a SETTINGS frame within ``header_timeout_s``, else the connection closes;
- frames up to 16,384 bytes (SETTINGS_MAX_FRAME_SIZE left at its default), else FRAME_SIZE_ERROR;
- header blocks (HEADERS + CONTINUATION) up to ``max_header_bytes`` compressed and decoded
  (SETTINGS_MAX_HEADER_LIST_SIZE; HPACK's 32 bytes a field count, so a bomb of small fields is
  refused as well) and in at most 32 frames, else GOAWAY ENHANCE_YOUR_CALM: the block is not
  decoded, so the HPACK state is lost with the connection;
- ``max_streams`` streams at once (SETTINGS_MAX_CONCURRENT_STREAMS), a stream past it refused with
  REFUSED_STREAM. A stream the peer resets still counts until the application lets it go, as
  Go's net/http2 does since the rapid-reset attack (CVE-2023-44487): resetting does not buy room
  for new work while the old runs. More than ``_CALM_RESETS`` resets or refusals in a second
  end the connection with ENHANCE_YOUR_CALM;
- request bodies up to ``max_body_bytes``; past it the application answers at once
  (``App.oversized``) and the rest is discarded;
- unfinished requests hold at most the connection's window (two bodies of ``max_body_bytes``):
  it is given back as requests complete or are dropped, not as bytes arrive;
- a request not complete within ``body_timeout_s`` of its HEADERS is reset (CANCEL); a header
  block not complete by then ends the connection; a connection without streams for
  ``idle_timeout_s`` gets GOAWAY (NO_ERROR);
- flow control both ways: a peer that sends past its window gets FLOW_CONTROL_ERROR; responses wait
  for the peer's windows and go in frames of its SETTINGS_MAX_FRAME_SIZE;
- when the peer stops reading, the connection stops reading too (asyncio's ``pause_writing``), so
  a flood of PINGs or SETTINGS that need answers cannot grow the send buffer;
- after its last frame (a drained GOAWAY, a connection error) the connection closes its sending
  side and reads the peer's late frames for a second before closing: a close with unread input
  makes the kernel answer RST, which drops answers still on their way.

Not offered, as gRPC has no use for them: server push, priorities (PRIORITY is read and ignored),
HTTP/1.1 upgrade, TLS (bind to loopback or put a TLS proxy in front, as for REST).

Example::

    server = await loop.create_server(lambda: Http2Connection(app, limits), "127.0.0.1", 8001)
"""

from __future__ import annotations

import asyncio
import struct
import time
from dataclasses import dataclass
from typing import Protocol

import hpack

__all__ = ["Http2Connection", "Http2Limits", "App", "HeaderDecoder", "encode_headers", "ErrorCode"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# Flags.
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# SETTINGS parameters (RFC 9113 6.5.2).
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS, S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = range(1, 7)

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65535
DEFAULT_FRAME = 16384
MAX_FRAME = 2**24 - 1
# The receive window this side gives a stream (SETTINGS_INITIAL_WINDOW_SIZE), replenished while
# its request is read, when half is used: a small request never costs a WINDOW_UPDATE. The
# connection's window is two bodies of ``max_body_bytes`` (at least this), replenished only as
# requests are taken whole or dropped, so that is what a connection's unfinished requests can hold.
STREAM_WINDOW = 1 << 20
_CALM_RESETS = 1000  # resets + refusals a connection may cause in one second
_MAX_FRAGMENTS = 32  # frames one header block may come in (HEADERS + CONTINUATION)
_LINGER_S = 1.0  # after our last frame: how long the peer's last frames are read before closing


class ErrorCode:
    """HTTP/2 error codes (RFC 9113 7)."""

    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    ENHANCE_YOUR_CALM = 0xB


class _ConnectionError(Exception):
    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


@dataclass(frozen=True)
class Http2Limits:
    """What one connection may ask of the server (see the module docstring)."""

    max_streams: int = 128
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 4 * 1024 * 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 65536  # open connections on the listener; past it a new one gets GOAWAY
    idle_timeout_s: float = 300.0  # a connection with no stream for this long gets GOAWAY (NO_ERROR)


class App(Protocol):
    """What the connection hands its exchanges to. Every stream given to ``request`` or
    ``oversized`` must be ended by the app, with :meth:`Http2Connection.respond` or
    :meth:`Http2Connection.release`, also after ``cancelled``."""

    def request(self, conn: Http2Connection, sid: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None: ...

    def oversized(self, conn: Http2Connection, sid: int, headers: list[tuple[bytes, bytes]]) -> None: ...

    def cancelled(self, conn: Http2Connection, sid: int) -> None: ...


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) whose first byte carries ``first`` in its high bits."""
    top = (1 << prefix_bits) - 1
    if value < top:
        return bytes([first | value])
    out = [first | top]
    value -= top
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A header block of literal fields without indexing, raw strings (RFC 7541 6.2.2): it never
    touches the peer's dynamic table, so blocks can be made once and sent on any connection."""
    out = []
    for name, value in headers:
        out.append(b"\x00" + _hpack_int(len(name), 7, 0) + name + _hpack_int(len(value), 7, 0) + value)
    return b"".join(out)


def _all_indexed(block: bytes) -> bool:
    """True if every field of ``block`` is an indexed field (RFC 7541 6.1): one that reads the
    tables and never changes them."""
    i, n = 0, len(block)
    while i < n:
        b = block[i]
        if not b & 0x80:
            return False
        i += 1
        if b & 0x7F == 0x7F:  # a multi-byte index: continuation bytes, the last below 0x80
            while i < n and block[i] & 0x80:
                i += 1
            i += 1
    return i == n


# Request headers a server must refuse (RFC 9113 8.2.2: connection-specific fields).
_CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"))


def _malformed(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why a request's header list is malformed (RFC 9113 8.2, 8.3.1), or None."""
    seen_regular = False
    pseudo = set()
    for name, value in headers:
        if name[:1] == b":":
            if seen_regular:
                return f"pseudo-header {name!r} after a regular header"
            if name not in (b":method", b":scheme", b":path", b":authority") or name in pseudo:
                return f"pseudo-header {name!r} unknown or repeated"
            pseudo.add(name)
        else:
            seen_regular = True
            if name != name.lower():
                return f"header name {name!r} is not lower-case"
            if name in _CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
                return f"connection-specific header {name!r}"
    if not {b":method", b":scheme", b":path"} <= pseudo:
        return "missing :method, :scheme or :path"
    return None


class HeaderDecoder:
    """``hpack.Decoder`` that remembers blocks of indexed fields (see the module docstring).

    Example::

        d = HeaderDecoder(16384)
        d.decode(block)   # ([(b":path", b"/pkg.Service/Method"), ...], None)
    """

    _MEMORY = 64  # distinct blocks kept per connection

    def __init__(self, max_header_list_size: int) -> None:
        self._dec = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._memory: dict[bytes, list[tuple[bytes, bytes]]] = {}

    def decode(self, block: bytes) -> tuple[list[tuple[bytes, bytes]], str | None]:
        """The headers of ``block`` and why they are no valid request (None if they are);
        raises ``hpack.HPACKError`` for a malformed or oversized block."""
        got = self._memory.get(block)
        if got is not None:
            return got
        headers = [(bytes(k), bytes(v)) for k, v in self._dec.decode(block, raw=True)]
        got = (headers, _malformed(headers))
        if not _all_indexed(block):
            self._memory.clear()  # the table may have changed under every remembered block
        else:
            if len(self._memory) >= self._MEMORY:
                self._memory.clear()
            self._memory[block] = got
        return got


# A frame's 9-byte head in one pack: the 24-bit length and the type as one 32-bit word, then the
# flags and the stream id (the reserved bit is 0: ids are below 2**31).
_FRAME_HEAD = struct.Struct(">IBI")


def _frame(typ: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return _FRAME_HEAD.pack(len(payload) << 8 | typ, flags, sid) + payload


class _Stream:
    __slots__ = ("sid", "headers", "block", "block_bytes", "chunks", "size", "held", "recv_window", "send_window", "opened", "state", "remote_open", "pending", "trailers")

    def __init__(self, sid: int, send_window: int, opened: float) -> None:
        self.sid = sid
        self.headers: list[tuple[bytes, bytes]] | None = None
        self.block: list[bytes] = []  # header block fragments until END_HEADERS
        self.block_bytes = 0
        self.chunks: list[bytes] = []
        self.size = 0
        self.held = 0  # flow-controlled bytes of this request not yet given back to the connection window
        self.recv_window = STREAM_WINDOW
        self.send_window = send_window
        self.opened = opened
        # recv: reading the request; discard: oversized, the app told, the rest dropped;
        # app: the app holds the complete request; send: the answer waits for window;
        # closed / refused: not a live stream (only its header block is read, for HPACK's sake).
        self.state = "recv"
        self.remote_open = True
        self.pending = b""  # response DATA waiting for window
        self.trailers: bytes | None = None


class Http2Connection(asyncio.Protocol):
    """One server connection. Complete requests go to ``app.request``; :meth:`respond` answers.

    Example::

        loop.create_server(lambda: Http2Connection(app, Http2Limits(max_streams=128)), host, port)
    """

    def __init__(self, app: App, limits: Http2Limits, registry: set | None = None) -> None:
        self.app = app
        self.limits = limits
        self._registry = registry
        self.transport: asyncio.Transport | None = None
        self._buf = b""
        self._preface = False
        self._settings_seen = False
        self._streams: dict[int, _Stream] = {}
        self._released: set[int] = set()  # reset by the peer, still held by the app
        self._last_sid = 0
        self._cont: _Stream | None = None  # the stream whose header block continues
        self._cont_end = False  # END_STREAM on the HEADERS frame that opened the block
        self._decoder = HeaderDecoder(limits.max_header_bytes)
        self._conn_window = max(2 * limits.max_body_bytes + 65536, STREAM_WINDOW)
        self._recv_conn = self._conn_window
        self._recv_unacked = 0
        self._send_conn = DEFAULT_WINDOW
        self._peer_window = DEFAULT_WINDOW
        self._peer_frame = DEFAULT_FRAME
        self._out: list[bytes] | None = None  # frames gathered while a read is processed, written once
        self._closing = False  # GOAWAY sent or received: no new streams
        self._goaway_sid = MAX_WINDOW
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._last_active = time.monotonic()  # when a stream last opened or ended
        self._linger: asyncio.TimerHandle | None = None
        self._resets = 0
        self._reset_window = 0.0
        self._closed = False  # our side is closed (or closing): nothing more is read or sent

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        lim = self.limits
        if self._registry is not None:
            if len(self._registry) >= lim.max_connections:
                self._emit(_frame(SETTINGS, 0, 0))  # the server's preface comes first, even here
                self._fail(ErrorCode.ENHANCE_YOUR_CALM, f"{lim.max_connections} connections open already")
                return
            self._registry.add(self)
        settings = struct.pack(
            ">HIHIHIHI",
            S_MAX_CONCURRENT_STREAMS, lim.max_streams,
            S_INITIAL_WINDOW_SIZE, STREAM_WINDOW,
            S_MAX_HEADER_LIST_SIZE, lim.max_header_bytes,
            S_ENABLE_PUSH, 0,
        )  # fmt: skip
        transport.write(_frame(SETTINGS, 0, 0, settings) + _frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._conn_window - DEFAULT_WINDOW)))
        self._arm(time.monotonic() + lim.header_timeout_s)

    def connection_lost(self, exc) -> None:
        if self._registry is not None:
            self._registry.discard(self)
        for t in (self._timer, self._linger):
            if t is not None:
                t.cancel()
        self._timer = self._linger = None
        held = [s.sid for s in self._streams.values() if s.state in ("app", "discard")]
        self._streams.clear()
        self.transport = None
        for sid in held:
            self._released.add(sid)
            self.app.cancelled(self, sid)

    def pause_writing(self) -> None:
        # The peer does not read what it asked for: read nothing more of it until it does.
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def eof_received(self) -> None:
        return None  # the peer is done sending: asyncio closes the transport

    def data_received(self, data: bytes) -> None:
        if self._closed:  # lingering after our last frame: what the peer still sends is dropped
            return
        buf = self._buf + data if self._buf else data
        out = self._out = []
        try:
            if not self._preface:
                if len(buf) < len(PREFACE):
                    if not PREFACE.startswith(buf):
                        raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    self._buf = buf
                    return
                if buf[: len(PREFACE)] != PREFACE:
                    raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                buf = buf[len(PREFACE) :]
                self._preface = True
            i, n = 0, len(buf)
            while n - i >= 9 and not self._closed:
                length = int.from_bytes(buf[i : i + 3], "big")
                if length > DEFAULT_FRAME:
                    raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, f"frame of {length} bytes exceeds SETTINGS_MAX_FRAME_SIZE {DEFAULT_FRAME}")
                if n - i < 9 + length:
                    break
                typ, flags = buf[i + 3], buf[i + 4]
                sid = int.from_bytes(buf[i + 5 : i + 9], "big") & 0x7FFFFFFF
                payload = buf[i + 9 : i + 9 + length]
                i += 9 + length
                self._frame(typ, flags, sid, payload)
            self._buf = buf[i:]
        except _ConnectionError as e:
            self._fail(e.code, str(e))
        finally:
            self._out = None
            if out and not self._closed:
                self.transport.write(b"".join(out))

    # -- frames in -----------------------------------------------------------------------------
    def _frame(self, typ: int, flags: int, sid: int, payload: bytes) -> None:
        if self._cont is not None and (typ != CONTINUATION or sid != self._cont.sid):
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "a header block was interrupted by another frame")
        if not self._settings_seen and typ != SETTINGS:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "the first frame must be SETTINGS")
        if typ == DATA:
            self._data(flags, sid, payload)
        elif typ == HEADERS:
            self._headers(flags, sid, payload)
        elif typ == CONTINUATION:
            if self._cont is None:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "CONTINUATION without a header block")
            self._fragment(self._cont, payload, flags)
        elif typ == SETTINGS:
            self._settings(flags, sid, payload)
        elif typ == WINDOW_UPDATE:
            self._window_update(sid, payload)
        elif typ == PING:
            if sid:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "PING payload is not 8 bytes")
            if not flags & ACK:
                self._emit(_frame(PING, ACK, 0, payload))
        elif typ == RST_STREAM:
            if not sid:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on stream 0")
            if len(payload) != 4:
                raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM payload is not 4 bytes")
            if sid > self._last_sid:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"RST_STREAM on idle stream {sid}")
            self._peer_reset(sid)
        elif typ == GOAWAY:
            if sid:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
            self._closing = True
            self._goaway_sid = min(self._goaway_sid, self._last_sid)
            self._close_if_done()
        elif typ == PRIORITY:
            if not sid:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "PRIORITY payload is not 5 bytes")
        elif typ == PUSH_PROMISE:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # Other frame types are ignored (RFC 9113 4.1, 5.5).

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if flags & PADDED:
            if not payload or payload[0] >= len(payload):
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "padding as long as the frame")
            return payload[1 : len(payload) - payload[0]]
        return payload

    def _headers(self, flags: int, sid: int, payload: bytes) -> None:
        if not sid % 2:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {sid}: client streams are odd")
        block = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "HEADERS too short for its priority fields")
            block = block[5:]
        s = self._streams.get(sid)
        if s is None:
            if sid <= self._last_sid:
                s = _Stream(sid, 0, 0.0)  # a closed stream: its block is read and dropped
                s.state = "closed"
            else:
                self._last_sid = sid
                s = _Stream(sid, self._peer_window, time.monotonic())
                self._streams[sid] = s
                self._last_active = s.opened
                if sid > self._goaway_sid or len(self._streams) + len(self._released) > self.limits.max_streams:
                    s.state = "refused"
                elif s.opened + self.limits.body_timeout_s < self._timer_at:
                    self._arm(s.opened + self.limits.body_timeout_s)
        elif not flags & END_STREAM:
            # A second block on a stream: only trailers, which end it (RFC 9113 8.1).
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"stream {sid}: a second header block that does not end the stream")
        elif s.state not in ("recv", "discard"):
            # Trailers of a request already answered (read and dropped), or a block after the
            # peer ended the stream (a stream error once it is read).
            if not s.remote_open:
                self._stream_error(s, ErrorCode.STREAM_CLOSED)
            s.remote_open = False
            s = _Stream(sid, 0, 0.0)
            s.state = "closed"
        self._cont_end = bool(flags & END_STREAM)
        self._fragment(s, block, flags)

    def _fragment(self, s: _Stream, fragment: bytes, flags: int) -> None:
        s.block.append(fragment)
        s.block_bytes += len(fragment)
        if s.block_bytes > self.limits.max_header_bytes:
            raise _ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, f"stream {s.sid}: header block exceeds {self.limits.max_header_bytes} bytes")
        if len(s.block) > _MAX_FRAGMENTS:  # empty CONTINUATIONs would cost work and never the byte cap
            raise _ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, f"stream {s.sid}: header block in more than {_MAX_FRAGMENTS} frames")
        if not flags & END_HEADERS:
            self._cont = s
            return
        self._cont = None
        block = s.block[0] if len(s.block) == 1 else b"".join(s.block)
        s.block, s.block_bytes = [], 0
        try:
            headers, why = self._decoder.decode(block)
        except hpack.OversizedHeaderListError:
            raise _ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, f"stream {s.sid}: header list exceeds {self.limits.max_header_bytes} bytes") from None
        except hpack.HPACKError as e:
            raise _ConnectionError(ErrorCode.COMPRESSION_ERROR, f"stream {s.sid}: {e}") from None
        if s.state == "closed":
            return
        if s.state == "refused":
            self._reset(s, ErrorCode.REFUSED_STREAM)
            self._count_reset()
            return
        if s.headers is None:
            if why is not None:
                self._reset(s, ErrorCode.PROTOCOL_ERROR)
                self._count_reset()
                return
            s.headers = headers
        if self._cont_end:
            self._remote_end(s)

    def _data(self, flags: int, sid: int, payload: bytes) -> None:
        if not sid:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        if sid > self._last_sid:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"DATA on idle stream {sid}")
        n = len(payload)
        self._recv_conn -= n
        if self._recv_conn < 0:
            raise _ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        s = self._streams.get(sid)
        if s is None or s.state != "recv":
            # Dropped: closed, answered already (an oversized request), or ended by the peer.
            # Frames in flight when a stream closed count against the window and are given back.
            self._give_back(n)
            if s is not None:
                if not s.remote_open:
                    self._stream_error(s, ErrorCode.STREAM_CLOSED)
                elif flags & END_STREAM:
                    self._remote_end(s)
            return
        s.held += n
        s.recv_window -= n
        if s.recv_window < 0:
            raise _ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, f"stream {sid}: DATA beyond its window")
        body = self._unpad(flags, payload)
        s.size += len(body)
        if s.size > self.limits.max_body_bytes:
            s.state = "discard"
            s.chunks = []
            self._return_held(s)
            self.app.oversized(self, sid, s.headers)
        elif body:
            s.chunks.append(body)
        if flags & END_STREAM:
            self._remote_end(s)
        elif s.state == "recv" and s.recv_window < STREAM_WINDOW // 2:  # a discarded body gets no more room
            self._emit(_frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", STREAM_WINDOW - s.recv_window)))
            s.recv_window = STREAM_WINDOW

    def _give_back(self, n: int) -> None:
        """Returns ``n`` bytes to the connection's receive window (a WINDOW_UPDATE once half is out)."""
        self._recv_unacked += n
        if self._recv_unacked >= self._conn_window // 2:
            self._emit(_frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._recv_unacked)))
            self._recv_conn += self._recv_unacked
            self._recv_unacked = 0

    def _remote_end(self, s: _Stream) -> None:
        s.remote_open = False
        if s.state == "recv":
            body = s.chunks[0] if len(s.chunks) == 1 else b"".join(s.chunks)
            s.chunks = []
            s.state = "app"
            self._return_held(s)
            self.app.request(self, s.sid, s.headers, body)
        elif s.state == "discard":
            s.state = "app"  # the app has the oversized request still to answer

    def _settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS payload is not a multiple of 6 bytes")
        for k in range(0, len(payload), 6):
            ident, value = struct.unpack_from(">HI", payload, k)
            if ident == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {value} exceeds 2^31-1")
                delta = value - self._peer_window
                self._peer_window = value
                for st in self._streams.values():
                    st.send_window += delta
                    if st.send_window > MAX_WINDOW:
                        raise _ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, f"stream {st.sid}: window beyond 2^31-1")
            elif ident == S_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= MAX_FRAME:
                    raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value} is outside [16384, 2^24-1]")
                self._peer_frame = value
            elif ident == S_ENABLE_PUSH and value > 1:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value} is not 0 or 1")
            # HEADER_TABLE_SIZE needs nothing: the blocks sent here never index.
        self._emit(_frame(SETTINGS, ACK, 0))
        if not self._settings_seen:
            self._settings_seen = True  # the preface's deadline is met: the idle one follows
            self._arm(time.monotonic() + self.limits.idle_timeout_s)
        self._flush_pending()

    def _window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE payload is not 4 bytes")
        inc = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if not sid:
            if not inc:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0 on the connection")
            self._send_conn += inc
            if self._send_conn > MAX_WINDOW:
                raise _ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "connection window beyond 2^31-1")
        else:
            if sid > self._last_sid:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {sid}")
            s = self._streams.get(sid)
            if s is None:
                return
            if not inc:
                self._stream_error(s, ErrorCode.PROTOCOL_ERROR)
                return
            s.send_window += inc
            if s.send_window > MAX_WINDOW:
                self._stream_error(s, ErrorCode.FLOW_CONTROL_ERROR)
                return
        self._flush_pending()

    def _peer_reset(self, sid: int) -> None:
        s = self._streams.pop(sid, None)
        if s is not None:
            self._drop(s)
            self._cancel_held(s)
        self._close_if_done()
        self._count_reset()  # last: past the limit it ends the connection, the handler told already

    def _stream_error(self, s: _Stream, code: int) -> None:
        """Resets ``s``; the app, if it holds it, hears it as a cancel."""
        self._reset(s, code)
        self._cancel_held(s)

    def _cancel_held(self, s: _Stream) -> None:
        """A stream gone while the app holds it: it stays counted (``_released``) until the app
        lets go, and the app hears of it."""
        if s.state in ("app", "discard"):
            self._released.add(s.sid)
            self.app.cancelled(self, s.sid)

    # -- frames out ----------------------------------------------------------------------------
    def _emit(self, frame: bytes) -> None:
        if self._out is not None:
            self._out.append(frame)
        elif not self._closed and self.transport is not None:
            self.transport.write(frame)

    def _header_frames(self, sid: int, block: bytes, end_stream: bool) -> bytes:
        size = self._peer_frame
        flags = END_STREAM if end_stream else 0
        if len(block) <= size:
            return _frame(HEADERS, flags | END_HEADERS, sid, block)
        parts = [_frame(HEADERS, flags, sid, block[:size])]
        for k in range(size, len(block), size):
            parts.append(_frame(CONTINUATION, END_HEADERS if k + size >= len(block) else 0, sid, block[k : k + size]))
        return b"".join(parts)

    def respond(self, sid: int, head: bytes, body: bytes | None = None, trailers: bytes | None = None) -> None:
        """Answers stream ``sid``: header block ``head`` (from :func:`encode_headers`), then
        ``body`` as DATA within the peer's windows, then ``trailers`` ending the stream. With
        neither body nor trailers, ``head`` ends the stream (a trailers-only response). A stream
        the peer reset, or a connection gone, takes nothing."""
        if self._let_go(sid):
            return
        s = self._streams.get(sid)
        if s is None or s.state not in ("app", "discard") or self._closed:
            return
        if body is None and trailers is None:
            self._emit(self._header_frames(sid, head, True))
            self._end(s)
            return
        frames = [self._header_frames(sid, head, False)]
        s.state = "send"
        s.pending = body or b""
        s.trailers = trailers if trailers is not None else b""
        done = self._send_some(s, frames)
        self._emit(frames[0] if len(frames) == 1 else b"".join(frames))
        if done:
            self._end(s)

    def release(self, sid: int) -> None:
        """Ends the app's hold on ``sid`` without an answer (resetting it with CANCEL if still open)."""
        if self._let_go(sid):
            return
        s = self._streams.get(sid)
        if s is not None and s.state in ("app", "discard"):
            self._reset(s, ErrorCode.CANCEL)

    def _let_go(self, sid: int) -> bool:
        """True if ``sid`` was already gone (reset, connection lost) and the app has now let go of it."""
        if sid not in self._released:
            return False
        self._released.discard(sid)
        self._close_if_done()
        return True

    def _send_some(self, s: _Stream, frames: list[bytes]) -> bool:
        """Moves what the windows allow of ``s``'s pending DATA, then its trailers, into
        ``frames``; True when the answer is all there (the caller ends the stream once they are out)."""
        data = s.pending
        while data:
            room = min(len(data), self._send_conn, s.send_window, self._peer_frame)
            if room <= 0:
                break
            frames.append(_frame(DATA, 0, s.sid, data[:room]))
            data = data[room:]
            self._send_conn -= room
            s.send_window -= room
        s.pending = data
        if data or s.trailers is None:
            return False
        frames.append(self._header_frames(s.sid, s.trailers, True) if s.trailers else _frame(DATA, END_STREAM, s.sid))
        s.trailers = None
        return True

    def _flush_pending(self) -> None:
        frames: list[bytes] = []
        done = [s for s in list(self._streams.values()) if s.state == "send" and s.trailers is not None and self._send_some(s, frames)]
        if frames:
            self._emit(b"".join(frames))
        for s in done:
            self._end(s)

    def _return_held(self, s: _Stream) -> None:
        """Gives the connection window back what ``s``'s request held: it is taken whole or dropped."""
        if s.held:
            self._give_back(s.held)
            s.held = 0

    def _drop(self, s: _Stream) -> None:
        """Bookkeeping of a stream leaving the connection: its window back, the idle clock reset."""
        self._return_held(s)
        self._last_active = time.monotonic()

    def _end(self, s: _Stream) -> None:
        """The answer is out: the stream closes. Answered before the request ended, the rest of
        the request is stopped without error (RFC 9113 8.1)."""
        self._streams.pop(s.sid, None)
        self._drop(s)
        if s.remote_open:
            self._emit(_frame(RST_STREAM, 0, s.sid, struct.pack(">I", ErrorCode.NO_ERROR)))
        self._close_if_done()

    def _reset(self, s: _Stream, code: int) -> None:
        self._streams.pop(s.sid, None)
        self._drop(s)
        self._emit(_frame(RST_STREAM, 0, s.sid, struct.pack(">I", code)))
        self._close_if_done()

    def _count_reset(self) -> None:
        now = time.monotonic()
        if now - self._reset_window > 1.0:
            self._reset_window, self._resets = now, 0
        self._resets += 1
        if self._resets > _CALM_RESETS:
            raise _ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, f"more than {_CALM_RESETS} streams reset or refused in a second")

    def _fail(self, code: int, why: str) -> None:
        """A connection error: GOAWAY with ``code`` and the reason, then close."""
        self._emit(_frame(GOAWAY, 0, 0, struct.pack(">II", self._last_sid, code) + why.encode("utf-8", "replace")[:256]))
        self._close()

    def _close(self) -> None:
        """Writes what is gathered, then closes our side only and reads (and drops) what the peer
        still sends for ``_LINGER_S`` or until it closes too. Closing a socket with unread input
        makes the kernel send RST, which throws away answers not yet delivered; Go's net/http2
        waits the same way (goAwayTimeout)."""
        if self._closed or self.transport is None:
            return
        out, self._out = self._out, None
        if out:
            self.transport.write(b"".join(out))
            out.clear()
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._linger = asyncio.get_running_loop().call_later(_LINGER_S, self.transport.close)
        else:
            self.transport.close()

    # -- lifetime ------------------------------------------------------------------------------
    def goaway(self) -> None:
        """Graceful close: no streams beyond those already opened; closes once they are answered."""
        if self._closed or self.transport is None or self._goaway_sid != MAX_WINDOW:
            return
        self._closing = True
        self._goaway_sid = self._last_sid
        self._emit(_frame(GOAWAY, 0, 0, struct.pack(">II", self._last_sid, ErrorCode.NO_ERROR)))
        self._close_if_done()

    @property
    def busy(self) -> bool:
        """Streams open, or held by the app."""
        return bool(self._streams or self._released)

    def _close_if_done(self) -> None:
        if self._closing and not self.busy:
            self._close()

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = asyncio.get_running_loop().call_later(max(when - time.monotonic(), 0.0), self._expire)

    def _expire(self) -> None:
        """The one timer, at the earliest of: the preface's deadline; the oldest unfinished
        request's; the idle deadline of a connection without streams."""
        self._timer, self._timer_at = None, float("inf")
        if self._closed or self.transport is None:
            return
        if not self._settings_seen:
            self._fail(ErrorCode.PROTOCOL_ERROR, f"no connection preface and SETTINGS within {self.limits.header_timeout_s:g} s")
            return
        now, limit = time.monotonic(), self.limits.body_timeout_s
        if self._cont is not None and now - self._cont.opened >= limit:
            self._fail(ErrorCode.ENHANCE_YOUR_CALM, f"stream {self._cont.sid}: header block unfinished after {limit:g} s")
            return
        for s in list(self._streams.values()):
            if s.state == "recv" and now - s.opened >= limit:
                self._reset(s, ErrorCode.CANCEL)
        if self._closed:
            return
        if not self.busy and now - self._last_active >= self.limits.idle_timeout_s:
            self.goaway()
            return
        oldest = min((s.opened for s in self._streams.values() if s.state == "recv"), default=None)
        nxt = self._last_active + self.limits.idle_timeout_s
        if oldest is not None:
            nxt = min(nxt, oldest + limit)
        self._arm(nxt)
