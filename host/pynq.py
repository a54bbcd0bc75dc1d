"""The ``pynq`` device: an Alveo card through PYNQ 3.x (``pynq.Overlay`` on an xclbin).

Specs: ``"pynq"`` / ``"pynq:0"`` (index into ``pynq.Device.devices``). PYNQ is imported lazily;
PYNQ 3.x is the last line that drives PCIe Alveo cards and needs XRT <= 2.16 (install
``offload[pynq]``). As with ``xrt``, kernels run from the bundle's xclbin:

- ``pynq.Overlay(xclbin, device=dev)``; compute units are ``ol.ip_dict`` entries (``top_1``, ...),
  used round-robin; each pointer argument's bank is ``ip_dict[cu]["registers"][arg]["memory"]``;
- buffers come from ``pynq.allocate(shape, dtype, target=<bank of that argument>)``, synced with
  ``buf.sync_to_device()`` / ``buf.sync_from_device()`` (slices sync only what a call uses) and
  released with ``buf.freebuffer()``;
- a call is ``ip.start(*args).wait()``, arguments in the top function's order.

Example::

    dev = open_device("pynq:0")
    handles = dev.load_bundle(offload.load("model.offload"))
"""

from __future__ import annotations

import itertools
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from offload.host._buffered import BufferedDevice, Loaded
from offload.host._pool import BufferPool
from offload.host.device import DeviceError, register_device

__all__ = ["PynqDevice", "import_pynq"]

_FIX = "install it with `pip install 'offload[pynq]'` (PYNQ 3.x; it drives Alveo cards with XRT <= 2.16)"


def import_pynq():
    """``import pynq`` with an error naming the fix."""
    try:
        import pynq  # type: ignore[import-not-found]
    except ImportError as e:
        raise DeviceError(f"the pynq device needs PYNQ: {_FIX}") from e
    return pynq


@dataclass
class _PynqCu:
    name: str
    ip: Any  # the overlay's driver for this compute unit
    targets: dict[int, Any]  # arg index -> pynq memory target (None: PYNQ's default bank)
    resident: dict[int, Any]  # arg index -> pynq buffer


@dataclass
class _PynqKernel:
    cus: list[_PynqCu]
    next_cu: Any
    lock: threading.Lock


@register_device("pynq")
class PynqDevice(BufferedDevice):
    """An Alveo card through PYNQ 3.x; see the module doc."""

    kind = "pynq"

    def __init__(self, spec: str = "pynq") -> None:
        super().__init__(spec)
        self._pynq = pynq = import_pynq()
        index = spec.split(":", 1)[1] if ":" in spec else "0"
        if not index.isdigit():
            raise ValueError(f"device {spec!r}: the pynq backend takes a card index (pynq:0), got {index!r}")
        devices = list(pynq.Device.devices)
        if int(index) >= len(devices):
            raise DeviceError(
                f"device {spec!r}: PYNQ found {len(devices)} card(s); PYNQ 3.x only enumerates Alveo cards with XRT <= 2.16 "
                "(see `offload devices`)"
            )
        self._dev = devices[int(index)]
        self._ol = None
        self._xclbin: Path | None = None
        self._compute_units: dict[str, list[str]] = {}
        self._resident_bufs: list[Any] = []
        self._pool: BufferPool[Any] = BufferPool(self._alloc, free=lambda b: b.freebuffer())

    def load_xclbin(self, path: str | os.PathLike, expected_uuid: str | None = None, compute_units: Mapping[str, list[str]] | None = None) -> None:
        """Program the card with ``path`` through ``pynq.Overlay``; checks the UUID when one is expected."""
        if expected_uuid:
            from offload.host.bundle import xclbin_uuid

            found = xclbin_uuid(path)
            if found is None or found.lower() != expected_uuid.lower():
                raise DeviceError(f"xclbin {path}: UUID {found} does not match the bundle's recorded UUID {expected_uuid}")
        with self._lock:
            try:
                self._ol = self._pynq.Overlay(str(path), device=self._dev)
            except Exception as e:
                raise DeviceError(f"xclbin {path}: PYNQ cannot program {self.name!r} with it: {e}") from e
            self._xclbin = Path(path)
            self._compute_units = {k: list(v) for k, v in (compute_units or {}).items()}

    def load_bundle(self, bundle: Any) -> dict:
        if bundle.xclbin is None:
            raise DeviceError(f"bundle {bundle.name!r} has no xclbin: build it with `offload build BUNDLE --target CARD --vitis` first")
        self.load_xclbin(bundle.xclbin, bundle.xclbin_uuid, bundle.compute_units)
        return super().load_bundle(bundle)

    # -- hooks ----------------------------------------------------------------------------------
    def _target(self, tag: str | None) -> Any:
        if not tag:
            return None
        for cand in (tag, re.sub(r"[\[\]]", "", tag)):
            mem = getattr(self._ol, cand, None)
            if mem is not None:
                return mem
        raise DeviceError(f"xclbin {self._xclbin}: PYNQ exposes no memory {tag!r} (overlay memories: {sorted(getattr(self._ol, 'mem_dict', {}))})")

    def _alloc(self, target: Any, size: int) -> Any:
        return self._pynq.allocate((size,), np.uint8, target=target)

    def _upload(self, loaded: Loaded, resident: dict[str, np.ndarray]) -> _PynqKernel:
        if self._ol is None:
            env = os.environ.get("OFFLOAD_XCLBIN")
            if not env:
                raise DeviceError(f"kernel {loaded.kernel.name!r}: no xclbin is loaded on {self.name!r}; use load_bundle(bundle), load_xclbin(path) or set OFFLOAD_XCLBIN")
            self.load_xclbin(env)
        ip_dict = self._ol.ip_dict
        names = self._compute_units.get(loaded.top) or sorted(
            n for n, d in ip_dict.items() if str(d.get("type", "")).split(":")[2:3] == [loaded.top] or n == loaded.top
        )
        if not names:
            raise DeviceError(f"kernel {loaded.kernel.name!r}: no compute unit of {loaded.top!r} in xclbin {self._xclbin} (IPs: {sorted(ip_dict)})")
        cus = []
        uploaded: dict[tuple[int, Any], Any] = {}  # (arg, bank) -> buffer: CUs on one bank share a table
        for cu in names:
            regs = ip_dict[cu].get("registers", {})
            tags = {i: regs.get(a.name, {}).get("memory") for i, a in enumerate(loaded.args) if a.role != "scalar"}
            targets = {i: self._target(tag) for i, tag in tags.items()}
            bufs = {}
            for i, a in enumerate(loaded.args):
                if a.role != "resident":
                    continue
                if (i, tags[i]) not in uploaded:
                    arr = resident[a.name]
                    buf = self._pynq.allocate(arr.shape, arr.dtype, target=targets[i])
                    buf[...] = arr
                    buf.sync_to_device()
                    self._resident_bufs.append(buf)
                    uploaded[(i, tags[i])] = buf
                bufs[i] = uploaded[(i, tags[i])]
            cus.append(_PynqCu(cu, getattr(self._ol, cu), targets, bufs))
        return _PynqKernel(cus, itertools.cycle(cus), threading.Lock())

    def _execute(self, loaded: Loaded, values: dict[str, Any], timeout: float | None) -> dict[str, np.ndarray]:
        st: _PynqKernel = loaded.state
        with st.lock:
            cu: _PynqCu = next(st.next_cu)

        def call() -> dict[str, np.ndarray]:
            taken = []
            try:
                args: list[Any] = []
                outs = []
                for i, a in enumerate(loaded.args):
                    if a.role == "resident":
                        args.append(cu.resident[i])
                    elif a.role == "scalar":
                        args.append(values[a.name])
                    else:
                        host = values[a.name]
                        key, buf = self._pool.acquire(cu.targets[i], host.nbytes)
                        taken.append((key, buf))
                        n = host.nbytes
                        buf[:n] = host.reshape(-1).view(np.uint8)
                        if n:
                            buf[:n].sync_to_device()  # outputs too: the kind hands them over as zeros
                        args.append(buf)
                        if a.role == "output":
                            outs.append((a.name, host, buf))
                try:
                    cu.ip.start(*args).wait()
                except RuntimeError as e:  # PYNQ reports a failed command this way
                    raise DeviceError(f"kernel {loaded.kernel.name!r} (compute unit {cu.name}) on {self.name!r} failed: {e}") from e
                result = {}
                for name, host, buf in outs:
                    n = host.nbytes
                    if n:
                        buf[:n].sync_from_device()
                    result[name] = np.array(buf[:n], dtype=np.uint8, copy=True).view(host.dtype).reshape(host.shape)
                return result
            finally:
                for key, buf in taken:
                    self._pool.release(key, buf)

        return self._with_timeout(call, timeout, f"kernel {loaded.kernel.name!r} (compute unit {cu.name})")

    def _details(self) -> dict[str, Any]:
        return {"card": getattr(self._dev, "name", str(self._dev)), "xclbin": str(self._xclbin) if self._xclbin else None}

    def _description(self) -> str:
        return "Alveo card through PYNQ 3.x"

    def _shutdown(self) -> None:
        self._pool.close()
        for b in self._resident_bufs:
            b.freebuffer()
        self._resident_bufs.clear()
        if self._ol is not None and hasattr(self._ol, "free"):
            self._ol.free()
