"""The ``xrt`` device: an Alveo card through XRT's Python binding, ``pyxrt``, as its source defines it.

Specs: ``"xrt"`` / ``"xrt:0"`` (device index) or ``"xrt:0000:3b:00.1"`` (PCIe BDF). Kernels run
from an xclbin: :meth:`XrtDevice.load_bundle` loads the bundle's xclbin (its UUID checked
against the one the bundle recorded) and then every kernel; :meth:`XrtDevice.load_xclbin` does
the first step by hand. ``$OFFLOAD_XCLBIN`` names an xclbin to load when a bare kernel is loaded.

Supported XRT: 2.12 and later (older pyxrt lacks ``device(bdf)``, ``xclbin.get_kernels`` and
``xrt_info_device``, and is refused). What differs by release, from Xilinx/XRT
``src/python/pybind11/src/pyxrt.cpp`` at each tag:

- from 2.16 the xclbin is registered and a ``hw_context`` opened on it, kernels come from
  ``kernel(hw_context, name)``; before, ``device.load_xclbin`` and ``kernel(device, uuid, name,
  mode)`` (deprecated shims from 2.23, one hardware context per kernel);
- ``enumerate_devices`` exists from 2.17; before, cards are counted by opening ``device(i)``.

Per kernel, one ``pyxrt.kernel`` per compute unit (``"top:{top_1}"``); resident tensors are
written once to buffer objects in each argument's memory bank (``kernel.group_id(i)``), shared by
the compute units wired to the same bank. A call takes per-call buffer objects from a pool (reused
by bank and size), writes and syncs them, starts the next healthy compute unit round-robin, then
polls ``run.state()`` against a deadline and syncs the outputs back.

Why polling: pyxrt's ``run.wait``, ``bo.sync`` and ``kernel(...)`` hold the GIL (pyxrt.cpp up to
2.23 releases it only in constructors), so one ``wait()`` stalls every Python thread, the serving
event loop included, for a whole kernel run; xrt_kernel.h warns that ``wait(timeout)`` can miss
its timeout while other runs keep completing; and ``run.abort`` is not bound. A run still going at
its deadline raises :class:`DeviceTimeout`; its compute unit is marked hung and skipped, and when
a kernel has no healthy compute unit left the device is reopened and its kernels reloaded.

pyxrt swallows a failed ``set_arg`` (a float or a scalar outside int32 is left unset; a buffer in
the wrong bank is cloned, so what the kernel writes there is lost), so every argument is checked
here before the call.

Example::

    dev = open_device("xrt:0")
    handles = dev.load_bundle(offload.load("model.offload"))
    out = dev.run(handles["emb0"], {"indices": idx, "offsets": off}, timeout=1.0)
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from offload.host._buffered import BufferedDevice, Loaded, next_live_cu
from offload.host._pool import BufferPool
from offload.host.device import DeviceError, DeviceTimeout, Probe, register_device
from offload.sim.errors import InputError

__all__ = ["XrtDevice", "XrtApi", "import_pyxrt", "pyxrt_import_problem", "xrt_api", "count_devices", "xrt_version", "MIN_XRT"]

_MIN_BO = 64  # XRT refuses zero-byte buffer objects
MIN_XRT = "2.12"
_MAX_PROBE = 64  # cards counted by opening device(i) on XRT < 2.17
_INT32 = (-(2**31), 2**31 - 1)
# ert_cmd_state values after which a command no longer runs (include/ert.h; RUNNING is not bound).
_TERMINAL = ("ERT_CMD_STATE_COMPLETED", "ERT_CMD_STATE_ERROR", "ERT_CMD_STATE_ABORT", "ERT_CMD_STATE_TIMEOUT",
             "ERT_CMD_STATE_NORESPONSE", "ERT_CMD_STATE_SKERROR", "ERT_CMD_STATE_SKCRASHED")
_POLL_FIRST_S = 20e-6  # first nap between run.state() polls; doubles up to _POLL_MAX_S
_POLL_MAX_S = 1e-3


def pyxrt_import_problem(e: ImportError) -> str:
    """Why ``import pyxrt`` failed, and the fix: not installed, or built for another Python."""
    if isinstance(e, ModuleNotFoundError) and e.name == "pyxrt":
        return "no pyxrt: install XRT (https://xilinx.github.io/XRT) and `source /opt/xilinx/xrt/setup.sh` so that pyxrt is on PYTHONPATH"
    # XRT builds pyxrt against its distribution's system Python; any other interpreter gets a
    # pybind11 "Python version mismatch" or an undefined-symbol ImportError here.
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (
        f"pyxrt is installed but Python {py} cannot import it ({e}): XRT builds pyxrt for the system Python of its "
        "distribution; run offload in a virtual environment made from that interpreter (e.g. /usr/bin/python3 -m venv)"
    )


def import_pyxrt():
    """``import pyxrt`` with an error that says how to get it (or why it cannot be imported)."""
    try:
        import pyxrt  # type: ignore[import-not-found]
    except ImportError as e:
        raise DeviceError(f"the xrt device needs XRT's Python binding `pyxrt`: {pyxrt_import_problem(e)}") from e
    return pyxrt


@dataclass(frozen=True)
class XrtApi:
    """What the imported pyxrt binds, told apart by the names pyxrt.cpp adds at each XRT tag."""

    hw_context: bool  # pyxrt.hw_context, device.register_xclbin, kernel(hw_context, name): 2.16+
    enumerate_devices: bool  # pyxrt.enumerate_devices: 2.17+


def xrt_api(pyxrt: Any) -> XrtApi:
    """The features of ``pyxrt``; refuses XRT older than :data:`MIN_XRT`.

    pyxrt has no version attribute, so the release is read from what it binds: ``xrt_info_device``
    and ``xclbin.get_kernels`` appear in 2.12 (pyxrt.cpp at 202120.2.12.427), with ``device(bdf)``.
    """
    if not (hasattr(pyxrt, "xrt_info_device") and hasattr(pyxrt.xclbin, "get_kernels")):
        raise DeviceError(
            f"this pyxrt is from XRT older than {MIN_XRT} (it has no xrt_info_device / xclbin.get_kernels); "
            f"offload needs XRT {MIN_XRT} or later: update XRT (https://xilinx.github.io/XRT)"
        )
    return XrtApi(hw_context=hasattr(pyxrt, "hw_context"), enumerate_devices=hasattr(pyxrt, "enumerate_devices"))


def count_devices(pyxrt: Any, api: XrtApi) -> int:
    """Cards XRT sees: ``enumerate_devices()`` (2.17+), else ``device(i)`` opened until it raises."""
    if api.enumerate_devices:
        return int(pyxrt.enumerate_devices())
    n = 0
    while n < _MAX_PROBE:
        try:
            pyxrt.device(n)
        except RuntimeError:  # "Could not open device with index" (xrt::device(unsigned int))
            break
        n += 1
    return n


def xrt_version() -> str | None:
    """The installed XRT's version, or None when nothing says: a version attribute of pyxrt where
    it has one, else ``$XILINX_XRT/version.json`` (XRT's setup.sh sets XILINX_XRT), else ``xbutil --version``."""
    try:
        import pyxrt  # type: ignore[import-not-found]
    except ImportError:
        pyxrt = None
    v = getattr(pyxrt, "__version__", None) or getattr(pyxrt, "version", None)
    if isinstance(v, str) and v:
        return v
    home = os.environ.get("XILINX_XRT")
    if home:
        try:
            d = json.loads((Path(home) / "version.json").read_text())
        except (OSError, ValueError):
            d = {}
        v = d.get("BUILD_VERSION") or d.get("version") if isinstance(d, dict) else None
        if v:
            return str(v)
    xbutil = shutil.which("xbutil")
    if xbutil:
        try:
            out = subprocess.run([xbutil, "--version"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        m = re.search(r"Version\s*:\s*([0-9][0-9.]*)", out)
        if m:
            return m.group(1)
    return None


@dataclass
class _Cu:
    name: str
    kernel: Any  # pyxrt.kernel bound to this compute unit
    resident: dict[int, Any]  # arg index -> pyxrt.bo
    groups: dict[int, int]  # arg index -> memory bank group id
    hung: bool = False  # a run on it outlived its deadline: never started again on this device


@dataclass
class _XrtKernel:
    cus: list[_Cu]
    next_cu: Any  # itertools.cycle over cus
    lock: threading.Lock
    resident: dict[str, np.ndarray] = field(default_factory=dict)  # kept to reload after a reopen


@register_device("xrt")
class XrtDevice(BufferedDevice):
    """An Alveo card through pyxrt; see the module doc."""

    kind = "xrt"

    def __init__(self, spec: str = "xrt") -> None:
        super().__init__(spec)
        self._pyxrt = import_pyxrt()
        self._api = xrt_api(self._pyxrt)
        self._target = spec.split(":", 1)[1] if ":" in spec else "0"
        self._dev = self._open()
        self._xb: Any = None  # the pyxrt.xclbin programmed
        self._ctx: Any = None  # its hw_context (XRT 2.16+)
        self._uuid: Any = None  # its pyxrt.uuid (XRT < 2.16: kernels are opened with it)
        self._xclbin: Path | None = None
        self._xclbin_kernels: list[str] = []
        self._compute_units: dict[str, list[str]] = {}
        self._pool: BufferPool[Any] = BufferPool(self._alloc_bo)
        self.reopens = 0

    @classmethod
    def probe(cls) -> Probe:
        """The cards XRT sees (index, PCIe BDF, platform name) and XRT's version, or why there are none."""
        try:
            import pyxrt  # type: ignore[import-not-found]
        except ImportError as e:
            return Probe("xrt", False, (), pyxrt_import_problem(e))
        cards, err = [], ""
        try:
            n = count_devices(pyxrt, xrt_api(pyxrt))  # enumerate_devices only from XRT 2.17
        except (RuntimeError, DeviceError) as e:  # DeviceError: XRT older than 2.12
            n, err = 0, str(e)
        for i in range(n):
            try:
                d = pyxrt.device(i)
                cards.append(f"xrt:{i} {d.get_info(pyxrt.xrt_info_device.bdf)} {d.get_info(pyxrt.xrt_info_device.name)}")
            except RuntimeError as e:
                cards.append(f"xrt:{i} (cannot open: {e})")
        found = f"{len(cards)} card(s)" if cards else (
            f"no card found{': ' + err if err else ''} (is the card flashed and the xocl driver loaded? `xbutil examine`)")
        return Probe("xrt", bool(cards), tuple(cards), f"XRT {xrt_version() or 'version unknown'}; {found}")

    def _open(self) -> Any:
        t = self._target
        try:
            return self._pyxrt.device(int(t)) if t.isdigit() else self._pyxrt.device(t)
        except (RuntimeError, TypeError) as e:  # pyxrt raises RuntimeError for a missing card
            raise DeviceError(f"device {self.name!r}: XRT cannot open card {t!r}: {e}") from e

    # -- xclbin ---------------------------------------------------------------------------------
    def load_xclbin(self, path: str | os.PathLike, expected_uuid: str | None = None, compute_units: Mapping[str, list[str]] | None = None) -> str:
        """Program the card with ``path``; refuses an xclbin whose UUID differs from ``expected_uuid``."""
        pyxrt = self._pyxrt
        try:
            xb = pyxrt.xclbin(str(path))
        except RuntimeError as e:  # pyxrt raises RuntimeError for an unreadable file
            raise DeviceError(f"xclbin {path}: XRT cannot read it: {e}") from e
        found = xb.get_uuid().to_string()
        if expected_uuid and found.lower() != expected_uuid.lower():
            raise DeviceError(f"xclbin {path}: UUID {found} does not match the bundle's recorded UUID {expected_uuid}; rebuild or re-record the bundle")
        with self._lock:
            try:
                self._program(xb)
            except RuntimeError as e:
                raise DeviceError(f"xclbin {path}: XRT cannot program {self.name!r} with it: {e}") from e
            self._xclbin = Path(path)
            self._xclbin_kernels = [k.get_name() for k in xb.get_kernels()]
            self._compute_units = {k: list(v) for k, v in (compute_units or {}).items()}
        return found

    def _program(self, xb: Any) -> None:
        if self._api.hw_context:
            # register_xclbin + hw_context (pyxrt.cpp 2.16+): device.load_xclbin is a deprecated
            # shim from 2.23 that opens a hardware context per kernel.
            self._ctx = self._pyxrt.hw_context(self._dev, self._dev.register_xclbin(xb))
        else:
            self._uuid = self._dev.load_xclbin(xb)
        self._xb = xb

    def _open_kernel(self, name: str) -> Any:
        pyxrt = self._pyxrt
        if self._ctx is not None:
            return pyxrt.kernel(self._ctx, name)
        # The mode argument is required before 2.16 (pyxrt.cpp 202120.2.12.427).
        return pyxrt.kernel(self._dev, self._uuid, name, pyxrt.kernel.cu_access_mode.shared)

    def load_bundle(self, bundle: Any) -> dict:
        if bundle.xclbin is None:
            raise DeviceError(f"bundle {bundle.name!r} has no xclbin: build it with `offload build BUNDLE --target CARD --vitis` first")
        self.load_xclbin(bundle.xclbin, bundle.xclbin_uuid, bundle.compute_units)
        return super().load_bundle(bundle)

    # -- hooks ----------------------------------------------------------------------------------
    def _alloc_bo(self, group: Any, size: int) -> Any:
        return self._pyxrt.bo(self._dev, size, self._pyxrt.bo.normal, group)

    def _upload(self, loaded: Loaded, resident: dict[str, np.ndarray]) -> _XrtKernel:
        for a in loaded.args:
            dt = np.dtype(a.dtype)
            # kernel(...) passes a scalar through set_arg<int> only (pyxrt.cpp __call__): anything
            # else would be silently left unset, so refuse the kernel here.
            if a.role == "scalar" and not (dt.kind in "iu" and dt.itemsize <= 4):
                raise DeviceError(
                    f"kernel {loaded.kernel.name!r}: scalar argument {a.name!r} is {dt}; pyxrt can only pass scalars that fit a C int (int8..int32, uint8..uint32)"
                )
        if self._xb is None:
            env = os.environ.get("OFFLOAD_XCLBIN")
            if not env:
                raise DeviceError(
                    f"kernel {loaded.kernel.name!r}: no xclbin is loaded on {self.name!r}; use load_bundle(bundle), "
                    "load_xclbin(path) or set OFFLOAD_XCLBIN"
                )
            self.load_xclbin(env)
        if self._xclbin_kernels and loaded.top not in self._xclbin_kernels:
            raise DeviceError(f"kernel {loaded.kernel.name!r}: top function {loaded.top!r} is not in xclbin {self._xclbin} (it holds {self._xclbin_kernels})")
        return self._upload_cus(loaded, resident)

    def _upload_cus(self, loaded: Loaded, resident: dict[str, np.ndarray]) -> _XrtKernel:
        pyxrt = self._pyxrt
        sync_to = pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE
        names = self._compute_units.get(loaded.top) or [None]
        cus = []
        uploaded: dict[tuple[int, int], Any] = {}  # (arg, bank) -> bo: CUs on the same bank share a table
        for cu in names:
            k = self._open_kernel(loaded.top if cu is None else f"{loaded.top}:{{{cu}}}")
            groups = {i: k.group_id(i) for i, a in enumerate(loaded.args) if a.role != "scalar"}
            bos = {}
            for i, a in enumerate(loaded.args):
                if a.role != "resident":
                    continue
                if (i, groups[i]) not in uploaded:
                    arr = resident[a.name]
                    bo = pyxrt.bo(self._dev, max(arr.nbytes, _MIN_BO), pyxrt.bo.normal, groups[i])
                    if arr.nbytes:
                        bo.write(arr.reshape(-1).view(np.uint8), 0)
                        bo.sync(sync_to, arr.nbytes, 0)  # (dir) alone only from 2.16
                    uploaded[(i, groups[i])] = bo
                bos[i] = uploaded[(i, groups[i])]
            cus.append(_Cu(cu or loaded.top, k, bos, groups))
        return _XrtKernel(cus, itertools.cycle(cus), threading.Lock(), dict(resident))

    def _scalar(self, loaded: Loaded, name: str, v: Any) -> int:
        if not (isinstance(v, (int, np.integer)) and _INT32[0] <= int(v) <= _INT32[1]):
            raise InputError(f"kernel {loaded.kernel.name!r}: scalar {name!r}={v!r} must be an int in [{_INT32[0]}, {_INT32[1]}] (pyxrt passes a C int)")
        return int(v)

    def _execute(self, loaded: Loaded, values: dict[str, Any], timeout: float | None) -> dict[str, np.ndarray]:
        pyxrt = self._pyxrt
        sync_dir = pyxrt.xclBOSyncDirection
        scalars = {a.name: self._scalar(loaded, a.name, values[a.name]) for a in loaded.args if a.role == "scalar"}
        cu: _Cu = next_live_cu(loaded, self.name)
        pool = self._pool
        taken = []
        reuse = True
        try:
            call_args: list[Any] = []
            outs: list[tuple[str, np.ndarray, Any]] = []
            for i, a in enumerate(loaded.args):
                if a.role == "resident":
                    call_args.append(cu.resident[i])
                elif a.role == "scalar":
                    call_args.append(scalars[a.name])
                else:
                    host = values[a.name]
                    key, bo = pool.acquire(cu.groups[i], host.nbytes)
                    taken.append((key, bo))
                    # Outputs are written too: the kind hands them over as zero arrays.
                    if host.nbytes:
                        bo.write(host.reshape(-1).view(np.uint8), 0)
                        bo.sync(sync_dir.XCL_BO_SYNC_BO_TO_DEVICE, host.nbytes, 0)
                    call_args.append(bo)
                    if a.role == "output":
                        outs.append((a.name, host, bo))
            what = f"kernel {loaded.kernel.name!r} (compute unit {cu.name}) on {self.name!r}"
            try:
                run = cu.kernel(*call_args)
            except RuntimeError as e:  # XRT refuses the start (lost card)
                raise DeviceError(f"{what}: XRT cannot start it: {e}") from e
            state = self._wait(run, timeout)
            if state is None:
                # Still running at the deadline: it may write its buffers any time, and pyxrt cannot abort it.
                reuse = False
                late = f"{what} did not complete within {timeout:g} s; compute unit {cu.name} is marked hung"
                try:
                    self._mark_hung(loaded, cu)
                except DeviceError as e:
                    raise DeviceTimeout(f"{late}, and reopening the device failed: {e}") from e
                raise DeviceTimeout(late)
            # The scheduler's own timeout: the run may still be writing its buffers.
            reuse = state != pyxrt.ert_cmd_state.ERT_CMD_STATE_TIMEOUT
            if state != pyxrt.ert_cmd_state.ERT_CMD_STATE_COMPLETED:
                if not reuse:
                    raise DeviceTimeout(f"{what} did not complete within the scheduler's timeout: {state.name}")
                raise DeviceError(f"{what} ended in state {state.name}")
            result = {}
            for name, host, bo in outs:
                bo.sync(sync_dir.XCL_BO_SYNC_BO_FROM_DEVICE, host.nbytes, 0)
                raw = np.array(bo.read(host.nbytes, 0), copy=True)  # pyxrt returns int8 bytes
                result[name] = raw.view(np.uint8).view(host.dtype).reshape(host.shape)
            return result
        finally:
            if reuse and pool is self._pool:  # a reopen replaced the pool: these bos belong to the old device
                for key, bo in taken:
                    pool.release(key, bo)

    def _wait(self, run: Any, timeout: float | None) -> Any:
        """The run's final state, or ``None`` if it still runs at the deadline.

        Polls ``run.state()`` with sleeps (which release the GIL) instead of ``run.wait``, which
        holds it; see the module doc."""
        terminal = tuple(getattr(self._pyxrt.ert_cmd_state, n) for n in _TERMINAL)
        deadline = None if timeout is None else time.monotonic() + timeout
        nap = _POLL_FIRST_S
        while True:
            state = run.state()
            if state in terminal:
                return state
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            time.sleep(nap if deadline is None else min(nap, deadline - now))
            nap = min(2 * nap, _POLL_MAX_S)

    def _mark_hung(self, loaded: Loaded, cu: _Cu) -> None:
        st: _XrtKernel = loaded.state
        with st.lock:
            cu.hung = True
            healthy = any(not c.hung for c in st.cus)
        if not healthy:
            self._reopen()

    def _reopen(self) -> None:
        """A fresh device handle, the xclbin programmed again and every kernel reloaded: the only way
        pyxrt offers past a compute unit that never finishes (``run.abort`` is not bound)."""
        with self._lock:
            old_pool = self._pool
            self._dev = self._open()
            self._ctx = self._uuid = None
            self._pool = BufferPool(self._alloc_bo)
            try:
                self._program(self._xb)
            except RuntimeError as e:
                raise DeviceError(f"device {self.name!r}: reprogramming after a hung compute unit failed: {e}; reset the card (`xbutil reset`)") from e
            for lo in self._loaded:
                lo.state = self._upload_cus(lo, lo.state.resident)
            self.reopens += 1
        old_pool.close()

    def _details(self) -> dict[str, Any]:
        d: dict[str, Any] = {"xclbin": str(self._xclbin) if self._xclbin else None, "buffer_allocations": self._pool.allocations, "reopens": self.reopens}
        info = self._pyxrt.xrt_info_device
        for key in ("name", "bdf"):
            try:
                d[key] = self._dev.get_info(getattr(info, key))
            except RuntimeError:  # a key the driver cannot answer
                pass
        return d

    def _description(self) -> str:
        return "Alveo card through XRT (pyxrt)"

    def _shutdown(self) -> None:
        self._pool.close()
