"""Dynamic batching in the style of Triton's default batcher.

Requests queue; a batch runs when it holds ``max_batch_size`` rows or when the oldest request has
waited ``max_queue_delay``; while the device computes, new requests gather for the next batch. A
full queue rejects at once (:class:`QueueFull`); a request that times out leaves the queue.
Every request gets back exactly its own rows: a batch is a concatenation in queue order and is cut
back at the same offsets.
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


@dataclass(eq=False)
class _Pending:
    x: np.ndarray
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)
    taken: bool = False


class DynamicBatcher:
    """Queues row batches and runs them, one at a time, through ``run_batch``.

    ``await run_batch(x: float64 [N, F]) -> (y: [N, n_out], device_name)``; it owns threads and
    deadlines (:class:`~offload.serve.faults.FailoverRunner`), so the batcher holds no thread that
    a stuck device could pin.

    Example::

        b = DynamicBatcher(runner.run, max_batch_size=64, max_queue_delay_s=100e-6, max_queue_size=1024)
        await b.start()
        y = await b.infer(x, timeout=1.0)
        await b.stop()
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
        self._metrics = metrics
        self._model = model
        if metrics is not None:  # labelled children resolved once: labels() takes a lock per call
            self._children = (metrics.queue_duration.labels(model=model), metrics.batch_size.labels(model=model), metrics.queue_depth.labels(model=model))
        self._queue: collections.deque[_Pending] = collections.deque()
        self._rows = 0
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False

    @property
    def depth(self) -> int:
        return len(self._queue)

    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="offload-batcher")

    async def stop(self, drain_timeout: float = 10.0) -> None:
        """Stops taking requests, answers those already queued (up to ``drain_timeout``), then ends."""
        self._stopping = True
        if self._wakeup is not None:
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
        """Queues ``x`` (float64 [n, F], n <= max_batch_size) and returns its own output rows."""
        if self._stopping:
            raise ShuttingDown("service is shutting down")
        if len(self._queue) >= self.max_queue_size:
            raise QueueFull(f"queue is full ({self.max_queue_size} requests waiting)")
        loop = asyncio.get_running_loop()
        p = _Pending(x, loop.create_future())
        self._queue.append(p)
        self._rows += x.shape[0]
        if self._rows >= self.max_batch_size or len(self._queue) == 1:
            self._wakeup.set()
        # A timer on the future itself: cheaper than asyncio.wait_for, which adds a waiter per call.
        timer = loop.call_later(timeout, self._expire, p, timeout)
        try:
            return await p.future
        finally:
            timer.cancel()

    def _expire(self, p: _Pending, timeout: float) -> None:
        if p.future.done():
            return
        if not p.taken:  # still queued: take it out so the device never computes it
            self._queue.remove(p)
            self._rows -= p.x.shape[0]
        p.future.set_exception(RequestTimeout(f"no answer within {timeout * 1e3:.0f} ms"))

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                if self._stopping:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            deadline = self._queue[0].enqueued + self.max_queue_delay_s
            while self._queue and self._rows < self.max_batch_size and not self._stopping:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                # A timer that sets the same event: cheaper than wait_for, which wraps a task per wait.
                self._wakeup.clear()
                timer = loop.call_later(left, self._wakeup.set)
                await self._wakeup.wait()
                timer.cancel()
            batch = self._take()
            if batch:
                await self._run(loop, batch)

    def _take(self) -> list[_Pending]:
        batch: list[_Pending] = []
        rows = 0
        while self._queue and rows + self._queue[0].x.shape[0] <= self.max_batch_size:
            p = self._queue.popleft()
            self._rows -= p.x.shape[0]
            if p.future.done():  # timed out or cancelled while queued
                continue
            p.taken = True
            batch.append(p)
            rows += p.x.shape[0]
        return batch

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending]) -> None:
        t_start = time.perf_counter()
        if self._metrics is not None:
            qd, bs, depth = self._children
            for p in batch:
                qd.observe(t_start - p.enqueued)
        x = batch[0].x if len(batch) == 1 else np.concatenate([p.x for p in batch], axis=0)
        if self._metrics is not None:
            bs.observe(x.shape[0])
            depth.set(len(self._queue))
        try:
            y, _ = await self._run_batch(x)
            # Let the requests that arrived meanwhile be read and queued before the next batch is
            # cut; otherwise back-to-back inline (sim) batches would each hold a single request.
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            for p in batch:
                p.future.cancel()
            raise
        except Exception as e:  # every request of the batch learns what happened to it
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(e)
            return
        off = 0
        for p in batch:
            n = p.x.shape[0]
            if not p.future.done():
                p.future.set_result(y[off : off + n])
            off += n
