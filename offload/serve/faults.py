"""Device fault handling: fail a batch over to the sim device (or to 503) and reopen in the background.

The sim device computes the kernel's bit-exact reference, the same numbers the card returns, so a
fail-over changes latency but never a score.

A device call is never trusted to end: card calls run on a daemon thread of their own (a "lane")
and the service waits for them with its own deadline. A call past that deadline is abandoned with
its thread and its device handle; nothing ever waits for it again (not the reopen, not shutdown),
because a blocking C call such as XRT's ``bo.sync`` cannot be interrupted.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable

import numpy as np

from offload.host import Device, DeviceError, KernelHandle, open_device
from offload.kernels import Kernel
from offload.serve.errors import BadDeviceOutput, DeviceAbandoned, DeviceOutputError, DeviceUnavailable
from offload.serve.metrics import ServeMetrics
from offload.serve.types import as_fp32

__all__ = ["FailoverRunner", "DeviceUnavailable", "deadline_for"]

_log = logging.getLogger("offload.serve")

# How long a close of a failed device may take at shutdown before it is abandoned too.
_CLOSE_WAIT_S = 2.0


def deadline_for(timeout_s: float) -> float:
    """The service's own deadline for a device call given ``timeout_s``: the device's timeout gets
    the first word, the margin covers the device reporting it (a DeviceTimeout beats abandonment)."""
    return timeout_s * 1.1 + 0.05


class _Lane:
    """One daemon thread running one device's calls in order. Never joined: if a call sticks, the
    lane is abandoned with it (a daemon thread does not hold up interpreter exit, unlike the
    workers of ``concurrent.futures.ThreadPoolExecutor``, which exit joins)."""

    def __init__(self, name: str) -> None:
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._work, name=name, daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        f: Future = Future()
        self._q.put((f, fn, args))
        return f

    def retire(self) -> None:
        self._q.put(None)  # ends the thread once its current call (if any) returns

    def _work(self) -> None:
        while (item := self._q.get()) is not None:
            f, fn, args = item
            if not f.set_running_or_notify_cancel():
                continue
            try:
                f.set_result(fn(*args))
            except BaseException as e:  # handed to the waiter, which decides what it means
                f.set_exception(e)


class FailoverRunner:
    """Runs batches of one kernel on a primary device with a sim fall-back.

    ``await run(x)`` scores a batch; its outputs are FP32 (float32 [B, n_out], C order), the
    service's wire type, whichever device computed them (:func:`~offload.serve.types.as_fp32`; the
    reopen probe compares a device's own outputs, before it). Any failure of the primary is a device fault: an exception of
    any kind (a binding's ``RuntimeError`` or ``OSError`` as much as a :class:`DeviceError`), a call
    past the service's deadline (abandoned), or outputs that break the model's declared output
    ``[rows, n_out]`` of finite numbers. A fault is counted, takes the primary out of service and
    the batch goes to the sim device (``fallback="sim"``); with ``fallback="503"`` it raises
    :class:`DeviceUnavailable`, or :class:`BadDeviceOutput` (500) when the device answered with
    wrong outputs. A background thread opens a fresh handle, checks it on a probe batch against
    the sim device and swaps it back in.

    Example::

        r = FailoverRunner(kernel, "xrt:0", n_out=1, fallback="sim", metrics=ServeMetrics(), model="risk")
        y, device = await r.run(x)          # float32 [B, n_out]: FP32, the wire type
    """

    def __init__(
        self,
        kernel: Kernel,
        device: str,
        *,
        n_out: int,
        fallback: str,
        metrics: ServeMetrics,
        model: str,
        timeout_s: float = 1.0,
        reopen_backoff_s: float = 0.5,
        probe: np.ndarray | None = None,
        launch: str = "per_call",
    ) -> None:
        self.kernel = kernel
        self.device_spec = device
        self.n_out = n_out
        self.fallback = fallback
        self.metrics = metrics
        self.model = model
        self.timeout_s = timeout_s
        self.deadline_s = deadline_for(timeout_s)
        self._backoff = reopen_backoff_s
        self._probe = probe
        self.launch = launch
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._reopener: threading.Thread | None = None
        self.abandoned = 0  # device calls left running past the deadline, and closes that never ended
        self._closers: list[threading.Thread] = []
        self.state = "up"
        self._primary, self._handle = self._open(device)
        self._fast = self._bound(self._primary, self._handle)
        # A device with a prepared rows call computes in this process under the GIL: a thread would
        # add only hand-offs, so its calls run inline. Any other device gets a lane of its own.
        self._inline = self._fast is not None
        self._lane = None if self._inline else _Lane(f"offload-device-{device}")
        # (device, handle, prepared call) while the primary is up, else None: one attribute, so
        # _run_inline reads a consistent triple without taking the lock (every writer holds it).
        self._live: tuple | None = (self._primary, self._handle, self._fast)
        # The fall-back device is opened up front: a fault must never wait for a cold start.
        self._sim: Device = open_device("sim") if fallback == "sim" else None  # type: ignore[assignment]
        self._sim_handle = self._sim.load(kernel) if self._sim is not None else None
        self._compute = metrics.compute_duration.labels(model=model, device=device)
        metrics.set_device_state(device, "up")

    def _open(self, spec: str) -> tuple[Device, KernelHandle]:
        dev = open_device(spec, launch=self.launch)
        try:
            return dev, dev.load(self.kernel)
        except BaseException:
            dev.close()
            raise

    @staticmethod
    def _bound(dev: Device, handle: KernelHandle) -> Callable[[np.ndarray], np.ndarray] | None:
        """The device's prepared rows-to-rows call (``Device.bind_rows``, FP32 both ways, the wire
        type), or None where the device has none: then every batch takes ``run`` and its checks.
        Rows reach it only after the service's own input check."""
        return dev.bind_rows(handle, fp32=True)

    def _run_inline(self, x: np.ndarray) -> tuple[np.ndarray, str]:
        """:meth:`run` on the caller's thread, for a device that computes under the GIL anyway."""
        live = self._live
        err: DeviceError | None = None
        if live is not None:
            dev, handle, fast = live
            t0 = time.perf_counter()
            try:
                if fast is not None:
                    y = fast(x)
                else:
                    y = as_fp32(self._checked(dev.run(handle, {"x": x}, timeout=self.timeout_s), x.shape[0], self.device_spec))
                self._compute.observe(time.perf_counter() - t0)
                return y, self.device_spec
            except Exception as e:  # as in run(): whatever a device call raises is a device fault
                err = e if isinstance(e, DeviceError) else DeviceError(f"device {self.device_spec!r} raised {type(e).__name__}: {e}")
                self._fault(dev, err, type(e).__name__)
        return self._fall_back(x, err)

    async def run(self, x: np.ndarray) -> tuple[np.ndarray, str]:
        """Scores ``x``; returns the output and the name of the device that computed it."""
        if self._inline:
            return self._run_inline(x)
        with self._lock:
            dev, handle, lane = (self._primary, self._handle, self._lane) if self.state == "up" else (None, None, None)
        err: DeviceError | None = None
        if dev is not None:
            t0 = time.perf_counter()
            try:
                fut = lane.submit(dev.run, handle, {"x": x}, self.timeout_s)
                try:
                    out = await asyncio.wait_for(asyncio.wrap_future(fut), self.deadline_s)
                except TimeoutError:
                    raise DeviceAbandoned(
                        f"device {self.device_spec!r}: a call ran past the service's deadline of {self.deadline_s * 1e3:.0f} ms "
                        f"(device timeout {self.timeout_s * 1e3:.0f} ms); call and handle abandoned"
                    ) from None
                y = as_fp32(self._checked(out, x.shape[0], self.device_spec))
                self._compute.observe(time.perf_counter() - t0)
                return y, self.device_spec
            # Whatever a device call raises is a device fault (bindings raise RuntimeError, OSError,
            # KeyError...); inputs were validated before queueing, so none of it is the client's.
            except Exception as e:
                err = e if isinstance(e, DeviceError) else DeviceError(f"device {self.device_spec!r} raised {type(e).__name__}: {e}")
                self._fault(dev, err, type(e).__name__)
        return self._fall_back(x, err)

    def _fall_back(self, x: np.ndarray, err: DeviceError | None) -> tuple[np.ndarray, str]:
        if self._sim is None:
            if isinstance(err, DeviceOutputError):
                raise BadDeviceOutput(f"{err}; no fall-back is configured, so no scores are returned") from None
            raise DeviceUnavailable(f"device {self.device_spec!r} is {self.state}; fallback is 503" + (f" ({err})" if err else ""))
        self.metrics.fallbacks.labels(model=self.model).inc()
        t0 = time.perf_counter()
        y = as_fp32(self._sim.run(self._sim_handle, {"x": x})["y"])
        self.metrics.compute_duration.labels(model=self.model, device="sim-fallback").observe(time.perf_counter() - t0)
        return y, "sim-fallback"

    def _checked(self, out: Any, rows: int, device: str) -> np.ndarray:
        """The device's ``y`` if it is the model's declared output ``[rows, n_out]`` of finite numbers."""
        if not isinstance(out, Mapping) or "y" not in out:
            got = sorted(out) if isinstance(out, Mapping) else type(out).__name__
            raise DeviceError(f"device {device!r} returned no output 'y' (got {got})")
        y = out["y"]
        if not isinstance(y, np.ndarray) or y.ndim == 0:
            raise DeviceError(f"device {device!r}: output 'y' is a {type(y).__name__}, not an array of {rows} rows")
        if y.shape[0] != rows:
            raise DeviceError(f"device {device!r} returned {y.shape[0]} rows for a batch of {rows}")
        if y.shape != (rows, self.n_out):
            raise DeviceOutputError(f"device {device!r}: output 'y' has shape {list(y.shape)}; the model declares [{rows}, {self.n_out}]")
        if y.dtype.kind not in "fiu":
            raise DeviceOutputError(f"device {device!r}: output 'y' has dtype {y.dtype}; expected numbers")
        if not np.isfinite(y).all():
            raise DeviceOutputError(f"device {device!r}: output 'y' holds {int(np.size(y) - np.isfinite(y).sum())} non-finite values (NaN or infinity)")
        return y

    def _fault(self, dev: Device, err: DeviceError, kind: str) -> None:
        self.metrics.device_faults.labels(device=self.device_spec, type=kind).inc()
        self.metrics.errors.labels(type=kind).inc()
        stuck = isinstance(err, DeviceAbandoned)
        with self._lock:
            if stuck:
                self.abandoned += 1
            if self._primary is not dev or self.state != "up":
                return  # another batch already reported this device
            _log.warning("device %s failed (%s: %s); %s and reopening", self.device_spec, kind, err, "falling back to sim" if self._sim else "answering 503")
            self.state = "failed"
            lane, self._primary, self._handle, self._lane, self._fast = self._lane, None, None, None, None
            self._live = None
            self.metrics.set_device_state(self.device_spec, "failed")
            self._reopener = threading.Thread(target=self._reopen, args=(dev, lane), name="offload-reopen", daemon=True)
            self._reopener.start()

    def _reopen(self, old: Device, old_lane: _Lane | None) -> None:
        if old_lane is not None:
            old_lane.retire()
        # Closing a failed card may wait for its stuck call (a binding's close joins its workers):
        # it gets a thread of its own and nobody waits for it. The fresh handle is what matters.
        self._close_later(old)
        delay = self._backoff
        while not self._closed.is_set():
            with self._lock:
                self.state = "reopening"
            self.metrics.set_device_state(self.device_spec, "reopening")
            try:
                dev, handle = self._open(self.device_spec)
                lane = None if self._inline else _Lane(f"offload-device-{self.device_spec}")
                self._check(dev, handle, lane)
            except Exception as e:  # any failure to come back means: wait and retry
                _log.warning("reopening %s failed: %s; retrying in %.1fs", self.device_spec, e, delay)
                if self._closed.wait(delay):
                    return
                delay = min(delay * 2, 10.0)
                continue
            with self._lock:
                closed = self._closed.is_set()
                if not closed:
                    self._primary, self._handle, self._lane, self.state = dev, handle, lane, "up"
                    self._fast = self._bound(dev, handle)
                    self._live = (dev, handle, self._fast)
            if closed:  # closed while it reopened; off the lock, which _close_later takes itself
                if lane is not None:
                    lane.retire()
                self._close_later(dev)
                return
            self.metrics.set_device_state(self.device_spec, "up")
            _log.warning("device %s is back", self.device_spec)
            return

    def _check(self, dev: Device, handle: KernelHandle, lane: _Lane | None) -> None:
        # A fresh handle must answer within the deadline, in the declared shape, and (when the sim
        # device is at hand) agree bit for bit with the reference, before it takes traffic again.
        if self._probe is None:
            return
        try:
            if lane is None:
                out = dev.run(handle, {"x": self._probe}, timeout=self.timeout_s)
            else:
                out = lane.submit(dev.run, handle, {"x": self._probe}, self.timeout_s).result(timeout=self.deadline_s)
            got = self._checked(out, self._probe.shape[0], self.device_spec)
            if self._sim is not None and not np.array_equal(got, self._sim.run(self._sim_handle, {"x": self._probe})["y"]):
                raise DeviceError(f"reopened device {self.device_spec!r} disagrees with the sim reference on the probe batch")
        except BaseException as e:
            if lane is not None:
                lane.retire()
            self._close_later(dev)
            if isinstance(e, FutureTimeout):
                raise DeviceAbandoned(f"reopened device {self.device_spec!r}: the probe ran past {self.deadline_s * 1e3:.0f} ms") from None
            raise

    def _close_later(self, dev: Device) -> None:
        t = threading.Thread(target=_close_quietly, args=(dev,), name="offload-close-failed", daemon=True)
        t.start()
        with self._lock:
            self._closers = [c for c in self._closers if c.is_alive()] + [t]

    def wait_up(self, timeout: float) -> bool:
        """Blocks until the primary is up again (tests, drain); True if it is."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.state == "up":
                return True
            time.sleep(0.01)
        return self.state == "up"

    def close(self) -> None:
        """Closes the devices; a device that does not close within a bound is left to the OS."""
        self._closed.set()
        if self._reopener is not None:
            self._reopener.join(timeout=_CLOSE_WAIT_S)
        with self._lock:
            devs = [d for d in (self._primary, self._sim) if d is not None]
            lane, self._primary, self._lane, self._fast = self._lane, None, None, None
            self._live = None
            self.state = "closed"
        if lane is not None:
            lane.retire()
        with self._lock:
            stuck_closes = sum(t.is_alive() for t in self._closers)
        if stuck_closes:  # a failed device's close still waits for its stuck call
            _log.warning("%d failed device(s) never finished closing; left to the OS", stuck_closes)
            self.abandoned += stuck_closes
        for d in devs:
            t = threading.Thread(target=_close_quietly, args=(d,), name="offload-close", daemon=True)
            t.start()
            t.join(timeout=_CLOSE_WAIT_S)
            if t.is_alive():
                _log.warning("device %s did not close within %.0f s; left to the OS", d.name, _CLOSE_WAIT_S)
                self.abandoned += 1
        self.metrics.set_device_state(self.device_spec, "closed")


def _close_quietly(dev: Device) -> None:
    try:
        dev.close()
    except Exception:  # a lost card may not close cleanly; nothing depends on it any more
        _log.debug("closing device %s raised", dev.name, exc_info=True)
