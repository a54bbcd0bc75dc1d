"""gRPC unary calls over :mod:`offload.serve.http2`, on the running event loop: the ``lean``
transport of the OIP v2 gRPC endpoint (``offload serve --grpc-server lean``, the default).

What it speaks is gRPC's HTTP/2 mapping (grpc/grpc doc/PROTOCOL-HTTP2.md) for unary methods: a
POST to ``/<package>.<Service>/<Method>`` with ``content-type: application/grpc[+proto]``, one
length-prefixed message (compressed with ``gzip`` or ``deflate`` when its flag says so and
``grpc-encoding`` names one of them), an optional ``grpc-timeout``; the answer is ``:status 200``,
one message and ``grpc-status`` / ``grpc-message`` trailers, or a trailers-only response for an
error. What grpc core's server answers, this one answers with the same code: an unknown method
UNIMPLEMENTED, a message over the limit RESOURCE_EXHAUSTED (also after decompression), more RPCs
in progress than ``max_rpcs`` RESOURCE_EXHAUSTED, a message that does not parse or a malformed
frame INTERNAL, a missed deadline DEADLINE_EXCEEDED; a non-POST is HTTP 405 and another
content-type HTTP 415, as the protocol document asks.

Handlers are ``async def handler(request, call) -> response``, the response a message or its
serialized bytes (:func:`answer_bytes`); they end an RPC with a status by raising
:class:`GrpcError`. A handler starts inside the read that completed its request, in a context of
its own (``contextvars``), and goes on in a task of that context at its first wait, so an RPC that
needs none is answered with no task and no pass of the event loop; until that first wait
``asyncio.current_task()`` is None. It is cancelled when the client resets the stream, the
connection drops or the deadline passes.

Example::

    server = GrpcServer({"/pkg.Svc/Echo": Method(pb.EchoRequest, echo)}, Http2Limits(), max_rpcs=1024)
    port = await server.start("127.0.0.1", 8001)
    ...
    await server.stop(grace_s=30)
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import logging
import time
import types
import zlib
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from google.protobuf.message import DecodeError

from offload.serve.http2 import Http2Connection, Http2Limits, encode_headers

__all__ = ["GrpcServer", "GrpcError", "Method", "Call", "STATUS_CODES", "percent_encode", "answer_bytes"]

_log = logging.getLogger("offload.serve")

# grpc/grpc doc/statuscodes.md
STATUS_CODES = {
    "OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9, "ABORTED": 10,
    "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12, "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16,
}  # fmt: skip

ACCEPT_ENCODING = b"identity, deflate, gzip"
_HEAD_OK = encode_headers([(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-accept-encoding", ACCEPT_ENCODING)])
_TRAILERS_OK = encode_headers([(b"grpc-status", b"0")])
# grpc-timeout units (PROTOCOL-HTTP2.md: TimeoutValue is at most 8 digits).
_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


class GrpcError(Exception):
    """Ends an RPC with ``code`` (a name of :data:`STATUS_CODES`) and ``message``."""

    def __init__(self, code: str, message: str) -> None:
        if code not in STATUS_CODES or code == "OK":
            raise ValueError(f"code={code!r}: not a gRPC error status")
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Method:
    """A unary method: how to parse its request, and the handler."""

    request_type: Any  # a protobuf message class
    # Answers a message, or its wire bytes where the handler has them more cheaply than the
    # message (bytes pass through as they are).
    handler: Callable[[Any, "Call"], Awaitable[Any]]


class Call:
    """What a handler may ask about its RPC: the client's metadata and the time left.

    Example::

        call.header("authorization")   # "Bearer ..." or None
        call.time_remaining()          # seconds, or None without a deadline
    """

    __slots__ = ("_headers", "_deadline", "_expired")

    def __init__(self, headers: list[tuple[bytes, bytes]], deadline: float | None) -> None:
        self._headers = headers
        self._deadline = deadline
        self._expired = False

    def header(self, name: str) -> str | None:
        """The first value of metadata ``name`` (lower-case), or None."""
        key = name.encode("ascii")
        for k, v in self._headers:
            if k == key:
                return v.decode("latin-1")
        return None

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return 0.0 if self._expired else self._deadline - time.monotonic()

    def _expire(self, task: asyncio.Task) -> None:
        # The loop's timers may fire a little before the clock reaches the deadline (libuv
        # counts from the time it cached at the start of the pass): once this fires, the deadline has passed.
        self._expired = True
        task.cancel()


def percent_encode(message: str) -> bytes:
    """``grpc-message``'s encoding: UTF-8, then every byte outside 0x20-0x7E, and '%', as %XX."""
    raw = message.encode("utf-8", "replace")
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


def answer_bytes(resp: Any) -> bytes:
    """A handler's answer on the wire: a message serialized, or bytes (its wire form) as they are.

    Example::

        answer_bytes(pb.ModelInferResponse(id="r1")) == answer_bytes(b"\x1a\x02r1")   # True
    """
    return resp if type(resp) is bytes else resp.SerializeToString()


def _trailers_only(code: str, message: str, extra: list[tuple[bytes, bytes]] = ()) -> bytes:
    return encode_headers(
        [(b":status", b"200"), (b"content-type", b"application/grpc"), *extra, (b"grpc-status", str(STATUS_CODES[code]).encode()), (b"grpc-message", percent_encode(message)[:4096])]
    )


def _timeout(value: bytes) -> float:
    unit = _UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not 1 <= len(digits) <= 8 or not digits.isdigit():
        raise GrpcError("INTERNAL", f"malformed grpc-timeout {value[:32]!r}")
    return int(digits) * unit


@types.coroutine
def _resume(coro, step):
    """Runs the rest of a coroutine already started by hand (``step``: what its first
    ``send(None)`` yielded) as a task's coroutine: each future it yields is handed on to the task
    and each result, or exception (a cancel), back to it, as ``await`` would. Python 3.12's eager
    task factory does this for whole loops."""
    while True:
        try:
            value = yield step
        except BaseException as e:  # noqa: BLE001 - thrown in by the task (CancelledError): the coroutine's to handle
            try:
                step = coro.throw(e)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                step = coro.send(value)
            except StopIteration as stop:
                return stop.value


class _App:
    """The :class:`~offload.serve.http2.App` of every connection of one :class:`GrpcServer`."""

    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.tasks: dict[tuple[Http2Connection, int], asyncio.Task] = {}

    def request(self, conn: Http2Connection, sid: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        srv = self.server
        # One C call instead of a Python loop over the headers (~190 bytecodes a request); a
        # repeated header keeps its last value, as the loop did.
        h = dict(headers)
        method, path, ctype = h.get(b":method"), h.get(b":path"), h.get(b"content-type")
        timeout, encoding = h.get(b"grpc-timeout"), h.get(b"grpc-encoding")
        if method != b"POST":
            conn.respond(sid, encode_headers([(b":status", b"405")]))
            return
        if ctype is None or not (ctype == b"application/grpc" or ctype.startswith((b"application/grpc+", b"application/grpc;"))):
            conn.respond(sid, encode_headers([(b":status", b"415")]))
            return
        try:
            m = srv.methods.get(path.decode("latin-1"))
            if m is None:
                raise GrpcError("UNIMPLEMENTED", f"unknown method {path.decode('latin-1')[:200]!r}")
            if len(self.tasks) >= srv.max_rpcs:
                raise GrpcError("RESOURCE_EXHAUSTED", f"more than {srv.max_rpcs} RPCs in progress")
            deadline = None if timeout is None else time.monotonic() + _timeout(timeout)
            request = m.request_type.FromString(self._message(body, encoding))
        except GrpcError as e:
            self._refuse(conn, sid, e)
            return
        except DecodeError:
            self._refuse(conn, sid, GrpcError("INTERNAL", f"the request message does not parse as {m.request_type.DESCRIPTOR.full_name}"))
            return
        # The handler starts here and now, inside the read: an RPC that needs no wait (the batcher's
        # lonely leader on the sim device) is answered in the same write as the read's other
        # frames, with no task and no extra pass of the loop. One that waits goes on in a task.
        call = Call(headers, deadline)
        coro = self._run(conn, sid, m, request, call)
        ctx = contextvars.copy_context()  # what the handler sets stays its own, across its waits
        try:
            step = ctx.run(coro.send, None)
        except StopIteration:
            return
        task = self._continue(conn, sid, coro, step, ctx)
        if deadline is not None:  # the deadline cancels the handler, as grpc core's server does
            timer = asyncio.get_running_loop().call_later(max(deadline - time.monotonic(), 0.0), call._expire, task)
            task.add_done_callback(lambda _: timer.cancel())

    def _continue(self, conn: Http2Connection, sid: int, coro, step, ctx: contextvars.Context) -> asyncio.Task:
        """The rest of a started handler, in a task."""
        task = self.tasks[conn, sid] = asyncio.get_running_loop().create_task(_resume(coro, step), context=ctx)
        task.add_done_callback(functools.partial(self._unstarted, conn, sid, coro, ctx))
        return task

    def _unstarted(self, conn: Http2Connection, sid: int, coro, ctx: contextvars.Context, task: asyncio.Task) -> None:
        """A task cancelled before its first step (a reset in the same read as the request) never
        ran ``_resume``, so the handler never heard of it: tell it now, and let it clean up (in a
        task again if it waits while doing so)."""
        if coro.cr_frame is None:  # it ran to its end
            return
        try:
            step = ctx.run(coro.throw, asyncio.CancelledError())
        except StopIteration:
            return
        self._continue(conn, sid, coro, step, ctx)

    def _message(self, body: bytes, encoding: bytes | None) -> bytes:
        """The one message of a unary request's body."""
        limit = self.server.limits.max_body_bytes
        if len(body) < 5:
            raise GrpcError("INTERNAL", "no request message" if not body else "a truncated message header")
        flag, size = body[0], int.from_bytes(body[1:5], "big")
        if 5 + size != len(body):
            raise GrpcError("INTERNAL", "a truncated request message" if 5 + size > len(body) else "more than one request message for a unary method")
        if flag == 0:
            return body[5:]
        if flag != 1:
            raise GrpcError("INTERNAL", f"message flag {flag} is neither 0 nor 1")
        if encoding in (b"gzip", b"deflate"):
            d = zlib.decompressobj(31 if encoding == b"gzip" else 15)
            try:
                out = d.decompress(body[5:], limit + 1)
            except zlib.error as e:
                raise GrpcError("INTERNAL", f"the {encoding.decode()} message does not decompress: {e}") from None
            if len(out) > limit:
                raise GrpcError("RESOURCE_EXHAUSTED", f"decompressed request message larger than {limit} bytes")
            if not d.eof:
                raise GrpcError("INTERNAL", f"a truncated {encoding.decode()} message")
            return out
        if encoding is None or encoding == b"identity":
            raise GrpcError("INTERNAL", "a compressed message without a grpc-encoding")
        raise GrpcError("UNIMPLEMENTED", f"grpc-encoding {encoding[:64].decode('latin-1')!r} is not supported; supported: {ACCEPT_ENCODING.decode()}")

    def _refuse(self, conn: Http2Connection, sid: int, err: GrpcError) -> None:
        self.server.on_status(err.code)
        extra = [(b"grpc-accept-encoding", ACCEPT_ENCODING)] if err.code == "UNIMPLEMENTED" else []
        conn.respond(sid, _trailers_only(err.code, err.message, extra))

    def oversized(self, conn: Http2Connection, sid: int, headers: list[tuple[bytes, bytes]]) -> None:
        self._refuse(conn, sid, GrpcError("RESOURCE_EXHAUSTED", f"request message larger than max ({self.server.limits.max_body_bytes} bytes)"))

    def cancelled(self, conn: Http2Connection, sid: int) -> None:
        task = self.tasks.get((conn, sid))
        if task is not None:
            task.cancel()
        else:
            conn.release(sid)

    async def _run(self, conn: Http2Connection, sid: int, m: Method, request: Any, call: Call) -> None:
        try:
            resp = await m.handler(request, call)
            out = answer_bytes(resp)
        except GrpcError as e:
            conn.respond(sid, _trailers_only(e.code, e.message))
        except asyncio.CancelledError:
            # The client reset the stream (the handler counted it), or the deadline passed.
            left = call.time_remaining()
            if left is not None and left <= 0:
                conn.respond(sid, _trailers_only("DEADLINE_EXCEEDED", "deadline exceeded"))
            else:
                conn.release(sid)
        except Exception:  # a handler's bug: the client gets INTERNAL, the log the trace
            _log.exception("unhandled error in gRPC %s", type(request).__name__)
            self.server.on_status("INTERNAL")
            conn.respond(sid, _trailers_only("INTERNAL", "internal error"))
        else:
            conn.respond(sid, _HEAD_OK, b"\x00" + len(out).to_bytes(4, "big") + out, _TRAILERS_OK)
        finally:
            self.tasks.pop((conn, sid), None)


class GrpcServer:
    """gRPC unary methods on the running loop (see the module docstring).

    ``methods`` maps ``/<package>.<Service>/<Method>`` to a :class:`Method`; ``limits`` are each
    connection's, ``limits.max_body_bytes`` the largest request message (its 5-byte gRPC prefix
    comes on top); ``max_rpcs`` bounds the RPCs in progress across connections; ``on_status(code)``
    hears every status the server gives without a handler (unknown method, refused or malformed
    message), so metrics see them.
    """

    def __init__(self, methods: dict[str, Method], limits: Http2Limits, *, max_rpcs: int, on_status: Callable[[str], None] = lambda code: None) -> None:
        self.methods = methods
        self.limits = limits
        self.max_rpcs = max_rpcs
        self.on_status = on_status
        self._app = _App(self)
        self._conns: set[Http2Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        # A body is one message and its prefix.
        self._conn_limits = dataclasses.replace(limits, max_body_bytes=limits.max_body_bytes + 5)

    def connection(self) -> Http2Connection:
        """The protocol of one accepted connection, as :meth:`start`'s listener makes it; handed a
        transport of one's own, it drives the server with no socket (``bench_serve_instr.py``).

        Example::

            conn = server.connection()
            conn.connection_made(transport)   # writes the server's SETTINGS to it
            conn.data_received(client_bytes)  # requests in; answers to transport.write
        """
        return Http2Connection(self._app, self._conn_limits, self._conns)

    async def start(self, host: str, port: int) -> int:
        """Listens on ``host:port`` (0: any free port); returns the port. Raises ``OSError``."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.connection, host, port, backlog=4096)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self, grace_s: float) -> None:
        """Stops accepting, sends every connection GOAWAY, answers the RPCs it has (up to
        ``grace_s``), then closes what is left."""
        if self._server is None:
            return
        self._server.close()
        for c in list(self._conns):
            c.goaway()
        loop = asyncio.get_running_loop()
        end = loop.time() + grace_s
        # Connections close themselves once their streams are answered (and their answers read:
        # Http2Connection._close); checked every 5 ms, only while stopping.
        while self._conns and loop.time() < end:
            await asyncio.sleep(0.005)
        for t in list(self._app.tasks.values()):
            t.cancel()
        for c in list(self._conns):
            if c.transport is not None:
                c.transport.abort()
        self._server = None
