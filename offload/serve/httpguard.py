"""The HTTP/1.1 connection limits uvicorn's httptools protocol lacks, as a subclass of it.

uvicorn 0.54 offers ``h11_max_incomplete_event_size`` for its h11 protocol only (``h11_impl.py``;
h11 0.16's own default, ``DEFAULT_MAX_INCOMPLETE_EVENT_SIZE``, is the 16 KiB used here), and no read
timeout for request heads or bodies under either protocol (``timeout_keep_alive`` covers idle
time between requests; a connection that never completes its first request waits forever).
httptools (0.9, ``parser.pyx``) appends each fragment of a header to the previous ones
(``self._current_header_value += val``) and uvicorn does the same with the URL (``self.url +=
url``): a head fed in many reads costs time quadratic in its size, before any route or key
check runs. The fix has to sit below the ASGI app, which sees a request only once its head is
parsed. This subclass adds, per connection:

- a cap on the request head (request line plus headers, ``max_head_bytes``, 431) enforced before
  the bytes reach the parser, a cap on the request line (``MAX_REQUEST_LINE``, 414) and on the
  header count (``MAX_HEADERS``, 431);
- a deadline for the head (``header_timeout_s``, from accept or from the first read of a later
  request; 408 and close) and for the body (``body_timeout_s``, from the read that ended the
  head; close);
- a connection cap under the open-file limit: at ``max_connections`` a new connection closes the
  one that has waited longest for a request head (an idle keep-alive or a slowloris), as nginx
  reuses "reusable" idle connections when it runs out, so the server never hits EMFILE (libuv
  then accepts and resets every pending client);
- a drain: on shutdown, an idle connection lingers ``DRAIN_LINGER_S`` so that a request already
  on its way is answered (with ``Connection: close``) rather than reset;
- one write a response (:class:`_OneWrite`): uvicorn writes a response's head when the app sends
  ``http.response.start`` and its body on ``http.response.body``, two ``write`` system calls and
  two TCP segments for every answer, each one a pass through the loopback or network stack and a
  wake-up of the client. The head is held until the body's write (or the end of the loop's pass,
  for an app that awaits in between) and goes out with it.

Example::

    cfg = uvicorn.Config(app, http=guarded_protocol(HttpLimits(max_head_bytes=16384, ...)))
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import Callable

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from offload.serve.errors import HeadTimeout, HeadTooLarge, InvalidRequest, RequestError, UriTooLong, answer

__all__ = ["HttpLimits", "guarded_protocol", "default_max_connections", "MAX_REQUEST_LINE", "MAX_HEADERS"]

_log = logging.getLogger("offload.serve")

MAX_REQUEST_LINE = 8190  # Apache's LimitRequestLine; nginx's 8 KiB large_client_header_buffers
MAX_HEADERS = 100  # Apache's LimitRequestFields
FD_HEADROOM = 64  # files the process keeps besides connections: device nodes, logs, the listener
DRAIN_LINGER_S = 0.5
_JOIN_MAX = 64 * 1024  # bodies up to this size are copied behind a held head, one write for both


def default_max_connections() -> int:
    """Open connections the process can hold under its open-file limit, keeping ``FD_HEADROOM``."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65536
    return max(16, soft - FD_HEADROOM)


@dataclass(frozen=True)
class HttpLimits:
    """Per-connection limits (see the module docstring); ``count(status, error_type)`` sees every
    answer sent here."""

    max_head_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    count: Callable[[int, str], None] | None = None


class _Rejected(Exception):
    """Raised in a parser callback to stop parsing; httptools wraps it, uvicorn answers 400."""


def guarded_protocol(limits: HttpLimits) -> type[HttpToolsProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)``, bound to ``limits``."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    limits: HttpLimits

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._head_open = True  # the next bytes belong to a request head
        self._head_seen = 0
        self._heads = 0  # heads completed on this connection
        self._head_since = 0.0
        self._n_headers = 0
        self._timer: asyncio.TimerHandle | None = None
        self._reject: RequestError | None = None
        self._draining = False

    # -- connection ---------------------------------------------------------------------------
    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Everything here writes through it, this protocol and uvicorn's cycles alike (they are
        # given self.transport), so nothing overtakes a held head; uvicorn's flow control keeps
        # the socket's own transport, for pause_reading / resume_reading.
        self.transport = _OneWrite(transport, self)
        self._head_since = self.loop.time()
        self._arm(self.limits.header_timeout_s, self._head_timeout)
        if len(self.connections) > self.limits.max_connections:
            self._evict()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        # A response with no body write (uvicorn writes none for HEAD) ends here: its head goes now.
        self.transport.flush()
        super().on_response_complete()

    def _evictable(self) -> bool:
        return self._head_open and (self.cycle is None or self.cycle.response_complete) and not self.pipeline

    def _evict(self) -> None:
        idle = [c for c in self.connections if c is not self and isinstance(c, GuardedHttpToolsProtocol) and c._evictable()]
        if idle:
            victim = min(idle, key=lambda c: c._head_since)
            _log.info("%d connections open (limit %d): closing one idle for %.1f s", len(self.connections), self.limits.max_connections, self.loop.time() - victim._head_since)
            victim._disarm()
            victim.transport.close()

    # -- bytes in -----------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._head_open:
            room = self.limits.max_head_bytes - self._head_seen
            if len(data) > room:
                heads = self._heads
                self._head_seen += room
                super().data_received(data[:room])
                if self._heads == heads:  # the cap was reached inside the head
                    if not self.transport.is_closing():
                        self._send_error(HeadTooLarge(f"request head exceeds {self.limits.max_head_bytes} bytes"))
                    return
                data = data[room:]
            else:
                self._head_seen += len(data)
        if self.transport.is_closing():
            return
        if data:
            # Bytes fed while not in a head may end a request and start the next one's head: those
            # are uncounted, at most one socket read (256 KiB in uvloop), so the parse stays linear.
            super().data_received(data)
        # Timers only for a read that leaves a head or a body half-received: a request that came
        # in one read (nearly all of them) costs no timer at all.
        if self._timer is None and not self.transport.is_closing():
            if not self._head_open:
                self._arm(self.limits.body_timeout_s, self._body_timeout)
            elif self._head_seen:
                self._arm(self.limits.header_timeout_s, self._head_timeout)

    def on_url(self, url: bytes) -> None:
        if len(self.url) + len(url) > MAX_REQUEST_LINE:
            self._reject = UriTooLong(f"request target exceeds {MAX_REQUEST_LINE} bytes")
            raise _Rejected
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._n_headers += 1
        if self._n_headers > MAX_HEADERS:
            self._reject = HeadTooLarge(f"more than {MAX_HEADERS} header fields")
            raise _Rejected
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._heads += 1
        self._head_open = False
        self._disarm()
        super().on_headers_complete()
        if self._draining and self.cycle is not None:
            self.cycle.keep_alive = False  # answered, then closed

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()
        self._head_open, self._head_seen, self._n_headers = True, 0, 0
        self._head_since = self.loop.time()

    # -- answers of our own -------------------------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to any parser error, ours (raised from a callback) included
        self._send_error(self._reject or InvalidRequest(msg))

    def _send_error(self, err: RequestError) -> None:
        self._disarm()
        status, kind = answer(err)
        body = orjson.dumps({"error": str(err)})
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend([b"content-type: application/json\r\n", b"content-length: " + str(len(body)).encode() + b"\r\n", b"connection: close\r\n\r\n", body])
        self.transport.write(b"".join(content))
        self.transport.close()
        if self.limits.count is not None:
            self.limits.count(status, kind)

    # -- timers -------------------------------------------------------------------------------
    def _arm(self, delay: float, fn: Callable[[], None]) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay, fn)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timeout(self) -> None:
        self._timer = None
        if self.transport.is_closing() or not self._evictable():
            return
        if self._head_seen:
            self._send_error(HeadTimeout(f"request head not received within {self.limits.header_timeout_s:g} s"))
        else:
            self.transport.close()

    def _body_timeout(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self._head_open:
            return
        if self.flow.read_paused:  # the app has not taken the body yet: not the client's delay
            self._arm(self.limits.body_timeout_s, self._body_timeout)
            return
        _log.info("request body not received within %g s: closing the connection", self.limits.body_timeout_s)
        self.transport.close()  # the app's receive() sees http.disconnect

    # -- drain --------------------------------------------------------------------------------
    def shutdown(self) -> None:
        self._draining = True
        if self.cycle is None or self.cycle.response_complete:
            if self._head_seen == 0:  # idle: a request may be on its way; answer it, don't reset it
                self._arm(DRAIN_LINGER_S, self._close_if_idle)
            # else a head is arriving: it is answered with Connection: close (the head timer bounds it)
        else:
            self.cycle.keep_alive = False

    def _close_if_idle(self) -> None:
        self._timer = None
        if self._head_seen == 0 and self._evictable() and not self.transport.is_closing():
            self.transport.close()
        elif self._head_open:
            self._arm(self.limits.header_timeout_s, self._head_timeout)


class _OneWrite:
    """A connection's transport that sends a response's head together with what follows it.

    The head is the first write of the protocol's current cycle after its response started
    (uvicorn's ``send`` sets ``response_started`` just before writing it); a ``100 Continue``
    comes before that and goes at once. A held head goes with the next write, at ``close``, at the
    end of the response (:meth:`GuardedHttpToolsProtocol.on_response_complete`), or at the latest
    when the loop runs its ready callbacks next (an app that awaits between head and body: a
    streamed answer's head is not delayed past that). Every other call is the transport's.
    """

    __slots__ = ("_t", "_protocol", "_held", "_headed")

    def __init__(self, transport, protocol: GuardedHttpToolsProtocol) -> None:
        self._t = transport
        self._protocol = protocol
        self._held: bytes | None = None
        self._headed = None  # the cycle whose head was held last

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if len(data) <= _JOIN_MAX:
                self._t.write(held + data)
                return
            self._t.write(held)  # a large body is not copied to save one system call
        cycle = self._protocol.cycle
        if cycle is not None and cycle.response_started and not cycle.response_complete and cycle is not self._headed:
            self._held = data
            self._headed = cycle
            self._protocol.loop.call_soon(self.flush)
            return
        self._t.write(data)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._t.is_closing():
                self._t.write(held)

    def close(self) -> None:
        self.flush()
        self._t.close()

    def is_closing(self) -> bool:
        return self._t.is_closing()

    def get_extra_info(self, name: str, default=None):
        return self._t.get_extra_info(name, default)
