"""Request timeouts on one timer per batcher: no timer per request, an earlier deadline still
fires first, a leader that outlived its deadline during its pass is never computed, and the queue
depth is what a scrape reads at that moment."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
import uvloop

import offload.serve.batcher as batcher_module
from offload.serve.batcher import DynamicBatcher
from offload.serve.errors import RequestTimeout
from offload.serve.metrics import ServeMetrics

GUARD = 20.0


class Held:
    """run_batch stand-in whose first batch waits on a gate; records every batch."""

    def __init__(self) -> None:
        self.batches: list[np.ndarray] = []
        self.gate = asyncio.Event()
        self.started = asyncio.Event()

    async def __call__(self, x):
        self.batches.append(x.copy())
        self.started.set()
        if len(self.batches) == 1:
            await self.gate.wait()
        return x[:, :1] + 1.0, "held"


def _row(v: float) -> np.ndarray:
    return np.full((1, 2), v)


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_many_queued_requests_arm_one_timeout_timer(run):
    timeout = 7.0

    async def go():
        loop = asyncio.get_running_loop()
        armed: list[float] = []
        real = loop.call_later

        dev = Held()
        b = DynamicBatcher(dev, max_batch_size=64, max_queue_delay_s=0.0, max_queue_size=100)

        def spy(delay, cb, *args, **kw):
            if cb == b._expire_due:
                armed.append(delay)
            return real(delay, cb, *args, **kw)

        await b.start()
        loop.call_later = spy
        try:
            first = asyncio.ensure_future(b.infer(_row(0), timeout))
            await dev.started.wait()
            rest = [asyncio.ensure_future(b.infer(_row(i), timeout)) for i in range(1, 50)]
            for _ in range(3):
                await asyncio.sleep(0)
            dev.gate.set()
            ys = await asyncio.wait_for(asyncio.gather(first, *rest), GUARD)
        finally:
            del loop.call_later
            await b.stop()
        return armed, ys

    armed, ys = run(go())
    assert [y.tolist() for y in ys] == [[[i + 1.0]] for i in range(50)]
    assert len(armed) == 1, f"{len(armed)} timeout timers for 50 requests"
    assert timeout - 0.5 < armed[0] <= timeout  # at the first request's deadline


def test_an_earlier_deadline_behind_later_ones_still_times_out_and_is_never_computed():
    async def go():
        dev = Held()
        b = DynamicBatcher(dev, max_batch_size=64, max_queue_delay_s=0.0, max_queue_size=100)
        await b.start()
        busy = asyncio.ensure_future(b.infer(_row(0), GUARD))
        await dev.started.wait()
        patient = asyncio.ensure_future(b.infer(_row(1), 3600.0))  # arms the timer an hour out
        hasty = asyncio.ensure_future(b.infer(_row(2), 0.02))
        with pytest.raises(RequestTimeout, match="20 ms"):
            await asyncio.wait_for(hasty, GUARD)
        assert b.depth == 1
        dev.gate.set()
        ys = await asyncio.wait_for(asyncio.gather(busy, patient), GUARD)
        await b.stop()
        return dev, ys

    dev, ys = asyncio.run(go())
    assert [y.tolist() for y in ys] == [[[1.0]], [[2.0]]]
    assert 2.0 not in np.concatenate(dev.batches)[:, 0]


def test_a_leader_past_its_deadline_after_its_pass_times_out_uncomputed(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(batcher_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    computed: list[int] = []

    def run_inline(x):
        computed.append(x.shape[0])
        return x[:, :1] + 1.0, "inline"

    async def run_batch(x):
        return run_inline(x)

    async def go():
        b = DynamicBatcher(run_batch, max_batch_size=64, max_queue_delay_s=100e-6, max_queue_size=10, run_inline=run_inline)
        await b.start()
        for _ in range(3):  # the batcher's task parks: the next lone request leads
            await asyncio.sleep(0)

        async def late_clock():
            clock[0] = 5.0  # runs during the leader's one pass

        leader = asyncio.ensure_future(b.infer(_row(0), 1.0))
        mover = asyncio.ensure_future(late_clock())
        with pytest.raises(RequestTimeout, match="1000 ms"):
            await asyncio.wait_for(leader, GUARD)
        await mover
        after = await asyncio.wait_for(b.infer(_row(3), 1.0), GUARD)  # the batcher carries on
        await b.stop()
        return after, b.depth

    after, depth = asyncio.run(go())
    assert after.tolist() == [[4.0]] and depth == 0
    assert computed == [1]  # only the later request's batch


def test_the_queue_depth_is_read_when_scraped():
    async def go():
        m = ServeMetrics()
        dev = Held()
        b = DynamicBatcher(dev, max_batch_size=1, max_queue_delay_s=0.0, max_queue_size=10, metrics=m, model="m1")
        await b.start()
        futs = [asyncio.ensure_future(b.infer(_row(0), GUARD))]
        await dev.started.wait()
        futs += [asyncio.ensure_future(b.infer(_row(i), GUARD)) for i in (1, 2, 3)]
        for _ in range(3):
            await asyncio.sleep(0)
        held = m.registry.get_sample_value("offload_queue_depth", {"model": "m1"})
        dev.gate.set()
        await asyncio.wait_for(asyncio.gather(*futs), GUARD)
        drained = m.registry.get_sample_value("offload_queue_depth", {"model": "m1"})
        await b.stop()
        return held, drained

    assert asyncio.run(go()) == (3.0, 0.0)


def test_later_deadlines_leave_the_timer_alone_and_an_earlier_one_rearms_it_and_fires_first():
    async def go():
        loop = asyncio.get_running_loop()
        dev = Held()
        b = DynamicBatcher(dev, max_batch_size=64, max_queue_delay_s=0.0, max_queue_size=100)
        arms: list[float] = []
        real = loop.call_later

        def spy(delay, cb, *args, **kw):
            if cb == b._expire_due:
                arms.append(delay)
            return real(delay, cb, *args, **kw)

        await b.start()
        loop.call_later = spy
        try:
            busy = asyncio.ensure_future(b.infer(_row(0), 2.0))  # on the device, held: the timer looks there too
            await dev.started.wait()
            usual = [asyncio.ensure_future(b.infer(_row(i), 2.0)) for i in (1, 2)]
            hasty = asyncio.ensure_future(b.infer(_row(3), 0.02))
            order: list[str] = []
            for f, name in ((busy, "busy"), (usual[0], "u1"), (usual[1], "u2"), (hasty, "hasty")):
                f.add_done_callback(lambda _, n=name: order.append(n))
            with pytest.raises(RequestTimeout, match="20 ms"):
                await asyncio.wait_for(hasty, GUARD)
            depth_after_hasty = b.depth
            arms_after_hasty = list(arms)
            for f in [busy, *usual]:  # each at its own deadline
                with pytest.raises(RequestTimeout, match="2000 ms"):
                    await asyncio.wait_for(f, GUARD)
            depth = b.depth
        finally:
            del loop.call_later
        dev.gate.set()
        await b.stop()
        return order, depth_after_hasty, depth, arms_after_hasty, arms, dev

    order, depth_after_hasty, depth, arms_after_hasty, arms, dev = asyncio.run(go())
    assert order == ["hasty", "busy", "u1", "u2"]
    assert (depth_after_hasty, depth) == (2, 0)
    # Armed by busy (u1 and u2 come later: untouched), re-armed by hasty, then for busy's remainder.
    assert len(arms_after_hasty) == 3 and 1.9 < arms_after_hasty[0] <= 2.0 and 0.0 < arms_after_hasty[1] <= 0.02 and 1.9 < arms_after_hasty[2] < 2.0
    assert len(arms) <= 5  # then at most once more for each of u1 and u2 (not within a tick of busy's)
    assert [r[0] for r in np.concatenate(dev.batches)[:, :1]] == [0.0]  # the timed-out ones never ran


def test_a_leader_that_skips_its_pass_runs_its_rows_alone_without_a_future(monkeypatch):
    from offload.serve.batcher import _LONELY_PASSES
    from offload.serve.errors import InvalidRequest

    m = ServeMetrics()
    ran: list[int] = []

    def run_inline(x):
        ran.append(x.shape[0])
        if x[0, 0] < 0:
            raise RuntimeError("device fault")
        return x[:, :1] + 1.0, "inline"

    async def run_batch(x):
        return run_inline(x)

    def stack(xs):  # refuses rows starting with 99 (as stack_rows refuses bad JSON rows)
        if xs[0][0][0] == 99:
            return np.empty((0, 2)), {0: InvalidRequest("bad row")}
        return np.concatenate(xs, axis=0, dtype=np.float64), {}

    async def go():
        b = DynamicBatcher(run_batch, max_batch_size=8, max_queue_delay_s=100e-6, max_queue_size=10, run_inline=run_inline, stack=stack, metrics=m, model="m")
        await b.start()
        for _ in range(3):
            await asyncio.sleep(0)
        for i in range(_LONELY_PASSES):  # every pass comes back empty: leaders start to skip
            await b.infer(_row(i), GUARD)
        loop = asyncio.get_running_loop()
        made = []
        real = loop.create_future
        loop.create_future = lambda: made.append(1) or real()
        try:
            y = await b.infer(np.full((2, 2), 5.0), GUARD)
            with pytest.raises(InvalidRequest, match="bad row"):
                await b.infer(_row(99), GUARD)
            with pytest.raises(RuntimeError, match="device fault"):
                await b.infer(_row(-1), GUARD)
            with pytest.raises(RequestTimeout):
                await b.infer(_row(1), 0.0)
        finally:
            del loop.create_future
        await b.stop()
        return y, made, b.depth

    y, made, depth = asyncio.run(go())
    assert y.tolist() == [[6.0], [6.0]] and made == [] and depth == 0
    assert ran == [1] * _LONELY_PASSES + [2, 1]  # the refused and the timed-out rows never ran
    rows = m.registry.get_sample_value("offload_batch_size_sum", {"model": "m"})
    waits = m.registry.get_sample_value("offload_queue_duration_seconds_count", {"model": "m"})
    assert rows == _LONELY_PASSES + 3 and waits == _LONELY_PASSES + 2


@pytest.mark.parametrize("seed", range(3))
def test_random_timeouts_cancels_and_slow_batches_leave_every_request_answered_once_and_the_batcher_clean(seed):
    # The one timer against the cases it must keep apart: deadlines out of arrival order, requests
    # cancelled while queued, batches still on the device when their requests' deadlines come.
    # Every request ends exactly one way, none before its deadline's tick; none that a run of the
    # timer found past its deadline reaches the device later; after every run the timer is armed,
    # no later than the earliest deadline, exactly while something waits; the queue's row count
    # ends at 0. (Times are the loop's own: a stalled machine moves them all together.)
    rng = np.random.default_rng(seed)
    tick = batcher_module._TIMER_TICK_S
    computed: dict[int, float] = {}

    async def run_batch(x):
        now = asyncio.get_running_loop().time()
        computed.update((int(v), now) for v in x[:, 0])
        await asyncio.sleep(float(rng.choice([0.0, 0.005, 0.03])))
        return x[:, :1] + 1.0, "slow"

    async def go():
        loop = asyncio.get_running_loop()
        b = DynamicBatcher(run_batch, max_batch_size=8, max_queue_delay_s=0.0, max_queue_size=1000)
        real_expire = b._expire_due

        def expire_due(loop_):  # the timer's callback, as _arm finds it on the instance
            runs.append(loop.time())
            real_expire(loop_)
            waiting = [p.enqueued + p.timeout for w in (b._queue, b._running) for p in w if not p.future.done()]
            armed_ok.append((b._expiry is not None) == bool(waiting) and (not waiting or b._expiry_at <= min(waiting)))

        runs: list[float] = []
        armed_ok: list[bool] = []
        b._expire_due = expire_due
        await b.start()
        reqs = []
        start: dict[int, float] = {}
        done_at: dict[int, float] = {}

        async def timed(i, timeout):
            start[i] = loop.time()  # in the step that queues it: a stalled loop starts it late
            return await b.infer(_row(float(i)), timeout)

        for i in range(120):
            timeout = float(rng.choice([0.01, 0.02, 0.05, 0.2]))
            fut = asyncio.ensure_future(timed(i, timeout))
            fut.add_done_callback(lambda _, i=i: done_at.__setitem__(i, loop.time()))
            reqs.append((i, timeout, fut))
            if rng.random() < 0.1:
                loop.call_later(float(rng.choice([0.0, 0.002])), fut.cancel)
            if rng.random() < 0.3:
                await asyncio.sleep(float(rng.choice([0.0, 0.001, 0.004])))
        ends = []
        for i, timeout, fut in reqs:
            try:
                y = await asyncio.wait_for(asyncio.shield(fut), GUARD)
                ends.append(("ok", i, y.tolist()))
            except RequestTimeout:
                ends.append(("timeout", i, done_at[i] - start[i] >= timeout - 2 * tick))
            except asyncio.CancelledError:
                ends.append(("cancelled", i, None))
        await asyncio.sleep(0.25)  # past every deadline: the timer finds nothing and stays off
        state = (b.depth, b._rows, b._expiry, b._running)
        await b.stop()
        deadlines = {i: start[i] + timeout for i, timeout, _ in reqs if i in start}  # (one cancelled before its start has none)
        return ends, state, deadlines, runs, armed_ok

    ends, (depth, rows, expiry, running), deadlines, runs, armed_ok = asyncio.run(go())
    assert len(ends) == 120
    kinds = {k for k, _, _ in ends}
    assert "ok" in kinds and "timeout" in kinds  # the mix exercised both ends
    for kind, i, v in ends:
        if kind == "ok":
            assert v == [[i + 1.0]]
        elif kind == "timeout":
            assert v, f"request {i} timed out before its deadline"
    assert (depth, rows, expiry, running) == (0, 0, None, [])
    answered = {i for kind, i, _ in ends if kind == "ok"}
    assert answered <= set(computed)  # every answer was computed
    late = {i for i, c in computed.items() if any(deadlines[i] <= r - 1e-4 and r <= c for r in runs)}
    assert not late, f"found past their deadlines by the timer, then computed: {sorted(late)}"
    assert len(computed) < 120  # some timed out in the queue, never computed
    assert len(runs) > 1 and all(armed_ok)
