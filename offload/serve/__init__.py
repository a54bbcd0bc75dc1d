"""The scoring service: a bundle's model over the Open Inference Protocol v2 (KServe / Triton),
with dynamic batching, Prometheus metrics, device fail-over and an optional API key. The serving
path needs only a bundle and a device: no torch.

Example::

    from offload.serve import ServeConfig, create_app, serve
    serve("risk_bundle", ServeConfig(device="sim", max_batch_size=64), port=8000)   # blocks
    app = create_app("risk_bundle", ServeConfig())                                   # ASGI, for any server
"""

from offload.serve.app import ScoringService, create_app
from offload.serve.config import ServeConfig
from offload.serve.server import serve

__all__ = ["ServeConfig", "ScoringService", "create_app", "serve"]
