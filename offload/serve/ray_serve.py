"""Scale-out with Ray Serve: the same ASGI app in N replicas, one per card.

Each replica asks Ray for one unit of a custom resource (default ``fpga``) that hosts with cards
advertise (``ray start --resources '{"fpga": 2}'``), so replicas land where a card is. When the
cluster advertises too few units for the replicas asked for, replicas are placed without the
resource and run on the sim device (same numbers, no card). Each replica decides from the
resources Ray actually assigned it.

Example::

    from offload.serve.ray_serve import deploy
    deploy("/srv/risk_bundle", ServeConfig(device="xrt:0"), replicas=2)     # after ray.init()
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
from typing import Any, Mapping

from offload.host.bundle import load
from offload.serve.config import ServeConfig
from offload.serve.dataplane import DataPlane
from offload.serve.rest import rest_app

__all__ = ["deploy", "run_ray", "replica_device", "APP_NAME"]

APP_NAME = "offload"
_log = logging.getLogger("offload.serve")


def replica_device(configured: str, assigned: Mapping[str, float], resource: str) -> str:
    """The device a replica opens: the configured one if Ray gave it a card, else ``"sim"``."""
    return configured if assigned.get(resource, 0) >= 1 else "sim"


def _replica_class():
    from ray import serve

    @serve.ingress()
    class OffloadReplica:
        """One service instance; Ray Serve routes HTTP to its ASGI app."""

        def __init__(self, bundle: str, config: dict, resource: str) -> None:
            import ray

            cfg = ServeConfig(**config)
            assigned = ray.get_runtime_context().get_assigned_resources()
            self.device = replica_device(cfg.device, assigned, resource)
            self._app = rest_app(DataPlane(load(bundle), dataclasses.replace(cfg, device=self.device)))

        def __serve_build_asgi_app__(self):
            return self._app

    return OffloadReplica


def deploy(bundle: str, config: ServeConfig, *, replicas: int = 1, resource: str = "fpga", host: str = "127.0.0.1", port: int = 8000, num_cpus: float = 0.5) -> dict[str, Any]:
    """Starts Ray Serve's HTTP proxy on ``host:port`` and deploys ``replicas`` replicas of the service.

    Connects to a running Ray cluster (or starts a local one). Returns what was decided:
    ``{"replicas", "resource", "cards": bool}``.
    """
    import ray
    from ray import serve

    if replicas < 1:
        raise ValueError(f"replicas={replicas}: must be >= 1")
    if not ray.is_initialized():
        ray.init(address="auto" if _cluster_running() else None, include_dashboard=False, logging_level="warning")
    have = ray.cluster_resources().get(resource, 0)
    cards = have >= replicas
    if not cards:
        _log.warning("Ray cluster advertises %g %r units for %d replicas: replicas run on the sim device", have, resource, replicas)
    opts: dict[str, Any] = {"num_cpus": num_cpus}
    if cards:
        opts["resources"] = {resource: 1}
    serve.start(http_options={"host": host, "port": port})
    dep = serve.deployment(_replica_class(), name="offload_model", num_replicas=replicas, ray_actor_options=opts, max_ongoing_requests=max(64, config.max_queue_size))
    serve.run(dep.bind(bundle, dataclasses.asdict(config), resource), name=APP_NAME, route_prefix="/")
    return {"replicas": replicas, "resource": resource, "cards": cards}


def _cluster_running() -> bool:
    return bool(os.environ.get("RAY_ADDRESS"))


def run_ray(bundle: str, config: ServeConfig, *, replicas: int, resource: str, host: str, port: int) -> None:
    """``offload serve --ray``: deploys, then serves until SIGTERM/SIGINT, then shuts Ray Serve down."""

    # Ray's C++ failure-signal handler turns SIGTERM into an immediate death (after a stack dump),
    # so the handler below would never run; this process only drives the deployment. Read when
    # Ray is imported, so set first.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    from ray import serve

    info = deploy(bundle, config, replicas=replicas, resource=resource, host=host, port=port)
    print(f"offload serve --ray: {replicas} replica(s) on http://{host}:{port} ({'one ' + resource + ' each' if info['cards'] else 'sim device, no ' + resource + ' resource'})", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):  # a bounded wait keeps the main thread able to run signal handlers
        pass
    print("offload serve --ray: stopping (Ray Serve drains the replicas)", flush=True)
    serve.shutdown()
    import ray

    ray.shutdown()
