"""``offload serve``: the REST routes on uvicorn (uvloop + httptools) and, with a gRPC port, the
gRPC service on grpc.aio, both on one event loop over one data plane.

SIGTERM/SIGINT: readiness goes off at once; for ``DRAIN_LINGER_S`` the listener stays open and
serves as before, so connections already in the accept backlog are read and answered (closing the
listener resets them, fully sent requests included); then the listener closes, each open
connection answers what it has or what is on its way (``rest/limits.py``) with ``Connection:
close``, and every request already read is answered (a result, 504 or 503) within
``drain_timeout_s``. gRPC answers UNAVAILABLE from the signal on, then stops (``grpc/server.py``).
"""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import os
import signal
import sys
from typing import Any

import uvicorn

from offload.host.bundle import load
from offload.serve.config import ServeConfig
from offload.serve.dataplane import DataPlane
from offload.serve.errors import ConfigError
from offload.serve.rest import rest_app
from offload.serve.rest.limits import DRAIN_LINGER_S, HttpLimits, default_max_connections, limited_protocol

__all__ = ["serve", "is_loopback", "check_port"]


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_port(port: object) -> int:
    """``port`` if it is a TCP port (0 lets the OS choose); the OS would silently wrap 99999."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"port={port!r}: must be an integer in [0, 65535]")
    return port


class _DrainingServer(uvicorn.Server):
    """uvicorn's Server, with readiness off before it stops accepting and the backlog answered."""

    def __init__(self, config: uvicorn.Config, plane: DataPlane) -> None:
        super().__init__(config)
        self._plane = plane

    def handle_exit(self, sig, frame) -> None:
        # In the signal handler itself: uvicorn's main loop notices should_exit only on its next
        # tick (0.1 s); probes answered meanwhile must already say "not ready".
        self._plane.draining = True
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None) -> None:
        self._plane.draining = True
        # Closing the listener resets every connection still in the kernel's accept backlog, fully
        # sent requests included; keep accepting for a moment so they are read and answered.
        await asyncio.sleep(DRAIN_LINGER_S)
        await super().shutdown(sockets)


def serve(bundle: Any, config: ServeConfig, host: str = "127.0.0.1", port: int = 8000, *, grpc_port: int | None = None, log_level: str = "warning") -> None:
    """Serves ``bundle`` (a Bundle or a path) until SIGTERM/SIGINT, then drains (module docstring).

    Example::

        serve("risk_bundle", ServeConfig(device="sim"), port=8000, grpc_port=8001)
    """
    check_port(port)
    if grpc_port is not None:
        check_port(grpc_port)
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.WARNING), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log = logging.getLogger("offload.serve")
    if not is_loopback(host):
        log.warning("binding %s: the service is reachable from the network%s", host, "" if config.api_key else " WITHOUT an API key")
    plane = DataPlane(load(bundle) if isinstance(bundle, (str, os.PathLike)) else bundle, config)
    on_start = on_stop = None
    if grpc_port is not None:
        from offload.serve.grpc.server import GrpcListener  # imports grpc: only when asked for

        listener = GrpcListener(plane, host, grpc_port)
        on_start, on_stop = listener.start, listener.stop

    def count(status: int, error_type: str) -> None:
        plane.metrics.responses.labels(code=str(status)).inc()
        plane.metrics.errors.labels(type=error_type).inc()

    limits = HttpLimits(config.max_head_bytes, config.header_timeout_s, config.body_timeout_s, config.max_connections or default_max_connections(), count)
    uv = uvicorn.Config(
        rest_app(plane, on_start=on_start, on_stop=on_stop),
        host=host,
        port=port,
        loop="uvloop",
        http=limited_protocol(limits),
        ws="none",  # no WebSocket routes: an Upgrade request is answered as plain HTTP
        lifespan="on",
        access_log=False,
        log_level=log_level,
        timeout_graceful_shutdown=config.drain_timeout_s,
        timeout_keep_alive=30,
        backlog=4096,
        proxy_headers=False,  # nothing here reads the client's address or scheme
    )
    server = _DrainingServer(uv, plane)
    _settle_gc()
    # uvicorn drains, restores the previous handlers and re-raises the signal it caught; a clean
    # drain should end the process with status 0, not "killed by SIGTERM".
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    try:
        server.run()
    except BaseException as e:
        _leave_if_stuck(plane, 0 if isinstance(e, SystemExit) and not e.code else 1)
        raise
    _leave_if_stuck(plane, 0)


def _settle_gc() -> None:
    """The collector's settings for serving, once everything is loaded: what is loaded lives as
    long as the process, so it is frozen out of every later collection (a full pass then scans only
    per-request garbage), and a young-generation pass runs every 50,000 allocations instead of 700:
    with 64 requests in flight each pass walks every live request's objects, yet what dies young is
    freed by reference counting whatever the threshold."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, *gc.get_threshold()[1:])


def _leave_if_stuck(plane: DataPlane, status: int) -> None:
    """Ends the process at once when a device call or close never returned: the bindings' own
    ThreadPoolExecutor workers would make interpreter exit wait for it forever. Every answer is
    out by now."""
    if plane.runner.abandoned:
        logging.getLogger("offload.serve").warning("%d device call(s) never returned; exiting without waiting for them", plane.runner.abandoned)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _exit_cleanly(signum, frame) -> None:
    raise SystemExit(0)
