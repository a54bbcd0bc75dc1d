"""The batcher waits on no timer finer than the event loop can keep: uvloop turns a call_later
under 0.5 ms into call_soon, so a sub-tick wait re-armed until its deadline is a busy spin (and on
asyncio's epoll loop a whole millisecond, 10x a 100 us delay)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import uvloop

from offload.serve.batcher import DynamicBatcher

REQUEST_TIMEOUT = 30.0
TICK_S = 1e-3  # uvloop's timers count whole ms (loop.pyx: round(delay * 1000))


async def _score(delay_s: float, n_requests: int) -> tuple[list[float], list[int]]:
    """Scores ``n_requests`` single rows sent in one loop pass; returns the delays of every timer
    armed meanwhile other than the requests' own timeouts, and the batch sizes the device saw."""
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    real = loop.call_later

    def spy(delay, cb, *args, **kw):
        if cb != b._expire_due:  # the requests' timeout timer
            armed.append(delay)
        return real(delay, cb, *args, **kw)

    sizes: list[int] = []

    async def run_batch(x):
        sizes.append(x.shape[0])
        return x[:, :1] + 1.0, "test"

    b = DynamicBatcher(run_batch, max_batch_size=64, max_queue_delay_s=delay_s, max_queue_size=100)
    loop.call_later = spy
    await b.start()
    try:
        ys = await asyncio.gather(*(b.infer(np.full((1, 2), float(i)), timeout=REQUEST_TIMEOUT) for i in range(n_requests)))
    finally:
        del loop.call_later  # before stop(): its drain timeout is no batching timer
        await b.stop()
    assert [y.tolist() for y in ys] == [[[i + 1.0]] for i in range(n_requests)]
    return armed, sizes


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
@pytest.mark.parametrize("delay_us", [1, 100, 999])
def test_a_sub_tick_delay_arms_no_timer_and_batches_what_was_read(run, delay_us):
    armed, sizes = run(_score(delay_us * 1e-6, 5))
    assert armed == [], f"timers armed for a {delay_us} us delay: {armed[:10]}"
    assert sizes == [5]  # sent in one pass, scored in one batch


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_a_delay_of_ticks_never_rearms_a_sub_tick_remainder(run):
    armed, sizes = run(_score(5e-3, 1))
    assert armed and all(d >= TICK_S for d in armed), armed
    assert sizes == [1]
