"""Dynamic batching in the style of Triton's default batcher.

Requests queue; a batch runs when it holds ``max_batch_size`` rows or when the oldest request has
waited ``max_queue_delay``; while the device computes, new requests gather for the next batch. A
full queue refuses at once (:class:`QueueFull`); a request that times out or is cancelled leaves
the queue and never reaches the device. Every request gets back exactly its own rows: a batch is a
concatenation in queue order, cut back at the same offsets.

The event loop's timers have whole-millisecond resolution (uvloop's ``call_later`` rounds to ms;
asyncio's epoll selector rounds its timeout up), so a delay under one tick arms no timer: the batch
is cut after one pass of the loop, which lets every request the server has already read join it.
A device that answers in microseconds is then never held behind a millisecond window.

Example::

    b = DynamicBatcher(runner.run, max_batch_size=64, max_queue_delay_s=100e-6, max_queue_size=1024)
    await b.start()
    y = await b.infer(x, timeout=1.0)        # x float32 [n, F] -> its own rows [n, n_out]
    await b.stop()
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import numpy as np

from offload.serve.errors import QueueFull, RequestTimeout, ShuttingDown
from offload.serve.metrics import ServeMetrics

__all__ = ["DynamicBatcher", "QueueFull", "RequestTimeout", "ShuttingDown"]

_TIMER_TICK_S = 1e-3


@dataclass(eq=False)
class _Pending:
    x: np.ndarray
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


class DynamicBatcher:
    """Queues row batches and runs them, one at a time, through ``run_batch``.

    ``await run_batch(x [N, F]) -> (y [N, n_out], device_name)``; the runner owns threads and
    deadlines (:class:`~offload.serve.faults.FailoverRunner`), so no thread here can be pinned by
    a stuck device.
    """

    def __init__(
        self,
        run_batch: Callable[[np.ndarray], Awaitable[tuple[np.ndarray, str]]],
        *,
        max_batch_size: int,
        max_queue_delay_s: float,
        max_queue_size: int,
        metrics: ServeMetrics | None = None,
        model: str = "model",
    ) -> None:
        self._run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.max_queue_delay_s = max_queue_delay_s
        self.max_queue_size = max_queue_size
        self._queue: collections.deque[_Pending] = collections.deque()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._metrics = None
        if metrics is not None:
            self._metrics = (metrics.queue_duration.labels(model=model), metrics.batch_size.labels(model=model))
            metrics.queue_depth.labels(model=model).set_function(lambda: len(self._queue))

    @property
    def depth(self) -> int:
        """Requests waiting for a batch."""
        return len(self._queue)

    async def start(self) -> None:
        self._wakeup = asyncio.Event()  # bound to the running loop
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="offload-batcher")

    async def stop(self, drain_timeout: float = 10.0) -> None:
        """Takes no new requests, answers those queued (within ``drain_timeout``), then ends."""
        self._stopping = True
        self._wakeup.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), drain_timeout)
            except asyncio.TimeoutError:
                self._task.cancel()
        for p in self._queue:
            if not p.future.done():
                p.future.set_exception(ShuttingDown("service is shutting down"))
        self._queue.clear()

    async def infer(self, x: np.ndarray, timeout: float) -> np.ndarray:
        """Queues ``x`` ([n, F] float32, n <= max_batch_size) and returns its own output rows."""
        if self._stopping:
            raise ShuttingDown("service is shutting down")
        if len(self._queue) >= self.max_queue_size:
            raise QueueFull(f"queue is full ({self.max_queue_size} requests waiting)")
        p = _Pending(x, asyncio.get_running_loop().create_future())
        self._queue.append(p)
        self._wakeup.set()
        try:
            async with asyncio.timeout(timeout):  # one timer handle; wait_for wraps the wait in more
                return await p.future
        except TimeoutError:
            raise RequestTimeout(f"no answer within {timeout * 1e3:.0f} ms") from None
        finally:
            if not p.future.done() or p.future.cancelled():  # timed out or cancelled: it leaves the queue
                try:
                    self._queue.remove(p)
                except ValueError:  # already taken for a batch, which skips it
                    pass

    async def _loop(self) -> None:
        while True:
            if not self._queue:
                if self._stopping:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await self._gather()
            batch = self._take()
            if batch:
                await self._run(batch)

    async def _gather(self) -> None:
        """Waits for company: up to the oldest request's deadline, or one pass of the loop."""
        wait = self.max_queue_delay_s - (time.perf_counter() - self._queue[0].enqueued)
        if wait < _TIMER_TICK_S or self._stopping:
            await asyncio.sleep(0)
            return
        while self._rows() < self.max_batch_size and wait >= _TIMER_TICK_S:
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), wait)
            except asyncio.TimeoutError:
                return
            if not self._queue or self._stopping:
                return
            wait = self.max_queue_delay_s - (time.perf_counter() - self._queue[0].enqueued)

    def _rows(self) -> int:
        return sum(len(p.x) for p in self._queue if not p.future.done())

    def _take(self) -> list[_Pending]:
        """Whole requests from the head of the queue, up to ``max_batch_size`` rows; requests that
        timed out or were cancelled while queued are dropped here."""
        batch: list[_Pending] = []
        rows = 0
        q = self._queue
        while q:
            p = q[0]
            if p.future.done():
                q.popleft()
                continue
            if batch and rows + len(p.x) > self.max_batch_size:
                break
            q.popleft()
            batch.append(p)
            rows += len(p.x)
        return batch

    async def _run(self, batch: list[_Pending]) -> None:
        now = time.perf_counter()
        x = batch[0].x if len(batch) == 1 else np.concatenate([p.x for p in batch], axis=0)
        if self._metrics is not None:
            queued, sizes = self._metrics
            for p in batch:
                queued.observe(now - p.enqueued)
            sizes.observe(len(x))
        try:
            y, _ = await self._run_batch(x)
        except asyncio.CancelledError:  # stop() gave up on the batch: so do its requests
            for p in batch:
                p.future.cancel()
            raise
        except Exception as e:  # the runner's typed refusal goes to every request of the batch
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(e)
            return
        off = 0
        for p in batch:
            n = len(p.x)
            if not p.future.done():  # timed out while on the device: its rows are dropped
                p.future.set_result(y[off : off + n])
            off += n
