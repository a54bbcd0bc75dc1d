"""Runs the service on uvicorn (uvloop + httptools). SIGTERM/SIGINT drain in-flight requests, then exit."""

from __future__ import annotations

import gc
import ipaddress
import logging
import signal
from typing import Any

from offload.serve.config import ServeConfig

__all__ = ["serve", "is_loopback"]


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _uvicorn_config(app: Any, host: str, port: int, drain_s: float, log_level: str):
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=log_level,
        # uvicorn stops accepting on SIGTERM and waits for open requests; this bounds the wait.
        timeout_graceful_shutdown=drain_s,
        # Keep-alive connections of load generators stay open between requests.
        timeout_keep_alive=30,
        backlog=4096,
    )


def serve(bundle: Any, config: ServeConfig, host: str = "127.0.0.1", port: int = 8000, *, drain_s: float = 30.0, log_level: str = "warning") -> None:
    """Serves ``bundle`` until SIGTERM/SIGINT; in-flight and queued requests are answered first.

    Example::

        serve("risk_bundle", ServeConfig(device="sim"), port=8000)
    """
    import uvicorn

    from offload.serve.app import create_app

    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.WARNING), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not is_loopback(host):
        logging.getLogger("offload.serve").warning("binding %s: the service is reachable from the network%s", host, "" if config.api_key else " WITHOUT an API key")
    app = create_app(bundle, config)
    # Everything loaded so far lives as long as the process: keep it out of every later
    # collection, so a full GC pass while serving scans only per-request garbage.
    gc.collect()
    gc.freeze()
    server = uvicorn.Server(_uvicorn_config(app, host, port, drain_s, log_level))
    # uvicorn drains, restores the previous handlers and re-raises the signal it caught; a clean
    # drain should end the process with status 0, not "killed by SIGTERM".
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    server.run()


def _exit_cleanly(signum, frame) -> None:
    raise SystemExit(0)
