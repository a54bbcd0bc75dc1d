"""Resident kernels for the torch ops.

torch.library schemas carry tensors and scalars, not Python objects, so a module registers its
kernel here once (uploading tables/weights to the device) and passes the returned integer id to
the op. The op looks the id up and runs on that device.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Callable

from offload.host import Device, KernelHandle, default_device
from offload.kernels import Kernel

__all__ = ["Resident", "make_resident", "get_resident", "release_resident", "bound_call", "on_release"]


@dataclass(frozen=True)
class Resident:
    id: int
    kernel: Kernel
    device: Device
    handle: KernelHandle
    # What a call does with inputs outside the kernel's formats (embedding per-sample weights):
    # "warn" (saturate, warn with count and worst value), "raise" or "saturate" (silently).
    on_overflow: str = "warn"
    # The device's prepared calls for this kernel, bound at first use (see bound_call).
    bound: dict = field(default_factory=dict, compare=False, repr=False)


_TABLE: dict[int, Resident] = {}
_IDS = itertools.count(1)
# Reentrant: the modules release their kernels from garbage-collector finalizers, which can run
# on a thread inside this lock (an allocation in make_resident), and a plain lock would wait for itself.
_LOCK = threading.RLock()
_ON_RELEASE: list[Callable[["Resident"], None]] = []


def make_resident(kernel: Kernel, device: str | Device | None = None, on_overflow: str = "warn") -> Resident:
    """Load ``kernel`` on ``device`` (a spec string, a Device, or None for the active device)."""
    dev = device if (device is not None and not isinstance(device, str)) else default_device(device)
    handle = dev.load(kernel)
    with _LOCK:
        rid = next(_IDS)
        res = _TABLE[rid] = Resident(rid, kernel, dev, handle, on_overflow)
    return res


def get_resident(rid: int) -> Resident:
    try:
        return _TABLE[int(rid)]
    except KeyError:
        raise KeyError(f"no resident offload kernel with id {rid}: was its module released?") from None


def release_resident(rid: int) -> None:
    with _LOCK:
        res = _TABLE.pop(int(rid), None)
    if res is not None:
        for hook in _ON_RELEASE:
            hook(res)


def on_release(hook: Callable[[Resident], None]) -> None:
    """Call ``hook(res)`` whenever a resident kernel is released (the C++ op forgets its entry)."""
    _ON_RELEASE.append(hook)


def bound_call(res: Resident, method: str, fp32: bool):
    """``res.device.<method>(res.handle, fp32=fp32)`` (``"bind_rows"`` or ``"bind_checked"``, both
    in the Device protocol: a device's prepared call for one kernel), bound once per resident
    kernel and kept on it; None where the device has none for this kernel: then the op calls ``run``.

    Example::

        rows = bound_call(res, "bind_rows", True)
        y = rows(x) if rows is not None else res.device.run(res.handle, {"x": x})["y"]
    """
    key = (method, fp32)
    try:
        return res.bound[key]
    except KeyError:
        call = res.bound[key] = getattr(res.device, method)(res.handle, fp32=fp32)
        return call
