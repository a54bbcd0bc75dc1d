"""The data plane: the one ``infer`` that REST JSON, REST binary and gRPC all call.

It owns what is the same whatever the protocol: the model and its input check, the dynamic
batcher, the device runner with fail-over, the metrics, readiness and drain. The protocols
(``rest/``, ``grpc/``) only decode a request into an :class:`~offload.serve.types.InferRequest`,
call :meth:`DataPlane.infer`, and encode the answer or the :class:`ServeError` it raised, whose
status comes from the one table in :mod:`offload.serve.errors`.

Example::

    plane = DataPlane(offload.load("risk_bundle"), ServeConfig(device="sim"))
    await plane.start()
    resp = await plane.infer(InferRequest(rows))
    await plane.stop()
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from offload import __version__
from offload.host import launch_modes
from offload.host.bundle import Bundle
from offload.serve.batcher import DynamicBatcher
from offload.serve.config import ServeConfig
from offload.serve.errors import InvalidRequest, ServeError, UnknownModel, answer
from offload.serve.faults import FailoverRunner
from offload.serve.metrics import ServeMetrics
from offload.serve.model import ServedModel, served_model
from offload.serve.types import InferRequest, InferResponse
from offload.sim.errors import InputError, InputKeyError, InputTypeError

__all__ = ["DataPlane"]

_log = logging.getLogger("offload.serve")


class DataPlane:
    """One served model behind every protocol."""

    def __init__(self, bundle: Bundle, config: ServeConfig | None = None) -> None:
        self.config = cfg = config or ServeConfig()
        self.model: ServedModel = served_model(bundle)
        self.metrics = ServeMetrics()
        # A device whose kernel can stay running takes requests through its ring: no kernel start
        # a batch, and with calls in microseconds the batcher holds no lone request for a timer.
        self.launch = cfg.launch if cfg.launch != "auto" else ("persistent" if "persistent" in launch_modes(cfg.device) else "per_call")
        self.runner = FailoverRunner(
            self.model.kernel,
            cfg.device,
            n_out=self.model.output.width,
            fallback=cfg.fallback,
            metrics=self.metrics,
            model=self.model.name,
            timeout_s=cfg.device_timeout_ms / 1e3,
            reopen_backoff_s=cfg.reopen_backoff_s,
            probe=np.zeros((1, self.model.input.width), dtype=np.float32),
            launch=self.launch,
        )
        self.batcher = DynamicBatcher(
            self.runner.run,
            max_batch_size=cfg.max_batch_size,
            max_queue_delay_s=cfg.max_queue_delay_us / 1e6,
            max_queue_size=cfg.max_queue_size,
            metrics=self.metrics,
            model=self.model.name,
        )
        self.metrics.fallbacks.labels(model=self.model.name)  # exported as 0 from the start, not absent
        self._latency = self.metrics.request_duration.labels(model=self.model.name)
        self._timeout_s = cfg.request_timeout_ms / 1e3
        self.started = False
        self.draining = False  # set first thing on SIGTERM: readiness goes off before anything closes
        # Which bundle is live, for the audit trail: its manifest digest (None: an unsealed v1 bundle).
        _log.warning("serving model %r from bundle manifest sha256 %s on device %s (%s launch)", self.model.name, bundle.manifest_sha256 or "none (unsealed v1 bundle)", cfg.device, self.launch)

    async def start(self) -> None:
        if not self.started:
            self.started = True
            await self.batcher.start()

    async def stop(self) -> None:
        """Answers what is queued, then closes the devices."""
        await self.batcher.stop(self.config.drain_timeout_s)
        self.runner.close()

    # -- health and metadata ----------------------------------------------------------------------
    def ready(self) -> bool:
        return self.started and not self.draining and (self.runner.state == "up" or self.config.fallback == "sim")

    def check_model(self, name: str, version: str | None) -> None:
        """:class:`UnknownModel` unless ``name`` (and ``version``, when given) is the served model."""
        if name != self.model.name:
            raise UnknownModel(f"unknown model {name!r}; this server serves {self.model.name!r}")
        if version and version != self.model.version:
            raise UnknownModel(f"model {name!r} has no version {version!r}; versions: [{self.model.version!r}]")

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "offload", "version": __version__, "extensions": ["binary_tensor_data"]}

    # -- inference --------------------------------------------------------------------------------
    async def infer(self, req: InferRequest) -> InferResponse:
        """Checks ``req.rows`` with the kernel kind's own input check, queues them for a batch and
        returns their scores; a :class:`ServeError` for anything refused."""
        t0 = time.perf_counter()
        try:
            try:
                self.model.validate(req.rows)
            except (InputError, InputTypeError, InputKeyError) as e:  # the kind's documented refusals
                raise InvalidRequest(f"inputs[0].data: {e}") from None
            y = await self.batcher.infer(req.rows, self._timeout_s)
        finally:
            self._latency.observe(time.perf_counter() - t0)
        m = self.model
        return InferResponse(m.name, m.version, m.output, y, req.id, req.binary_output)

    def failed(self, err: ServeError) -> int:
        """Counts a refused request (``offload_errors_total{type}``); returns its HTTP status."""
        status, kind = answer(err)
        self.metrics.errors.labels(type=kind).inc()
        return status
