"""TEST STAND-IN for PYNQ on Alveo, as strict as the real one, per release.

Never shipped; tests put ``tests/fakes`` first on ``sys.path`` and choose a profile with
:func:`use_profile`: ``"3.0.1"`` (the default) or ``"3.1"``. Every API method names what it
mirrors in Xilinx/PYNQ at tag ``v3.0.1``: ``pynq/pl_server/xrt_device.py`` (``XrtDevice``,
``ErtWaitHandle``, ``XrtMemory``), ``pynq/overlay.py`` (``Overlay``, ``DefaultIP._start_ert``),
``pynq/pl_server/xclbin_parser.py`` (``ip_dict``, ``mem_dict``) and ``pynq/buffer.py``.

The warts kept on purpose, because offload must survive them on a real card:

- ``ErtWaitHandle.wait()`` only services events (``device._handle_events(1000)``) until the future
  is done: a failed command stores ``RuntimeError("Execution failed: 5")`` in the handle's future
  and ``wait()`` returns normally.
- ``XrtDevice.execute_bo`` appends to ``active_bos`` and ``_handle_events`` rebuilds that list,
  neither under a lock: concurrent callers can lose a completion, and that handle's ``wait()``
  then spins forever (this fake raises ``AssertionError`` instead of spinning, so a test ends).
- ``xclbin_parser._add_argument_memory`` keeps only the last bank of an argument connected to a
  range (``r["memory"] = memory[-1]``, the whole list in ``r["MBG"]``), so a buffer bigger than
  that one pseudo-channel cannot be allocated for it.
- memory tags are what the platform names them: ``HBM[0]``, ``DDR[1]`` or ``bank0``; the
  overlay attribute is the tag with every character outside ``[A-Za-z0-9_]`` removed.
- ``_start_ert`` passes only each buffer's ``device_address``: nothing checks the bank. A CU
  given a buffer outside its connected banks computes nothing useful (its results are garbage).
- PYNQ 3.1: ``XrtDevice._probe_`` returns ``[]`` ("XrtDevice has been deprecated"), so
  ``Device.devices`` is empty on a PCIe host.

THE "XCLBIN" IS A TEST ARTIFACT: the JSON stand-in the fake ``pyxrt`` reads (``{"format":
"offload-test-fake-xclbin", "uuid", "xsa", "kernels": [{"name", "kind", "spec", "cus", "banks"?,
"memory"?: {arg: tag or "HBM[a:b]"}, "memory_kind"?: "HBM" | "DDR" | "bank", "bank_bytes"?}]}``).

Test hooks (not PYNQ API): ``use_profile``, ``inject_fault("error" | "hang", count)``,
``release_hangs``, ``set_run_time``, ``set_race_window``, ``stats``, ``cu_runs``.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import re
import struct
import threading
import time
from pathlib import Path

import numpy as np

__version__ = "3.0.1"
FORMAT = "offload-test-fake-xclbin"
PROFILES = ("3.0.1", "3.1")

_FAULTS: list[str] = []
_HANG = threading.Event()
_LOCK = threading.Lock()
_RUN_TIME = [0.0]
_RACE_WINDOW = [0.0]
_PROFILE_SET = [False]
stats = {"runs": 0, "allocations": 0, "freed": 0, "lost": 0}
cu_runs: dict[str, int] = {}
_ERROR, _ABORT, _COMPLETED = 5, 6, 4  # include/ert.h
_DEFAULT_BANK_BYTES = 256 << 20


def use_profile(version: str) -> None:
    """Shape this module like PYNQ ``version`` (once per import: the fixture re-imports)."""
    global __version__
    if version not in PROFILES:
        raise ValueError(f"unknown PYNQ profile {version!r}; known: {PROFILES}")
    if _PROFILE_SET[0]:
        raise RuntimeError("use_profile: call it once, on a fresh import")
    _PROFILE_SET[0] = True
    if version == "3.1":
        __version__ = "3.1.2"
        # pynq/pl_server/xrt_device.py at v3.1: "XrtDevice has been deprecated. This probe will
        # now always return an empty list."
        Device.devices = []
        Device.active_device = None


def inject_fault(kind: str, count: int = 1) -> None:
    """The next ``count`` commands end in ERT state 5 (``"error"``) or never end (``"hang"``)."""
    if kind not in ("error", "hang"):
        raise ValueError(kind)
    with _LOCK:
        _FAULTS.extend([kind] * count)


def release_hangs() -> None:
    _HANG.set()


def set_run_time(seconds: float) -> None:
    _RUN_TIME[0] = float(seconds)


def set_race_window(seconds: float) -> None:
    """Widen the unlocked gap in ``_handle_events`` between reading and replacing ``active_bos``."""
    _RACE_WINDOW[0] = float(seconds)


def reset() -> None:
    _FAULTS.clear()
    _HANG.clear()
    _RUN_TIME[0] = _RACE_WINDOW[0] = 0.0
    for k in stats:
        stats[k] = 0
    cu_runs.clear()
    for d in Device.devices:
        d._loop.close()
    Device.devices = [XrtDevice(0, "xilinx_u55c_gen3x16_xdma_base_3")]
    Device.active_device = Device.devices[0]


class _Cmd:
    """An ERT command packet (``ExecBo`` in xrt_device.py): its state nibble and what completing it does."""

    def __init__(self, end: int, done_at: float, commit=None, hang: bool = False) -> None:
        self.state = 1  # ERT_CMD_STATE_NEW
        self._end, self._done_at, self._commit, self._hang = end, done_at, commit, hang

    def advance(self) -> None:
        if self.state >= _COMPLETED:
            return
        if self._hang:
            if _HANG.is_set():
                self.state = _ABORT
            return
        if time.monotonic() >= self._done_at:
            if self._end == _COMPLETED and self._commit is not None:
                self._commit()
            self.state = self._end


class ErtWaitHandle:
    """``ErtWaitHandle`` (xrt_device.py v3.0.1): ``_complete`` stores a failure in the future,
    ``done`` is ``future.done()``, ``wait()`` loops on ``device._handle_events(1000)`` and never
    raises the stored failure."""

    def __init__(self, bo, future, device) -> None:
        self._future = future
        self._bo = bo
        self.device = device

    def _complete(self, state) -> None:
        """``ErtWaitHandle._complete`` (xrt_device.py v3.0.1): a failure goes into the future, not raised."""
        if state != _COMPLETED:
            self._future.set_exception(RuntimeError("Execution failed: " + str(state)))
        else:
            self._future.set_result(None)
        self._bo = None

    @property
    def _has_bo(self) -> bool:
        return self._bo is not None

    @property
    def done(self) -> bool:
        """``ErtWaitHandle.done``: ``self._future.done()`` (xrt_device.py v3.0.1)."""
        return self._future.done()

    def wait(self) -> None:
        """``ErtWaitHandle.wait`` (xrt_device.py v3.0.1): ``while not self.done: self.device._handle_events(1000)``."""
        while not self.done:
            if not any(wh is self for _, wh in self.device.active_bos):
                stats["lost"] += 1
                # The real loop spins forever here; a test must end.
                raise AssertionError("fake pynq: this command was lost from active_bos; PYNQ 3.0.1's wait() would spin forever")
            self.device._handle_events(1000)


class XrtMemory:
    """``XrtMemory`` (xrt_device.py v3.0.1): one bank; ``allocate``; equal by device and ``idx``."""

    def __init__(self, device, desc) -> None:
        self.idx = desc["idx"]
        self.size = desc["size"]
        self.base_address = desc["base_address"]
        self.desc = desc
        self.device = device

    def allocate(self, shape, dtype, **kwargs):
        """``XrtMemory.allocate`` -> ``_xrt_allocate(shape, dtype, device, self.idx)`` (xrt_device.py v3.0.1)."""
        return _xrt_allocate(shape, dtype, self.device, self, **kwargs)

    def __hash__(self) -> int:
        return hash((id(self.device), self.idx))

    def __eq__(self, other) -> bool:
        return type(other) is XrtMemory and self.device is other.device and self.idx == other.idx


class XrtDevice:
    """``XrtDevice`` (xrt_device.py v3.0.1): ``name``, ``default_memory``, ``execute_bo``,
    ``_handle_events``, ``active_bos`` (a plain list, no lock)."""

    def __init__(self, index: int, name: str) -> None:
        self._index = index
        self.name = name
        self.active_bos: list = []
        self._loop = asyncio.new_event_loop()  # asyncio.get_event_loop() at construction in PYNQ
        self.default_memory = XrtMemory(self, {"idx": 0, "size": _DEFAULT_BANK_BYTES, "base_address": 0, "tag": "default"})

    def __repr__(self) -> str:
        return f"<pynq.XrtDevice {self.name}>"

    def execute_bo(self, bo) -> ErtWaitHandle:
        """``XrtDevice.execute_bo`` (xrt_device.py v3.0.1): ``xclExecBuf``, then ``self.active_bos.append((bo, wh))``, no lock."""
        wh = ErtWaitHandle(bo, self._loop.create_future(), self)
        self.active_bos.append((bo, wh))
        return wh

    def _handle_events(self, timeout=0) -> None:
        """``XrtDevice._handle_events`` (xrt_device.py v3.0.1): ``xclExecWait(handle, timeout)``, then completes every
        finished command and replaces ``active_bos`` with the rest, no lock (real time capped at 5 ms per call here)."""
        # xclExecWait(handle, timeout): returns once any command completes, or after timeout ms.
        limit = time.monotonic() + min(timeout, 5) / 1000
        while True:
            for bo, _ in list(self.active_bos):
                bo.advance()
            if any(bo.state >= _COMPLETED for bo, _ in self.active_bos) or time.monotonic() >= limit:
                break
            time.sleep(0.0002)
        next_bos = []
        for bo, completion in self.active_bos:
            if bo.state >= _COMPLETED:
                if completion:
                    completion._complete(bo.state)
            else:
                next_bos.append((bo, completion))
        if _RACE_WINDOW[0]:
            time.sleep(_RACE_WINDOW[0])
        self.active_bos = next_bos


class Device:
    """``pynq.Device``: ``devices`` (every probed device) and ``active_device``."""

    devices: list = []
    active_device = None


_ADDR = itertools.count(0x8000_0000, 0x10_0000)


class PynqBuffer(np.ndarray):
    """``PynqBuffer`` (pynq/buffer.py v3.0.1): an ndarray over the bo's mapping with ``sync_to_device``,
    ``sync_from_device`` (a slice syncs its own bytes), ``flush``, ``invalidate``, ``freebuffer``,
    ``device_address``, ``memory``."""

    def __array_finalize__(self, obj) -> None:
        self._root = getattr(obj, "_root", None)
        self.memory = getattr(obj, "memory", None)

    def _span(self) -> slice:
        root = self._root
        off = self.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        return slice(off, off + self.nbytes)

    def sync_to_device(self) -> None:
        """``PynqBuffer.sync_to_device`` (pynq/buffer.py v3.0.1): ``flush`` of this view's bytes."""
        root = self._root
        sl = self._span()
        root._device_mem[sl] = root.view(np.uint8).reshape(-1)[sl]

    def sync_from_device(self) -> None:
        """``PynqBuffer.sync_from_device`` (pynq/buffer.py v3.0.1): ``invalidate`` of this view's bytes."""
        root = self._root
        sl = self._span()
        root.view(np.uint8).reshape(-1)[sl] = root._device_mem[sl]

    flush = sync_to_device
    invalidate = sync_from_device

    @property
    def device_address(self) -> int:
        return self._root._address + self._span().start

    physical_address = device_address

    def freebuffer(self) -> None:
        """``PynqBuffer.freebuffer`` (pynq/buffer.py v3.0.1)."""
        if not getattr(self._root, "_freed", False):
            self._root._freed = True
            stats["freed"] += 1


def _xrt_allocate(shape, dtype, device, memory, **kwargs) -> PynqBuffer:
    """``_xrt_allocate`` (xrt_device.py v3.0.1): ``xclAllocBO`` in bank ``memory.idx``; it fails when the bank is too small."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if nbytes > memory.size:
        raise RuntimeError(f"Failed to allocate buffer of {nbytes} bytes in memory bank {memory.idx}")
    buf = np.zeros(shape, dtype=dtype).view(PynqBuffer)
    buf._root = buf
    buf.memory = memory
    buf._device_mem = np.full(buf.nbytes, 0xA5, dtype=np.uint8)  # device memory starts as garbage
    buf._address = next(_ADDR)
    buf._freed = False
    stats["allocations"] += 1
    return buf


def allocate(shape, dtype="u4", target=None, **kwargs) -> PynqBuffer:
    """``pynq.allocate`` (pynq/buffer.py v3.0.1): ``target`` or the active device's ``default_memory``."""
    if target is None:
        target = Device.active_device.default_memory
    return target.allocate(shape, dtype, **kwargs)


_STRUCT = {"int": "i", "unsigned int": "I", "int32_t": "i", "uint32_t": "I"}


class DefaultIP:
    """``DefaultIP`` with ``_start_ert`` as ``start`` (overlay.py v3.0.1): packs each pointer's
    ``device_address`` and each scalar with ``struct`` into an ERT packet, ``device.execute_bo``;
    ``call`` is ``start(...).wait()``."""

    def __init__(self, name: str, entry: dict, top, connected, device) -> None:
        self._name = name
        self._top = top
        self._connected = connected  # arg -> memory tags the CU reaches for it
        self.description = entry
        self.device = device
        self._lock = threading.Lock()

    @property
    def signature(self) -> inspect.Signature:
        return inspect.Signature([inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for a in self._top.args])

    def start(self, *args, waitfor=()) -> ErtWaitHandle:
        """``DefaultIP._start_ert`` (overlay.py v3.0.1): ``device_address`` of each pointer, ``struct.pack`` of each
        scalar, ``device.execute_bo(bo)``; returns the ``ErtWaitHandle``."""
        top = self._top
        args = self.signature.bind(*args).args  # TypeError on a wrong count, as inspect does
        values = []
        wired = True
        for a, v in zip(top.args, args):
            if a.role == "scalar":
                struct.pack("<" + _STRUCT["int"], v)  # struct.error for a float or an int outside int32
                values.append(v)
                continue
            root = v._root  # AttributeError for a non-buffer: _start_ert reads a.device_address
            _ = v.device_address
            if getattr(root, "_freed", False) or v.memory is None or v.memory.desc.get("tag") not in self._connected[a.name]:
                wired = False  # the CU reads some other memory
            values.append(root._device_mem[v._span()])
        with _LOCK:
            fault = _FAULTS.pop(0) if _FAULTS else None
        stats["runs"] += 1
        cu_runs[self._name] = cu_runs.get(self._name, 0) + 1
        done_at = time.monotonic() + _RUN_TIME[0]
        if fault == "hang":
            return self.device.execute_bo(_Cmd(_COMPLETED, done_at, hang=True))
        if fault == "error":
            return self.device.execute_bo(_Cmd(_ERROR, done_at))
        if not wired:
            return self.device.execute_bo(_Cmd(_COMPLETED, done_at))
        scratch = [x.copy() if isinstance(x, np.ndarray) else x for x in values]
        with self._lock:
            top(scratch)

        def commit() -> None:
            for a, dst, src in zip(top.args, values, scratch):
                if a.role == "output":
                    dst[...] = src

        return self.device.execute_bo(_Cmd(_COMPLETED, done_at, commit))

    def call(self, *args, waitfor=()) -> None:
        """``DefaultIP.call`` (overlay.py v3.0.1): ``self.start(*args).wait()``; a failure stays in the future."""
        self.start(*args, waitfor=waitfor).wait()


def _sanitize(tag: str) -> str:
    return re.sub("[^A-Za-z0-9_]", "", tag)


def _range(spelling: str) -> list[str]:
    m = re.fullmatch(r"(\w+)\[(\d+):(\d+)\]", spelling)
    if not m:
        return [spelling]
    return [f"{m.group(1)}[{i}]" for i in range(int(m.group(2)), int(m.group(3)) + 1)]


class Overlay:
    """``pynq.Overlay(xclbin, device=...)`` (overlay.py v3.0.1): ``ip_dict`` (CU -> ``{"type", "registers":
    {arg: {"memory": last bank, "MBG"?: all banks, "id", "type"}}, "cu_index", "fullpath"}``), ``mem_dict``
    (tag -> ``{"idx", "size", "used", "type", "base_address", "streaming", "tag"}``), one attribute per CU and
    per used memory (its sanitised tag), ``free()``."""

    def __init__(self, bitfile_name, dtbo=None, download=True, ignore_version=False, device=None) -> None:
        from offload.hls.ctop import load_top
        from offload.kernels.registry import get_kind

        try:
            d = json.loads(Path(bitfile_name).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RuntimeError(f"Overlay: cannot read {bitfile_name}: {e}") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise RuntimeError(f"Overlay: {bitfile_name} is not an xclbin (test fake reads {FORMAT} JSON)")
        self.device = device or Device.active_device
        self.ip_dict: dict[str, dict] = {}
        self.mem_dict: dict[str, dict] = {}
        self._drivers: dict[str, DefaultIP] = {}
        index = 0
        for k in d["kernels"]:
            top = load_top(get_kind(k["kind"]).spec_from_json(k["spec"]))
            bundles = sorted({a.bundle or "" for a in top.args if a.role != "scalar"})
            shared = k.get("banks") == "shared"
            kind = k.get("memory_kind", "HBM")
            size = int(k.get("bank_bytes", _DEFAULT_BANK_BYTES))
            for ci, cu in enumerate(k.get("cus") or [f"{k['name']}_1"]):
                regs, connected = {}, {}
                for a in top.args:
                    regs[a.name] = {"type": "int" if a.role == "scalar" else "void*", "id": len(regs)}
                    if a.role == "scalar":
                        continue
                    n = (0 if shared else ci) * 16 + bundles.index(a.bundle or "")
                    default = f"bank{n}" if kind == "bank" else f"{kind}[{n}]"
                    banks = _range(k.get("memory", {}).get(a.name, default))
                    for tag in banks:
                        self.mem_dict.setdefault(tag, {"used": 1, "type": kind if kind != "bank" else "DDR", "streaming": False,
                                                       "idx": len(self.mem_dict), "size": size, "base_address": 0, "tag": tag})
                    regs[a.name]["memory"] = banks[-1]  # xclbin_parser._add_argument_memory: memory[-1]
                    if len(banks) > 1:
                        regs[a.name]["MBG"] = banks
                    connected[a.name] = set(banks)
                entry = {"type": f"xilinx.com:hls:{k['name']}:1.0", "registers": regs, "cu_index": index, "fullpath": cu}
                index += 1
                self.ip_dict[cu] = entry
                self._drivers[cu] = DefaultIP(cu, entry, top, connected, self.device)

    def __getattr__(self, name: str):
        drivers = self.__dict__.get("_drivers", {})
        if name in drivers:
            return drivers[name]
        for tag, desc in self.__dict__.get("mem_dict", {}).items():
            if desc.get("used") and name == _sanitize(tag):
                return XrtMemory(self.device, desc)
        raise AttributeError(f"Could not find IP or hierarchy {name} in overlay")

    def free(self) -> None:
        """``Overlay.free`` (overlay.py v3.0.1)."""
        self._drivers.clear()


reset()
