"""TEST STAND-IN for PYNQ 3.x: only the documented API surface the pynq backend uses, running the
emu kernels underneath. Never shipped; tests put ``tests/fakes`` first on ``sys.path``.

Surface (as in Xilinx/PYNQ ``pynq/overlay.py``, ``pynq/buffer.py``, ``docs/source/pynq_alveo.rst``):
``Device.devices`` / ``Device.active_device``; ``Overlay(xclbin, device=...)`` with ``ip_dict``
(CU instance name -> ``{"type": vlnv, "registers": {arg: {"memory": tag, ...}}, "cu_index"}``),
``mem_dict``, one attribute per IP (a driver with ``call``, ``start(...).wait()``,
``signature``) and per memory (``ol.HBM0`` for tag ``HBM[0]``), ``free()``; ``allocate(shape,
dtype, target=...)`` returning a ``PynqBuffer`` (an ndarray with ``sync_to_device``,
``sync_from_device``, ``flush``, ``invalidate``, ``freebuffer``, ``device_address``).

Card semantics kept: a buffer's device memory is separate and only syncs move bytes (a slice
syncs just its bytes); kernels see device memory only; a buffer passed for an argument must be
allocated in that argument's memory bank.

THE "XCLBIN" IS A TEST ARTIFACT: the same JSON stand-in the fake ``pyxrt`` reads
(``{"format": "offload-test-fake-xclbin", "uuid", "xsa", "kernels": [{"name", "kind", "spec", "cus"}]}``).

Fault injection (test hooks, not PYNQ API): ``inject_fault("error")`` makes the next run's
``wait()`` raise ``RuntimeError``; ``inject_fault("hang")`` makes it block until ``release_hangs()``.
"""

from __future__ import annotations

import inspect
import itertools
import json
import threading
from pathlib import Path

import numpy as np

__version__ = "3.0.1"
FORMAT = "offload-test-fake-xclbin"

_FAULTS: list[str] = []
_HANG = threading.Event()
_LOCK = threading.Lock()
stats = {"runs": 0, "allocations": 0, "freed": 0}
cu_runs: dict[str, int] = {}


def inject_fault(kind: str, count: int = 1) -> None:
    with _LOCK:
        _FAULTS.extend([kind] * count)


def release_hangs() -> None:
    _HANG.set()


def reset() -> None:
    _FAULTS.clear()
    _HANG.clear()
    for k in stats:
        stats[k] = 0
    cu_runs.clear()
    Device.devices = [Device("xilinx_u55c_gen3x16_xdma_base_3")]
    Device.active_device = Device.devices[0]


class Device:
    devices: list["Device"] = []
    active_device: "Device | None" = None

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<pynq.Device {self.name}>"


_ADDR = itertools.count(0x8000_0000, 0x10_0000)


class PynqBuffer(np.ndarray):
    def __array_finalize__(self, obj) -> None:
        self._root = getattr(obj, "_root", None)
        self.memory = getattr(obj, "memory", None)

    def _span(self) -> slice:
        root = self._root
        off = self.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        return slice(off, off + self.nbytes)

    def sync_to_device(self) -> None:
        root = self._root
        sl = self._span()
        root._device_mem[sl] = root.view(np.uint8).reshape(-1)[sl]

    def sync_from_device(self) -> None:
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
        if not getattr(self._root, "_freed", False):
            self._root._freed = True
            stats["freed"] += 1


def allocate(shape, dtype="u4", target=None, **kwargs) -> PynqBuffer:
    buf = np.zeros(shape, dtype=dtype).view(PynqBuffer)
    buf._root = buf
    buf.memory = getattr(target, "tag", None)
    buf._device_mem = np.full(buf.nbytes, 0xA5, dtype=np.uint8)  # device memory starts as garbage
    buf._address = next(_ADDR)
    buf._freed = False
    stats["allocations"] += 1
    return buf


class _Memory:
    def __init__(self, tag: str) -> None:
        self.tag = tag


class _WaitHandle:
    def __init__(self, fault: str | None) -> None:
        self._fault = fault

    @property
    def done(self) -> bool:
        return self._fault != "hang"

    def wait(self) -> None:
        if self._fault == "hang":
            _HANG.wait()
            raise RuntimeError("Execution failed: ERT_CMD_STATE_ABORT")
        if self._fault == "error":
            raise RuntimeError("Execution failed: ERT_CMD_STATE_ERROR")


class DefaultIP:
    def __init__(self, name: str, entry: dict, top, cu_index: int, bank_of) -> None:
        self._name = name
        self._top = top
        self._bank_of = bank_of
        self.description = entry
        self._lock = threading.Lock()

    @property
    def signature(self) -> inspect.Signature:
        return inspect.Signature([inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for a in self._top.args])

    def start(self, *args, waitfor=()) -> _WaitHandle:
        top = self._top
        if len(args) != len(top.args):
            raise TypeError(f"{self._name}: {len(top.args)} arguments expected, got {len(args)}")
        values = []
        for a, v in zip(top.args, args):
            if a.role == "scalar":
                if not isinstance(v, (int, np.integer, float)):
                    raise TypeError(f"{self._name}: argument {a.name} must be a scalar")
                values.append(v)
            else:
                if not isinstance(v, PynqBuffer):
                    raise TypeError(f"{self._name}: argument {a.name} must be a PynqBuffer")
                want = self._bank_of(a)
                if v.memory != want:
                    raise RuntimeError(f"{self._name}: buffer for {a.name} is in {v.memory}, the CU is connected to {want}")
                root = v._root
                if getattr(root, "_freed", False):
                    raise RuntimeError(f"{self._name}: buffer for {a.name} was freed")
                values.append(root._device_mem[v._span()])
        with _LOCK:
            fault = _FAULTS.pop(0) if _FAULTS else None
        stats["runs"] += 1
        cu_runs[self._name] = cu_runs.get(self._name, 0) + 1
        if fault is None:
            with self._lock:
                top(values)
        return _WaitHandle(fault)

    def call(self, *args, waitfor=()) -> None:
        self.start(*args, waitfor=waitfor).wait()


class Overlay:
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
            for ci, cu in enumerate(k.get("cus") or [f"{k['name']}_1"]):
                def bank_of(a, ci=0 if shared else ci, bundles=bundles):
                    return f"HBM[{ci * 16 + bundles.index(a.bundle or '')}]"

                regs = {}
                for a in top.args:
                    regs[a.name] = {"type": "int" if a.role == "scalar" else "void*", "id": len(regs)}
                    if a.role != "scalar":
                        regs[a.name]["memory"] = bank_of(a)
                        self.mem_dict.setdefault(bank_of(a), {"used": 1, "type": "HBM", "streaming": False, "idx": len(self.mem_dict)})
                entry = {"type": f"xilinx.com:hls:{k['name']}:1.0", "registers": regs, "cu_index": index, "fullpath": cu}
                index += 1
                self.ip_dict[cu] = entry
                self._drivers[cu] = DefaultIP(cu, entry, top, ci, bank_of)

    def __getattr__(self, name: str):
        drivers = self.__dict__.get("_drivers", {})
        if name in drivers:
            return drivers[name]
        for tag in self.__dict__.get("mem_dict", {}):
            if name == tag.replace("[", "").replace("]", ""):
                return _Memory(tag)
        raise AttributeError(f"Could not find IP or hierarchy {name} in overlay")

    def free(self) -> None:
        self._drivers.clear()


reset()
