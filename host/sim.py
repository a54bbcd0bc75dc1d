"""The ``sim`` device: the bit-exact reference models behind the device protocol.

A kind with a fast path (``KernelKind.prepare`` / ``run_checked``: the embedding kind's and the
mlp kind's fused compiled code, bit-identical to their NumPy references) gets its resident arrays laid out and its code
compiled at ``load()``, so no request pays the JIT; the seconds are in ``info().details["jit_s"]``.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Mapping

import numpy as np

from offload.host.device import DeviceError, DeviceInfo, KernelHandle, Probe, register_device
from offload.kernels.registry import Kernel, get_kind, resident_copy

__all__ = ["SimDevice"]


@register_device("sim")
class SimDevice:
    """Runs each kernel's reference model from :mod:`offload.sim`.

    Example::

        dev = SimDevice()
        h = dev.load(kernel)
        out = dev.run(h, inputs)
    """

    launch_modes = ("per_call",)
    launch_why = "the sim device computes in the caller's thread: there is no kernel to keep running"

    @classmethod
    def probe(cls) -> Probe:
        """Always available: NumPy (and numba, where installed) is all it needs."""
        return Probe("sim", True, ("sim",), "needs nothing from this host")

    def __init__(self, spec: str = "sim") -> None:
        self.name = spec
        self._kernels: list[Kernel] = []
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self._jit_s = 0.0
        self._native: list = []  # entries handed out by bind_native, turned off at close

    def load(self, kernel: Kernel) -> KernelHandle:
        frozen = resident_copy(kernel)
        kind = get_kind(frozen.kind)
        jit = 0.0
        if kind.prepare is not None:
            tensors, jit = kind.prepare(frozen.spec, frozen.tensors)
            frozen = Kernel(frozen.name, frozen.spec, tensors)
        with self._lock:
            self._check_open()
            self._jit_s += jit
            self._kernels.append(frozen)
            slot = len(self._kernels) - 1
        return KernelHandle(self.name, kernel.name, kernel.kind, slot)

    def load_bundle(self, bundle) -> dict[str, KernelHandle]:
        """Load every kernel of a :class:`offload.host.bundle.Bundle`; name -> handle."""
        return {name: self.load(k) for name, k in bundle.kernels.items()}

    def _get(self, handle: KernelHandle) -> Kernel:
        if handle.device != self.name or not (0 <= handle.slot < len(self._kernels)):
            raise DeviceError(f"kernel handle {handle} does not belong to device {self.name!r}")
        return self._kernels[handle.slot]

    def run(self, handle: KernelHandle, inputs: Mapping[str, np.ndarray], timeout: float | None = None) -> dict[str, np.ndarray]:
        self._check_open()
        k = self._get(handle)
        kind = get_kind(k.kind)
        if kind.run_checked is not None:
            return kind.run_checked(k.spec, k.tensors, inputs)
        kind.validate(k.spec, k.tensors, inputs)
        return kind.reference(k.spec, k.tensors, inputs)

    def bind_rows(self, handle: KernelHandle, *, fp32: bool = False) -> Callable[[np.ndarray], np.ndarray] | None:
        """:meth:`run` of ``handle`` as one prepared call from rows to rows (the kernel's one
        input and one output; an ndarray in), for rows that already passed the kind's input check
        for this kernel (the mlp kind's ``validate_inputs``: the scoring service checks every
        request before queueing it); None for a kind with no ``bind_rows`` (then call :meth:`run`).
        Skips :meth:`run`'s per-call check of the inputs and of the resident tensors, which were
        checked once, at :meth:`load`, and are read-only since, its per-call lookups, and the
        mappings around the rows. Unchecked rows give undefined outputs here: anyone else calls
        :meth:`run`. A closed device refuses it as run does.

        ``fp32``: rows of FP32 values and the output as float32, bit for bit run's output
        ``.astype(np.float32)`` (the kind's ``bind_rows`` does the rounding): what a server
        whose wire type is FP32 asks for.

        Example::

            score = dev.bind_rows(h)
            y = score(checked_rows)
        """
        self._check_open()
        k = self._get(handle)
        kind = get_kind(k.kind)
        if kind.bind_rows is None:
            return None
        return self._refused_once_closed(kind.bind_rows(k.spec, k.tensors, fp32=fp32))

    def bind_checked(self, handle: KernelHandle, *, fp32: bool = False) -> Callable[..., np.ndarray] | None:
        """:meth:`run`'s one output as one prepared call on the kernel's inputs given positionally
        (the embedding kind: ``(indices, offsets, per_sample_weights)``), checked as :meth:`run`
        checks them, with the per-call lookups and mappings of :meth:`run` done once; None for a
        kind (or spec) with no ``bind_checked`` (then call :meth:`run`). ``fp32``: the output as
        float32, written so by the kind's fast path (the embedding kind: its fused kernels): what
        the torch op returns for a float32 result. A closed device refuses it as run does.

        Example::

            lookup = dev.bind_checked(h, fp32=True)
            y = lookup(indices, offsets, None)
        """
        self._check_open()
        k = self._get(handle)
        kind = get_kind(k.kind)
        if kind.bind_checked is None:
            return None
        call = kind.bind_checked(k.spec, k.tensors, fp32=fp32)
        return None if call is None else self._refused_once_closed(call)

    def bind_native(self, handle: KernelHandle):
        """The kind's C-ABI entry for ``handle`` (``KernelKind.bind_native``: the embedding kind's
        :class:`offload.sim.embedding.fused.NativeEntry`), or None; close() turns it off (its calls
        then decline, and the caller's Python path raises as :meth:`run` does).

        Example::

            entry = dev.bind_native(h)
        """
        self._check_open()
        k = self._get(handle)
        kind = get_kind(k.kind)
        entry = None if kind.bind_native is None else kind.bind_native(k.spec, k.tensors)
        if entry is not None:
            with self._lock:
                if self._closed:
                    entry.close()
                self._native.append(entry)
        return entry

    def _refused_once_closed(self, fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
        """``fn``, refused (as :meth:`run` refuses) once this device is closed."""

        def call(*inputs: np.ndarray | None) -> np.ndarray:
            if self._closed:  # _check_open's test inline: its frame only when it raises
                self._check_open()
            return fn(*inputs)

        return call

    def submit(self, handle: KernelHandle, inputs: Mapping[str, np.ndarray], timeout: float | None = None) -> Future:
        with self._lock:
            self._check_open()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="offload-sim")
            return self._pool.submit(self.run, handle, inputs, timeout)

    def info(self) -> DeviceInfo:
        return DeviceInfo(self.name, "sim", "bit-exact reference models", {"kernels": len(self._kernels), "jit_s": self._jit_s})

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for entry in self._native:
                entry.close()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def _check_open(self) -> None:
        if self._closed:
            raise DeviceError(f"device {self.name!r} is closed")
