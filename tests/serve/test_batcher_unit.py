"""DynamicBatcher's contracts, one at a time and without wall-clock asserts: batches cut at
max_batch_size in queue order, each request gets its own rows, a full queue rejects, a timed-out
request is never computed, a failing batch fails only its own requests, stop answers or rejects.

The device is a stand-in ``run_batch`` that can be held on an asyncio.Event, so "while the device
is busy" is an exact state, not a sleep. Delays are either 0 (cut at once) or far longer than
any test (a test that had to wait for one would hit its own 20 s guard and fail).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from offload.serve.batcher import DynamicBatcher
from offload.serve.errors import QueueFull, RequestTimeout, ShuttingDown
from offload.serve.metrics import ServeMetrics

LONG = 3600.0  # a queue delay no test may wait out
GUARD = 20.0   # fail rather than hang when a batch never runs


class Device:
    """run_batch stand-in: records each batch, answers 10*x[:, :1] + 1, can be held busy."""

    def __init__(self, hold_first: bool = False, fail_on: int | None = None):
        self.batches: list[np.ndarray] = []
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        if not hold_first:
            self.gate.set()
        self.fail_on = fail_on

    async def __call__(self, x: np.ndarray):
        self.batches.append(x.copy())
        self.started.set()
        if len(self.batches) == 1:
            await self.gate.wait()
        if self.fail_on is not None and len(self.batches) == self.fail_on:
            raise RuntimeError("device fault")
        return x[:, :1] * 10.0 + 1.0, "stand-in"


def rows(first: float, n: int) -> np.ndarray:
    """n rows whose first column is first, first+1, ... (so each request's answer is recognisable)."""
    x = np.zeros((n, 3))
    x[:, 0] = first + np.arange(n)
    return x


def expect(x: np.ndarray) -> list[list[float]]:
    return (x[:, :1] * 10.0 + 1.0).tolist()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, GUARD))


async def _settle():
    for _ in range(5):  # let the batcher's task run to its next wait
        await asyncio.sleep(0)


def test_a_full_batch_runs_without_waiting_and_each_request_gets_its_rows():
    async def go():
        dev = Device()
        b = DynamicBatcher(dev, max_batch_size=5, max_queue_delay_s=LONG, max_queue_size=10)
        await b.start()
        xs = [rows(0, 2), rows(100, 3)]
        ys = await asyncio.gather(*(b.infer(x, timeout=GUARD) for x in xs))
        await b.stop()
        return dev, xs, ys

    dev, xs, ys = run(go())
    assert [y.tolist() for y in ys] == [expect(x) for x in xs]
    assert len(dev.batches) == 1 and np.array_equal(dev.batches[0], np.concatenate(xs))


def test_batches_are_cut_at_max_batch_size_in_queue_order():
    async def go():
        dev = Device(hold_first=True)
        b = DynamicBatcher(dev, max_batch_size=4, max_queue_delay_s=0.0, max_queue_size=10)
        await b.start()
        first = asyncio.ensure_future(b.infer(rows(0, 1), timeout=GUARD))
        await dev.started.wait()  # the device is now busy with the first request
        xs = [rows(10, 2), rows(20, 2), rows(30, 1), rows(40, 4)]
        futs = [asyncio.ensure_future(b.infer(x, timeout=GUARD)) for x in xs]
        await _settle()
        assert b.depth == 4
        dev.gate.set()
        ys = await asyncio.gather(first, *futs)
        await b.stop()
        return dev, xs, ys

    dev, xs, ys = run(go())
    # 2+2 fill a batch exactly; 1 then cannot join 4 (5 > 4), so it goes alone, then the 4.
    assert [len(x) for x in dev.batches] == [1, 4, 1, 4]
    assert np.array_equal(dev.batches[1], np.concatenate(xs[:2]))
    assert [y.tolist() for y in ys[1:]] == [expect(x) for x in xs]


def test_requests_wait_together_for_the_delay_when_the_batch_is_not_full():
    async def go():
        dev = Device()
        b = DynamicBatcher(dev, max_batch_size=64, max_queue_delay_s=0.05, max_queue_size=10)
        await b.start()
        xs = [rows(0, 1), rows(5, 2), rows(9, 1)]
        ys = await asyncio.gather(*(b.infer(x, timeout=GUARD) for x in xs))
        await b.stop()
        return dev, xs, ys

    dev, xs, ys = run(go())
    assert [len(x) for x in dev.batches] == [4]
    assert [y.tolist() for y in ys] == [expect(x) for x in xs]


def test_a_full_queue_rejects_at_once_and_exactly_at_its_size():
    async def go():
        dev = Device(hold_first=True)
        b = DynamicBatcher(dev, max_batch_size=1, max_queue_delay_s=0.0, max_queue_size=3)
        await b.start()
        busy = asyncio.ensure_future(b.infer(rows(0, 1), timeout=GUARD))
        await dev.started.wait()
        queued = [asyncio.ensure_future(b.infer(rows(i, 1), timeout=GUARD)) for i in (1, 2, 3)]
        await _settle()
        assert b.depth == 3
        with pytest.raises(QueueFull, match="3 requests"):
            await b.infer(rows(4, 1), timeout=GUARD)
        dev.gate.set()
        ys = await asyncio.gather(busy, *queued)
        await b.stop()
        return ys

    ys = run(go())
    assert [y.tolist() for y in ys] == [[[1.0]], [[11.0]], [[21.0]], [[31.0]]]


def test_a_request_that_times_out_in_the_queue_is_never_computed():
    async def go():
        dev = Device(hold_first=True)
        b = DynamicBatcher(dev, max_batch_size=4, max_queue_delay_s=0.0, max_queue_size=10)
        await b.start()
        busy = asyncio.ensure_future(b.infer(rows(0, 1), timeout=GUARD))
        await dev.started.wait()
        doomed = asyncio.ensure_future(b.infer(rows(50, 3), timeout=0.01))
        with pytest.raises(RequestTimeout, match="10 ms"):
            await doomed
        assert b.depth == 0
        later = [asyncio.ensure_future(b.infer(rows(60, 2), timeout=GUARD)), asyncio.ensure_future(b.infer(rows(70, 2), timeout=GUARD))]
        await _settle()
        dev.gate.set()
        ys = await asyncio.gather(busy, *later)
        await b.stop()
        return dev, ys

    dev, ys = run(go())
    # The timed-out rows left the queue and its row count: the two later requests fill one batch.
    assert [len(x) for x in dev.batches] == [1, 4]
    assert 50.0 not in np.concatenate(dev.batches)[:, 0]
    assert ys[1].tolist() == [[601.0], [611.0]] and ys[2].tolist() == [[701.0], [711.0]]


def test_a_failing_batch_fails_its_own_requests_and_the_batcher_carries_on():
    async def go():
        dev = Device(fail_on=1)
        b = DynamicBatcher(dev, max_batch_size=2, max_queue_delay_s=LONG, max_queue_size=10)
        await b.start()
        bad = await asyncio.gather(b.infer(rows(0, 1), timeout=GUARD), b.infer(rows(1, 1), timeout=GUARD), return_exceptions=True)
        good = await asyncio.gather(b.infer(rows(2, 1), timeout=GUARD), b.infer(rows(3, 1), timeout=GUARD))
        await b.stop()
        return bad, good

    bad, good = run(go())
    assert all(isinstance(e, RuntimeError) and str(e) == "device fault" for e in bad)
    assert [y.tolist() for y in good] == [[[21.0]], [[31.0]]]


def test_stop_drains_what_is_queued_then_refuses():
    async def go():
        dev = Device()
        b = DynamicBatcher(dev, max_batch_size=8, max_queue_delay_s=LONG, max_queue_size=10)
        await b.start()
        fut = asyncio.ensure_future(b.infer(rows(7, 2), timeout=GUARD))
        await _settle()
        await b.stop()  # stopping cuts the delay short: the queued request is answered
        y = await fut
        with pytest.raises(ShuttingDown):
            await b.infer(rows(0, 1), timeout=GUARD)
        return y

    assert run(go()).tolist() == [[71.0], [81.0]]


def test_stop_rejects_what_it_cannot_drain_in_time():
    async def go():
        dev = Device(hold_first=True)
        b = DynamicBatcher(dev, max_batch_size=1, max_queue_delay_s=0.0, max_queue_size=10)
        await b.start()
        busy = asyncio.ensure_future(b.infer(rows(0, 1), timeout=GUARD))
        await dev.started.wait()
        queued = asyncio.ensure_future(b.infer(rows(1, 1), timeout=GUARD))
        await _settle()
        await b.stop(drain_timeout=0.01)
        assert b.depth == 0
        return await asyncio.gather(busy, queued, return_exceptions=True)

    busy, queued = run(go())
    assert isinstance(busy, asyncio.CancelledError) and isinstance(queued, ShuttingDown)


def test_metrics_see_every_batch_and_request():
    async def go():
        m = ServeMetrics(CollectorRegistry())
        dev = Device()
        b = DynamicBatcher(dev, max_batch_size=3, max_queue_delay_s=LONG, max_queue_size=10, metrics=m, model="m1")
        await b.start()
        t0 = time.perf_counter()
        await asyncio.gather(b.infer(rows(0, 1), timeout=GUARD), b.infer(rows(1, 2), timeout=GUARD))
        window = time.perf_counter() - t0
        await b.stop()
        return m, window

    m, window = run(go())
    samples = {s.name: s.value for metric in m.batch_size.collect() for s in metric.samples if s.labels.get("model") == "m1"}
    assert samples["offload_batch_size_count"] == 1 and samples["offload_batch_size_sum"] == 3
    qd = {s.name: s.value for metric in m.queue_duration.collect() for s in metric.samples if s.labels.get("model") == "m1"}
    assert qd["offload_queue_duration_seconds_count"] == 2
    # Each request waited inside the window the test measured around it (a consistency bound, not a
    # speed claim): the wait is a difference of two clock readings, never a ratio or a sum of them.
    assert 0.0 <= qd["offload_queue_duration_seconds_sum"] <= 2 * window


def test_a_lone_request_waits_for_company_until_its_delay():
    # One 1-row request of 5 columns, max_batch_size 3: the batch is not full (rows, not columns,
    # count), so nothing runs before the delay; a second request joins it; stop() flushes both.
    async def go():
        dev = Device()
        b = DynamicBatcher(dev, max_batch_size=3, max_queue_delay_s=LONG, max_queue_size=10)
        await b.start()
        x1, x2 = np.full((1, 5), 1.0), np.full((1, 5), 2.0)
        f1 = asyncio.ensure_future(b.infer(x1, timeout=GUARD))
        await _settle()
        f2 = asyncio.ensure_future(b.infer(x2, timeout=GUARD))
        await _settle()
        ran_before_stop = len(dev.batches)
        await b.stop()
        return dev, ran_before_stop, await f1, await f2

    dev, ran_before_stop, y1, y2 = run(go())
    assert ran_before_stop == 0
    assert [len(x) for x in dev.batches] == [2]
    assert y1.tolist() == [[11.0]] and y2.tolist() == [[21.0]]


def test_a_batch_that_overshoots_max_rows_runs_at_once_and_is_cut():
    # 3 rows then 2 with max_batch_size 4: together they pass the limit without hitting it exactly;
    # the 3 go at once (no waiting out the delay), the 2 stay for the next batch (5 > 4).
    async def go():
        dev = Device()
        b = DynamicBatcher(dev, max_batch_size=4, max_queue_delay_s=LONG, max_queue_size=10)
        await b.start()
        f1 = asyncio.ensure_future(b.infer(rows(0, 3), timeout=GUARD))
        await _settle()
        f2 = asyncio.ensure_future(b.infer(rows(10, 2), timeout=GUARD))
        y1 = await f1
        await b.stop()
        return dev, y1, await f2

    dev, y1, y2 = run(go())
    assert [len(x) for x in dev.batches] == [3, 2]
    assert y1.tolist() == expect(rows(0, 3)) and y2.tolist() == expect(rows(10, 2))


def test_queued_requests_that_do_not_fit_together_go_in_separate_batches():
    async def go():
        dev = Device(hold_first=True)
        b = DynamicBatcher(dev, max_batch_size=4, max_queue_delay_s=0.0, max_queue_size=10)
        await b.start()
        first = asyncio.ensure_future(b.infer(rows(0, 1), timeout=GUARD))
        await dev.started.wait()
        futs = [asyncio.ensure_future(b.infer(x, timeout=GUARD)) for x in (rows(10, 2), rows(20, 3))]
        await _settle()
        dev.gate.set()
        await asyncio.gather(first, *futs)
        await b.stop()
        return dev

    assert [len(x) for x in run(go()).batches] == [1, 2, 3]


class Refuse(ValueError):
    pass


def _stack_refusing_negatives(xs):
    """A ``stack`` that refuses requests whose first value is negative, as stack_rows refuses
    bad JSON rows: the others still make the batch, in order."""
    refused = {i: Refuse(f"request {i}") for i, x in enumerate(xs) if x[0, 0] < 0}
    kept = [x for i, x in enumerate(xs) if i not in refused]
    return (np.concatenate(kept, axis=0, dtype=np.float64) if kept else np.empty((0, 0))), refused


