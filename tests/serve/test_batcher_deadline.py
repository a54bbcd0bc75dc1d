"""The batcher's queue delay is counted from the OLDEST waiting request, as Triton's
``max_queue_delay_microseconds`` is: a request that already waited its delay while the device was
busy goes out with the next batch at once, however recently the newest one arrived."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from offload.serve.batcher import DynamicBatcher

DELAY = 2.0  # long against scheduling noise: the two behaviours differ by about this much


def test_a_request_past_its_delay_goes_out_when_the_device_frees_up():
    gate = asyncio.Event()
    starts: list[tuple[float, int]] = []

    async def run_batch(x: np.ndarray):
        starts.append((time.perf_counter(), x.shape[0]))
        if len(starts) == 1:
            await asyncio.wait_for(gate.wait(), 30)
        return x[:, :1] * 2.0, "test"

    async def scenario() -> dict[str, float]:
        b = DynamicBatcher(run_batch, max_batch_size=64, max_queue_delay_s=DELAY, max_queue_size=100)
        await b.start()
        t: dict[str, float] = {}
        full = asyncio.ensure_future(b.infer(np.ones((64, 3)), timeout=30))  # a full batch: runs at once, then blocks
        while not starts:
            await asyncio.sleep(0.01)
        t["a"] = time.perf_counter()
        a = asyncio.ensure_future(b.infer(np.full((1, 3), 1.0), timeout=30))
        await asyncio.sleep(DELAY + 0.2)  # A has now waited longer than its delay
        t["b"] = time.perf_counter()
        bb = asyncio.ensure_future(b.infer(np.full((1, 3), 2.0), timeout=30))
        await asyncio.sleep(0.1)
        t["release"] = time.perf_counter()
        gate.set()
        ya, yb, _ = await asyncio.gather(a, bb, full)
        await b.stop()
        assert ya.tolist() == [[2.0]] and yb.tolist() == [[4.0]]
        return t

    t = asyncio.run(scenario())
    assert len(starts) == 2 and starts[1][1] == 2, starts  # A and B in one batch
    # Counted from A, the batch is due at once when the device frees up; counted from B it would
    # wait until t["b"] + DELAY, a full DELAY after the release.
    assert starts[1][0] < t["b"] + DELAY / 2, (starts[1][0] - t["release"])
