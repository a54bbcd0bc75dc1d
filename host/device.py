"""The device protocol, the device registry, ``open_device`` and ``probe_devices``.

Every device (sim, emu, xrt, pynq) implements :class:`Device`. Kernels are loaded once (their
resident tensors uploaded) and then run many times with per-call inputs. All devices are
thread-safe: the torch ops and the scoring service call them from several threads.

A backend whose devices depend on the host (a compiler, a driver, a card) gives its factory a
``probe()`` that says what it finds without opening anything (:class:`Probe`);
:func:`probe_devices` asks every registered backend, which is all ``offload devices`` prints.

Example::

    from offload.host.device import probe_devices
    for p in probe_devices():
        print(p.backend, p.available, p.devices, p.why)
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import numpy as np

from offload.hls.cards import LAUNCH_MODES  # defined once, beside the card's launch figures
from offload.kernels.registry import Kernel, Registry
from offload.sim.errors import DeviceError, DeviceTimeout, InputError, UnsupportedError  # noqa: F401  (re-exported: defined once in the hierarchy)

__all__ = [
    "Device",
    "DeviceError",
    "DeviceTimeout",
    "DeviceInfo",
    "KernelHandle",
    "LAUNCH_MODES",
    "Probe",
    "open_device",
    "launch_modes",
    "default_device",
    "register_device",
    "probe_devices",
]


@dataclass(frozen=True)
class DeviceInfo:
    """What a device is: its registry name, a human description and backend details."""

    name: str
    kind: str
    description: str
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Probe:
    """What one backend finds on this host: whether it can open a device, which ones, and why (not).

    ``devices``: one line per device it can open (``"xrt:0 0000:3b:00.1 xilinx_u55c_..."``);
    ``why``: the versions found, or what is missing and how to get it.

    Example::

        Probe("emu", False, (), "g++ not found on PATH (set CXX to use another compiler)")
    """

    backend: str
    available: bool
    devices: tuple[str, ...] = ()
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "available": self.available, "devices": list(self.devices), "why": self.why}


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

    def bind_rows(self, handle: KernelHandle, *, fp32: bool = False) -> Callable[[np.ndarray], np.ndarray] | None:
        """A prepared rows-to-rows call of ``handle`` (the kernel's one input and one output, an
        ndarray in) for inputs already checked by the kind's input check, or ``None`` when the
        device has none: then call :meth:`run`. ``fp32``: FP32 rows in, float32 out, bit for bit
        ``run``'s output ``.astype(np.float32)``. Unchecked rows give undefined outputs.

        Example::

            score = dev.bind_rows(h) or (lambda x: dev.run(h, {"x": x})["y"])
        """
        ...

    def bind_checked(self, handle: KernelHandle, *, fp32: bool = False) -> Callable[..., np.ndarray] | None:
        """``run`` of ``handle`` as one prepared call on the kernel's inputs (positional, as the
        kind's ``bind_checked`` orders them), with every check ``run`` makes; ``None`` when the
        device has none: then call :meth:`run`. ``fp32``: the output as float32.

        Example::

            lookup = dev.bind_checked(h, fp32=True)
        """
        ...

    def bind_native(self, handle: KernelHandle) -> Any:
        """The kind's C-ABI entry for ``handle`` (the sim device's embedding kernels:
        :class:`offload.sim.embedding.fused.NativeEntry`, which a compiled caller invokes with raw
        pointers and no Python), or ``None`` when the device has none.

        Example::

            entry = dev.bind_native(h)
        """
        ...

    def load_bundle(self, bundle: Any) -> dict[str, KernelHandle]:
        """Load every kernel of an :class:`offload.host.bundle.Bundle` (the card backends first load
        its xclbin, checking the UUID the bundle recorded); kernel name -> handle."""
        ...

    def info(self) -> DeviceInfo:
        ...

    def close(self) -> None:
        ...


DeviceFactory = Callable[..., Device]
# How a device starts its kernels: one run per call, or started once at load and fed through a
# ring of requests in memory (offload.kernels.ring). Every backend lists the modes it takes as
# ``launch_modes``, and says in ``launch_why`` why it has no other; it gets any mode other than
# per-call as ``launch=``. Every backend also has a ``probe()`` classmethod (probe_devices).
DEVICES: Registry[DeviceFactory] = Registry("device backend")
_DEFAULTS: dict[str, Device] = {}
_LOCK = threading.Lock()


def register_device(prefix: str) -> Callable[[DeviceFactory], DeviceFactory]:
    """Class decorator: register a device backend under ``prefix`` (``"sim"``, ``"xrt"``); the
    factory (usually the class) gets the full spec string. A factory with a ``probe()`` (a
    classmethod returning :class:`Probe`) reports what it finds to :func:`probe_devices`."""
    return DEVICES.register(prefix)


def probe_devices() -> list[Probe]:
    """What every registered backend finds on this host (its ``probe()``), by backend name. A
    probe that raises is reported as unavailable with its error: one broken backend does not hide
    the others.
    """
    found = []
    for prefix in DEVICES.names():
        try:
            found.append(DEVICES.get(prefix).probe())
        except Exception as e:  # noqa: BLE001 - reported against its backend
            found.append(Probe(prefix, False, (), f"probing failed: {type(e).__name__}: {e}"))
    return found


def open_device(spec: str | None = None, launch: str = "per_call") -> Device:
    """Open a new device from a spec such as ``"sim"``, ``"emu"``, ``"xrt:0"``, ``"pynq:0"``.

    ``None`` means ``$OFFLOAD_DEVICE``, else ``"sim"``. Unknown specs raise ``ValueError``.
    ``launch``: ``"per_call"`` (one kernel run per call) or ``"persistent"`` (kernels started once
    at load, requests through a ring in memory); a backend without that mode raises
    :class:`UnsupportedError` saying why (its backend's ``launch_why``).

    Example::

        dev = open_device("emu", launch="persistent")
    """
    if launch not in LAUNCH_MODES:
        raise InputError(f"launch: {launch!r} is not one of {list(LAUNCH_MODES)}")
    spec = (spec or os.environ.get("OFFLOAD_DEVICE") or "sim").strip()
    prefix = spec.split(":", 1)[0]
    if prefix not in DEVICES:
        raise InputError(f"device {spec!r}: unknown backend {prefix!r}; known: {DEVICES.names()}")
    factory = DEVICES.get(prefix)
    if launch == "per_call":
        return factory(spec)
    if launch not in factory.launch_modes:
        raise UnsupportedError(f"device {spec!r}: no {launch!r} launch mode: {factory.launch_why}")
    return factory(spec, launch=launch)


def launch_modes(spec: str | None = None) -> tuple[str, ...]:
    """The launch modes the backend of ``spec`` offers (``"per_call"`` always first).

    Example::

        "persistent" in launch_modes("emu")      # True
    """
    prefix = (spec or os.environ.get("OFFLOAD_DEVICE") or "sim").strip().split(":", 1)[0]
    if prefix not in DEVICES:
        raise InputError(f"device {spec!r}: unknown backend {prefix!r}; known: {DEVICES.names()}")
    return tuple(DEVICES.get(prefix).launch_modes)


def default_device(spec: str | None = None) -> Device:
    """A process-wide shared device for ``spec`` (default ``$OFFLOAD_DEVICE`` or sim), opened once."""
    key = (spec or os.environ.get("OFFLOAD_DEVICE") or "sim").strip()
    with _LOCK:
        dev = _DEFAULTS.get(key)
        if dev is None:
            dev = _DEFAULTS[key] = open_device(key)
        return dev
