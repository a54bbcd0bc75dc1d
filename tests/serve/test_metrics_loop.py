"""The service's lock-free per-request series scrape exactly as prometheus_client's own would:
same sample names, labels, bucket bounds (``le`` equal to a bound counts in it), counts and sums."""

from __future__ import annotations

import re

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from offload.serve.metrics import _BATCH_BUCKETS, _FOLD_AT, _LATENCY_BUCKETS, FOLD_EVERY_S, LoopCounter, LoopHistogram, ServeMetrics


def _without_created(text: bytes) -> str:
    # _created holds each child's creation time, which differs between any two registries.
    return re.sub(r"^\w+_created\{.*$", "", text.decode(), flags=re.M)


@pytest.mark.parametrize("buckets", [_LATENCY_BUCKETS, _BATCH_BUCKETS])
def test_histogram_and_counter_scrape_like_prometheus_client(buckets):
    ref, ours = CollectorRegistry(), CollectorRegistry()
    h_ref = Histogram("h_seconds", "doc", ["model", "device"], buckets=buckets, registry=ref)
    h = LoopHistogram("h_seconds", "doc", ["model", "device"], buckets=buckets, registry=ours)
    c_ref = Counter("c", "doc", ["code"], registry=ref)
    c = LoopCounter("c", "doc", ["code"], registry=ours)
    values = [0.0, *buckets, *(b * 1.5 for b in buckets), 1e9, 3e-7]
    for i, v in enumerate(values):
        dev = "sim" if i % 3 else "emu"
        h_ref.labels(model="m", device=dev).observe(v)
        h.labels(model="m", device=dev).observe(v)
        c_ref.labels(code=200 + i % 2).inc(i)
        c.labels(code=200 + i % 2).inc(i)
    assert _without_created(generate_latest(ours)) == _without_created(generate_latest(ref))
    assert ours.get_sample_value("h_seconds_created", {"model": "m", "device": "sim"}) is not None
    assert ours.get_sample_value("c_created", {"code": "200"}) is not None


def test_bulk_binning_across_folds_and_scrapes_matches_prometheus_client():
    # More observations than one fold holds, single and batched, with scrapes in between: every
    # scrape shows what observing one at a time shows, sums added in arrival order included.
    rng = np.random.default_rng(7)
    ref, ours = CollectorRegistry(), CollectorRegistry()
    h_ref = Histogram("q_seconds", "doc", ["model"], buckets=_LATENCY_BUCKETS, registry=ref)
    h = LoopHistogram("q_seconds", "doc", ["model"], buckets=_LATENCY_BUCKETS, registry=ours)
    ties = [float(b) for b in _LATENCY_BUCKETS]
    values = [*(rng.lognormal(-8, 2, size=2 * _FOLD_AT + 123)).tolist(), *ties * 50]
    rng.shuffle(values)
    child = h.labels(model="m")
    assert type(child.observe) is type([].append)  # the list's C method: no Python frame an observation
    i = 0
    for step in (1, 7, _FOLD_AT - 1, 3, _FOLD_AT + 5, 1, len(values)):
        chunk = values[i : i + step]
        i += len(chunk)
        for v in chunk:
            h_ref.labels(model="m").observe(v)
        if len(chunk) == 1:
            child.observe(chunk[0])
        else:
            child.observe_many(chunk)
        assert _without_created(generate_latest(ours)) == _without_created(generate_latest(ref))
    assert i == len(values)


def test_wrong_labels_and_negative_increments_are_refused():
    m = ServeMetrics()
    with pytest.raises(ValueError, match="model"):
        m.request_duration.labels(modle="x")
    with pytest.raises(ValueError, match="up"):
        m.requests.labels(model="x", code="200").inc(-1)


def test_a_started_service_bins_its_histograms_on_a_timer_until_it_stops():
    # Observations are plain appends: only the service's timer bounds what a series holds between scrapes.
    import asyncio

    import _serve_standin as standin
    from offload.host.bundle import load
    from offload.serve.app import ScoringService
    from offload.serve.config import ServeConfig

    svc = ScoringService(load(standin.risk_bundle_path()), ServeConfig(device="sim"))
    child = svc.metrics.request_duration.labels(model="risk")
    batches = svc.metrics.batch_size.labels(model="risk")

    async def go() -> None:
        async with svc._lifespan(svc.app):
            for _ in range(50):
                child.observe(1e-4)
            batches.observe(3)
            assert len(child._vals) == 50  # held until a fold
            await asyncio.sleep(FOLD_EVERY_S * 3)
            assert child._vals == [] and batches._vals == []
            assert sum(child.counts) == 50 and child.counts[1] == 50 and child.sum == pytest.approx(50e-4, rel=1e-12)
            assert sum(batches.counts) == 1 and batches.sum == 3
            child.observe(1e-4)
        assert svc._folder is None
        await asyncio.sleep(FOLD_EVERY_S * 3)
        assert len(child._vals) == 1  # stopped: nothing folds it until a scrape

    asyncio.run(go())
    assert svc.metrics.registry.get_sample_value("offload_request_duration_seconds_count", {"model": "risk"}) == 51
