"""The HTTP limits' connection cap at its value, on the protocol class itself (uvicorn's
``HttpToolsProtocol`` driven through asyncio's protocol calls with an in-memory transport): up to
``max_connections`` idle connections stay open; one more closes the one that waited longest."""

from __future__ import annotations

import asyncio
import logging
import re

from uvicorn.config import Config
from uvicorn.server import ServerState

from offload.serve.rest.limits import HttpLimits, limited_protocol


async def _app(scope, receive, send):  # never reached: no request is sent
    raise AssertionError("no request was sent")


class _Transport(asyncio.Transport):
    def __init__(self, port: int) -> None:
        super().__init__()
        self.port, self.closed, self.written = port, False, b""

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", self.port), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def write(self, data) -> None:
        self.written += data

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def test_connections_up_to_the_cap_stay_open_and_one_more_closes_the_longest_idle(caplog):
    caplog.set_level(logging.INFO, logger="offload.serve")

    async def go():
        cls = limited_protocol(HttpLimits(16384, 30.0, 30.0, max_connections=3))
        config = Config(app=_app, lifespan="off", log_config=None)
        config.load()
        state = ServerState()
        conns = []
        for i in range(4):
            p = cls(config=config, server_state=state, app_state={})
            t = _Transport(5000 + i)
            p.connection_made(t)
            conns.append((p, t))
            if i == 2:  # at the cap: nobody is closed
                assert [t.closed for _, t in conns] == [False, False, False]
            await asyncio.sleep(0.01)  # each waits a little less than the one before
        assert [t.closed for _, t in conns] == [True, False, False, False]
        assert not any(t.written for _, t in conns)  # an idle connection is closed without an answer
        for p, _ in conns:
            p.connection_lost(None)
        assert not cls.open

    asyncio.run(go())
    (msg,) = [r.getMessage() for r in caplog.records if "connections open" in r.getMessage()]
    waited = float(re.search(r"4 connections open \(limit 3\): closing one that waited ([0-9.]+) s", msg).group(1))
    assert waited < 0.95  # about 30 ms, printed to 0.1 s


def _answer(data: bytes, limits: HttpLimits) -> bytes:
    async def go():
        config = Config(app=_app, lifespan="off", log_config=None)
        config.load()
        p = limited_protocol(limits)(config=config, server_state=ServerState(), app_state={})
        t = _Transport(6000)
        p.connection_made(t)
        p.data_received(data)
        p.connection_lost(None)
        assert t.closed
        return t.written

    return asyncio.run(go())


def test_refusals_carry_their_status_line_and_close():
    limits = HttpLimits(64, 30.0, 30.0, max_connections=8)
    bad = _answer(b"NOT HTTP AT ALL\r\n\r\n", limits)
    assert bad.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"connection: close" in bad
    big = _answer(b"GET / HTTP/1.1\r\nX: " + b"a" * 100 + b"\r\n\r\n", limits)
    assert big.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n") and b"64 bytes" in big
