"""What the emu, xrt and pynq devices share: handles, validation, marshalling, async submit.

Each of them runs a kernel's HLS top function with the buffer semantics of a card: resident
buffers uploaded once at ``load``; per call, input buffers written and synced to the device,
the top function started with the arguments in ``HlsKind.top_args`` order, output buffers synced
back. A backend supplies two hooks, ``_upload`` (resident buffers of one kernel) and ``_execute``
(one call); everything else lives here once.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as _FutureTimeout
from dataclasses import dataclass
from typing import Any, Callable, Mapping, TypeVar

import numpy as np

from offload.hls.registry import HlsKind, KernelArg, get_hls_kind
from offload.host.device import DeviceError, DeviceInfo, DeviceTimeout, KernelHandle
from offload.kernels.registry import Kernel, get_kind, resident_copy
from offload.sim.errors import InputError, InputTypeError

__all__ = ["BufferedDevice", "Loaded", "host_array", "scalar_value", "next_live_cu"]

R = TypeVar("R")


@dataclass
class Loaded:
    """One kernel resident on a device: its frozen copy, generator, argument list and backend state."""

    kernel: Kernel
    hls: HlsKind
    top: str
    args: tuple[KernelArg, ...]
    state: Any = None
    # The ring (slots, rows) a bundle recorded for this kernel's persistent top; None: the device's.
    ring: tuple[int, int] | None = None


def next_live_cu(loaded: Loaded, device: str) -> Any:
    """The next compute unit of ``loaded`` in round-robin order that is not marked hung.

    ``loaded.state`` holds ``cus`` (each with a ``hung`` flag), their ``next_cu`` cycle and the
    ``lock`` that guards it: the card devices (xrt, pynq) keep their compute units that way.
    """
    st = loaded.state
    with st.lock:
        for _ in range(len(st.cus)):
            cu = next(st.next_cu)
            if not cu.hung:
                return cu
    raise DeviceError(f"kernel {loaded.kernel.name!r} on {device!r}: every compute unit is hung; reset the card (`xbutil reset`) and reopen")


def host_array(kernel: str, arg: KernelArg, value: Any) -> np.ndarray:
    """A C-contiguous host array for a pointer argument, with exactly the argument's dtype.

    A dtype mismatch is a bug in the kind's ``pack_*`` (the C++ would reinterpret the bytes), so it
    is refused rather than silently cast.
    """
    arr = np.asarray(value)
    want = np.dtype(arg.dtype)
    if arr.dtype != want:
        raise InputTypeError(f"kernel {kernel!r}: buffer {arg.name!r} has dtype {arr.dtype}, the top function takes {want}")
    return np.ascontiguousarray(arr)


def scalar_value(kernel: str, arg: KernelArg, value: Any) -> int | float:
    """A Python number for a scalar argument, range-checked against the argument's dtype."""
    dt = np.dtype(arg.dtype)
    if dt.kind in "iu":
        v = int(value)
        info = np.iinfo(dt)
        if not info.min <= v <= info.max:
            raise InputError(f"kernel {kernel!r}: scalar {arg.name!r}={v} is outside {dt} [{info.min}, {info.max}]")
        return v
    return float(value)


class BufferedDevice:
    """Base of the devices that run the real top function (emu, xrt, pynq). Thread-safe."""

    kind = "buffered"

    def __init__(self, name: str) -> None:
        self.name = name
        self._loaded: list[Loaded] = []
        self._lock = threading.Lock()
        self._submit_pool: ThreadPoolExecutor | None = None
        self._timeout_pool: ThreadPoolExecutor | None = None
        self._closed = False
        self._runs = itertools.count()

    # -- backend hooks ------------------------------------------------------------------------
    def _upload(self, loaded: Loaded, resident: dict[str, np.ndarray]) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _execute(self, loaded: Loaded, values: dict[str, Any], timeout: float | None) -> dict[str, np.ndarray]:  # pragma: no cover
        raise NotImplementedError

    def _details(self) -> dict[str, Any]:
        return {}

    def _shutdown(self) -> None:
        pass

    # -- protocol -----------------------------------------------------------------------------
    def load(self, kernel: Kernel) -> KernelHandle:
        """Upload ``kernel``'s resident tensors once; the returned handle runs it."""
        return self._load(kernel, None)

    def _load(self, kernel: Kernel, ring: tuple[int, int] | None) -> KernelHandle:
        self._check_open()
        frozen = resident_copy(kernel)
        hk = get_hls_kind(kernel.kind)
        args = tuple(hk.top_args(frozen.spec))
        loaded = Loaded(frozen, hk, hk.top_name(frozen.spec), args, ring=ring)
        packed = hk.pack_resident(frozen.spec, frozen.tensors)
        resident = {}
        for a in args:
            if a.role == "resident":
                if a.name not in packed:
                    raise DeviceError(f"kernel {kernel.name!r}: pack_resident gave no buffer for resident argument {a.name!r}")
                resident[a.name] = host_array(kernel.name, a, packed[a.name])
        try:
            loaded.state = self._upload(loaded, resident)
        except (DeviceError, TypeError, ValueError):
            raise
        except Exception as e:  # a g++ build error, an XRT/PYNQ RuntimeError: name the kernel and device
            raise DeviceError(f"kernel {kernel.name!r} ({loaded.top}): cannot load on device {self.name!r}: {e}") from e
        with self._lock:
            self._check_open()
            self._loaded.append(loaded)
            slot = len(self._loaded) - 1
        return KernelHandle(self.name, kernel.name, kernel.kind, slot)

    def load_bundle(self, bundle: Any) -> dict[str, KernelHandle]:
        """Load every kernel of a :class:`offload.host.bundle.Bundle`; name -> handle."""
        return self._load_all(bundle, {})

    def _load_all(self, bundle: Any, rings: Mapping[str, tuple[int, int]]) -> dict[str, KernelHandle]:
        """Every kernel of ``bundle``, each with the ring ``rings`` names for it (see :class:`Loaded`)."""
        return {name: self._load(k, rings.get(name)) for name, k in bundle.kernels.items()}

    def run(self, handle: KernelHandle, inputs: Mapping[str, np.ndarray], timeout: float | None = None) -> dict[str, np.ndarray]:
        """Run synchronously: validate, marshal, execute on the device, unmarshal."""
        self._check_open()
        loaded = self._get(handle)
        k = loaded.kernel
        get_kind(k.kind).validate(k.spec, k.tensors, inputs)  # before any device work
        packed = loaded.hls.pack_inputs(k.spec, inputs)
        values: dict[str, Any] = {}
        for a in loaded.args:
            if a.role == "resident":
                continue
            if a.name not in packed:
                raise DeviceError(f"kernel {k.name!r}: pack_inputs gave no value for {a.role} argument {a.name!r}")
            v = packed[a.name]
            values[a.name] = scalar_value(k.name, a, v) if a.role == "scalar" else host_array(k.name, a, v)
        outputs = self._execute(loaded, values, timeout)
        return loaded.hls.unpack_outputs(k.spec, inputs, outputs)

    def bind_rows(self, handle: KernelHandle, *, fp32: bool = False) -> Callable[[np.ndarray], np.ndarray] | None:
        """None: a call here packs, syncs and unpacks buffers whatever the rows, so there is no
        prepared call to hand out; callers use :meth:`run`. A closed device or a foreign handle is
        refused as :meth:`run` refuses it."""
        self._check_open()
        self._get(handle)
        return None

    def bind_checked(self, handle: KernelHandle, *, fp32: bool = False) -> Callable[..., np.ndarray] | None:
        """None, as :meth:`bind_rows`: callers use :meth:`run`."""
        return self.bind_rows(handle, fp32=fp32)

    def bind_native(self, handle: KernelHandle) -> Any:
        """None, as :meth:`bind_rows`: the kernel runs behind buffers, not on the caller's memory."""
        return self.bind_rows(handle)

    def submit(self, handle: KernelHandle, inputs: Mapping[str, np.ndarray], timeout: float | None = None) -> Future:
        """Run asynchronously; the future resolves to :meth:`run`'s result (or its error)."""
        with self._lock:
            self._check_open()
            if self._submit_pool is None:
                self._submit_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"offload-{self.kind}")
            return self._submit_pool.submit(self.run, handle, inputs, timeout)

    def info(self) -> DeviceInfo:
        details = {"kernels": [lo.kernel.name for lo in self._loaded], **self._details()}
        return DeviceInfo(self.name, self.kind, self._description(), details)

    def _description(self) -> str:
        return self.kind

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pools = (self._submit_pool, self._timeout_pool)
            self._submit_pool = self._timeout_pool = None
        for p in pools:
            if p is not None:
                p.shutdown(wait=True)
        self._shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- helpers for backends -----------------------------------------------------------------
    def _get(self, handle: KernelHandle) -> Loaded:
        if handle.device != self.name or not (0 <= handle.slot < len(self._loaded)):
            raise DeviceError(f"kernel handle {handle} does not belong to device {self.name!r}")
        return self._loaded[handle.slot]

    def _check_open(self) -> None:
        if self._closed:
            raise DeviceError(f"device {self.name!r} is closed")

    def _with_timeout(self, fn: Callable[[], R], timeout: float | None, what: str) -> R:
        """Run ``fn`` here, or in a worker when a timeout is asked for (a blocking C call cannot be
        interrupted; on timeout the worker finishes in the background and releases its buffers)."""
        if timeout is None:
            return fn()
        with self._lock:
            if self._timeout_pool is None:
                self._timeout_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"offload-{self.kind}-run")
            fut = self._timeout_pool.submit(fn)
        try:
            return fut.result(timeout=timeout)
        except _FutureTimeout:
            raise DeviceTimeout(f"{what} did not finish within {timeout:g} s on device {self.name!r}") from None

