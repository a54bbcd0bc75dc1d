"""The ``emu`` device: each kernel's HLS C++ compiled with g++ and run with card buffer semantics.

It plays the role of XRT software emulation without a Vitis install. The top function generated
by ``HlsKind.sources(spec)`` is built as a shared library (``offload.hls.csim``) and called
through ctypes. Buffers behave as on a card: the device side is a separate copy; resident
buffers are copied once at ``load``; per call, host input (and output) buffers are copied
("synced") into pooled device buffers, the top function runs on the device copies only, and the
outputs are copied back. A kernel that read host memory or skipped a sync would differ from sim.

Example::

    from offload.host import open_device
    dev = open_device("emu")
    h = dev.load(kernel)
    out = dev.run(h, inputs)          # same dict, bit for bit, as open_device("sim")
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from offload.hls import csim
from offload.hls.ctop import CTop, load_top
from offload.host._buffered import BufferedDevice, Loaded
from offload.host._pool import BufferPool
from offload.host.device import Probe, register_device

__all__ = ["EmuDevice", "load_top"]


@dataclass
class _EmuKernel:
    top: CTop
    resident: dict[str, np.ndarray]  # the device-side copies
    lock: threading.Lock  # one compute unit: one call at a time, as on the card


def _alloc_device(bank: Any, size: int) -> np.ndarray:
    return np.empty(size, dtype=np.uint8)


@register_device("emu")
class EmuDevice(BufferedDevice):
    """Runs the kernels' HLS C++ (g++-built) behind card buffer semantics; see the module doc."""

    kind = "emu"

    def __init__(self, spec: str = "emu") -> None:
        super().__init__(spec)
        self._pool: BufferPool[np.ndarray] = BufferPool(_alloc_device)

    @classmethod
    def probe(cls) -> Probe:
        """Available where C-simulation can build: a C++ compiler and hls4ml's ap_types headers."""
        try:
            built_with = csim.toolchain()
        except csim.ToolchainMissing as e:
            return Probe("emu", False, (), str(e))
        return Probe("emu", True, ("emu",), f"HLS C++ built with {built_with}")

    def _upload(self, loaded: Loaded, resident: dict[str, np.ndarray]) -> _EmuKernel:
        top = load_top(loaded.kernel.spec)
        return _EmuKernel(top, {k: np.array(v, copy=True) for k, v in resident.items()}, threading.Lock())

    def _execute(self, loaded: Loaded, values: dict[str, Any], timeout: float | None) -> dict[str, np.ndarray]:
        state: _EmuKernel = loaded.state

        def call() -> dict[str, np.ndarray]:
            taken = []
            try:
                call_args: list[Any] = []
                outs: list[tuple[str, np.ndarray, np.ndarray]] = []
                for a in loaded.args:
                    if a.role == "resident":
                        call_args.append(state.resident[a.name])
                    elif a.role == "scalar":
                        call_args.append(values[a.name])
                    else:
                        host = values[a.name]
                        key, raw = self._pool.acquire(a.bundle, host.nbytes)
                        taken.append((key, raw))
                        dev = raw[: host.nbytes].view(host.dtype).reshape(host.shape)
                        # Outputs are synced too: the contract hands them over as zero arrays.
                        np.copyto(dev, host)
                        call_args.append(dev)
                        if a.role == "output":
                            outs.append((a.name, host, dev))
                with state.lock:
                    state.top(call_args)
                return {name: dev.copy() for name, _host, dev in outs}
            finally:
                for key, raw in taken:
                    self._pool.release(key, raw)

        return self._with_timeout(call, timeout, f"kernel {loaded.kernel.name!r} ({loaded.top})")

    def _details(self) -> dict[str, Any]:
        return {"buffer_allocations": self._pool.allocations}

    def _description(self) -> str:
        return "HLS C++ built with g++, card buffer semantics (software emulation)"

    def _shutdown(self) -> None:
        self._pool.close()
