"""TEST STAND-IN for XRT's ``pyxrt`` binding, as strict as the real one, per XRT release.

Never shipped; tests put ``tests/fakes`` first on ``sys.path`` and then choose a version profile
with :func:`use_profile` (``"2.11"``, ``"2.12"``, ``"2.16"``, ``"2.17"``, ``"2.23"``; default the
newest). Every API method below names the source it mirrors: Xilinx/XRT
``src/python/pybind11/src/pyxrt.cpp`` at the tags ``202120.2.12.427`` (2.12),
``202320.2.16.204`` (2.16), ``202410.2.17.319`` (2.17) and ``202610.2.23.244`` (2.23), and the
C++ it wraps (``src/runtime_src/core/common/api/xrt_kernel.cpp``, ``include/xrt/xrt_kernel.h``).

The warts kept on purpose, because offload must survive them on a real card:

- ``kernel(...)`` tries ``set_arg(i, bo)`` and then ``set_arg<int>(i, int)`` per argument and
  swallows every exception: a float scalar, an int outside int32 or a buffer in a bank the CU
  cannot reach is silently left unset (2.12), or the buffer is cloned into the connected bank so
  whatever the kernel writes there is lost (2.13 and later, ``validate_bo_at_index``).
- runs are asynchronous: outputs land in device memory only once the run is seen complete;
  ``wait(ms)`` returns ``ERT_CMD_STATE_TIMEOUT`` after ``ms``; ``wait()`` blocks; no ``abort``.
- ``ert_cmd_state`` is a pybind11 enum, not an ``IntEnum``: no ordering, no ``RUNNING`` member
  (a running command reads as ``ert_cmd_state.???``); ``uuid`` has no ``__eq__``.
- ``bo.sync`` takes ``(dir, size, offset)``; ``(dir)`` alone only from 2.16. The kernel mode
  argument is optional, ``hw_context`` and ``device.register_xclbin`` exist only from 2.16;
  ``enumerate_devices`` only from 2.17; ``device.load_xclbin`` and ``kernel(device, uuid, ...)``
  warn ``DeprecationWarning`` from 2.23. XRT 2.11 has no ``xrt_info_device``, no
  ``xclbin.get_kernels`` and no ``device(bdf)``.

THE "XCLBIN" IS A TEST ARTIFACT: there is no real xclbin here, so this fake reads a small JSON
file (``{"format": "offload-test-fake-xclbin", "uuid", "xsa", "kernels": [{"name", "kind",
"spec", "cus", "banks"?}]}``; ``"banks": "shared"`` wires every CU to the same banks) naming
each kernel's kind and spec; it is written by ``write_xclbin`` below. A real one is an axlf.

Host memory and the persistent kernel (what launch="persistent" needs):

- ``bo.flags.host_only`` is bound in every profile (pyxrt.cpp 202110.2.11.634 line 159 ..
  202610.2.23.244 line 502): such a bo is one array the "kernel" and the host share; ``sync`` on it
  moves nothing (a cache flush or invalidate, xrt_bo.cpp ``bo_impl::sync`` comment, 2.12 .. 2.23).
  Allocating one fails while host memory is not reserved (``set_host_memory(False)``: no
  ``xrt-smi configure --host-mem``).
- ``xclbin.get_mems`` and ``xclbinmem.get_tag``/``get_index`` from 2.12 (pyxrt.cpp
  202120.2.12.427 lines 270-275, 293; absent in 202110.2.11.634): the host finds a HOST[0] bank.
- ``kernel.read_register``/``write_register`` only in 2.11 (pyxrt.cpp 202110.2.11.634 lines
  144-145); gone from 202120.2.12.427 through 202610.2.23.244. ``xrt::ip`` and ``run.abort`` are
  never bound. So no profile offload supports offers register access, and a running kernel cannot
  be stopped from Python except through memory it polls.
- A kernel entry with ``"ring": {"rows", "slots"}`` is a persistent top (offload.hls.persistent):
  ``kernel(ring_bo, *resident_bos)`` starts the generated loop, built with g++, in a thread over
  the bo's device memory (its HOST[0] memory for a ``host_only`` bo; ``"ring_memory": "HOST"``
  connects the ring port to HOST[0]). The run reads as running until the loop ends on the stop
  word (COMPLETED); a loop that died (``inject_ring_fault``) never completes, as a hung CU.

Test hooks (not pyxrt API): ``use_profile``, ``set_devices``, ``inject_fault(state | HANG,
count)``, ``release_hangs``, ``set_run_time(seconds)``, ``set_host_memory(enabled)``,
``inject_ring_fault(...)``, ``stats``, ``cu_runs``, ``warnings_seen``, ``ring_threads``.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import sys
import threading
import time
import uuid as _uuidlib
import warnings
from pathlib import Path

import numpy as np

FORMAT = "offload-test-fake-xclbin"
PROFILES = ("2.11", "2.12", "2.16", "2.17", "2.23")
HANG = "hang"  # inject_fault(HANG): the run never completes until release_hangs()
_V = (2, 23)
_PROFILE_SET = False


def _vt(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


# -- pybind11 enums --------------------------------------------------------------------------------
class _Enum:
    """A value of a pybind11 ``py::enum_`` (pybind11/pybind11.h ``enum_base::init``): ``name``,
    ``value``, ``__int__``, ``__index__``, ``__hash__``; no ordering (``<`` raises TypeError);
    an unscoped C enum also compares equal to its integer, a scoped ``enum class`` only to its
    own type; a value without a binding is named ``???``."""

    _names: dict[int, str] = {}
    _convertible = True

    def __init__(self, value: int) -> None:
        self._value = int(value)

    @property
    def name(self) -> str:
        return type(self)._names.get(self._value, "???")

    @property
    def value(self) -> int:
        return self._value

    def __int__(self) -> int:
        return self._value

    def __index__(self) -> int:
        return self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __eq__(self, other) -> bool:
        if type(other) is type(self):
            return other._value == self._value
        if type(self)._convertible and other is not None and not isinstance(other, _Enum):
            return self._value == other
        return False

    def __ne__(self, other) -> bool:
        return not self.__eq__(other)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {self._value}>"

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


def _enum(name: str, members: dict[str, int], convertible: bool = True, parent=None):
    cls = type(name, (_Enum,), {"_names": {v: k for k, v in members.items()}, "_convertible": convertible})
    cls.__members__ = {}
    for k, v in members.items():
        inst = cls(v)
        setattr(cls, k, inst)
        cls.__members__[k] = inst
        if parent is not None:  # .export_values()
            setattr(parent, k, inst)
    return cls


XCL_BO_FLAGS_NONE = 0
xclBOSyncDirection = _enum("xclBOSyncDirection", {
    "XCL_BO_SYNC_BO_TO_DEVICE": 0, "XCL_BO_SYNC_BO_FROM_DEVICE": 1, "XCL_BO_SYNC_BO_GMIO_TO_AIE": 2, "XCL_BO_SYNC_BO_AIE_TO_GMIO": 3,
})
# include/ert.h numbers them NEW=1 .. SKCRASHED=11 with RUNNING=3, which pyxrt.cpp never binds.
ert_cmd_state = _enum("ert_cmd_state", {
    "ERT_CMD_STATE_NEW": 1, "ERT_CMD_STATE_QUEUED": 2, "ERT_CMD_STATE_COMPLETED": 4, "ERT_CMD_STATE_ERROR": 5,
    "ERT_CMD_STATE_ABORT": 6, "ERT_CMD_STATE_SUBMITTED": 7, "ERT_CMD_STATE_TIMEOUT": 8, "ERT_CMD_STATE_NORESPONSE": 9,
    "ERT_CMD_STATE_SKERROR": 10, "ERT_CMD_STATE_SKCRASHED": 11,
})
_RUNNING = 3
_INFO = ["bdf", "interface_uuid", "kdma", "max_clock_frequency_mhz", "m2m", "name", "nodma", "offline", "electrical",
         "thermal", "mechanical", "memory", "platform", "pcie_info", "host", "dynamic_regions", "vmr"]
# xrt::info::device is an enum class: it equals only itself.
xrt_info_device = _enum("xrt_info_device", {k: i for i, k in enumerate(_INFO)}, convertible=False)


# -- test hooks ---------------------------------------------------------------------------------
_DEFAULT_DEVICES = [{"bdf": "0000:3b:00.1", "name": "xilinx_u55c_gen3x16_xdma_base_3"}]
_DEVICES: list[dict] = list(_DEFAULT_DEVICES)
_FAULTS: list = []
_LOCK = threading.Lock()
_HANG = threading.Event()
_RUN_TIME = [0.0]
_HOST_MEMORY = [True]
_RING_FAULTS: list = []
HOST_BANK = 64  # the mem_topology index of HOST[0] in these xclbins (after the card's banks)
stats = {"bo_allocs": 0, "runs": 0, "syncs_to_device": 0, "syncs_from_device": 0, "device_opens": 0, "clones": 0, "skipped_args": 0,
         "host_syncs": 0, "host_only_allocs": 0}
ring_threads: list = []  # every persistent loop's thread, for the tests to join
cu_runs: dict[str, int] = {}
warnings_seen: list[str] = []


def use_profile(version: str) -> None:
    """Shape this module like pyxrt of XRT ``version`` (once per import: the fixture re-imports)."""
    global _V, _PROFILE_SET
    if version not in PROFILES:
        raise ValueError(f"unknown XRT profile {version!r}; known: {PROFILES}")
    if _PROFILE_SET:
        raise RuntimeError("use_profile: call it once, on a fresh import")
    _PROFILE_SET = True
    _V = _vt(version)
    mod = sys.modules[__name__]
    if _V >= (2, 12):
        del kernel.read_register
        del kernel.write_register
    if _V < (2, 23):
        del hw_context.get_xclbin_uuid
    if _V < (2, 17):
        del mod.enumerate_devices
    if _V < (2, 16):
        del mod.hw_context
        del device.register_xclbin
    if _V < (2, 12):
        del mod.xrt_info_device
        del xclbin.get_kernels
        del xclbin.get_mems
        del device.get_info


def set_devices(devices: list[dict]) -> None:
    _DEVICES[:] = devices


def inject_fault(state, count: int = 1) -> None:
    """The next ``count`` runs end in ``state`` (an ``ert_cmd_state``) without running, or never end (``HANG``)."""
    with _LOCK:
        _FAULTS.extend([state] * count)


def release_hangs() -> None:
    _HANG.set()


def set_run_time(seconds: float) -> None:
    """How long a run takes (real time; keep it to milliseconds)."""
    _RUN_TIME[0] = float(seconds)


def set_host_memory(enabled: bool) -> None:
    """Whether host memory is reserved for the card (``xrt-smi configure --host-mem ... enable``)."""
    _HOST_MEMORY[0] = bool(enabled)


def inject_ring_fault(*, die_at: int = 0, after_compute: bool = False, delay_permille: int = 0, max_delay_us: int = 0, seed: int = 0) -> None:
    """The next persistent loop started runs with these C-simulation hooks (offload_ring::Csim):
    it dies at request ``die_at`` (before computing, or after writing the outputs but not the
    response word), and/or delays requests at random."""
    with _LOCK:
        _RING_FAULTS.append(dict(die_at=die_at, after_compute=after_compute, delay_permille=delay_permille, max_delay_us=max_delay_us, seed=seed))


def reset() -> None:
    set_devices(list(_DEFAULT_DEVICES))
    _HOST_MEMORY[0] = True
    _RING_FAULTS.clear()
    ring_threads.clear()
    _FAULTS.clear()
    _HANG.clear()
    _RUN_TIME[0] = 0.0
    for k in stats:
        stats[k] = 0
    cu_runs.clear()
    warnings_seen.clear()


def write_xclbin(path, kernels, *, xsa: str = "xilinx_u55c_gen3x16_xdma_3_202210_1", uuid: str | None = None) -> str:
    """Write the JSON stand-in for an xclbin. ``kernels``: [{"name": top, "kind", "spec": dict, "cus": [...]}]."""
    u = uuid or str(_uuidlib.uuid4())
    Path(path).write_text(json.dumps({"format": FORMAT, "uuid": u, "xsa": xsa, "kernels": kernels}))
    return u


def _deprecated(msg: str) -> None:
    if _V >= (2, 23):
        warnings_seen.append(msg)
        warnings.warn(msg, DeprecationWarning, stacklevel=3)


def _incompatible(what: str):
    return TypeError(f"{what}: incompatible function arguments. The following argument types are supported: ...")


# -- API surface ----------------------------------------------------------------------------------
def enumerate_devices() -> int:
    """``m.def("enumerate_devices", &xrt::system::enumerate_devices)``: pyxrt.cpp from 2.17 (202410.2.17.319)."""
    return len(_DEVICES)


class uuid:
    """``py::class_<xrt::uuid>`` with ``py::init<char*>`` and ``to_string`` only (pyxrt.cpp 2.12 .. 2.23):
    no ``__eq__``, so two uuid objects of one xclbin compare unequal."""

    def __init__(self, uuid_str: str) -> None:
        if not isinstance(uuid_str, str):
            raise _incompatible("uuid.__init__")
        self._s = str(_uuidlib.UUID(uuid_str))

    def to_string(self) -> str:
        """``.def("to_string", &xrt::uuid::to_string)`` (pyxrt.cpp 202120.2.12.427 .. 202610.2.23.244)."""
        return self._s


class xclbin:
    """``py::class_<xrt::xclbin>`` (pyxrt.cpp 2.12 .. 2.23): ``xclbin(path)``, ``get_kernels`` (2.12+),
    ``get_xsa_name``, ``get_uuid``."""

    class xclbinkernel:
        """``xrt::xclbin::kernel``: ``get_name``, ``get_num_args`` (pyxrt.cpp 2.12)."""

        def __init__(self, d: dict | None = None) -> None:
            self._d = d or {}

        def get_name(self) -> str:
            """``xrt::xclbin::kernel::get_name`` (pyxrt.cpp 202120.2.12.427)."""
            return self._d.get("name", "")

        def get_num_args(self) -> int:
            """``xrt::xclbin::kernel::get_num_args`` (pyxrt.cpp 202120.2.12.427)."""
            return len(self._d.get("args", []))

    class xclbinmem:
        """``xrt::xclbin::mem``: ``get_tag``, ``get_index``, ``get_base_address``, ``get_size_kb``,
        ``get_used`` (pyxrt.cpp 202120.2.12.427 lines 270-275)."""

        def __init__(self, index: int = 0, tag: str = "") -> None:
            self._i, self._tag = index, tag

        def get_tag(self) -> str:
            return self._tag

        def get_index(self) -> int:
            return self._i

        def get_base_address(self) -> int:
            return 0x4000_0000 * self._i

        def get_size_kb(self) -> int:
            return 256 * 1024

        def get_used(self) -> bool:
            return True

    def __init__(self, filename: str | None = None) -> None:
        self._d = {"kernels": [], "uuid": str(_uuidlib.UUID(int=0)), "xsa": ""}
        if filename is not None:
            if not isinstance(filename, str):
                raise _incompatible("xclbin.__init__")
            try:
                d = json.loads(Path(filename).read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise RuntimeError(f"xclbin: cannot read {filename}: {e}") from None
            if not isinstance(d, dict) or d.get("format") != FORMAT:
                raise RuntimeError(f"xclbin: {filename} is not a valid xclbin (test fake reads {FORMAT} JSON)")
            self._d = d

    def get_kernels(self):
        """``.def("get_kernels", &xrt::xclbin::get_kernels)``: from 2.12 (pyxrt.cpp 202120.2.12.427); absent in 2.11."""
        return [xclbin.xclbinkernel(k) for k in self._d["kernels"]]

    def get_mems(self):
        """``.def("get_mems", &xrt::xclbin::get_mems)``: from 2.12 (pyxrt.cpp 202120.2.12.427 line 293). The
        mem_topology here: HBM[0..63] (the fake's card banks, see ``kernel.group_id``) and HOST[0]."""
        return [xclbin.xclbinmem(i, f"HBM[{i}]") for i in range(HOST_BANK)] + [xclbin.xclbinmem(HOST_BANK, "HOST[0]")]

    def get_xsa_name(self) -> str:
        """``xrt::xclbin::get_xsa_name`` (pyxrt.cpp 202120.2.12.427)."""
        return self._d.get("xsa", "")

    def get_uuid(self) -> uuid:
        """``xrt::xclbin::get_uuid``: a new uuid object each call (pyxrt.cpp 202120.2.12.427)."""
        return uuid(self._d["uuid"])


class device:
    """``py::class_<xrt::device>`` (pyxrt.cpp): ``device(index)``; ``device(bdf)`` from 2.12;
    ``load_xclbin(xclbin | path)`` (a deprecated shim warning ``DeprecationWarning`` in 2.23);
    ``register_xclbin`` from 2.16; ``get_xclbin_uuid``; ``get_info(xrt_info_device)`` -> str."""

    def __init__(self, index_or_bdf=None) -> None:
        if isinstance(index_or_bdf, bool) or not isinstance(index_or_bdf, (int, str)):
            raise _incompatible("device.__init__")
        if isinstance(index_or_bdf, int):
            if index_or_bdf < 0:
                raise _incompatible("device.__init__")  # py::init<unsigned int>
            if index_or_bdf >= len(_DEVICES):
                raise RuntimeError(f"Could not open device with index '{index_or_bdf}'")
            self._d = _DEVICES[index_or_bdf]
        else:
            if _V < (2, 12):
                raise _incompatible("device.__init__")
            found = [d for d in _DEVICES if d["bdf"] == index_or_bdf]
            if not found:
                raise RuntimeError(f"No such device with bdf '{index_or_bdf}'")
            self._d = found[0]
        self._xclbin: xclbin | None = None
        self._registered: dict[str, xclbin] = {}
        self._tops: dict = {}
        stats["device_opens"] += 1

    def load_xclbin(self, xb) -> uuid:
        """``device.load_xclbin(xclbin | path)`` (pyxrt.cpp 202120.2.12.427); the deprecated ``load_xclbin_compat`` shim warning
        ``DeprecationWarning`` in pyxrt.cpp 202610.2.23.244."""
        _deprecated("pyxrt.device.load_xclbin() is deprecated; use pyxrt.hw_context(device, xclbin) or pyxrt.hw_context(device, xclbin_path) instead")
        if isinstance(xb, str):
            xb = xclbin(xb)
        if not isinstance(xb, xclbin):
            raise _incompatible("device.load_xclbin")
        self._program(xb)
        return xb.get_uuid()

    def register_xclbin(self, xb) -> uuid:
        """``device.register_xclbin(xclbin)``: from pyxrt.cpp 202320.2.16.204; does not program the card."""
        if not isinstance(xb, xclbin):
            raise _incompatible("device.register_xclbin")
        self._registered[xb._d["uuid"]] = xb
        return xb.get_uuid()

    def get_xclbin_uuid(self) -> uuid:
        """``hw_context.get_xclbin_uuid``: bound only from pyxrt.cpp 202610.2.23.244."""
        return self._xclbin.get_uuid() if self._xclbin else uuid(str(_uuidlib.UUID(int=0)))

    def get_info(self, key) -> str:
        """``device.get_info(xrt_info_device)`` -> str, ``"NA"`` for keys it cannot convert (pyxrt.cpp 202120.2.12.427);
        any other key type is a pybind11 TypeError."""
        if type(key) is not xrt_info_device:
            raise _incompatible("device.get_info")
        if key == xrt_info_device.bdf:
            return self._d["bdf"]
        if key in (xrt_info_device.name, xrt_info_device.platform):
            return self._d["name"]
        return "NA"

    def _program(self, xb: xclbin) -> None:
        self._xclbin = xb
        self._tops = {}

    def _top(self, entry: dict):
        """The entry's compiled top and its argument list: the per-call top (``load_top``), or for a
        ``"ring"`` entry the persistent loop ``offload.hls.persistent`` writes, over the ring
        layout the xclbin was built for."""
        from offload.hls.ctop import load_top
        from offload.kernels.registry import get_kind

        name = entry["name"]
        if name not in self._tops:
            spec = get_kind(entry["kind"]).spec_from_json(entry["spec"])
            if "ring" in entry:
                from offload.hls import persistent
                from offload.hls.registry import KernelArg

                layout = persistent.ring_layout(spec, rows=int(entry["ring"]["rows"]), slots=int(entry["ring"]["slots"]))
                top = persistent.load(spec, layout)
                args = [KernelArg(persistent.RING_ARG, "input", np.uint64, persistent.RING_BUNDLE), *persistent.resident_args(spec)]
                self._tops[name] = (top, args)
            else:
                top = load_top(spec)
                self._tops[name] = (top, list(top.args))
        return self._tops[name]


class hw_context:
    """``py::class_<xrt::hw_context>`` from 2.16 (pyxrt.cpp 202320.2.16.204): ``hw_context(device,
    uuid)`` of an xclbin registered with ``device.register_xclbin``; creating it programs the card."""

    def __init__(self, dev=None, xuuid=None, *rest) -> None:
        if not isinstance(dev, device) or rest:
            raise _incompatible("hw_context.__init__")
        if isinstance(xuuid, xclbin) and _V >= (2, 23):  # hw_context(device, xclbin) from 2.23
            xuuid = dev.register_xclbin(xuuid)
        if not isinstance(xuuid, uuid):
            raise _incompatible("hw_context.__init__")
        xb = dev._registered.get(xuuid._s)
        if xb is None:
            raise RuntimeError(f"hw_context: xclbin {xuuid.to_string()} is not registered with the device")
        dev._program(xb)
        self._dev = dev
        self._xclbin = xb

    def get_xclbin_uuid(self) -> uuid:
        """``hw_context.get_xclbin_uuid``: bound only from pyxrt.cpp 202610.2.23.244."""
        return self._xclbin.get_uuid()


_ADDR = itertools.count(0x4000_0000, 0x10_0000)


class bo:
    """``py::class_<xrt::bo>`` (pyxrt.cpp 2.12 .. 2.23): ``bo(device, size, flags, group)``; ``write(buffer,
    seek)``; ``read(size, skip)`` -> int8 array; ``sync(dir, size, offset)`` and, from 2.16, ``sync(dir)``;
    ``map``, ``size``, ``address``. Host and device memory are apart: only ``sync`` moves bytes."""

    flags = _enum("flags", {"normal": 0, "cacheable": 1, "device_only": 2, "host_only": 3, "p2p": 4, "svm": 5})

    def __init__(self, dev, size, flags, group) -> None:
        if not isinstance(dev, device) or type(flags) is not bo.flags or isinstance(size, bool) or not isinstance(size, (int, np.integer)):
            raise _incompatible("bo.__init__")
        if int(size) <= 0:
            raise RuntimeError("bo: size must be > 0")
        self._host_only = flags == bo.flags.host_only
        if self._host_only:
            # xocl allocates it from the memory `xrt-smi configure --host-mem` reserved.
            if not _HOST_MEMORY[0]:
                raise RuntimeError("bo: failed to allocate host_only buffer: host memory is not enabled (xrt-smi configure --host-mem)")
            self._host = self._dev = _aligned(int(size), 0)  # one memory: the card reads and writes it over PCIe
            stats["host_only_allocs"] += 1
        else:
            self._host = _aligned(int(size), 0)
            self._dev = _aligned(int(size), 0xA5)  # device memory starts as garbage
        self.group = int(group)
        self._addr = next(_ADDR)
        stats["bo_allocs"] += 1

    def write(self, data, seek: int) -> None:
        """``bo.write(buffer, seek)``: into host memory only (pyxrt.cpp 202120.2.12.427)."""
        b = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        if seek + b.size > self._host.size:
            raise RuntimeError("bo.write: out of range")
        self._host[seek : seek + b.size] = b

    def read(self, size: int, skip: int) -> np.ndarray:
        """``bo.read(size, skip)`` -> ``py::array_t<char>`` (int8) of host memory (pyxrt.cpp 202120.2.12.427)."""
        if skip + size > self._host.size:
            raise RuntimeError("bo.read: out of range")
        return self._host[skip : skip + size].view(np.int8).copy()

    def sync(self, direction, *size_offset) -> None:
        """``bo.sync(dir, size, offset)`` (pyxrt.cpp 202120.2.12.427); ``bo.sync(dir)`` only from pyxrt.cpp 202320.2.16.204."""
        if type(direction) is not xclBOSyncDirection:
            raise _incompatible("bo.sync")
        if len(size_offset) == 2:
            size, offset = (int(x) for x in size_offset)
        elif not size_offset and _V >= (2, 16):
            size, offset = self._host.size, 0
        else:
            raise _incompatible("bo.sync")
        if offset + size > self._host.size:
            raise RuntimeError("bo.sync: out of range")
        sl = slice(offset, offset + size)
        if self._host_only:
            # No DMA: a cache flush/invalidate (xrt_bo.cpp bo_impl::sync comment, 2.12 .. 2.23).
            stats["host_syncs"] += 1
            return
        if direction == xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE:
            self._dev[sl] = self._host[sl]
            stats["syncs_to_device"] += 1
        elif direction == xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE:
            self._host[sl] = self._dev[sl]
            stats["syncs_from_device"] += 1
        else:
            raise RuntimeError(f"bo.sync: unsupported direction {direction!r}")

    def map(self) -> memoryview:
        """``bo.map()`` -> memoryview of host memory (pyxrt.cpp 202120.2.12.427)."""
        return memoryview(self._host)

    def size(self) -> int:
        """``xrt::bo::size`` (pyxrt.cpp 202120.2.12.427)."""
        return int(self._host.size)

    def address(self) -> int:
        """``xrt::bo::address``: the device physical address (pyxrt.cpp 202120.2.12.427)."""
        return self._addr


def _aligned(size: int, fill: int) -> np.ndarray:
    """``size`` bytes, page-aligned as XRT's buffers are (the ring loop needs 64-byte alignment)."""
    raw = np.full(size + 4096, fill, dtype=np.uint8)
    start = (-raw.ctypes.data) % 4096
    return raw[start: start + size]


for _f in bo.flags.__members__.values():  # .export_values()
    setattr(bo, _f.name, _f)

_TERMINAL = {int(s) for s in ert_cmd_state.__members__.values()} - {1, 2, 7}


class run:
    """``py::class_<xrt::run>`` (pyxrt.cpp 2.12 .. 2.23): ``wait()`` (``r.wait(0)``: no timeout),
    ``wait(timeout_ms: unsigned)`` -> ``ERT_CMD_STATE_TIMEOUT`` when it expires (xrt_kernel.h),
    ``state()``; no ``abort``. The outputs reach device memory when the run completes."""

    def __init__(self, end_state=None, done_at: float = 0.0, commit=None, hang: bool = False, loop=None) -> None:
        self._end = end_state
        self._done_at = done_at
        self._commit = commit
        self._hang = hang
        self._loop = loop  # a persistent loop: (thread, ended-on-stop-word event)
        self._lock = threading.Lock()
        self._state = 1 if end_state is None else _RUNNING  # a default-constructed run is NEW

    def _poll(self) -> None:
        with self._lock:
            if self._state in _TERMINAL or self._end is None:
                return
            if self._loop is not None:
                thread, stopped = self._loop
                if stopped.is_set():
                    self._state = int(ert_cmd_state.ERT_CMD_STATE_COMPLETED)
                elif not thread.is_alive() and _HANG.is_set():  # a dead loop: hung until released
                    self._state = int(ert_cmd_state.ERT_CMD_STATE_ABORT)
                return
            if self._hang and not _HANG.is_set():
                return
            if self._hang or time.monotonic() >= self._done_at:
                if self._hang:
                    self._end = ert_cmd_state.ERT_CMD_STATE_ABORT
                if self._commit is not None and self._end == ert_cmd_state.ERT_CMD_STATE_COMPLETED:
                    self._commit()
                self._state = int(self._end)

    def state(self):
        """``run.state()``: the ERT packet state (xrt_kernel.cpp ``run_impl::state`` at 202120.2.12.427); a running
        command reads ``ert_cmd_state.???`` (3), which pyxrt.cpp never binds."""
        self._poll()
        return ert_cmd_state(self._state)

    def wait(self, *timeout_ms):
        """``run.wait()`` is ``r.wait(0)``, no timeout; ``run.wait(timeout_ms: unsigned)`` returns
        ``ERT_CMD_STATE_TIMEOUT`` when it expires (pyxrt.cpp 202120.2.12.427, include/xrt/xrt_kernel.h). Neither releases
        the GIL (no ``gil_scoped_release`` up to 202610.2.23.244): this blocks with it held."""
        if len(timeout_ms) > 1 or (timeout_ms and (isinstance(timeout_ms[0], (bool, float)) or not isinstance(timeout_ms[0], (int, np.integer)) or timeout_ms[0] < 0)):
            raise _incompatible("run.wait")
        ms = int(timeout_ms[0]) if timeout_ms else 0
        limit = time.monotonic() + ms / 1000 if ms else None
        while True:
            self._poll()
            if self._state in _TERMINAL:
                return ert_cmd_state(self._state)
            now = time.monotonic()
            if limit is not None and now >= limit:
                return ert_cmd_state.ERT_CMD_STATE_TIMEOUT
            until = limit if limit is not None else float("inf")
            if self._loop is not None:
                until = min(until, now + 1e-3)  # poll the loop's thread
            elif not self._hang:
                until = min(until, self._done_at)
            if until == float("inf"):  # a hung run and no timeout
                if not _HANG.wait(10.0):
                    raise AssertionError("fake pyxrt: run.wait() on a hung run would block forever")
            else:
                _sleep_holding_gil(max(until - now, 0.0) + 1e-4)


_LIBC = ctypes.PyDLL(None)  # a PyDLL call keeps the GIL, as a pybind11 function without gil_scoped_release


def _sleep_holding_gil(seconds: float) -> None:
    """pyxrt's ``run.wait`` blocks in C++ with the GIL held (pyxrt.cpp 2.12 .. 2.23): so does this."""
    _LIBC.usleep(int(seconds * 1e6))


def _as_int(v):
    """pybind11's ``int`` caster with conversion: no float, no value outside C ``int``."""
    if isinstance(v, (float, np.floating)) or not hasattr(v, "__index__"):
        return None
    n = v.__index__()
    return n if -(2**31) <= n < 2**31 else None


class kernel:
    """``py::class_<xrt::kernel>`` (pyxrt.cpp): ``kernel(device, uuid, name, mode)`` (mode optional
    from 2.16, deprecated from 2.23), ``kernel(hw_context, name)`` from 2.16, ``group_id(i)``,
    ``__call__(*args) -> run`` that swallows every failed ``set_arg`` (see the module doc)."""

    cu_access_mode = None  # set below (an enum nested in the class, with .export_values())

    def __init__(self, *args) -> None:
        if len(args) == 2 and _V >= (2, 16) and isinstance(args[0], hw_context) and isinstance(args[1], str):
            ctx, name = args
            dev, xb = ctx._dev, ctx._xclbin
        elif len(args) in (3, 4) and isinstance(args[0], device) and isinstance(args[1], uuid) and isinstance(args[2], str):
            if len(args) == 3 and _V < (2, 16):
                raise _incompatible("kernel.__init__")
            if len(args) == 4 and type(args[3]) is not kernel.cu_access_mode:
                raise _incompatible("kernel.__init__")
            _deprecated("kernel(device, uuid, name[, mode]) is deprecated; use kernel(hw_context, name) instead.")
            dev, xuuid, name = args[:3]
            xb = dev._xclbin
            if xb is None or xb._d["uuid"] != xuuid._s:
                raise RuntimeError(f"kernel: xclbin with uuid {xuuid.to_string()} is not loaded on the device")
        else:
            raise _incompatible("kernel.__init__")
        top, _, cu = name.partition(":")
        cu = cu.strip("{}")
        entries = [k for k in xb._d["kernels"] if k["name"] == top]
        if not entries:
            raise RuntimeError(f"No kernel with name ({top}) found in xclbin")
        self._entry = entries[0]
        cus = self._entry.get("cus") or [f"{top}_1"]
        if cu and cu not in cus:
            raise RuntimeError(f"No compute units matching '{name}'")
        self._cu_index = cus.index(cu) if cu else 0
        self._dev = dev
        self._top, self._args = dev._top(self._entry)
        self.cu_name = cu or cus[0]
        self._lock = threading.Lock()
        self._regs: dict[int, int] = {}

    def read_register(self, offset: int) -> int:
        """``.def("read_register", &xrt::kernel::read_register)``: only in pyxrt.cpp 202110.2.11.634 (line 145)."""
        return self._regs.get(int(offset), 0)

    def write_register(self, offset: int, value: int) -> None:
        """``.def("write_register", &xrt::kernel::write_register)``: only in pyxrt.cpp 202110.2.11.634 (line 144)."""
        self._regs[int(offset)] = int(value)

    def group_id(self, index: int) -> int:
        """``xrt::kernel::group_id(argno)``: the memory bank of a global argument of this CU (pyxrt.cpp 202120.2.12.427);
        ``HOST_BANK`` for the ring port of an entry whose ``"ring_memory"`` is ``"HOST"`` (sp=...:HOST[0])."""
        a = self._args[index]
        if a.role == "scalar":
            raise RuntimeError(f"group_id: argument {index} is not a global memory argument")
        if "ring" in self._entry and index == 0 and self._entry.get("ring_memory") == "HOST":
            return HOST_BANK
        bundles = sorted({x.bundle or "" for x in self._args if x.role != "scalar"})
        # Each CU has its own banks, unless the xclbin entry says its CUs share them
        # ("banks": "shared", as the embedding connectivity maps every CU's tables identically).
        per_cu = 0 if self._entry.get("banks") == "shared" else self._cu_index * 16
        return per_cu + bundles.index(a.bundle or "")

    def __call__(self, *args) -> run:
        """``kernel.__call__(*args)`` (pyxrt.cpp 202120.2.12.427 .. 202610.2.23.244): per argument ``try { r.set_arg(i,
        item.cast<xrt::bo>()) } catch (...) {}`` then ``try { r.set_arg<int>(i, item.cast<int>()) }
        catch (...) {}``, then ``r.start()``. A bo in another bank: ``validate_ip_arg_connectivity``
        throws in 2.12, ``validate_bo_at_index`` clones it into the connected bank from 2.13
        (xrt_kernel.cpp at 202210.2.13.479)."""
        top, targs = self._top, self._args
        values: list = [None] * len(targs)
        for i, v in enumerate(args):
            a = targs[i] if i < len(targs) else None
            if a is None:
                continue  # set_arg throws for an index the kernel lacks; swallowed
            if isinstance(v, bo) and a.role != "scalar":
                if v.group == self.group_id(i):
                    values[i] = v._dev
                elif _V >= (2, 13):  # validate_bo_at_index: "Allocating local copy of argument buffer in connected bank"
                    stats["clones"] += 1
                    values[i] = v._dev.copy()
                continue  # 2.12: "No compute units satisfy requested connectivity", swallowed
            n = _as_int(v)
            if a.role == "scalar" and n is not None and np.dtype(a.dtype).itemsize <= 4:
                values[i] = np.dtype(a.dtype).type(n) if np.dtype(a.dtype).kind == "i" or n >= 0 else None
        for i, a in enumerate(targs):
            if values[i] is None:
                stats["skipped_args"] += 1
                if a.role == "scalar":
                    values[i] = 0  # an argument never set is zero in the command packet
        with _LOCK:
            fault = _FAULTS.pop(0) if _FAULTS else None
        stats["runs"] += 1
        cu_runs[self.cu_name] = cu_runs.get(self.cu_name, 0) + 1
        done_at = time.monotonic() + _RUN_TIME[0]
        if fault == HANG:
            return run(ert_cmd_state.ERT_CMD_STATE_COMPLETED, done_at, hang=True)
        if fault is not None:
            return run(fault, done_at)
        if any(v is None for v in values):  # a buffer at address 0: the CU computes nothing useful
            return run(ert_cmd_state.ERT_CMD_STATE_COMPLETED, done_at)
        if "ring" in self._entry:
            return self._start_loop(values)
        # The kernel works on scratch copies; they land in device memory when the run completes.
        scratch = [v.copy() if isinstance(v, np.ndarray) else v for v in values]
        with self._lock:
            top(scratch)

        def commit() -> None:
            for a, dst, src in zip(targs, values, scratch):
                if a.role == "output":
                    dst[...] = src

        return run(ert_cmd_state.ERT_CMD_STATE_COMPLETED, done_at, commit)


def _start_loop(self, values: list) -> run:
    """Start the persistent loop on the ring (``values[0]``, device memory) in a daemon thread,
    as the card's CU runs it: the run stays running until the loop returns on the stop word."""
    from offload.hls import persistent
    from offload.kernels.ring import HDR_STOP, STOP

    top = self._top
    ring = values[0][: top.layout.nbytes]
    with _LOCK:
        fault = _RING_FAULTS.pop(0) if _RING_FAULTS else None
    block = None
    if fault is not None:
        block = persistent.Csim(idle_spin_ns=200_000, max_sleep_ns=100_000, seed=fault["seed"], delay_permille=fault["delay_permille"],
                                max_delay_us=fault["max_delay_us"], die_at=fault["die_at"], die_after_compute=int(fault["after_compute"]))
    stopped = threading.Event()

    def serve() -> None:
        top.serve(ring, values[1:], block)
        # The loop also returns when a fault hook kills it; only the stop word ends it cleanly.
        if int(ring[HDR_STOP: HDR_STOP + 8].view(np.uint64)[0]) == STOP and not (block is not None and block.die_at and _died(ring, top.layout, block.die_at)):
            stopped.set()

    t = threading.Thread(target=serve, name=f"fake-xrt-{self.cu_name}", daemon=True)
    ring_threads.append(t)
    t.start()
    return run(ert_cmd_state.ERT_CMD_STATE_COMPLETED, 0.0, loop=(t, stopped))


def _died(ring: np.ndarray, layout, die_at: int) -> bool:
    """Whether the loop returned at its die hook: request ``die_at`` was published but never answered."""
    from offload.kernels.ring import SLOT_REQ_SEQ

    at = layout.slot_offset(layout.slot_of(die_at))
    req = int(ring[at + SLOT_REQ_SEQ: at + SLOT_REQ_SEQ + 8].view(np.uint64)[0])
    resp = int(ring[at + layout.slot.resp_seq: at + layout.slot.resp_seq + 8].view(np.uint64)[0])
    return req == die_at and resp != die_at


kernel._start_loop = _start_loop
kernel.cu_access_mode = _enum("cu_access_mode", {"exclusive": 0, "shared": 1, "none": 2}, parent=kernel)
