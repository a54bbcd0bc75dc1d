"""Test helpers for the serving tests: the example risk bundle (built once per process) and sim
devices that fail or block on demand, registered as the ``flaky`` and ``gated`` device backends."""

from __future__ import annotations

import threading
from offload.host import DeviceError, DeviceTimeout, register_device
from offload.host.sim import SimDevice

_BUNDLE_DIR: list[str] = []


def risk_bundle_path() -> str:
    """The example risk bundle (``offload example risk``), trained once per test process."""
    if not _BUNDLE_DIR:
        import atexit
        import shutil
        import tempfile

        import torch

        from offload.examples.risk import build_risk_bundle

        torch.set_num_threads(1)  # the machine is shared: training is small, threads only contend
        d = tempfile.mkdtemp(prefix="offload-risk-")
        atexit.register(shutil.rmtree, d, True)
        build_risk_bundle(f"{d}/risk")
        _BUNDLE_DIR.append(f"{d}/risk")
    return _BUNDLE_DIR[0]


class FlakyDevice(SimDevice):
    """A sim device that raises on the next ``fail_next`` runs (DeviceError or DeviceTimeout)."""

    instances: list["FlakyDevice"] = []
    fail_opens = 0
    _lock = threading.Lock()

    def __init__(self, spec: str = "flaky") -> None:
        with FlakyDevice._lock:
            if FlakyDevice.fail_opens > 0:
                FlakyDevice.fail_opens -= 1
                raise DeviceError("flaky: card not found")
        super().__init__(spec)
        self.fail_next = 0
        self.timeout = False
        self.crash = False
        self.runs = 0
        FlakyDevice.instances.append(self)

    def bind_rows(self, handle, *, fp32=False):
        return None  # every call goes through run(), which this stand-in overrides

    def run(self, handle, inputs, timeout=None):
        self.runs += 1
        if self.crash:
            raise RuntimeError("flaky: a bug, not a device fault")
        if self.fail_next > 0:
            self.fail_next -= 1
            raise (DeviceTimeout if self.timeout else DeviceError)("flaky: injected fault")
        return super().run(handle, inputs, timeout)


register_device("flaky")(FlakyDevice)


class GatedDevice(SimDevice):
    """A sim device whose runs block until ``gate`` is set: lets a test fill the queue.
    ``entered`` is set when the first run arrives (a test can time the stall from it)."""

    gate = threading.Event()
    entered = threading.Event()
    batches: list[int] = []

    def bind_rows(self, handle, *, fp32=False):
        return None  # every call goes through run(), which this stand-in overrides

    def run(self, handle, inputs, timeout=None):
        GatedDevice.entered.set()
        GatedDevice.gate.wait(timeout=30)
        GatedDevice.batches.append(inputs["x"].shape[0])
        return super().run(handle, inputs, timeout)


register_device("gated")(GatedDevice)
