"""TEST STAND-IN for XRT's ``pyxrt`` binding: only its documented API surface, running the emu
kernels underneath. Never shipped; tests put ``tests/fakes`` first on ``sys.path``.

Surface implemented (names as in XRT's ``src/python/pybind11/pyxrt.pyi``): ``enumerate_devices``,
``device(index | bdf)`` with ``load_xclbin``, ``get_xclbin_uuid``, ``get_info``; ``xclbin(path)``
with ``get_uuid``, ``get_kernels``, ``get_xsa_name``; ``uuid.to_string``; ``kernel(device, uuid,
name[, cu_access_mode])`` with ``group_id`` and ``__call__ -> run``; ``run.wait([timeout_ms]) ->
ert_cmd_state`` and ``run.state``; ``bo(device, size, flags, group)`` with ``write``, ``read``,
``sync``, ``map``, ``size``, ``address``; the enums ``xclBOSyncDirection``, ``ert_cmd_state``,
``xrt_info_device``, ``kernel.cu_access_mode``, ``bo.flags``.

Card semantics kept: a buffer object has separate host and device memory and only ``sync``
moves bytes between them; a kernel reads and writes device memory only; a kernel argument's
buffer must live in the memory bank ``group_id`` reports for it (else ``RuntimeError``, as a
real card would fail or corrupt).

THE "XCLBIN" IS A TEST ARTIFACT: there is no real xclbin here, so this fake reads a small JSON
file (``{"format": "offload-test-fake-xclbin", "uuid", "xsa", "kernels": [{"name", "kind",
"spec", "cus", "banks"?}]}``; ``"banks": "shared"`` wires every CU to the same banks) naming each kernel's kind and spec; it is written by ``write_xclbin`` below
or by the build's fake flow in tests. A real xclbin is a binary axlf container.

Fault injection (test hooks, not pyxrt API): ``inject_fault(state, count)`` makes the next
``count`` runs end in ``state`` without running; ``set_devices([...])`` sets what enumerates.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid as _uuidlib
from enum import IntEnum
from pathlib import Path

import numpy as np

FORMAT = "offload-test-fake-xclbin"
XCL_BO_FLAGS_NONE = 0


class xclBOSyncDirection(IntEnum):
    XCL_BO_SYNC_BO_TO_DEVICE = 0
    XCL_BO_SYNC_BO_FROM_DEVICE = 1
    XCL_BO_SYNC_BO_GMIO_TO_AIE = 2
    XCL_BO_SYNC_BO_AIE_TO_GMIO = 3


class ert_cmd_state(IntEnum):
    ERT_CMD_STATE_NEW = 1
    ERT_CMD_STATE_QUEUED = 2
    ERT_CMD_STATE_RUNNING = 3
    ERT_CMD_STATE_COMPLETED = 4
    ERT_CMD_STATE_ERROR = 5
    ERT_CMD_STATE_ABORT = 6
    ERT_CMD_STATE_SUBMITTED = 7
    ERT_CMD_STATE_TIMEOUT = 8
    ERT_CMD_STATE_NORESPONSE = 9
    ERT_CMD_STATE_SKERROR = 10
    ERT_CMD_STATE_SKCRASHED = 11


class xrt_info_device(IntEnum):
    bdf = 0
    interface_uuid = 1
    kdma = 2
    max_clock_frequency_mhz = 3
    m2m = 4
    name = 5
    nodma = 6
    offline = 7
    electrical = 8
    thermal = 9
    mechanical = 10
    memory = 11
    platform = 12
    pcie_info = 13
    host = 14
    dynamic_regions = 15
    vmr = 16


# -- test hooks ---------------------------------------------------------------------------------
_DEVICES: list[dict] = [{"bdf": "0000:3b:00.1", "name": "xilinx_u55c_gen3x16_xdma_base_3"}]
_FAULTS: list[ert_cmd_state] = []
_LOCK = threading.Lock()
stats = {"bo_allocs": 0, "runs": 0, "syncs_to_device": 0, "syncs_from_device": 0}
cu_runs: dict[str, int] = {}


def set_devices(devices: list[dict]) -> None:
    _DEVICES[:] = devices


def inject_fault(state: ert_cmd_state, count: int = 1) -> None:
    with _LOCK:
        _FAULTS.extend([state] * count)


def reset() -> None:
    set_devices([{"bdf": "0000:3b:00.1", "name": "xilinx_u55c_gen3x16_xdma_base_3"}])
    _FAULTS.clear()
    for k in stats:
        stats[k] = 0
    cu_runs.clear()


def write_xclbin(path, kernels, *, xsa: str = "xilinx_u55c_gen3x16_xdma_3_202210_1", uuid: str | None = None) -> str:
    """Write the JSON stand-in for an xclbin. ``kernels``: [{"name": top, "kind", "spec": dict, "cus": [...]}]."""
    u = uuid or str(_uuidlib.uuid4())
    Path(path).write_text(json.dumps({"format": FORMAT, "uuid": u, "xsa": xsa, "kernels": kernels}))
    return u


# -- API surface ----------------------------------------------------------------------------------
def enumerate_devices() -> int:
    return len(_DEVICES)


class uuid:
    def __init__(self, uuid_str: str) -> None:
        self._s = str(uuid_str).lower()

    def to_string(self) -> str:
        return self._s

    def __eq__(self, other) -> bool:
        return isinstance(other, uuid) and other._s == self._s


class xclbin:
    class xclbinkernel:
        def __init__(self, d: dict | None = None) -> None:
            self._d = d or {}

        def get_name(self) -> str:
            return self._d.get("name", "")

        def get_num_args(self) -> int:
            return len(self._d.get("args", []))

    def __init__(self, filename: str | None = None) -> None:
        self._d = {"kernels": [], "uuid": str(_uuidlib.UUID(int=0)), "xsa": ""}
        if filename is not None:
            try:
                d = json.loads(Path(filename).read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise RuntimeError(f"xclbin: cannot read {filename}: {e}") from None
            if not isinstance(d, dict) or d.get("format") != FORMAT:
                raise RuntimeError(f"xclbin: {filename} is not a valid xclbin (test fake reads {FORMAT} JSON)")
            self._d = d

    def get_kernels(self):
        return [xclbin.xclbinkernel(k) for k in self._d["kernels"]]

    def get_xsa_name(self) -> str:
        return self._d.get("xsa", "")

    def get_uuid(self) -> uuid:
        return uuid(self._d["uuid"])


class device:
    def __init__(self, index_or_bdf=None) -> None:
        if isinstance(index_or_bdf, int):
            if not 0 <= index_or_bdf < len(_DEVICES):
                raise RuntimeError(f"No such device index '{index_or_bdf}'")
            self._d = _DEVICES[index_or_bdf]
        else:
            found = [d for d in _DEVICES if d["bdf"] == index_or_bdf]
            if not found:
                raise RuntimeError(f"No such device with bdf '{index_or_bdf}'")
            self._d = found[0]
        self._xclbin: xclbin | None = None
        self._tops: dict = {}

    def load_xclbin(self, xb) -> uuid:
        if not isinstance(xb, xclbin):
            xb = xclbin(str(xb))
        self._xclbin = xb
        self._tops = {}
        return xb.get_uuid()

    def get_xclbin_uuid(self) -> uuid:
        return self._xclbin.get_uuid() if self._xclbin else uuid(str(_uuidlib.UUID(int=0)))

    def get_info(self, key: xrt_info_device) -> str:
        if key == xrt_info_device.bdf:
            return self._d["bdf"]
        if key in (xrt_info_device.name, xrt_info_device.platform):
            return self._d["name"]
        raise RuntimeError(f"get_info: key {key!r} not available")

    def _top(self, entry: dict):
        from offload.hls.ctop import load_top
        from offload.kernels.registry import get_kind

        name = entry["name"]
        if name not in self._tops:
            spec = get_kind(entry["kind"]).spec_from_json(entry["spec"])
            self._tops[name] = load_top(spec)
        return self._tops[name]


_ADDR = itertools.count(0x4000_0000, 0x10_0000)


class bo:
    class flags(IntEnum):
        normal = 0
        cacheable = 1
        device_only = 2
        host_only = 3
        p2p = 4
        svm = 5

    def __init__(self, dev: device, size: int, flags: "bo.flags", group: int) -> None:
        if not isinstance(dev, device):
            raise TypeError("bo(): incompatible constructor arguments")
        if int(size) <= 0:
            raise RuntimeError("bo: size must be > 0")
        self._host = np.zeros(int(size), dtype=np.uint8)
        self._dev = np.full(int(size), 0xA5, dtype=np.uint8)  # device memory starts as garbage
        self.group = int(group)
        self._addr = next(_ADDR)
        stats["bo_allocs"] += 1

    def write(self, data, seek: int) -> None:
        b = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        if seek + b.size > self._host.size:
            raise RuntimeError("bo.write: out of range")
        self._host[seek : seek + b.size] = b

    def read(self, size: int, skip: int) -> np.ndarray:
        if skip + size > self._host.size:
            raise RuntimeError("bo.read: out of range")
        return self._host[skip : skip + size].view(np.int8).copy()

    def sync(self, direction: xclBOSyncDirection, size: int | None = None, offset: int = 0) -> None:
        size = self._host.size - offset if size is None else size
        if offset + size > self._host.size:
            raise RuntimeError("bo.sync: out of range")
        sl = slice(offset, offset + size)
        if direction == xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE:
            self._dev[sl] = self._host[sl]
            stats["syncs_to_device"] += 1
        elif direction == xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE:
            self._host[sl] = self._dev[sl]
            stats["syncs_from_device"] += 1
        else:
            raise RuntimeError(f"bo.sync: unsupported direction {direction!r}")

    def map(self) -> memoryview:
        return memoryview(self._host)

    def size(self) -> int:
        return int(self._host.size)

    def address(self) -> int:
        return self._addr


for _f in bo.flags:
    setattr(bo, _f.name, _f)


class run:
    def __init__(self, state: ert_cmd_state = ert_cmd_state.ERT_CMD_STATE_NEW) -> None:
        self._state = state

    def wait(self, timeout_ms: int | None = None) -> ert_cmd_state:
        return self._state

    def state(self) -> ert_cmd_state:
        return self._state


class kernel:
    class cu_access_mode(IntEnum):
        exclusive = 0
        shared = 1
        none = 2

    def __init__(self, dev: device, xuuid: uuid, name: str, mode: "kernel.cu_access_mode" = None) -> None:
        if dev._xclbin is None or dev.get_xclbin_uuid() != xuuid:
            raise RuntimeError(f"kernel: xclbin with uuid {xuuid.to_string()} is not loaded on the device")
        top, _, cu = name.partition(":")
        cu = cu.strip("{}")
        entries = [k for k in dev._xclbin._d["kernels"] if k["name"] == top]
        if not entries:
            raise RuntimeError(f"No kernel with name ({top}) found in xclbin")
        self._entry = entries[0]
        cus = self._entry.get("cus") or [f"{top}_1"]
        if cu and cu not in cus:
            raise RuntimeError(f"No compute units matching '{name}'")
        self._cu_index = cus.index(cu) if cu else 0
        self._dev = dev
        self._top = dev._top(self._entry)
        self.cu_name = cu or cus[0]
        self._lock = threading.Lock()

    def group_id(self, index: int) -> int:
        a = self._top.args[index]
        if a.role == "scalar":
            raise RuntimeError(f"group_id: argument {index} is not a global memory argument")
        bundles = sorted({x.bundle or "" for x in self._top.args if x.role != "scalar"})
        # Each CU has its own banks, unless the xclbin entry says its CUs share them
        # ("banks": "shared", as the embedding connectivity maps every CU's tables identically).
        per_cu = 0 if self._entry.get("banks") == "shared" else self._cu_index * 16
        return per_cu + bundles.index(a.bundle or "")

    def __call__(self, *args) -> run:
        top = self._top
        if len(args) != len(top.args):
            raise RuntimeError(f"kernel {top.name}: {len(top.args)} arguments expected, got {len(args)}")
        values = []
        for i, (a, v) in enumerate(zip(top.args, args)):
            if a.role == "scalar":
                if not isinstance(v, (int, np.integer, float)):
                    raise TypeError(f"kernel {top.name}: argument {i} ({a.name}) must be a scalar")
                values.append(v)
            else:
                if not isinstance(v, bo):
                    raise TypeError(f"kernel {top.name}: argument {i} ({a.name}) must be a bo")
                if v.group != self.group_id(i):
                    raise RuntimeError(f"kernel {top.name}: bo for argument {i} ({a.name}) is in bank {v.group}, the CU is connected to {self.group_id(i)}")
                values.append(v._dev)
        with _LOCK:
            fault = _FAULTS.pop(0) if _FAULTS else None
        stats["runs"] += 1
        cu_runs[self.cu_name] = cu_runs.get(self.cu_name, 0) + 1
        if fault is not None:
            return run(fault)
        with self._lock:
            top(values)
        return run(ert_cmd_state.ERT_CMD_STATE_COMPLETED)
