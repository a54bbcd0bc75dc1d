"""Runs the service on uvicorn (uvloop + httptools). SIGTERM/SIGINT drain in-flight requests, then exit."""

from __future__ import annotations

import gc
import ipaddress
import logging
import os
import signal
import sys
from typing import Any

import uvicorn

from offload.host.bundle import load
from offload.serve.app import ScoringService
from offload.serve.config import ServeConfig
from offload.serve.errors import ConfigError
from offload.serve.httpguard import HttpLimits, default_max_connections, guarded_protocol

__all__ = ["serve", "is_loopback", "check_port", "grpc_core_env"]

# grpc core rollouts (src/core/lib/experiments/rollouts.yaml, grpcio 1.85: both "default: true")
# that move socket I/O onto EventEngine worker threads. grpc.aio already hands every completion
# from its poller thread to the event loop through a socket pair
# (src/python/grpcio/grpc/_cython/_cygrpc/aio/completion_queue.pyx.pxi, PollerCompletionQueue);
# with these on, each read first wakes an EventEngine thread, which then wakes the poller: one more
# thread hop per event, several per unary RPC. Off, the poller thread reads the socket itself
# (the iomgr path grpc core used by default for years). Measured on 2 cores with batch-1 RPCs from
# tritonclient.grpc: 20-30 % less CPU per request for the constant-answer gRPC server, ~14 % for
# the service. A grpcio that no longer knows a name logs "Unknown experiment" once and runs its
# default; child processes inherit the setting.
GRPC_EXPERIMENTS = "-event_engine_listener,-event_engine_for_all_other_endpoints"


_GC_GEN0 = 50_000


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


def _uvicorn_config(app: Any, host: str, port: int, drain_s: float, log_level: str, limits: HttpLimits | None = None):
    limits = limits or HttpLimits(16 * 1024, 10.0, 30.0, default_max_connections())
    return uvicorn.Config(
        app,
        host=host,
        port=check_port(port),
        loop="uvloop",
        # uvicorn's httptools protocol with head/body caps, read timeouts and a connection cap
        # (offload/serve/httpguard.py says why each is needed and where uvicorn stops).
        http=guarded_protocol(limits),
        # No WebSocket routes here: an Upgrade request is answered as plain HTTP, and uvicorn's
        # upgrade path, which hands the connection's transport to another protocol, never runs.
        ws="none",
        lifespan="on",
        access_log=False,
        log_level=log_level,
        # uvicorn stops accepting on SIGTERM and waits for open requests; this bounds the wait.
        timeout_graceful_shutdown=drain_s,
        # Keep-alive connections of load generators stay open between requests.
        timeout_keep_alive=30,
        backlog=4096,
        # Nothing here reads the client's address or scheme (no access log, keys not tied to
        # hosts): uvicorn's X-Forwarded-* middleware would only add a wrapper to every request.
        proxy_headers=False,
    )


def grpc_core_env() -> None:
    """Sets ``GRPC_EXPERIMENTS`` for this process's gRPC listener unless the environment already
    chose one. grpc core reads it once, when grpc is first imported, so this must run before
    anything imports grpc; serve() calls it before it imports the gRPC endpoint."""
    os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)


class _DrainingServer(uvicorn.Server):
    """uvicorn's Server, with the service's readiness switched off before it stops accepting."""

    def __init__(self, config: uvicorn.Config, svc: Any) -> None:
        super().__init__(config)
        self._svc = svc

    def handle_exit(self, sig, frame) -> None:
        # In the signal handler itself: uvicorn's main loop notices should_exit only on its next
        # tick (0.1 s); probes answered meanwhile must already say "not ready".
        self._svc.draining = True
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None) -> None:
        self._svc.draining = True
        await super().shutdown(sockets)


def serve(bundle: Any, config: ServeConfig, host: str = "127.0.0.1", port: int = 8000, *, grpc_port: int | None = None, log_level: str = "warning") -> None:
    """Serves ``bundle`` until SIGTERM/SIGINT. Then readiness goes off, the listener closes, and
    every request already read is answered (result, 504 or 503) within ``config.drain_timeout_s``.
    With ``grpc_port``, the OIP v2 gRPC service listens there too, on the same host, event loop
    and batcher, over ``config.grpc_server``'s transport (offload/serve/oip_grpc.py).

    Example::

        serve("risk_bundle", ServeConfig(device="sim"), port=8000, grpc_port=8001)
    """

    check_port(port)
    if grpc_port is not None:
        check_port(grpc_port)
        if config.grpc_server == "grpcio":
            grpc_core_env()  # before anything imports grpc
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.WARNING), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not is_loopback(host):
        logging.getLogger("offload.serve").warning("binding %s: the service is reachable from the network%s", host, "" if config.api_key else " WITHOUT an API key")
    svc = ScoringService(load(bundle) if isinstance(bundle, (str, os.PathLike)) else bundle, config)
    if grpc_port is not None:
        from offload.serve.oip_grpc import GrpcEndpoint

        svc.grpc = GrpcEndpoint(svc, host, grpc_port)

    def count(status: int, error_type: str) -> None:
        svc.count_response(status)
        svc.metrics.errors.labels(type=error_type).inc()

    limits = HttpLimits(
        max_head_bytes=config.max_head_bytes,
        header_timeout_s=config.header_timeout_s,
        body_timeout_s=config.body_timeout_s,
        max_connections=config.max_connections or default_max_connections(),
        count=count,
    )
    _settle_gc()
    server = _DrainingServer(_uvicorn_config(svc.app, host, port, config.drain_timeout_s, log_level, limits), svc)
    # uvicorn drains, restores the previous handlers and re-raises the signal it caught; a clean
    # drain should end the process with status 0, not "killed by SIGTERM".
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    try:
        server.run()
    except BaseException as e:
        _leave_if_stuck(svc, 0 if isinstance(e, SystemExit) and not e.code else 1)
        raise
    _leave_if_stuck(svc, 0)


def _settle_gc() -> None:
    """The collector's settings for serving, once everything is loaded."""
    # Everything loaded so far lives as long as the process: keep it out of every later
    # collection, so a full GC pass while serving scans only per-request garbage.
    gc.collect()
    gc.freeze()
    # A young-generation pass every _GC_GEN0 allocations instead of CPython's 700: with 64
    # requests in flight each pass walks every live request's objects (py-spy at 64 connections:
    # 2.5% of the server in gc_collect_main), yet what dies young is freed by reference counting
    # whatever the threshold; cycles wait at most a few thousand requests longer.
    gc.set_threshold(_GC_GEN0, *gc.get_threshold()[1:])


def _leave_if_stuck(svc: Any, status: int) -> None:
    """Ends the process at once when a device call or close never returned: the bindings' own
    ThreadPoolExecutor workers would make interpreter exit wait for it forever. Every answer is
    out by now."""
    if svc.runner.abandoned:
        logging.getLogger("offload.serve").warning("%d device call(s) never returned; exiting without waiting for them", svc.runner.abandoned)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _exit_cleanly(signum, frame) -> None:
    raise SystemExit(0)
