"""A lone request leads: with a device that computes inline (the sim device) and a sub-tick
delay, the request that finds the batcher idle gathers one loop pass of company and runs the
batch in its own task, with no hand-off to the batcher's task. Same batches, same answers, same
failure and timeout rules as the batcher's own path; leftovers go to the batcher's task."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import uvloop

from offload.serve.batcher import DynamicBatcher

TIMEOUT = 30.0
GUARD = 20.0


class Devices:
    """The same stand-in as an inline call and as the batcher task's coroutine; records who ran what."""

    def __init__(self, fail_inline_on: int | None = None) -> None:
        self.inline: list[int] = []
        self.task: list[int] = []
        self.fail_inline_on = fail_inline_on

    def run_inline(self, x: np.ndarray):
        self.inline.append(x.shape[0])
        if self.fail_inline_on == len(self.inline):
            raise RuntimeError("device fault")
        return x[:, :1] * 10.0 + 1.0, "inline"

    async def run_batch(self, x: np.ndarray):
        self.task.append(x.shape[0])
        return x[:, :1] * 10.0 + 1.0, "task"


def _rows(i: int) -> np.ndarray:
    return np.full((1, 3), float(i))


async def _with(dev: Devices, body, *, max_batch: int = 64, delay_s: float = 100e-6):
    b = DynamicBatcher(dev.run_batch, max_batch_size=max_batch, max_queue_delay_s=delay_s, max_queue_size=100, run_inline=dev.run_inline)
    await b.start()
    for _ in range(3):  # the batcher's task parks on its wakeup
        await asyncio.sleep(0)
    try:
        return await asyncio.wait_for(body(b), GUARD)
    finally:
        await b.stop()


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_requests_read_in_one_pass_share_the_leaders_batch(run):
    dev = Devices()

    async def body(b):
        ys = await asyncio.gather(*(b.infer(_rows(i), TIMEOUT) for i in range(5)))
        again = await b.infer(_rows(7), TIMEOUT)  # a later lone request leads again
        return ys, again

    ys, again = run(_with(dev, body))
    assert [y.tolist() for y in ys] == [[[10.0 * i + 1.0]] for i in range(5)]
    assert again.tolist() == [[71.0]]
    assert dev.inline == [5, 1] and dev.task == []


def test_what_does_not_fit_goes_to_the_batchers_task():
    dev = Devices()

    async def body(b):
        return await asyncio.gather(*(b.infer(_rows(i), TIMEOUT) for i in range(10)))

    ys = asyncio.run(_with(dev, body, max_batch=4))
    assert [y.tolist() for y in ys] == [[[10.0 * i + 1.0]] for i in range(10)]
    assert dev.inline == [4] and dev.task == [4, 2]


def test_a_timed_delay_never_leads():
    dev = Devices()

    async def body(b):
        return await asyncio.gather(*(b.infer(_rows(i), TIMEOUT) for i in range(3)))

    asyncio.run(_with(dev, body, delay_s=1e-3))
    assert dev.inline == [] and sum(dev.task) == 3


def test_a_failing_inline_batch_fails_its_own_requests_and_the_next_one_runs():
    dev = Devices(fail_inline_on=1)

    async def body(b):
        first = await asyncio.gather(*(b.infer(_rows(i), TIMEOUT) for i in range(3)), return_exceptions=True)
        return first, await b.infer(_rows(4), TIMEOUT)

    first, after = asyncio.run(_with(dev, body))
    assert all(isinstance(e, RuntimeError) for e in first)
    assert after.tolist() == [[41.0]]
    assert dev.inline == [3, 1]


def test_a_leader_cancelled_during_its_pass_still_runs_the_batch_for_the_others():
    dev = Devices()

    async def body(b):
        tasks = [asyncio.ensure_future(b.infer(_rows(i), TIMEOUT)) for i in range(3)]
        await asyncio.sleep(0)  # every task has queued; the first leads and waits out its pass
        tasks[0].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        return done, b.depth

    (c, y1, y2), depth = asyncio.run(_with(dev, body))
    assert isinstance(c, asyncio.CancelledError)
    assert y1.tolist() == [[11.0]] and y2.tolist() == [[21.0]]
    assert dev.inline == [2] and depth == 0


def test_the_leader_waits_one_pass_not_the_delay(monkeypatch):
    # The clock is held still, so the 999 us delay never ends: only the one-pass rule lets the
    # lone request go (and the next lone request lead again).
    from types import SimpleNamespace

    import offload.serve.batcher as batcher_module

    monkeypatch.setattr(batcher_module, "time", SimpleNamespace(perf_counter=lambda: 0.0))
    dev = Devices()

    async def body(b):
        first = asyncio.ensure_future(b.infer(_rows(0), TIMEOUT))
        for _ in range(4):  # passes with no new request: the lone one goes on its own
            await asyncio.sleep(0)
        return await first, await b.infer(_rows(1), TIMEOUT)

    asyncio.run(_with(dev, body, delay_s=999e-6))
    assert dev.inline == [1, 1]


def test_leaders_alone_for_long_skip_their_pass_and_a_probe_that_finds_company_restores_it():
    from offload.serve.batcher import _LONELY_PASSES, _PROBE_EVERY

    dev = Devices()

    async def body(b):
        for i in range(_LONELY_PASSES):  # lone requests: every pass comes back empty
            await b.infer(_rows(i), TIMEOUT)
        burst = await asyncio.gather(*(b.infer(_rows(i), TIMEOUT) for i in range(3)))  # leaders now skip
        for i in range(_PROBE_EVERY - 3):
            await b.infer(_rows(i), TIMEOUT)
        probed = await asyncio.gather(*(b.infer(_rows(i), TIMEOUT) for i in range(3)))  # the probe's pass
        again = await asyncio.gather(*(b.infer(_rows(i), TIMEOUT) for i in range(3)))  # passes are back
        return burst + probed + again

    ys = asyncio.run(_with(dev, body))
    assert [y.tolist() for y in ys] == [[[10.0 * i + 1.0]] for i in range(3)] * 3
    assert dev.inline == [1] * _LONELY_PASSES + [1, 1, 1] + [1] * (_PROBE_EVERY - 3) + [3, 3]
    assert dev.task == []


def test_submit_answers_a_lone_skipping_leader_at_once_and_gives_the_others_an_awaitable():
    """``submit`` answers without a coroutine of its own: a leader that skips its pass gets its
    answer itself, computed before ``submit`` returns; a leader with its pass, or a request that
    queues behind one, gets an awaitable to await. Both answer what ``infer`` answers."""
    from offload.serve.batcher import _LONELY_PASSES, _PROBE_EVERY, BatchOut

    dev = Devices()

    async def body(b):
        first = b.submit(_rows(7), TIMEOUT)  # the batcher is idle but not yet lonely: a pass
        assert type(first) is not tuple and dev.inline == []
        out, off, n = await first
        for i in range(_LONELY_PASSES):
            await b.infer(_rows(i), TIMEOUT)
        alone = []  # lonely now: leaders skip their pass, computed before submit returns
        while type(r := b.submit(_rows(5), TIMEOUT)) is tuple:
            alone.append(r)
            assert dev.inline[-1] == 1 and len(alone) <= _PROBE_EVERY
        assert alone  # then the probe's pass: r is that leader's, awaited at once (in a task)
        leader = asyncio.ensure_future(r)
        await asyncio.sleep(0)  # the leader is in its pass now; a request that comes meanwhile queues
        queued = b.submit(_rows(2), TIMEOUT)
        assert type(queued) is not tuple
        return (out, off, n), alone[-1], await leader, await queued

    got = asyncio.run(_with(dev, body))
    for (out, off, n), i in zip(got, (7, 5, 5, 2)):
        assert isinstance(out, BatchOut) and n == 1
        assert out.y[off : off + n].tolist() == [[10.0 * i + 1.0]]
    assert dev.inline[-1] == 2  # the leader's pass took the queued request into its batch


def test_submit_refuses_at_once_when_stopping_or_full():
    from offload.serve.errors import QueueFull, ShuttingDown

    dev = Devices()

    async def body(b):
        b.max_queue_size = 1
        leader = asyncio.ensure_future(b.submit(_rows(1), TIMEOUT))
        await asyncio.sleep(0)  # in its pass, it holds the one place in the queue
        with pytest.raises(QueueFull, match="queue is full"):
            b.submit(_rows(2), TIMEOUT)
        await leader
        b._stopping = True
        with pytest.raises(ShuttingDown):
            b.submit(_rows(3), TIMEOUT)
        b._stopping = False

    asyncio.run(_with(dev, body))


def test_a_ready_lone_request_goes_to_the_device_as_it_is_and_a_queued_one_is_stacked():
    """``submit(x, timeout, ready=True)``: alone, ``x`` itself is the device's input, with no
    ``alone`` call; queued, ``stack`` builds its batch as for any request."""
    from offload.serve.batcher import _LONELY_PASSES

    seen: list = []
    built: list = []

    def run_inline(x):
        seen.append(x)
        return x[:, :1] * 10.0 + 1.0, "inline"

    async def run_batch(x):
        seen.append(x)
        return x[:, :1] * 10.0 + 1.0, "task"

    def alone(x):
        built.append(np.array(x, dtype=np.float64))
        return built[-1]

    async def body():
        b = DynamicBatcher(run_batch, max_batch_size=64, max_queue_delay_s=100e-6, max_queue_size=100, run_inline=run_inline, alone=alone)
        await b.start()
        try:
            for i in range(_LONELY_PASSES + 1):
                await b.infer(_rows(i), TIMEOUT)
            x = _rows(4).astype(np.float32)
            r = b.submit(x, TIMEOUT, True)
            assert type(r) is tuple and seen[-1] is x and not built  # alone, as it is
            r = b.submit(_rows(5), TIMEOUT)
            assert type(r) is tuple and len(built) == 1 and seen[-1] is built[0]  # not ready: alone's array
            assert built[0].tolist() == [[5.0, 5.0, 5.0]]
            # queued behind a leader's pass: stacked with its batch, never the array itself
            b._lonely = 0
            leader = asyncio.ensure_future(b.submit(_rows(6), TIMEOUT))
            await asyncio.sleep(0)
            y = _rows(7).astype(np.float32)
            queued = b.submit(y, TIMEOUT, True)
            assert type(queued) is not tuple
            (out, off, n), _ = await queued, await leader
            assert seen[-1] is not y and seen[-1].shape == (2, 3) and out.y[off : off + n].tolist() == [[71.0]]
        finally:
            await b.stop()

    asyncio.run(asyncio.wait_for(body(), GUARD))
