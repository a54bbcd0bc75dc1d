"""Hostile HTTP against a real ``offload serve`` process (issue 15, items 6, 7, 11 and 12): oversized
and slow request heads and bodies, descriptor exhaustion, SIGTERM under load, bad settings,
response metrics, the bearer scheme and redirects. Every socket goes to 127.0.0.1; every wait is
bounded by a socket timeout."""

from __future__ import annotations

import asyncio
import random
import re
import signal
import socket
import subprocess
import time

import httpx
import pytest
from _serve_proc import OFFLOAD, raw_request, read_all, read_until_close, risk_bundle, serving, status_of

from offload.serve.config import ServeConfig
from offload.serve.errors import ConfigError

KEY = "k3y"
N_IN = 16
ROW = ",".join(["0.5"] * N_IN)
INFER = ('{"inputs":[{"name":"x","shape":[1,%d],"datatype":"FP32","data":[%s]}]}' % (N_IN, ROW)).encode()


@pytest.fixture(scope="module")
def srv():
    # Short read timeouts so that slow clients are cut within the test's bounded waits.
    with serving("--header-timeout-s", "1", "--body-timeout-s", "1", api_key=KEY) as s:
        yield s


def _infer_bytes(body: bytes = INFER, *, auth: str = f"Bearer {KEY}", extra: bytes = b"") -> bytes:
    head = b"POST /v2/models/risk/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += f"Authorization: {auth}\r\nContent-Length: {len(body)}\r\n".encode() + extra + b"\r\n"
    return head + body


# -- item 6: head and body limits ------------------------------------------------------------------
def test_an_oversized_header_is_refused_with_431_before_it_is_read_whole(srv):
    # 4 MiB of a single header, streamed: the server must answer 431 after its cap (16 KiB), not
    # parse megabytes. The client stops sending once the server has answered and closed.
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        sent = 0
        try:
            while sent < 4 << 20:
                s.sendall(b"a" * 65536)
                sent += 65536
            s.sendall(b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = read_all(s)
    assert status_of(got) == 431, got[:200]
    assert b"16384" in got  # the error names the limit
    # A complete head just over the cap: 431 too, and the server keeps serving.
    r = raw_request(srv.port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
    assert status_of(r) == 431
    # At the limit itself: a head of exactly 16384 bytes is read; one byte more is refused.
    base = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: \r\n\r\n"
    pad = lambda n: base[:-4] + b"a" * (n - len(base)) + b"\r\n\r\n"  # noqa: E731
    assert status_of(raw_request(srv.port, pad(16384))) == 200
    assert status_of(raw_request(srv.port, pad(16385))) == 431
    assert httpx.get(f"{srv.url}/v2/health/live", timeout=5).status_code == 200


def _head(path: bytes, n_fields: int) -> bytes:
    """A GET head with exactly ``n_fields`` header fields, Host included."""
    return b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(n_fields - 1)) + b"\r\n"


def test_the_request_line_and_header_count_limits_at_their_value(srv):
    # Apache's LimitRequestLine (8190) and LimitRequestFields (100): the last value that passes
    # and the first that is refused, from the limits' definitions.
    line = lambda n: b"GET /v2/health/live?" + b"a" * (n - len(b"/v2/health/live?")) + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"  # noqa: E731
    assert status_of(raw_request(srv.port, line(8190))) == 200
    r = raw_request(srv.port, line(8191))
    assert status_of(r) == 414, r[:200]
    assert status_of(raw_request(srv.port, _head(b"/v2/health/live", 100))) == 200
    r = raw_request(srv.port, _head(b"/v2/health/live", 101))
    assert status_of(r) == 431 and b"100 header fields" in r, r[:200]


def test_the_header_count_is_per_request_on_a_keep_alive_connection(srv):
    # Three requests of 60 fields each on one connection: 180 in all, 60 a request, all answered.
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(_head(b"/v2/health/live", 60) * 3)
        got = b""
        while got.count(b"HTTP/1.1 ") < 3:
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
    assert [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3})", got)] == [200, 200, 200], got[:300]


def test_a_head_trickled_a_byte_at_a_time_still_meets_its_deadline(srv):
    # slowloris that trickles: a byte every 0.25 s. The head deadline (1 s here) runs from the
    # head's first byte and no read pushes it back, so the connection is answered 408 and closed
    # well before the head could finish (it would take 12 s).
    head = b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: trickle\r\n\r\n"
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        t0 = time.monotonic()
        got = b""
        try:
            for b in head:
                s.sendall(bytes([b]))
                time.sleep(0.25)
                if time.monotonic() - t0 > 6:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        rest, closed = read_until_close(s)
        got += rest
        elapsed = time.monotonic() - t0
    assert status_of(got) == 408 and closed, got
    assert elapsed < 6, f"the trickled head held the connection {elapsed:.1f} s"


def test_a_slow_head_gets_408_and_a_slow_body_is_cut(srv):
    # slowloris: half a head, then silence. The server's head timeout is 1 s; the socket waits 10 s.
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        got, closed = read_until_close(s)
        assert status_of(got) == 408 and closed, got
    # A connection that never sends a byte is closed too, without an answer.
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        assert read_until_close(s) == (b"", True)
    # A body that stops half-way: the connection is closed, without an answer to a half request.
    whole = _infer_bytes()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(whole[: len(whole) - 20])
        assert read_until_close(s) == (b"", True)
    assert httpx.post(f"{srv.url}/v2/models/risk/infer", content=INFER, headers={"Authorization": f"Bearer {KEY}"}, timeout=5).status_code == 200


def test_held_half_heads_past_the_open_file_limit_do_not_lock_out_new_clients():
    # 300 connections holding half a head against a server allowed 256 open files (and a long
    # head timeout, so it is the connection cap that acts): new clients are still served.
    with serving("--header-timeout-s", "60", nofile=256) as s:
        held = []
        try:
            for _ in range(300):
                c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
                c.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                held.append(c)
            for _ in range(3):
                r = raw_request(s.port, b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", timeout=10)
                assert status_of(r) == 200, r[:200]
        finally:
            for c in held:
                c.close()


# -- item 7: SIGTERM drain ---------------------------------------------------------------------------
async def _client(port: int, stats: dict, stop: asyncio.Event, seed: int) -> None:
    """Closed-loop keep-alive client over raw sockets with a think time of up to 5 ms (so that
    SIGTERM finds connections idle between requests); honours ``Connection: close``. A request
    counts as dropped when it was sent whole and the connection ended with no answer."""
    req = _infer_bytes(auth="Bearer none")  # no key on this server: auth header is ignored
    rng = random.Random(seed)
    while not stop.is_set():
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return  # listener closed: nothing sent, nothing lost
        try:
            while True:
                await asyncio.sleep(rng.uniform(0, 0.005))
                w.write(req)
                await w.drain()
                stats["sent"] += 1
                try:
                    head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 15)
                except (asyncio.IncompleteReadError, ConnectionError):
                    stats["dropped"] += 1
                    return
                n = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))
                await asyncio.wait_for(r.readexactly(n), 15)
                code = status_of(head)
                stats[code] = stats.get(code, 0) + 1
                if re.search(rb"(?i)connection: close", head):
                    break
        except ConnectionError:
            stats["write_failed"] += 1  # the request never left: the server had closed already
        finally:
            w.close()


def test_sigterm_under_load_answers_every_request_it_read():
    with serving("--max-queue-delay-us", "2000") as s:

        async def go():
            stats = {"sent": 0, "dropped": 0, "write_failed": 0}
            stop = asyncio.Event()
            # A keep-alive connection that is idle when SIGTERM comes: readiness is off on it.
            pr, pw = await asyncio.open_connection("127.0.0.1", s.port)
            clients = [asyncio.ensure_future(_client(s.port, stats, stop, i)) for i in range(64)]
            end = time.monotonic() + 30
            while stats.get(200, 0) < 300:
                assert time.monotonic() < end, stats
                await asyncio.sleep(0.02)
            s.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.05)
            pw.write(b"GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            probe = await asyncio.wait_for(pr.read(), 15)
            pw.close()
            await asyncio.wait_for(asyncio.gather(*clients), 30)
            stop.set()
            return stats, probe

        stats, probe = asyncio.run(go())
        assert s.proc.wait(timeout=30) == 0
    assert stats["dropped"] == 0, stats
    assert status_of(probe) == 503 and b'"ready":false' in probe, probe
    assert set(stats) <= {"sent", "dropped", "write_failed", 200, 503}, stats


def test_sigterm_answers_requests_waiting_in_the_accept_backlog():
    # The server is stopped (SIGSTOP) while 10 clients connect and send whole requests: the kernel
    # completes their handshakes and holds the connections in the listener's backlog. Then
    # SIGTERM and SIGCONT: every one of them gets an answer, none a reset.
    with serving() as s:
        s.proc.send_signal(signal.SIGSTOP)
        socks = []
        try:
            for _ in range(10):
                c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
                c.sendall(_infer_bytes(auth="Bearer none"))
                socks.append(c)
            time.sleep(0.5)  # past uvicorn's 0.1 s tick: on SIGCONT its exit check runs before the backlog is read
            s.proc.send_signal(signal.SIGTERM)
        finally:
            s.proc.send_signal(signal.SIGCONT)
        answers = []
        for c in socks:
            got, _ = read_until_close(c)
            answers.append(status_of(got) if got else None)
            # A 503 must let the client retry elsewhere: it closes the connection and says so.
            assert answers[-1] != 503 or b"connection: close" in got.split(b"\r\n\r\n")[0].lower(), got
            c.close()
        assert s.proc.wait(timeout=30) == 0
    assert all(a in (200, 503) for a in answers), answers


# -- item 11: settings ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, words",
    [
        (["--request-timeout-ms", "nan"], "request_timeout_ms"),
        (["--device-timeout-ms", "inf"], "device_timeout_ms"),
        (["--request-timeout-ms", "-5"], "request_timeout_ms"),
        (["--port", "99999"], "99999"),
        (["--max-queue-size", "0"], "max_queue_size"),
    ],
)
def test_bad_settings_are_refused_at_start_up(args, words):
    r = subprocess.run([*OFFLOAD, "serve", risk_bundle(), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert words in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("field, value", [("request_timeout_ms", float("nan")), ("device_timeout_ms", float("inf")), ("header_timeout_s", 0.0), ("max_body_bytes", 2**40), ("max_batch_size", True)])
def test_config_rejects_non_finite_and_out_of_range(field, value):
    with pytest.raises(ConfigError, match=field):
        ServeConfig(**{field: value})


# -- item 12: metrics, bearer scheme, redirects ----------------------------------------------------
def test_every_response_is_counted_by_code(srv):
    before = srv.metrics()
    h = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=srv.url, timeout=5) as c:
        assert c.get("/v2/models/risk").status_code == 401
        assert c.get("/nope", headers=h).status_code == 404
        assert c.post("/v2/health/live").status_code == 405
        assert c.post("/v2/models/nope/infer", headers=h, content=INFER).status_code == 404
    assert status_of(raw_request(srv.port, b"GET /v2/" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n")) == 414
    after = srv.metrics()
    for code, n in (("401", 1), ("404", 2), ("405", 1), ("414", 1)):
        key = f'offload_responses_total{{code="{code}"}}'
        assert after.get(key, 0) - before.get(key, 0) == n, (code, before.get(key), after.get(key))


def test_bearer_scheme_is_case_insensitive_and_the_key_still_checked(srv):
    with httpx.Client(base_url=srv.url, timeout=5) as c:
        for scheme in ("Bearer", "bearer", "BEARER"):
            assert c.get("/v2/models/risk", headers={"Authorization": f"{scheme} {KEY}"}).status_code == 200, scheme
        for bad in (f"bearer {KEY}x", f"Basic {KEY}", KEY, f"bearer{KEY}"):
            assert c.get("/v2/models/risk", headers={"Authorization": bad}).status_code == 401, bad


def test_no_redirect_is_built_from_the_host_header(srv):
    for path in (b"/v2/", b"/v2/health/live/", b"/metrics/"):
        r = raw_request(srv.port, b"GET " + path + b" HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer " + KEY.encode() + b"\r\nConnection: close\r\n\r\n")
        assert b"evil.example" not in r, r[:300]
        assert status_of(r) not in (301, 302, 303, 307, 308), r[:300]


def test_every_serve_error_has_its_status_in_the_one_table():
    import inspect

    from offload.serve import errors
    from offload.sim.errors import OffloadError

    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.ServeError) and c not in (errors.ServeError, errors.RequestError)]
    assert len(classes) >= 12
    for c in classes:
        assert issubclass(c, OffloadError)
        assert c in errors.HTTP_STATUS, f"{c.__name__} has no HTTP status"
        status, kind = errors.answer(c("x"))
        assert (status >= 500) == (not issubclass(c, errors.RequestError)), c
    assert errors.answer(errors.InvalidRequest("x")) == (400, "bad_request")
