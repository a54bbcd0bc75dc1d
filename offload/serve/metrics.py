"""Prometheus metrics of one service instance, in a registry of its own (several apps can coexist).

Example::

    m = ServeMetrics()
    m.requests.labels(model="risk", code="200").inc()
    text = m.render()
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["ServeMetrics", "CONTENT_TYPE_LATEST", "DEVICE_STATES"]

# Sub-millisecond resolution: loopback requests take ~0.1-2 ms, so the default buckets (5 ms first) say nothing.
_LATENCY_BUCKETS = (50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 20e-3, 50e-3, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
DEVICE_STATES = ("up", "failed", "reopening", "closed")


class ServeMetrics:
    """The service's counters, gauges and histograms (prometheus_client's own, thread-safe)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.request_duration = Histogram("offload_request_duration_seconds", "Inference request latency, receive to response", ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_duration = Histogram("offload_queue_duration_seconds", "Time a request waited in the batch queue", ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.compute_duration = Histogram("offload_compute_duration_seconds", "Device time per batch", ["model", "device"], buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("offload_batch_size", "Rows per device call", ["model"], buckets=_BATCH_BUCKETS, registry=r)
        self.requests = Counter("offload_requests", "Inference requests by HTTP status", ["model", "code"], registry=r)
        self.responses = Counter("offload_responses", "Every HTTP response by status, any route (401, 404, 405 and 500 included)", ["code"], registry=r)
        self.grpc_responses = Counter("offload_grpc_responses", "Every gRPC response by status code (OK, INVALID_ARGUMENT, ...)", ["code"], registry=r)
        self.errors = Counter("offload_errors", "Errors by type", ["type"], registry=r)
        self.fallbacks = Counter("offload_fallbacks", "Batches re-run on the sim device after a device fault", ["model"], registry=r)
        self.device_faults = Counter("offload_device_faults", "Device errors and timeouts", ["device", "type"], registry=r)
        self.device_state = Gauge("offload_device_state", "1 for the device's current state", ["device", "state"], registry=r)
        self.queue_depth = Gauge("offload_queue_depth", "Requests waiting in the batch queue", ["model"], registry=r)

    def set_device_state(self, device: str, state: str) -> None:
        for s in DEVICE_STATES:
            self.device_state.labels(device=device, state=s).set(1.0 if s == state else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
