"""Runs the service's REST app on a real uvicorn server in a background thread (port chosen by the OS)."""

from __future__ import annotations

import contextlib
import threading
import time

import uvicorn

from offload.serve import DataPlane
from offload.serve.rest import rest_app


class Service:
    """A data plane and its REST app, as the tests drive them."""

    def __init__(self, bundle, config=None, **kw) -> None:
        self.plane = DataPlane(bundle, config, **kw)
        self.app = rest_app(self.plane)
        self.metrics, self.runner, self.model = self.plane.metrics, self.plane.runner, self.plane.model


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
