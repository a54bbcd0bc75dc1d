"""The ``xrt`` device: an Alveo card through XRT's Python binding, ``pyxrt``, as XRT documents it.

Specs: ``"xrt"`` / ``"xrt:0"`` (device index) or ``"xrt:0000:3b:00.1"`` (PCIe BDF). Kernels run
from an xclbin: :meth:`XrtDevice.load_bundle` loads the bundle's xclbin (its UUID checked
against the one the bundle recorded) and then every kernel; :meth:`XrtDevice.load_xclbin` does
the first step by hand. ``$OFFLOAD_XCLBIN`` names an xclbin to load when a bare kernel is loaded.

Per kernel, one ``pyxrt.kernel`` per compute unit (``"top:{top_1}"``) is opened in shared mode;
resident tensors are written to buffer objects in each argument's memory bank
(``kernel.group_id(i)``) once, shared by the compute units wired to the same bank. A call takes per-call buffer objects from a pool (reused by bank
and size), writes and syncs them to the device, starts the next compute unit round-robin, waits
with a timeout and checks the returned ``pyxrt.ert_cmd_state``, then syncs the outputs back.

Example::

    dev = open_device("xrt:0")
    handles = dev.load_bundle(offload.load("model.offload"))
    out = dev.run(handles["emb0"], {"indices": idx, "offsets": off}, timeout=1.0)
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from offload.host._buffered import BufferedDevice, Loaded
from offload.host._pool import BufferPool
from offload.host.device import DeviceError, DeviceTimeout, register_device

__all__ = ["XrtDevice", "import_pyxrt"]

_MIN_BO = 64  # XRT refuses zero-byte buffer objects


def import_pyxrt():
    """``import pyxrt`` with an error that says how to get it."""
    try:
        import pyxrt  # type: ignore[import-not-found]
    except ImportError as e:
        raise DeviceError(
            "the xrt device needs XRT's Python binding `pyxrt`: install XRT (https://xilinx.github.io/XRT) "
            "and `source /opt/xilinx/xrt/setup.sh` so that pyxrt is on PYTHONPATH"
        ) from e
    return pyxrt


@dataclass
class _Cu:
    name: str
    kernel: Any  # pyxrt.kernel bound to this compute unit
    resident: dict[int, Any]  # arg index -> pyxrt.bo
    groups: dict[int, int]  # arg index -> memory bank group id


@dataclass
class _XrtKernel:
    cus: list[_Cu]
    next_cu: Any  # itertools.cycle over cus
    lock: threading.Lock


@register_device("xrt")
class XrtDevice(BufferedDevice):
    """An Alveo card through pyxrt; see the module doc."""

    kind = "xrt"

    def __init__(self, spec: str = "xrt") -> None:
        super().__init__(spec)
        self._pyxrt = pyxrt = import_pyxrt()
        target = spec.split(":", 1)[1] if ":" in spec else "0"
        try:
            self._dev = pyxrt.device(int(target)) if target.isdigit() else pyxrt.device(target)
        except Exception as e:  # pyxrt raises RuntimeError for a missing card
            raise DeviceError(f"device {spec!r}: XRT cannot open card {target!r}: {e}") from e
        self._uuid = None
        self._xclbin: Path | None = None
        self._xclbin_kernels: list[str] = []
        self._compute_units: dict[str, list[str]] = {}
        self._pool: BufferPool[Any] = BufferPool(self._alloc_bo)

    # -- xclbin ---------------------------------------------------------------------------------
    def load_xclbin(self, path: str | os.PathLike, expected_uuid: str | None = None, compute_units: Mapping[str, list[str]] | None = None) -> str:
        """Program the card with ``path``; refuses an xclbin whose UUID differs from ``expected_uuid``."""
        pyxrt = self._pyxrt
        try:
            xb = pyxrt.xclbin(str(path))
        except Exception as e:  # pyxrt raises RuntimeError for an unreadable file
            raise DeviceError(f"xclbin {path}: XRT cannot read it: {e}") from e
        found = xb.get_uuid().to_string()
        if expected_uuid and found.lower() != expected_uuid.lower():
            raise DeviceError(f"xclbin {path}: UUID {found} does not match the bundle's recorded UUID {expected_uuid}; rebuild or re-record the bundle")
        with self._lock:
            try:
                self._uuid = self._dev.load_xclbin(xb)
            except Exception as e:
                raise DeviceError(f"xclbin {path}: XRT cannot program {self.name!r} with it: {e}") from e
            self._xclbin = Path(path)
            self._xclbin_kernels = [k.get_name() for k in xb.get_kernels()]
            self._compute_units = {k: list(v) for k, v in (compute_units or {}).items()}
        return found

    def load_bundle(self, bundle: Any) -> dict:
        if bundle.xclbin is None:
            raise DeviceError(f"bundle {bundle.name!r} has no xclbin: build it with `offload build BUNDLE --target CARD --vitis` first")
        self.load_xclbin(bundle.xclbin, bundle.xclbin_uuid, bundle.compute_units)
        return super().load_bundle(bundle)

    # -- hooks ----------------------------------------------------------------------------------
    def _alloc_bo(self, group: Any, size: int) -> Any:
        return self._pyxrt.bo(self._dev, size, self._pyxrt.bo.normal, group)

    def _upload(self, loaded: Loaded, resident: dict[str, np.ndarray]) -> _XrtKernel:
        pyxrt = self._pyxrt
        if self._uuid is None:
            env = os.environ.get("OFFLOAD_XCLBIN")
            if not env:
                raise DeviceError(
                    f"kernel {loaded.kernel.name!r}: no xclbin is loaded on {self.name!r}; use load_bundle(bundle), "
                    "load_xclbin(path) or set OFFLOAD_XCLBIN"
                )
            self.load_xclbin(env)
        if self._xclbin_kernels and loaded.top not in self._xclbin_kernels:
            raise DeviceError(f"kernel {loaded.kernel.name!r}: top function {loaded.top!r} is not in xclbin {self._xclbin} (it holds {self._xclbin_kernels})")
        names = self._compute_units.get(loaded.top) or [None]
        cus = []
        uploaded: dict[tuple[int, int], Any] = {}  # (arg, bank) -> bo: CUs on the same bank share a table
        for cu in names:
            kname = loaded.top if cu is None else f"{loaded.top}:{{{cu}}}"
            k = pyxrt.kernel(self._dev, self._uuid, kname, pyxrt.kernel.cu_access_mode.shared)
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
                        bo.sync(pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, arr.nbytes, 0)
                    uploaded[(i, groups[i])] = bo
                bos[i] = uploaded[(i, groups[i])]
            cus.append(_Cu(cu or loaded.top, k, bos, groups))
        return _XrtKernel(cus, itertools.cycle(cus), threading.Lock())

    def _execute(self, loaded: Loaded, values: dict[str, Any], timeout: float | None) -> dict[str, np.ndarray]:
        pyxrt = self._pyxrt
        st: _XrtKernel = loaded.state
        with st.lock:
            cu: _Cu = next(st.next_cu)
        taken = []
        reuse = True
        try:
            call_args: list[Any] = []
            outs: list[tuple[str, np.ndarray, Any]] = []
            for i, a in enumerate(loaded.args):
                if a.role == "resident":
                    call_args.append(cu.resident[i])
                elif a.role == "scalar":
                    call_args.append(values[a.name])
                else:
                    host = values[a.name]
                    key, bo = self._pool.acquire(cu.groups[i], host.nbytes)
                    taken.append((key, bo))
                    # Outputs are written too: the kind hands them over as zero arrays.
                    if host.nbytes:
                        bo.write(host.reshape(-1).view(np.uint8), 0)
                        bo.sync(pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, host.nbytes, 0)
                    call_args.append(bo)
                    if a.role == "output":
                        outs.append((a.name, host, bo))
            try:
                run = cu.kernel(*call_args)
            except Exception as e:  # XRT refuses the start (bad argument, lost card)
                raise DeviceError(f"kernel {loaded.kernel.name!r} (compute unit {cu.name}) on {self.name!r}: XRT cannot start it: {e}") from e
            # wait(0) means "no timeout" to XRT: a positive timeout is at least 1 ms.
            state = run.wait(max(1, math.ceil(timeout * 1000))) if timeout is not None else run.wait()
            # A timed-out run may still be writing its buffers: they must not serve another call.
            reuse = state != pyxrt.ert_cmd_state.ERT_CMD_STATE_TIMEOUT
            self._check_state(loaded, cu, state, timeout)
            result = {}
            for name, host, bo in outs:
                bo.sync(pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE, host.nbytes, 0)
                raw = np.array(bo.read(host.nbytes, 0), copy=True)  # pyxrt returns int8 bytes
                result[name] = raw.view(np.uint8).view(host.dtype).reshape(host.shape)
            return result
        finally:
            if reuse:
                for key, bo in taken:
                    self._pool.release(key, bo)

    def _check_state(self, loaded: Loaded, cu: _Cu, state: Any, timeout: float | None) -> None:
        s = self._pyxrt.ert_cmd_state
        if state == s.ERT_CMD_STATE_COMPLETED:
            return
        what = f"kernel {loaded.kernel.name!r} (compute unit {cu.name}) on {self.name!r}"
        name = getattr(state, "name", str(state))
        if state == s.ERT_CMD_STATE_TIMEOUT:
            raise DeviceTimeout(f"{what} did not complete within {timeout:g} s: {name}" if timeout is not None else f"{what}: {name}")
        raise DeviceError(f"{what} ended in state {name}")

    def _details(self) -> dict[str, Any]:
        d: dict[str, Any] = {"xclbin": str(self._xclbin) if self._xclbin else None, "buffer_allocations": self._pool.allocations}
        info = self._pyxrt.xrt_info_device
        for key in ("name", "bdf"):
            try:
                d[key] = self._dev.get_info(getattr(info, key))
            except Exception:  # older XRT: not every key is queryable
                pass
        return d

    def _description(self) -> str:
        return "Alveo card through XRT (pyxrt)"

    def _shutdown(self) -> None:
        self._pool.close()
