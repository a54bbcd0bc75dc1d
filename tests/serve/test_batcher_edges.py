"""Edges of the dynamic batcher the service suites do not reach: the one loop pass a sub-tick
delay still grants, the deadline kept from the oldest request when a newer one wakes the batcher,
and the timeout's message in the unit it names."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from offload.serve.batcher import DynamicBatcher
from offload.serve.errors import RequestTimeout


def test_a_sub_tick_delay_still_lets_requests_read_in_the_same_loop_pass_join():
    sizes: list[int] = []

    async def run(x):
        sizes.append(len(x))
        return x[:, :1], "test"

    async def go():
        b = DynamicBatcher(run, max_batch_size=8, max_queue_delay_s=0.0, max_queue_size=8)
        await b.start()
        a = asyncio.create_task(b.infer(np.ones((1, 2)), 5))
        await asyncio.sleep(0)  # a enqueues and wakes the batcher, whose step is now due
        c = asyncio.create_task(b.infer(np.ones((1, 2)), 5))  # scheduled after that step
        await asyncio.gather(a, c)
        await b.stop()

    asyncio.run(go())
    assert sizes == [2]  # the documented pass of the loop: the second request joins the first


def test_a_newer_request_does_not_push_back_the_oldest_ones_deadline():
    delay = 0.3
    starts: list[float] = []

    async def run(x):
        starts.append(time.perf_counter())
        return x[:, :1], "test"

    async def go():
        b = DynamicBatcher(run, max_batch_size=8, max_queue_delay_s=delay, max_queue_size=8)
        await b.start()
        t0 = time.perf_counter()
        a = asyncio.create_task(b.infer(np.ones((1, 2)), 10))
        await asyncio.sleep(0.02)
        c = asyncio.create_task(b.infer(np.ones((1, 2)), 10))  # wakes the batcher, batch not full
        await asyncio.gather(a, c)
        await b.stop()
        return t0

    t0 = asyncio.run(go())
    assert len(starts) == 1
    # Due at t0 + delay; anything near a second means the wait was recomputed wrongly.
    assert delay - 2e-3 <= starts[0] - t0 < delay + 0.35, starts[0] - t0


def test_the_timeout_message_says_milliseconds():
    async def never(x):
        await asyncio.Event().wait()

    async def go():
        b = DynamicBatcher(never, max_batch_size=1, max_queue_delay_s=0.0, max_queue_size=4)
        await b.start()
        with pytest.raises(RequestTimeout, match=r"^no answer within 600 ms$"):
            await b.infer(np.ones((1, 2)), 0.6)
        await b.stop(drain_timeout=0.1)

    asyncio.run(go())
