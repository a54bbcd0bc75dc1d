"""The ``pynq`` device: an Alveo card through PYNQ 3.0 (``pynq.Overlay`` on an xclbin).

Specs: ``"pynq"`` / ``"pynq:0"`` (index into ``pynq.Device.devices``). PYNQ is imported lazily.
Supported: PYNQ 3.0.x over XRT 2.12 .. 2.16 (install ``offload[pynq]``, which pins
``pynq>=3.0,<3.1``): in PYNQ 3.1 ``XrtDevice._probe_`` returns ``[]`` ("XrtDevice has been
deprecated"), so no PCIe card is ever found, and PYNQ 3.0 needs the ``xclProbe`` API that XRT
dropped after 2.16. As with ``xrt``, kernels run from the bundle's xclbin:

- ``pynq.Overlay(xclbin, device=dev)``; compute units are ``ol.ip_dict`` entries (``top_1``, ...),
  used round-robin; each pointer argument's bank is ``ip_dict[cu]["registers"][arg]["memory"]``,
  the overlay attribute of a bank its tag with every character outside ``[A-Za-z0-9_]`` removed
  (``HBM[0]`` -> ``HBM0``, ``bank0`` stays) as ``overlay.py`` builds ``memories``;
- buffers come from ``pynq.allocate(shape, dtype, target=<bank of that argument>)``, synced with
  ``buf.sync_to_device()`` / ``buf.sync_from_device()`` (slices sync only what a call uses) and
  released with ``buf.freebuffer()``;
- a call is ``ip.start(*args)``, arguments in the top function's order, then the wait handle is
  serviced here (see below).

PYNQ 3.0.1 warts handled here (Xilinx/PYNQ ``pynq/pl_server/xrt_device.py``, ``xclbin_parser.py``):

- ``ErtWaitHandle.wait()`` never raises: a failed command ("Execution failed: 5") is stored in
  the handle's future, so the future is read after completion and a failure raises DeviceError;
- ``execute_bo`` and ``_handle_events`` update ``active_bos`` without a lock, so concurrent calls
  can lose a completion and spin forever: starts and event servicing are serialised per card,
  and the wait polls ``_handle_events`` in short slices against the call's deadline;
- an argument connected to ``HBM[a:b]`` is given only the last channel (``memory[-1]``): a
  resident buffer larger than that channel is refused at load with an error saying so.

Example::

    dev = open_device("pynq:0")
    handles = dev.load_bundle(offload.load("model.offload"))
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from offload.host._buffered import BufferedDevice, Loaded, next_live_cu
from offload.host._pool import BufferPool
from offload.host.bundle import xclbin_uuid
from offload.host.device import DeviceError, DeviceTimeout, Probe, register_device
from offload.host.xrt import xrt_version

__all__ = ["PynqDevice", "import_pynq", "PYNQ_RANGE"]

PYNQ_RANGE = ">=3.0,<3.1"
MAX_XRT = (2, 16)  # PYNQ 3.0 calls xclProbe, which XRT dropped after 2.16
_FIX = f"install it with `pip install 'offload[pynq]'` (pynq{PYNQ_RANGE}: PYNQ 3.0.x drives PCIe Alveo cards with XRT 2.12 .. 2.16)"
_POLL_MS = 1  # one _handle_events slice: the card lock is held at most this long per slice

# One lock per PYNQ card object: every PynqDevice opened on it shares PYNQ's unlocked active_bos.
_ERT_LOCKS: dict[int, threading.Lock] = {}
_ERT_LOCKS_GUARD = threading.Lock()


def _ert_lock(card: Any) -> threading.Lock:
    with _ERT_LOCKS_GUARD:
        return _ERT_LOCKS.setdefault(id(card), threading.Lock())


def import_pynq():
    """``import pynq`` with an error naming the fix."""
    try:
        import pynq  # type: ignore[import-not-found]
    except ImportError as e:
        raise DeviceError(f"the pynq device needs PYNQ: {_FIX}") from e
    return pynq


def _major_minor(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:2])


def pynq_too_new(version: str) -> bool:
    """PYNQ 3.1 and later probe no PCIe card (``XrtDevice._probe_`` returns ``[]`` at v3.1)."""
    nums = _major_minor(version)
    return len(nums) == 2 and nums >= (3, 1)


def sanitized(tag: str) -> str:
    """The overlay attribute of memory ``tag`` (overlay.py v3.0.1: ``re.sub("[^A-Za-z0-9_]", "", k)``)."""
    return re.sub("[^A-Za-z0-9_]", "", tag)


@dataclass
class _PynqCu:
    name: str
    ip: Any  # the overlay's driver for this compute unit
    targets: dict[int, Any]  # arg index -> pynq memory target (None: PYNQ's default bank)
    resident: dict[int, Any]  # arg index -> pynq buffer
    hung: bool = False  # a command on it outlived its deadline


@dataclass
class _PynqKernel:
    cus: list[_PynqCu]
    next_cu: Any
    lock: threading.Lock


@register_device("pynq")
class PynqDevice(BufferedDevice):
    """An Alveo card through PYNQ 3.0; see the module doc."""

    kind = "pynq"
    launch_modes = ("per_call",)
    # open_device(spec, launch="persistent") is refused with this reason (host.device.open_device).
    launch_why = ("PYNQ 3.0 allocates card-memory buffers only (pynq/pl_server/xrt_device.py allocate_bo: "
                  "XCL_BO_DEVICE_RAM, no host_only flag), so no ring in host memory, and this backend does not drive the "
                  "card-memory ring through PYNQ's wait handles; open the same card and xclbin as "
                  "open_device('xrt:0', launch='persistent')")

    def __init__(self, spec: str = "pynq") -> None:
        super().__init__(spec)
        self._pynq = pynq = import_pynq()
        index = spec.split(":", 1)[1] if ":" in spec else "0"
        if not index.isdigit():
            raise ValueError(f"device {spec!r}: the pynq backend takes a card index (pynq:0), got {index!r}")
        version = str(getattr(pynq, "__version__", "?"))
        if pynq_too_new(version):
            raise DeviceError(f"device {spec!r}: PYNQ {version} no longer probes PCIe Alveo cards (XrtDevice is deprecated from 3.1); {_FIX}")
        devices = list(pynq.Device.devices)
        if int(index) >= len(devices):
            raise DeviceError(
                f"device {spec!r}: PYNQ found {len(devices)} card(s); PYNQ 3.0 only enumerates Alveo cards with XRT 2.12 .. 2.16 "
                "(see `offload devices`)"
            )
        self._dev = devices[int(index)]
        self._ert = _ert_lock(self._dev)
        self._ol = None
        self._xclbin: Path | None = None
        self._compute_units: dict[str, list[str]] = {}
        self._resident_bufs: list[Any] = []
        self._pool: BufferPool[Any] = BufferPool(self._alloc, free=lambda b: b.freebuffer())

    @classmethod
    def probe(cls) -> Probe:
        """The cards PYNQ enumerates, or why it enumerates none (no PYNQ, a PYNQ or an XRT too new for PCIe cards)."""
        needs = f"PYNQ 3.0.x (pip install 'offload[pynq]', pynq{PYNQ_RANGE}) with XRT 2.12 .. 2.16"
        try:
            import pynq  # type: ignore[import-not-found]
        except ImportError:
            return Probe("pynq", False, (), f"no pynq: needs {needs}")
        version = str(getattr(pynq, "__version__", "?"))
        if pynq_too_new(version):
            return Probe("pynq", False, (), f"PYNQ {version} probes no PCIe card (XrtDevice is deprecated from 3.1); needs {needs}")
        xrt = xrt_version()
        if xrt and _major_minor(xrt) > MAX_XRT:
            return Probe("pynq", False, (), f"XRT {xrt} is too new for PYNQ 3.0 (it needs XRT 2.12 .. 2.16); use the xrt backend")
        try:
            devices, err = list(pynq.Device.devices), ""
        except RuntimeError as e:
            devices, err = [], str(e)
        names = tuple(f"pynq:{i} {getattr(d, 'name', d)}" for i, d in enumerate(devices))
        found = f"{len(names)} card(s)" if names else f"no card enumerated{': ' + err if err else ''}"
        return Probe("pynq", bool(names), names, f"PYNQ {version}; {found}")

    def load_xclbin(self, path: str | os.PathLike, expected_uuid: str | None = None, compute_units: Mapping[str, list[str]] | None = None) -> None:
        """Program the card with ``path`` through ``pynq.Overlay``; checks the UUID when one is expected."""
        if expected_uuid:
            found = xclbin_uuid(path)
            if found is None or found.lower() != expected_uuid.lower():
                raise DeviceError(f"xclbin {path}: UUID {found} does not match the bundle's recorded UUID {expected_uuid}")
        with self._lock:
            try:
                self._ol = self._pynq.Overlay(str(path), device=self._dev)
            except (RuntimeError, OSError, ValueError) as e:
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
        try:
            return getattr(self._ol, sanitized(tag))
        except AttributeError:
            raise DeviceError(f"xclbin {self._xclbin}: PYNQ exposes no memory {tag!r} (overlay memories: {sorted(self._ol.mem_dict)})") from None

    def _alloc(self, target: Any, size: int) -> Any:
        return self._pynq.allocate((size,), np.uint8, target=target)

    def _check_fits(self, loaded: Loaded, cu: str, name: str, reg: Mapping[str, Any], nbytes: int) -> None:
        tag = reg.get("memory")
        if not tag or tag not in self._ol.mem_dict:
            return
        size = int(self._ol.mem_dict[tag].get("size", 0))
        if nbytes <= size:
            return
        banks = reg.get("MBG") or [tag]
        if len(banks) > 1:
            raise DeviceError(
                f"kernel {loaded.kernel.name!r} ({cu}): resident {name!r} ({nbytes} B) is connected to {banks[0]}..{banks[-1]}, "
                f"but PYNQ 3.0 allocates it only in the last of them, {tag} ({size} B): its xclbin parser keeps one bank per "
                "argument. Use the xrt backend (`--device xrt:0`) for tables larger than one pseudo-channel"
            )
        raise DeviceError(f"kernel {loaded.kernel.name!r} ({cu}): resident {name!r} ({nbytes} B) does not fit its bank {tag} ({size} B)")

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
        for cu in names:  # refuse before allocating anything
            regs = ip_dict[cu].get("registers", {})
            for a in loaded.args:
                if a.role == "resident":
                    self._check_fits(loaded, cu, a.name, regs.get(a.name, {}), resident[a.name].nbytes)
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
        cu: _PynqCu = next_live_cu(loaded, self.name)
        what = f"kernel {loaded.kernel.name!r} (compute unit {cu.name}) on {self.name!r}"
        deadline = None if timeout is None else time.monotonic() + timeout
        taken = []
        reuse = True
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
            with self._ert:  # execute_bo appends to PYNQ's unlocked active_bos
                wh = cu.ip.start(*args)
            if not self._serve(wh, deadline):
                reuse = False  # the command may still write its buffers
                cu.hung = True
                raise DeviceTimeout(f"{what} did not finish within {timeout:g} s; compute unit {cu.name} is marked hung")
            # ErtWaitHandle._complete stores a failure in the future and wait() never raises it
            # (xrt_device.py v3.0.1); the future is read here, where the failure is known.
            failure = wh._future.exception()
            if failure is not None:
                raise DeviceError(f"{what} failed: {failure}")
            result = {}
            for name, host, buf in outs:
                n = host.nbytes
                if n:
                    buf[:n].sync_from_device()
                result[name] = np.array(buf[:n], dtype=np.uint8, copy=True).view(host.dtype).reshape(host.shape)
            return result
        finally:
            if reuse:
                for key, buf in taken:
                    self._pool.release(key, buf)

    def _serve(self, wh: Any, deadline: float | None) -> bool:
        """Service the card's completions until ``wh`` is done (True) or the deadline passes (False).

        This is ``ErtWaitHandle.wait()`` (``while not done: device._handle_events(1000)``) in 1 ms
        slices, each under the card lock, so no completion is lost and a deadline holds."""
        while True:
            with self._ert:
                if wh.done:
                    return True
                wh.device._handle_events(_POLL_MS)
                if wh.done:
                    return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def _details(self) -> dict[str, Any]:
        return {"card": getattr(self._dev, "name", str(self._dev)), "xclbin": str(self._xclbin) if self._xclbin else None}

    def _description(self) -> str:
        return "Alveo card through PYNQ 3.0"

    def _shutdown(self) -> None:
        self._pool.close()
        for b in self._resident_bufs:
            b.freebuffer()
        self._resident_bufs.clear()
        if self._ol is not None:
            self._ol.free()
