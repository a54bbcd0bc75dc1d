"""Runs a ScoringService on a real uvicorn server in a background thread (port chosen by the OS)."""

from __future__ import annotations

import contextlib
import threading
import time

import uvicorn


@contextlib.contextmanager
def live(app):
    cfg = uvicorn.Config(app, host="127.0.0.1", port=0, loop="asyncio", http="httptools", lifespan="on", log_level="error", access_log=False)
    server = uvicorn.Server(cfg)
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    end = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > end or not t.is_alive():
            raise RuntimeError("test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(timeout=20)
