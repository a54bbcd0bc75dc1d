"""The device protocol, the device registry and ``open_device``.

Every device (sim, emu, xrt, pynq) implements :class:`Device`. Kernels are loaded once (their
resident tensors uploaded) and then run many times with per-call inputs. All devices are
thread-safe: the torch ops and the scoring service call them from several threads.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import numpy as np

from offload.kernels.registry import Kernel, Registry
from offload.sim.errors import DeviceError, DeviceTimeout, InputError  # noqa: F401  (re-exported: defined once in the hierarchy)

__all__ = [
    "Device",
    "DeviceError",
    "DeviceTimeout",
    "DeviceInfo",
    "KernelHandle",
    "open_device",
    "default_device",
    "register_device",
]


@dataclass(frozen=True)
class DeviceInfo:
    """What a device is: its registry name, a human description and backend details."""

    name: str
    kind: str
    description: str
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KernelHandle:
    """A kernel resident on a device; returned by ``Device.load`` and passed to ``run``."""

    device: str
    kernel: str
    kind: str
    slot: int


@runtime_checkable
class Device(Protocol):
    """What every device implements."""

    name: str

    def load(self, kernel: Kernel) -> KernelHandle:
        """Upload the kernel's resident tensors (once) and return a handle."""
        ...

    def run(self, handle: KernelHandle, inputs: Mapping[str, np.ndarray], timeout: float | None = None) -> dict[str, np.ndarray]:
        """Run synchronously; inputs are validated before any device work."""
        ...

    def submit(self, handle: KernelHandle, inputs: Mapping[str, np.ndarray], timeout: float | None = None) -> Future:
        """Run asynchronously; the future resolves to ``run``'s result."""
        ...

    def load_bundle(self, bundle: Any) -> dict[str, KernelHandle]:
        """Load every kernel of an :class:`offload.host.bundle.Bundle` (the card backends first load
        its xclbin, checking the UUID the bundle recorded); kernel name -> handle."""
        ...

    def info(self) -> DeviceInfo:
        ...

    def close(self) -> None:
        ...


DeviceFactory = Callable[[str], Device]
DEVICES: Registry[DeviceFactory] = Registry("device backend")
_DEFAULTS: dict[str, Device] = {}
_LOCK = threading.Lock()


def register_device(prefix: str) -> Callable[[DeviceFactory], DeviceFactory]:
    """Class decorator: register a device backend under ``prefix`` (``"sim"``, ``"xrt"``); the
    factory (usually the class) gets the full spec string."""
    return DEVICES.register(prefix)


def open_device(spec: str | None = None) -> Device:
    """Open a new device from a spec such as ``"sim"``, ``"emu"``, ``"xrt:0"``, ``"pynq:0"``.

    ``None`` means ``$OFFLOAD_DEVICE``, else ``"sim"``. Unknown specs raise ``ValueError``.
    """
    spec = (spec or os.environ.get("OFFLOAD_DEVICE") or "sim").strip()
    prefix = spec.split(":", 1)[0]
    if prefix not in DEVICES:
        raise InputError(f"device {spec!r}: unknown backend {prefix!r}; known: {DEVICES.names()}")
    return DEVICES.get(prefix)(spec)


def default_device(spec: str | None = None) -> Device:
    """A process-wide shared device for ``spec`` (default ``$OFFLOAD_DEVICE`` or sim), opened once."""
    key = (spec or os.environ.get("OFFLOAD_DEVICE") or "sim").strip()
    with _LOCK:
        dev = _DEFAULTS.get(key)
        if dev is None:
            dev = _DEFAULTS[key] = open_device(key)
        return dev
