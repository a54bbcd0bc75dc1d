"""The batcher under random timeouts, cancellations and slow batches: every request ends exactly
one way (its own rows, a timeout no earlier than its deadline, or its cancellation), and the
batcher ends clean. Times are the loop's own: a stalled machine moves them all together."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from offload.serve.batcher import DynamicBatcher
from offload.serve.errors import RequestTimeout

GUARD = 20.0
TICK = 1e-3  # the loop's timer resolution: a timeout may fire up to a tick early by the clock read here


def _row(v: float) -> np.ndarray:
    return np.full((1, 3), v, dtype=np.float32)


@pytest.mark.parametrize("seed", range(3))
def test_random_timeouts_cancels_and_slow_batches_leave_every_request_answered_once(seed):
    rng = np.random.default_rng(seed)
    computed: set[int] = set()

    async def run_batch(x):
        computed.update(int(v) for v in x[:, 0])
        await asyncio.sleep(float(rng.choice([0.0, 0.005, 0.03])))
        return x[:, :1] + 1.0, "slow"

    async def go():
        loop = asyncio.get_running_loop()
        b = DynamicBatcher(run_batch, max_batch_size=8, max_queue_delay_s=0.0, max_queue_size=1000)
        await b.start()
        reqs, start, done_at = [], {}, {}

        async def timed(i, timeout):
            start[i] = loop.time()
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
                ends.append(("timeout", i, done_at[i] - start[i] >= timeout - 2 * TICK))
            except asyncio.CancelledError:
                ends.append(("cancelled", i, None))
        await asyncio.sleep(0.25)
        depth = b.depth
        await b.stop()
        return ends, depth

    ends, depth = asyncio.run(go())
    assert len(ends) == 120 and len({i for _, i, _ in ends}) == 120
    kinds = {k for k, _, _ in ends}
    assert "ok" in kinds and "timeout" in kinds  # the mix exercised both ends
    for kind, i, v in ends:
        if kind == "ok":
            assert v == [[i + 1.0]], i
        elif kind == "timeout":
            assert v, f"request {i} timed out before its deadline"
    answered = {i for kind, i, _ in ends if kind == "ok"}
    assert answered <= computed  # every answer was computed
    assert len(computed) < 120  # some timed out or were cancelled in the queue, never computed
    assert depth == 0
