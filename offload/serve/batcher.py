"""Dynamic batching in the style of Triton's default batcher.

Requests queue; a batch runs when it holds ``max_batch_size`` rows or when the oldest request has
waited ``max_queue_delay``; while the device computes, new requests gather for the next batch. A
full queue rejects at once (:class:`QueueFull`); a request that times out leaves the queue.
Every request gets back exactly its own rows: a batch is a concatenation in queue order and is cut
back at the same offsets.

Waiting without a busy spin. The event loop's timers have whole-millisecond resolution: uvloop's
``call_later`` computes ``round(delay * 1000)`` ms and turns anything under 0.5 ms into
``call_soon`` (uvloop/loop.pyx, ``Loop.call_later``, 0.21-0.23), and asyncio's epoll selector rounds
its timeout up to whole ms. A 100 us wait on such a timer either spins the loop (re-armed timers
that fire at once, what this batcher did before) or sleeps a whole millisecond, 10x the setting.
So the batcher never waits on a timer coarser than the configured delay:

- a delay below one timer tick (``_TIMER_TICK_S``, 1 ms) arms no timer at all. When the device is
  free, the batch is cut as soon as the loop has run once more, so every request the server has
  already read joins it; requests arriving while the device computes gather for the next batch, as
  they do under any delay. An idle device never waits for company it could only get by waiting
  longer than it was told to.
- a delay of one tick or more waits on a timer to the oldest request's deadline; a remainder of
  less than a tick when that timer fires is not re-armed (that would spin), the batch goes.

A lone request leads. With a device that computes on the caller's thread (``run_inline``, the sim
device) and a sub-tick delay, a request that finds the batcher idle and the queue empty does the
batcher's work itself: one pass of the loop (requests already read queue behind it, exactly what
the batcher would have waited for), then it cuts the batch and runs it in its own task. The same
batch as before, without the two hand-offs per batch (wake the batcher's task, wake the request's)
that at one connection cost more than the device call (py-spy). Leftovers beyond the batch size
go to the batcher's task.

A leader alone for long skips its pass, and then its batch is its own rows: they go to the
device at once, with no queue entry, future or hand-off at all (in ``DynamicBatcher.submit``).
The pass is a whole turn of the event loop, a poll system call included; at one connection it
never brings company, and it was the service's one system call per request beyond the floor's
(strace, closed loop at 1 connection: 2 epoll_pwait, 2 write,
1 read and 1 getpid per request, against the floor's 1, 2, 1 and 0; now 1.1, 2, 1, 0). In 6
interleaved runs each way the median server CPU per request went from 120 to 100 us. After
``_LONELY_PASSES`` passes in a row that brought nobody, leaders run their batch at once, except
every ``_PROBE_EVERY``-th, whose pass finds out whether company is back; one that finds it turns
the passes back on. So under load (where passes bring company) nothing changes, and a burst that
arrives while leaders skip costs at most ``_PROBE_EVERY`` batches of one.

Requests' rows are converted per batch. What a request queues is any sequence of rows the
``stack`` function turns, with the rest of its batch, into one array (the default: float64; the
service's JSON rows become FP32 here, in one go: :func:`offload.serve.oip.stack_rows`); a request it refuses
gets its error, and the others their batch. Each request gets back its place in the batch's
shared output (:class:`BatchOut`), where encoders keep what they derive once per batch.

One timer for every request's timeout, armed at the earliest deadline of the requests waiting,
and only re-armed by a request whose deadline comes before it. When it fires, it looks at every
request still waiting (the queue, and a batch on the device), answers those whose deadline has
come, and arms itself for the earliest of the rest. A request thus costs the timer one comparison:
the service gives every request the same timeout, so a later request never has an earlier
deadline, and the timer fires about once per timeout, whatever the load. A ``call_later`` and its
cancel per request cost uvloop ~2 us (a libuv timer started, stopped and closed each time), more
than the rest of the batcher's work for that request; the FIFO of deadlines that replaced those
(with a heap for other timeouts) was still ~60 bytecodes a request at 64 connections (round 18).
A leader needs no timer: it can only run out of time during its one pass, so it checks its
deadline when the pass is over. The price is a scan of the waiting requests (at most
``max_queue_size``) each time the timer fires: once per timeout with one timeout for all, as the
service gives (gRPC deadlines cancel the request's task instead); with many different timeouts,
at most once per timer tick.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from typing import Awaitable, Callable, Sequence

import msgspec
import numpy as np

from offload.serve.errors import QueueFull, RequestTimeout, ShuttingDown
from offload.serve.metrics import ServeMetrics

__all__ = ["DynamicBatcher", "BatchOut", "QueueFull", "RequestTimeout", "ShuttingDown"]

# The coarsest step of the event loop's timers (uvloop and asyncio's epoll selector alike: whole ms).
_TIMER_TICK_S = 1e-3
# Leaders stop taking their pass after this many passes in a row brought no company; every
# _PROBE_EVERY-th leader still takes it, to find out whether company is back (see the module doc).
_LONELY_PASSES = 16
_PROBE_EVERY = 8


class BatchOut(msgspec.Struct, gc=False, eq=False):
    """A batch's output, shared by its requests: ``y`` [rows, n_out] as ``run_batch`` gave it, and ``derived``,
    where the requests' encoder keeps what it computes once per batch (None until one does).
    A msgspec Struct, made by one C call (a class with ``__init__`` was a Python frame a batch,
    so one a lone request). gc=False: an array and the encoder's texts hold no cycle.
    eq=False: equal only to itself, as the plain class was."""

    y: np.ndarray
    derived: object = None


def stack_arrays(xs: list[np.ndarray]) -> tuple[np.ndarray, dict[int, Exception]]:
    """The default ``stack``: arrays of rows, concatenated in order as float64; refuses none."""
    if len(xs) == 1:
        return (xs[0] if xs[0].dtype.char == "d" else xs[0].astype(np.float64)), {}
    return np.concatenate(xs, axis=0, dtype=np.float64), {}


class _Pending(msgspec.Struct, eq=False):
    """One queued request: its rows, their count, its future, when it was queued and how long it
    may wait. A msgspec Struct: made by one C call, where a class with ``__init__`` is a Python
    frame a request (and a dataclass with a default_factory cost ~1 us more, py-spy). Collected
    by the GC as usual: its future's callbacks reach the task that holds it. eq=False: requests
    are equal only to themselves (the queue's ``remove`` compares; rows are arrays)."""

    x: Sequence
    n: int
    future: asyncio.Future
    enqueued: float
    timeout: float


class DynamicBatcher:
    """Queues row batches and runs them, one at a time, through ``run_batch``.

    ``await run_batch(x: [N, F]) -> (y: [N, n_out], device_name)``; it owns threads and
    deadlines (:class:`~offload.serve.faults.FailoverRunner`), so the batcher holds no thread that
    a stuck device could pin. ``stack(list of queued rows) -> ([N, F], {index: error})``
    builds a batch's input (default :func:`stack_arrays`: float64). ``alone(rows)`` builds the
    input of a request the device computes alone, at once (default: ``stack([rows])``, its
    refusal raised); the device call reads it before ``submit`` returns, so it may reuse a buffer
    (:class:`~offload.serve.oip.LoneRows`).

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
        run_inline: Callable[[np.ndarray], tuple[np.ndarray, str]] | None = None,
        stack: Callable[[list], tuple[np.ndarray, dict[int, Exception]]] = stack_arrays,
        alone: Callable[[Sequence], np.ndarray] | None = None,
    ) -> None:
        self._run_batch = run_batch
        self._stack = stack
        # A lone request's rows: stack([x])'s array, or its refusal raised. Only read by the device
        # call made before submit() returns, so it may be a buffer the next lone request reuses.
        self._alone = alone if alone is not None else functools.partial(_stacked_alone, stack)
        # run_batch as a plain call, given only where run_batch never suspends (FailoverRunner.inline).
        self._run_inline = run_inline
        self.max_batch_size = max_batch_size
        self.max_queue_delay_s = max_queue_delay_s
        self.max_queue_size = max_queue_size
        self._metrics = metrics
        self._model = model
        if metrics is not None:  # labelled children resolved once: labels() takes a lock per call
            self._children = (metrics.queue_duration.labels(model=model), metrics.batch_size.labels(model=model))
            # Read when scraped, instead of set after every batch (a lock per set).
            metrics.queue_depth.labels(model=model).set_function(lambda: len(self._queue))
        self._queue: collections.deque[_Pending] = collections.deque()
        # The batch the batcher's task has on the device: waiting too, so the timer looks at it.
        self._running: list[_Pending] = []
        # The one timeout timer (see the module doc) and the deadline it is armed for.
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at = float("inf")
        self._rows = 0
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._idle = False  # the batcher's task is parked on _wakeup with nothing queued
        self._leading = False  # a lone request is gathering and running a batch in its own task
        self._lead_ok = run_inline is not None and max_queue_delay_s < _TIMER_TICK_S
        self._lonely = 0  # leaders' passes in a row that brought no company
        self._skipped = 0  # leaders in a row that went without a pass

    @property
    def depth(self) -> int:
        return len(self._queue)

    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        # The loop, kept: asyncio.get_running_loop() makes a getpid() system call on every call
        # (CPython 3.11's _asynciomodule.c checks for a fork), one per request in infer().
        self._event_loop = asyncio.get_running_loop()
        self._task = self._event_loop.create_task(self._loop(), name="offload-batcher")

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
            if self._expiry is not None:
                self._expiry.cancel()
                self._expiry = None

    async def infer(self, x: np.ndarray, timeout: float) -> np.ndarray:
        """Queues ``x`` ([n, F] floats, n <= max_batch_size) and returns its own output rows; the
        device gets each batch as ``stack`` makes it."""
        r = self.submit(x, timeout)
        out, off, n = r if type(r) is tuple else await r
        return out.y[off : off + n]

    def submit(self, x: Sequence, timeout: float, ready: bool = False) -> tuple[BatchOut, int, int] | Awaitable[tuple[BatchOut, int, int]]:
        """Queues ``x`` (anything ``stack`` takes, ``len(x)`` rows); its answer is the batch's
        shared output and this request's rows in it, ``(out, offset, n)``: the answer itself when
        the request ran at once, alone (a lonely leader on an inline device), else an awaitable of
        it (the request's future, or its leader's pass) for the caller to await directly. Each
        coroutine between a request's task and its future is a frame to enter and leave on every
        resume; at 64 connections the REST hot path's await chain cost 0.35-0.95 us a level (py-spy).

        ``ready``: ``x`` is already what ``alone(x)`` would give, the array the device reads, and
        not a buffer anyone reuses (the service's compiled JSON reader makes a fresh one per
        request): computed alone, it goes to the device as it is, without ``alone``'s call (a
        frame, ~1 us of a lone request in a real server; BENCHMARKS.md, round 20). Queued, it is
        ``stack``'s as any request.

        Await the awaitable at once, before anything else is submitted or awaited: the request
        is queued already, and a leader's pass, which runs its batch, starts only when awaited
        (dropped unawaited, it would leave its request queued with nobody to run it).

        Example::

            r = batcher.submit(rows, timeout=1.0)
            out, off, n = r if type(r) is tuple else await r
        """
        if self._stopping:
            raise ShuttingDown("service is shutting down")
        if len(self._queue) >= self.max_queue_size:
            raise QueueFull(f"queue is full ({self.max_queue_size} requests waiting)")
        lead = self._lead_ok and self._idle and not self._leading and not self._queue
        if lead and self._lonely >= _LONELY_PASSES and self._skipped < _PROBE_EVERY and len(x) <= self.max_batch_size:
            # Alone: its batch is its own rows (the queue is empty and the device idle), so they go
            # straight to the device, with no queue entry, future or hand-off. The same checks,
            # metrics and errors, in the same order, as that batch had on the queue. Written here,
            # not in a method of its own: at one connection every request comes this way, and each
            # frame's code and data are cache lines it brings back (BENCHMARKS.md, round 16).
            self._skipped += 1
            if timeout <= 0:  # its one check of the deadline: it never waits, so only this can fail it
                raise RequestTimeout(f"no answer within {timeout * 1e3:.0f} ms")
            rows = x if ready else self._alone(x)
            if self._metrics is not None:
                qd, bs = self._children
                qd.observe(0.0)  # never queued: no clock read for a wait that cannot be one
                bs.observe(rows.shape[0])
            y, _ = self._run_inline(rows)
            return BatchOut(y), 0, rows.shape[0]
        loop = self._event_loop
        t = time.perf_counter()
        p = _Pending(x, len(x), loop.create_future(), t, timeout)
        self._queue.append(p)
        self._rows += p.n
        if lead:
            return self._lead(loop, p, timeout)
        if not self._leading and (self._rows >= self.max_batch_size or len(self._queue) == 1):
            self._wakeup.set()
        if t + timeout < self._expiry_at:  # rarely: a later request has a later deadline
            self._arm(loop, t + timeout)
        return p.future

    def _arm(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """The timer, (re-)armed for ``deadline``."""
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_at = deadline
        self._expiry = loop.call_later(max(deadline - time.perf_counter(), 0.0), self._expire_due, loop)

    def _expire_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """The timer: every waiting request whose deadline has come gets its timeout, then the
        timer is armed for the earliest of the rest. A deadline less than a timer tick away
        counts as come: the loop's timers fire on whole ticks, so the per-request timers this
        replaces did the same."""
        self._expiry = None
        self._expiry_at = float("inf")
        due = time.perf_counter() + _TIMER_TICK_S
        queue = self._queue
        for p in self._running:  # first: they came before anything queued
            if p.enqueued + p.timeout <= due:
                _time_out(p)
        for p in [p for p in queue if p.enqueued + p.timeout <= due]:
            self._time_out_queued(p)
        nxt = min((p.enqueued + p.timeout for w in (queue, self._running) for p in w if not p.future.done()), default=float("inf"))
        if nxt != float("inf"):
            self._arm(loop, nxt)

    def _time_out_queued(self, p: _Pending) -> None:
        """``p``'s timeout, and out of the queue while it is still there: the device never computes it."""
        try:
            self._queue.remove(p)  # one scan: expired requests are the oldest, near the head
        except ValueError:  # no longer queued: taken meanwhile
            pass
        else:
            self._rows -= p.n
        _time_out(p)

    async def _lead(self, loop: asyncio.AbstractEventLoop, p: _Pending, timeout: float) -> tuple[BatchOut, int, int]:
        """The batcher's work for the batch ``p`` opens, done in ``p``'s own task (see the module)."""
        self._leading = True
        try:
            try:
                self._skipped = 0
                queued = len(self._queue)
                await self._gather()
                self._lonely = 0 if len(self._queue) > queued else self._lonely + 1
            except asyncio.CancelledError:
                if not p.future.done():
                    p.future.cancel()  # _take skips it; the others still get their batch
                raise
            finally:
                # Its only wait is over: past its deadline now, it leaves the queue untouched.
                # (The batcher's task, woken by stop(), may have taken it meanwhile.)
                if time.perf_counter() >= p.enqueued + timeout and not p.future.done():
                    self._time_out_queued(p)
                batch = self._take()
                if batch:
                    self._run_now(batch)
        finally:
            self._leading = False
            if self._queue:  # what did not fit goes to the batcher's task
                self._wakeup.set()
        if not p.future.done() and p.enqueued + timeout < self._expiry_at:  # only a request larger than a batch is left waiting
            self._arm(loop, p.enqueued + timeout)
        return await p.future  # done by now: its batch ran, or it timed out or was cancelled

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        timed = self.max_queue_delay_s >= _TIMER_TICK_S
        while True:
            if not self._queue:
                if self._stopping:
                    return
                self._wakeup.clear()
                self._idle = True
                try:
                    await self._wakeup.wait()
                finally:
                    self._idle = False
                continue
            if timed:
                await self._fill(loop)
            elif self.max_queue_delay_s > 0 and self._rows < self.max_batch_size:
                await self._gather()
            batch = self._take()
            if batch:
                await self._run(loop, batch)

    async def _gather(self) -> None:
        """One more pass of the loop: requests already read (their tasks are scheduled) queue up.
        Only one: a request read during that pass takes its first step after this one resumes
        (the loop runs ready callbacks before it polls), so a rule of "more passes while each
        brings requests" never saw them (tried: requests arriving one per pass each ran alone),
        and more passes regardless would be the busy spin this module avoids."""
        await asyncio.sleep(0)

    async def _fill(self, loop: asyncio.AbstractEventLoop) -> None:
        """Waits until the oldest request's delay is over or the batch is full, on timers of at
        least one tick: a remainder under a tick is not waited for."""
        deadline = self._queue[0].enqueued + self.max_queue_delay_s
        while self._queue and self._rows < self.max_batch_size and not self._stopping:
            left = deadline - time.perf_counter()
            if left < _TIMER_TICK_S:
                return
            # A timer that sets the same event: cheaper than wait_for, which wraps a task per wait.
            self._wakeup.clear()
            timer = loop.call_later(left, self._wakeup.set)
            await self._wakeup.wait()
            timer.cancel()

    def _take(self) -> list[_Pending]:
        queue, limit = self._queue, self.max_batch_size
        if self._rows <= limit:  # all of it: the usual case, one comprehension
            batch = [p for p in queue if not p.future.done()]  # (cancelled while queued)
            queue.clear()
            self._rows = 0
            return batch
        # Locals and one update of _rows at the end (nothing here suspends, so no one sees _rows
        # in between).
        batch: list[_Pending] = []
        rows = popped = 0
        while queue and rows + queue[0].n <= limit:
            p = queue.popleft()
            popped += p.n
            if p.future.done():  # timed out or cancelled while queued
                continue
            batch.append(p)
            rows += p.n
        self._rows -= popped
        return batch

    def _rows_of(self, batch: list[_Pending]) -> tuple[np.ndarray, list[_Pending]]:
        """The batch's rows in queue order (``stack``'s array for the device, made here once per batch)
        and the requests they belong to: any that ``stack`` refused have their error and are out.
        Its queue and size metrics."""
        t_start = time.perf_counter()
        x, refused = self._stack([p.x for p in batch])
        if refused:
            for i, e in refused.items():
                batch[i].future.set_exception(e)
            batch = [p for i, p in enumerate(batch) if i not in refused]
        if self._metrics is not None and batch:  # of the requests that go on to the device
            qd, bs = self._children
            qd.observe_many([t_start - p.enqueued for p in batch])
            bs.observe(x.shape[0])
        return x, batch

    def _run_now(self, batch: list[_Pending]) -> None:
        x, batch = self._rows_of(batch)
        if not batch:
            return
        try:
            y, _ = self._run_inline(x)
        except Exception as e:
            self._fail(batch, e)
            return
        self._deliver(batch, y)

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending]) -> None:
        x, batch = self._rows_of(batch)
        if not batch:
            return
        self._running = batch
        try:
            y, _ = await self._run_batch(x)
            # Let the requests that arrived meanwhile be read and queued before the next batch is
            # cut; otherwise back-to-back inline (sim) batches would each hold a single request.
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            for p in batch:
                p.future.cancel()
            raise
        except Exception as e:
            self._fail(batch, e)
            return
        finally:
            self._running = []
        self._deliver(batch, y)

    @staticmethod
    def _fail(batch: list[_Pending], e: Exception) -> None:
        """Every request of the batch learns what happened to it."""
        for p in batch:
            if not p.future.done():
                p.future.set_exception(e)

    @staticmethod
    def _deliver(batch: list[_Pending], y: np.ndarray) -> None:
        out = BatchOut(y)
        off = 0
        for p in batch:
            if not p.future.done():
                p.future.set_result((out, off, p.n))
            off += p.n


def _stacked_alone(stack: Callable[[list], tuple[np.ndarray, dict[int, Exception]]], x: Sequence) -> np.ndarray:
    rows, refused = stack([x])
    if refused:
        raise refused[0]
    return rows


def _time_out(p: _Pending) -> None:
    if not p.future.done():
        p.future.set_exception(RequestTimeout(f"no answer within {p.timeout * 1e3:.0f} ms"))
