"""Prometheus metrics of one service instance (its own registry, so several apps can coexist).

The per-request series (latencies, batch sizes, request and response counts) are observed on the
event loop's thread only, several times per request: prometheus_client's Histogram takes a lock
per bucket increment and per sum (~1.3 us an observation, ~15% of the service's own CPU per
request at 64 connections, py-spy). They are kept here as plain numbers instead (:class:`LoopHistogram`,
:class:`LoopCounter`) and turned into the same samples, names and ``_created`` series when
scraped. Series that other threads touch (device state and faults, set by the re-opener) stay
prometheus_client's own.
"""

from __future__ import annotations

import functools
import operator
import time
from typing import Callable, Iterable

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

__all__ = ["ServeMetrics", "LoopHistogram", "LoopCounter", "CONTENT_TYPE_LATEST", "FOLD_EVERY_S"]

# Sub-millisecond resolution: loopback requests take ~0.2-2 ms, so the default buckets (5 ms first) say nothing.
_LATENCY_BUCKETS = (50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 20e-3, 50e-3, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_FOLD_AT = 4096  # observe_many's bound on what it holds before binning: ~130 KB a series
FOLD_EVERY_S = 0.1  # how often a running service bins what its series hold (ServeMetrics.fold)
DEVICE_STATES = ("up", "failed", "reopening", "closed")


class _HistChild:
    """One labelled histogram series. ``observe(v)`` is the pending list's own ``append``, a C
    call with no Python frame (four observations a lone request; each frame's code and data are
    cache lines such a request brings back). What it holds is binned in bulk by :meth:`fold`:
    before each scrape, by ``observe_many`` past ``_FOLD_AT``, and every ``FOLD_EVERY_S`` on a
    running service's loop (:meth:`ServeMetrics.fold`), which bounds what a series holds to what
    that interval brings. A ``bisect`` per observation compared floats through the object
    protocol, ~860 machine instructions each (callgrind), against ~120 binned in bulk. Bucket
    counts and the sum are exactly what observing one at a time gives (the sum is added up in
    arrival order)."""

    __slots__ = ("_edges", "_vals", "observe", "counts", "sum", "created")

    def __init__(self, edges: np.ndarray) -> None:
        self._edges = edges  # the family's bucket bounds, float64, shared by its series
        self._vals: list[float] = []  # observed, not yet binned; always this list (observe is bound to it)
        self.observe: Callable[[float], None] = self._vals.append
        self.counts = [0] * (len(edges) + 1)  # per bucket, not cumulative; the last is +Inf
        self.sum = 0.0
        self.created = time.time()

    def observe_many(self, vs: list[float]) -> None:
        """:meth:`observe` of each value: one call for a batch's requests."""
        vals = self._vals
        vals.extend(vs)
        if len(vals) >= _FOLD_AT:
            self.fold()

    def fold(self) -> None:
        """Bins what was observed since the last fold into ``counts`` and ``sum``."""
        held = self._vals
        if not held:
            return
        vals = held.copy()
        held.clear()  # emptied in place: observe appends to this list
        # side="left": a value equal to a bound falls in that bound's bucket (le, "less or
        # equal"), as bisect_left placed it. Values are durations and row counts, never NaN.
        where = np.searchsorted(self._edges, np.array(vals, dtype=np.float64), side="left")
        for i, n in enumerate(np.bincount(where, minlength=len(self.counts)).tolist()):
            self.counts[i] += n
        self.sum = functools.reduce(operator.add, vals, self.sum)


class _CountChild:
    __slots__ = ("value", "created")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, n: float = 1.0) -> None:
        if n < 0:
            raise ValueError("counters only go up")
        self.value += n


class _Family:
    """Labelled children, created on first use and then cached: ``labels(**kw)`` is a dict lookup."""

    def __init__(self, name: str, doc: str, labelnames: Iterable[str], registry: CollectorRegistry) -> None:
        self.name, self.doc = name, doc
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], object] = {}
        registry.register(self)

    def _child(self):
        raise NotImplementedError

    def labels(self, **kw: object):
        if set(kw) != set(self.labelnames):
            raise ValueError(f"{self.name}: labels {sorted(kw)}; expected {sorted(self.labelnames)}")
        key = tuple(str(kw[n]) for n in self.labelnames)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = self._child()
        return c


class LoopHistogram(_Family):
    """A labelled histogram for one thread (the event loop's): no lock; observations binned in bulk."""

    def __init__(self, name: str, doc: str, labelnames: Iterable[str], *, buckets: tuple[float, ...], registry: CollectorRegistry) -> None:
        bounds = tuple(float(b) for b in buckets)
        self._edges = np.array(bounds, dtype=np.float64)
        self._le = [floatToGoString(b) for b in bounds] + ["+Inf"]
        super().__init__(name, doc, labelnames, registry)

    def _child(self) -> _HistChild:
        return _HistChild(self._edges)

    def fold(self) -> None:
        """Bins what every series holds (:meth:`_HistChild.fold`)."""
        for c in list(self._children.values()):
            c.fold()

    def collect(self) -> list[Metric]:
        fam = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        for key, c in list(self._children.items()):
            c.fold()
            cum, acc = [], 0
            for le, n in zip(self._le, c.counts):
                acc += n
                cum.append((le, float(acc)))
            fam.add_metric(list(key), cum, c.sum)
            fam.samples.append(Sample(self.name + "_created", dict(zip(self.labelnames, key)), c.created, None, None))
        return [fam]


class LoopCounter(_Family):
    """A labelled counter for one thread (the event loop's); exposed as ``<name>_total``."""

    def _child(self) -> _CountChild:
        return _CountChild()

    def collect(self) -> list[Metric]:
        fam = CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
        for key, c in list(self._children.items()):
            fam.add_metric(list(key), c.value, created=c.created)
        return [fam]


class ServeMetrics:
    """The service's counters and histograms.

    Example::

        m = ServeMetrics()
        m.requests.labels(model="risk", code="200").inc()
        text = m.render()
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.request_duration = LoopHistogram("offload_request_duration_seconds", "Inference request latency, receive to response", ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_duration = LoopHistogram("offload_queue_duration_seconds", "Time a request waited in the batch queue", ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.compute_duration = LoopHistogram("offload_compute_duration_seconds", "Device time per batch", ["model", "device"], buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_size = LoopHistogram("offload_batch_size", "Rows per device call", ["model"], buckets=_BATCH_BUCKETS, registry=r)
        self.requests = LoopCounter("offload_requests", "Inference requests by HTTP status", ["model", "code"], registry=r)
        self.responses = LoopCounter("offload_responses", "Every HTTP response by status, any route (401, 404, 405 and 500 included)", ["code"], registry=r)
        self.grpc_responses = LoopCounter("offload_grpc_responses", "Every gRPC response by status code (OK, INVALID_ARGUMENT, ...)", ["code"], registry=r)
        self.errors = Counter("offload_errors", "Errors by type", ["type"], registry=r)
        self.fallbacks = Counter("offload_fallbacks", "Batches re-run on the sim device after a device fault", ["model"], registry=r)
        self.device_faults = Counter("offload_device_faults", "Device errors and timeouts", ["device", "type"], registry=r)
        self.device_state = Gauge("offload_device_state", "1 for the device's current state", ["device", "state"], registry=r)
        self.queue_depth = Gauge("offload_queue_depth", "Requests waiting in the batch queue", ["model"], registry=r)

    def set_device_state(self, device: str, state: str) -> None:
        for s in DEVICE_STATES:
            self.device_state.labels(device=device, state=s).set(1.0 if s == state else 0.0)

    def fold(self) -> None:
        """Bins what the per-request histograms hold; a running service calls it every
        ``FOLD_EVERY_S`` on its loop, the one thread that observes them."""
        for h in (self.request_duration, self.queue_duration, self.compute_duration, self.batch_size):
            h.fold()

    def render(self) -> bytes:
        return generate_latest(self.registry)
