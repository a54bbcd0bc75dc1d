"""Device fault handling: fail a batch over to the sim device (or to 503) and reopen in the background.

The sim device computes the kernel's bit-exact reference, the same numbers the card returns, so a
fail-over changes latency but never a score.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import numpy as np

from offload.host import Device, DeviceError, KernelHandle, open_device
from offload.kernels import Kernel
from offload.serve.metrics import ServeMetrics

__all__ = ["FailoverRunner", "DeviceUnavailable"]

_log = logging.getLogger("offload.serve")


class DeviceUnavailable(RuntimeError):
    """The device failed and the service is configured to answer 503 rather than fall back."""


class FailoverRunner:
    """Runs batches of one kernel on a primary device with a sim fall-back.

    ``run(x)`` is synchronous (the batcher calls it from its worker thread). On a
    :class:`DeviceError` (timeouts included) the primary is marked failed, the batch goes to the sim
    device (``fallback="sim"``) or raises :class:`DeviceUnavailable` (``fallback="503"``), and a
    background thread reopens the primary, checks it against the sim device on a probe batch and
    swaps it back in.

    Example::

        r = FailoverRunner(kernel, "xrt:0", fallback="sim", metrics=ServeMetrics(), model="risk")
        y = r.run(x)                       # float64 [B, n_out]
    """

    def __init__(
        self,
        kernel: Kernel,
        device: str,
        *,
        fallback: str,
        metrics: ServeMetrics,
        model: str,
        timeout_s: float = 1.0,
        reopen_backoff_s: float = 0.5,
        probe: np.ndarray | None = None,
        opener: Callable[[str], Device] = open_device,
    ) -> None:
        self.kernel = kernel
        self.device_spec = device
        self.fallback = fallback
        self.metrics = metrics
        self.model = model
        self.timeout_s = timeout_s
        self._backoff = reopen_backoff_s
        self._probe = probe
        self._opener = opener
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._reopener: threading.Thread | None = None
        self.state = "up"
        self._primary: Device | None = None
        self._handle: KernelHandle | None = None
        self._primary, self._handle = self._open(device)
        # The fall-back device is opened up front: a fault must never wait for a cold start.
        self._sim: Device = opener("sim") if fallback == "sim" else None  # type: ignore[assignment]
        self._sim_handle = self._sim.load(kernel) if self._sim is not None else None
        metrics.set_device_state(device, "up")

    def _open(self, spec: str) -> tuple[Device, KernelHandle]:
        dev = self._opener(spec)
        try:
            return dev, dev.load(self.kernel)
        except BaseException:
            dev.close()
            raise

    def run(self, x: np.ndarray) -> tuple[np.ndarray, str]:
        """Scores ``x``; returns the output and the name of the device that computed it."""
        with self._lock:
            dev, handle = (self._primary, self._handle) if self.state == "up" else (None, None)
        if dev is not None:
            t0 = time.perf_counter()
            try:
                y = dev.run(handle, {"x": x}, timeout=self.timeout_s)["y"]
                self.metrics.compute_duration.labels(model=self.model, device=self.device_spec).observe(time.perf_counter() - t0)
                return y, self.device_spec
            except DeviceError as e:
                self._fault(dev, e)
        if self._sim is None:
            raise DeviceUnavailable(f"device {self.device_spec!r} is {self.state}; fallback is 503")
        self.metrics.fallbacks.labels(model=self.model).inc()
        t0 = time.perf_counter()
        y = self._sim.run(self._sim_handle, {"x": x})["y"]
        self.metrics.compute_duration.labels(model=self.model, device="sim-fallback").observe(time.perf_counter() - t0)
        return y, "sim-fallback"

    def _fault(self, dev: Device, err: DeviceError) -> None:
        kind = type(err).__name__
        self.metrics.device_faults.labels(device=self.device_spec, type=kind).inc()
        self.metrics.errors.labels(type=kind).inc()
        with self._lock:
            if self._primary is not dev or self.state != "up":
                return  # another batch already reported this device
            _log.warning("device %s failed (%s: %s); %s and reopening", self.device_spec, kind, err, "falling back to sim" if self._sim else "answering 503")
            self.state = "failed"
            self._primary, self._handle = None, None
            self.metrics.set_device_state(self.device_spec, "failed")
            self._reopener = threading.Thread(target=self._reopen, args=(dev,), name="offload-reopen", daemon=True)
            self._reopener.start()

    def _reopen(self, old: Device) -> None:
        try:
            old.close()
        except Exception:  # a lost card may not close cleanly; the reopen below is what matters
            _log.debug("closing failed device raised", exc_info=True)
        delay = self._backoff
        while not self._closed.is_set():
            with self._lock:
                self.state = "reopening"
            self.metrics.set_device_state(self.device_spec, "reopening")
            try:
                dev, handle = self._open(self.device_spec)
                self._check(dev, handle)
            except Exception as e:  # any failure to come back means: wait and retry
                _log.warning("reopening %s failed: %s; retrying in %.1fs", self.device_spec, e, delay)
                if self._closed.wait(delay):
                    return
                delay = min(delay * 2, 10.0)
                continue
            with self._lock:
                if self._closed.is_set():
                    dev.close()
                    return
                self._primary, self._handle, self.state = dev, handle, "up"
            self.metrics.set_device_state(self.device_spec, "up")
            _log.warning("device %s is back", self.device_spec)
            return

    def _check(self, dev: Device, handle: KernelHandle) -> None:
        # A reopened device must agree bit for bit with the reference before it takes traffic again.
        if self._probe is None or self._sim is None:
            return
        got = dev.run(handle, {"x": self._probe}, timeout=self.timeout_s)["y"]
        want = self._sim.run(self._sim_handle, {"x": self._probe})["y"]
        if not np.array_equal(got, want):
            dev.close()
            raise DeviceError(f"reopened device {self.device_spec!r} disagrees with the sim reference on the probe batch")

    def wait_up(self, timeout: float) -> bool:
        """Blocks until the primary is up again (tests, drain); True if it is."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.state == "up":
                return True
            time.sleep(0.01)
        return self.state == "up"

    def close(self) -> None:
        self._closed.set()
        if self._reopener is not None:
            self._reopener.join(timeout=5)
        with self._lock:
            devs = [d for d in (self._primary, self._sim) if d is not None]
            self._primary = None
            self.state = "closed"
        for d in devs:
            d.close()
        self.metrics.set_device_state(self.device_spec, "closed")
