"""One write a response (offload/serve/httpguard.py, ``_OneWrite``): uvicorn's head and body go out
together, and nothing about what the client receives, or when, changes otherwise: 100 Continue
first, HEAD answers, heads of streamed answers not held past the loop's pass, pipelined answers
in order, a crashed app's head before the close, large bodies uncopied.

The guarded protocol runs on a real event loop with a recording transport in place of a socket:
the writes it records are the ``write`` system calls a socket would see."""

from __future__ import annotations

import asyncio

import pytest
from uvicorn.server import ServerState

from offload.serve.httpguard import HttpLimits, guarded_protocol
from offload.serve.server import _uvicorn_config


class _Transport:
    """What uvicorn's protocol calls on an asyncio transport, recording every write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _connection(app):
    loop = asyncio.get_running_loop()
    config = _uvicorn_config(app, "127.0.0.1", 8000, 1.0, "warning")
    config.lifespan = "off"
    config.load()
    cls = guarded_protocol(HttpLimits(16384, 10.0, 10.0, 100))
    proto = cls(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    t = _Transport()
    proto.connection_made(t)
    return proto, t


async def _until(cond, what: str) -> None:
    for _ in range(2000):
        if cond():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"timed out waiting for {what}")


def _answer(body: bytes = b"hello", status: int = 200):
    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


def test_head_and_body_go_out_in_one_write():
    async def go():
        proto, t = _connection(_answer(b'{"y":1}'))
        proto.data_received(GET)
        await _until(lambda: proto.cycle.response_complete, "the answer")
        await asyncio.sleep(0)  # the held head's flush callback, a no-op by now
        return t.writes

    (w,) = asyncio.run(go())
    assert w.startswith(b"HTTP/1.1 200 OK\r\n") and w.endswith(b'\r\n\r\n{"y":1}')


def test_a_head_request_gets_its_head_alone():
    async def go():
        proto, t = _connection(_answer(b"12345"))
        proto.data_received(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
        await _until(lambda: proto.cycle.response_complete, "the answer")
        return t.writes

    (w,) = asyncio.run(go())
    assert w.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 5\r\n" in w and w.endswith(b"\r\n\r\n")


def test_100_continue_goes_at_once_and_the_answer_in_one_write():
    async def go():
        proto, t = _connection(_answer(b"ok"))
        proto.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
        await _until(lambda: t.writes, "100 Continue")
        first = list(t.writes)  # what the client has before it sends the body
        proto.data_received(b"abc")
        await _until(lambda: proto.cycle.response_complete, "the answer")
        return first, t.writes

    first, writes = asyncio.run(go())
    assert first == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    assert len(writes) == 2 and writes[1].startswith(b"HTTP/1.1 200 OK\r\n") and writes[1].endswith(b"\r\n\r\nok")


def test_a_streamed_answers_head_is_not_held_while_the_app_awaits():
    gate: asyncio.Event

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await gate.wait()
        await send({"type": "http.response.body", "body": b"late", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def go():
        nonlocal gate
        gate = asyncio.Event()
        proto, t = _connection(app)
        proto.data_received(GET)
        await _until(lambda: t.writes, "the head")
        head_alone = list(t.writes)
        gate.set()
        await _until(lambda: proto.cycle.response_complete, "the end")
        return head_alone, t.writes

    head_alone, writes = asyncio.run(go())
    assert len(head_alone) == 1 and head_alone[0].startswith(b"HTTP/1.1 200 OK\r\n") and head_alone[0].endswith(b"transfer-encoding: chunked\r\n\r\n")
    assert writes[1:] == [b"4\r\nlate\r\n", b"0\r\n\r\n"]


def test_pipelined_answers_keep_their_order():
    n = 0

    async def app(scope, receive, send):
        nonlocal n
        n += 1
        body = scope["path"].encode()
        await receive()
        await asyncio.sleep(0.002 if n == 1 else 0)  # the first answer is the slower one
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def go():
        proto, t = _connection(app)
        proto.data_received(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\nGET /second HTTP/1.1\r\nHost: x\r\n\r\n")
        await _until(lambda: b"".join(t.writes).endswith(b"/second"), "both answers")
        await asyncio.sleep(0.005)
        return b"".join(t.writes)

    stream = asyncio.run(go())
    first, second = stream.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert first.endswith(b"\r\n\r\n/first") and second.endswith(b"\r\n\r\n/second")


def test_an_app_that_fails_after_its_head_closes_after_sending_it():
    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]})
        raise RuntimeError("boom")

    async def go():
        proto, t = _connection(app)
        proto.data_received(GET)
        await _until(lambda: t.closed, "the close")
        return t.writes

    (w,) = asyncio.run(go())
    assert w.startswith(b"HTTP/1.1 200 OK\r\n") and w.endswith(b"content-length: 10\r\n\r\n")


@pytest.mark.parametrize("size", [64 * 1024, 64 * 1024 + 1])
def test_only_bodies_past_64_kib_are_written_on_their_own(size):
    body = b"z" * size

    async def go():
        proto, t = _connection(_answer(body))
        proto.data_received(GET)
        await _until(lambda: proto.cycle.response_complete, "the answer")
        return t.writes

    writes = asyncio.run(go())
    assert b"".join(writes).endswith(b"\r\n\r\n" + body)
    assert len(writes) == (1 if size <= 64 * 1024 else 2)


def test_the_servers_config_takes_no_websocket_upgrade():
    config = _uvicorn_config(_answer(), "127.0.0.1", 8000, 1.0, "warning")
    config.load()
    assert config.ws_protocol_class is None
