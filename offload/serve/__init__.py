"""The scoring service: a bundle's model over the Open Inference Protocol v2 (KServe / Triton),
REST and gRPC, with dynamic batching, Prometheus metrics, device fail-over and an optional API key.
The serving path needs only a bundle and a device: no torch.

Laid out as KServe's: ``dataplane.py`` (the one ``infer``), ``rest/`` and ``grpc/`` beside it,
``types.py`` the neutral request and response between them.

Example::

    from offload.serve import ServeConfig, create_app, serve
    serve("risk_bundle", ServeConfig(device="sim", max_batch_size=64), port=8000)   # blocks
    app = create_app("risk_bundle", ServeConfig())                                   # ASGI, for any server
"""

from __future__ import annotations

import os
from typing import Any

from offload.serve.config import ServeConfig
from offload.serve.dataplane import DataPlane
from offload.serve.server import serve

__all__ = ["ServeConfig", "DataPlane", "create_app", "serve"]


def create_app(bundle: Any, config: ServeConfig | None = None, **kw: Any):
    """The REST app (ASGI) serving ``bundle`` (a Bundle, or a path given to ``offload.load``).

    Example::

        app = create_app("risk_bundle", ServeConfig(device="sim", max_batch_size=64))
        # uvicorn.run(app, host="127.0.0.1", port=8000)
    """
    from offload.host.bundle import load
    from offload.serve.rest import rest_app

    if isinstance(bundle, (str, bytes, os.PathLike)):
        bundle = load(bundle)
    return rest_app(DataPlane(bundle, config, **kw))
