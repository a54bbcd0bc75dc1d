"""Test-only stand-ins for the serving tests: a tiny fixed-point scoring kernel kind and a device
that fails on demand. They exercise the service's contracts (Bundle + Device) without depending
on any particular kernel family."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from offload.host import DeviceError, DeviceTimeout, register_device
from offload.host.sim import SimDevice
from offload.kernels import Kernel, KernelKind, register_kind

KIND = "serve_test_affine"


@dataclass(frozen=True)
class AffineSpec:
    n_in: int
    n_out: int
    kind: str = KIND

    def to_json(self) -> dict:
        return {"n_in": self.n_in, "n_out": self.n_out}


def _validate(spec, tensors, inputs):
    x = inputs["x"]
    if x.ndim != 2 or x.shape[1] != spec.n_in:
        raise ValueError(f"x: shape {x.shape}, expected [B, {spec.n_in}]")
    bad = np.argwhere(~np.isfinite(x))
    if bad.size:
        r, c = bad[0]
        raise ValueError(f"x[{r}, {c}] is not finite ({x[r, c]})")


def _reference(spec, tensors, inputs):
    # Quantize to Q8 with saturation, integer matmul, rescale: row-independent like a real MLP.
    q = np.clip(np.round(inputs["x"] * 256), -32768, 32767).astype(np.int64)
    acc = q @ tensors["w"].astype(np.int64) + tensors["b"].astype(np.int64)
    return {"y": acc.astype(np.float64) / 65536.0}


KIND_OBJ = register_kind(KernelKind(KIND, lambda d: AffineSpec(int(d["n_in"]), int(d["n_out"])), _validate, _reference))


def make_bundle(name: str = "risk", n_in: int = 8, n_out: int = 1, seed: int = 0):
    from offload.host.bundle import Bundle

    rng = np.random.default_rng(seed)
    k = Kernel(name, AffineSpec(n_in, n_out), {"w": rng.integers(-300, 300, (n_in, n_out)).astype(np.int16), "b": rng.integers(-1000, 1000, n_out).astype(np.int32)})
    return Bundle(name, {name: k}, {"features": [f"f{i}" for i in range(n_in)]})


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
        self.runs = 0
        FlakyDevice.instances.append(self)

    def run(self, handle, inputs, timeout=None):
        self.runs += 1
        if self.fail_next > 0:
            self.fail_next -= 1
            raise (DeviceTimeout if self.timeout else DeviceError)("flaky: injected fault")
        return super().run(handle, inputs, timeout)


register_device("flaky", FlakyDevice)


class GatedDevice(SimDevice):
    """A sim device whose runs block until ``gate`` is set: lets a test fill the queue."""

    gate = threading.Event()
    batches: list[int] = []

    def run(self, handle, inputs, timeout=None):
        GatedDevice.gate.wait(timeout=30)
        GatedDevice.batches.append(inputs["x"].shape[0])
        return super().run(handle, inputs, timeout)


register_device("gated", GatedDevice)
