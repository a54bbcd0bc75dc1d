"""The HTTP/1.1 limits uvicorn's stock settings lack, as a subclass of its httptools protocol.

uvicorn (0.54-0.55) offers a head-size cap only for its h11 protocol
(``h11_max_incomplete_event_size``), ``timeout_keep_alive`` only between requests, and
``limit_concurrency`` only as a 503 once a head is complete: a connection that never completes its
first request waits forever and holds a file descriptor. httptools also appends each fragment of a
header to the last (``parser.pyx``), so a head fed in many reads costs time quadratic in its size.
These limits must act below the ASGI app, which sees a request only once its head is parsed.

The subclass uses asyncio's protocol interface (``connection_made``, ``data_received``,
``connection_lost``), httptools' documented parser callbacks (``on_url``, ``on_header``,
``on_headers_complete``, ``on_message_complete``), and uvicorn's ``send_400_response``, the one
place it answers a parser error, to answer with the limit's own status. Per connection:

- the request head (line plus headers) is capped at ``max_head_bytes`` before the bytes reach the
  parser (431), the request line at ``MAX_REQUEST_LINE`` (414), the header count at
  ``MAX_HEADERS`` (431);
- a head must arrive whole within ``header_timeout_s`` of its first byte (or of accept), however
  it trickles in: the deadline is armed once per head, never pushed back by a read (408, close);
  a body within ``body_timeout_s`` of the end of its head (close);
- on shutdown, a connection waiting for a request lingers ``DRAIN_LINGER_S`` before it closes, so
  a request already on its way is answered (with ``Connection: close``) rather than reset;
- at ``max_connections`` open connections a new one closes the connection that has waited longest
  for a request head, as nginx reuses idle connections when it runs out, so the process never
  meets EMFILE (libuv would then accept and reset every pending client).

Behind a reverse proxy (SECURITY.md) these are a second line; the proxy's own limits come first.

Example::

    uvicorn.Config(app, http=limited_protocol(HttpLimits(16384, 10.0, 30.0, 1024)))
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import Callable

import msgspec
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from offload.serve.errors import HeadTimeout, HeadTooLarge, InvalidRequest, RequestError, UriTooLong, answer

__all__ = ["HttpLimits", "limited_protocol", "default_max_connections", "MAX_REQUEST_LINE", "MAX_HEADERS", "DRAIN_LINGER_S"]

_log = logging.getLogger("offload.serve")

MAX_REQUEST_LINE = 8190  # Apache's LimitRequestLine; nginx's 8 KiB large_client_header_buffers
MAX_HEADERS = 100  # Apache's LimitRequestFields
DRAIN_LINGER_S = 0.5  # how long a drain waits for requests already on their way
FD_HEADROOM = 64  # files the process keeps besides connections: device nodes, logs, the listeners
_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 414: b"URI Too Long", 431: b"Request Header Fields Too Large"}


def default_max_connections() -> int:
    """Open connections the process can hold under its open-file limit, keeping ``FD_HEADROOM``."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 65536 if soft == resource.RLIM_INFINITY else max(16, soft - FD_HEADROOM)


@dataclass(frozen=True)
class HttpLimits:
    """Per-connection limits (module docstring); ``count(status, error_type)`` sees each refusal."""

    max_head_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    count: Callable[[int, str], None] | None = None


class _Rejected(Exception):
    """Raised in a parser callback to stop parsing; uvicorn then calls send_400_response."""


def limited_protocol(limits: HttpLimits) -> type[HttpToolsProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)``, bound to ``limits``."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), {"limits": limits, "open": set()})


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    limits: HttpLimits
    open: set  # this server's connections (one set per limited_protocol class)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # the next bytes belong to a request head
        self._head_bytes = 0
        self._n_headers = 0
        self._waiting_since = 0.0  # when this connection began waiting for its current head
        self._timer: asyncio.TimerHandle | None = None
        self._reject: RequestError | None = None
        self._closing = False  # the server is draining: every answer from now on closes the connection

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._waiting_since = self.loop.time()
        self._arm(self.limits.header_timeout_s, self._head_late)
        self.open.add(self)
        if len(self.open) > self.limits.max_connections:
            self._evict()

    def connection_lost(self, exc) -> None:
        self._disarm()
        self.open.discard(self)
        super().connection_lost(exc)

    def _evict(self) -> None:
        idle = [c for c in self.open if c is not self and c._waiting()]
        if idle:
            victim = min(idle, key=lambda c: c._waiting_since)
            _log.info("%d connections open (limit %d): closing one that waited %.1f s for a request", len(self.open), self.limits.max_connections, self.loop.time() - victim._waiting_since)
            victim._disarm()
            victim.transport.close()

    def _waiting(self) -> bool:
        """Waiting for a request head, with no answer owed (uvicorn's cycle and pipeline)."""
        return self._in_head and (self.cycle is None or self.cycle.response_complete) and not self.pipeline

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            room = self.limits.max_head_bytes - self._head_bytes
            if len(data) > room:
                self._head_bytes += room
                super().data_received(data[:room])
                if self._in_head and not self.transport.is_closing():  # the cap was reached inside the head
                    self._refuse(HeadTooLarge(f"request head exceeds {self.limits.max_head_bytes} bytes"))
                    return
                data = data[room:]
            else:
                self._head_bytes += len(data)
        if data and not self.transport.is_closing():
            super().data_received(data)
        # A head begun in this read gets its deadline now, once: later reads never push it back.
        if self._in_head and self._head_bytes and self._timer is None and not self.transport.is_closing():
            self._arm(self.limits.header_timeout_s, self._head_late)

    # -- httptools' parser callbacks ------------------------------------------------------------
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
        self._in_head = False
        self._arm(self.limits.body_timeout_s, self._body_late)
        super().on_headers_complete()
        if self._closing and self.cycle is not None:
            self.cycle.keep_alive = False  # answered, then closed

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes, self._n_headers = True, 0, 0
        self._waiting_since = self.loop.time()
        # Idle until the next head's first byte arms its deadline (data_received); an idle
        # keep-alive connection is uvicorn's timeout_keep_alive's.
        self._disarm()

    def shutdown(self) -> None:
        """uvicorn's drain: it closes a connection with no request in progress at once, which
        resets one whose next request is already on the wire; such a connection lingers first."""
        self._closing = True
        if not self._waiting():
            super().shutdown()  # a request in progress: answered, then closed
        elif self._head_bytes == 0:
            self._arm(DRAIN_LINGER_S, self._close_if_idle)
        # else a head is arriving: its deadline bounds it, and its answer says Connection: close

    def _close_if_idle(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self._waiting() and self._head_bytes == 0:
            self.transport.close()
        elif self._in_head:
            self._arm(self.limits.header_timeout_s, self._head_late)

    # -- answers of our own ---------------------------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        self._refuse(self._reject or InvalidRequest(msg))

    def _refuse(self, err: RequestError) -> None:
        self._disarm()
        status, kind = answer(err)
        body = msgspec.json.encode({"error": str(err)})
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % (status, _REASONS.get(status, b"Error"), len(body))
        self.transport.write(head + body)
        self.transport.close()
        if self.limits.count is not None:
            self.limits.count(status, kind)

    # -- deadlines --------------------------------------------------------------------------------
    def _arm(self, delay: float, fn: Callable[[], None]) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay, fn)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_late(self) -> None:
        self._timer = None
        if self.transport.is_closing() or not self._in_head:
            return
        if not self._waiting():  # the last request's answer is still being made: not the client's delay
            self._arm(self.limits.header_timeout_s, self._head_late)
            return
        if self._head_bytes:
            self._refuse(HeadTimeout(f"request head not received within {self.limits.header_timeout_s:g} s"))
        else:
            self.transport.close()  # nothing sent: nothing to answer

    def _body_late(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self._in_head:
            return
        if self.flow.read_paused:  # the app has not taken the body yet: not the client's delay
            self._arm(self.limits.body_timeout_s, self._body_late)
            return
        _log.info("request body not received within %g s: closing the connection", self.limits.body_timeout_s)
        self.transport.close()  # the app's receive() sees http.disconnect
