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

Launch modes. ``open_device("xrt:0")`` starts one ``xrt::run`` per call (``launch="per_call"``, the
default). ``open_device("xrt:0", launch="persistent")`` starts each kernel's persistent top
(``<top>_ring``, :mod:`offload.hls.persistent`: a ``while`` loop with a stop word) once, at load,
with one ordinary ``xrt::run``, and then talks to it only through its ring
(:mod:`offload.kernels.ring`, whose memory-ordering contract this follows):

- the ring is a ``host_only`` buffer where the xclbin connects the ring port to ``HOST[0]`` (the
  xclbin's ``get_mems`` tag of ``kernel.group_id(0)``; :func:`offload.hls.cards.ring_memory` says
  which platforms can), else an ordinary buffer in card memory;
- a call writes its slot with plain stores, syncs it to the card, stores the request number into
  the slot's request word with release semantics and syncs that line: on a card-memory ring the
  request word, reaching card memory by DMA after the inputs, is the doorbell the loop polls. No
  register doorbell: pyxrt binds ``kernel.read_register``/``write_register`` only in XRT 2.11
  (pyxrt.cpp at 202110.2.11.634) and ``xrt::ip`` in no release;
- it then waits for the slot's response word to hold its own number: on a host-memory ring it
  spins on the word (acquire loads, GIL released) for ``SPIN_S``, then backs off; each later
  look syncs the word's line from the card first (a cache invalidate on host memory, which XRT's
  xrt_bo.cpp asks for "just in case the HW changes"; a DMA on card memory). The outputs are
  synced back and copied only after the word matched.
- Syncs of a ``host_only`` buffer move nothing on Alveo (xrt_bo.cpp ``bo_impl::sync``), so the
  host-memory ring costs no DMA and no ``xrt::run`` per call.

Nothing waits forever: every call has a deadline (``timeout``, else ``PERSISTENT_TIMEOUT_S``).
A request not answered by then raises :class:`DeviceTimeout`; its ring is abandoned (its
numbers are never reused, so a late answer lands in a ring no one reads, never in another
request's result), the other requests waiting on it fail with :class:`DeviceError`, the
persistent compute unit is marked hung, and with none left the device is reopened, as for
per-call runs. A request larger than a slot runs per call when the xclbin also holds the
per-call top, else it is refused naming the field and the limit. ``close`` drains: it admits no
new request, waits for those in flight, then stores the stop word and waits (bounded) for the
loop's run to complete. Each ring has the size its persistent top was compiled for: the one the
bundle recorded for that kernel (``Bundle.rings``; the defaults of :mod:`offload.hls.persistent`
when unrecorded), and a device opened with another ``ring_slots``/``ring_rows`` refuses the
bundle with a :class:`BundleError` naming both. Persistence is refused with :class:`UnsupportedError` naming the reason
where it cannot work: a pyxrt without host-only buffers, ``map`` or ``xclbin.get_mems``, no C++
compiler for the ring's acquire/release helpers, an xclbin without the persistent top; host
memory not reserved for a ring the xclbin put there is a :class:`DeviceError` at load that says
how to reserve it.

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

from offload.hls import persistent
from offload.host._buffered import BufferedDevice, Loaded, next_live_cu
from offload.host._pool import BufferPool
from offload.host.device import LAUNCH_MODES, DeviceError, DeviceTimeout, Probe, register_device
from offload.kernels.ring import HDR_STOP, LINE, SLOT_REQ_SEQ, STOP, RingLayout
from offload.sim.errors import InputError, UnsupportedError

__all__ = ["XrtDevice", "XrtApi", "import_pyxrt", "pyxrt_import_problem", "xrt_api", "count_devices", "xrt_version",
           "persistent_problem", "MIN_XRT", "PERSISTENT_TIMEOUT_S", "SPIN_S"]

_MIN_BO = 64  # XRT refuses zero-byte buffer objects
MIN_XRT = "2.12"
_MAX_PROBE = 64  # cards counted by opening device(i) on XRT < 2.17
_INT32 = (-(2**31), 2**31 - 1)
# ert_cmd_state values after which a command no longer runs (include/ert.h; RUNNING is not bound).
_TERMINAL = ("ERT_CMD_STATE_COMPLETED", "ERT_CMD_STATE_ERROR", "ERT_CMD_STATE_ABORT", "ERT_CMD_STATE_TIMEOUT",
             "ERT_CMD_STATE_NORESPONSE", "ERT_CMD_STATE_SKERROR", "ERT_CMD_STATE_SKCRASHED")
_POLL_FIRST_S = 20e-6  # first nap between run.state() polls; doubles up to _POLL_MAX_S
_POLL_MAX_S = 1e-3
# Persistent launch. A call without a timeout still has a deadline: a loop that stopped answering
# must not hold its caller forever. Spin: a host-memory round trip is a few microseconds
# (hls.cards.HOST_CARD_ROUND_TRIP_S), so a caller spins about ten of them before it naps.
PERSISTENT_TIMEOUT_S = 10.0
SPIN_S = 50e-6
_STOP_WAIT_S = 1.0  # close: how long the loop's run gets to complete after the stop word


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


def persistent_problem(pyxrt: Any) -> str | None:
    """Why ``launch="persistent"`` cannot work with this pyxrt on this host, or None when it can.

    It needs ``bo.flags.host_only`` (pyxrt.cpp from 202110.2.11.634), ``bo.map`` (same) and
    ``xclbin.get_mems`` with ``get_tag`` (from 202120.2.12.427) to find a HOST[0] ring, and the
    ring's acquire/release helpers, built once with the C++ compiler (offload.hls.persistent.ring_ops).
    """
    missing = [name for name, ok in (("bo.flags.host_only", hasattr(getattr(pyxrt.bo, "flags", None), "host_only")),
                                     ("bo.map", hasattr(pyxrt.bo, "map")),
                                     ("xclbin.get_mems", hasattr(pyxrt.xclbin, "get_mems"))) if not ok]
    if missing:
        return f"this pyxrt lacks {', '.join(missing)} (bound from XRT 2.12): update XRT"
    try:
        persistent.ring_ops()
    except Exception as e:  # noqa: BLE001 - ToolchainMissing, a failed g++ build: reported as the reason
        return f"the ring's acquire/release helpers cannot be built: {e}"
    return None


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


def _launch_text(pyxrt: Any) -> str:
    why = persistent_problem(pyxrt)
    if why:
        return f"launch modes: per_call only (persistent: {why})"
    return ("launch modes: per_call, persistent (a bundle whose xclbin holds the <top>_ring kernels; its ring in host "
            "memory where the xclbin put it at HOST[0], else in card memory)")


@dataclass
class _Cu:
    name: str
    kernel: Any  # pyxrt.kernel bound to this compute unit
    resident: dict[int, Any]  # arg index -> pyxrt.bo
    groups: dict[int, int]  # arg index -> memory bank group id
    hung: bool = False  # a run on it outlived its deadline: never started again on this device


@dataclass
class _Ring:
    """One persistent compute unit: its loop's run and the ring it serves, with the host's side of
    the protocol (request numbers, which request holds each slot, requests in flight)."""

    name: str
    kernel: Any
    bo: Any
    view: np.ndarray  # the ring's bytes as the host maps them (host_only: the memory the card reads)
    layout: RingLayout
    host: bool  # in host memory (HOST[0]) rather than card memory
    run: Any = None
    cond: threading.Condition = field(default_factory=threading.Condition)
    next_n: int = 1
    owner: list[int] = field(default_factory=list)  # slot -> request number holding it (0: free)
    inflight: int = 0
    answered: int = 0
    dead: str | None = None  # why the ring was abandoned; never used again
    stopping: bool = False

    @property
    def base(self) -> int:
        return int(self.view.ctypes.data)


@dataclass
class _XrtKernel:
    cus: list[_Cu]
    next_cu: Any  # itertools.cycle over cus
    lock: threading.Lock
    resident: dict[str, np.ndarray] = field(default_factory=dict)  # kept to reload after a reopen
    rings: list[_Ring] = field(default_factory=list)  # persistent compute units (launch="persistent")
    next_ring: int = 0
    ring_size: tuple[int, int] = (persistent.DEFAULT_SLOTS, persistent.DEFAULT_ROWS)  # (slots, rows) its top was built for


@register_device("xrt")
class XrtDevice(BufferedDevice):
    """An Alveo card through pyxrt; see the module doc."""

    kind = "xrt"
    launch_modes = LAUNCH_MODES  # what open_device(spec, launch=...) may ask for
    launch_why = ""  # it has every mode

    def __init__(self, spec: str = "xrt", launch: str = "per_call", *, ring_slots: int | None = None, ring_rows: int | None = None) -> None:
        """``launch``: ``"per_call"`` or ``"persistent"`` (see the module doc). Persistent only:
        ``ring_slots``/``ring_rows``, the ring its persistent tops were built for when no bundle
        records it (a bundle that records another is refused)."""
        super().__init__(spec)
        self._ring_slots, self._ring_rows = ring_slots, ring_rows
        if launch not in self.launch_modes:
            raise InputError(f"launch: {launch!r} is not one of {list(self.launch_modes)}")
        self.launch = launch
        self._pyxrt = import_pyxrt()
        self._api = xrt_api(self._pyxrt)
        if launch == "persistent":
            why = persistent_problem(self._pyxrt)
            if why:
                raise UnsupportedError(f"device {spec!r}: launch='persistent' is not possible: {why}")
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
        return Probe("xrt", bool(cards), tuple(cards), f"XRT {xrt_version() or 'version unknown'}; {found}; {_launch_text(pyxrt)}")

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

    def _load(self, kernel: Any, ring: tuple[int, int] | None):
        """Upload ``kernel``'s resident tensors; in persistent mode also start its loop (see the module doc)."""
        if self.launch == "persistent" and self._xclbin_kernels:
            ring_top = persistent.top_name(kernel.spec)
            if ring_top not in self._xclbin_kernels:
                raise UnsupportedError(
                    f"kernel {kernel.name!r}: launch='persistent' needs the persistent top {ring_top!r}, and xclbin {self._xclbin} "
                    f"holds only {self._xclbin_kernels}: rebuild it with `offload build` (which writes {ring_top} next to the per-call top) "
                    "or open the device with launch='per_call'")
        return super()._load(kernel, ring)

    def load_bundle(self, bundle: Any) -> dict:
        if bundle.xclbin is None:
            raise DeviceError(f"bundle {bundle.name!r} has no xclbin: build it with `offload build BUNDLE --target CARD --vitis` first")
        sizes = {}
        if self.launch == "persistent":  # every ring size checked before the card is programmed
            # unrecorded: the device's ring_slots/ring_rows, else the defaults
            sizes = bundle.ring_sizes_for(self.name, self._ring_slots, self._ring_rows)
        self.load_xclbin(bundle.xclbin, bundle.xclbin_uuid, bundle.compute_units)
        return self._load_all(bundle, sizes)

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
        per_call = not self._xclbin_kernels or loaded.top in self._xclbin_kernels
        if self.launch == "per_call" and not per_call:
            raise DeviceError(f"kernel {loaded.kernel.name!r}: top function {loaded.top!r} is not in xclbin {self._xclbin} (it holds {self._xclbin_kernels})")
        size = persistent.ring_size(loaded.ring, self._ring_slots, self._ring_rows)
        return self._upload_cus(loaded, resident, size)

    def _resident_bo(self, uploaded: dict, name: str, group: int, arr: np.ndarray) -> Any:
        """The resident buffer of ``name`` in bank ``group``, uploaded once: compute units (per-call
        and persistent) wired to the same bank share a table."""
        if (name, group) not in uploaded:
            pyxrt = self._pyxrt
            bo = pyxrt.bo(self._dev, max(arr.nbytes, _MIN_BO), pyxrt.bo.normal, group)
            if arr.nbytes:
                bo.write(arr.reshape(-1).view(np.uint8), 0)
                bo.sync(pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, arr.nbytes, 0)  # (dir) alone only from 2.16
            uploaded[(name, group)] = bo
        return uploaded[(name, group)]

    def _upload_cus(self, loaded: Loaded, resident: dict[str, np.ndarray], ring_size: tuple[int, int]) -> _XrtKernel:
        cus = []
        uploaded: dict[tuple[str, int], Any] = {}  # (arg, bank) -> bo
        per_call = not self._xclbin_kernels or loaded.top in self._xclbin_kernels
        for cu in (self._compute_units.get(loaded.top) or [None]) if per_call else []:
            k = self._open_kernel(loaded.top if cu is None else f"{loaded.top}:{{{cu}}}")
            groups = {i: k.group_id(i) for i, a in enumerate(loaded.args) if a.role != "scalar"}
            bos = {i: self._resident_bo(uploaded, a.name, groups[i], resident[a.name]) for i, a in enumerate(loaded.args) if a.role == "resident"}
            cus.append(_Cu(cu or loaded.top, k, bos, groups))
        st = _XrtKernel(cus, itertools.cycle(cus), threading.Lock(), dict(resident), ring_size=ring_size)
        if self.launch == "persistent":
            try:
                st.rings = self._start_rings(loaded, resident, uploaded, ring_size)
            except BaseException:
                for r in st.rings:
                    self._abandon(r, "the load failed")
                raise
        return st

    # -- persistent launch ----------------------------------------------------------------------
    def _host_banks(self) -> set[int]:
        """The memory indices the xclbin tags ``HOST[...]`` (xclbin.get_mems, pyxrt.cpp from 2.12)."""
        return {int(m.get_index()) for m in self._xb.get_mems() if str(m.get_tag()).upper().startswith("HOST")}

    def _start_rings(self, loaded: Loaded, resident: dict[str, np.ndarray], uploaded: dict, ring_size: tuple[int, int]) -> list[_Ring]:
        """Allocate each persistent compute unit's ring, write its header, and start its loop with one run."""
        pyxrt = self._pyxrt
        spec = loaded.kernel.spec
        top = persistent.top_name(spec)
        slots, rows = ring_size
        layout = persistent.ring_layout(spec, rows=rows, slots=slots)  # the layout offload build compiled the loop for
        host_banks = self._host_banks()
        to_dev = pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE
        rings: list[_Ring] = []
        try:
            for cu in self._compute_units.get(top) or [None]:
                k = self._open_kernel(top if cu is None else f"{top}:{{{cu}}}")
                group = k.group_id(0)
                host = group in host_banks
                try:
                    bo = pyxrt.bo(self._dev, layout.nbytes, pyxrt.bo.host_only if host else pyxrt.bo.normal, group)
                except RuntimeError as e:
                    if not host:
                        raise
                    raise DeviceError(
                        f"kernel {loaded.kernel.name!r}: its persistent top keeps the ring in host memory (HOST[0]) and XRT cannot allocate "
                        f"it: {e}; reserve host memory first (`sudo xrt-smi configure --host-mem -d <bdf> --size 1G enable`, "
                        "`xbutil` on older XRT) or open the device with launch='per_call'") from e
                view = np.frombuffer(bo.map(), dtype=np.uint8)[: layout.nbytes]
                if view.ctypes.data % LINE:
                    raise DeviceError(f"kernel {loaded.kernel.name!r}: XRT mapped the ring at {view.ctypes.data:#x}, not {LINE}-byte aligned")
                view[:] = 0
                layout.write_header(view)
                bo.sync(to_dev, layout.nbytes, 0)
                bos = [self._resident_bo(uploaded, a.name, k.group_id(i + 1), resident[a.name]) for i, a in enumerate(persistent.resident_args(spec))]
                ring = _Ring(cu or top, k, bo, view, layout, host, owner=[0] * layout.slots)
                try:
                    ring.run = k(bo, *bos)  # the one xrt::run of this loop: it ends at the stop word
                except RuntimeError as e:
                    raise DeviceError(f"kernel {loaded.kernel.name!r}: XRT cannot start its persistent top {ring.name}: {e}") from e
                rings.append(ring)
        except BaseException:
            for r in rings:
                self._abandon(r, "the load failed")
            raise
        return rings

    def _next_ring(self, loaded: Loaded) -> _Ring:
        st: _XrtKernel = loaded.state
        with st.lock:
            for _ in range(len(st.rings)):
                r = st.rings[st.next_ring % len(st.rings)]
                st.next_ring += 1
                if r.dead is None:
                    return r
        raise DeviceError(f"kernel {loaded.kernel.name!r} on {self.name!r}: every persistent compute unit is hung; reset the card (`xbutil reset`) and reopen")

    @staticmethod
    def _fits(layout: RingLayout, values: dict[str, Any]) -> str | None:
        """None when the request fits a slot, else which field exceeds it and by how much."""
        for f in layout.slot.fields:
            if f.role != "scalar" and np.asarray(values[f.name]).size > f.count:
                return f"{f.name}: {np.asarray(values[f.name]).size} elements exceed the ring slot's {f.count}"
        return None

    def _abandon(self, ring: _Ring, why: str) -> None:
        """Never use ``ring`` again; fail its waiters; ask its loop to end (harmless if it is dead)."""
        with ring.cond:
            if ring.dead is None:
                ring.dead = why
            ring.cond.notify_all()
        try:
            persistent.ring_ops().store_release(ring.base + HDR_STOP, STOP)
            ring.bo.sync(self._pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, LINE, HDR_STOP)
        except RuntimeError:  # a lost card: nothing left to stop
            pass

    def _ring_call(self, loaded: Loaded, ring: _Ring, values: dict[str, Any], timeout: float) -> dict[str, np.ndarray]:
        """One request through ``ring``, following offload.kernels.ring's contract (see the module doc)."""
        pyxrt, ops, layout = self._pyxrt, persistent.ring_ops(), ring.layout
        to_dev, from_dev = pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE
        deadline = time.monotonic() + timeout
        what = f"kernel {loaded.kernel.name!r} (persistent compute unit {ring.name}) on {self.name!r}"
        with ring.cond:  # a number, and the slot it maps to once that slot's last request was read
            while True:
                if ring.dead is not None:
                    raise DeviceError(f"{what}: its ring was abandoned ({ring.dead})")
                if ring.stopping:
                    raise DeviceError(f"device {self.name!r} is closing")
                s = layout.slot_of(ring.next_n)
                if ring.owner[s] == 0:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DeviceTimeout(f"{what}: no ring slot came free within {timeout:g} s (request {ring.owner[s]} still holds slot {s})")
                ring.cond.wait(min(left, 0.05))
            n = ring.next_n
            ring.next_n += 1
            ring.owner[s] = n
            ring.inflight += 1
        answered = False
        try:
            at = layout.slot_offset(s)
            try:
                persistent.write_request(layout, ring.view, s, values)
                ring.bo.sync(to_dev, _input_end(layout) - LINE, at + LINE)
                ops.store_release(ring.base + at + SLOT_REQ_SEQ, n)  # last: publishes the request
                ring.bo.sync(to_dev, LINE, at + SLOT_REQ_SEQ)
            except BaseException as e:
                # Taken but maybe not published: the loop would wait for n forever.
                self._abandon(ring, f"request {n} could not be written: {e}")
                raise
            got = self._await(ring, n, at + layout.slot.resp_seq, deadline)
            if got != "answered":
                if got == "abandoned":
                    raise DeviceError(f"{what}: request {n} was not answered: its ring was abandoned ({ring.dead})")
                if got == "timeout":
                    why = f"request {n} was not answered within {timeout:g} s; the compute unit is marked hung and its ring abandoned"
                else:  # the loop's run ended without the stop word: it will answer nothing more
                    why = f"its loop ended ({got}) without answering request {n}; its ring is abandoned"
                late = f"{what}: {why}"
                self._abandon(ring, why)
                err = DeviceTimeout if got == "timeout" else DeviceError
                try:
                    self._ring_hung(loaded)
                except DeviceError as e:
                    raise err(f"{late}, and reopening the device failed: {e}") from e
                raise err(late)
            first, end = _output_span(layout)
            ring.bo.sync(from_dev, end - first, at + first)
            out = persistent.read_response(layout, ring.view, s, values)
            answered = True
            return out
        finally:
            with ring.cond:
                ring.inflight -= 1
                if answered:
                    ring.owner[s] = 0
                    ring.answered += 1
                ring.cond.notify_all()

    def _await(self, ring: _Ring, n: int, resp: int, deadline: float) -> str:
        """``"answered"`` once the response word at byte ``resp`` holds ``n``; ``"timeout"`` at the
        deadline; ``"abandoned"`` when another request gave the ring up; the run's final state
        (``"ERT_CMD_STATE_..."``) when the loop's run ended. Host memory: spin on the word (GIL
        released) for SPIN_S first; then back off, looking at the run's state between naps."""
        ops = persistent.ring_ops()
        from_dev = self._pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE
        terminal = tuple(getattr(self._pyxrt.ert_cmd_state, t) for t in _TERMINAL)
        addr = ring.base + resp
        now = time.monotonic()
        if ring.host and ops.wait(addr, n, int(max(0.0, min(SPIN_S, deadline - now)) * 1e9)):
            return "answered"
        spin_until = now + SPIN_S
        nap = _POLL_FIRST_S
        while True:
            ring.bo.sync(from_dev, LINE, resp)  # host memory: a cache invalidate; card memory: the DMA that reads the word
            if ops.load_acquire(addr) == n:
                return "answered"
            if ring.dead is not None:
                return "abandoned"
            now = time.monotonic()
            if now >= deadline:
                return "timeout"
            if not ring.host and now < spin_until:
                continue
            state = ring.run.state() if ring.run is not None else None
            if state in terminal:
                return state.name
            time.sleep(min(nap, deadline - now))
            nap = min(2 * nap, _POLL_MAX_S)

    def _ring_hung(self, loaded: Loaded) -> None:
        st: _XrtKernel = loaded.state
        with st.lock:
            healthy = any(r.dead is None for r in st.rings)
        if not healthy:
            self._reopen()

    def _stop_ring(self, ring: _Ring, wait_s: float) -> None:
        """Drain ``ring`` (no new request; those in flight finish or time out), then the stop word."""
        end = time.monotonic() + wait_s
        with ring.cond:
            ring.stopping = True
            while ring.inflight and ring.dead is None and time.monotonic() < end:
                ring.cond.wait(min(0.05, max(0.0, end - time.monotonic())))
            if ring.dead is not None:
                return
            ring.dead = "the device was closed"
        ops = persistent.ring_ops()
        ops.store_release(ring.base + HDR_STOP, STOP)
        ring.bo.sync(self._pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, LINE, HDR_STOP)
        if ring.run is not None:
            self._wait(ring.run, _STOP_WAIT_S)  # the loop ends at its next idle poll; pyxrt cannot abort it otherwise

    def _scalar(self, loaded: Loaded, name: str, v: Any) -> int:
        if not (isinstance(v, (int, np.integer)) and _INT32[0] <= int(v) <= _INT32[1]):
            raise InputError(f"kernel {loaded.kernel.name!r}: scalar {name!r}={v!r} must be an int in [{_INT32[0]}, {_INT32[1]}] (pyxrt passes a C int)")
        return int(v)

    def _execute(self, loaded: Loaded, values: dict[str, Any], timeout: float | None) -> dict[str, np.ndarray]:
        if self.launch == "persistent":
            st: _XrtKernel = loaded.state
            ring = self._next_ring(loaded)
            too_big = self._fits(ring.layout, values)
            if too_big is None:
                return self._ring_call(loaded, ring, values, PERSISTENT_TIMEOUT_S if timeout is None else timeout)
            if not st.cus:
                raise InputError(f"kernel {loaded.kernel.name!r}: {too_big} (the persistent top was built for "
                                 f"{st.ring_size[1]} rows a request, and the xclbin has no per-call top to run a larger one)")
        return self._execute_per_call(loaded, values, timeout)

    def _execute_per_call(self, loaded: Loaded, values: dict[str, Any], timeout: float | None) -> dict[str, np.ndarray]:
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
            for lo in self._loaded:
                for r in lo.state.rings:
                    self._abandon(r, "the device was reopened")
            old_pool = self._pool
            self._dev = self._open()
            self._ctx = self._uuid = None
            self._pool = BufferPool(self._alloc_bo)
            try:
                self._program(self._xb)
            except RuntimeError as e:
                raise DeviceError(f"device {self.name!r}: reprogramming after a hung compute unit failed: {e}; reset the card (`xbutil reset`)") from e
            for lo in self._loaded:
                lo.state = self._upload_cus(lo, lo.state.resident, lo.state.ring_size)
            self.reopens += 1
        old_pool.close()

    def _details(self) -> dict[str, Any]:
        d: dict[str, Any] = {"xclbin": str(self._xclbin) if self._xclbin else None, "buffer_allocations": self._pool.allocations, "reopens": self.reopens,
                             "launch": self.launch}
        if self.launch == "persistent":
            d["rings"] = [{"kernel": lo.kernel.name, "compute_unit": r.name, "memory": "host" if r.host else "card", "slots": r.layout.slots,
                           "rows": lo.state.ring_size[1],
                           "answered": r.answered, "abandoned": r.dead}
                          for lo in self._loaded for r in lo.state.rings]
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
        for lo in self._loaded:
            for r in lo.state.rings:
                self._stop_ring(r, PERSISTENT_TIMEOUT_S)
        self._pool.close()


def _input_end(layout: RingLayout) -> int:
    """Byte offset in a slot just past the last scalar or input field (what a request writes)."""
    from offload.kernels.ring import align

    return align(max(f.offset + f.nbytes for f in layout.slot.fields if f.role != "output"))


def _output_span(layout: RingLayout) -> tuple[int, int]:
    """Byte offsets in a slot of the output fields: first byte, and the response word's line."""
    outs = [f.offset for f in layout.slot.fields if f.role == "output"]
    return (min(outs) if outs else layout.slot.resp_seq), layout.slot.resp_seq
