"""Closed-loop load: N keep-alive connections, each sending its next request as soon as the last
answer is in. What it measures is a server's throughput at a given concurrency (and the latency
that comes with it), the figure to compare two servers by when both are CPU-bound.

The client is an asyncio Protocol per connection speaking just enough HTTP/1.1 (pre-built request
bytes, status line + Content-Length of the answer): no coroutine, no client library per request.
On a 2-core machine the load tool shares the CPU with the server it loads; an aiohttp client
costs several times what the servers under test do per request, so it, not they, would set the
ceiling. Loopback targets only, duration bounded; answers without a Content-Length (chunked) are
refused, since every OIP server measured here sends one.

Example::

    res = uvloop.run(run_closed("http://127.0.0.1:8000/v2/models/risk/infer", body, connections=64, duration=3))
    res.throughput, res.percentiles()
"""

from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from hdrh.histogram import HdrHistogram

from offload.serve.server import is_loopback

__all__ = ["ClosedResult", "run_closed", "MAX_CONNECTIONS"]

MAX_CONNECTIONS = 1024
_MAX_LATENCY_US = 60_000_000


@dataclass
class ClosedResult:
    """Answers counted by status over ``elapsed`` seconds; latencies (200s only) in microseconds."""

    url: str
    connections: int
    ok: int
    errors: dict[str, int]
    elapsed: float
    hist: HdrHistogram = field(repr=False)

    @property
    def throughput(self) -> float:
        return self.ok / self.elapsed if self.elapsed > 0 else 0.0

    def percentiles(self) -> dict[str, float]:
        return {f"p{p:g}": float(self.hist.get_value_at_percentile(p)) for p in (50.0, 99.0)}


class _Conn(asyncio.Protocol):
    """One connection: send, read one whole answer, count it, send again until the run ends."""

    def __init__(self, run: "_Run") -> None:
        self.run = run
        self.buf = bytearray()
        self.need = -1  # bytes of the current answer (head + body) once its head is in
        self.status = 0
        self.t = 0.0
        self.transport: asyncio.Transport | None = None
        self.finished = False
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self) -> None:
        self.t = time.perf_counter()
        self.transport.write(self.run.request)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while True:
            if self.need < 0:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(buf[:end]).lower()
                i = head.find(b"\r\ncontent-length:")
                if i < 0:
                    self.finished = True
                    self.run.fail("no content-length")
                    self.transport.close()
                    return
                j = head.find(b"\r\n", i + 2)
                self.need = end + 4 + int(head[i + 17 : j if j >= 0 else len(head)])
                self.status = int(head[9:12])
            if len(buf) < self.need:
                return
            del buf[: self.need]
            self.need = -1
            if not self.run.answered(self.status, self.t):
                self.finished = True
                self.transport.close()
                return
            self.send()

    def connection_lost(self, exc) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        if not self.finished and self.run.running:
            self.run.fail("connection lost")


class _Run:
    def __init__(self, request: bytes, end: float, hist: HdrHistogram) -> None:
        self.request = request
        self.end = end
        self.hist = hist
        self.ok = 0
        self.errors: dict[str, int] = {}
        self.running = True
        self.done = asyncio.get_running_loop().create_future()
        self.open = 0

    def answered(self, status: int, t: float) -> bool:
        now = time.perf_counter()
        if status == 200:
            self.ok += 1
            self.hist.record_value(max(1, min(_MAX_LATENCY_US, int((now - t) * 1e6))))
        else:
            k = f"http_{status}"
            self.errors[k] = self.errors.get(k, 0) + 1
        if now < self.end:
            return True
        self.running = False
        self.open -= 1
        if self.open == 0 and not self.done.done():
            self.done.set_result(now)
        return False

    def fail(self, why: str) -> None:
        self.errors[why] = self.errors.get(why, 0) + 1
        if self.running:
            self.running = False
            if not self.done.done():
                self.done.set_result(time.perf_counter())


async def run_closed(url: str, body: bytes | None, *, connections: int, duration: float, headers: dict[str, str] | None = None) -> ClosedResult:
    """POSTs ``body`` to ``url`` (GETs it for None) over ``connections`` keep-alive connections for ``duration`` s."""
    u = urlsplit(url)
    if u.scheme != "http" or not u.hostname or not u.port:
        raise ValueError(f"url {url!r}: expected http://HOST:PORT/PATH")
    if not is_loopback(u.hostname):
        raise ValueError(f"url {url!r}: the load tool only targets loopback hosts (127.0.0.0/8, ::1, localhost)")
    if not 1 <= connections <= MAX_CONNECTIONS:
        raise ValueError(f"connections={connections}: must be in [1, {MAX_CONNECTIONS}]")
    if not 0 < duration <= 600:
        raise ValueError(f"duration={duration}: must be in (0, 600] s")
    if body is None:
        method, hdrs, body = "GET", {"host": u.netloc, **(headers or {})}, b""
    else:
        method, hdrs = "POST", {"host": u.netloc, "content-type": "application/json", **(headers or {}), "content-length": str(len(body))}
    request = f"{method} {u.path or '/'} HTTP/1.1\r\n".encode() + b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in hdrs.items()) + b"\r\n" + body
    loop = asyncio.get_running_loop()
    hist = HdrHistogram(1, _MAX_LATENCY_US, 3)
    conns = []
    # Connections are all open before the clock starts: a run measures answers, not handshakes.
    run = _Run(request, float("inf"), hist)
    for _ in range(connections):
        _, c = await loop.create_connection(lambda: _Conn(run), u.hostname, u.port)
        conns.append(c)
    run.open = connections
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # a collection in the client would be charged to the server as latency
    try:
        t0 = time.perf_counter()
        run.end = t0 + duration
        for c in conns:
            c.send()
        t1 = await run.done
    finally:
        if gc_was_enabled:
            gc.enable()
        for c in conns:
            c.transport.close()
        await asyncio.gather(*(c.closed for c in conns))
    return ClosedResult(url, connections, run.ok, run.errors, t1 - t0, hist)
